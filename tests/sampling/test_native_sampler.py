"""The compiled sampler and restriction (kernels/sampler.cpp) against the torch-op path: identical
samples (the random numbers are counter based and shared), the same restricted bases and
full-batch equality on both paths; thread-count determinism, draws with replacement, the
loader's background prefetch (same batches, resume inside an epoch) and the fallback."""

import gc
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structconv import sampling as S
from structconv.kernels import native
from tests.sampling.test_sampling import (
    KINDS,
    chi2,
    full_forward,
    graph,
    restriction,
    star,
    two_layers,
)

D = torch.float64
compiled = pytest.mark.skipif(native.sampler() is None,
                              reason="no compiled sampler (no compiler, or STRUCTCONV_NATIVE=0)")


def both(ei, n, w=None):
    """The same graph's sampler on the torch ops and on the compiled path."""
    return S.NeighborSampler(ei, n, w, native=False), S.NeighborSampler(ei, n, w, native=True)


def same_sample(a, b):
    assert a.node_counts == b.node_counts and a.edge_counts == b.edge_counts
    for name in ("node_ids", "edge_index", "edge_ids"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@compiled
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10 ** 6), n=st.integers(2, 30), E=st.integers(0, 150),
       fanouts=st.lists(st.sampled_from([1, 2, 3, 5, -1]), min_size=1, max_size=3),
       mode=st.sampled_from(["floyd", "keys", "weighted", "replace"]))
def test_compiled_sampler_draws_the_torch_paths_samples(seed, n, E, fanouts, mode):
    ei, w, et, x, g = graph(n, E, seed)
    w = torch.where(torch.rand(w.shape, generator=g) < 0.2, torch.zeros_like(w), w)
    a, b = both(ei, n, w)
    if mode == "keys":  # the path of large fanouts: the f smallest uniform keys
        a.floyd_max_fanout = b.floyd_max_fanout = 0
    seeds = torch.randperm(n, generator=g)[:4]
    kw = dict(weighted=mode == "weighted", replace=mode == "replace")
    sa = a.sample(seeds, fanouts, generator=torch.Generator().manual_seed(seed), **kw)
    sb = b.sample(seeds, fanouts, generator=torch.Generator().manual_seed(seed), **kw)
    same_sample(sa, sb)


@compiled
def test_compiled_sampler_is_the_same_on_any_thread_count():
    # enough frontier nodes that the parallel loops split (grains of 64 nodes, 4096 edges)
    ei, w, et, x, g = graph(3000, 40000, 11)
    smp = S.NeighborSampler(ei, 3000, w, native=True)
    seeds = torch.randperm(3000, generator=g)[:500]
    threads = torch.get_num_threads()
    out = []
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            out.append([smp.sample(seeds, [5, 3], weighted=wt,
                                   generator=torch.Generator().manual_seed(7))
                         for wt in (False, True)])
    finally:
        torch.set_num_threads(threads)
    for u, v in zip(*out):
        same_sample(u, v)
    r = S.GraphRestriction("gcn", ei, 3000, edge_weight=w)
    torch.testing.assert_close(r.restrict(out[0][0]).to_dense(), r.restrict(out[1][0]).to_dense(),
                               rtol=0, atol=0)


@pytest.mark.parametrize("path", [False, True])
def test_a_nodes_draws_depend_on_its_position_and_the_seed_only(path):
    # the counter keys: (base seed, hop, index in the frontier, slot); other seeds of the
    # batch do not change a seed's neighbours, another generator seed does
    if path and native.sampler() is None:
        pytest.skip("no compiled sampler here")
    ei, w, et, x, g = graph(200, 3000, 2)
    smp = S.NeighborSampler(ei, 200, native=path)

    def hop1(seeds, s):
        sm = smp.sample(torch.tensor(seeds), [4], generator=torch.Generator().manual_seed(s))
        e = sm.edge_ids[sm.edge_index[1] < 2]  # the edges into the first two seeds
        return sorted(e.tolist())

    assert hop1([3, 9, 17], 5) == hop1([3, 9, 44, 120], 5) != hop1([3, 9, 17], 6)


@compiled
@pytest.mark.parametrize("kind,opts", KINDS, ids=[f"{k}-{o}" for k, o in KINDS])
def test_compiled_restriction_equals_the_torch_ops(kind, opts):
    ei, w, et, x, g = graph(25, 90, 4)
    s = S.NeighborSampler(ei, 25, w).sample(torch.tensor([3, 0, 7]), [3, 2, -1, 2],
                                            generator=torch.Generator().manual_seed(1))
    a, b = restriction(kind, opts, ei, 25, w, et), restriction(kind, opts, ei, 25, w, et)
    a.native, b.native = False, True
    for hop in range(s.num_hops - a.hops + 1):
        ra, rb = a.restrict(s, hop), b.restrict(s, hop)
        assert ra.shape == rb.shape
        torch.testing.assert_close(rb.to_dense(), ra.to_dense(), rtol=1e-13, atol=1e-15)
        z = torch.randn(2, ra.M, ra.K, 3, generator=g, dtype=D)
        torch.testing.assert_close(rb.propagate_heads(z), ra.propagate_heads(z))
        torch.testing.assert_close(rb.propagate_sum(z), ra.propagate_sum(z))


@compiled
def test_compiled_csr_is_the_sparse_products_own():
    # the CSR handed to the sparse product is the one it would build (coalesced, sorted)
    from structconv.sparse import build_csr

    ei, w, et, x, g = graph(20, 80, 9)
    ei = torch.cat([ei, ei[:, :10]], 1)  # duplicate edges: summed
    w = torch.cat([w, w[:10]])
    s = S.NeighborSampler(ei, 20).sample(torch.tensor([1, 4]), [-1, -1])
    r = S.GraphRestriction("gcn", ei, 20, edge_weight=w, dtype=D)
    for op in r.restrict(s).ops:
        got = op.t._csr[(D, torch.device("cpu"), False)]
        ref = build_csr(op.dst, op.src, op.value, (op.N, op.M))
        for u, v in ((got.crow_indices(), ref.crow_indices()),
                     (got.col_indices(), ref.col_indices())):
            assert torch.equal(u, v)
        torch.testing.assert_close(got.values(), ref.values())


@pytest.mark.parametrize("path", [False, True])
@pytest.mark.parametrize("kind", ["gcn", "cheb", "tag", "sgc", "rgcn", "gat", "mixed"])
def test_fanout_all_equals_full_batch_on_both_paths(kind, path):
    if path and native.sampler() is None:
        pytest.skip("no compiled sampler here")
    n = 16
    ei, w, et, x, g = graph(n, 40, 3)
    layers = [m.double() for m in two_layers(kind)]
    for m in layers:
        for p in m.parameters():
            p.data.normal_(generator=g)
    x = x.clone().requires_grad_(True)
    seeds = torch.tensor([5, 0, 11])
    y = full_forward(layers, x, ei, w, et)[seeds]
    params = [p for m in layers for p in m.parameters()]
    gy = torch.randn(y.shape, generator=g, dtype=D)
    ref = torch.autograd.grad(y, params + [x], gy)
    loader = S.NeighborLoader(ei, n, ["all", -1], layers=layers, x=x, input_nodes=seeds,
                              batch_size=3, edge_weight=w, edge_type=et, native=path)
    (batch,) = list(loader)
    out = S.apply_layers(layers, batch.x, batch.bases, act=torch.relu)
    torch.testing.assert_close(out, y)
    got = torch.autograd.grad(out, params + [x], gy, allow_unused=True)
    for a, b in zip(got, ref):
        torch.testing.assert_close(torch.zeros_like(b) if a is None else a, b)


@pytest.mark.parametrize("path", [False, True])
def test_draws_with_replacement(path):
    if path and native.sampler() is None:
        pytest.skip("no compiled sampler here")
    ei, _ = star()
    ei = torch.cat([ei, torch.tensor([[3], [5]])], 1)  # node 5: one edge; others none
    smp = S.NeighborSampler(ei, 11, native=path)
    s = smp.sample([0, 5, 7], [4], replace=True, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(s.edge_index[1], minlength=3)
    assert counts.tolist() == [4, 4, 0]  # f draws per node with edges, none without
    assert torch.equal(s.node_ids[s.edge_index], ei[:, s.edge_ids])  # true edges
    assert torch.equal(s.edge_ids[4:], torch.full((4,), 10))  # node 5's one edge, four times
    T = 6000
    eid, seg = smp.sample_neighbors(torch.zeros(T, dtype=torch.long), 3, replace=True,
                                    generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.bincount(seg, minlength=T), torch.full((T,), 3))
    assert chi2(torch.bincount(eid, minlength=10), torch.full((10,), T * 3 / 10)) > 1e-3
    # a triple repeats an edge with probability 1 - (10 * 9 * 8) / 10^3 = 0.28
    r = torch.sort(seg * 16 + eid).values.view(T, 3)
    repeats = (r[:, 1:] == r[:, :-1]).any(1).double().mean()
    assert 0.25 < repeats < 0.31
    with pytest.raises(ValueError, match="replace must be False with weighted=True"):
        S.NeighborSampler(ei, 11, torch.ones(11, dtype=D)).sample([0], [2], weighted=True,
                                                                  replace=True)


# ------------------------------------------------------------------------------------------------
# the loader's background prefetch
def loader_kw(**extra):
    ei, w, et, x, g = graph(60, 300, 8)
    y = torch.randint(0, 3, (60,), generator=g)
    return dict(edge_index=ei, num_nodes=60, fanouts=[3, 2], x=x, y=y, batch_size=7,
                shuffle=True, seed=4, **extra)


def same_batches(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert torch.equal(u.seeds, v.seeds) and torch.equal(u.node_ids, v.node_ids)
        assert torch.equal(u.sample.edge_ids, v.sample.edge_ids) and torch.equal(u.x, v.x)


def test_prefetch_yields_the_same_batches_and_resumes_inside_an_epoch():
    plain = S.NeighborLoader(**loader_kw())
    ahead = S.NeighborLoader(**loader_kw(prefetch=2))
    for _ in range(2):  # two epochs, each reshuffled alike
        same_batches(list(plain), list(ahead))
    # resume at batch 3 of epoch 0: the rest of that epoch, as uninterrupted
    ref = list(S.NeighborLoader(**loader_kw()).__iter__())
    ahead.set_epoch(0, start=3)
    same_batches(list(ahead), ref[3:])
    # an epoch left early stops its thread; the next one starts afresh
    it = iter(ahead)
    next(it)
    it.close()
    assert not it._thread.is_alive()
    assert len(list(ahead)) == len(ahead)
    # an iterator dropped without close: collected, its thread stops (none left at exit)
    it = iter(ahead)
    next(it)
    thread = it._thread
    del it
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_prefetch_raises_the_threads_error_and_checks_its_options():
    def broken(item):
        raise RuntimeError("sampling failed")

    with pytest.raises(RuntimeError, match="sampling failed"):
        list(S.loader._Prefetch(broken, [1, 2], 1, False))
    with pytest.raises(ValueError, match="prefetch must be an int >= 0, got -1"):
        S.NeighborLoader(**loader_kw(prefetch=-1))
    with pytest.raises(ValueError, match="use it with num_workers=0, got num_workers=2"):
        S.NeighborLoader(**loader_kw(prefetch=2, num_workers=2))


def test_the_compiled_sampler_is_optional(monkeypatch):
    # switched off (or no compiler): the torch ops give the same samples
    ei, w, et, x, g = graph(30, 120, 1)
    want = S.NeighborSampler(ei, 30, native=False).sample(
        [2, 9], [3, 3], generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(native, "_built", {})
    monkeypatch.setenv("STRUCTCONV_NATIVE", "0")
    smp = S.NeighborSampler(ei, 30)
    assert native.sampler() is None and smp.compiled() is None
    same_sample(smp.sample([2, 9], [3, 3], generator=torch.Generator().manual_seed(3)), want)


@pytest.mark.parametrize("path", [False, True])
def test_fanout_all_consumes_no_random_state(path):
    # layer-wise evaluation samples whole neighbourhoods: the global RNG (dropout) is untouched
    ei, w, et, x, g = graph(20, 60, 6)
    smp = S.NeighborSampler(ei, 20, native=path)
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    smp.sample([1, 2], [-1, "all"])
    smp.sample_neighbors(torch.tensor([4]), -1)
    assert torch.equal(torch.rand(3), want)


@compiled
def test_compiled_row_gather_equals_indexing():
    ext = native.sampler()
    g = torch.Generator().manual_seed(0)
    for x in (torch.randn(50, 7, generator=g), torch.randn(40, 3, 5, generator=g).half(),
              torch.randint(0, 9, (30,), generator=g)):
        idx = torch.randint(0, x.shape[0], (100,), generator=g)
        assert torch.equal(ext.gather_rows(x, idx), x[idx])
    with pytest.raises(RuntimeError, match=r"index 50 out of \[0, 50\)"):
        ext.gather_rows(torch.randn(50, 2), torch.tensor([3, 50]))


def test_a_samples_cache_is_not_pickled():
    # a worker process sends its batches back pickled: the restriction (whole-graph values)
    # keying the sample's cache must not travel with them
    ei, w, et, x, g = graph(30, 100, 2)
    r = S.GraphRestriction("gcn", ei, 30, edge_weight=w)
    s = S.NeighborSampler(ei, 30).sample([1, 2], [2, 2])
    b = r.restrict(s)
    s.cache["marker"] = r
    back = pickle.loads(pickle.dumps(s))
    assert back.cache == {} and torch.equal(back.edge_ids, s.edge_ids)
    torch.testing.assert_close(r.restrict(back).to_dense(), b.to_dense())

"""Typed neighbour sampling: the compiled and torch-op paths draw the same typed samples (any thread
count), the samples keep their fanouts per relation and hop, sampled typed models (to_hetero SAGE,
HeteroConv, HGTConv) equal full batch at fanout "all" in values and gradients, and the typed
loader's shuffling, prefetch and resume."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv.data.hetero import HeteroGraph
from structconv.kernels import native
from structconv.sampling import (
    NeighborSampler,
    TypedNeighborLoader,
    TypedNeighborSampler,
    apply_typed_layers,
    typed_fanouts,
)

compiled = pytest.mark.skipif(native.sampler() is None,
                              reason="no compiled sampler (no compiler, or STRUCTCONV_NATIVE=0)")

NUM = {"a": 9, "b": 11, "c": 4, "d": 3, "e": 0}
ETS = [("a", "r", "b"), ("b", "s", "a"), ("a", "t", "a"), ("c", "u", "b"), ("b", "w", "c"),
       ("d", "v", "a"), ("e", "x", "b")]
EMPTY = (("d", "v", "a"), ("e", "x", "b"))  # relations with no edges


def typed_graph(seed=0, E=20, num=NUM, ets=ETS, empty=EMPTY, width=4):
    g = torch.Generator().manual_seed(seed)
    ei = {}
    for e in ets:
        n = 0 if e in empty or not num[e[0]] or not num[e[2]] else E
        ei[e] = torch.stack([torch.randint(0, max(num[e[0]], 1), (n,), generator=g),
                             torch.randint(0, max(num[e[2]], 1), (n,), generator=g)])
    x = {t: torch.randn(n, width, generator=g, dtype=torch.float64) for t, n in num.items()}
    y = {"b": torch.randint(0, 3, (num["b"],), generator=g)}
    return HeteroGraph(dict(num), ei, x, y=y)


def same(a, b):
    assert a.node_counts == b.node_counts and a.edge_counts == b.edge_counts
    for t in a.node_ids:
        assert torch.equal(a.node_ids[t], b.node_ids[t]), t
    for e in a.edge_index:
        assert torch.equal(a.edge_index[e], b.edge_index[e]), e
        assert torch.equal(a.edge_ids[e], b.edge_ids[e]), e


def draw(graph, seeds, fanouts, native_, seed=5, **kw):
    s = TypedNeighborSampler(graph, native=native_)
    return s.sample(seeds, fanouts, generator=torch.Generator().manual_seed(seed), **kw)


# ------------------------------------------------------------------------------------------------
@compiled
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10 ** 6), E=st.integers(0, 60),
       fan=st.lists(st.lists(st.sampled_from([0, 1, 2, 3, -1]), min_size=7, max_size=7),
                    min_size=1, max_size=3),
       mode=st.sampled_from(["floyd", "keys", "replace"]))
def test_compiled_typed_sampler_draws_the_torch_paths_samples(seed, E, fan, mode):
    G = typed_graph(seed, E)
    fanouts = {e: [row[r] for row in fan] for r, e in enumerate(ETS)}
    g = torch.Generator().manual_seed(seed)
    seeds = {"b": torch.randperm(11, generator=g)[:4], "a": torch.randperm(9, generator=g)[:2]}
    a, b = TypedNeighborSampler(G, native=False), TypedNeighborSampler(G, native=True)
    if mode == "keys":  # the path of large fanouts: the f smallest uniform keys
        a.floyd_max_fanout = b.floyd_max_fanout = 0
    kw = dict(replace=mode == "replace")
    sa = a.sample(seeds, fanouts, generator=torch.Generator().manual_seed(seed), **kw)
    sb = b.sample(seeds, fanouts, generator=torch.Generator().manual_seed(seed), **kw)
    same(sa, sb)
    sb._check_hops()  # the compiled sample is nested as the torch path checks it


@compiled
def test_compiled_typed_sampler_is_the_same_on_any_thread_count():
    G = typed_graph(3, E=400, num={"a": 300, "b": 200, "c": 50, "d": 3, "e": 0})
    seeds = {"b": torch.arange(0, 200, 3)}
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = draw(G, seeds, [4, 3], True)
        torch.set_num_threads(max(2, old))
        many = draw(G, seeds, [4, 3], True)
    finally:
        torch.set_num_threads(old)
    same(one, many)
    same(one, draw(G, seeds, [4, 3], False))


@pytest.mark.parametrize("path", [False, None])
def test_one_relation_draws_the_homogeneous_sample(path):
    # relation 0's counter key is the homogeneous hop key: a graph of one type and relation
    # sampled typed and homogeneous gives the same sample
    g = torch.Generator().manual_seed(1)
    ei = torch.randint(0, 40, (2, 300), generator=g)
    G = HeteroGraph({"n": 40}, {("n", "to", "n"): ei})
    t = draw(G, {"n": torch.tensor([5, 2, 9])}, [3, 2], path)
    h = NeighborSampler(ei, 40, native=path).sample(
        torch.tensor([5, 2, 9]), [3, 2], generator=torch.Generator().manual_seed(5))
    assert t.node_counts["n"] == h.node_counts
    assert torch.equal(t.node_ids["n"], h.node_ids)
    assert torch.equal(t.edge_index[("n", "to", "n")], h.edge_index)
    assert torch.equal(t.edge_ids[("n", "to", "n")], h.edge_ids)


@pytest.mark.parametrize("replace", [False, True])
def test_typed_sample_keeps_each_relations_fanout(replace):
    G = typed_graph(2, E=60)
    fan = {e: [2, 1] for e in ETS}
    fan[("a", "t", "a")] = [0, 3]
    s = draw(G, {"b": torch.arange(11)}, fan, None, replace=replace)
    for e in ETS:
        ei, ids, c = s.edge_index[e], s.edge_ids[e], s.edge_counts[e]
        full = G.edge_index[e]
        src_t, dst_t = e[0], e[2]
        # every sampled edge is a true edge of its relation, in local ids
        assert torch.equal(s.node_ids[src_t][ei[0]], full[0, ids])
        assert torch.equal(s.node_ids[dst_t][ei[1]], full[1, ids])
        lo = 0
        for h in range(2):
            f = fan[e][h]
            tgt = ei[1, lo:c[h]]
            deg = torch.bincount(tgt, minlength=s.node_counts[dst_t][-1])
            if f == 0:
                assert tgt.numel() == 0
            elif replace:
                assert set(deg[deg > 0].tolist()) <= {f}
            else:
                assert int(deg.max()) <= f if deg.numel() else True
                assert ids[lo:c[h]].unique().numel() == c[h] - lo  # no edge twice
            lo = c[h]
    assert s.node_counts["e"] == (0, 0, 0) and s.node_ids["e"].shape == (0,)


def test_fanout_all_takes_every_incoming_edge_and_draws_nothing():
    G = typed_graph(4)
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    s = TypedNeighborSampler(G).sample({"b": torch.tensor([0, 3])}, ["all", -1], generator=gen)
    assert torch.equal(gen.get_state(), state)  # fanout "all" consumes no random numbers
    blk = s.block(2)
    for e in ETS:
        d = e[2]
        targets = s.node_ids[d][:blk.num_dst[d]]
        want = torch.isin(G.edge_index[e][1], targets).sum()
        assert blk.edge_index[e].shape[1] == int(want)


def test_typed_fanouts_and_seed_errors():
    assert typed_fanouts([2, "all"], ETS[:2]) == [[2, 2], [-1, -1]]
    assert typed_fanouts({"a__r__b": [1, 0], ("b", "s", "a"): [3, 2]}, ETS[:2]) == \
        [[1, 3], [0, 2]]
    with pytest.raises(ValueError, match="missing"):
        typed_fanouts({ETS[0]: [1]}, ETS[:2])
    with pytest.raises(ValueError, match="same number of hops"):
        typed_fanouts({ETS[0]: [1], ETS[1]: [1, 2]}, ETS[:2])
    with pytest.raises(ValueError, match="positive int"):
        typed_fanouts([-2], ETS[:2])
    s = TypedNeighborSampler(typed_graph())
    with pytest.raises(ValueError, match="node types"):
        s.sample({"zz": torch.tensor([0])}, [1])
    with pytest.raises(ValueError, match="must lie in"):
        s.sample({"b": torch.tensor([11])}, [1])
    with pytest.raises(TypeError, match="dict"):
        s.sample(torch.tensor([1]), [1])
    # a relation's bipartite sampler: sources and targets counted apart, one hop at a time
    rel = NeighborSampler(torch.tensor([[4, 0], [2, 2]]), 3, num_src=5)
    eid, src, seg = rel.draw_keyed(torch.tensor([2, 0]), -1, 0)
    assert eid.tolist() == [0, 1] and src.tolist() == [4, 0] and seg.tolist() == [0, 0]
    with pytest.raises(ValueError, match="bipartite"):
        rel.sample(torch.tensor([0]), [1])
    with pytest.raises(ValueError, match="source ids"):
        NeighborSampler(torch.tensor([[5], [0]]), 3, num_src=5)


# ------------------------------------------------------------------------------------------------
class _Two(torch.nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.c1, self.c2 = conv(4, 6), conv(6, 3)

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


class _Hetero(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = sc.nn.HeteroConv({e: sc.nn.SAGEConv((4, 4), 6) for e in ETS})
        # the second layer reads no type that the first leaves unreached (d, e), as in PyG
        self.c2 = sc.nn.HeteroConv({e: sc.nn.GATConv((6, 6), 3, add_self_loops=False)
                                    for e in ETS if e[0] not in ("d", "e")})

    def forward(self, x, edge_index):
        return self.c2({t: v.relu() for t, v in self.c1(x, edge_index).items()}, edge_index)


class _HGT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        meta = (list(NUM), ETS)
        self.c1, self.c2 = sc.nn.HGTConv(4, 6, meta, heads=2), sc.nn.HGTConv(6, 4, meta, heads=2)

    def forward(self, x, edge_index):
        return self.c2({t: v.relu() for t, v in self.c1(x, edge_index).items()}, edge_index)


def _model(kind):
    torch.manual_seed(0)
    if kind == "sage":
        return sc.nn.to_hetero(_Two(sc.nn.SAGEConv), (list(NUM), ETS)).double()
    return (_Hetero() if kind == "hetero" else _HGT()).double()


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("path", [False, None])
@pytest.mark.parametrize("kind", ["sage", "hetero", "hgt"])
def test_sampled_typed_model_equals_full_batch_at_fanout_all(kind, path):
    G = typed_graph(7)
    model = _model(kind)
    full = model(G.x, G.edge_index)
    w = torch.randn(full["b"].shape, generator=torch.Generator().manual_seed(3),
                    dtype=torch.float64)
    loader = TypedNeighborLoader(G, ["all", "all"], input_nodes=("b", None), batch_size=6,
                                 shuffle=True, seed=1, native=path)
    for batch in loader:
        S, ids = batch.num_seeds["b"], batch.seeds["b"]
        assert set(batch.x_dict) == set(NUM)  # types without nodes in the batch: (0, F) rows
        out = model(batch.x_dict, batch.edge_index_dict)
        assert all(v is not None for v in out.values())
        torch.testing.assert_close(out["b"][:S], full["b"][ids], rtol=1e-12, atol=1e-12)
        got = _grads(model, (out["b"][:S] * w[ids]).sum())
        want = _grads(model, (model(G.x, G.edge_index)["b"][ids] * w[ids]).sum())
        assert got.keys() == want.keys()
        for n in want:
            torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-12, msg=n)


@pytest.mark.parametrize("kind", ["sage", "hgt"])
def test_typed_layers_on_blocks_equal_full_batch(kind):
    # layer by layer on shrinking node sets: each layer on its hop's block, trimmed
    G = typed_graph(8)
    model = _model(kind)
    layers = [model.layers["c1"], model.layers["c2"]] if kind == "sage" else \
        [model.c1, model.c2]
    full = model(G.x, G.edge_index)
    loader = TypedNeighborLoader(G, [-1, -1], input_nodes={"b": None, "a": torch.tensor([1, 4])},
                                 batch_size=5)
    for batch in loader:
        out = apply_typed_layers(layers, batch.x_dict, batch.blocks, act=torch.relu)
        for t, ids in batch.seeds.items():
            assert out[t].shape[0] == ids.shape[0]
            torch.testing.assert_close(out[t], full[t][ids], rtol=1e-12, atol=1e-12)


def test_block_basis_is_the_relations_rectangular_basis():
    G = typed_graph(9)
    s = TypedNeighborSampler(G).sample({"b": torch.tensor([2, 5, 7])}, [-1])
    blk = s.block(1)
    e = ("a", "r", "b")
    B = blk.basis(e, dtype=torch.float64)
    assert (B.K, B.M, B.N) == (1, blk.num_src["a"], blk.num_dst["b"])
    full = sc.basis.typed.relation_operator(G.edge_index[e], 9, 11, "mean",
                                            dtype=torch.float64)
    x = G.x["a"]
    want = full.apply_t(x)[s.node_ids["b"][:3]]
    got = sc.convolve(x[s.node_ids["a"]], B, torch.eye(4, dtype=torch.float64).unsqueeze(0))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="0 source"):
        blk.basis(("d", "v", "a"))  # no d node in the block
    fan = {e: [0 if e == ("a", "r", "b") else 1] for e in ETS}
    s = TypedNeighborSampler(G).sample({"b": torch.tensor([2]), "a": torch.tensor([1])}, fan)
    assert s.block(1).basis(("a", "r", "b")).to_dense().abs().sum() == 0  # no edges: zero


# ------------------------------------------------------------------------------------------------
def _ids(batches):
    return [{t: v.tolist() for t, v in b.seeds.items()} for b in batches]


def test_typed_loader_plan_shuffle_prefetch_and_resume():
    G = typed_graph(10)
    kw = dict(input_nodes={"b": None, "a": torch.tensor([0, 2, 4])}, batch_size=3,
              shuffle=True, seed=4)
    loader = TypedNeighborLoader(G, [2, 2], **kw)
    first = list(loader)
    assert len(first) == len(loader) == 5
    seen = sorted((t, i) for b in _ids(first) for t, v in b.items() for i in v)
    assert seen == sorted([("b", i) for i in range(11)] + [("a", i) for i in (0, 2, 4)])
    second = list(loader)  # the next epoch: another order
    assert _ids(second) != _ids(first)
    again = TypedNeighborLoader(G, [2, 2], prefetch=2, **kw)
    pre = list(again)
    assert _ids(pre) == _ids(first)
    for a, b in zip(pre, first):
        for e in ETS:
            assert torch.equal(a.edge_index_dict[e], b.edge_index_dict[e])
    # stop after two batches of epoch 1, save, resume in a new loader: the same rest
    it = iter(again)
    next(it), next(it)
    state = again.state_dict()
    assert state == {"epoch": 1, "batch": 2, "seed": 4}
    resumed = TypedNeighborLoader(G, [2, 2], **kw)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert _ids(rest) == _ids(second)[2:]
    for a, b in zip(rest, second[2:]):
        assert a.rng_seed == b.rng_seed
        for t in b.node_ids:
            assert torch.equal(a.node_ids[t], b.node_ids[t])
    assert resumed.state_dict() == {"epoch": 2, "batch": 0, "seed": 4}
    with pytest.raises(ValueError, match="seed"):
        TypedNeighborLoader(G, [2, 2], **{**kw, "seed": 5}).load_state_dict(state)


def test_typed_loader_ranks_and_batch_contents():
    G = typed_graph(11)
    kw = dict(input_nodes=("b", torch.arange(11) % 2 == 0), batch_size=2, seed=0)
    ranks = [TypedNeighborLoader(G, [1], rank=r, world_size=2, **kw) for r in range(2)]
    got = sorted(i for ld in ranks for b in ld for i in b.seeds["b"].tolist())
    assert got == sorted([0, 2, 4, 6, 8, 10] + [0, 2])  # 3 batches, 2 ranks: the first again
    b = next(iter(TypedNeighborLoader(G, [2, 1], **kw)))
    assert torch.equal(b.y_dict["b"], G.y["b"][b.seeds["b"]])
    for t in NUM:
        assert torch.equal(b.x_dict[t], G.x[t][b.node_ids[t]])
    assert [blk.num_dst for blk in b.blocks][-1]["b"] == 2  # the last block ends at the seeds
    moved = b.to("cpu")
    assert moved.blocks[0].num_src == b.blocks[0].num_src
    for e in ETS:
        assert torch.equal(moved.edge_index_dict[e], b.edge_index_dict[e])
        assert torch.equal(moved.blocks[1].edge_index[e], b.blocks[1].edge_index[e])
    with pytest.raises(ValueError, match="input_nodes"):
        TypedNeighborLoader(G, [1], input_nodes="zz")
    with pytest.raises(ValueError, match="rank"):
        TypedNeighborLoader(G, [1], input_nodes="b", rank=2, world_size=2)


def test_bench_scale_times_typed_sampling(tmp_path, capsys):
    import json

    from structconv.cli import main

    assert main(["bench", "scale", "--quick", "--models", "", "--no-full", "--procs", "1",
                 "--threads", "1", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "scale.json").read_text())["typed_sampling"]
    assert r["types"] == 4 and r["relations"] == 8
    assert r["python"]["seeds_per_s"] > 0
    if native.sampler() is not None:
        assert r["native"]["seeds_per_s"] > 0 and r["speedup"] > 0
    assert "typed sampling alone" in capsys.readouterr().out

"""Sampling (issue 16): nested neighbour sampling, restricted bases == full bases on covering
sets, fanout "all" == full batch for every graph layer (values and gradients), the sampler's
statistics, the loader's workers, layer-wise inference and the errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv import sampling as S
from structconv.basis import graph as G

D = torch.float64
KINDS = [
    ("gcn", {}), ("gcn", {"improved": True}), ("gcn", {"add_self_loops": False}),
    ("gcn", {"normalize": False, "add_self_loops": False}),
    ("sgc", {"K": 2}), ("sgc", {"K": 3, "add_self_loops": False}),
    ("chebyshev", {"K": 1}), ("chebyshev", {"K": 3}),
    ("chebyshev", {"K": 4, "normalization": "rw"}),
    ("chebyshev", {"K": 3, "normalization": None, "lambda_max": 3.0}),
    ("diffusion", {"K": 0}), ("diffusion", {"K": 3}),
    ("diffusion", {"K": 2, "normalization": "rw"}),
    ("diffusion", {"K": 2, "normalization": None}),
    ("relational", {}), ("relational", {"normalization": "sym", "identity": True}),
    ("relational", {"sorts": [(0,), (1, 2), (2, 0, 1)], "identity": True}),
    ("relational", {"sorts": [(1, 0)], "normalization": None}),
]


def graph(n, E, seed, R=3):
    """A random directed graph with duplicate edges and self loops; weights, relations, x."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, E), generator=g)
    if E:
        ei = torch.cat([ei, ei[:, :2], torch.stack([ei[0, :1], ei[0, :1]])], 1)
    w = torch.rand(ei.shape[1], generator=g, dtype=D) + 0.1
    et = torch.randint(0, R, (ei.shape[1],), generator=g)
    x = torch.randn(n, 4, generator=g, dtype=D)
    return ei, w, et, x, g


def full_basis(kind, opts, ei, n, w, et):
    if kind == "gcn":
        return G.gcn(ei, n, w, opts.get("add_self_loops", True), opts.get("normalize", True),
                     improved=opts.get("improved", False))
    if kind == "sgc":
        return G.sgc(ei, n, opts["K"], w, opts.get("add_self_loops", True))
    if kind == "chebyshev":
        return G.chebyshev(ei, n, opts["K"], w, opts.get("normalization", "sym"),
                           opts.get("lambda_max"))
    if kind == "diffusion":
        return G.diffusion(ei, n, opts["K"], w, opts.get("normalization", "sym"))
    return G.relational(ei, et, n, opts.get("sorts"), w, opts.get("normalization", "mean"),
                        opts.get("identity", False), num_relations=3)


def restriction(kind, opts, ei, n, w, et, **kw):
    extra = {"num_relations": 3} if kind == "relational" else {}
    return S.GraphRestriction(kind, ei, n, edge_weight=w, edge_type=et, **opts, **extra, **kw)


def check_primitives(basis, z):
    """propagate_heads and propagate_sum of ``basis`` agree with its dense form (built by
    ``propagate``) on the bundle z (B, M, K, C)."""
    A = basis.to_dense().to(z.dtype)  # (a 0-hop basis holds no tensor: default dtype)
    torch.testing.assert_close(basis.propagate_heads(z), torch.einsum("kmn,bmkc->bnkc", A, z))
    torch.testing.assert_close(basis.propagate_sum(z), torch.einsum("kmn,bmkc->bnc", A, z))


@pytest.mark.parametrize("kind,opts", KINDS, ids=[f"{k}-{o}" for k, o in KINDS])
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10 ** 6), n=st.integers(2, 12), E=st.integers(0, 30),
       S_=st.integers(1, 4), hop=st.integers(0, 1))
def test_restriction_equals_full_on_covering_sets(kind, opts, seed, n, E, S_, hop):
    # every neighbourhood sampled whole: the restricted basis on the targets is the full one's
    ei, w, et, x, g = graph(n, E, seed)
    seeds = torch.randperm(n, generator=g)[:S_]
    s = S.NeighborSampler(ei, n).sample(seeds, ["all"] * 5)
    full = full_basis(kind, opts, ei, n, w, et)
    r = restriction(kind, opts, ei, n, w, et)
    b = r.restrict(s, hop)
    tgt = s.node_ids[:s.node_counts[hop]]
    assert b.shape == (full.K, s.node_counts[hop + r.hops], tgt.shape[0])
    z = torch.randn(2, n, full.K, 3, generator=g, dtype=D)
    zr = z[:, s.node_ids[:b.M]]
    for name in ("propagate_heads", "propagate_sum"):
        torch.testing.assert_close(getattr(b, name)(zr), getattr(full, name)(z)[:, tgt])
    torch.testing.assert_close(b.propagate(zr[:, :, 0]), full.propagate(z[:, :, 0])[:, tgt])


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10 ** 6), n=st.integers(3, 14), E=st.integers(5, 40),
       f=st.integers(1, 3), weighted=st.booleans())
def test_sampled_restriction_is_one_basis(seed, n, E, f, weighted):
    # with fanouts below the degrees, the propagate (input-side recurrence), propagate_sum
    # (Horner / Clenshaw) and propagate_heads (per head) of a restriction are one basis: the
    # nested blocks make every evaluation order agree
    ei, w, et, x, g = graph(n, E, seed)
    seeds = torch.randperm(n, generator=g)[:2]
    gen = torch.Generator().manual_seed(seed)
    s = S.NeighborSampler(ei, n, w).sample(seeds, [f] * 4, weighted=weighted, generator=gen)
    for kind, opts in KINDS:
        b = restriction(kind, opts, ei, n, w, et).restrict(s, 0)
        check_primitives(b, torch.randn(2, b.M, b.K, 3, generator=g, dtype=D))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10 ** 6), n=st.integers(3, 12), E=st.integers(3, 40),
       f=st.integers(1, 2))
def test_sampled_restriction_keeps_the_full_graphs_values(seed, n, E, f):
    # degrees="full": a one-hop restriction holds the full operator's entries (GCN's degrees,
    # the Laplacian's, R-GCN's per-relation means of the whole graph) on the sampled edges and
    # the diagonal, and nothing else. Edges are made distinct so that an entry is one edge.
    ei, w, et, x, g = graph(n, E, seed)
    ei = torch.unique(ei, dim=1)
    w, et = w[:ei.shape[1]], et[:ei.shape[1]]
    s = S.NeighborSampler(ei, n).sample(torch.tensor([0, n - 1]), [f],
                                        generator=torch.Generator().manual_seed(seed))
    ids, (m, t) = s.node_ids, s.edge_index
    mask = torch.zeros(s.node_counts[1], s.node_counts[0], dtype=D)
    mask[m, t] = 1
    # (kind, options, whether the operator has a diagonal, the matrices k compared: TAG's
    # S^0 = I is not an operator of edges)
    for kind, opts, loops, ks in [
            ("gcn", {}, True, slice(None)), ("chebyshev", {"K": 2}, True, slice(None)),
            ("relational", {}, False, slice(None)),
            ("gcn", {"add_self_loops": False}, False, slice(None)),
            ("diffusion", {"K": 1, "normalization": "rw"}, False, slice(1, None))]:
        A = full_basis(kind, opts, ei, n, w, et).to_dense()[ks][:, ids][:, :, ids[:mask.shape[1]]]
        keep = mask.clone()
        if loops:
            keep.diagonal().fill_(1)
        b = restriction(kind, opts, ei, n, w, et).restrict(s, 0)
        torch.testing.assert_close(b.to_dense()[ks], A * keep, msg=f"{kind} {opts}")


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10 ** 6), n=st.integers(3, 12), E=st.integers(3, 30),
       f=st.sampled_from([1, 2, "all"]))
def test_sample_degrees_are_the_sampled_subgraphs(seed, n, E, f):
    # degrees="sample": the layer normalised on the sampled subgraph as a graph of its own (PyG)
    ei, w, et, x, g = graph(n, E, seed)
    s = S.NeighborSampler(ei, n).sample(torch.tensor([0, n - 1]), [f, f],
                                        generator=torch.Generator().manual_seed(seed))
    sub, m = s.edge_index, s.node_counts[-1]
    for kind, opts in [("gcn", {}), ("chebyshev", {"K": 3}), ("relational", {})]:
        b = restriction(kind, opts, ei, n, w, et, degrees="sample").restrict(s, 0)
        ref = full_basis(kind, opts, sub, m, w[s.edge_ids], et[s.edge_ids])
        xs = x[s.node_ids].unsqueeze(0)
        torch.testing.assert_close(b.propagate(xs[:, :b.M]), ref.propagate(xs)[:, :b.N])


# ------------------------------------------------------------------------------------------------
# layers: fanout "all" == full batch, values and gradients
def two_layers(kind):
    torch.manual_seed(0)
    if kind == "gcn":
        return [sc.nn.GCNConv(4, 5), sc.nn.GCNConv(5, 3, improved=True)]
    if kind == "cheb":
        return [sc.nn.ChebConv(4, 5, K=3), sc.nn.ChebConv(5, 3, K=2, normalization="rw")]
    if kind == "tag":
        return [sc.nn.TAGConv(4, 5, K=2), sc.nn.TAGConv(5, 3, K=1)]
    if kind == "sgc":
        return [sc.nn.SGConv(4, 5, K=2), sc.nn.SGConv(5, 3, K=1)]
    if kind == "rgcn":
        return [sc.nn.RGCNConv(4, 5, 3), sc.nn.RGCNConv(5, 3, 3, num_bases=2, aggr="add")]
    if kind == "gat":
        return [sc.nn.GATConv(4, 3, heads=2), sc.nn.GATConv(6, 3, heads=2, concat=False)]
    return [sc.nn.TAGConv(4, 6, K=2), sc.nn.GATConv(6, 3)]  # mixed


def full_forward(layers, x, ei, w, et):
    for i, m in enumerate(layers):
        if isinstance(m, sc.nn.RGCNConv):
            x = m(x, ei, et)
        elif isinstance(m, sc.nn.GATConv):
            x = m(x, ei)
        else:
            x = m(x, ei, w)
        x = torch.relu(x) if i < len(layers) - 1 else x
    return x


@pytest.mark.parametrize("kind", ["gcn", "cheb", "tag", "sgc", "rgcn", "gat", "mixed"])
def test_fanout_all_equals_full_batch(kind):
    n = 16
    ei, w, et, x, g = graph(n, 40, 3)
    layers = [m.double() for m in two_layers(kind)]
    for m in layers:  # random biases (zero by default) so that they are checked too
        for p in m.parameters():
            p.data.normal_(generator=g)
    x = x.clone().requires_grad_(True)
    seeds = torch.tensor([5, 0, 11])
    y = full_forward(layers, x, ei, w, et)[seeds]
    params = [p for m in layers for p in m.parameters()]
    gy = torch.randn(y.shape, generator=g, dtype=D)
    ref = torch.autograd.grad(y, params + [x], gy)

    loader = S.NeighborLoader(ei, n, ["all", -1], layers=layers, x=x, input_nodes=seeds,
                              batch_size=3, edge_weight=w, edge_type=et)
    (batch,) = list(loader)
    assert torch.equal(batch.seeds, seeds)
    out = S.apply_layers(layers, batch.x, batch.bases, act=torch.relu)
    torch.testing.assert_close(out, y)
    got = torch.autograd.grad(out, params + [x], gy, allow_unused=True)
    for a, b in zip(got, ref):
        torch.testing.assert_close(torch.zeros_like(b) if a is None else a, b)


def test_featureless_rgcn_equals_full_batch():
    n = 10
    ei, w, et, x, g = graph(n, 30, 4)
    torch.manual_seed(1)
    layers = [sc.nn.RGCNConv(n, 4, 3).double(), sc.nn.RGCNConv(4, 2, 3).double()]
    y = layers[1](torch.relu(layers[0](None, ei, et)), ei, et)
    batch = next(iter(S.NeighborLoader(ei, n, ["all", "all"], layers=layers, batch_size=4,
                                       edge_type=et)))
    out = S.apply_layers(layers, batch.node_ids, batch.bases, act=torch.relu)
    torch.testing.assert_close(out, y[batch.seeds])


def test_graph_attention_blocks_carry_their_edges_features():
    """GATConv(edge_dim) layers on mini-batches: each block gathers its edges' rows of
    edge_attr by its edge ids; fanout "all" and layer-wise inference equal the full batch
    (values; gradients of the parameters, the inputs and the edge features)."""
    n = 16
    ei, w, et, x, g = graph(n, 40, 7)
    ea = torch.randn(ei.shape[1], 2, generator=g, dtype=D).requires_grad_(True)
    torch.manual_seed(0)
    layers = [sc.nn.GATConv(4, 3, heads=2, edge_dim=2).double(),
              sc.nn.GATConv(6, 3, edge_dim=2, fill_value="add", concat=False).double()]
    for m in layers:
        for p in m.parameters():
            p.data.normal_(generator=g)
    x = x.clone().requires_grad_(True)

    def full():
        return layers[1](torch.relu(layers[0](x, ei, ea)), ei, ea)

    seeds = torch.tensor([5, 0, 11, 2])
    y = full()[seeds]
    wrt = [p for m in layers for p in m.parameters()] + [x, ea]
    gy = torch.randn(y.shape, generator=g, dtype=D)
    ref = torch.autograd.grad(y, wrt, gy)
    loader = S.NeighborLoader(ei, n, ["all", -1], layers=layers, x=x, edge_attr=ea,
                              input_nodes=seeds, batch_size=4)
    (batch,) = list(loader)
    for blk in batch.bases:
        torch.testing.assert_close(blk.edge_attr, ea[blk.edge_ids])
    out = S.apply_layers(layers, batch.x, batch.bases, act=torch.relu)
    torch.testing.assert_close(out, y)
    for a, b in zip(torch.autograd.grad(out, wrt, gy), ref):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        got = S.inference(layers, x, ei, n, edge_attr=ea, batch_size=5)
        torch.testing.assert_close(got, full())
    with pytest.raises(ValueError, match=r"edge_attr must have one row per edge \(43\), got "
                                         r"\(42, 2\)"):
        S.NeighborLoader(ei, n, [2, 2], layers=layers, edge_attr=ea[:-1])


@pytest.mark.parametrize("kind", ["gcn", "cheb", "rgcn", "mixed", "gat"])
def test_layerwise_inference_equals_full_batch(kind):
    n = 19
    ei, w, et, x, g = graph(n, 50, 5)
    layers = [m.double().eval() for m in two_layers(kind)]
    y = full_forward(layers, x, ei, w, et)
    got = S.inference(layers, x, ei, n, edge_weight=w, edge_type=et, batch_size=4)
    torch.testing.assert_close(got, y.detach())


# ------------------------------------------------------------------------------------------------
# the sampler
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10 ** 6), n=st.integers(2, 15), E=st.integers(0, 60),
       fanouts=st.lists(st.sampled_from([1, 2, 3, -1]), min_size=1, max_size=3),
       weighted=st.booleans())
def test_sampled_neighbours_are_true_distinct_and_at_most_fanout(seed, n, E, fanouts, weighted):
    ei, w, et, x, g = graph(n, E, seed)
    w = torch.where(torch.rand(w.shape, generator=g) < 0.2, torch.zeros_like(w), w)
    smp = S.NeighborSampler(ei, n, w)
    seeds = torch.randperm(n, generator=g)[:3]
    s = smp.sample(seeds, fanouts, weighted=weighted,
                   generator=torch.Generator().manual_seed(seed))
    ids, loc, eid = s.node_ids, s.edge_index, s.edge_ids
    assert torch.equal(ids[:seeds.shape[0]], seeds)
    assert torch.unique(ids).numel() == ids.numel()  # every node once
    # true neighbours: the local edge is the full graph's edge of that id
    assert torch.equal(ids[loc], ei[:, eid])
    assert torch.unique(eid).numel() == eid.numel()  # without replacement
    deg = torch.bincount(ei[1], minlength=n)
    got = torch.bincount(loc[1], minlength=ids.numel())
    # each node is sampled at one hop: hop h's frontier with fanout h, min(degree, fanout) edges
    for h, f in enumerate(fanouts, start=1):
        lo = s.node_counts[h - 2] if h >= 2 else 0
        fr = slice(lo, s.node_counts[h - 1])
        want = deg[ids[fr]] if f == -1 else deg[ids[fr]].clamp(max=f)
        assert torch.equal(got[fr], want)
    assert got[s.node_counts[-2]:].sum() == 0  # the last hop's new nodes are not expanded
    # reproducible from the generator's seed
    again = smp.sample(seeds, fanouts, weighted=weighted,
                       generator=torch.Generator().manual_seed(seed))
    assert torch.equal(again.node_ids, ids) and torch.equal(again.edge_ids, eid)
    # blocks: the targets of hop h are U_{h-1}, sources within U_h
    for h in range(1, s.num_hops + 1):
        blk = s.block(h)
        assert blk.num_dst == s.node_counts[h - 1] and blk.num_src == s.node_counts[h]
        if blk.edge_index.numel():
            assert int(blk.edge_index[1].max()) < blk.num_dst
            assert int(blk.edge_index[0].max()) < blk.num_src


def star(d=10):
    """Node 0 with d incoming edges from 1..d, weights 1..d."""
    ei = torch.stack([torch.arange(1, d + 1), torch.zeros(d, dtype=torch.long)])
    return ei, torch.arange(1, d + 1, dtype=D)


def test_different_seeds_give_different_samples():
    ei, w = star()
    smp = S.NeighborSampler(ei, 11)
    draws = {tuple(smp.sample([0], [3], generator=torch.Generator().manual_seed(s))
                   .edge_ids.tolist()) for s in range(5)}
    assert len(draws) > 1


def chi2(counts, expected):
    """The p-value of Pearson's chi-square test of ``counts`` against ``expected``."""
    stats = pytest.importorskip("scipy.stats")
    e = expected.double()
    e = e * counts.sum() / e.sum()  # equal totals to float rounding, as scipy requires
    return stats.chisquare(counts.double().numpy(), e.numpy()).pvalue


@pytest.mark.parametrize("floyd", [True, False])
def test_uniform_sampling_is_uniform(floyd):
    # 10 neighbours, fanout 3, 12000 draws (one node repeated: every draw independent), by
    # Floyd's algorithm and by sorted random keys (the path of large fanouts)
    ei, _ = star()
    smp = S.NeighborSampler(ei, 11)
    if not floyd:
        smp.floyd_max_fanout = 0
    T, f = 12000, 3
    eid, seg = smp.sample_neighbors(torch.zeros(T, dtype=torch.long), f,
                                    generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.bincount(seg, minlength=T), torch.full((T,), f))
    counts = torch.bincount(eid, minlength=10)
    assert chi2(counts, torch.full((10,), T * f / 10)) > 1e-3
    # the 120 subsets are equally likely too (not only the inclusion frequencies)
    code = torch.zeros(T, dtype=torch.long).index_add(0, seg, 1 << eid)  # sets as bit masks
    _, subset_counts = torch.unique(code, return_counts=True)
    assert subset_counts.numel() == 120
    assert chi2(subset_counts, torch.full((120,), T / 120)) > 1e-3
    # and a wrong hypothesis is rejected by the same test (it has power)
    skewed = torch.full((10,), T * f / 10)
    skewed[0] *= 1.2
    skewed *= T * f / skewed.sum()
    assert chi2(counts, skewed) < 1e-3


def test_weighted_sampling_prefers_heavy_edges():
    ei, w = star()
    smp = S.NeighborSampler(ei, 11, w)
    T = 10000
    eid, _ = smp.sample_neighbors(torch.zeros(T, dtype=torch.long), 1, weighted=True,
                                  generator=torch.Generator().manual_seed(1))
    counts = torch.bincount(eid, minlength=10)
    # fanout 1: one draw proportional to the weight
    assert chi2(counts, T * w / w.sum()) > 1e-3
    eid, _ = smp.sample_neighbors(torch.zeros(T, dtype=torch.long), 3, weighted=True,
                                  generator=torch.Generator().manual_seed(2))
    counts = torch.bincount(eid, minlength=10)
    assert counts[9] > 2 * counts[0] and counts[5:].sum() > 2 * counts[:5].sum()
    # zero weights lose against every positive weight
    w0 = w.clone()
    w0[:5] = 0
    eid, _ = S.NeighborSampler(ei, 11, w0).sample_neighbors(
        torch.zeros(500, dtype=torch.long), 5, weighted=True,
        generator=torch.Generator().manual_seed(3))
    assert int(eid.min()) >= 5


# ------------------------------------------------------------------------------------------------
# the loader
def loader_args(n=30, E=90):
    ei, w, et, x, g = graph(n, E, 7)
    y = torch.randint(0, 3, (n,), generator=g)
    layers = [sc.nn.GCNConv(4, 4).double(), sc.nn.TAGConv(4, 2, K=2).double()]
    return dict(edge_index=ei, num_nodes=n, fanouts=[(2, 3), 2], layers=layers, x=x, y=y,
                batch_size=7, shuffle=True, seed=3, edge_weight=w, weighted=True)


def same_batch(a, b):
    for name in ("seeds", "node_ids", "x", "y"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(a.sample.edge_index, b.sample.edge_index)
    for u, v in zip(a.bases, b.bases):
        assert torch.equal(u.to_dense(), v.to_dense())


def test_loader_workers_equal_main_process():
    kw = loader_args()
    main = S.NeighborLoader(**kw)
    work = S.NeighborLoader(**kw, num_workers=2)
    for _ in range(2):  # two epochs: each reshuffled, the same in both
        a, b = list(main), list(work)
        assert len(a) == len(b) == len(main) == 5
        for u, v in zip(a, b):
            same_batch(u, v)
    assert not torch.equal(a[0].seeds, list(S.NeighborLoader(**kw))[0].seeds)  # epoch 1 != 0


def test_loader_epochs_cover_seeds_and_ranks_split_them():
    kw = loader_args()
    loader = S.NeighborLoader(**kw)
    batches = list(loader)
    assert [b.batch_size for b in batches] == [7, 7, 7, 7, 2]
    seen = torch.cat([b.seeds for b in batches])
    assert torch.equal(seen.sort().values, torch.arange(30))
    b0 = batches[0]
    assert torch.equal(b0.y, kw["y"][b0.seeds]) and torch.equal(b0.x, kw["x"][b0.node_ids])
    out = S.apply_layers(kw["layers"], b0.x, b0.bases, act=torch.relu)
    assert out.shape == (7, 2)
    moved = b0.to("cpu")  # bases and blocks are rebuilt around the moved tensors
    torch.testing.assert_close(S.apply_layers(kw["layers"], moved.x, moved.bases,
                                              act=torch.relu), out)
    # the same seed gives the same epochs; set_epoch replays one
    again = S.NeighborLoader(**kw)
    again.set_epoch(0)
    same_batch(next(iter(again)), b0)
    # two ranks: the epoch's batches dealt round robin, padded to equal length
    parts = [S.NeighborLoader(**kw, rank=r, world_size=2).plan(0) for r in (0, 1)]
    assert [len(p) for p in parts] == [3, 3]
    got = [p[j][0] for j in range(3) for p in parts][:5]
    for u, v in zip(got, [b.seeds for b in batches]):
        assert torch.equal(u, v)


def test_loader_without_layers_yields_blocks():
    ei, w, et, x, g = graph(12, 30, 2)
    batch = next(iter(S.NeighborLoader(ei, 12, [2, 3], batch_size=4)))
    h = batch.sample.num_hops
    assert len(batch.bases) == 2 and h == 2
    assert [b.num_dst for b in batch.bases] == [batch.sample.node_counts[1],
                                                batch.sample.node_counts[0]]


# ------------------------------------------------------------------------------------------------
# errors
def test_bad_inputs_name_the_value():
    ei, w, et, x, g = graph(12, 30, 2)
    layers = [sc.nn.GCNConv(4, 4), sc.nn.GCNConv(4, 2)]
    with pytest.raises(ValueError, match=r"fanouts has 3 entries .* 2 graph layers"):
        S.NeighborLoader(ei, 12, [5, 5, 5], layers=layers)
    with pytest.raises(ValueError, match=r"fanouts\[0\] \(1, 2\) has 2 hops"):
        S.NeighborLoader(ei, 12, [(1, 2), 5], layers=layers)
    with pytest.raises(ValueError, match=r"\[0, 11\] for 12 nodes, got values in \[-1, 12\]"):
        S.NeighborLoader(ei, 12, [5, 5], layers=layers, input_nodes=torch.tensor([-1, 3, 12]))
    with pytest.raises(ValueError, match=r"\[0, 11\] .* got values in \[3, 40\]"):
        S.NeighborSampler(ei, 12).sample(torch.tensor([3, 40]), [2])
    with pytest.raises(ValueError, match="distinct"):
        S.NeighborSampler(ei, 12).sample(torch.tensor([3, 3]), [2])
    for bs in (0, -3):
        with pytest.raises(ValueError, match=f"batch_size must be an int >= 1, got {bs}"):
            S.NeighborLoader(ei, 12, [5, 5], layers=layers, batch_size=bs)
    for f in (0, -2, "some", 2.5):
        with pytest.raises(ValueError, match=rf"fanouts\[1\] must be .* got {f!r}"):
            S.NeighborLoader(ei, 12, [5, f], layers=layers)
    with pytest.raises(ValueError, match="fanout must be a positive int, -1 or 'all', got 0"):
        S.NeighborSampler(ei, 12).sample_neighbors(torch.tensor([0]), 0)
    with pytest.raises(ValueError, match="weighted sampling needs"):
        S.NeighborSampler(ei, 12).sample([0], [2], weighted=True)
    with pytest.raises(ValueError, match=r"edge_weight must be finite and >= 0 .* got -1.0"):
        S.NeighborSampler(ei, 12, -torch.ones(ei.shape[1], dtype=D))
    with pytest.raises(ValueError, match="flow='target_to_source'"):
        S.NeighborLoader(ei, 12, [5], layers=[sc.nn.GCNConv(4, 4, flow="target_to_source")])
    with pytest.raises(ValueError, match="consumes 2 hops: from hop 0 .* got 1"):
        S.GraphRestriction("sgc", ei, 12, K=2).restrict(S.NeighborSampler(ei, 12).sample([0], [2]))
    with pytest.raises(ValueError, match="unknown graph basis kind 'grid'"):
        S.GraphRestriction("grid", ei, 12)
    with pytest.raises(ValueError, match=r"Sample hop 1: .* targets in \[0, 1\)"):
        S.Sample(torch.tensor([0, 1]), torch.tensor([[0], [1]]), torch.tensor([0]), [1, 2], [1])

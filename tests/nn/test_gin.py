"""GINConv / GINEConv equal PyG's in float64 (values and gradients, bipartite, empty edge sets),
convert with from_pyg, and a GIN with readout compiles whole, once for every batch size."""

import copy

import pytest
import torch
from torch import nn

import structconv as sc
from structconv.data import GraphDataset
from structconv.models.gin import GIN

pnn = pytest.importorskip("torch_geometric.nn")


def _mlp(P, H, Q):
    return nn.Sequential(nn.Linear(P, H), nn.Tanh(), nn.Linear(H, Q)).double()


def _graph(M, N, E, seed):
    g = torch.Generator().manual_seed(seed)
    ei = torch.stack([torch.randint(0, M, (E,), generator=g), torch.randint(0, N, (E,),
                                                                           generator=g)])
    return ei


CASES = [  # (M, N, E): odd sizes, duplicates, no edges, bipartite
    (7, 7, 19), (11, 11, 0), (5, 9, 13), (9, 4, 0), (1, 1, 3)]


def _check(ours, theirs, args, kwargs=None):
    kwargs = kwargs or {}
    y, want = ours(*args, **kwargs), theirs(*args, **kwargs)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-13)
    g = torch.randn_like(want)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    leaves += [t for a in args if isinstance(a, tuple) for t in a if t is not None]
    params = [p for p in theirs.parameters() if p.requires_grad]
    wrt = leaves + params
    got = torch.autograd.grad(y, leaves + [p for p in ours.parameters() if p.requires_grad], g)
    exp = torch.autograd.grad(want, wrt, g)
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("train_eps", [False, True])
@pytest.mark.parametrize("M,N,E", CASES)
def test_gin_equals_pyg(M, N, E, train_eps):
    torch.manual_seed(M * 31 + E)
    theirs = pnn.GINConv(_mlp(5, 6, 3), eps=0.37, train_eps=train_eps).double()
    if train_eps:
        theirs.eps.data.fill_(-0.21)
    ours = sc.nn.from_pyg(theirs)
    assert isinstance(ours, sc.nn.GINConv) and ours.nn is theirs.nn
    ei = _graph(M, N, E, M + E)
    if M == N:
        x = torch.randn(M, 5, dtype=torch.float64, requires_grad=True)
        _check(ours, theirs, (x, ei))
    xs = torch.randn(M, 5, dtype=torch.float64, requires_grad=True)
    xd = torch.randn(N, 5, dtype=torch.float64, requires_grad=True)
    _check(ours, theirs, ((xs, xd), ei))
    _check(ours, theirs, ((xs, xd), ei), {"size": (M, N)})


@pytest.mark.parametrize("edge_dim", [None, 4])
@pytest.mark.parametrize("M,N,E", CASES)
def test_gine_equals_pyg(M, N, E, edge_dim):
    torch.manual_seed(M * 17 + E)
    theirs = pnn.GINEConv(_mlp(5, 6, 3), eps=-0.4, train_eps=True, edge_dim=edge_dim).double()
    ours = sc.nn.from_pyg(theirs)
    assert isinstance(ours, sc.nn.GINEConv)
    ei = _graph(M, N, E, M * E + 1)
    ea = torch.randn(E, edge_dim or 5, dtype=torch.float64, requires_grad=True)
    xs = torch.randn(M, 5, dtype=torch.float64, requires_grad=True)
    xd = torch.randn(N, 5, dtype=torch.float64, requires_grad=True)
    _check(ours, theirs, ((xs, xd), ei, ea))
    if M == N:
        _check(ours, theirs, (xs, ei, ea))


def test_gine_edge_feature_gradient_equals_pyg():
    theirs = pnn.GINEConv(_mlp(3, 4, 2), edge_dim=2).double()
    ours = sc.nn.from_pyg(theirs)
    ei = _graph(6, 6, 15, 3)
    x = torch.randn(6, 3, dtype=torch.float64)
    ea = torch.randn(15, 2, dtype=torch.float64, requires_grad=True)
    g = torch.randn(6, 2, dtype=torch.float64)
    a = torch.autograd.grad(ours(x, ei, ea), ea, g)[0]
    b = torch.autograd.grad(theirs(x, ei, ea), ea, g)[0]
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_construction_and_reset_like_pyg():
    torch.manual_seed(0)
    gin = sc.nn.GINConv(_mlp(3, 4, 2), eps=0.5, train_eps=True)
    assert isinstance(gin.eps, nn.Parameter) and float(gin.eps.detach()) == 0.5
    with torch.no_grad():
        gin.eps.fill_(3.0)
    w = gin.nn[0].weight.clone()
    gin.reset_parameters()
    assert float(gin.eps.detach()) == 0.5 and not torch.equal(w, gin.nn[0].weight)
    fixed = sc.nn.GINConv(nn.Identity())
    assert "eps" in dict(fixed.named_buffers()) and not list(fixed.parameters())
    gine = sc.nn.GINEConv(nn.Sequential(nn.Linear(7, 3)), edge_dim=2)
    assert gine.lin.in_features == 2 and gine.lin.out_features == 7
    with pytest.raises(ValueError, match="input channels"):
        sc.nn.GINEConv(nn.ReLU(), edge_dim=2)


def test_bad_inputs_name_what_is_wrong():
    gin = sc.nn.GINConv(nn.Identity())
    with pytest.raises(ValueError, match="edge_index"):
        gin(torch.randn(3, 2), torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="floating"):
        gin(torch.zeros(3, 2, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long))
    gine = sc.nn.GINEConv(nn.Identity())
    with pytest.raises(ValueError, match="edge_attr"):
        gine(torch.randn(3, 2), torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="edge_dim"):
        gine(torch.randn(3, 2), torch.zeros(2, 1, dtype=torch.long), torch.randn(1, 5))


def test_from_pyg_keeps_the_nn_and_refuses_overrides():
    theirs = pnn.GINConv(_mlp(3, 4, 2))
    w = theirs.nn[0].weight.clone()
    ours = sc.nn.from_pyg(theirs)
    assert ours.nn is theirs.nn and torch.equal(theirs.nn[0].weight, w)  # not re-initialised

    class Mine(pnn.GINConv):
        def message(self, x_j):
            return 2 * x_j

    with pytest.raises(ValueError, match="overrides message"):
        sc.nn.from_pyg(Mine(nn.Identity()))


# -- the model and torch.compile ------------------------------------------------------------------
def _dataset(G=40, P=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(G):
        n = int(torch.randint(2, 9, (1,), generator=g))
        e = int(torch.randint(1, 3 * n, (1,), generator=g))
        graphs.append({"x": torch.randn(n, P, generator=g),
                       "edge_index": torch.randint(0, n, (2, e), generator=g),
                       "y": torch.randint(0, 2, (1,), generator=g)})
    return GraphDataset.from_graphs(graphs)


def _run(model, b):
    return model(b.x, b.edge_index, b.batch, b.num_graphs)


def test_gin_model_equals_pyg_gin_with_the_same_weights():
    torch.manual_seed(3)
    model = GIN(4, 8, 3, layers=3).double().eval()
    convs = [pnn.GINConv(copy.deepcopy(c.nn)) for c in model.convs]
    for c, mine in zip(convs, model.convs):  # (PyG's constructor re-initialises its nn)
        c.nn.load_state_dict(mine.nn.state_dict())
    b = _dataset().batch(range(12)).to(dtype=torch.float64)
    h = b.x
    for c in convs:
        h = c(h, b.edge_index)
    want = model.head(pnn.global_add_pool(h, b.batch))
    torch.testing.assert_close(_run(model, b), want, rtol=1e-12, atol=1e-12)


def test_cold_compiled_gin_with_readout_equals_eager():
    torch.manual_seed(4)
    model = GIN(4, 8, 2, layers=2).eval()
    ref = copy.deepcopy(model)
    b = _dataset().batch(range(10))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)  # never run eagerly before
    y = _run(compiled, b)
    torch.testing.assert_close(y, _run(ref, b), rtol=1e-4, atol=1e-5)


def test_compiled_gin_does_not_recompile_per_batch_size():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(5)
    model = GIN(4, 8, 2, layers=2, readout="mean")
    ds = _dataset(G=60)
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    first = None
    for idx in (range(0, 16), range(16, 29), range(29, 60), range(7)):
        b = ds.batch(list(idx))
        y = _run(compiled, b)
        y.sum().backward()
        torch.testing.assert_close(y, _run(model, b), rtol=1e-5, atol=1e-5)
        first = counter.frame_count if first is None else first
    # (the first call may trace twice: Dynamo restarts once to turn Python floats into tensors)
    assert counter.frame_count == first <= 2


def test_gin_takes_a_built_sum_basis():
    theirs = pnn.GINConv(_mlp(5, 6, 3), eps=0.2).double()
    ours = sc.nn.from_pyg(theirs)
    ei = _graph(8, 8, 20, 9)
    x = torch.randn(8, 5, dtype=torch.float64)
    A = sc.basis.adjacency(ei, 8, dtype=torch.float64)
    torch.testing.assert_close(ours(x, A), theirs(x, ei), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(A.to_dense()[0], torch.zeros(8, 8, dtype=torch.float64)
                               .index_put_((ei[0], ei[1]), torch.ones(20, dtype=torch.float64),
                                           accumulate=True))
    with pytest.raises(ValueError, match="given basis"):
        ours(x[:5], A)


def test_a_pair_without_targets_equals_pyg():
    theirs = pnn.GINEConv(_mlp(3, 4, 2), edge_dim=2).double()
    ours = sc.nn.from_pyg(theirs)
    gin_theirs = pnn.GINConv(_mlp(3, 4, 2)).double()
    gin = sc.nn.from_pyg(gin_theirs)
    xs = torch.randn(5, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 4, 4], [2, 0, 3, 6]])
    ea = torch.randn(4, 2, dtype=torch.float64)
    for size in ((5, 7), (None, 9)):
        torch.testing.assert_close(ours((xs, None), ei, ea, size=size),
                                   theirs((xs, None), ei, ea, size=size))
        torch.testing.assert_close(gin((xs, None), ei, size=size),
                                   gin_theirs((xs, None), ei, size=size))
    # without a size: as many targets as sources (PyG's), so target 6 is out of range
    torch.testing.assert_close(gin((xs, None), ei[:, :3]), gin_theirs((xs, None), ei[:, :3]))
    with pytest.raises(ValueError, match="target ids"):
        gin((xs, None), ei)


@pytest.mark.parametrize("kwargs", [{"aggr": "mean"}, {"aggr": "max"},
                                    {"flow": "target_to_source"}])
def test_from_pyg_refuses_other_aggregations_and_flows(kwargs):
    for layer in (pnn.GINConv(nn.Identity(), **kwargs), pnn.GINEConv(nn.Identity(), **kwargs)):
        with pytest.raises(ValueError, match="only"):
            sc.nn.from_pyg(layer)
    assert isinstance(sc.nn.from_pyg(pnn.GINConv(nn.Identity(), aggr="sum")), sc.nn.GINConv)


def test_gine_model_equals_pyg_gine_with_the_same_weights():
    torch.manual_seed(6)
    model = GIN(4, 8, 2, layers=2, edge_dim=3, train_eps=True).double().eval()
    twins = []
    for conv in model.convs:
        twin = pnn.GINEConv(copy.deepcopy(conv.nn), train_eps=True, edge_dim=3).double()
        twin.load_state_dict(conv.state_dict())
        twins.append(twin)
    g = torch.Generator().manual_seed(1)
    graphs = [{"x": torch.randn(n, 4, generator=g), "edge_index": torch.randint(0, n, (2, 2 * n),
                                                                                 generator=g),
               "edge_attr": torch.randn(2 * n, 3, generator=g)} for n in (3, 6, 4)]
    b = GraphDataset.from_graphs(graphs).batch().to(dtype=torch.float64)
    h = b.x
    for t in twins:
        h = t(h, b.edge_index, b.edge_attr)
    want = model.head(pnn.global_add_pool(h, b.batch))
    got = model(b.x, b.edge_index, b.batch, b.num_graphs, b.edge_attr)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)

"""Graph layers against PyG (float64, every option), gradients, caching and errors."""

import pytest
import torch

import structconv as sc
from structconv.basis import graph

pyg = pytest.importorskip("torch_geometric.nn", reason="PyG (torch_geometric) is not installed")

D = torch.float64
N, P, Q = 13, 6, 4
FLOWS = ["source_to_target", "target_to_source"]


def random_graph(seed=0, E=40, isolated=2, R=4):
    """Directed, with duplicate edges, self loops (one duplicated), isolated last nodes."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N - isolated, (2, E), generator=g)
    ei = torch.cat([ei, ei[:, :4], torch.tensor([[3, 4, 4], [3, 4, 4]])], 1)
    w = torch.rand(ei.shape[1], generator=g, dtype=D) + 0.2
    et = torch.randint(0, R, (ei.shape[1],), generator=g)
    x = torch.randn(N, P, generator=g, dtype=D)
    return x, ei, w, et


def randomize_(module, seed=0):
    """Random weights everywhere (PyG zero-initialises biases)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def check(ref, *args, grad=True):
    ref = randomize_(ref.double()).eval()
    ours = sc.nn.from_pyg(ref)
    y_ref, y = ref(*args), ours(*args)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    if grad:
        g = torch.randn_like(y_ref)
        gr = torch.autograd.grad(y_ref, list(ref.parameters()), g)
        go = torch.autograd.grad(y, list(ours.parameters()), g)
        # compare through the totals: every parameter's gradient contracted with its value
        tot_r = sum((a * b).sum() for a, b in zip(gr, ref.parameters()))
        tot_o = sum((a * b).sum() for a, b in zip(go, ours.parameters()))
        torch.testing.assert_close(tot_o, tot_r, rtol=1e-10, atol=1e-10)
    return ours


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("opts", [
    {}, {"improved": True}, {"add_self_loops": False}, {"normalize": False},
    {"bias": False}, {"cached": True},
])
@pytest.mark.parametrize("weighted", [False, True])
def test_gcnconv(flow, opts, weighted):
    x, ei, w, _ = random_graph(1)
    args = (x, ei, w) if weighted else (x, ei)
    ours = check(pyg.GCNConv(P, Q, flow=flow, **opts), *args)
    assert isinstance(ours, sc.nn.GCNConv)
    torch.testing.assert_close(ours(*args), ours(*args))  # cached path on the second call


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("normalization", ["sym", "rw", None])
def test_chebconv(flow, K, normalization):
    x, ei, w, _ = random_graph(2)
    mod = pyg.ChebConv(P, Q, K, normalization=normalization, flow=flow)
    check(mod, x, ei, w)
    check(mod, x, ei)
    check(pyg.ChebConv(P, Q, K, normalization=normalization, bias=False, flow=flow), x, ei, w)


def test_chebconv_lambda_max_at_call():
    x, ei, w, _ = random_graph(3)
    ref = randomize_(pyg.ChebConv(P, Q, 3).double()).eval()
    ours = sc.nn.from_pyg(ref)
    batch = torch.tensor([0] * 6 + [1] * (N - 6))
    for lam in (3.0, torch.tensor(2.5, dtype=D)):
        torch.testing.assert_close(ours(x, ei, w, None, lam), ref(x, ei, w, None, lam))
        torch.testing.assert_close(ours(x, ei, w, lambda_max=lam), ref(x, ei, w, lambda_max=lam))
    lam = torch.tensor([2.5, 3.5], dtype=D)
    torch.testing.assert_close(ours(x, ei, w, batch, lam), ref(x, ei, w, batch, lam))


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("K", [0, 1, 3])
@pytest.mark.parametrize("opts", [{}, {"normalize": False}, {"bias": False}])
def test_tagconv(flow, K, opts):
    x, ei, w, _ = random_graph(4)
    check(pyg.TAGConv(P, Q, K=K, flow=flow, **opts), x, ei, w)
    check(pyg.TAGConv(P, Q, K=K, flow=flow, **opts), x, ei)


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("opts", [{}, {"add_self_loops": False}, {"bias": False}])
def test_sgconv(flow, K, opts):
    x, ei, w, _ = random_graph(5)
    check(pyg.SGConv(P, Q, K=K, flow=flow, **opts), x, ei, w)
    check(pyg.SGConv(P, Q, K=K, flow=flow, **opts), x, ei)


def test_sgconv_cached_features_are_keyed_safely():
    x, ei, w, _ = random_graph(6)
    ref = randomize_(pyg.SGConv(P, Q, K=2, cached=True).double()).eval()
    ours = check(ref, x, ei, w, grad=False)
    torch.testing.assert_close(ours(x, ei, w), ref(x, ei, w))  # answered from the cache
    # unlike PyG's cache, a new input is never answered with the stale features
    x2 = torch.randn_like(x)
    fresh = randomize_(pyg.SGConv(P, Q, K=2).double()).eval()
    torch.testing.assert_close(ours(x2, ei, w), fresh(x2, ei, w))
    x.add_(1.0)  # in place: the version counter invalidates the cache
    torch.testing.assert_close(ours(x, ei, w), fresh(x, ei, w))


@pytest.mark.parametrize("cls", ["RGCNConv", "FastRGCNConv"])
@pytest.mark.parametrize("opts", [
    {}, {"num_bases": 3}, {"num_blocks": 2}, {"aggr": "add"}, {"aggr": "sum", "num_bases": 2},
    {"root_weight": False}, {"bias": False}, {"is_sorted": True},
])
@pytest.mark.parametrize("flow", FLOWS)
def test_rgcnconv(cls, opts, flow):
    x, ei, _, et = random_graph(7)
    mod = getattr(pyg, cls)(P, Q, 5, flow=flow, **opts)  # relation 4 has no edge
    check(mod, x, ei, et)


@pytest.mark.parametrize("opts", [{}, {"num_bases": 2}, {"aggr": "add"}])
def test_rgcnconv_featureless_and_bipartite(opts):
    x, ei, _, et = random_graph(8)
    check(pyg.RGCNConv(N, Q, 4, **opts), None, ei, et)
    idx = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    check(pyg.RGCNConv(N, Q, 4, **opts), idx, ei, et)
    # bipartite: 13 sources with P features, 9 targets with 3 features
    keep = ei[1] < 9
    x_r = torch.randn(9, 3, dtype=D)
    check(pyg.RGCNConv((P, 3), Q, 4, **opts), (x, x_r), ei[:, keep], et[keep])


def test_rgcn_num_bases_is_controlled_separability():
    ours = sc.nn.RGCNConv(P, Q, 5, num_bases=3)
    assert isinstance(ours.param, sc.params.ControlledSeparable) and ours.param.H == 3
    assert isinstance(sc.nn.RGCNConv(P, Q, 5, num_blocks=2).param, sc.params.Grouped)


def test_native_layers_run_batched_and_match_unbatched():
    x, ei, w, et = random_graph(9)
    for layer in (sc.nn.GCNConv(P, Q), sc.nn.ChebConv(P, Q, 3), sc.nn.TAGConv(P, Q, 2),
                  sc.nn.SGConv(P, Q, 2)):
        layer = layer.double()
        xb = torch.stack([x, 2 * x])
        yb = layer(xb, ei, w)
        torch.testing.assert_close(yb[1], layer(2 * x, ei, w))


def test_layers_share_the_graph_structure():
    graph.clear_graph_cache()
    x, ei, w, _ = random_graph(10)
    l1, l2 = sc.nn.GCNConv(P, Q).double(), sc.nn.GCNConv(Q, Q).double()
    h = l1(x, ei, w)
    l2(h, ei, w)
    assert l1.basis(x, ei, w) is l2.basis(h, ei, w)
    info = graph.graph_cache_info()
    assert info["misses"] == 1 and info["hits"] >= 1
    # not cached: built anew each call
    l3 = sc.nn.GCNConv(P, Q, cached=False).double()
    assert l3.basis(x, ei, w) is not l3.basis(x, ei, w)


def test_layer_gradients_reach_x_and_edge_weights():
    x, ei, w, _ = random_graph(11, E=15)
    keep = ei[0] != ei[1]
    ei, w = ei[:, keep], w[keep]
    ref = randomize_(pyg.GCNConv(P, Q).double()).eval()
    ours = sc.nn.from_pyg(ref)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref(xr, ei, wr).square().sum().backward()
    ours(xo, ei, wo).square().sum().backward()
    torch.testing.assert_close(xo.grad, xr.grad)
    torch.testing.assert_close(wo.grad, wr.grad)


def test_planner_applies_theta_first_for_narrow_outputs():
    x, ei, w, et = random_graph(12)
    wide = torch.randn(N, 64, dtype=D)
    assert sc.nn.GCNConv(64, 2).double().plan(wide, ei).route == "input_param"
    assert sc.nn.GCNConv(2, 64).double().plan(wide[:, :2], ei).route == "basis_input"
    assert sc.nn.RGCNConv(64, 2, 4).double().plan(wide, ei, et).route == "input_param"


def test_layer_errors():
    x, ei, w, et = random_graph(13)
    with pytest.raises(ValueError, match="self loops without normalize"):
        sc.nn.GCNConv(P, Q, add_self_loops=True, normalize=False)
    with pytest.raises(ValueError, match="aggr"):
        sc.nn.from_pyg(pyg.GCNConv(P, Q, aggr="max"))
    with pytest.raises(ValueError, match="aggr"):
        sc.nn.from_pyg(pyg.RGCNConv(P, Q, 4, aggr="max"))
    with pytest.raises(ValueError, match="in_channels=6 but x has 5"):
        sc.nn.GCNConv(P, Q)(x[:, :5], ei)
    with pytest.raises(ValueError, match="adjacency is 2 x 47"):  # read as an adj_t
        sc.nn.GCNConv(P, Q)(x.float(), ei.to_sparse())
    with pytest.raises(ValueError, match="edge_index source ids"):
        sc.nn.GCNConv(P, Q)(x[:3].float(), ei)
    with pytest.raises(ValueError, match="K must be"):
        sc.nn.ChebConv(P, Q, 0)
    with pytest.raises(ValueError, match="normalization"):
        sc.nn.ChebConv(P, Q, 2, normalization="lap")
    with pytest.raises(ValueError, match="flow"):
        sc.nn.TAGConv(P, Q, flow="sideways")
    with pytest.raises(ValueError, match="needs edge_type"):
        sc.nn.RGCNConv(P, Q, 4)(x.float(), ei)
    with pytest.raises(ValueError, match="num_bases and num_blocks"):
        sc.nn.RGCNConv(P, Q, 4, num_bases=2, num_blocks=2)
    with pytest.raises(ValueError, match=r"x \(source\) features \(N, 6\)"):
        sc.nn.RGCNConv(P, Q, 4)(x[:, :5].float(), ei, et)
    with pytest.raises(ValueError, match="featureless x"):
        sc.nn.RGCNConv(N, Q, 4)(torch.arange(N + 1), ei, et)
    with pytest.raises(ValueError, match="num_relations=3"):
        sc.nn.RGCNConv(P, Q, 3)(x.float(), ei, et)
    with pytest.raises(TypeError, match="from_pyg does not know"):
        sc.nn.from_pyg(torch.nn.Linear(2, 2))


# ------------------------------------------------------- kept plans, copies and pickles
def test_a_graph_layer_keeps_its_plan_per_graph_and_shape():
    torch.manual_seed(0)
    layer = sc.nn.GCNConv(5, 3)
    ei, ei2 = torch.randint(0, 9, (2, 30)), torch.randint(0, 9, (2, 20))
    x = torch.randn(9, 5, dtype=torch.float64)
    layer = layer.double()
    y = layer(x, ei)
    assert len(layer._plans) == 1
    p = next(iter(layer._plans.values()))[1]
    assert layer.plan_for(layer.basis(x, ei), x.unsqueeze(0)) is p  # kept, not planned again
    torch.testing.assert_close(y, sc.convolve(x, layer.basis(x, ei), layer.param,
                                              bias=layer.bias), rtol=0, atol=1e-13)
    layer(x, ei2)
    layer(torch.randn(2, 9, 5, dtype=torch.float64), ei)  # another call shape
    assert len(layer._plans) == 3
    # a new graph (new basis object) never reuses a plan of a freed basis whose id recurs
    for _ in range(40):
        e = torch.randint(0, 9, (2, 25))
        torch.testing.assert_close(layer(x, e), sc.convolve(x, layer.basis(x, e), layer.param,
                                                            bias=layer.bias),
                                   rtol=0, atol=1e-13)
    assert len(layer._plans) <= 16


@pytest.mark.parametrize("make", [lambda: sc.nn.GCNConv(4, 3), lambda: sc.nn.SGConv(4, 3, K=2),
                                  lambda: sc.nn.ChebConv(4, 3, K=3)])
def test_a_called_graph_layer_pickles_and_deep_copies(make):
    import copy
    import io

    layer = make()
    ei, x = torch.randint(0, 10, (2, 30)), torch.randn(10, 4)
    y = layer(x, ei)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for other in (copy.deepcopy(layer), torch.load(buf, weights_only=False)):
        assert other._plans == {}
        torch.testing.assert_close(other(x, ei), y)


def test_a_called_grid_layer_pickles_and_deep_copies():
    import copy
    import pickle

    conv = sc.nn.from_torch(torch.nn.Conv2d(3, 4, 3, padding=1))
    x = torch.randn(2, 3, 8, 8)
    y = conv(x)
    for other in (copy.deepcopy(conv), pickle.loads(pickle.dumps(conv))):
        assert other.basis is not None and other._plans == {}
        torch.testing.assert_close(other(x), y)

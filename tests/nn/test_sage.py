"""SAGEConv against PyG's in float64: homogeneous and bipartite, every aggregation and option."""

import pytest
import torch

import structconv as sc

pyg = pytest.importorskip("torch_geometric.nn")


def _graph(M, N, E, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, M, (E,), generator=g)
    dst = torch.randint(0, max(N // 2, 1), (E,), generator=g)  # half the targets isolated
    return torch.stack([src, dst])


CASES = [
    # (in_channels, out, M, N, E, kwargs)
    (7, 5, 13, 13, 40, {}),
    (9, 3, 11, 11, 30, {"aggr": "sum"}),
    (6, 11, 10, 10, 25, {"aggr": "max"}),
    ((7, 4), 5, 13, 6, 30, {}),                           # bipartite, odd shapes
    ((5, 8), 9, 9, 17, 20, {"aggr": "max", "root_weight": False}),
    ((6, 3), 4, 8, 5, 0, {}),                             # zero edges
    (7, 5, 12, 12, 30, {"project": True}),
    ((7, 3), 13, 12, 7, 30, {"normalize": True, "aggr": "add"}),
    (5, 6, 9, 9, 20, {"bias": False, "project": True, "normalize": True}),
]


@pytest.mark.parametrize("cin,cout,M,N,E,kw", CASES)
def test_sage_equals_pyg(cin, cout, M, N, E, kw):
    torch.manual_seed(1)
    ref = pyg.SAGEConv(cin, cout, **kw).double()
    ours = sc.nn.from_pyg(ref)
    assert isinstance(ours, sc.nn.SAGEConv)
    ei = _graph(M, N, E)
    P_src, P_dst = cin if isinstance(cin, tuple) else (cin, cin)
    xs = torch.randn(M, P_src, dtype=torch.float64, requires_grad=True)
    xd = torch.randn(N, P_dst, dtype=torch.float64, requires_grad=True)
    x = xs if not isinstance(cin, tuple) else (xs, xd)
    want, got = ref(x, ei), ours(x, ei)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(want)
    gw = torch.autograd.grad(want, [xs, xd, ref.lin_l.weight], g, allow_unused=True)
    gg = torch.autograd.grad(got, [xs, xd, ours.param.weight], g, allow_unused=True)
    for a, b in zip(gw[:2], gg[:2]):
        if a is None:
            assert b is None or not b.abs().any()
        else:
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gg[2][0], gw[2].t(), rtol=1e-12, atol=1e-12)


def test_sage_dst_none_and_size():
    ref = pyg.SAGEConv((4, 6), 3).double()
    ours = sc.nn.from_pyg(ref)
    xs = torch.randn(7, 4, dtype=torch.float64)
    ei = torch.tensor([[0, 6, 3], [1, 2, 2]])
    torch.testing.assert_close(ours((xs, None), ei, size=(7, 5)), ref((xs, None), ei,
                                                                     size=(7, 5)))


def test_sage_reset_and_errors():
    m = sc.nn.SAGEConv(4, 3)
    w = m.param.weight.detach().clone()
    m.reset_parameters()
    assert not torch.equal(w, m.param.weight)
    with pytest.raises(ValueError, match="aggr"):
        sc.nn.SAGEConv(4, 3, aggr="median-ish")
    with pytest.raises(ValueError, match="in_channels"):
        sc.nn.SAGEConv((4, 3, 2), 3)
    with pytest.raises(ValueError, match=r"x_src must be floating \(N, 4\)"):
        m(torch.randn(5, 3), torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="edge_index"):
        m(torch.randn(5, 4), torch.tensor([[0], [9]]))


def test_sage_project_first_when_narrow():
    # mean aggregation is a rectangular basis: the planner projects before propagating
    m = sc.nn.SAGEConv((64, 8), 4)
    ei = _graph(30, 10, 60)
    from structconv.nn.sage import sage_basis
    b = sage_basis(ei, 30, 10)
    assert b.shape == (1, 30, 10)
    p = sc.plan(torch.randn(1, 30, 64), b, m.param)
    assert p.route in ("input", "input_side", "theta_first") or "input" in p.route


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_sage_compiles_whole_and_equals_eager(aggr):
    torch.manual_seed(0)
    layer = sc.nn.SAGEConv((6, 3), 4, aggr=aggr)
    xs = torch.randn(24, 6, requires_grad=True)
    xd = torch.randn(10, 3, requires_grad=True)
    ei = torch.stack([torch.randint(0, 24, (50,)), torch.randint(0, 10, (50,))])
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    y, yc = layer((xs, xd), ei), compiled((xs, xd), ei)
    torch.testing.assert_close(yc, y, rtol=1e-4, atol=1e-5)
    g = torch.randn_like(y)
    wrt = [xs, xd, *layer.parameters()]
    for a, b in zip(torch.autograd.grad(yc, wrt, g), torch.autograd.grad(y, wrt, g)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

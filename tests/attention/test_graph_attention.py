"""GATConv (edge features), GATv2Conv and TransformerConv against PyG's layers (float64).

Values, attention weights and the gradients of inputs, edge features and every parameter, on
random directed graphs with isolated nodes, existing self loops and duplicate edges, for every
option; bipartite blocks, training-mode dropout and empty graphs too.
"""

import itertools

import pytest
import torch

import structconv as sc
from structconv import attention as at

pyg = pytest.importorskip("torch_geometric.nn", reason="PyG is the reference of these layers")

DT = torch.float64


def _rand(*shape):
    return torch.randn(*shape, dtype=DT)


def _graph(seed, n=9, e=24):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 2, (2, e), generator=g)  # nodes n-2, n-1 isolated
    loops = torch.tensor([[3, 3, 1], [3, 3, 2]])  # an existing self loop, twice
    return torch.cat([ei, loops, ei[:, :2]], 1)  # and duplicate edges


def _perturb(module, scale=0.3):
    with torch.no_grad():  # biases start at zero: make every parameter count
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))
    return module


def _leaf(t):
    return t.detach().clone().requires_grad_() if isinstance(t, torch.Tensor) and \
        t.is_floating_point() else t


def _leaves(args):
    return [tuple(_leaf(t) for t in a) if isinstance(a, tuple) else _leaf(a) for a in args]


def _tensors(args):
    for a in args:
        for t in (a if isinstance(a, tuple) else (a,)):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                yield t


def _same(ref, mine, args, **kw):
    """Outputs, attention weights, and gradients of inputs (edge features included) and of
    every parameter, by name, equal to float64 rounding."""
    a1, a2 = _leaves(args), _leaves(args)
    o1, o2 = ref(*a1, **kw), mine(*a2, **kw)
    if isinstance(o1, tuple):
        (o1, (e1, w1)), (o2, (e2, w2)) = o1, o2
        assert torch.equal(e1, e2)
        torch.testing.assert_close(w2, w1)
    torch.testing.assert_close(o2, o1)
    g = torch.randn_like(o1)
    (o1 * g).sum().backward()
    (o2 * g).sum().backward()
    for t1, t2 in zip(_tensors(a1), _tensors(a2)):
        torch.testing.assert_close(t2.grad, t1.grad)
    names = [n for n, _ in ref.named_parameters()]
    assert names == [n for n, _ in mine.named_parameters()]
    for (n, p1), (_, p2) in zip(ref.named_parameters(), mine.named_parameters()):
        if p1.grad is None:
            assert p2.grad is None or not p2.grad.any(), n
        else:
            torch.testing.assert_close(p2.grad, p1.grad, msg=n)


def _features(edge_dim, E):
    if edge_dim is None:
        return None
    return _rand(E) if edge_dim == 1 else _rand(E, edge_dim)  # (E,) when edge_dim is 1


FILLS = ["mean", "add", "max", "min", "mul", 0.5, None, "tensor"]


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("edge_dim", [1, 3])
def test_gatconv_with_edge_features_matches_pyg(fill, edge_dim):
    ei = _graph(edge_dim)
    x = _rand(9, 5)
    for heads, concat, loops, residual in itertools.product((1, 3), (True, False), (True, False),
                                                            (False, True)):
        torch.manual_seed(heads + 2 * concat + 4 * loops + 8 * residual)
        fv = _rand(edge_dim) if fill == "tensor" else fill
        ref = _perturb(pyg.GATConv(5, 4, heads=heads, concat=concat, add_self_loops=loops,
                                   edge_dim=edge_dim, fill_value=fv, residual=residual,
                                   dropout=0.3).to(DT)).eval()
        mine = sc.nn.from_pyg(ref)
        assert isinstance(mine, sc.nn.GATConv) and not mine.training
        ea = _features(edge_dim, ei.shape[1])
        _same(ref, mine, (x, ei, ea), return_attention_weights=True)
        _same(ref, mine, (x, ei))  # edge_dim without edge_attr: no edge term, as PyG


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("edge_dim", [None, 1, 3])
def test_gatv2conv_matches_pyg(fill, edge_dim):
    ei = _graph(7 + (edge_dim or 0))
    x = _rand(9, 5)
    options = itertools.product((1, 3), (True, False), (True, False), (False, True), (False, True),
                                (True, False))
    for heads, concat, loops, share, residual, bias in options:
        torch.manual_seed(heads + 2 * concat + 4 * loops + 8 * share + 16 * residual)
        fv = _rand(edge_dim or 1) if fill == "tensor" else fill
        ref = _perturb(pyg.GATv2Conv(5, 4, heads=heads, concat=concat, add_self_loops=loops,
                                     edge_dim=edge_dim, fill_value=fv, share_weights=share,
                                     residual=residual, bias=bias, negative_slope=0.3,
                                     dropout=0.2).to(DT)).eval()
        mine = sc.nn.from_pyg(ref)
        assert isinstance(mine, sc.nn.GATv2Conv)
        _same(ref, mine, (x, ei, _features(edge_dim, ei.shape[1])),
              return_attention_weights=True)


@pytest.mark.parametrize("edge_dim", [None, 1, 3])
@pytest.mark.parametrize("heads", [1, 3])
def test_transformerconv_matches_pyg(edge_dim, heads):
    ei = _graph(11 + heads)
    x = _rand(9, 5)
    for concat, beta, root, bias in itertools.product((True, False), repeat=4):
        torch.manual_seed(heads + 2 * concat + 4 * beta + 8 * root + 16 * bias)
        ref = _perturb(pyg.TransformerConv(5, 4, heads=heads, concat=concat, beta=beta,
                                           root_weight=root, edge_dim=edge_dim, bias=bias,
                                           dropout=0.4).to(DT)).eval()
        mine = sc.nn.from_pyg(ref)
        assert isinstance(mine, sc.nn.TransformerConv) and mine.beta == ref.beta
        ea = None if edge_dim is None else _rand(ei.shape[1], edge_dim)
        # weights are returned for either bool, as PyG
        _same(ref, mine, (x, ei, ea), return_attention_weights=False)
        _same(ref, mine, (x, ei, ea))


@pytest.mark.parametrize("layer", ["GATConv", "GATv2Conv", "TransformerConv"])
@pytest.mark.parametrize("M,N", [(9, 6), (6, 9)])
def test_bipartite_blocks_match_pyg(layer, M, N):
    g = torch.Generator().manual_seed(M)
    ei = torch.stack([torch.randint(0, M, (30,), generator=g),
                      torch.randint(0, N, (30,), generator=g)])
    ei = torch.cat([ei, torch.tensor([[2, 2], [2, 2]])], 1)
    xs, xd = _rand(M, 5), _rand(N, 4)
    for edge_dim, fill in itertools.product((None, 2), ("mean", 0.3)):
        kw = {} if layer == "TransformerConv" else {"fill_value": fill}
        torch.manual_seed(M + (edge_dim or 0))
        ref = _perturb(getattr(pyg, layer)((5, 4), 3, heads=2, edge_dim=edge_dim, **kw)
                       .to(DT)).eval()
        mine = sc.nn.from_pyg(ref)
        ea = None if edge_dim is None else _rand(ei.shape[1], edge_dim)
        if layer != "TransformerConv" and edge_dim and fill == "mean" and N > M:
            # targets beyond the min(M, N) self loops: PyG's scatter fails; structconv fills
            # each loop from its node's incoming edges, the others not counted
            with pytest.raises(RuntimeError):
                ref((xs, xd), ei, ea)
            out = mine((xs, xd), ei, ea)
            assert out.shape == (N, 6) and torch.isfinite(out).all()
            continue
        _same(ref, mine, ((xs, xd), ei, ea))
    if layer == "GATConv":  # no target features: the size says how many targets
        ref = _perturb(pyg.GATConv((5, 4), 3, heads=2).to(DT)).eval()
        _same(ref, sc.nn.from_pyg(ref), ((xs, None), ei, None), size=(M, N))


@pytest.mark.parametrize("layer", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_training_dropout_draws_the_same_masks_as_pyg(layer):
    x, ei = _rand(9, 5), _graph(3)
    ea = _rand(ei.shape[1], 2)
    ref = _perturb(getattr(pyg, layer)(5, 3, heads=2, edge_dim=2, dropout=0.5).to(DT)).train()
    mine = sc.nn.from_pyg(ref)
    assert mine.training
    # the weights' dropout is the forward pass's only draw: one seed, the same mask
    torch.manual_seed(5)
    o1, (_, w1) = ref(x, ei, ea, return_attention_weights=True)
    torch.manual_seed(5)
    o2, (_, w2) = mine(x, ei, ea, return_attention_weights=True)
    torch.testing.assert_close(o2, o1)
    torch.testing.assert_close(w2, w1)  # TransformerConv's before dropout, GAT's after
    assert (w2 == 0).any() == (layer != "TransformerConv")


@pytest.mark.parametrize("layer", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_empty_graph_and_cached_structure(layer):
    x, ei = _rand(9, 5), _graph(4)
    ref = _perturb(getattr(pyg, layer)(5, 3, heads=2, edge_dim=2).to(DT)).eval()
    mine = sc.nn.from_pyg(ref)
    e0 = torch.zeros(2, 0, dtype=torch.long)
    torch.testing.assert_close(mine(x, e0, _rand(0, 2)), ref(x, e0, _rand(0, 2)))
    ea = _rand(ei.shape[1], 2)
    first = mine(x, ei, ea)
    ei2 = ei.clone()
    ei2[1, 0] = 8  # an edit of the same-shaped graph is seen (content-checked cache)
    torch.testing.assert_close(mine(x, ei2, ea), ref(x, ei2, ea))
    torch.testing.assert_close(mine(x, ei, ea), first)


def test_layers_refuse_bad_edge_features_by_name():
    x, ei = _rand(9, 5), _graph(5)
    E = ei.shape[1]
    for layer in (sc.nn.GATConv(5, 3), sc.nn.GATv2Conv(5, 3), sc.nn.TransformerConv(5, 3)):
        with pytest.raises(ValueError, match="edge_dim"):
            layer.double()(x, ei, _rand(E, 2))  # features without edge_dim
    for layer in (sc.nn.GATConv(5, 3, edge_dim=2), sc.nn.GATv2Conv(5, 3, edge_dim=2),
                  sc.nn.TransformerConv(5, 3, edge_dim=2)):
        layer = layer.double()
        with pytest.raises(ValueError, match=f"\\({E}, 2\\)"):
            layer(x, ei, _rand(E - 1, 2))
        with pytest.raises(ValueError, match=f"\\({E}, 2\\)"):
            layer(x, ei, _rand(E))  # (E,) only when edge_dim is 1
        with pytest.raises(TypeError, match="floating"):
            layer(x, ei, torch.ones(E, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="needs edge_attr"):
        sc.nn.TransformerConv(5, 3, edge_dim=2).double()(x, ei)
    with pytest.raises(ValueError, match="outside"):
        sc.nn.GATConv(5, 3).double()(x, torch.tensor([[0], [9]]))
    with pytest.raises(TypeError, match="integer"):  # a dtype error, not a shape error
        sc.nn.GATv2Conv(5, 3).double()(x, ei.double())
    with pytest.raises(ValueError, match="x_dst"):
        sc.nn.GATv2Conv((5, 4), 3).double()((x, None), ei)
    for cls in (sc.nn.GATConv, sc.nn.GATv2Conv):
        with pytest.raises(ValueError, match="'median'"):
            cls(5, 3, edge_dim=2, fill_value="median")
    for name in ("GATv2Conv", "TransformerConv"):
        with pytest.raises(ValueError, match="aggr"):
            sc.nn.from_pyg(getattr(pyg, name)(5, 3, aggr="mean"))
        with pytest.raises(ValueError, match="flow"):
            sc.nn.from_pyg(getattr(pyg, name)(5, 3, flow="target_to_source"))


def test_layers_are_their_mechanisms_paper_view():
    """Each layer's output is Σ_k A_kᵀ v_k with A its mechanism's dense softmax on the graph."""
    torch.manual_seed(9)
    x = _rand(9, 5)
    e0 = torch.unique(_graph(6), dim=1)
    e0 = e0[:, e0[0] != e0[1]]  # unique edges without loops: the layers add one per node
    Ed = _rand(9, 9, 2)
    ea0 = Ed[e0[0], e0[1]]
    eu, ea = at.add_self_loops(e0, 9, ea0, "mean")
    Ed[eu[0], eu[1]] = ea  # the loops carry the mean of each node's incoming features
    gat = _perturb(sc.nn.GATConv(5, 3, heads=2, edge_dim=2).double()).eval()
    h = gat.lin(x).view(9, 2, 3)
    A = gat.mechanism(eu, with_edges=True)(h, h, edge_attr=Ed)
    y = torch.einsum("kmn,mkc->nkc", A, h).reshape(9, 6) + gat.bias
    torch.testing.assert_close(y, gat(x, e0, ea0))
    v2 = _perturb(sc.nn.GATv2Conv(5, 3, heads=2, edge_dim=2).double()).eval()
    xl, xr = v2.lin_l(x).view(9, 2, 3), v2.lin_r(x).view(9, 2, 3)
    A = v2.mechanism(eu)(xl, xr, edge_attr=Ed)
    y = torch.einsum("kmn,mkc->nkc", A, xl).reshape(9, 6) + v2.bias
    torch.testing.assert_close(y, v2(x, e0, ea0))
    tc = _perturb(sc.nn.TransformerConv(5, 3, heads=2, edge_dim=2, root_weight=False)
                  .double()).eval()
    q, k, v = (lin(x).view(9, 2, 3) for lin in (tc.lin_query, tc.lin_key, tc.lin_value))
    ek = tc.lin_edge(Ed).view(9, 9, 2, 3)  # the edge keys, every pair's
    A = tc.mechanism(eu)(k, q, edge_attr=ek)
    y = torch.einsum("kmn,mnkc->nkc", A, v.unsqueeze(1) + ek).reshape(9, 6)
    torch.testing.assert_close(y, tc(x, eu, ea))
    assert isinstance(at.attention_basis(tc.mechanism(eu), k, q, edge_attr=ek[eu[0], eu[1]]),
                      at.GraphAttention)


def test_bench_attention_edges_part_runs(tmp_path):
    import json

    from tests.conftest import run_cli

    r = run_cli("bench", "attention", "--quick", "--parts", "edges", "--repeats", "1",
                "--edge-layers", "gat_edge8,transformer_edge8_beta", "--out", tmp_path,
                timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "attention.json").read_text())
    rows = res["edges"]
    assert [x["layer"] for x in rows] == ["gat_edge8", "transformer_edge8_beta"]
    for row in rows:
        assert set(row["forward_backward_s"]) == {"pyg", "ours"}
        assert row["ratios"]["edge_layer_vs_pyg"]["forward_backward"] > 0
        assert row["edge_features"] == 8 and row["options"]["heads"] == 8
    bad = run_cli("bench", "attention", "--quick", "--parts", "edges", "--edge-layers", "gcn",
                  "--out", tmp_path)
    assert bad.returncode == 2 and "gcn" in bad.stderr

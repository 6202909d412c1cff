"""Typed layers: HeteroConv and to_hetero against PyG, TypedGraphConv against its definition."""

import pytest
import torch

import structconv as sc
from structconv.basis.typed import segment_matmul, typed_basis, typed_convolve, typed_order
from structconv.params import ControlledSeparable, Grouped

NUM = {"a": 5, "b": 7, "c": 3}
META = (["a", "b", "c"], [("a", "r", "b"), ("b", "s", "a"), ("a", "t", "a"), ("c", "u", "b"),
                          ("b", "w", "c")])


def _edges(meta=META, E=8, seed=0, empty=()):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for e in meta[1]:
        n = 0 if e in empty else E
        out[e] = torch.stack([torch.randint(0, NUM[e[0]], (n,), generator=g),
                              torch.randint(0, NUM[e[2]], (n,), generator=g)])
    return out


def _x(widths=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    widths = widths or {t: 4 for t in NUM}
    return {t: torch.randn(NUM[t], widths[t], generator=g, dtype=torch.float64) for t in NUM}


class _Two(torch.nn.Module):
    def __init__(self, conv, p=4):
        super().__init__()
        self.c1, self.c2 = conv(p, 6), conv(6, 3)

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("aggr", ["sum", "mean", "max", "min", None, "cat"])
@pytest.mark.filterwarnings("ignore:There exist node types")
def test_heteroconv_equals_pyg(aggr):
    pnn = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    meta = (["a", "b", "c"], META[1][:4])  # c reaches nothing: absent from the output
    ref = pnn.HeteroConv({
        ("a", "r", "b"): pnn.SAGEConv((4, 4), 6),
        ("b", "s", "a"): pnn.GATConv((4, 4), 6, add_self_loops=False),
        ("a", "t", "a"): pnn.SAGEConv(4, 6, aggr="max"),
        ("c", "u", "b"): pnn.SAGEConv((4, 4), 6, project=True),
    }, aggr=aggr).double()
    ours = sc.nn.from_pyg(ref)
    assert isinstance(ours, sc.nn.HeteroConv)
    x, ei = _x(), _edges(meta, empty=[("c", "u", "b")])  # a relation with no edges
    want, got = ref(x, ei), ours(x, ei)
    assert set(got) == set(want) == {"a", "b"}
    for t in want:
        torch.testing.assert_close(got[t], want[t], rtol=1e-12, atol=1e-12)


def test_heteroconv_errors_and_edge_args():
    conv = sc.nn.HeteroConv({("a", "r", "b"): sc.nn.SAGEConv((4, 4), 2)})
    with pytest.raises(ValueError, match="_dict"):
        conv(_x(), _edges(), edge_weight=1)
    with pytest.raises(ValueError, match="aggr"):
        sc.nn.HeteroConv({("a", "r", "b"): sc.nn.SAGEConv(4, 2)}, aggr="prod")
    assert conv({"a": _x()["a"]}, {}) == {}  # no edge type given: nothing runs


# ------------------------------------------------------------------------------------------------
def _dense_typed(x_dict, ei, theta, widths, aggr="mean"):
    """Σ_r A_rᵀ x_src θ_r per destination type, by dense matrices (the definition)."""
    out = {t: 0.0 for t in NUM}
    for r, e in enumerate(META[1]):
        A = torch.zeros(NUM[e[0]], NUM[e[2]], dtype=torch.float64)
        A.index_put_((ei[e][0], ei[e][1]), torch.ones(ei[e].shape[1], dtype=torch.float64),
                     accumulate=True)
        if aggr == "mean":
            A = A / A.sum(0, keepdim=True).clamp_min(1)
        out[e[2]] = out[e[2]] + A.t() @ x_dict[e[0]] @ theta[r, :widths[e[0]]]
    return out


@pytest.mark.parametrize("param", ["full", "grouped", "separable"])
@pytest.mark.parametrize("aggr", ["mean", "sum"])
@pytest.mark.parametrize("widths", [{"a": 4, "b": 6, "c": 2}, {"a": 6, "b": 6, "c": 6}],
                         ids=["per-relation", "one-segment-product"])
def test_typed_conv_equals_definition(param, aggr, widths):
    torch.manual_seed(0)
    R = len(META[1])
    form = {"full": "full", "grouped": Grouped(R, 6, 4, 2),
            "separable": ControlledSeparable(R, 6, 4, 2)}[param]
    m = sc.nn.TypedGraphConv(widths, 4, META, param=form, aggr=aggr).double()
    x, ei = _x(widths), _edges(empty=[("a", "t", "a")])
    for p in [*x.values()]:
        p.requires_grad_(True)
    got = m(x, ei)
    theta = m.param()
    want = _dense_typed(x, ei, theta, widths, aggr)
    for i, t in enumerate(m.node_types):
        want[t] = want[t] + x[t] @ m.root[i, :widths[t]] + m.bias[i]
        torch.testing.assert_close(got[t], want[t], rtol=1e-12, atol=1e-12)
    g = {t: torch.randn_like(v) for t, v in got.items()}
    params = [x["a"], x["b"], *m.param.parameters()]
    gg = torch.autograd.grad([got[t] for t in g], params, [g[t] for t in g])
    gw = torch.autograd.grad([want[t] for t in g], params, [g[t] for t in g])
    for a, b in zip(gg, gw):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_typed_conv_unreached_type_and_errors():
    meta = (["a", "b", "c"], META[1][:3])  # nothing reaches c
    m = sc.nn.TypedGraphConv(4, 3, meta).double()
    x = _x()
    y = m(x, _edges(meta))
    assert set(y) == {"a", "b", "c"} and y["c"].shape == (3, 3)
    torch.testing.assert_close(y["c"], x["c"] @ m.root[2] + m.bias[2])
    # a type absent from x_dict (not reached by an earlier layer) has no rows and no output
    only = m({"a": x["a"], "c": x["c"]}, _edges(meta))
    assert set(only) == {"a", "c"}
    with pytest.raises(ValueError, match=r"x_dict\['b'\]"):
        m({"a": x["a"], "b": x["b"][:, :2]}, _edges(meta))
    with pytest.raises(ValueError, match="not in its metadata"):
        m(x, {("c", "zz", "a"): torch.zeros(2, 0, dtype=torch.long)})
    with pytest.raises(ValueError, match="aggr"):
        sc.nn.TypedGraphConv(4, 3, meta, aggr="max")


def test_segment_matmul_tiles():
    g = torch.Generator().manual_seed(0)
    counts = [5, 0, 13, 1, 7]
    x = torch.randn(sum(counts), 3, generator=g, dtype=torch.float64)
    w = torch.randn(5, 3, 2, generator=g, dtype=torch.float64)
    want = torch.cat([xs @ w[i] for i, xs in enumerate(x.split(counts))])
    for tile in (1, 4, 64):
        torch.testing.assert_close(segment_matmul(x, counts, w, tile=tile), want)


def test_typed_convolve_orders_agree():
    x = torch.randn(15, 4, dtype=torch.float64)
    b = typed_basis(NUM, _edges(), dtype=torch.float64)
    th = torch.randn(len(META[1]), 4, 3, dtype=torch.float64)
    ref = torch.einsum("kmn,mp,kpq->nq", b.to_dense(), x, th)
    for order in ("input", "basis", "auto"):
        torch.testing.assert_close(typed_convolve(x, b, th, order), ref)


def _skewed(seed):
    """A typed graph with skewed relation counts: a hub type with 12 outgoing relations (each
    touching a few of its rows, one to itself), small types, an empty type, relations without
    edges."""
    g = torch.Generator().manual_seed(seed)
    num = {"hub": 40, **{f"s{i}": 3 for i in range(8)}, "none": 0}
    rels = [("hub", f"to{i}", f"s{i}") for i in range(8)] + \
        [(f"s{i}", f"from{i}", "hub") for i in range(8)] + \
        [("hub", "self", "hub"), ("hub", "void", "none"), ("none", "back", "hub"),
         ("s0", "idle", "s1"), ("hub", "wide", "s2")]
    sizes = {"self": 5, "void": 0, "back": 0, "idle": 0, "wide": 30}
    ei = {}
    for s, r, d in rels:
        E = sizes.get(r, 2 if s == "hub" else 4)
        ei[(s, r, d)] = torch.stack([torch.randint(0, max(num[s], 1), (E,), generator=g),
                                     torch.randint(0, max(num[d], 1), (E,), generator=g)])
    return num, rels, ei


def _orders(x, b, th, orders):
    """{order: (output, grads in x and theta)} for one upstream gradient."""
    gy = torch.randn(x.shape[0], th.shape[-1], dtype=x.dtype,
                     generator=torch.Generator().manual_seed(9))
    out = {}
    for order in orders:
        xx, tt = x.clone().requires_grad_(), th.clone().requires_grad_()
        y = (typed_convolve(xx, b, tt, order) if order != "dense" else
             torch.einsum("kmn,mp,kpq->nq", b.to_dense(), xx, tt))
        out[order] = (y, *torch.autograd.grad(y, (xx, tt), gy, allow_unused=True,
                                              materialize_grads=True))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_typed_convolve_relation_order(seed):
    num, rels, ei = _skewed(seed)
    b = typed_basis(num, ei, rels, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(num.values()), 5, generator=g, dtype=torch.float64)
    th = torch.randn(len(rels), 5, 3, generator=g, dtype=torch.float64)
    got = _orders(x, b, th, ("dense", "input", "basis", "relation", "auto"))
    for order in ("input", "basis", "relation", "auto"):
        for a, want in zip(got[order], got["dense"]):
            torch.testing.assert_close(a, want)
    rows, counts, _ = b.relation_rows()
    k, m, _ = b.indices
    distinct = [len(set(m[k == r].tolist())) for r in range(len(rels))]
    assert list(counts) == distinct and rows.shape[0] == sum(distinct)
    assert all(c <= u for c, u in zip(counts, b.source_bound))
    # a relation's edges leave theta_r's gradient zero where it has none
    assert not got["relation"][2][rels.index(("hub", "void", "none"))].any()


def test_typed_order_auto():
    balanced = typed_basis(NUM, _edges(), dtype=torch.float64)
    assert typed_order(balanced, 4, 3) == "input" and typed_order(balanced, 3, 40) == "basis"
    num, rels, ei = _skewed(0)
    skewed = typed_basis(num, ei, rels, dtype=torch.float64)
    assert typed_order(skewed, 4, 4) == "relation"
    with pytest.raises(ValueError, match="order"):
        typed_convolve(torch.zeros(15, 4), balanced, torch.zeros(5, 4, 3), "slots")


# ------------------------------------------------------------------------------------------------
def test_to_hetero_sage_equals_pyg():
    pnn = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    ref = pnn.to_hetero(_Two(pnn.SAGEConv), META).double()
    ours = sc.nn.to_hetero(_Two(sc.nn.SAGEConv), META).double()
    assert isinstance(ours.layers["c1"], sc.nn.TypedGraphConv)
    ours.layers["c1"].load_relation_layers(dict(ref.c1.items()))
    ours.layers["c2"].load_relation_layers(dict(ref.c2.items()))
    x, ei = _x(), _edges()
    want, got = ref(x, ei), ours(x, ei)
    for t in want:
        torch.testing.assert_close(got[t], want[t], rtol=1e-12, atol=1e-12)
    # its parameters are the typed layers' only
    n_typed = sum(p.numel() for p in ours.layers.parameters())
    assert sum(p.numel() for p in ours.parameters()) == n_typed


def test_to_hetero_other_layers_and_unreached_types():
    torch.manual_seed(0)
    meta = (["a", "b", "c"], META[1][:3])  # nothing reaches c: PyG's to_hetero raises here

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.conv = sc.nn.GATConv((4, 4), 5, add_self_loops=False)
            self.sage = sc.nn.SAGEConv(5, 2, aggr="mean")

        def forward(self, x, edge_index):
            h = self.conv(self.lin(x).relu(), edge_index)
            return self.sage(torch.nn.functional.elu(h), edge_index)

    m = sc.nn.to_hetero(Net(), meta)
    assert isinstance(m.layers["conv"], sc.nn.HeteroConv)
    x = {t: v.float() for t, v in _x().items()}
    y = m(x, _edges(meta))
    assert set(y) == {"a", "b"} and y["b"].shape == (7, 2)
    assert len(m.layers["lin"]) == 3  # a Linear per node type


def test_to_hetero_with_bases_trains():
    # ControlledSeparable across relations: PyG's to_hetero_with_bases's parameter form
    torch.manual_seed(0)
    m = sc.nn.to_hetero(_Two(sc.nn.SAGEConv), META, param={"param": "separable", "H": 2})
    conv = m.layers["c1"]
    assert isinstance(conv.param, ControlledSeparable) and conv.param.K == len(META[1])
    x = {t: v.float() for t, v in _x().items()}
    y = m(x, _edges())
    sum(v.square().sum() for v in y.values()).backward()
    assert conv.param.basis_coef.grad is not None and conv.param.basis_coef.grad.abs().sum() > 0
    assert m.double()(_x(), _edges())["a"].dtype == torch.float64


@pytest.mark.parametrize("cached", [False, True])
def test_typed_relation_order_compiles(cached):
    # cached: the relation rows are found eagerly first and the trace reads them; uncached:
    # the trace builds the basis and "auto" keeps a padded order (a sort cannot be traced)
    num, rels, ei = _skewed(0)
    x = {t: torch.randn(n, 4, generator=torch.Generator().manual_seed(2)) for t, n in num.items()}
    torch.manual_seed(0)
    conv = sc.nn.TypedGraphConv(4, 3, (list(num), rels), cached=cached)
    want = conv(x, ei)
    torch._dynamo.reset()
    got = torch.compile(conv, fullgraph=True, backend="eager")(x, ei)
    for t in want:
        torch.testing.assert_close(got[t], want[t])

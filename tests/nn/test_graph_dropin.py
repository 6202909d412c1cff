"""The graph layers as drop-ins for PyG's: every graph input kind, lazy sizes, empty node sets,
reset_parameters, input checks, PyG checkpoints both ways, MessagePassing instances,
``to_hetero`` and ``Explainer`` (each against PyG's layer holding the same weights)."""

from __future__ import annotations

import copy
import pickle
import sys

import pytest
import torch

import structconv as sc
from structconv.basis.edges import as_edge_index
from structconv.nn.pyg import pyg_compatible, pyg_state_dict

pyg = pytest.importorskip("torch_geometric.nn")
from torch_geometric import EdgeIndex  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402

D = torch.float64
N, P, Q = 7, 5, 4

#: name -> (constructor args, call extras, PyG class) for the eight layers (homogeneous graph)
LAYERS = {
    "GCNConv": ((P, Q), {}),
    "ChebConv": ((P, Q, 3), {}),
    "TAGConv": ((P, Q, 2), {}),
    "SGConv": ((P, Q, 2), {}),
    "RGCNConv": ((P, Q, 3), {}),
    "GATConv": ((P, Q), {"heads": 2}),
    "GATv2Conv": ((P, Q), {"heads": 2}),
    "TransformerConv": ((P, Q), {"heads": 2}),
}
ATTENTION = ("GATConv", "GATv2Conv", "TransformerConv")
WEIGHTED = ("GCNConv", "ChebConv", "TAGConv", "SGConv")


def _graph(seed=0, n=N, E=19):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, E), generator=g)
    ei = torch.unique(ei[:, ei[0] != ei[1]], dim=1).contiguous()  # no duplicates (a sparse
    # tensor would sum them)
    return (torch.randn(n, P, generator=g, dtype=D), ei,
            torch.rand(ei.shape[1], generator=g, dtype=D) + 0.1,
            torch.randint(0, 3, (ei.shape[1],), generator=g))


def _pair(name, **over):
    """(PyG layer, structconv layer) of ``name`` holding the same weights, float64, eval."""
    args, kw = LAYERS[name]
    kw = {**kw, **over}
    torch.manual_seed(3)
    ref = getattr(pyg, name)(*args, **kw).to(D).eval()
    ours = getattr(sc.nn, name)(*args, **kw).to(D).eval()
    ours.load_state_dict(ref.state_dict())  # PyG's names load directly
    return ref, ours


def _call(layer, name, x, ei, w=None, et=None):
    if name == "RGCNConv":
        return layer(x, ei, et)
    if name in WEIGHTED:
        return layer(x, ei, w)
    return layer(x, ei)


def _adj_t(ei, value, n_src, n_dst, layout):
    """PyG's adj_t (num_dst, num_src): entry [dst, src] of each edge src -> dst."""
    a = torch.sparse_coo_tensor(ei.flip(0), value, (n_dst, n_src)).coalesce()
    if layout == torch.sparse_csr:
        return a.to_sparse_csr()
    if layout == torch.sparse_csc:
        return a.to_sparse_csc()
    return a


# ------------------------------------------------------------------------------------------------
# the one edge-input helper
def test_as_edge_index_reads_each_kind_in_pygs_orientation():
    ei = torch.tensor([[0, 2, 3, 1], [1, 1, 0, 2]])  # (source; target)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    same = as_edge_index(ei)
    assert same.index is ei and same.value is None and same.kind == "edge_index"
    for layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc):
        e = as_edge_index(_adj_t(ei, w, 4, 3, layout))
        assert e.size == (4, 3) and e.kind == "torch_sparse"
        got = {(int(s), int(d)): float(v) for (s, d), v in zip(e.index.t(), e.value)}
        assert got == {(0, 1): 1.0, (2, 1): 2.0, (3, 0): 3.0, (1, 2): 4.0}
    typed = EdgeIndex(ei, sparse_size=(4, 3))
    e = as_edge_index(typed)
    assert type(e.index) is torch.Tensor and torch.equal(e.index, ei) and e.size == (4, 3)


def test_as_edge_index_keeps_one_edge_list_per_adjacency():
    # the same adj_t object, unchanged, gives the same edge list: the structure cache hits
    ei = torch.tensor([[0, 2, 3], [1, 1, 0]])
    adj = _adj_t(ei, torch.ones(3), 4, 4, torch.sparse_csr)
    assert as_edge_index(adj).index is as_edge_index(adj).index
    with torch.no_grad():
        adj.values()[0] = 5.0  # an edit through a view: seen by content
    assert float(as_edge_index(adj).value[0]) == 5.0


class _FakeSparseTensor:
    """torch_sparse.SparseTensor's interface as the layers read it (adj_t: rows are targets)."""

    def __init__(self, row=None, col=None, value=None, sparse_sizes=None):
        self.row, self.col, self.value, self.sizes = row, col, value, sparse_sizes

    def storage(self):
        return self

    def coo(self):
        return self.row, self.col, self.value

    def sparse_sizes(self):
        return self.sizes

    def set_value(self, value, layout=None):
        return _FakeSparseTensor(self.row, self.col, value, self.sizes)


@pytest.mark.parametrize("name", list(LAYERS))
def test_every_graph_input_gives_the_edge_list_output(name):
    ref, ours = _pair(name)
    x, ei, w, et = _graph()
    want = _call(ref, name, x, ei, w, et)
    assert torch.allclose(_call(ours, name, x, EdgeIndex(ei, sparse_size=(N, N)), w, et), want,
                          atol=1e-12)
    # a sparse adj_t carries the edge weights (GCN family) or the edge types (R-GCN) as values
    val = w if name in WEIGHTED else et if name == "RGCNConv" else None
    kinds = [_adj_t(ei, val if val is not None else torch.ones(ei.shape[1], dtype=D), N, N, lay)
             for lay in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)]
    kinds.append(_FakeSparseTensor(ei[1], ei[0], val, (N, N)))
    for k in kinds:
        assert torch.allclose(ours(x, k), want, atol=1e-12), getattr(k, "layout", k)


@pytest.mark.parametrize("name", ["GCNConv", "GATConv", "TransformerConv"])
def test_sparse_adjacency_against_pygs_sparse_call(name):
    ref, ours = _pair(name)
    x, ei, w, _ = _graph(1)
    adj = _adj_t(ei, w if name == "GCNConv" else torch.ones(ei.shape[1], dtype=D), N, N,
                 torch.sparse_csr)
    assert torch.allclose(ours(x, adj), ref(x, adj), atol=1e-12)


def test_attention_weights_come_back_in_the_inputs_form():
    ref, ours = _pair("GATConv")
    x, ei, _, _ = _graph(2)
    adj = _adj_t(ei, torch.ones(ei.shape[1], dtype=D), N, N, torch.sparse_csr)
    out, (a, alpha) = ours(x, adj, return_attention_weights=True)
    r_out, (r_a, r_alpha) = ref(x, adj, return_attention_weights=True)
    assert torch.allclose(out, r_out, atol=1e-12)
    assert a.shape == r_a.shape and a._nnz() == r_a._nnz()
    assert torch.allclose(a.to_dense(), r_a.to_dense(), atol=1e-12)
    fake = _FakeSparseTensor(ei[1], ei[0], None, (N, N))
    _, st = ours(x, fake, return_attention_weights=True)
    assert isinstance(st, _FakeSparseTensor) and st.value.shape[1] == 2


def test_real_sparse_tensor():
    torch_sparse = pytest.importorskip("torch_sparse", reason="torch_sparse is not installed: "
                                       "the duck-typed SparseTensor tests above stand in")
    ref, ours = _pair("GCNConv")
    x, ei, w, _ = _graph(3)
    adj = torch_sparse.SparseTensor.from_edge_index(ei, w, (N, N)).t()
    assert torch.allclose(ours(x, adj), ref(x, adj), atol=1e-12)


# ------------------------------------------------------------------------------------------------
# input checks
@pytest.mark.parametrize("name", list(LAYERS))
def test_bad_inputs_are_refused_by_name(name):
    _, ours = _pair(name)
    x, ei, w, et = _graph()
    for bad in (ei.bool(), ei.double()):
        with pytest.raises(TypeError, match=f"edge_index.*{bad.dtype}"):
            _call(ours, name, x, bad, w, et)
    if name != "RGCNConv":  # R-GCN reads integer x as node ids (featureless), as PyG
        with pytest.raises(TypeError, match="floating"):
            _call(ours, name, x.long(), ei, w, et)
    with pytest.raises(ValueError, match=f"{P}.*{P + 1}|{P + 1}.*{P}"):
        _call(ours, name, torch.randn(N, P + 1, dtype=D), ei, w, et)
    with pytest.raises(TypeError, match="edge_index"):
        _call(ours, name, x, [[0, 1], [1, 0]], w, et)


@pytest.mark.parametrize("name", list(LAYERS))
def test_meta_device_gives_shapes(name):
    args, kw = LAYERS[name]
    layer = getattr(sc.nn, name)(*args, **kw).to("meta")
    x = torch.empty(N, P, device="meta")
    ei = torch.empty(2, 11, dtype=torch.long, device="meta")
    et = torch.empty(11, dtype=torch.long, device="meta")
    y = _call(layer, name, x, ei, None, et)
    assert y.device.type == "meta" and y.shape[0] == N


# ------------------------------------------------------------------------------------------------
# empty node sets
@pytest.mark.parametrize("name", list(LAYERS))
def test_a_graph_without_nodes(name):
    ref, ours = _pair(name)
    x = torch.randn(0, P, dtype=D)
    ei = torch.empty(2, 0, dtype=torch.long)
    et = torch.empty(0, dtype=torch.long)
    got = _call(ours, name, x, ei, None, et)
    assert got.shape[0] == 0 and got.shape[1] == (2 * Q if name in ("GATConv", "GATv2Conv",
                                                                     "TransformerConv") else Q)
    if name != "ChebConv":  # PyG's ChebConv itself fails here (max of no Laplacian entries)
        assert got.shape == _call(ref, name, x, ei, None, et).shape


@pytest.mark.parametrize("name", ["RGCNConv", "GATConv", "GATv2Conv", "TransformerConv"])
@pytest.mark.parametrize("M,Nd", [(0, 3), (4, 0)])
def test_bipartite_calls_with_an_empty_side(name, M, Nd):
    kw = {"add_self_loops": False} if name != "TransformerConv" and name != "RGCNConv" else {}
    extra = (3,) if name == "RGCNConv" else ()
    torch.manual_seed(4)
    ref = getattr(pyg, name)((P, P + 1), Q, *extra, **kw).to(D)
    ours = getattr(sc.nn, name)((P, P + 1), Q, *extra, **kw).to(D)
    ours.load_state_dict(ref.state_dict())
    with torch.no_grad():  # a visible bias
        for m in (ref, ours):
            for n_, p in m.named_parameters():
                if n_.endswith("bias"):
                    p.fill_(0.25)
    xs, xd = torch.randn(M, P, dtype=D), torch.randn(Nd, P + 1, dtype=D)
    ei = torch.empty(2, 0, dtype=torch.long)
    args = (torch.empty(0, dtype=torch.long),) if name == "RGCNConv" else ()
    want, got = ref((xs, xd), ei, *args), ours((xs, xd), ei, *args)
    assert got.shape == want.shape == (Nd, want.shape[1])
    assert torch.allclose(got, want, atol=1e-12)
    if Nd:
        got.sum().backward()  # gradients reach every parameter that shapes the output


# ------------------------------------------------------------------------------------------------
# lazy sizes and reset_parameters
@pytest.mark.parametrize("name", [n for n in LAYERS if n != "RGCNConv"])
def test_lazy_in_channels(name):
    args, kw = LAYERS[name]
    lazy = getattr(sc.nn, name)(-1, *args[1:], **kw).to(D)
    before = list(lazy.parameters())
    x, ei, w, _ = _graph()
    y = _call(lazy, name, x, ei, w)
    assert all(a is b for a, b in zip(before, lazy.parameters()))  # an optimizer keeps them
    ref = getattr(pyg, name)(*args, **kw).to(D)
    ref.load_state_dict(lazy.state_dict()) if name in ATTENTION else \
        ref.load_state_dict(pyg_state_dict(lazy))
    assert torch.allclose(y, _call(ref, name, x, ei, w), atol=1e-12)
    with pytest.raises(ValueError, match=f"{P}"):
        _call(lazy, name, torch.randn(N, P + 2, dtype=D), ei, w)


@pytest.mark.parametrize("name", ATTENTION)
def test_lazy_bipartite_pair(name):
    layer = getattr(sc.nn, name)((-1, -1), Q, add_self_loops=False) if name != \
        "TransformerConv" else sc.nn.TransformerConv((-1, -1), Q)
    xs, xd = torch.randn(5, 3), torch.randn(4, 6)
    ei = torch.tensor([[0, 1, 4], [0, 3, 3]])
    assert layer((xs, xd), ei).shape == (4, Q)
    ws = {n: p.shape for n, p in layer.named_parameters()}
    assert any(s[-1] == 3 for s in ws.values()) and any(s[-1] == 6 for s in ws.values())


@pytest.mark.parametrize("name", ["GCNConv", "GATConv"])
def test_lazy_layer_loads_a_checkpoint_before_its_first_call(name):
    ref, _ = _pair(name)
    lazy = getattr(sc.nn, name)(-1, Q, **LAYERS[name][1]).to(D).eval()
    lazy.load_state_dict(ref.state_dict())
    x, ei, _, _ = _graph()
    assert torch.allclose(lazy(x, ei), ref(x, ei), atol=1e-12)


@pytest.mark.parametrize("name", list(LAYERS))
def test_reset_parameters_draws_again_and_runs_at_construction(name, monkeypatch):
    args, kw = LAYERS[name]
    layer = getattr(sc.nn, name)(*args, **kw)
    before = [p.detach().clone() for p in layer.parameters()]
    layer.reset_parameters()
    after = list(layer.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    cls = getattr(sc.nn, name)
    calls = []
    orig = cls.reset_parameters
    monkeypatch.setattr(cls, "reset_parameters", lambda self: calls.append(1) or orig(self))
    cls(*args, **kw)
    assert calls


@pytest.mark.parametrize("form", [sc.params.Full(3, 4, 5), sc.params.Grouped(3, 4, 6, 2),
                                  sc.params.DepthwiseSeparable(3, 4, 5),
                                  sc.params.ControlledSeparable(3, 4, 5, 2),
                                  sc.params.LowRank(3, 4, 5, 2)])
def test_the_parameter_forms_the_layers_hold_reset_too(form):
    torch.manual_seed(0)
    before = form().detach().clone()
    form.reset_parameters()
    after = form().detach()
    assert not torch.equal(before, after)
    assert after.abs().max() <= 3 * before.abs().max()  # the same distribution's range


# ------------------------------------------------------------------------------------------------
# checkpoints both ways
@pytest.mark.parametrize("name,over", [(n, {}) for n in LAYERS] + [
    ("RGCNConv", {"num_bases": 2}), ("RGCNConv", {"num_blocks": 1}),
    ("SGConv", {"bias": False}), ("GATConv", {"edge_dim": 2, "residual": True}),
    ("GATv2Conv", {"share_weights": True}), ("TransformerConv", {"beta": True})])
def test_checkpoints_load_both_ways(name, over):
    ref, ours = _pair(name, **over)  # PyG -> structconv
    x, ei, w, et = _graph(5)
    ea = torch.randn(ei.shape[1], 2, dtype=D) if over.get("edge_dim") else None
    if ea is not None:
        assert torch.allclose(ours(x, ei, ea), ref(x, ei, ea), atol=1e-12)
        return
    assert torch.allclose(_call(ours, name, x, ei, w, et), _call(ref, name, x, ei, w, et),
                          atol=1e-12)
    args, kw = LAYERS[name]
    back = getattr(pyg, name)(*args, **{**kw, **over}).to(D).eval()
    back.load_state_dict(pyg_state_dict(ours))  # structconv -> PyG
    assert torch.allclose(_call(back, name, x, ei, w, et), _call(ours, name, x, ei, w, et),
                          atol=1e-12)


# ------------------------------------------------------------------------------------------------
# PyG's tooling
def test_layers_are_message_passing_and_stay_picklable():
    layer = sc.nn.GCNConv(P, Q)
    assert isinstance(layer, MessagePassing) and isinstance(layer, sc.nn.GCNConv)
    x, ei, _, _ = _graph()
    y = layer.double()(x, ei)
    for copied in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert type(copied) is type(layer) and torch.equal(copied(x, ei), y)


def test_pyg_compatible_converts_layers_built_before_pyg(monkeypatch):
    with monkeypatch.context() as m:
        m.delitem(sys.modules, "torch_geometric")
        model = torch.nn.Sequential(sc.nn.GATConv(P, Q, heads=2))
    assert not isinstance(model[0], MessagePassing)
    x, ei, _, _ = _graph()
    model = model.double()
    y = model[0](x, ei)
    pyg_compatible(model)
    assert isinstance(model[0], MessagePassing) and torch.equal(model[0](x, ei), y)


@pytest.mark.parametrize("name", ATTENTION)
def test_to_hetero_gives_pygs_outputs(name):
    from torch_geometric.nn import to_hetero

    meta = (["a", "b"], [("a", "to", "b"), ("b", "to", "a"), ("a", "self", "a")])
    g = torch.Generator().manual_seed(6)
    xs = {"a": torch.randn(5, 3, generator=g), "b": torch.randn(4, 2, generator=g)}
    eis = {("a", "to", "b"): torch.tensor([[0, 1, 4, 2], [0, 3, 3, 1]]),
           ("b", "to", "a"): torch.tensor([[0, 3, 3, 1], [0, 1, 4, 2]]),
           ("a", "self", "a"): torch.tensor([[0, 1, 2], [1, 2, 3]])}
    kw = {} if name == "TransformerConv" else {"add_self_loops": False}

    def net(lib):
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = getattr(lib, name)((-1, -1), 4, **kw)

            def forward(self, x, edge_index):
                return self.conv(x, edge_index)
        return to_hetero(Net(), meta)

    ref, ours = net(pyg), net(sc.nn)
    with torch.no_grad():
        want = ref(xs, eis)
        ours(xs, eis)  # sizes the lazy layers
        ours.load_state_dict(ref.state_dict())
        got = ours(xs, eis)
    assert set(got) == {"a", "b"}
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-6)


@pytest.mark.parametrize("name", ["GCNConv", "ChebConv", "TAGConv", "SGConv", "GATConv",
                                  "GATv2Conv", "TransformerConv"])
def test_explainer_gives_pygs_explanation(name):
    from torch_geometric.explain import Explainer, GNNExplainer

    x, ei, _, _ = _graph(7, n=9, E=30)
    ei = torch.cat([ei, torch.tensor([[2], [2]])], 1)  # a self loop the layers replace

    def net(lib):
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                args, kw = LAYERS[name]
                self.conv = getattr(lib, name)(*args, **kw)

            def forward(self, x, edge_index):
                return self.conv(x, edge_index).sum(-1, keepdim=True).tanh()
        return Net().to(D).eval()

    ref, ours = net(pyg), net(sc.nn)
    ours.conv.load_state_dict(ref.conv.state_dict())
    masks = []
    for model in (ref, ours):
        torch.manual_seed(8)
        ex = Explainer(model, GNNExplainer(epochs=5), explanation_type="model",
                       edge_mask_type="object",
                       model_config=dict(mode="regression", task_level="node",
                                         return_type="raw"))
        masks.append(ex(x, ei, index=1).edge_mask)
    assert (masks[0] > 0).sum() > 0
    assert torch.allclose(masks[0], masks[1], atol=1e-6)

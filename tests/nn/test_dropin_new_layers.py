"""SAGEConv, GINConv and GINEConv as drop-ins for PyG's: every graph input kind, lazy sizes,
empty node sets, input checks, reset_parameters, PyG checkpoints both ways, MessagePassing
instances, ``to_hetero`` and ``Explainer`` (each against PyG's layer holding the same weights,
float64)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import structconv as sc
from structconv.nn.pyg import pyg_state_dict

pyg = pytest.importorskip("torch_geometric.nn")
from torch_geometric import EdgeIndex  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402

D = torch.float64
N, P, Q = 7, 5, 4


def _mlp(p=P):
    return torch.nn.Sequential(torch.nn.Linear(p, 6), torch.nn.ReLU(), torch.nn.Linear(6, Q))


#: name -> (structconv/PyG class name, constructor of (lib) -> layer, takes edge_attr)
MAKERS = {
    "sage-mean": ("SAGEConv", lambda lib: lib.SAGEConv(P, Q), False),
    "sage-sum-project": ("SAGEConv", lambda lib: lib.SAGEConv(P, Q, aggr="sum", project=True),
                         False),
    "sage-max-normalize": ("SAGEConv", lambda lib: lib.SAGEConv(P, Q, aggr="max",
                                                                 normalize=True), False),
    "sage-no-root-no-bias": ("SAGEConv", lambda lib: lib.SAGEConv(P, Q, root_weight=False,
                                                                   bias=False), False),
    "gin": ("GINConv", lambda lib: lib.GINConv(_mlp(), eps=0.3, train_eps=True), False),
    "gine": ("GINEConv", lambda lib: lib.GINEConv(_mlp(), eps=-0.2), True),
    "gine-edge-dim": ("GINEConv", lambda lib: lib.GINEConv(_mlp(), edge_dim=3), True),
}


def _graph(seed=0, n=N, E=19, edge_dim=P):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, E), generator=g)
    ei = torch.unique(ei, dim=1).contiguous()  # no duplicates (a sparse tensor sums them)
    return (torch.randn(n, P, generator=g, dtype=D), ei,
            torch.randn(ei.shape[1], edge_dim, generator=g, dtype=D))


def _layers(key):
    """(PyG layer, structconv layer) of ``key`` holding the same weights, float64, eval."""
    _, make, _ = MAKERS[key]
    torch.manual_seed(3)
    ref = make(pyg).to(D).eval()
    torch.manual_seed(4)  # other weights: the checkpoint must carry PyG's
    ours = make(sc.nn).to(D).eval()
    ours.load_state_dict(ref.state_dict())  # PyG's names load directly
    return ref, ours


def _attr(key, ei_attr):
    if not MAKERS[key][2]:
        return ()
    return (ei_attr[:, :3],) if key == "gine-edge-dim" else (ei_attr,)


def _adj_t(ei, value, M, Nd, layout):
    adj = torch.sparse_coo_tensor(ei.flip(0), value, (Nd, M)).coalesce()
    return {torch.sparse_coo: adj, torch.sparse_csr: adj.to_sparse_csr(),
            torch.sparse_csc: adj.to_sparse_csc()}[layout]


class _FakeSparseTensor:
    """The two methods of ``torch_sparse.SparseTensor`` that structconv reads (not installed)."""

    def __init__(self, row, col, value, sizes):
        self._coo, self._sizes = (row, col, value), sizes

    def coo(self):
        return self._coo

    def sparse_sizes(self):
        return self._sizes


# ------------------------------------------------------------------------------------------------
# graph inputs
@pytest.mark.parametrize("key", list(MAKERS))
def test_every_graph_input_gives_pygs_output(key):
    ref, ours = _layers(key)
    x, ei, ea = _graph()
    a = _attr(key, ea)
    want = ref(x, ei, *a)
    assert torch.allclose(ours(x, ei, *a), want, atol=1e-12)
    assert torch.allclose(ours(x, EdgeIndex(ei, sparse_size=(N, N)), *a), want, atol=1e-12)
    if not a:  # adj_t with ones: the structure (GINE's features come with a SparseTensor)
        for lay in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc):
            adj = _adj_t(ei, torch.ones(ei.shape[1], dtype=D), N, N, lay)
            assert torch.allclose(ours(x, adj), want, atol=1e-12), lay
    else:
        perm = torch.arange(ei.shape[1]).flip(0)  # a SparseTensor's own edge order
        st = _FakeSparseTensor(ei[1, perm], ei[0, perm], a[0][perm], (N, N))
        assert torch.allclose(ours(x, st), want, atol=1e-12)


def test_gin_sums_a_weighted_adjacency_as_pygs_sparse_product():
    ref, ours = _layers("gin")
    x, ei, _ = _graph(1)
    w = torch.rand(ei.shape[1], dtype=D) + 0.5
    adj = _adj_t(ei, w, N, N, torch.sparse_csr)
    assert torch.allclose(ours(x, adj), ref(x, adj), atol=1e-12)
    assert not torch.allclose(ours(x, adj), ours(x, ei), atol=1e-3)  # the weights count


@pytest.mark.parametrize("key", ["sage-mean", "sage-max-normalize", "gin", "gine"])
def test_bipartite_pairs_and_sparse_adjacency_of_a_pair(key):
    name = MAKERS[key][0]
    torch.manual_seed(3)
    if name == "SAGEConv":
        ref = pyg.SAGEConv((P, P + 1), Q, aggr=MAKERS[key][1](pyg).aggr).to(D)
        ours = sc.nn.SAGEConv((P, P + 1), Q, aggr=ref.aggr).to(D)
        ours.load_state_dict(ref.state_dict())
        Pd = P + 1
    else:
        ref, ours = _layers(key)
        Pd = P
    g = torch.Generator().manual_seed(2)
    xs, xd = torch.randn(6, P, generator=g, dtype=D), torch.randn(3, Pd, generator=g, dtype=D)
    ei = torch.unique(torch.stack([torch.randint(0, 6, (12,), generator=g),
                                   torch.randint(0, 3, (12,), generator=g)]), dim=1)
    a = _attr(key, torch.randn(ei.shape[1], P, generator=g, dtype=D))
    adj = _adj_t(ei, torch.ones(ei.shape[1], dtype=D), 6, 3, torch.sparse_csc)
    want = ref((xs, xd), ei, *a)
    assert torch.allclose(ours((xs, xd), ei, *a), want, atol=1e-12)
    if not a:
        assert torch.allclose(ours((xs, xd), adj), want, atol=1e-12)
        # (x_src, None): the adjacency's shape gives the targets, as size=(6, 3) does
        assert torch.allclose(ours((xs, None), adj), ref((xs, None), ei, size=(6, 3)),
                              atol=1e-12)


@pytest.mark.parametrize("key", ["gin", "gine"])
def test_a_batch_of_graphs_on_the_same_edges(key):
    ref, ours = _layers(key)
    x, ei, ea = _graph(3)
    xb = torch.randn(3, N, P, dtype=D)
    want = ref(xb, ei, *_attr(key, ea))
    assert want.shape == (3, N, Q)
    assert torch.allclose(ours(xb, ei, *_attr(key, ea)), want, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# bad input
@pytest.mark.parametrize("key", ["sage-mean", "gin", "gine"])
def test_bad_inputs_are_refused_by_name(key):
    _, ours = _layers(key)
    x, ei, ea = _graph()
    a = _attr(key, ea)
    for bad in (ei.bool(), ei.double()):
        with pytest.raises(TypeError, match="edge_index.*integer.*" + str(bad.dtype)):
            ours(x, bad, *a)
    with pytest.raises(TypeError, match="edge_index"):
        ours(x, [[0, 1], [1, 0]], *a)
    with pytest.raises((TypeError, ValueError), match="x.*floating.*int64|floating.*int64"):
        ours(x.long(), ei, *a)
    with pytest.raises(ValueError, match="x.*\\(7,\\)"):
        ours(torch.randn(N, dtype=D), ei, *a)


# ------------------------------------------------------------------------------------------------
# empty node sets
@pytest.mark.parametrize("key", list(MAKERS))
def test_a_graph_without_nodes(key):
    ref, ours = _layers(key)
    x, ei = torch.randn(0, P, dtype=D), torch.empty(2, 0, dtype=torch.long)
    a = _attr(key, torch.randn(0, P, dtype=D))
    want, got = ref(x, ei, *a), ours(x, ei, *a)
    assert got.shape == want.shape == (0, Q)


@pytest.mark.parametrize("key", ["sage-mean", "sage-sum-project", "sage-max-normalize", "gin",
                                 "gine"])
@pytest.mark.parametrize("M,Nd", [(0, 3), (4, 0)])
def test_bipartite_calls_with_an_empty_side(key, M, Nd):
    ref, ours = _layers(key)
    with torch.no_grad():  # a visible bias
        for m in (ref, ours):
            for n_, p in m.named_parameters():
                if n_.endswith("bias"):
                    p.fill_(0.25)
    xs, xd = torch.randn(M, P, dtype=D), torch.randn(Nd, P, dtype=D)
    ei = torch.empty(2, 0, dtype=torch.long)
    a = _attr(key, torch.randn(0, P, dtype=D))
    want, got = ref((xs, xd), ei, *a), ours((xs, xd), ei, *a)
    assert got.shape == want.shape == (Nd, Q)
    assert torch.allclose(got, want, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# lazy sizes, reset_parameters, checkpoints
@pytest.mark.parametrize("in_channels", [-1, (-1, -1), (-1, P + 1)])
def test_lazy_sage_is_sized_on_its_first_call(in_channels):
    torch.manual_seed(5)
    ref = pyg.SAGEConv(in_channels, Q).to(D)
    ours = sc.nn.SAGEConv(in_channels, Q).to(D)
    x, ei, _ = _graph(2)
    xd = x if in_channels == -1 else torch.randn(N, P + 1, dtype=D)
    xin = x if in_channels == -1 else (x, xd)
    ref(xin, ei)
    y = ours(xin, ei)
    assert y.shape == (N, Q) and ours.param.weight.shape == (1, P, Q)
    assert ours.root.shape == (xd.shape[1], Q)
    ours.load_state_dict(ref.state_dict())
    assert torch.allclose(ours(xin, ei), ref(xin, ei), atol=1e-12)
    with pytest.raises(ValueError, match=r"x_src.*\(N, 5\).*\(7, 6\)"):
        ours(torch.randn(N, 6, dtype=D), ei)


def test_lazy_sage_loads_a_checkpoint_before_its_first_call_and_refuses_lazy_projection():
    ref = pyg.SAGEConv(P, Q).to(D)
    ours = sc.nn.SAGEConv(-1, Q).to(D)
    ours.load_state_dict(ref.state_dict())
    x, ei, _ = _graph(3)
    assert torch.allclose(ours(x, ei), ref(x, ei), atol=1e-12)
    with pytest.raises(ValueError, match="lazy"):
        sc.nn.SAGEConv(-1, Q, project=True)


@pytest.mark.parametrize("key", list(MAKERS))
def test_reset_parameters_draws_again(key):
    _, ours = _layers(key)
    before = {n: p.detach().clone() for n, p in ours.named_parameters() if p.numel() > 1}
    ours.reset_parameters()
    after = dict(ours.named_parameters())
    assert before and all(not torch.equal(before[n], after[n]) for n in before)


@pytest.mark.parametrize("key", list(MAKERS))
def test_checkpoints_load_both_ways(key):
    ref, ours = _layers(key)  # PyG -> structconv
    x, ei, ea = _graph(5)
    a = _attr(key, ea)
    assert set(pyg_state_dict(ours)) == set(ref.state_dict())  # PyG's key names
    torch.manual_seed(9)
    back = MAKERS[key][1](pyg).to(D).eval()
    back.load_state_dict(pyg_state_dict(ours))  # structconv -> PyG
    assert torch.allclose(back(x, ei, *a), ours(x, ei, *a), atol=1e-12)


# ------------------------------------------------------------------------------------------------
# PyG's tooling
@pytest.mark.parametrize("key", ["sage-mean", "gin", "gine"])
def test_layers_are_message_passing_and_stay_picklable(key):
    _, ours = _layers(key)
    assert isinstance(ours, MessagePassing) and isinstance(ours, getattr(sc.nn, MAKERS[key][0]))
    x, ei, ea = _graph()
    a = _attr(key, ea)
    y = ours(x, ei, *a)
    for copied in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert type(copied) is type(ours) and torch.equal(copied(x, ei, *a), y)


def test_to_hetero_of_sage_gives_pygs_outputs():
    from torch_geometric.nn import to_hetero

    meta = (["a", "b"], [("a", "to", "b"), ("b", "to", "a"), ("a", "self", "a")])
    g = torch.Generator().manual_seed(6)
    xs = {"a": torch.randn(5, 3, generator=g), "b": torch.randn(4, 2, generator=g)}
    eis = {("a", "to", "b"): torch.tensor([[0, 1, 4, 2], [0, 3, 3, 1]]),
           ("b", "to", "a"): torch.tensor([[0, 3, 3, 1], [0, 1, 4, 2]]),
           ("a", "self", "a"): torch.tensor([[0, 1, 2], [1, 2, 3]])}

    def net(lib):
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = lib.SAGEConv((-1, -1), 4)

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


@pytest.mark.parametrize("key", ["sage-mean", "sage-max-normalize", "gin", "gine"])
def test_explainer_gives_pygs_explanation(key):
    from torch_geometric.explain import Explainer, GNNExplainer

    x, ei, ea = _graph(7, n=9, E=30)
    a = _attr(key, ea)

    class Net(torch.nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.conv = conv

        def forward(self, x, edge_index):
            return self.conv(x, edge_index, *a).sum(-1, keepdim=True).tanh()

    ref, ours = (Net(m) for m in _layers(key))
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


# ------------------------------------------------------------------------------------------------
# HGTConv (typed graphs)
META = (["a", "b", "c"], [("a", "to", "b"), ("b", "back", "a"), ("c", "to", "a")])


def _typed(seed=0, nc=3):
    g = torch.Generator().manual_seed(seed)
    n = {"a": 5, "b": 4, "c": nc}
    x = {"a": torch.randn(5, 3, generator=g, dtype=D), "b": torch.randn(4, 6, generator=g,
                                                                      dtype=D),
         "c": torch.randn(nc, 3, generator=g, dtype=D)}
    eis = {}
    for s, r, d in META[1]:
        E = 9 if n[s] and n[d] else 0
        ei = torch.stack([torch.randint(0, max(n[s], 1), (E,), generator=g),
                          torch.randint(0, max(n[d], 1), (E,), generator=g)])
        eis[(s, r, d)] = torch.unique(ei, dim=1).contiguous()
    return x, eis, n


WIDTHS = {"a": 3, "b": 6, "c": 3}


def _hgt(in_channels=None):
    in_channels = dict(WIDTHS) if in_channels is None else in_channels
    torch.manual_seed(3)
    ref = pyg.HGTConv(in_channels, 4, META, heads=2).to(D)
    torch.manual_seed(4)
    ours = sc.nn.HGTConv(in_channels, 4, META, heads=2).to(D)
    x, eis, _ = _typed()
    ref(x, eis)  # sizes PyG's lazy maps
    ours.load_state_dict(ref.state_dict())  # PyG's names load directly
    return ref, ours


def _close(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].shape == b[k].shape and torch.allclose(a[k], b[k], atol=1e-10), k


@pytest.mark.parametrize("in_channels", [None, -1])
def test_hgt_loads_pygs_checkpoint_and_gives_its_outputs_for_every_graph_input(in_channels):
    ref, ours = _hgt(in_channels)
    assert isinstance(ours, MessagePassing)
    x, eis, n = _typed(1)
    want = ref(x, eis)
    _close(ours(x, eis), want)
    for lay in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc):
        adj = {et: _adj_t(ei, torch.ones(ei.shape[1], dtype=D), n[et[0]], n[et[2]], lay)
               for et, ei in eis.items()}
        _close(ours(x, adj), want)
    _close(ours(x, {et: EdgeIndex(ei, sparse_size=(n[et[0]], n[et[2]]))
                    for et, ei in eis.items()}), want)
    assert set(pyg_state_dict(ours)) == set(ref.state_dict())
    torch.manual_seed(9)
    back = pyg.HGTConv(in_channels or WIDTHS, 4, META, heads=2).to(D)
    back(x, eis)
    back.load_state_dict(pyg_state_dict(ours))  # structconv -> PyG
    _close(back(x, eis), want)


def test_hgt_lazy_types_are_sized_on_the_first_call_and_load_before_it():
    ours = sc.nn.HGTConv(-1, 4, META, heads=2).to(D)
    x, eis, _ = _typed(2)
    y = ours(x, eis)
    assert {t: ours.kqv_weight[t].shape[0] for t in x} == {"a": 3, "b": 6, "c": 3}
    assert y["a"].shape == (5, 4)
    ref, _ = _hgt()
    fresh = sc.nn.HGTConv(-1, 4, META, heads=2).to(D)
    fresh.load_state_dict(ref.state_dict())
    _close(fresh(x, eis), ref(x, eis))
    before = ours.kqv_weight["b"].detach().clone()
    ours.reset_parameters()
    assert not torch.equal(before, ours.kqv_weight["b"])


def test_hgt_with_an_empty_node_type_gives_pygs_outputs():
    ref, ours = _hgt()
    x, eis, _ = _typed(3, nc=0)
    _close(ours(x, eis), ref(x, eis))


def test_hgt_refuses_bad_inputs_by_name():
    _, ours = _hgt()
    x, eis, _ = _typed()
    et = ("a", "to", "b")
    for bad in (eis[et].bool(), eis[et].double()):
        with pytest.raises(TypeError, match=r"edge_index_dict\[\('a', 'to', 'b'\)\].*integer"):
            ours(x, {**eis, et: bad})
    with pytest.raises(TypeError, match=r"x_dict\['b'\].*floating.*int64"):
        ours({**x, "b": x["b"].long()}, eis)


def test_a_lazy_hgt_prints():
    text = repr(sc.nn.HGTConv(-1, 4, META, heads=2))
    assert "uninitialized" in text and "HGTConv" in text


def test_hgt_refuses_an_explain_mask_it_would_ignore():
    # PyG's Explainer sets an edge mask on every MessagePassing layer; HGT does not apply it,
    # so it says so instead of returning an explanation that ignored the mask
    pytest.importorskip("torch_geometric")
    meta = (["a", "b"], [("a", "r", "b"), ("b", "s", "a")])
    m = sc.nn.HGTConv(4, 4, meta, heads=2)
    x = {"a": torch.randn(3, 4), "b": torch.randn(2, 4)}
    ei = {("a", "r", "b"): torch.tensor([[0, 1, 2], [0, 1, 1]]),
          ("b", "s", "a"): torch.tensor([[0, 1], [2, 0]])}
    m(x, ei)  # no mask: runs
    m.__dict__["_explain"] = True
    m.__dict__["_edge_mask"] = torch.zeros(3)
    with pytest.raises(NotImplementedError, match="explain edge masks"):
        m(x, ei)

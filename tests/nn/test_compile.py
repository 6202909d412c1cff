"""Every sc.nn layer traces whole: torch.compile(fullgraph=True) equals eager, values and grads.

Each layer is compiled **cold** (a fresh module that never ran eagerly: nothing it keeps, no
grid, plan, mask or basis, exists yet, so all of it is made inside the trace and must not be
kept from there) and **warm** (after an eager call has filled those caches). Planning and
structure building run on static shapes inside the trace (the planner needs no lock or I/O, the
sparse operator applies itself by gather + index_add while compiling, value checks that need
concrete data are skipped there).

Most cases compile with the ``aot_eager`` backend (Dynamo's trace and AOTAutograd's joint
graph, where a layer that cannot trace whole fails, without Inductor's C++ build); the
``INDUCTOR`` cases go through the default backend end to end.
"""

import copy

import pytest
import torch
from torch import nn

import structconv as sc
from structconv.models.hetero import TypedGATLayer
from tests.conftest import TwoSage

torch.manual_seed(0)
N, E = 24, 70
EI = torch.cat([torch.randint(0, N, (2, E)), torch.tensor([[3, 5], [3, 5]])], 1)  # 2 loops
ET = torch.randint(0, 3, (EI.shape[1],))
EA = torch.randn(EI.shape[1], 3)  # edge features
X = torch.randn(N, 6)
IMG = torch.randn(2, 3, 7, 9)
SEQ = torch.randn(2, 10, 16)
BUNDLE = torch.randn(2, 63, 3)  # a (7, 9) grid as a bundle
IDS = torch.randint(0, 11, (2, 9))
SRC, TGT = torch.randint(3, 11, (2, 7)), torch.randint(3, 13, (2, 6))
SRC[1, 5:] = 0  # a padded source row


# a typed graph: three node types, five relations (one with no edges), float32 features
NUM = {"a": 5, "b": 7, "c": 3}
META = (["a", "b", "c"], [("a", "r", "b"), ("b", "s", "a"), ("a", "t", "a"), ("c", "u", "b"),
                          ("b", "w", "c")])
XD = {t: torch.randn(n, 4) for t, n in NUM.items()}
EID = {e: torch.stack([torch.randint(0, NUM[e[0]], (0 if e[1] == "w" else 9,)),
                       torch.randint(0, NUM[e[2]], (0 if e[1] == "w" else 9,))])
       for e in META[1]}
BATCH = torch.tensor([0] * 9 + [1] * 8 + [2] * 7)  # X's 24 nodes in 3 graphs


def _mlp(p, q):
    return nn.Sequential(nn.Linear(p, 8), nn.ReLU(), nn.Linear(8, q))


def _lm(**kw):
    return lambda: sc.nn.TransformerLM(11, 16, 2, 2, **kw)


def _cases():
    dense = torch.randn(3, 10, 7)
    sparse = sc.basis.Sparse(torch.tensor([[0, 1, 2, 2], [1, 2, 3, 9], [4, 5, 6, 0]]),
                             torch.randn(4), (3, 10, 7))
    stack = sc.basis.Stack([torch.randn(1, 10, 7), sparse])
    B = torch.randn(2, 10, 4)
    s2s = dict(width=16, layers=1, heads=2)
    return {
        "Convolution-dense": (lambda: sc.nn.Convolution(dense, 4, 5), (B,)),
        "Convolution-sparse": (lambda: sc.nn.Convolution(sparse, 4, 5), (B,)),
        "Convolution-stack": (lambda: sc.nn.Convolution(stack, 4, 5, param="depthwise"), (B,)),
        "GridConv": (lambda: sc.nn.GridConv(3, 8, (3, 3), padding=1), (IMG,)),
        "GridConv-bundle": (lambda: sc.nn.GridConv(3, 4, (3, 3), padding=1, in_shape=(7, 9)),
                            (BUNDLE,)),
        "GridConv-shift": (lambda: sc.nn.GridConv(3, 4, (3, 3), padding=1, native=False), (IMG,)),
        "GridConv-shift-strided": (lambda: sc.nn.GridConv(3, 4, (2, 3), stride=2, native=False),
                                   (IMG,)),
        "GridConv-shift-channelwise": (lambda: sc.nn.GridConv(
            3, 3, (3, 3), padding=1, groups=3, native=False), (IMG,)),
        "GridConv-shift-depthwise": (lambda: sc.nn.GridConv(
            3, 6, (3, 3), padding=1, native=False, param="depthwise"), (IMG,)),
        "from_torch-Conv2d": (lambda: sc.nn.from_torch(nn.Conv2d(3, 8, 3, padding=1)), (IMG,)),
        "from_torch-Conv1d-same": (lambda: sc.nn.from_torch(nn.Conv1d(3, 4, 4, padding="same")),
                                   (IMG[:, :, 0],)),
        "GridAvgPool": (lambda: sc.nn.GridAvgPool((2, 2)), (IMG,)),
        "GridAvgPool-bundle": (lambda: sc.nn.GridAvgPool((2, 2), in_shape=(7, 9)), (BUNDLE,)),
        "from_torch-AvgPool2d": (lambda: sc.nn.from_torch(nn.AvgPool2d(3, 2, 1)), (IMG,)),
        "GCNConv": (lambda: sc.nn.GCNConv(6, 4), (X, EI)),
        "ChebConv": (lambda: sc.nn.ChebConv(6, 4, 3), (X, EI)),
        "TAGConv": (lambda: sc.nn.TAGConv(6, 4), (X, EI)),
        "SGConv": (lambda: sc.nn.SGConv(6, 4, K=2), (X, EI)),
        "RGCNConv": (lambda: sc.nn.RGCNConv(6, 4, 3), (X, EI, ET)),
        "GATConv": (lambda: sc.nn.GATConv(6, 4, heads=2), (X, EI)),
        "GATConv-edges": (lambda: sc.nn.GATConv(6, 4, heads=2, edge_dim=3, fill_value="max"),
                          (X, EI, EA)),
        "GATv2Conv": (lambda: sc.nn.GATv2Conv(6, 4, heads=2, residual=True), (X, EI)),
        "GATv2Conv-edges": (lambda: sc.nn.GATv2Conv(6, 4, heads=2, edge_dim=3,
                                                    share_weights=True), (X, EI, EA)),
        "TransformerConv": (lambda: sc.nn.TransformerConv(6, 4, heads=2, concat=False), (X, EI)),
        "TransformerConv-edges": (lambda: sc.nn.TransformerConv(6, 4, heads=2, edge_dim=3,
                                                                beta=True), (X, EI, EA)),
        "MultiheadAttention": (lambda: sc.nn.MultiheadAttention(16, 4, batch_first=True),
                               (SEQ, SEQ, SEQ)),
        "from_torch-MultiheadAttention": (lambda: sc.nn.from_torch(nn.MultiheadAttention(
            16, 2, batch_first=True)), (SEQ, SEQ[:, :6], SEQ[:, :6])),
        "TransformerEncoderLayer": (lambda: sc.nn.TransformerEncoderLayer(
            16, 4, 32, dropout=0.0, batch_first=True), (SEQ,)),
        "TransformerDecoderLayer": (lambda: sc.nn.TransformerDecoderLayer(
            16, 4, 32, dropout=0.0, batch_first=True), (SEQ, SEQ[:, :7])),
        "MixedAttention": (lambda: sc.nn.MixedAttention(16, 4), (SEQ,)),
        "CausalSelfAttention": (lambda: sc.nn.CausalSelfAttention(16, 2, 2), (SEQ,)),
        "Canon": (lambda: sc.nn.Canon(16, 3), (SEQ,)),
        "TransformerLM-shift-canon": (_lm(canon="ABCD", canon_kernel=3), (IDS,)),
        "TransformerLM-rotary": (_lm(position="rotary"), (IDS,)),
        "TransformerLM-alibi": (_lm(position="shift+alibi"), (IDS,)),
        "TransformerLM-relative": (_lm(position="relative"), (IDS,)),
        "TransformerLM-learned": (_lm(position="learned", context=12), (IDS,)),
        "SelfAttention": (lambda: sc.nn.SelfAttention(16, 2, (-1, 1)), (SEQ,)),
        "CrossAttention": (lambda: sc.nn.CrossAttention(16, 2), (SEQ, SEQ[:, :4])),
        "Seq2Seq-shift-canon": (lambda: sc.nn.Seq2Seq(11, 13, position="shift", canon="ABCD",
                                                      **s2s), (SRC, TGT)),
        "Seq2Seq-alibi": (lambda: sc.nn.Seq2Seq(11, 13, position="alibi", **s2s), (SRC, TGT)),
        "PervasiveAttention": (lambda: sc.nn.PervasiveAttention(
            11, 13, embed=4, layers=2, growth=4), (SRC, TGT)),
        "PervasiveAttention-max": (lambda: sc.nn.PervasiveAttention(
            11, 13, embed=4, layers=1, growth=4, pooling="max"), (SRC, TGT)),
        "AttentionPooling": (lambda: sc.nn.AttentionPooling(8, 5, heads=2),
                             (torch.randn(2, 3, 4, 8),)),
        "SparseDropout-eval": (lambda: sc.nn.SparseDropout(0.5).eval(), (X,)),
        "GINConv": (lambda: sc.nn.GINConv(_mlp(6, 4), train_eps=True), (X, EI)),
        "GINEConv": (lambda: sc.nn.GINEConv(_mlp(6, 4), edge_dim=3), (X, EI, EA)),
        "AttentionalAggregation": (lambda: sc.nn.AttentionalAggregation(
            nn.Linear(6, 1), _mlp(6, 5)), (X, BATCH, None, 3)),
        "NodeGate": (lambda: sc.nn.NodeGate(nn.Linear(6, 2)), (X, 3)),
        "SAGEConv": (lambda: sc.nn.SAGEConv(6, 4), (X, EI)),
        "SAGEConv-max-project": (lambda: sc.nn.SAGEConv(6, 4, aggr="max", project=True,
                                                        normalize=True), (X, EI)),
        "HeteroConv": (lambda: sc.nn.HeteroConv({e: sc.nn.SAGEConv(4, 3) for e in META[1]},
                                                aggr="sum"), (XD, EID)),
        "TypedGraphConv": (lambda: sc.nn.TypedGraphConv(4, 3, META), (XD, EID)),
        "TypedModel": (lambda: sc.nn.to_hetero(TwoSage(), META), (XD, EID)),
        "HGTConv": (lambda: sc.nn.HGTConv(4, 6, META, heads=2), (XD, EID)),
        "HANConv": (lambda: sc.nn.HANConv(4, 6, META, heads=2), (XD, EID)),
        "TypedGATLayer": (lambda: TypedGATLayer({t: 4 for t in META[0]}, 3, META, heads=2),
                          (XD, EID)),
    }


CASES = _cases()
#: compiled by the default backend (Inductor) as well: the reported cold grid case, a graph,
#: an attention and a sequence layer
INDUCTOR = ("GridConv", "from_torch-Conv2d", "GCNConv", "CausalSelfAttention")


def _out(y):
    if isinstance(y, dict):  # a typed layer: its node types' outputs, in a fixed order
        return torch.cat([y[t] for t in sorted(y) if y[t] is not None])
    return y[0] if isinstance(y, tuple) else y


def _input(a):
    if isinstance(a, dict):
        return {k: _input(v) for k, v in a.items()}
    if isinstance(a, torch.Tensor) and a.is_floating_point() and not a.is_sparse:
        return a.clone().requires_grad_()
    return a


def _leaves(ins):
    for a in ins:
        if isinstance(a, dict):
            yield from _leaves(a.values())
        elif isinstance(a, torch.Tensor) and a.requires_grad:
            yield a


def _run(layer, args, gy=None):
    """(output, grads of (parameters, floating inputs), the upstream gradient used)."""
    ins = [_input(a) for a in args]
    y = _out(layer(*ins))
    if y.is_sparse:
        y = y.to_dense()
    wrt = [*(p for p in layer.parameters() if p.requires_grad), *_leaves(ins)]
    if not wrt:
        return y, [], None
    gy = torch.randn_like(y) if gy is None else gy
    # a typed layer's relation without edges leaves its parameters unused: zero gradients
    return y, torch.autograd.grad(y, wrt, gy, allow_unused=True, materialize_grads=True), gy


def _check(name, backend):
    make, args = CASES[name]
    torch.manual_seed(1)
    cold = make()
    eager = copy.deepcopy(cold)  # the same weights, nothing run yet
    torch._dynamo.reset()
    y, want, gy = _run(eager, args)  # eager from here on: ``eager`` is warm
    yc, got, _ = _run(torch.compile(cold, fullgraph=True, backend=backend), args, gy)
    torch.testing.assert_close(yc, y, rtol=1e-4, atol=1e-5)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    yw, got, _ = _run(torch.compile(eager, fullgraph=True, backend=backend), args, gy)
    torch.testing.assert_close(yw, y, rtol=1e-4, atol=1e-5)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cold_and_warm_compile_equal_eager(name):
    _check(name, "aot_eager")


@pytest.mark.parametrize("name", INDUCTOR)
def test_cold_and_warm_compile_equal_eager_inductor(name):
    _check(name, "inductor")


def test_cold_compiled_grid_layer_keeps_nothing_from_the_trace():
    # a plan or grid made while tracing holds traced objects: the layer keeps none, and its
    # ``.basis`` still names the grid of the input it was last called on
    layer = sc.nn.GridConv(3, 8, (3, 3), padding=1)
    torch._dynamo.reset()
    torch.compile(layer, fullgraph=True, backend="aot_eager")(IMG)
    assert not layer._plans and not layer._bases
    assert layer.basis.in_shape == (7, 9)
    assert layer(IMG).shape == (2, 8, 7, 9)  # and it still runs eagerly


def test_sparse_dropout_compiles_in_training():
    # training draws at random, so the compiled layer is checked by what dropout means: each
    # entry kept and scaled by 1 / (1 - p), or zeroed; zeros stay zero
    x = torch.relu(torch.randn(40, 30))
    torch._dynamo.reset()
    y = torch.compile(sc.nn.SparseDropout(0.5), fullgraph=True, backend="aot_eager")(x)
    kept = y != 0
    assert not kept[x == 0].any() and 0 < int(kept.sum()) < int((x != 0).sum())
    torch.testing.assert_close(y[kept], 2 * x[kept])


def test_every_layer_class_is_compiled():
    # a new sc.nn layer gets a compile case here
    layers = {n for n in sc.nn.__all__ if isinstance(getattr(sc.nn, n), type)
              and issubclass(getattr(sc.nn, n), nn.Module)}
    covered = {type(make()).__name__ for make, _ in CASES.values()}
    assert layers <= covered, sorted(layers - covered)


def test_gcn_compiles_in_float64_with_self_loops():
    # the traced structure (static-shape self loops) takes the input's dtype, as eager does
    layer = sc.nn.GCNConv(6, 4).double()
    x = X.double()
    torch._dynamo.reset()
    y = torch.compile(layer, fullgraph=True)(x, EI)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, layer(x, EI), rtol=1e-12, atol=1e-12)

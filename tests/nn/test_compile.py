"""Every sc.nn layer traces whole: torch.compile(fullgraph=True) equals eager, values and grads.

Planning and structure building run on static shapes inside the trace (the planner needs no
lock or I/O, the sparse operator applies itself by gather + index_add while compiling, value
checks that need concrete data are skipped there).
"""

import pytest
import torch

import structconv as sc

torch.manual_seed(0)
N, E = 24, 70
EI = torch.cat([torch.randint(0, N, (2, E)), torch.tensor([[3, 5], [3, 5]])], 1)  # 2 loops
ET = torch.randint(0, 3, (EI.shape[1],))
EA = torch.randn(EI.shape[1], 3)  # edge features
X = torch.randn(N, 6)
IMG = torch.randn(2, 3, 7, 9)
SEQ = torch.randn(2, 10, 16)


def _cases():
    dense = torch.randn(3, 10, 7)
    sparse = sc.basis.Sparse(torch.tensor([[0, 1, 2, 2], [1, 2, 3, 9], [4, 5, 6, 0]]),
                             torch.randn(4), (3, 10, 7))
    stack = sc.basis.Stack([torch.randn(1, 10, 7), sparse])
    B = torch.randn(2, 10, 4)
    return {
        "Convolution-dense": (lambda: sc.nn.Convolution(dense, 4, 5), (B,)),
        "Convolution-sparse": (lambda: sc.nn.Convolution(sparse, 4, 5), (B,)),
        "Convolution-stack": (lambda: sc.nn.Convolution(stack, 4, 5, param="depthwise"), (B,)),
        "GridConv": (lambda: sc.nn.GridConv(3, 4, (3, 3), padding=1), (IMG,)),
        "GridConv-shift": (lambda: sc.nn.GridConv(3, 4, (3, 3), padding=1, native=False), (IMG,)),
        "GridConv-shift-strided": (lambda: sc.nn.GridConv(3, 4, (2, 3), stride=2, native=False),
                                   (IMG,)),
        "GridAvgPool": (lambda: sc.nn.GridAvgPool((2, 2)), (IMG,)),
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
        "TransformerEncoderLayer": (lambda: sc.nn.TransformerEncoderLayer(
            16, 4, 32, dropout=0.0, batch_first=True), (SEQ,)),
        "TransformerDecoderLayer": (lambda: sc.nn.TransformerDecoderLayer(
            16, 4, 32, dropout=0.0, batch_first=True), (SEQ, SEQ[:, :7])),
        "MixedAttention": (lambda: sc.nn.MixedAttention(16, 4), (SEQ,)),
        "GridConv-shift-channelwise": (lambda: sc.nn.GridConv(
            3, 3, (3, 3), padding=1, groups=3, native=False), (IMG,)),
        "GridConv-shift-depthwise": (lambda: sc.nn.GridConv(
            3, 6, (3, 3), padding=1, native=False, param="depthwise"), (IMG,)),
    }


CASES = _cases()


def _out(y):
    return y[0] if isinstance(y, tuple) else y


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_whole_and_equals_eager(name):
    make, args = CASES[name]
    torch.manual_seed(1)
    layer = make()
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    ins = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
    y = _out(layer(*ins))
    gy = torch.randn_like(y)
    params = [p for p in layer.parameters() if p.requires_grad]
    # every floating input: node features, and edge features where the layer takes them
    wrt = [*params, *(a for a in ins if a.requires_grad)]
    want = torch.autograd.grad(y, wrt, gy)
    yc = _out(compiled(*ins))
    got = torch.autograd.grad(yc, wrt, gy)
    torch.testing.assert_close(yc, y, rtol=1e-4, atol=1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_gcn_compiles_in_float64_with_self_loops():
    # the traced structure (static-shape self loops) takes the input's dtype, as eager does
    layer = sc.nn.GCNConv(6, 4).double()
    x = X.double()
    torch._dynamo.reset()
    y = torch.compile(layer, fullgraph=True)(x, EI)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, layer(x, EI), rtol=1e-12, atol=1e-12)

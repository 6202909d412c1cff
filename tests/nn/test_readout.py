"""Readout as a rectangular basis (1, M, N); PyG's global pools and attentional aggregation."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc

torch.manual_seed(0)


def _batch(sizes):
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


SIZES = [3, 0, 5, 1, 0, 4]  # empty graphs in the middle
BATCH = _batch(SIZES)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_readout_dense_entries(reduce):
    b = sc.basis.readout(BATCH, reduce=reduce)
    assert isinstance(b, sc.basis.Basis) and b.shape == (1, 13, 6)
    A = b.to_dense()
    want = torch.zeros(1, 13, 6)
    for m, g in enumerate(BATCH.tolist()):
        want[0, m, g] = 1.0 if reduce == "sum" else 1.0 / SIZES[g]
    torch.testing.assert_close(A, want)


def test_readout_trailing_empty_graphs_need_num_graphs():
    assert sc.basis.readout(BATCH).N == 6
    assert sc.basis.readout(BATCH, num_graphs=8).N == 8
    with pytest.raises(ValueError, match="batch ids"):
        sc.basis.readout(BATCH, num_graphs=3)
    with pytest.raises(ValueError, match="reduce"):
        sc.basis.readout(BATCH, reduce="max")


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 5), min_size=1, max_size=6).filter(lambda s: sum(s) > 0),
       B=st.integers(1, 3), P=st.integers(1, 4), Q=st.integers(1, 3),
       reduce=st.sampled_from(["sum", "mean"]))
def test_readout_convolve_every_route_equals_dense(sizes, B, P, Q, reduce):
    batch = _batch(sizes)
    b = sc.basis.readout(batch, reduce=reduce)
    x = torch.randn(B, batch.shape[0], P, dtype=torch.float64)
    th = torch.randn(1, P, Q, dtype=torch.float64)
    want = torch.einsum("kmn,bmp,kpq->bnq", b.to_dense().double(), x, th)
    for route in ("input_param", "basis_input", "basis_param"):
        torch.testing.assert_close(sc.convolve(x, b, th, route=route), want)


def test_readout_in_stack_and_product():
    ei = torch.tensor([[0, 1, 2, 5, 6], [1, 2, 0, 6, 5]])
    batch = _batch([3, 4])
    adj = sc.basis.adjacency(ei, 7)
    prod = sc.basis.Product(adj, sc.basis.readout(batch))  # aggregate, then read out
    stack = sc.basis.Stack([sc.basis.readout(batch), sc.basis.readout(batch, reduce="mean")])
    x = torch.randn(7, 3, dtype=torch.float64)
    th = torch.randn(2, 3, 2, dtype=torch.float64)
    for b in (prod, stack):
        want = torch.einsum("kmn,mp,kpq->nq", b.to_dense().double(), x, th[:b.K])
        torch.testing.assert_close(sc.convolve(x, b, th[:b.K]), want)
    torch.testing.assert_close(prod.to_dense()[0], adj.to_dense()[0] @ sc.basis.readout(
        batch).to_dense()[0])


def test_readout_moves_and_casts():
    b = sc.basis.readout(BATCH, reduce="mean").to(dtype=torch.float64)
    assert b.dtype == torch.float64 and b.index.dtype == torch.long


@pytest.mark.parametrize("name", ["global_add_pool", "global_mean_pool", "global_max_pool"])
def test_global_pools_equal_pyg(name):
    pyg = pytest.importorskip("torch_geometric.nn")
    x = torch.randn(13, 5, dtype=torch.float64, requires_grad=True)
    ours, theirs = getattr(sc.nn, name), getattr(pyg, name)
    for args in ((BATCH,), (BATCH, 9), (None,)):
        y = ours(x, *args)
        want = theirs(x, *args)
        torch.testing.assert_close(y, want, rtol=1e-13, atol=1e-14)
        g = torch.randn_like(want)
        torch.testing.assert_close(torch.autograd.grad(y, x, g)[0],
                                   torch.autograd.grad(want, x, g)[0])
    # 1-d and batched (B, M, C) inputs, no nodes at all
    torch.testing.assert_close(ours(x[:, 0], BATCH), theirs(x[:, 0], BATCH))
    xb = torch.randn(2, 13, 3, dtype=torch.float64)
    torch.testing.assert_close(ours(xb, BATCH), theirs(xb, BATCH))
    empty = torch.zeros(0, 5, dtype=torch.float64)
    assert torch.equal(ours(empty, BATCH[:0], 3), theirs(empty, BATCH[:0], 3))


def test_pool_errors_name_the_argument():
    with pytest.raises(ValueError, match="batch has 4 entries"):
        sc.nn.global_add_pool(torch.randn(5, 2), BATCH[:4])


@pytest.mark.parametrize("gate_width", [1, 4])
def test_attentional_aggregation_equals_pyg(gate_width):
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(2)
    gate = torch.nn.Sequential(torch.nn.Linear(3, 7), torch.nn.Tanh(),
                               torch.nn.Linear(7, gate_width)).double()
    inner = torch.nn.Linear(3, 4).double()
    theirs = pyg.aggr.AttentionalAggregation(gate, inner)
    ours = sc.nn.from_pyg(theirs)
    assert isinstance(ours, sc.nn.AttentionalAggregation)
    x = torch.randn(13, 3, dtype=torch.float64, requires_grad=True)
    for dim_size in (None, 8):
        y, want = ours(x, BATCH, dim_size=dim_size), theirs(x, BATCH, dim_size=dim_size)
        torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-13)
    g = torch.randn_like(want)
    params = [x, *gate.parameters(), *inner.parameters()]
    for a, b in zip(torch.autograd.grad(y, params, g), torch.autograd.grad(want, params, g)):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-13)


def test_attention_readout_is_the_attention_algebra():
    # the layer's basis equals attention_basis of Softmax(GraphMasked(NodeGate)) on the
    # node -> graph edges: scores per node, softmax over each graph's column
    gate = torch.nn.Linear(3, 1).double()
    agg = sc.nn.AttentionalAggregation(gate)
    x = torch.randn(13, 3, dtype=torch.float64)
    ei = torch.stack([torch.arange(13), BATCH])
    mech = sc.attention.Softmax(sc.attention.GraphMasked(sc.nn.NodeGate(gate, 1), ei))
    want = sc.attention.attention_basis(mech, x, 6).to_dense()
    A = agg.basis(x, BATCH, 6).to_dense()
    torch.testing.assert_close(A, want)
    cols = A[0].sum(0)
    assert torch.allclose(cols, torch.tensor([1.0, 0, 1, 1, 0, 1], dtype=torch.float64))

"""The paper's algebra: mixed product, Propositions 1 and 2, composition, the generic layer."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv import params
from structconv.basis import Product

D = torch.float64
small = st.integers(1, 4)


@settings(max_examples=30, deadline=None)
@given(K=small, s=st.lists(small, min_size=1, max_size=2), t=st.lists(small, min_size=1,
       max_size=2), seed=st.integers(0, 10**6))
def test_mixed_product_definition_and_rank_bound(K, s, t, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(K, *s, generator=gen, dtype=D)
    b = torch.randn(K, *t, generator=gen, dtype=D)
    out = sc.mixed_product(a, b)
    ref = sum(torch.tensordot(a[k], b[k], dims=0) for k in range(K))
    torch.testing.assert_close(out, ref)
    # rank(a∘b) <= Σ_k rank(a_k) rank(b_k), on the matricisations S x T
    mat = out.reshape(math.prod(s), math.prod(t))
    bound = sum(torch.linalg.matrix_rank(a[k].reshape(-1, 1)).item()
                * torch.linalg.matrix_rank(b[k].reshape(1, -1)).item() for k in range(K))
    assert torch.linalg.matrix_rank(mat).item() <= bound


def test_mixed_product_shape_error():
    with pytest.raises(ValueError, match=r"same K.*\(3, 2\).*\(2, 2\)"):
        sc.mixed_product(torch.randn(3, 2), torch.randn(2, 2))


@settings(max_examples=20, deadline=None)
@given(M=st.integers(1, 3), N=st.integers(1, 3), P=small, Q=small, seed=st.integers(0, 10**6))
def test_proposition1_inversion_of_a_spanning_basis(M, N, P, Q, seed):
    """A basis of K = MN independent matrices recovers any Φ exactly and uniquely."""
    gen = torch.Generator().manual_seed(seed)
    K = M * N
    A = torch.randn(K, M, N, generator=gen, dtype=D)  # full rank with probability 1
    phi = torch.randn(M, N, P, Q, generator=gen, dtype=D)
    theta = sc.invert(A, phi)
    assert theta.shape == (K, P, Q)
    torch.testing.assert_close(sc.materialize(A, theta), phi)
    # uniqueness: invert(materialize(theta)) gives theta back
    theta2 = torch.randn(K, P, Q, generator=gen, dtype=D)
    torch.testing.assert_close(sc.invert(A, sc.materialize(A, theta2)), theta2)


def test_proposition1_least_squares_when_not_spanning():
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(2, 3, 3, generator=gen, dtype=D)
    phi = torch.randn(3, 3, 2, 2, generator=gen, dtype=D)
    theta = sc.invert(A, phi)
    resid = phi - sc.materialize(A, theta)
    # the residual is orthogonal to every basis matrix (normal equations)
    for k in range(2):
        torch.testing.assert_close(torch.einsum("mn,mnpq->pq", A[k], resid),
                                   torch.zeros(2, 2, dtype=D), atol=1e-10, rtol=0)
    # and a rank-deficient basis (duplicate matrices) still gives a least-squares answer
    A2 = torch.cat([A[:1], A[:1]])
    th2 = sc.invert(A2, phi)
    one = sc.materialize(A[:1], sc.invert(A[:1], phi))
    torch.testing.assert_close(sc.materialize(A2, th2), one)


def test_invert_shape_error():
    with pytest.raises(ValueError, match=r"\(M, N\)=\(3, 4\)"):
        sc.invert(torch.randn(2, 3, 4), torch.randn(4, 3, 1, 1))


@settings(max_examples=20, deadline=None)
@given(K1=small, K2=small, M=small, L=small, N=small, P=small, R=small, Q=small,
       seed=st.integers(0, 10**6))
def test_proposition2_composition(K1, K2, M, L, N, P, R, Q, seed):
    gen = torch.Generator().manual_seed(seed)
    A1 = torch.randn(K1, M, L, generator=gen, dtype=D)
    A2 = torch.randn(K2, L, N, generator=gen, dtype=D)
    t1 = torch.randn(K1, P, R, generator=gen, dtype=D)
    t2 = torch.randn(K2, R, Q, generator=gen, dtype=D)
    x = torch.randn(2, M, P, generator=gen, dtype=D)
    basis, theta = sc.compose((A1, t1), (A2, t2))
    assert isinstance(basis, Product) and basis.K == K1 * K2 and theta.shape == (K1 * K2, P, Q)
    two_steps = sc.convolve(sc.convolve(x, A1, t1), A2, t2)
    for route in sc.ROUTES:
        torch.testing.assert_close(sc.convolve(x, basis, theta, route=route), two_steps)
    # index convention k = k' * K'' + k''
    dense = basis.to_dense()
    torch.testing.assert_close(dense[min(1, K1 - 1) * K2 + (K2 - 1)],
                               A1[min(1, K1 - 1)] @ A2[K2 - 1])


def test_compose_mismatch_errors():
    with pytest.raises(ValueError, match="N=4.*M=3"):
        sc.compose((torch.randn(1, 2, 4), torch.randn(1, 2, 2)),
                   (torch.randn(1, 3, 2), torch.randn(1, 2, 2)))
    with pytest.raises(ValueError, match="Q=5.*P=2"):
        sc.compose((torch.randn(1, 2, 3), torch.randn(1, 2, 5)),
                   (torch.randn(1, 3, 2), torch.randn(1, 2, 2)))


def test_convolution_layer():
    torch.manual_seed(0)
    A = torch.randn(3, 5, 4)
    layer = sc.nn.Convolution(A, 2, 6)
    x = torch.randn(5, 2)
    y = layer(x)
    assert y.shape == (4, 6)
    torch.testing.assert_close(y, torch.einsum("kmn,mp,kpq->nq", A, x, layer.param()) + layer.bias)
    assert layer(torch.randn(7, 5, 2)).shape == (7, 4, 6)
    lr = sc.nn.Convolution(A, 2, 6, param=params.LowRank(3, 2, 6, 1), bias=False)
    assert lr.bias is None and lr(x).shape == (4, 6)
    with pytest.raises(ValueError, match=r"\(K, P, Q\)=\(3, 2, 5\).*\(3, 2, 6\)"):
        sc.nn.Convolution(A, 2, 6, param=params.Full(3, 2, 5))
    with pytest.raises(ValueError, match="unknown param"):
        sc.nn.Convolution(A, 2, 6, param="fancy")

"""The core engine: every route and basis kind equals the einsum definition, with gradients."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv.basis import Dense, Product, Sparse, Stack
from structconv.basis.base import csr_matmul, to_csr

D = torch.float64
dims = st.integers(1, 5)


def reference(A, x, theta):
    """The convolution's definition, y[b,n,q] = Σ A[k,m,n] x[b,m,p] θ[k,p,q]."""
    return torch.einsum("kmn,bmp,kpq->bnq", A, x, theta)


def random_sparse(K, M, N, density, gen, dup=True):
    """A Sparse basis with the given density (and duplicate entries, which are summed)."""
    mask = torch.rand(K, M, N, generator=gen, dtype=D) < density
    idx = mask.nonzero().T
    vals = torch.randn(idx.shape[1], generator=gen, dtype=D)
    if dup and idx.shape[1]:
        idx = torch.cat([idx, idx[:, :1]], 1)
        vals = torch.cat([vals, vals[:1]])
    return Sparse(idx, vals, (K, M, N))


def make_bases(K, M, N, gen):
    """One basis of every generic kind with the given (K, M, N), and its dense tensor."""
    out = []
    A = torch.randn(K, M, N, generator=gen, dtype=D)
    out.append(Dense(A))
    out.append(random_sparse(K, M, N, 0.4, gen))
    if K >= 2:
        out.append(Stack([Dense(A[:1]), random_sparse(K - 1, M, N, 0.5, gen)]))
    # a Product with K = K1 * K2 when K factors
    for K1 in range(1, K + 1):
        if K % K1 == 0:
            K2, L = K // K1, 3
            out.append(Product(random_sparse(K1, M, L, 0.6, gen),
                               Dense(torch.randn(K2, L, N, generator=gen, dtype=D))))
            break
    return out


@settings(max_examples=25, deadline=None)
@given(B=dims, K=dims, M=dims, N=dims, P=dims, Q=dims, seed=st.integers(0, 10**6),
       batched=st.booleans())
def test_every_route_and_basis_matches_einsum(B, K, M, N, P, Q, seed, batched):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, M, P, generator=gen, dtype=D)
    theta = torch.randn(K, P, Q, generator=gen, dtype=D)
    for basis in make_bases(K, M, N, gen):
        ref = reference(basis.to_dense(), x, theta)
        for route in (*sc.ROUTES, "auto"):
            xin = x if batched else x[0]
            y = sc.convolve(xin, basis, theta, route=route)
            expect = ref if batched else ref[0]
            assert y.shape == expect.shape
            torch.testing.assert_close(y, expect, rtol=1e-10, atol=1e-10,
                                       msg=f"{basis!r} route={route}")


@settings(max_examples=15, deadline=None)
@given(K=dims, M=dims, N=dims, C=dims, B=st.integers(1, 3), seed=st.integers(0, 10**6))
def test_primitives_match_dense(K, M, N, C, B, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, M, C, generator=gen, dtype=D)
    z = torch.randn(B, M, K, C, generator=gen, dtype=D)
    for basis in make_bases(K, M, N, gen):
        A = basis.to_dense()
        torch.testing.assert_close(basis.propagate(x), torch.einsum("kmn,bmc->bnkc", A, x))
        torch.testing.assert_close(basis.propagate_sum(z), torch.einsum("kmn,bmkc->bnc", A, z))
        torch.testing.assert_close(basis.propagate_heads(z),
                                   torch.einsum("kmn,bmkc->bnkc", A, z))


@pytest.mark.parametrize("route", [*sc.ROUTES, "auto"])
@pytest.mark.parametrize("kind", ["dense", "sparse", "stack", "product"])
def test_gradients_match_einsum(route, kind):
    gen = torch.Generator().manual_seed(1)
    K, M, N, P, Q, B = 4, 7, 5, 3, 2, 2
    basis = {b.__class__.__name__.lower(): b for b in make_bases(K, M, N, gen)}[kind]
    x = torch.randn(B, M, P, dtype=D, requires_grad=True)
    theta = torch.randn(K, P, Q, dtype=D, requires_grad=True)
    w = torch.randn(B, N, Q, dtype=D)
    (sc.convolve(x, basis, theta, route=route) * w).sum().backward()
    gx, gt = x.grad.clone(), theta.grad.clone()
    x.grad = theta.grad = None
    (reference(basis.to_dense().detach(), x, theta) * w).sum().backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gt, theta.grad)


def test_gradient_through_dense_basis():
    A = torch.randn(3, 4, 5, dtype=D, requires_grad=True)
    x = torch.randn(2, 4, 3, dtype=D)
    th = torch.randn(3, 3, 2, dtype=D)
    for route in sc.ROUTES:
        torch.autograd.gradcheck(lambda a, r=route: sc.convolve(x, a, th, route=r), (A,))


def test_gradient_through_sparse_values():
    gen = torch.Generator().manual_seed(3)
    sp = random_sparse(2, 5, 4, 0.5, gen)
    vals = sp.values.clone().requires_grad_(True)
    x = torch.randn(2, 5, 3, dtype=D)
    th = torch.randn(2, 3, 2, dtype=D)

    def f(v):
        return sc.convolve(x, Sparse(sp.indices, v, sp.shape), th, route="input_param")

    torch.autograd.gradcheck(f, (vals,))


def test_csr_matmul_gradcheck():
    gen = torch.Generator().manual_seed(0)
    r = torch.randint(0, 6, (15,), generator=gen)
    c = torch.randint(0, 4, (15,), generator=gen)
    v = torch.randn(15, generator=gen, dtype=D)
    S, St = to_csr(r, c, v, (6, 4)), to_csr(c, r, v, (4, 6))
    X = torch.randn(4, 3, dtype=D, requires_grad=True)
    torch.autograd.gradcheck(lambda t: csr_matmul(S, St, t), (X,))
    # the bias added in the sparse kernel (addmm): values and gradients of X and the bias
    bias = torch.randn(3, dtype=D, requires_grad=True)
    torch.testing.assert_close(csr_matmul(S, St, X, bias), S.to_dense() @ X + bias)
    torch.autograd.gradcheck(lambda t, b: csr_matmul(S, St, t, b), (X, bias))
    torch.autograd.gradcheck(lambda b: csr_matmul(S, St, X.detach(), b), (bias,))


def test_dtype_and_device_follow_the_input():
    gen = torch.Generator().manual_seed(0)
    sp = random_sparse(2, 6, 6, 0.5, gen)
    x = torch.randn(6, 3, dtype=torch.float32)
    th = torch.randn(2, 3, 4, dtype=torch.float32)
    y = sc.convolve(x, sp, th)
    assert y.dtype == torch.float32
    ref = reference(sp.to_dense().float(), x[None], th)[0]
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)


def test_shape_errors_name_both_shapes():
    A = torch.randn(3, 4, 5)
    with pytest.raises(ValueError, match=r"K=3.*K=2.*dimension K disagrees"):
        sc.convolve(torch.randn(4, 2), A, torch.randn(2, 2, 3))
    with pytest.raises(ValueError, match=r"P=6.*P=2.*dimension P disagrees"):
        sc.convolve(torch.randn(4, 6), A, torch.randn(3, 2, 3))
    with pytest.raises(ValueError, match=r"M=7.*M=4"):
        sc.convolve(torch.randn(7, 2), A, torch.randn(3, 2, 3))
    with pytest.raises(ValueError, match="unknown route"):
        sc.convolve(torch.randn(4, 2), A, torch.randn(3, 2, 3), route="sideways")
    with pytest.raises(ValueError, match="out of range"):
        Sparse(torch.tensor([[0], [9], [0]]), None, (1, 4, 4))
    with pytest.raises(ValueError, match=r"share \(M, N\)"):
        Stack([torch.randn(1, 3, 3), torch.randn(1, 3, 4)])
    with pytest.raises(ValueError, match="first.N == second.M"):
        Product(torch.randn(1, 3, 4), torch.randn(1, 3, 4))

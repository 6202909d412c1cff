"""float16 / bfloat16 through the sparse operator: computed in float32, cast back.

torch has no half-precision CPU SpMM ("addmm_out_sparse_csr_impl_mkl not implemented for
'Half'"); ``structconv.sparse.SparseMatrix`` computes such inputs in float32, so every graph and
sparse basis takes half-precision bundles: the output keeps the input's dtype, the values match
the float32 computation on the same (rounded) inputs to the half type's precision, and
gradients flow back in the input's dtype.
"""

from __future__ import annotations

import pytest
import torch

import structconv as sc
from structconv.basis import Sparse, chebyshev, diffusion, gcn, relational, sgc
from structconv.engine import ROUTES

N = 13
#: relative precision of one rounding to the type, times the few roundings a route makes
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _bases():
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, N, (2, 50), generator=g)
    et = torch.randint(0, 3, (50,), generator=g)
    idx = torch.stack([torch.randint(0, s, (40,), generator=g) for s in (2, N, N)])
    return {
        "gcn": gcn(ei, N),
        "chebyshev": chebyshev(ei, N, 3),
        "sgc": sgc(ei, N, 2),
        "diffusion": diffusion(ei, N, 2),
        "relational": relational(ei, et, N),
        "relational_sorts": relational(ei, et, N, sorts=[(0,), (1, 2)]),
        "sparse": Sparse(idx, torch.randn(40, generator=g), (2, N, N)),
    }


BASES = _bases()


@pytest.mark.parametrize("route", ("auto",) + ROUTES)
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("kind", sorted(BASES))
def test_half_precision_matches_float32_and_keeps_its_dtype(kind, dtype, route):
    basis = BASES[kind]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, N, 5, generator=g).to(dtype).requires_grad_()
    theta = (torch.randn(basis.K, 5, 3, generator=g) / 3).to(dtype).requires_grad_()
    w = torch.randn(2, N, 3, generator=g)
    y = sc.convolve(x, basis, theta, route=route)
    assert y.dtype == dtype and y.shape == (2, N, 3)
    (y.float() * w).sum().backward()
    assert x.grad.dtype == dtype and theta.grad.dtype == dtype

    # float32 on the same rounded values: the reference the half computation approximates
    x32 = x.detach().float().requires_grad_()
    t32 = theta.detach().float().requires_grad_()
    y32 = sc.convolve(x32, basis, t32, route=route)
    (y32 * w).sum().backward()
    tol = TOL[dtype]
    for got, ref in ((y, y32), (x.grad, x32.grad), (theta.grad, t32.grad)):
        scale = float(ref.detach().abs().max())
        assert scale > 0
        torch.testing.assert_close(got.float(), ref.detach(), rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("dtype", list(TOL))
def test_a_half_basis_applies_to_half_bundles(dtype):
    # the basis itself cast to half (values rounded): the operator still computes in float32
    basis = BASES["gcn"].to(dtype=dtype)
    assert basis.dtype == dtype
    x = torch.randn(N, 4).to(dtype)
    out = basis.propagate(x.unsqueeze(0))
    assert out.dtype == dtype
    ref = BASES["gcn"].to(dtype=dtype).to(dtype=torch.float32).propagate(x.float().unsqueeze(0))
    torch.testing.assert_close(out.float(), ref, rtol=TOL[dtype], atol=TOL[dtype])
    dense = basis.to_dense()
    assert dense.dtype == dtype
    torch.testing.assert_close(dense.float(), BASES["gcn"].to_dense().float(),
                               rtol=TOL[dtype], atol=TOL[dtype])


def test_the_float32_cache_serves_half_inputs():
    # half inputs use the float32 CSR (no half CSR is ever built: torch could not apply it)
    from structconv.sparse import SparseMatrix

    S = SparseMatrix(torch.tensor([0, 1, 1]), torch.tensor([1, 0, 1]),
                     torch.tensor([1.0, 2.0, 3.0]), (2, 2))
    X = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    for dt in TOL:
        torch.testing.assert_close(S.matmul(X.to(dt)), torch.tensor([[3.0, 4.0], [11.0, 16.0]],
                                                                    dtype=dt))
    assert {k[0] for k in S._csr} == {torch.float32}

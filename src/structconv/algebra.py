"""The tensor algebra of the paper: mixed product, materialisation, inversion, composition."""

from __future__ import annotations

import torch
from torch import Tensor

from .basis.base import Basis, Product, Stack, as_basis

__all__ = ["mixed_product", "materialize", "invert", "compose"]


def mixed_product(a: Tensor, b: Tensor) -> Tensor:
    """(K, *S) ∘ (K, *T) -> (*S, *T): Σ_k a_k ⊗ b_k (eq. "mixed-product")."""
    if a.dim() < 1 or b.dim() < 1 or a.shape[0] != b.shape[0]:
        raise ValueError(
            f"mixed_product needs a (K, *S) and b (K, *T) with the same K: got a {tuple(a.shape)}"
            f" and b {tuple(b.shape)}"
        )
    K = a.shape[0]
    out = a.reshape(K, -1).transpose(0, 1) @ b.reshape(K, -1).to(a.dtype)
    return out.reshape(*a.shape[1:], *b.shape[1:])


def _theta_shape_check(basis: Basis, theta: Tensor, what: str) -> None:
    if not isinstance(theta, Tensor) or theta.dim() != 3:
        got = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
        raise ValueError(f"{what}: theta must be (K, P, Q), got {got}")
    if theta.shape[0] != basis.K:
        raise ValueError(
            f"{what}: basis has K={basis.K} (shape {basis.shape}) but theta has K={theta.shape[0]}"
            f" (shape {tuple(theta.shape)}): dimension K disagrees"
        )


def materialize(basis, theta: Tensor) -> Tensor:
    """The full linear map Φ = A ∘ Θ of a convolution, shape (M, N, P, Q) (eq. "factorisation").

    A basis computed per batch item (an attention basis of B > 1 items, whose dense form is
    (B, K, M, N)) gives one map per item, (B, M, N, P, Q); a ``Stack`` adds its parts' maps
    (each part's own dense form, so batched and shared parts mix).
    """
    basis = as_basis(basis)
    if not isinstance(theta, Tensor):
        theta = theta()
    _theta_shape_check(basis, theta, "materialize")
    if isinstance(basis, Stack):
        o = basis.offsets
        return sum(materialize(b, theta[o[i]:o[i + 1]]) for i, b in enumerate(basis.parts))
    A = basis.to_dense().to(theta.dtype)
    if A.dim() == 4:  # (B, K, M, N): one map per item
        return torch.stack([mixed_product(a, theta) for a in A])
    return mixed_product(A, theta)


def invert(basis, phi: Tensor) -> Tensor:
    """Proposition 1: the theta (K, P, Q) with ``materialize(basis, theta) == phi``.

    Exact when the K matrices span the space of (M, N) matrices; otherwise the least-squares
    theta, i.e. the projection of phi onto the span of the basis.
    """
    basis = as_basis(basis)
    K, M, N = basis.shape
    if phi.dim() != 4 or tuple(phi.shape[:2]) != (M, N):
        raise ValueError(
            f"invert: phi must be (M, N, P, Q) with (M, N)=({M}, {N}) from the basis "
            f"(K, M, N)={basis.shape}, got {tuple(phi.shape)}"
        )
    P, Q = phi.shape[2:]
    dtype = phi.dtype if phi.is_floating_point() else torch.get_default_dtype()
    A = basis.to_dense().to(device=phi.device, dtype=dtype).reshape(K, M * N).transpose(0, 1)
    rhs = phi.to(dtype).reshape(M * N, P * Q)
    # lstsq's gelsd driver handles rank-deficient bases on CPU; the pseudo-inverse elsewhere
    if A.device.type == "cpu":
        sol = torch.linalg.lstsq(A, rhs, driver="gelsd").solution
    else:
        sol = torch.linalg.pinv(A) @ rhs
    return sol.reshape(K, P, Q)


def compose(first, second) -> tuple[Basis, Tensor]:
    """Proposition 2: the (basis, theta) of convolution ``second`` applied after ``first``.

    ``first`` and ``second`` are ``(basis, theta)`` pairs with ``first``'s (N, Q) equal to
    ``second``'s (M, P). The result has K = K'K'' with k = k' * K'' + k''; its basis is a
    ``sc.basis.Product`` (applied as its factors, never multiplied out).
    """
    (b1, t1), (b2, t2) = first, second
    b1, b2 = as_basis(b1), as_basis(b2)
    t1 = t1 if isinstance(t1, Tensor) else t1()
    t2 = t2 if isinstance(t2, Tensor) else t2()
    _theta_shape_check(b1, t1, "compose (first)")
    _theta_shape_check(b2, t2, "compose (second)")
    if b1.N != b2.M:
        raise ValueError(
            f"compose: first's output entries N={b1.N} (basis {b1.shape}) differ from second's "
            f"input entries M={b2.M} (basis {b2.shape})"
        )
    if t1.shape[2] != t2.shape[1]:
        raise ValueError(
            f"compose: first's output channels Q={t1.shape[2]} (theta {tuple(t1.shape)}) differ "
            f"from second's input channels P={t2.shape[1]} (theta {tuple(t2.shape)})"
        )
    theta = torch.einsum("ipq,jqr->ijpr", t1, t2.to(t1.dtype))
    return Product(b1, b2), theta.reshape(b1.K * b2.K, t1.shape[1], t2.shape[2])

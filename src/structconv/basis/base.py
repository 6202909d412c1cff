"""The basis protocol and the generic bases: Dense, Sparse, Stack, Product.

A basis A of shape (K, M, N) is an object that knows how to apply its matrices to a bundle
without being made dense. The engine only ever calls three primitives, all batched, with the
channel dimension last so that the common unbatched case needs no copies:

* ``propagate(x)``        x (B, M, C)    -> (B, N, K, C):  out[:, :, k] = A_kᵀ x
* ``propagate_sum(z)``    z (B, M, K, C) -> (B, N, C):     Σ_k A_kᵀ z[:, :, k]
* ``propagate_heads(z)``  z (B, M, K, C) -> (B, N, K, C):  out[:, :, k] = A_kᵀ z[:, :, k]

Subclasses implement ``propagate_heads`` (or all three when they have better kernels) and report
how many multiply-adds one channel of one batch item costs, for the planner.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from .._checks import check_index_tensor

__all__ = ["Basis", "Dense", "Sparse", "Stack", "Product", "as_basis"]


class Basis:
    """A family of K matrices of shape (M, N) that can apply itself to (B, M, C) bundles."""

    #: relative cost of one multiply-add of this basis against one of a dense GEMM; the planner
    #: multiplies ``apply_flops`` by it (sparse gathers run far below the matmul rate).
    flop_weight: float = 1.0

    def __init__(self, K: int, M: int, N: int):
        for name, v in (("K", K), ("M", M), ("N", N)):
            if int(v) < 1:
                raise ValueError(f"basis size {name} must be >= 1, got {v}")
        self.K, self.M, self.N = int(K), int(M), int(N)

    # -- shape --------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int]:
        """``(K, M, N)``."""
        return (self.K, self.M, self.N)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(K={self.K}, M={self.M}, N={self.N})"

    # -- primitives ---------------------------------------------------------------------------
    def to_dense(self) -> Tensor:
        """The (K, M, N) tensor of this basis (built only on request)."""
        eye = torch.eye(self.M, dtype=self.dtype, device=self.device)
        z = eye.reshape(1, self.M, 1, self.M).expand(1, self.M, self.K, self.M)
        # propagate_heads of the identity bundle gives A_kᵀ I = A_kᵀ, laid out (1, N, K, M)
        out = self.propagate_heads(z)[0]  # (N, K, M)
        return out.permute(1, 2, 0).contiguous()

    def propagate_heads(self, z: Tensor) -> Tensor:
        """(B, M, K, C) -> (B, N, K, C): A_kᵀ applied to slice k."""
        raise NotImplementedError(f"{type(self).__name__} does not implement propagate_heads")

    def propagate(self, x: Tensor) -> Tensor:
        """(B, M, C) -> (B, N, K, C): every A_kᵀ applied to the same bundle."""
        B, M, C = x.shape
        return self.propagate_heads(x.unsqueeze(2).expand(B, M, self.K, C))

    def propagate_sum(self, z: Tensor) -> Tensor:
        """(B, M, K, C) -> (B, N, C): Σ_k A_kᵀ z_k."""
        return self.propagate_heads(z).sum(2)

    # -- costs (multiply-adds per channel per batch item) --------------------------------------
    def apply_flops(self) -> float:
        """Multiply-adds to apply all K matrices to one channel of one batch item."""
        return float(self.K * self.M * self.N)

    def propagate_flops(self, C: int) -> float:
        """Weighted cost of ``propagate`` on C channels (one batch item)."""
        return self.flop_weight * self.apply_flops() * C

    def propagate_sum_flops(self, C: int) -> float:
        """Weighted cost of ``propagate_sum`` on C channels (one batch item)."""
        return self.flop_weight * self.apply_flops() * C

    def native_convolve(self, x: Tensor, theta, route: str | None = None) -> Tensor | None:
        """A fused kernel for the whole convolution (e.g. ``F.conv2d``), or None if there is none.

        ``theta`` is a (K, P, Q) tensor or a ``sc.params`` module; x is (B, M, P).
        """
        return None

    def native_flops(self, B: int, P: int, Q: int, theta=None) -> float | None:
        """Weighted cost of ``native_convolve``, or None when no fused kernel applies."""
        return None

    def routes(self, x: Tensor, theta) -> list:
        """The basis's own whole-convolution routes (``sc.params.Route`` list) for x (B, M, P).

        Like ``native_convolve`` but any number of them, each costed for the planner; a Grid
        offers its tap routes here. None by default.
        """
        return []

    # -- dtype / device -----------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return torch.get_default_dtype()

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def to(self, device=None, dtype=None) -> Basis:
        """This basis on another device / dtype (self when nothing changes)."""
        return self

    def _matching(self, t: Tensor) -> Basis:
        """This basis cast to the dtype and device of ``t`` (cached by subclasses)."""
        if t.dtype == self.dtype and t.device == self.device:
            return self
        return self.to(device=t.device, dtype=t.dtype)


# ------------------------------------------------------------------------------------------------
class Dense(Basis):
    """A basis given as a dense (K, M, N) tensor; differentiable in that tensor."""

    def __init__(self, A: Tensor):
        if not isinstance(A, Tensor) or A.dim() != 3:
            got = tuple(A.shape) if isinstance(A, Tensor) else type(A).__name__
            raise ValueError(f"Dense basis needs a (K, M, N) tensor, got shape {got}")
        super().__init__(*A.shape)
        self.A = A
        self._cache: dict = {}

    def _arranged(self, layout: str, dtype: torch.dtype) -> Tensor:
        """A as the 2-d matrix one GEMM needs: ``tall`` [(n, k), m] or ``wide`` [n, (m, k)].

        A constant basis keeps the contiguous copy (checked against A's version counter), so
        repeated calls do not pay a (K, M, N) transpose each time.
        """
        K, M, N = self.shape
        A = self.A.to(dtype)
        make = (lambda: A.permute(2, 0, 1).reshape(N * K, M)) if layout == "tall" else \
            (lambda: A.permute(2, 1, 0).reshape(N, M * K))
        if self.A.requires_grad:
            return make()
        key = (layout, dtype, self.A._version)
        if key not in self._cache:
            self._cache = {k: v for k, v in self._cache.items() if k[2] == self.A._version}
            self._cache[key] = make().contiguous()
        return self._cache[key]

    @property
    def dtype(self):
        return self.A.dtype

    @property
    def device(self):
        return self.A.device

    def to(self, device=None, dtype=None):
        return Dense(self.A.to(device=device, dtype=dtype))

    def to_dense(self) -> Tensor:
        return self.A

    def propagate(self, x):
        # (B, M, C) x (K, M, N): one GEMM over m with (K*N) rows
        B, M, C = x.shape
        out = self._arranged("tall", x.dtype) @ x
        return out.reshape(B, self.N, self.K, C)

    def propagate_sum(self, z):
        # Σ_k A_kᵀ z_k is one GEMM with the (k, m) pair as the contracted index
        B, M, K, C = z.shape
        return self._arranged("wide", z.dtype) @ z.reshape(B, M * K, C)

    def propagate_heads(self, z):
        return torch.einsum("kmn,bmkc->bnkc", self.A.to(z.dtype), z)


# ------------------------------------------------------------------------------------------------
class _CSRMatmul(torch.autograd.Function):
    """y = S @ X for a constant CSR matrix S, with the CSR of Sᵀ for the backward pass.

    ``St`` may be a callable that builds (and caches) the transpose: it then costs memory only
    once a gradient is actually needed.
    """

    @staticmethod
    def forward(ctx, S, St, X):
        ctx.St = St
        return S @ X

    @staticmethod
    def backward(ctx, gy):
        St = ctx.St() if callable(ctx.St) else ctx.St
        return None, None, St @ gy.contiguous()


def to_csr(rows: Tensor, cols: Tensor, values: Tensor, shape) -> Tensor:
    """A coalesced CSR matrix from COO triplets (duplicates summed)."""
    with warnings.catch_warnings():
        # torch flags CSR as beta; the kernels used here (CSR @ dense) are stable
        warnings.simplefilter("ignore", UserWarning)
        coo = torch.sparse_coo_tensor(torch.stack([rows, cols]), values, tuple(shape),
                                      check_invariants=False)
        return coo.coalesce().to_sparse_csr()


def csr_matmul(S: Tensor, St, X: Tensor) -> Tensor:
    """S @ X with S a constant sparse CSR matrix (St its transpose, or a callable giving it)."""
    if X.requires_grad:
        return _CSRMatmul.apply(S, St, X)
    return S @ X


class Sparse(Basis):
    """A sparse basis from COO ``indices`` (3, nnz) rows [k, m, n], ``values`` (nnz,), ``size``.

    The index/value form is the source of truth (traceable by ``torch.compile``); CSR matrices
    for the SpMM kernels are built lazily, once per layout, dtype and device. Duplicate entries
    are summed. When ``values`` requires grad the basis is differentiable in it (COO autograd path).
    """

    flop_weight = 6.0

    def __init__(self, indices: Tensor, values: Tensor | None, size: Sequence[int]):
        if len(size) != 3:
            raise ValueError(f"Sparse basis size must be (K, M, N), got {tuple(size)}")
        super().__init__(*size)
        check_index_tensor(indices, rows=3, what="Sparse basis indices [k; m; n]")
        nnz = indices.shape[1]
        if values is None:
            values = torch.ones(nnz, dtype=torch.get_default_dtype(), device=indices.device)
        if values.dim() != 1 or values.shape[0] != nnz:
            raise ValueError(
                f"Sparse basis values must be ({nnz},) to match indices (3, {nnz}), "
                f"got {tuple(values.shape)}"
            )
        if nnz:
            lim = torch.tensor(self.shape, device=indices.device).unsqueeze(1)
            bad = ((indices < 0) | (indices >= lim)).any(1)
            if bad.any():
                d = int(bad.nonzero()[0])
                name = "kmn"[d]
                raise ValueError(
                    f"Sparse basis index {name} out of range: values in "
                    f"[{int(indices[d].min())}, {int(indices[d].max())}] but size "
                    f"{name.upper()}={self.shape[d]}"
                )
        self.indices = indices.long()
        self.values = values
        self._cache: dict = {}

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[1])

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def device(self):
        return self.values.device

    def to(self, device=None, dtype=None):
        return Sparse(self.indices.to(device), self.values.to(device=device, dtype=dtype),
                      self.shape)

    def _matching(self, t):
        key = ("cast", t.dtype, t.device)
        if t.dtype == self.dtype and t.device == self.device:
            return self
        if self.values.requires_grad:
            return self.to(t.device, t.dtype)
        if key not in self._cache:
            self._cache[key] = self.to(t.device, t.dtype)
        return self._cache[key]

    def apply_flops(self):
        return float(max(self.nnz, 1))

    def propagate_sum_flops(self, C):
        # the wide layout gathers from a K-times larger operand (M*K rows) than ``propagate``
        # does (M rows): measured 10-60% slower at equal multiply-adds, so it breaks P == Q ties
        return 1.2 * super().propagate_sum_flops(C)

    def to_dense(self):
        K, M, N = self.shape
        out = torch.zeros(K * M * N, dtype=self.dtype, device=self.device)
        k, m, n = self.indices
        return out.index_add(0, (k * M + m) * N + n, self.values).reshape(K, M, N)

    def _csr(self, layout: str, transpose: bool = False) -> Tensor:
        """CSR of a 2-d arrangement of Aᵀ (or of its transpose), built once and cached.

        ``tall``:  rows (n, k), cols m       -> propagate
        ``wide``:  rows n,      cols (m, k)  -> propagate_sum
        ``diag``:  rows (n, k), cols (m, k)  -> propagate_heads

        The transpose serves only backward passes, so it is built on a gradient's first need.
        """
        key = (layout, transpose)
        if key not in self._cache:
            r, c, shp = self._layout(layout)
            if transpose:
                r, c, shp = c, r, shp[::-1]
            self._cache[key] = to_csr(r, c, self.values.detach(), shp)
        return self._cache[key]

    def _layout(self, layout: str) -> tuple[Tensor, Tensor, tuple[int, int]]:
        """Row and column indices and the 2-d shape of one arrangement (see ``_csr``)."""
        K, M, N = self.shape
        k, m, n = self.indices
        if layout == "tall":
            return n * K + k, m, (N * K, M)
        if layout == "wide":
            return n, m * K + k, (N, M * K)
        return n * K + k, m * K + k, (N * K, M * K)

    def _mm(self, layout: str, X: Tensor) -> Tensor:
        if self.values.requires_grad:
            # differentiable in the values: COO sparse @ dense has autograd for both operands
            r, c, shp = self._layout(layout)
            S = torch.sparse_coo_tensor(torch.stack([r, c]), self.values, shp,
                                        check_invariants=False)
            return torch.sparse.mm(S, X)
        return csr_matmul(self._csr(layout), lambda: self._csr(layout, transpose=True), X)

    @staticmethod
    def _to_cols(t: Tensor, lead: int) -> tuple[Tensor, int]:
        """(B, lead..., C) -> (lead..., B*C) as a 2-d matrix; a free view when B == 1."""
        B = t.shape[0]
        if B == 1:
            return t.reshape(-1, t.shape[-1]), 1
        return t.movedim(0, -2).reshape(lead, -1), B

    def propagate(self, x):
        B, M, C = x.shape
        X, _ = self._to_cols(x, M)
        out = self._mm("tall", X)  # (N*K, B*C)
        if B == 1:
            return out.reshape(1, self.N, self.K, C)
        return out.reshape(self.N, self.K, B, C).permute(2, 0, 1, 3)

    def propagate_sum(self, z):
        B, M, K, C = z.shape
        Z, _ = self._to_cols(z, M * K)
        out = self._mm("wide", Z)  # (N, B*C)
        if B == 1:
            return out.reshape(1, self.N, C)
        return out.reshape(self.N, B, C).transpose(0, 1)

    def propagate_heads(self, z):
        B, M, K, C = z.shape
        Z, _ = self._to_cols(z, M * K)
        out = self._mm("diag", Z)  # (N*K, B*C)
        if B == 1:
            return out.reshape(1, self.N, self.K, C)
        return out.reshape(self.N, self.K, B, C).permute(2, 0, 1, 3)


# ------------------------------------------------------------------------------------------------
class Stack(Basis):
    """Concatenation of bases along k (same M and N); each part keeps its own fast path."""

    def __init__(self, bases: Sequence[Basis | Tensor]):
        parts = [as_basis(b) for b in bases]
        if not parts:
            raise ValueError("Stack needs at least one basis")
        M, N = parts[0].M, parts[0].N
        for i, b in enumerate(parts):
            if (b.M, b.N) != (M, N):
                raise ValueError(
                    f"Stack parts must share (M, N): part 0 has (M, N)=({M}, {N}) but part {i} "
                    f"{type(b).__name__} has (M, N)=({b.M}, {b.N})"
                )
        super().__init__(sum(b.K for b in parts), M, N)
        self.parts = parts
        self.offsets = [0]
        for b in parts:
            self.offsets.append(self.offsets[-1] + b.K)

    def __repr__(self):
        return f"Stack([{', '.join(repr(b) for b in self.parts)}])"

    @property
    def dtype(self):
        return self.parts[0].dtype

    @property
    def device(self):
        return self.parts[0].device

    def to(self, device=None, dtype=None):
        return Stack([b.to(device, dtype) for b in self.parts])

    def _matching(self, t):
        return Stack([b._matching(t) for b in self.parts]) if any(
            b._matching(t) is not b for b in self.parts) else self

    def apply_flops(self):
        return sum(b.apply_flops() for b in self.parts)

    def propagate_flops(self, C):
        return sum(b.propagate_flops(C) for b in self.parts)

    def propagate_sum_flops(self, C):
        return sum(b.propagate_sum_flops(C) for b in self.parts)

    def to_dense(self):
        return torch.cat([b.to_dense() for b in self.parts], 0)

    def _slices(self):
        return [slice(self.offsets[i], self.offsets[i + 1]) for i in range(len(self.parts))]

    def propagate(self, x):
        return torch.cat([b.propagate(x) for b in self.parts], 2)

    def propagate_sum(self, z):
        outs = [b.propagate_sum(z[:, :, s]) for b, s in zip(self.parts, self._slices())]
        return torch.stack(outs, 0).sum(0) if len(outs) > 1 else outs[0]

    def propagate_heads(self, z):
        return torch.cat([b.propagate_heads(z[:, :, s])
                          for b, s in zip(self.parts, self._slices())], 2)


# ------------------------------------------------------------------------------------------------
class Product(Basis):
    """The basis of a composition (Proposition 2): A[k'*K'' + k''] = A'[k'] @ A''[k''].

    Applied as its two factors (A''ᵀ A'ᵀ x), never multiplied out.
    """

    def __init__(self, first: Basis | Tensor, second: Basis | Tensor):
        a, b = as_basis(first), as_basis(second)
        if a.N != b.M:
            raise ValueError(
                f"Product(first, second) needs first.N == second.M: first is (K, M, N)="
                f"{a.shape}, second is (K, M, N)={b.shape}"
            )
        super().__init__(a.K * b.K, a.M, b.N)
        self.first, self.second = a, b

    def __repr__(self):
        return f"Product({self.first!r}, {self.second!r})"

    @property
    def dtype(self):
        return self.first.dtype

    @property
    def device(self):
        return self.first.device

    def to(self, device=None, dtype=None):
        return Product(self.first.to(device, dtype), self.second.to(device, dtype))

    def _matching(self, t):
        a, b = self.first._matching(t), self.second._matching(t)
        return self if (a is self.first and b is self.second) else Product(a, b)

    def apply_flops(self):
        return self.first.apply_flops() + self.first.K * self.second.apply_flops()

    def propagate_flops(self, C):
        # A' on C channels, then A'' on K'*C channels
        return self.first.propagate_flops(C) + self.second.propagate_flops(self.first.K * C)

    def propagate_sum_flops(self, C):
        # A' on K''*C channels (summing k'), then A'' summing k''
        return self.first.propagate_sum_flops(self.second.K * C) + \
            self.second.propagate_sum_flops(C)

    def to_dense(self):
        a, b = self.first.to_dense(), self.second.to_dense()
        return torch.einsum("imj,kjn->ikmn", a, b).reshape(self.K, self.M, self.N)

    def propagate(self, x):
        B, _, C = x.shape
        K1, K2 = self.first.K, self.second.K
        u = self.first.propagate(x)  # (B, N', K', C)
        v = self.second.propagate(u.reshape(B, self.first.N, K1 * C))  # (B, N, K'', K'*C)
        return v.reshape(B, self.N, K2, K1, C).transpose(2, 3).reshape(B, self.N, K1 * K2, C)

    def propagate_sum(self, z):
        B, M, K, C = z.shape
        K1, K2 = self.first.K, self.second.K
        u = self.first.propagate_sum(z.reshape(B, M, K1, K2 * C))  # (B, N', K''*C)
        return self.second.propagate_sum(u.reshape(B, self.first.N, K2, C))

    def propagate_heads(self, z):
        B, M, K, C = z.shape
        K1, K2 = self.first.K, self.second.K
        u = self.first.propagate_heads(
            z.reshape(B, M, K1, K2 * C))  # (B, N', K', K''*C)
        u = u.reshape(B, self.first.N, K1, K2, C).transpose(2, 3)  # (B, N', K'', K', C)
        v = self.second.propagate_heads(u.reshape(B, self.first.N, K2, K1 * C))
        return v.reshape(B, self.N, K2, K1, C).transpose(2, 3).reshape(B, self.N, K, C)


def as_basis(A) -> Basis:
    """A ``Basis`` from a basis or a dense (K, M, N) tensor."""
    if isinstance(A, Basis):
        return A
    if isinstance(A, Tensor):
        if A.is_sparse:
            A = A.coalesce()
            return Sparse(A.indices(), A.values(), tuple(A.shape))
        return Dense(A)
    raise TypeError(f"expected a sc.basis.Basis or a (K, M, N) tensor, got {type(A).__name__}")


def density(basis: Basis) -> float:
    """Fraction of nonzero entries (an estimate for implicit bases)."""
    return min(1.0, basis.apply_flops() / max(1, basis.K * basis.M * basis.N))


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

import copy
from collections.abc import Sequence

import torch
from torch import Tensor

from .. import costs
from .._checks import check_index_tensor
from ..sparse import SparseMatrix, build_csr, csr_matmul  # noqa: F401  (re-exported)

#: the former names of the sparse helpers, now in ``structconv.sparse``
to_csr = build_csr

__all__ = ["Basis", "Dense", "Sparse", "Stack", "Product", "as_basis"]


class Basis:
    """A family of K matrices of shape (M, N) that can apply itself to (B, M, C) bundles.

    A subclass that calls ``super().__init__(K, M, N)`` and implements ``propagate_heads`` is
    complete. Every other hook below has a working default that a subclass may override for
    speed: ``propagate``, ``propagate_sum``, ``to_dense``, ``channelwise_sum``, the costs
    (``apply_flops``, ``propagate_flops``, ``propagate_sum_flops``, ``channelwise_flops``) and
    ``routes`` (the basis's own whole-convolution kernels). The base class finds the tensors a
    basis holds (attributes, directly or in lists, tuples, dicts, nested bases, or helper
    objects with an ``_apply(fn)`` method), and derives ``dtype``, ``device``, ``to`` and
    ``cast_like`` from them, as ``nn.Module._apply`` does for parameters.
    """

    #: the cost-table row (``sc.costs``) of one multiply-add of this basis's primitives
    cost_kernel: str = "dense"
    #: attributes holding caches derived from the tensors: dropped by ``to`` (rebuilt lazily)
    _transient: tuple[str, ...] = ()
    #: the grid shape of the N output entries, where the basis has one (a Grid's, a pooling's);
    #: model configs follow it from layer to layer
    out_shape: tuple[int, ...] | None = None

    def __init__(self, K: int, M: int, N: int):
        for name, v in (("K", K), ("M", M), ("N", N)):
            if isinstance(v, bool) or int(v) != v or int(v) < 1:
                raise ValueError(f"basis size {name} must be an int >= 1, got {v!r}")
        self.K, self.M, self.N = int(K), int(M), int(N)

    @property
    def memo(self) -> dict:
        """Derived state: casts, plans, the held-tensor summary (see ``clear_cache``).

        Threads may share a basis: the memo is created by one atomic ``setdefault`` (two
        threads never get two memos), and whoever walks a dict that another thread may grow
        walks a snapshot (``dict.copy`` is atomic under the GIL). No lock: ``torch.compile``
        traces these paths, and a lock would break its graph.
        """
        d = self.__dict__.get("_cache")
        if d is None:
            if torch.compiler.is_compiling():
                # traced code keeps no state on the basis (the planner does not cache under
                # tracing either); and Dynamo before torch 2.13 cannot trace
                # ``__dict__.setdefault`` (seen with 2.11: a fullgraph compile of GCNConv
                # failed on it)
                return {}
            d = self.__dict__.setdefault("_cache", {})
        return d

    def clear_cache(self) -> None:
        """Forget derived state (casts, plans). A basis is treated as fixed once built; call
        this after replacing one of its attributes. Its tensors' values may change in place
        freely: plans depend only on shapes, dtypes and devices, a cached cast is rebuilt when
        a held tensor's version counter moves, and casts of tensors that require grad are
        never cached."""
        self.__dict__.pop("_cache", None)

    # -- shape --------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int]:
        """``(K, M, N)``."""
        return (self.K, self.M, self.N)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(K={self.K}, M={self.M}, N={self.N})"

    # -- primitives ---------------------------------------------------------------------------
    def propagate_heads(self, z: Tensor) -> Tensor:
        """(B, M, K, C) -> (B, N, K, C): ``out[:, :, k] = A_kᵀ z[:, :, k]`` (the required hook)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement propagate_heads")

    def propagate(self, x: Tensor) -> Tensor:
        """(B, M, C) -> (B, N, K, C): every A_kᵀ applied to the same bundle."""
        B, M, C = x.shape
        return self.propagate_heads(x.unsqueeze(2).expand(B, M, self.K, C))

    def propagate_sum(self, z: Tensor) -> Tensor:
        """(B, M, K, C) -> (B, N, C): Σ_k A_kᵀ z_k."""
        return self.propagate_heads(z).sum(2)

    def propagate_sum_bias(self, z: Tensor, bias: Tensor) -> Tensor:
        """(B, M, K, C), bias (C,) -> (B, N, C): Σ_k A_kᵀ z_k + bias. The default adds the bias
        after ``propagate_sum``; a basis whose last step is a sparse product adds it there."""
        return self.propagate_sum(z) + bias

    def channelwise_sum(self, x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
        """(B, M, C), w (K, C) -> (B, N, C): Σ_k A_kᵀ (x · w_k), a depthwise convolution.

        The default builds the (B, M, K, C) product; a basis with a fused tap-by-tap kernel
        (a Grid) never does.
        """
        y = self.propagate_sum(x.unsqueeze(2) * w.to(x.dtype))
        return y if bias is None else y + bias.to(y.dtype)

    def to_dense(self) -> Tensor:
        """The (K, M, N) tensor of this basis (built only on request)."""
        eye = torch.eye(self.M, dtype=self.dtype, device=self.device)
        z = eye.reshape(1, self.M, 1, self.M).expand(1, self.M, self.K, self.M)
        # propagate_heads of the identity bundle gives A_kᵀ I = A_kᵀ, laid out (1, N, K, M)
        out = self.propagate_heads(z)[0]  # (N, K, M)
        return out.permute(1, 2, 0).contiguous()

    # -- costs (weighted multiply-adds; see sc.costs) ------------------------------------------
    @property
    def flop_weight(self) -> float:
        """Relative cost of one multiply-add of this basis against one of a dense GEMM."""
        return costs.weight(self.cost_kernel, self.device.type)

    def cost_weight(self, kernel: str) -> float:
        """A cost-table weight for this basis's device (``sc.costs.weight``)."""
        return costs.weight(kernel, self.device.type)

    def apply_flops(self) -> float:
        """Multiply-adds to apply all K matrices to one channel of one batch item."""
        return float(self.K * self.M * self.N)

    def propagate_flops(self, C: int) -> float:
        """Weighted cost of ``propagate`` on C channels (one batch item)."""
        return self.flop_weight * self.apply_flops() * C

    def propagate_sum_flops(self, C: int) -> float:
        """Weighted cost of ``propagate_sum`` on C channels (one batch item)."""
        return self.flop_weight * self.apply_flops() * C

    def channelwise_flops(self, C: int, B: int = 1) -> float:
        """Weighted cost of ``channelwise_sum`` on B items of C channels (temporary included)."""
        return B * ((1.0 + self.cost_weight("element")) * self.M * self.K * C
                    + self.propagate_sum_flops(C))

    def routes(self, x: Tensor, theta) -> list:
        """The basis's own whole-convolution kernels, as costed ``sc.costs.Route``s.

        ``x`` (B, M, P) (its strides may matter: a grid's image layout), ``theta`` the adapted
        parameter form (``.K, .P, .Q``, ``theta()`` the (K, P, Q) tensor). E.g. a Grid offers
        ``F.convNd`` (``native``) and its tap routes. None by default.
        """
        return []

    # -- tensors held, dtype / device ----------------------------------------------------------
    def _apply(self, fn) -> Basis:
        """A shallow copy with ``fn`` applied to every tensor held (caches dropped)."""
        new = copy.copy(self)  # (copies self.__dict__ in one step: a consistent snapshot)
        d = new.__dict__
        d.pop("_cache", None)
        for name, v in list(d.items()):
            if name in self._transient:  # derived caches start empty in the copy
                d[name] = {} if isinstance(v, dict) else None
            else:
                d[name] = _map_tensors(v, fn)
        return new

    def _held(self) -> tuple[torch.dtype | None, torch.device | None]:
        """(promoted floating dtype, device) of the tensors held; None where there is none."""
        memo = self.memo
        if "held" not in memo:
            found: list[Tensor] = []
            # a snapshot: other threads add caches (``_cache``, transient ones) meanwhile
            for name, v in self.__dict__.copy().items():
                if name != "_cache" and name not in self._transient:
                    _collect(v, found)
            fl = [t.dtype for t in found if t.is_floating_point() or t.is_complex()]
            dt = fl[0] if fl else None
            for other in fl[1:]:
                dt = torch.promote_types(dt, other)
            memo["held"] = (dt, found[0].device if found else None,
                            any(t.requires_grad for t in found), found)
        return memo["held"][:2]

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of the tensors held (the default dtype where there are none)."""
        dt = self._held()[0]
        return dt if dt is not None else (self.__dict__.get("_to_dtype")
                                          or torch.get_default_dtype())

    @property
    def device(self) -> torch.device:
        """The device of the tensors held (cpu where there are none)."""
        dev = self._held()[1]
        return dev if dev is not None else (self.__dict__.get("_to_device")
                                            or torch.device("cpu"))

    def to(self, device=None, dtype=None) -> Basis:
        """This basis on another device / dtype: floating tensors take ``dtype``, integer
        tensors keep theirs (self when nothing changes)."""
        device = torch.device(device) if device is not None else None
        if (device is None or device == self.device) and (dtype is None or dtype == self.dtype):
            return self

        def move(t: Tensor) -> Tensor:
            floating = t.is_floating_point() or t.is_complex()
            return t.to(device=device, dtype=dtype if floating and dtype is not None else None)

        new = self._apply(move)
        if dtype is not None:
            new._to_dtype = dtype
        if device is not None:
            new._to_device = device
        return new

    def cast_like(self, t: Tensor) -> Basis:
        """This basis with t's dtype and device, for applying it to t (casts are cached unless
        the basis holds tensors that require grad, whose casts must stay in the graph)."""
        dt, dev = self._held()
        if (dt is None or dt == t.dtype) and (dev is None or dev == t.device):
            return self
        memo = self.memo
        if memo["held"][2] or torch.compiler.is_compiling():
            return self.to(device=t.device, dtype=t.dtype)
        # the cast copies values: an in-place edit of a held tensor (its version) renews it
        versions = tuple(h._version for h in memo["held"][3])
        key = ("cast", t.dtype, t.device)
        hit = memo.get(key)
        if hit is None or hit[0] != versions:
            hit = memo[key] = (versions, self.to(device=t.device, dtype=t.dtype))
        return hit[1]

    def _cast_parts(self, t: Tensor, parts: list, rebuild) -> Basis:
        """A composite's cast: each part casts itself (a part that casts inside its kernels
        stays as it is); the composite is rebuilt, once per set of cast parts."""
        cast = [b.cast_like(t) for b in parts]
        if all(a is b for a, b in zip(cast, parts)):
            return self
        key = ("cast", t.dtype, t.device)
        memo = self.memo
        hit = memo.get(key)
        if hit is None or any(a is not b for a, b in zip(cast, hit[0])):
            hit = memo[key] = (cast, rebuild(cast))
        return hit[1]


def _map_tensors(v, fn):
    """``v`` with ``fn`` applied to every tensor inside (containers and bases rebuilt)."""
    if isinstance(v, Tensor):
        return fn(v)
    if isinstance(v, Basis):
        return v._apply(fn)
    if isinstance(v, list):
        return [_map_tensors(u, fn) for u in v]
    if isinstance(v, tuple):
        items = [_map_tensors(u, fn) for u in v]
        return type(v)(*items) if hasattr(v, "_fields") else tuple(items)
    if isinstance(v, dict):
        return type(v)((k, _map_tensors(u, fn)) for k, u in v.items())
    if not isinstance(v, type) and callable(getattr(v, "_apply", None)):
        return v._apply(fn)
    return v


def _collect(v, out: list) -> None:
    """Append every tensor inside ``v`` (as ``_map_tensors`` would visit them) to ``out``."""
    if isinstance(v, Tensor):
        out.append(v)
    elif isinstance(v, Basis):
        for name, u in v.__dict__.copy().items():  # (a snapshot, as in ``_held``)
            if name != "_cache" and name not in v._transient:
                _collect(u, out)
    elif isinstance(v, (list, tuple)):
        for u in v:
            _collect(u, out)
    elif isinstance(v, dict):
        for u in v.copy().values():
            _collect(u, out)
    elif not isinstance(v, type) and callable(getattr(v, "_apply", None)):
        v._apply(lambda t: (out.append(t), t)[1])


# ------------------------------------------------------------------------------------------------
class Dense(Basis):
    """A basis given as a dense (K, M, N) tensor; differentiable in that tensor."""

    def __init__(self, A: Tensor):
        if not isinstance(A, Tensor) or A.dim() != 3:
            got = tuple(A.shape) if isinstance(A, Tensor) else type(A).__name__
            raise ValueError(f"Dense basis needs a (K, M, N) tensor, got shape {got}")
        super().__init__(*A.shape)
        self.A = A
        self._arranged_cache: dict = {}

    _transient = ("_arranged_cache",)

    def _arranged(self, layout: str, dtype: torch.dtype) -> Tensor:
        """A as the 2-d matrix one GEMM needs: ``tall`` [(n, k), m] or ``wide`` [n, (m, k)].

        A constant basis keeps the contiguous copy (checked against A's version counter), so
        repeated calls do not pay a (K, M, N) transpose each time.
        """
        K, M, N = self.shape
        A = self.A.to(dtype)
        make = (lambda: A.permute(2, 0, 1).reshape(N * K, M)) if layout == "tall" else \
            (lambda: A.permute(2, 1, 0).reshape(N, M * K))
        if self.A.requires_grad or torch.compiler.is_compiling():
            # (while tracing, the version counter is no constant: the compiler folds the copy)
            return make()
        key = (layout, dtype, self.A._version)
        cache = self.__dict__.get("_arranged_cache")
        if cache is None:  # dropped by ``to``
            cache = self.__dict__.setdefault("_arranged_cache", {})
        hit = cache.get(key)
        if hit is None:
            # another thread may add or drop entries meanwhile: walk a snapshot, pop softly
            for k in [k for k in cache.copy() if k[2] != self.A._version]:
                cache.pop(k, None)
            hit = cache[key] = make().contiguous()
        return hit

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
class Sparse(Basis):
    """A sparse basis from COO ``indices`` (3, nnz) rows [k, m, n], ``values`` (nnz,), ``size``.

    The index/value form is the source of truth (traceable by ``torch.compile``); CSR matrices
    for the SpMM kernels are built lazily, once per layout, dtype and device. Duplicate entries
    are summed. When ``values`` requires grad the basis is differentiable in it (COO autograd path).
    """

    cost_kernel = "sparse"

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
        # (value checks need concrete data: not while compiling, nor on the meta device)
        if nnz and not torch.compiler.is_compiling() and indices.device.type != "meta":
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

    def apply_flops(self):
        return float(max(self.nnz, 1))

    def propagate_sum_flops(self, C):
        # the wide layout gathers from a K-times larger operand (M*K rows) than ``propagate``
        # does (M rows): measured 10-60% slower at equal multiply-adds, so it breaks P == Q ties
        return self.cost_weight("sparse_wide") * super().propagate_sum_flops(C)

    def to_dense(self):
        K, M, N = self.shape
        out = torch.zeros(K * M * N, dtype=self.dtype, device=self.device)
        k, m, n = self.indices
        return out.index_add(0, (k * M + m) * N + n, self.values).reshape(K, M, N)

    def _layout(self, layout: str) -> SparseMatrix:
        """One 2-d arrangement of Aᵀ as a sparse matrix:

        ``tall``:  rows (n, k), cols m       -> propagate
        ``wide``:  rows n,      cols (m, k)  -> propagate_sum
        ``diag``:  rows (n, k), cols (m, k)  -> propagate_heads
        """
        K, M, N = self.shape
        k, m, n = self.indices
        if layout == "tall":
            r, c, shp = n * K + k, m, (N * K, M)
        elif layout == "wide":
            r, c, shp = n, m * K + k, (N, M * K)
        else:
            r, c, shp = n * K + k, m * K + k, (N * K, M * K)
        return SparseMatrix(r, c, self.values, shp)

    def _mm(self, layout: str, X: Tensor) -> Tensor:
        if torch.compiler.is_compiling():  # no cache while tracing: the compiler folds it
            return self._layout(layout).matmul(X)
        memo = self.memo
        key = ("layout", layout)
        if key not in memo:  # built once per layout; its CSRs per dtype and device inside
            memo[key] = self._layout(layout)
        return memo[key].matmul(X)

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
    def out_shape(self):
        shapes = {b.out_shape for b in self.parts}
        return shapes.pop() if len(shapes) == 1 else None

    def cast_like(self, t):
        return self._cast_parts(t, self.parts, Stack)

    def apply_flops(self):
        return sum(b.apply_flops() for b in self.parts)

    def propagate_flops(self, C):
        return sum(b.propagate_flops(C) for b in self.parts)

    def propagate_sum_flops(self, C):
        return sum(b.propagate_sum_flops(C) for b in self.parts)

    def to_dense(self):
        dense = [b.to_dense() for b in self.parts]
        if all(d.dim() == 3 for d in dense):
            return torch.cat(dense, 0)
        # parts computed per batch item (attention: (B, K_i, M, N)) beside shared ones
        B = max(d.shape[0] for d in dense if d.dim() == 4)
        return torch.cat([d if d.dim() == 4 else d.expand(B, *d.shape) for d in dense], 1)

    def slices(self) -> list[slice]:
        """The k-range of each part in the stacked K."""
        return [slice(self.offsets[i], self.offsets[i + 1]) for i in range(len(self.parts))]

    def propagate(self, x):
        return torch.cat([b.propagate(x) for b in self.parts], 2)

    def propagate_sum(self, z):
        outs = [b.propagate_sum(z[:, :, s]) for b, s in zip(self.parts, self.slices())]
        return torch.stack(outs, 0).sum(0) if len(outs) > 1 else outs[0]

    def propagate_heads(self, z):
        return torch.cat([b.propagate_heads(z[:, :, s])
                          for b, s in zip(self.parts, self.slices())], 2)


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

    def cast_like(self, t):
        return self._cast_parts(t, [self.first, self.second], lambda ab: Product(*ab))

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
        # factors may differ in dtype (a tensor-free Grid beside a float64 Dense): promote
        dt = torch.promote_types(a.dtype, b.dtype)
        return torch.einsum("imj,kjn->ikmn", a.to(dt), b.to(dt)).reshape(self.K, self.M, self.N)

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


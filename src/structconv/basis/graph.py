"""Graph and relational bases built from an edge_index (GCN, Chebyshev, diffusion, sorts).

An edge ``m -> n`` (PyG's ``[source; target]``) lands at ``A[k, m, n]``, so ``A_kᵀ x`` aggregates
at targets as PyG's ``source_to_target`` message passing does. Every normalisation is computed as
PyG computes it (``gcn_norm``: degree on targets; ``get_laplacian``: degree on sources).

The bases stay sparse: one normalised operator ``S`` is kept as a CSR matrix and polynomial bases
are applied by recurrence (``S^k x = S S^{k-1} x``, Chebyshev ``T_k = 2 L̂ T_{k-1} - T_{k-2}``), and
their adjoint sums ``Σ_k A_kᵀ z_k`` by Horner / Clenshaw, so that every primitive costs as many
SpMMs as the highest power. No matrix power is ever formed.

Structure caching (``cache=True`` in the constructors): the built basis is kept in a small LRU
keyed on the *identity* of the ``edge_index`` / ``edge_weight`` / ``edge_type`` tensors (``id``
checked against a weak reference, so a freed tensor whose id is reused never matches), their
``_version`` counters (an in-place edit invalidates), shapes, dtypes, devices, data pointers and
every option. Keying on identity costs O(1) per call, where a content hash would read every edge.
"""

from __future__ import annotations

import numbers
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .._checks import check_index_tensor
from ..sparse import SparseMatrix
from .base import Basis, Sparse
from .sorts import parse_sorts, sort_name  # noqa: F401  (sort_name re-exported)

__all__ = [
    "gcn", "chebyshev", "diffusion", "sgc", "relational",
    "SparseOperator", "PowerBasis", "ChebyshevBasis", "RelationalBasis",
    "clear_graph_cache", "graph_cache_info",
]

_INF = float("inf")


# ------------------------------------------------------------------------------------------------
# validation
def _check_num_nodes(num_nodes, what: str = "num_nodes") -> int:
    # any integer: a Python int, a NumPy integer, a 0-d integer tensor (never a bool)
    if isinstance(num_nodes, Tensor) and num_nodes.dim() == 0 and \
            not num_nodes.is_floating_point() and num_nodes.dtype != torch.bool:
        num_nodes = int(num_nodes)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, numbers.Integral) or \
            num_nodes < 1:
        raise ValueError(f"{what} must be a positive int, got {num_nodes!r}")
    return int(num_nodes)


def _check_edges(edge_index: Tensor, num_src: int, num_dst: int | None = None,
                 edge_weight: Tensor | None = None) -> None:
    """Raise unless edge_index is (2, E) integer with sources < num_src and targets < num_dst."""
    check_index_tensor(edge_index, rows=2, what="edge_index [source; target]")
    num_dst = num_src if num_dst is None else num_dst
    E = edge_index.shape[1]
    # value checks need concrete data: while torch.compile traces, shapes are checked only
    if E and not torch.compiler.is_compiling():
        for row, name, lim in ((0, "source", num_src), (1, "target", num_dst)):
            lo, hi = int(edge_index[row].min()), int(edge_index[row].max())
            if lo < 0 or hi >= lim:
                raise ValueError(
                    f"edge_index {name} ids must lie in [0, {lim - 1}] for {lim} nodes, got "
                    f"values in [{lo}, {hi}]"
                )
    if edge_weight is not None:
        if not isinstance(edge_weight, Tensor):
            raise TypeError(f"edge_weight must be a tensor, got {type(edge_weight).__name__}")
        if edge_weight.dim() != 1 or edge_weight.shape[0] != E:
            raise ValueError(
                f"edge_weight must be ({E},) to match edge_index (2, {E}), got "
                f"{tuple(edge_weight.shape)}"
            )
        if not edge_weight.is_floating_point():
            raise TypeError(f"edge_weight must be a floating tensor, got {edge_weight.dtype}")


def _check_K(K, what: str = "K", low: int = 1) -> int:
    if isinstance(K, bool) or not isinstance(K, int) or K < low:
        raise ValueError(f"{what} must be an int >= {low}, got {K!r}")
    return K


def _value_dtype(edge_weight: Tensor | None, dtype) -> torch.dtype:
    # as PyG: an explicit edge_weight keeps its dtype, otherwise ones of ``dtype``
    if edge_weight is not None:
        return edge_weight.dtype
    return dtype if dtype is not None else torch.get_default_dtype()


# ------------------------------------------------------------------------------------------------
# normalisations, computed in the same order as PyG's so float64 results agree to rounding
def _remaining_self_loops(src, dst, w, n: int, fill: float, dtype):
    """PyG's add_remaining_self_loops: one loop per node; an existing loop keeps its weight."""
    if torch.compiler.is_compiling():
        return _remaining_self_loops_static(src, dst, w, n, fill, dtype)
    mask = src != dst
    loop = torch.arange(n, device=src.device)
    if w is not None:
        loop_w = w.new_full((n,), fill)
        inv = ~mask
        loop_w[src[inv]] = w[inv]
        w = torch.cat([w[mask], loop_w])
    return torch.cat([src[mask], loop]), torch.cat([dst[mask], loop]), w


def _remaining_self_loops_static(src, dst, w, n: int, fill: float, dtype):
    """The same operator with static shapes (for torch.compile, which cannot trace a boolean
    selection): existing loops stay as zero-weight entries, and one loop per node follows with
    the existing loop's weight or ``fill``. Zero entries change no sum, so the basis is equal."""
    loop = torch.arange(n, device=src.device)
    is_loop = src == dst
    w_in = torch.ones(src.shape[0], dtype=dtype, device=src.device) if w is None else w
    has = torch.zeros(n, dtype=w_in.dtype, device=src.device).index_add(0, src, is_loop.to(
        w_in.dtype))
    old = torch.zeros(n, dtype=w_in.dtype, device=src.device).index_add(
        0, src, torch.where(is_loop, w_in, torch.zeros_like(w_in)))
    loop_w = torch.where(has > 0, old, torch.full_like(old, fill))
    if w is None:
        # PyG's loops without given weights are ones; the zeroed originals keep the graph's
        w_out = torch.cat([(~is_loop).to(w_in.dtype), torch.ones_like(loop_w)])
    else:
        w_out = torch.cat([torch.where(is_loop, torch.zeros_like(w), w), loop_w])
    return torch.cat([src, loop]), torch.cat([dst, loop]), w_out


def _inv_sqrt(deg: Tensor) -> Tensor:
    d = deg.pow(-0.5)
    return d.masked_fill(d == _INF, 0.0)


def _gcn_values(src, dst, w, n, *, add_self_loops, normalize, improved, dtype):
    if add_self_loops:
        src, dst, w = _remaining_self_loops(src, dst, w, n, 2.0 if improved else 1.0, dtype)
    if w is None:
        w = torch.ones(src.shape[0], dtype=dtype, device=src.device)
    if normalize:
        deg = torch.zeros(n, dtype=w.dtype, device=w.device).index_add(0, dst, w)
        dis = _inv_sqrt(deg)
        w = dis[src] * w * dis[dst]
    return src, dst, w


def _laplacian_values(src, dst, w, n, *, normalization, lambda_max, batch, dtype):
    """PyG ChebConv's scaled Laplacian 2 L / lambda_max - I (self loops of the input dropped)."""
    mask = src != dst
    if torch.compiler.is_compiling():
        # static shapes: the input's loops stay as zero-weight entries (no sum changes)
        w = torch.ones(src.shape[0], dtype=dtype, device=src.device) if w is None else w
        w = w * mask.to(w.dtype)
    else:
        src, dst = src[mask], dst[mask]
        w = torch.ones(src.shape[0], dtype=dtype, device=src.device) if w is None else w[mask]
    deg = torch.zeros(n, dtype=w.dtype, device=w.device).index_add(0, src, w)
    if normalization is None:
        off, diag = -w, deg
    elif normalization == "sym":
        dis = _inv_sqrt(deg)
        off, diag = -(dis[src] * w * dis[dst]), torch.ones(n, dtype=w.dtype, device=w.device)
    else:  # "rw"
        dinv = 1.0 / deg
        dinv = dinv.masked_fill(dinv == _INF, 0.0)
        off, diag = -(dinv[src] * w), torch.ones(n, dtype=w.dtype, device=w.device)
    loop = torch.arange(n, device=src.device)
    src, dst, v = torch.cat([src, loop]), torch.cat([dst, loop]), torch.cat([off, diag])
    if lambda_max is None:
        lam = 2.0 * v.max()
    elif isinstance(lambda_max, Tensor):
        lam = lambda_max.to(v.device)
    else:
        lam = torch.tensor(float(lambda_max), dtype=v.dtype, device=v.device)
    if batch is not None and lam.numel() > 1:
        lam = lam[batch[src]]
    elif lam.numel() > 1:
        raise ValueError(
            f"lambda_max has {lam.numel()} entries (one per graph) but no batch vector was given"
        )
    else:
        lam = lam.reshape(())
    v = (2.0 * v) / lam
    v = v.masked_fill(v == _INF, 0.0)
    v = torch.cat([v[:-n], v[-n:] - 1])
    return src, dst, v


def _rw_values(src, dst, w, n, *, dtype):
    if w is None:
        w = torch.ones(src.shape[0], dtype=dtype, device=src.device)
    deg = torch.zeros(n, dtype=w.dtype, device=w.device).index_add(0, src, w)
    dinv = 1.0 / deg
    dinv = dinv.masked_fill(dinv == _INF, 0.0)
    return src, dst, dinv[src] * w


# ------------------------------------------------------------------------------------------------
def _cols(x: Tensor) -> Tensor:
    """(B, M, C) -> (M, B*C), a free view when B == 1 (squeeze, whose backward is free too)."""
    B, M, C = x.shape
    return x.squeeze(0) if B == 1 else x.permute(1, 0, 2).reshape(M, B * C)


def _uncols(Y: Tensor, B: int) -> Tensor:
    """(N, B*C) -> (B, N, C)."""
    N = Y.shape[0]
    return Y.unsqueeze(0) if B == 1 else Y.reshape(N, B, -1).transpose(0, 1)


def _uncols_heads(Ys: list[Tensor], B: int) -> Tensor:
    """K blocks (N, B*C) -> (B, N, K, C)."""
    out = torch.stack(Ys, 1)  # (N, K, B*C)
    N, K, BC = out.shape
    if B == 1:
        return out.unsqueeze(0)
    return out.reshape(N, K, B, BC // B).permute(2, 0, 1, 3)


def _heads(z: Tensor) -> list[Tensor]:
    """(B, M, K, C) -> K blocks (M, B*C).

    ``unbind`` (a view per head, one stack in backward) rather than K ``select``s, whose
    backward would zero-fill and add K copies of the whole of z.
    """
    if z.shape[2] == 1:
        return [_cols(z.squeeze(2))]
    return [_cols(h) for h in z.unbind(2)]


class SparseOperator:
    """A fixed sparse (M, N) matrix S from COO (src, dst, value); applies Sᵀ.

    ``apply_t(X)`` maps (M, C) -> (N, C): out[n] = Σ_{src->n} value · X[src], by the one sparse
    operator of ``structconv.sparse`` (CSR per dtype and device, its transpose on the first
    backward; the differentiable product when ``value`` requires grad; traceable).
    """

    def __init__(self, src: Tensor, dst: Tensor, value: Tensor, M: int, N: int):
        self.src, self.dst, self.value = src, dst, value
        self.M, self.N = int(M), int(N)
        self.t = SparseMatrix(dst, src, value, (self.N, self.M))  # Sᵀ

    @property
    def nnz(self) -> int:
        return self.t.nnz

    @property
    def dtype(self) -> torch.dtype:
        return self.t.dtype

    @property
    def device(self) -> torch.device:
        return self.t.device

    def to(self, device=None, dtype=None) -> SparseOperator:
        return self._apply(lambda t: t.to(device=device, dtype=dtype if t.is_floating_point()
                                          else None))

    def _apply(self, fn) -> SparseOperator:
        """The same operator with ``fn`` applied to its tensors (how a Basis moves it)."""
        return SparseOperator(fn(self.src), fn(self.dst), fn(self.value), self.M, self.N)

    def apply_t(self, X: Tensor) -> Tensor:
        """Sᵀ X: (M, C) -> (N, C)."""
        return self.t.matmul(X)

    def to_dense(self) -> Tensor:
        return self.t.to_dense().t().contiguous()


class _GraphBasis(Basis):
    """Common plumbing of the polynomial bases: one square operator, lazy dtype casts."""

    cost_kernel = "graph"

    def __init__(self, K: int, op: SparseOperator):
        super().__init__(K, op.M, op.N)
        self.op = op

    def cast_like(self, t):
        # the operator casts its CSR lazily (cached per dtype/device), so no copy is needed
        return self

    def to_dense(self) -> Tensor:
        eye = torch.eye(self.M, dtype=self.dtype, device=self.device).unsqueeze(0)
        return self.propagate(eye)[0].permute(1, 2, 0).contiguous()  # (N, K, M) -> (K, M, N)

    def _spmm_cost(self, n_spmm: float, C: int, adds: float = 0.0) -> float:
        return self.flop_weight * n_spmm * max(self.op.nnz, 1) * C + adds * self.N * C


class PowerBasis(_GraphBasis):
    """A_k = S^{powers[k]} of one sparse operator S, applied by repeated SpMM (never S^p)."""

    def __init__(self, op: SparseOperator, powers: Sequence[int]):
        powers = tuple(int(p) for p in powers)
        if not powers or any(p < 0 for p in powers) or list(powers) != sorted(set(powers)):
            raise ValueError(f"powers must be distinct non-negative ints in increasing order, "
                             f"got {powers}")
        if op.M != op.N and powers != (1,):
            raise ValueError(f"powers {powers} need a square operator, got (M, N)=({op.M}, "
                             f"{op.N})")
        super().__init__(len(powers), op)
        self.powers = powers
        self._pos = {p: k for k, p in enumerate(powers)}

    def __repr__(self):
        return f"PowerBasis(powers={self.powers}, N={self.N}, nnz={self.op.nnz})"

    def apply_flops(self):
        return float(self.powers[-1] * max(self.op.nnz, 1) + (self.K - 1) * self.N)

    def propagate_flops(self, C):
        return self._spmm_cost(self.powers[-1], C, adds=self.K)

    def propagate_sum_flops(self, C):
        return self._spmm_cost(self.powers[-1], C, adds=self.K)

    def propagate(self, x):
        B = x.shape[0]
        cur = _cols(x)
        outs = [cur] if self.powers[0] == 0 else []
        for p in range(1, self.powers[-1] + 1):
            cur = self.op.apply_t(cur)
            if p in self._pos:
                outs.append(cur)
        return _uncols_heads(outs, B)

    def propagate_sum(self, z):
        # Horner: Σ_k (Sᵀ)^{p_k} z_k = Sᵀ(...Sᵀ(Sᵀ z_top + z_next)...) + z_0
        B = z.shape[0]
        zs = _heads(z)
        acc = None
        for p in range(self.powers[-1], 0, -1):
            if p in self._pos:
                zp = zs[self._pos[p]]
                acc = zp if acc is None else acc + zp
            if acc is not None:
                acc = self.op.apply_t(acc)
        if 0 in self._pos:
            acc = acc + zs[0] if acc is not None else zs[0].clone()
        return _uncols(acc, B)

    def propagate_heads(self, z):
        # all heads step together: one SpMM per power on the heads that still need it
        B, _, K, C = z.shape
        cur = _heads(z)
        for step in range(1, self.powers[-1] + 1):
            active = [k for k in range(K) if self.powers[k] >= step]
            if len(active) == 1:
                cur[active[0]] = self.op.apply_t(cur[active[0]])
                continue
            out = self.op.apply_t(torch.cat([cur[k] for k in active], 1))
            for k, blk in zip(active, out.split(cur[active[0]].shape[1], 1)):
                cur[k] = blk
        return _uncols_heads(cur, B)


class ChebyshevBasis(_GraphBasis):
    """A_k = T_k(L̂), k < K, Chebyshev polynomials of a square operator L̂ (by recurrence)."""

    def __init__(self, op: SparseOperator, K: int):
        if op.M != op.N:
            raise ValueError(f"Chebyshev needs a square operator, got (M, N)=({op.M}, {op.N})")
        super().__init__(_check_K(K), op)

    def __repr__(self):
        return f"ChebyshevBasis(K={self.K}, N={self.N}, nnz={self.op.nnz})"

    def apply_flops(self):
        return float((self.K - 1) * max(self.op.nnz, 1) + 2 * max(self.K - 2, 0) * self.N)

    def propagate_flops(self, C):
        return self._spmm_cost(self.K - 1, C, adds=2 * max(self.K - 2, 0) + self.K)

    def propagate_sum_flops(self, C):
        return self._spmm_cost(self.K - 1, C, adds=2 * max(self.K - 1, 0))

    def _recurrence(self, X: Tensor, K: int) -> list[Tensor]:
        outs = [X]
        if K > 1:
            outs.append(self.op.apply_t(X))
        for _ in range(2, K):
            outs.append(2.0 * self.op.apply_t(outs[-1]) - outs[-2])
        return outs

    def propagate(self, x):
        return _uncols_heads(self._recurrence(_cols(x), self.K), x.shape[0])

    def propagate_sum(self, z):
        # Clenshaw: b_k = z_k + 2 L̂ᵀ b_{k+1} - b_{k+2};  y = z_0 + L̂ᵀ b_1 - b_2  (K-1 SpMMs)
        B, K = z.shape[0], self.K
        zs = _heads(z)
        if K == 1:
            return _uncols(zs[0].clone(), B)
        b1, b2 = zs[K - 1], None
        for k in range(K - 2, 0, -1):
            t = 2.0 * self.op.apply_t(b1) + zs[k]
            if b2 is not None:
                t = t - b2
            b1, b2 = t, b1
        y = self.op.apply_t(b1) + zs[0]
        if b2 is not None:
            y = y - b2
        return _uncols(y, B)

    def propagate_heads(self, z):
        B = z.shape[0]
        zs = _heads(z)
        return _uncols_heads([self._recurrence(zs[k], k + 1)[k] for k in range(self.K)], B)


def stack_single_sorts(sorts, op_of, identity: bool, n_eye: int, M: int, N: int, device,
                       dtype):
    """The identity (on the first ``n_eye`` entries) and the 1-sorts of ``sorts`` as one flat
    (len(flat_k), M, N) ``Sparse`` basis (one SpMM for all of them; None if there are none);
    returns (flat, flat_k: their positions k, [(k, sort)] of the longer sorts). ``op_of(r)``
    is relation r's ``SparseOperator``."""
    off = int(identity)
    flat_k, idx, vals, longer = [], [], [], []
    if identity:
        ar = torch.arange(n_eye, device=device)
        idx.append(torch.stack([torch.zeros_like(ar), ar, ar]))
        vals.append(torch.ones(n_eye, dtype=dtype, device=device))
        flat_k.append(0)
    for j, s in enumerate(sorts):
        if len(s) == 1:
            op = op_of(s[0])
            idx.append(torch.stack([torch.full_like(op.src, len(flat_k)), op.src, op.dst]))
            vals.append(op.value)
            flat_k.append(off + j)
        else:
            longer.append((off + j, s))
    flat = None
    if flat_k:
        flat = Sparse(torch.cat(idx, 1), torch.cat(vals), (len(flat_k), M, N))
        flat.cost_kernel = "graph"
    return flat, flat_k, longer


class RelationalBasis(Basis):
    """One basis matrix per random-walk sort (a tuple of relations), optionally the identity first.

    A sort ``(r1, ..., rL)`` is the product ``S_{r1} ... S_{rL}`` of normalised relation matrices
    (a walk along r1 first). The identity and single-relation sorts form one flat sparse basis
    (one SpMM for all of them); longer sorts are applied relation by relation.
    """

    def __init__(self, ops: dict[int, SparseOperator], sorts: Sequence[tuple[int, ...]],
                 identity: bool, M: int, N: int):
        self.sorts = [tuple(s) for s in sorts]
        self.identity = bool(identity)
        self.ops = ops
        super().__init__(len(self.sorts) + int(self.identity), M, N)
        dev = next(iter(ops.values())).device if ops else torch.device("cpu")
        dtype = next(iter(ops.values())).dtype if ops else torch.get_default_dtype()
        # (k, relations) for sorts longer than one relation
        self._flat, self._flat_k, self._walks = stack_single_sorts(
            self.sorts, lambda r: ops[r], self.identity, M, M, N, dev, dtype)
        self._flat_is_all = self._flat_k == list(range(self.K))

    def __repr__(self):
        return (f"RelationalBasis(K={self.K}, sorts={self.sorts}, identity={self.identity}, "
                f"M={self.M}, N={self.N})")

    def _walk_nnz(self) -> int:
        return sum(self.ops[r].nnz for _, s in self._walks for r in s)

    def apply_flops(self):
        flat = self._flat.nnz if self._flat is not None else 0
        return float(max(flat + self._walk_nnz(), 1))

    def propagate_flops(self, C):
        return self.cost_weight("graph") * self.apply_flops() * C

    def propagate_sum_flops(self, C):
        return self.cost_weight("graph") * self.apply_flops() * C

    def to_dense(self):
        eye = torch.eye(self.M, dtype=self.dtype, device=self.device).unsqueeze(0)
        return self.propagate(eye)[0].permute(1, 2, 0).contiguous()

    def _walk(self, X: Tensor, sort: tuple[int, ...]) -> Tensor:
        for r in sort:
            X = self.ops[r].apply_t(X)
        return X

    def _assemble(self, parts: dict[int, Tensor]) -> Tensor:
        return torch.cat([parts[k] for k in range(self.K)], 2)

    # -- the per-sort route: each sort's rows only, theta_k on them -------------------------------
    _transient = ("_compact_cache",)

    def _compact(self):
        """Each sort's last step restricted to the targets it reaches, built once: the 1-sorts
        as one stacked operator (its rows: Σ_k |targets_k|), each longer sort as its own after
        them; the (k, first row, rows) of every sort and the target id of every row."""
        cache = getattr(self, "_compact_cache", None)
        if cache is not None:
            return cache
        off = int(self.identity)
        src, rows, vals, segs, tgts, walks, n = [], [], [], [], [], [], 0
        order = sorted(range(len(self.sorts)), key=lambda j: len(self.sorts[j]) > 1)
        for j in order:
            s = self.sorts[j]
            op = self.ops[s[-1]]
            tgt, inv = torch.unique(op.dst, return_inverse=True)
            if len(s) == 1:
                src.append(op.src)
                rows.append(inv + n)
                vals.append(op.value)
            else:
                walks.append((s[:-1], SparseOperator(op.src, inv, op.value, self.M,
                                                     tgt.numel())))
            segs.append((off + j, n, tgt.numel()))
            tgts.append(tgt)
            n += tgt.numel()
        n_flat = n - sum(op.N for _, op in walks)
        flat = (SparseOperator(torch.cat(src), torch.cat(rows), torch.cat(vals), self.M, n_flat)
                if src else None)
        tgt_all = (torch.cat(tgts) if tgts else
                   torch.zeros(0, dtype=torch.long, device=self.device))
        self._compact_cache = (flat, walks, segs, tgt_all, n)
        return self._compact_cache

    def _per_sort(self, x: Tensor, theta, bias=None) -> Tensor:
        """y = Σ_k A_kᵀ x Θ_k computed on each sort's target rows: no (N, K, C) temporary, so
        hundreds of relations (a knowledge graph's) cost about one pass over the edges."""
        flat, walks, segs, tgt_all, n = self._compact()
        B, M, P = x.shape
        X = _cols(x)
        parts = [] if flat is None else [flat.apply_t(X)]
        parts += [op.apply_t(self._walk(X, prefix)) for prefix, op in walks]
        U = torch.cat(parts) if len(parts) > 1 else parts[0]  # (rows, B*P)
        blocks = theta.blocks() if hasattr(theta, "blocks") else None
        # tiny blocks run far below the GEMM rate (a bmm of (n, b) x (b, b) per block): up to
        # 32 blocks, one dense GEMM on the block-diagonal matrix is faster in practice
        dense = blocks is None or blocks.shape[1] <= 32
        W = (theta() if dense else blocks).to(x.dtype)
        segs = sorted(segs, key=lambda t: t[1])
        # split / unbind: one concatenation in backward, not a zero-filled copy per slice
        us = U.split([cnt for _, _, cnt in segs])
        Ws = W.unbind(0)
        outs = []
        for (k, _, cnt), u in zip(segs, us):
            u = u.reshape(cnt * B, P)
            if dense:
                outs.append(u @ Ws[k])
            else:  # block-diagonal theta_k: (g, P/g, Q/g) blocks
                g = W.shape[1]
                outs.append(torch.einsum("ngp,gpq->ngq", u.reshape(-1, g, P // g),
                                         Ws[k]).reshape(cnt * B, -1))
        V = torch.cat(outs)  # (rows*B, Q)
        Q = V.shape[1]
        y = x.new_zeros(self.N, B, Q).index_add_(0, tgt_all, V.reshape(n, B, Q))
        if self.identity:  # the identity sort: every node's own features
            th0 = Ws[0] if dense else theta()[0].to(x.dtype)
            y = y + (x @ th0).transpose(0, 1)
        y = y.transpose(0, 1)
        return y if bias is None else y + bias

    def routes(self, x: Tensor, theta) -> list:
        """``per_sort``: each sort's rows only (Full or block-diagonal theta, K >= 16)."""
        from ..costs import Route

        blocks = getattr(theta, "blocks", lambda: None)()
        if not (blocks is not None or type(theta).__name__ in ("Full", "Fixed")):
            return []
        if self.M != self.N and self.identity:
            return []
        # with few sorts the engine's GEMM routes (one x·Θ over all k, one SpMM) are as fast
        # and have no per-sort loop; the route is for knowledge graphs' hundreds of relations,
        # whose (N, K, C) temporaries would not fit
        if self.K < 16:
            return []
        B, _, P = x.shape
        Q = theta.Q
        g = 1 if blocks is None or blocks.shape[1] <= 32 else blocks.shape[1]
        rows = self._compact()[4]
        walk = sum(self.ops[r].nnz for s in self.sorts for r in s)
        flops = B * (self.cost_weight("graph") * walk * P + rows * P * Q / g
                     + (self.M * P * Q if self.identity else 0) + rows * Q)
        return [Route("per_sort", float(flops), float(B * rows * (P + Q)), self._per_sort,
                      fuses_bias=True, device_type=self.device.type)]

    def propagate(self, x):
        if self._flat_is_all:
            return self._flat.propagate(x)
        B, _, C = x.shape
        parts = {}
        if self._flat is not None:
            flat = self._flat.propagate(x)
            for j, k in enumerate(self._flat_k):
                parts[k] = flat[:, :, j:j + 1]
        X, memo = _cols(x), {}
        for k, s in self._walks:
            # walks sharing a prefix share its SpMMs
            cur, done = X, ()
            for r in s:
                done = done + (r,)
                if done not in memo:
                    memo[done] = self.ops[r].apply_t(cur)
                cur = memo[done]
            parts[k] = _uncols(cur, B).unsqueeze(2)
        return self._assemble(parts)

    def propagate_sum(self, z):
        if self._flat_is_all:
            return self._flat.propagate_sum(z)
        B = z.shape[0]
        y = None
        if self._flat is not None:
            y = self._flat.propagate_sum(z[:, :, self._flat_k])
        zs = _heads(z)
        for k, s in self._walks:
            w = _uncols(self._walk(zs[k], s), B)
            y = w if y is None else y + w
        return y

    def propagate_heads(self, z):
        if self._flat_is_all:
            return self._flat.propagate_heads(z)
        B = z.shape[0]
        parts = {}
        if self._flat is not None:
            flat = self._flat.propagate_heads(z[:, :, self._flat_k])
            for j, k in enumerate(self._flat_k):
                parts[k] = flat[:, :, j:j + 1]
        zs = _heads(z)
        for k, s in self._walks:
            parts[k] = _uncols(self._walk(zs[k], s), B).unsqueeze(2)
        return self._assemble(parts)


# ------------------------------------------------------------------------------------------------
# structure cache
class _GraphCache:
    """A small LRU of built bases keyed on tensor identity + version + options (see module doc)."""

    def __init__(self, maxsize: int = 16):
        self.maxsize = maxsize
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.RLock()  # re-entrant: a weakref callback may fire under it
        self.hits = self.misses = 0

    @staticmethod
    def _tkey(t):
        if t is None:
            return None
        if not isinstance(t, Tensor):
            return ("object", id(t))  # never hits: only tensors are keyed by identity
        return (id(t), t._version, tuple(t.shape), t.dtype, str(t.device), t.data_ptr())

    @staticmethod
    def _fingerprint(tensors: tuple) -> list:
        """A content checksum of the key tensors, so that an edit that bumps no version counter
        (through ``.numpy()``, ``.data`` or another tensor on the same storage) misses the
        cache: the column sums of the flattened entries laid out in 64 columns, and the sum of
        the rest. Any change of one entry, and any exchange of two entries whose distance is
        not a multiple of 64, changes it; one read of the entries (10M edges: ~4.5 ms, against
        ~0.5 s to build the basis; Cora-size: ~45 us a call, measured)."""
        out = []
        for t in tensors:
            if not isinstance(t, Tensor):
                out.append(None)
                continue
            flat = t.detach().reshape(-1)
            flat = flat.to(torch.float64) if flat.is_floating_point() else flat.to(torch.int64)
            n = flat.numel() // 64 * 64
            out.append(torch.cat([flat[:n].view(-1, 64).sum(0), flat[n:].sum().reshape(1)]))
        return out

    @staticmethod
    def _same(a: list, b: list) -> bool:
        return all((x is None and y is None) or (x is not None and y is not None and
                                                 torch.equal(x, y)) for x, y in zip(a, b))

    def get(self, tensors: tuple, options: tuple, build: Callable[[], Basis]) -> Basis:
        key = (tuple(self._tkey(t) for t in tensors), options)
        fp = self._fingerprint(tensors)
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                refs, basis, fp_hit = hit
                alive = all((r is None and t is None) or (r is not None and r() is t)
                            for r, t in zip(refs, tensors))
                if alive and self._same(fp_hit, fp):
                    self._d.move_to_end(key)
                    self.hits += 1
                    return basis
                self._d.pop(key, None)
        basis = build()
        refs = []
        for t in tensors:
            if isinstance(t, Tensor):
                # a dead key tensor frees its entry at once (its id may be reused)
                refs.append(weakref.ref(t, lambda _r, key=key: self._drop(key)))
            else:
                refs.append(None)
        with self._lock:
            self.misses += 1
            self._d[key] = (refs, basis, fp)
            while len(self._d) > self.maxsize:
                self._d.popitem(last=False)
        return basis

    def _drop(self, key):
        with self._lock:
            self._d.pop(key, None)

    def clear(self):
        with self._lock:
            self._d.clear()
            self.hits = self.misses = 0


_CACHE = _GraphCache()


def clear_graph_cache() -> None:
    """Forget every cached graph structure."""
    _CACHE.clear()


def graph_cache_info() -> dict:
    """``{"entries", "hits", "misses", "maxsize"}`` of the structure cache."""
    return dict(entries=len(_CACHE._d), hits=_CACHE.hits, misses=_CACHE.misses,
                maxsize=_CACHE.maxsize)


def _cached(cache: bool, tensors: tuple, options: tuple, build: Callable[[], Basis]) -> Basis:
    # a weight that requires grad must be re-read every call, so it is never cached; while
    # torch.compile traces, the structure is part of the graph
    if not cache or torch.compiler.is_compiling() or \
            any(isinstance(t, Tensor) and t.requires_grad for t in tensors):
        return build()
    return _CACHE.get(tensors, options, build)


# ------------------------------------------------------------------------------------------------
# public constructors
def gcn(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None,
        add_self_loops: bool = True, normalize: bool = True, *, improved: bool = False,
        dtype: torch.dtype | None = None, cache: bool = False) -> PowerBasis:
    """K=1 basis D̂^-1/2 Â D̂^-1/2 (N, N) exactly as PyG's ``gcn_norm`` (degree on targets).

    ``improved`` gives remaining self loops weight 2 where edge weights are given (as PyG).
    """
    n = _check_num_nodes(num_nodes)
    opts = ("gcn", n, bool(add_self_loops), bool(normalize), bool(improved), dtype)

    def build():
        # validated on a miss only: a hit is the same, unchanged tensor as a checked one
        _check_edges(edge_index, n, edge_weight=edge_weight)
        src, dst, v = _gcn_values(edge_index[0].long(), edge_index[1].long(), edge_weight, n,
                                  add_self_loops=add_self_loops, normalize=normalize,
                                  improved=improved, dtype=_value_dtype(edge_weight, dtype))
        return PowerBasis(SparseOperator(src, dst, v, n, n), (1,))

    return _cached(cache, (edge_index, edge_weight), opts, build)


def sgc(edge_index: Tensor, num_nodes: int, K: int, edge_weight: Tensor | None = None,
        add_self_loops: bool = True, *, dtype: torch.dtype | None = None,
        cache: bool = False) -> PowerBasis:
    """K=1 basis S^K with S the GCN-normalised adjacency (PyG's ``SGConv``), applied K times."""
    n = _check_num_nodes(num_nodes)
    K = _check_K(K)
    opts = ("sgc", n, K, bool(add_self_loops), dtype)

    def build():
        _check_edges(edge_index, n, edge_weight=edge_weight)
        src, dst, v = _gcn_values(edge_index[0].long(), edge_index[1].long(), edge_weight, n,
                                  add_self_loops=add_self_loops, normalize=True, improved=False,
                                  dtype=_value_dtype(edge_weight, dtype))
        return PowerBasis(SparseOperator(src, dst, v, n, n), (K,))

    return _cached(cache, (edge_index, edge_weight), opts, build)


def _check_norm(normalization, allowed, what):
    if normalization not in allowed:
        raise ValueError(f"unknown {what} normalization {normalization!r}: use one of "
                         f"{list(allowed)}")


def chebyshev(edge_index: Tensor, num_nodes: int, K: int, edge_weight: Tensor | None = None,
              normalization: str | None = "sym", lambda_max=None, *, batch: Tensor | None = None,
              dtype: torch.dtype | None = None, cache: bool = False) -> ChebyshevBasis:
    """T_0..T_{K-1} of the scaled Laplacian 2L/lambda_max - I, as PyG's ``ChebConv``.

    ``normalization`` is ``"sym"``, ``"rw"`` or None (L = D - A); ``lambda_max`` a number, a
    0-d tensor or one value per graph of ``batch``; None means PyG's default 2·max(L).
    """
    n = _check_num_nodes(num_nodes)
    K = _check_K(K)
    _check_norm(normalization, (None, "sym", "rw"), "Chebyshev")
    if batch is not None and (batch.dim() != 1 or batch.shape[0] != n):
        raise ValueError(f"batch must be ({n},) for {n} nodes, got {tuple(batch.shape)}")
    lam_key = lambda_max if not isinstance(lambda_max, Tensor) else None
    tensors = (edge_index, edge_weight, batch,
               lambda_max if isinstance(lambda_max, Tensor) else None)
    opts = ("cheb", n, K, normalization, lam_key, dtype)

    def build():
        _check_edges(edge_index, n, edge_weight=edge_weight)
        src, dst, v = _laplacian_values(
            edge_index[0].long(), edge_index[1].long(), edge_weight, n,
            normalization=normalization, lambda_max=lambda_max, batch=batch,
            dtype=_value_dtype(edge_weight, dtype))
        return ChebyshevBasis(SparseOperator(src, dst, v, n, n), K)

    return _cached(cache, tensors, opts, build)


def diffusion(edge_index: Tensor, num_nodes: int, K: int, edge_weight: Tensor | None = None,
              normalization: str | None = "sym", *, dtype: torch.dtype | None = None,
              cache: bool = False) -> PowerBasis:
    """Monomials S^0..S^K (K+1 matrices) of the normalised adjacency, applied by recurrence.

    ``"sym"``: D_in^-1/2 A D_in^-1/2 without added loops (PyG's ``TAGConv``); ``"rw"``:
    S = D_out^-1 A (rows of nodes without out-edges stay zero); None: the (weighted) adjacency.
    """
    n = _check_num_nodes(num_nodes)
    K = _check_K(K, low=0)
    _check_norm(normalization, (None, "sym", "rw"), "diffusion")
    opts = ("diffusion", n, K, normalization, dtype)

    def build():
        _check_edges(edge_index, n, edge_weight=edge_weight)
        src, dst = edge_index[0].long(), edge_index[1].long()
        vd = _value_dtype(edge_weight, dtype)
        if normalization == "sym":
            src, dst, v = _gcn_values(src, dst, edge_weight, n, add_self_loops=False,
                                      normalize=True, improved=False, dtype=vd)
        elif normalization == "rw":
            src, dst, v = _rw_values(src, dst, edge_weight, n, dtype=vd)
        else:
            v = edge_weight if edge_weight is not None else torch.ones(
                src.shape[0], dtype=vd, device=src.device)
        return PowerBasis(SparseOperator(src, dst, v, n, n), tuple(range(K + 1)))

    return _cached(cache, (edge_index, edge_weight), opts, build)


def _relation_values(src, dst, w, M, N, normalization):
    if normalization is None:
        return w
    if normalization == "mean":
        # R-GCN's 1/c_{n,r}: (weighted) mean over the incoming edges of this relation
        deg = torch.zeros(N, dtype=w.dtype, device=w.device).index_add(0, dst, w)
        dinv = 1.0 / deg
        return dinv.masked_fill(dinv == _INF, 0.0)[dst] * w
    din = torch.zeros(N, dtype=w.dtype, device=w.device).index_add(0, dst, w)
    dout = torch.zeros(M, dtype=w.dtype, device=w.device).index_add(0, src, w)
    return _inv_sqrt(dout)[src] * w * _inv_sqrt(din)[dst]


def _pair_nodes(num_nodes) -> tuple[int, int]:
    """(M, N) from an int or a (num_sources, num_targets) pair."""
    if isinstance(num_nodes, (tuple, list)):
        if len(num_nodes) != 2:
            raise ValueError(f"num_nodes must be an int or a (M, N) pair, got {num_nodes!r}")
        return (_check_num_nodes(num_nodes[0], "num_nodes[0]"),
                _check_num_nodes(num_nodes[1], "num_nodes[1]"))
    M = _check_num_nodes(num_nodes)
    return M, M


def _check_edge_type(edge_type, E: int) -> None:
    if not isinstance(edge_type, Tensor):
        raise TypeError(f"edge_type must be a tensor, got {type(edge_type).__name__}")
    if edge_type.dim() != 1 or edge_type.shape[0] != E:
        raise ValueError(f"edge_type must be ({E},) to match edge_index (2, {E}), got "
                         f"{tuple(edge_type.shape)}")
    if edge_type.is_floating_point():
        raise TypeError(f"edge_type must be an integer tensor, got {edge_type.dtype}")
    if E and not torch.compiler.is_compiling() and int(edge_type.min()) < 0:
        raise ValueError(f"edge_type ids must be >= 0, got min {int(edge_type.min())}")


def _num_relations(edge_type: Tensor, num_relations, sorts) -> int:
    """The number of relations: given (and checked against the edge types) or inferred."""
    if num_relations is not None and torch.compiler.is_compiling():
        return num_relations
    et_max = int(edge_type.max()) if edge_type.numel() else -1
    if num_relations is None:
        num_relations = et_max + 1
        if sorts is not None:
            flat = [r for s in sorts for r in ((s,) if isinstance(s, int) else s)]
            num_relations = max([num_relations, *(r + 1 for r in flat)])
    elif et_max >= num_relations:
        raise ValueError(f"edge_type ids must be < num_relations={num_relations}, got max "
                         f"{et_max}")
    return num_relations


def _check_sorts(sorts, num_relations: int, identity: bool, M: int, N: int) -> list[tuple]:
    """Sorts as tuples of relation ids (None: every relation alone), each checked."""
    if sorts is None:
        sorts = [(r,) for r in range(num_relations)]
    out = []
    for s in sorts:
        s = (s,) if isinstance(s, int) else tuple(s)
        if not s or any(isinstance(r, bool) or not isinstance(r, int) or not
                        0 <= r < num_relations for r in s):
            raise ValueError(f"each sort must be a non-empty tuple of relation ids in "
                             f"[0, {num_relations - 1}], got {s!r}")
        if len(s) > 1 and M != N:
            raise ValueError(f"sort {s} of length {len(s)} needs M == N, got (M, N)=({M}, {N})")
        out.append(s)
    if identity and M != N:
        raise ValueError(f"identity needs M == N, got (M, N)=({M}, {N})")
    if not out and not identity:
        raise ValueError("relational needs at least one sort or identity=True")
    return out


def relational(edge_index: Tensor, edge_type: Tensor, num_nodes, sorts=None,
               edge_weight: Tensor | None = None, normalization: str | None = "mean",
               identity: bool = False, *, num_relations: int | None = None,
               relations: Sequence[str] | None = None,
               dtype: torch.dtype | None = None, cache: bool = False) -> RelationalBasis:
    """One basis matrix per random-walk sort; ``K = len(sorts) + identity`` (identity first).

    ``sorts``: tuples of relation ids (an int is a 1-sort; None = every relation alone), or,
    with ``relations`` (names, index = relation id), tuples of names or dotted strings
    (``"played.characterIn.genre"``). Each relation matrix is normalised on its own:
    ``"mean"`` over a target's incoming edges of that relation (R-GCN), ``"sym"`` by
    sqrt(out-degree · in-degree), or None. ``num_nodes`` is an int or a
    ``(num_sources, num_targets)`` pair (bipartite, 1-sorts only).
    """
    M, N = _pair_nodes(num_nodes)
    _check_edges(edge_index, M, N, edge_weight=edge_weight)
    E = edge_index.shape[1]
    _check_edge_type(edge_type, E)
    _check_norm(normalization, (None, "mean", "sym"), "relational")
    if relations is not None:
        if num_relations is not None and num_relations != len(relations):
            raise ValueError(f"relations names {len(relations)} relations but num_relations="
                             f"{num_relations}")
        num_relations = len(relations)
    if sorts is not None and (relations is not None or any(
            isinstance(s, str) or (isinstance(s, (tuple, list)) and
                                   any(isinstance(r, str) for r in s)) for s in sorts)):
        R = num_relations if num_relations is not None else _num_relations(
            edge_type, None, None)
        sorts = parse_sorts(sorts, relations, R)
        num_relations = R
    num_relations = _num_relations(edge_type, num_relations, sorts)
    norm_sorts = _check_sorts(sorts, num_relations, identity, M, N)
    opts = ("relational", M, N, tuple(norm_sorts), normalization, bool(identity),
            num_relations, dtype)

    def build():
        vd = _value_dtype(edge_weight, dtype)
        src, dst, et = edge_index[0].long(), edge_index[1].long(), edge_type.long()
        w = edge_weight if edge_weight is not None else torch.ones(E, dtype=vd,
                                                                   device=src.device)
        ops = {}
        for r in sorted({r for s in norm_sorts for r in s}):
            m = et == r
            if torch.compiler.is_compiling():
                # static shapes: every edge, weighted zero outside relation r
                s_r, d_r, w_r = src, dst, w * m.to(w.dtype)
            else:
                s_r, d_r, w_r = src[m], dst[m], w[m]
            ops[r] = SparseOperator(s_r, d_r, _relation_values(s_r, d_r, w_r, M, N,
                                                               normalization), M, N)
        return RelationalBasis(ops, norm_sorts, identity, M, N)

    return _cached(cache, (edge_index, edge_type, edge_weight), opts, build)


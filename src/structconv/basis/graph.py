"""Graph and relational bases built from an edge_index (GCN, Chebyshev, diffusion, sorts).

An edge ``m -> n`` (PyG's ``[source; target]``) lands at ``A[k, m, n]``, so ``A_kᵀ x`` aggregates
at targets as PyG's ``source_to_target`` message passing does. Every normalisation is computed as
PyG computes it (``gcn_norm``: degree on targets; ``get_laplacian``: degree on sources).

The bases stay sparse: one normalised operator ``S`` is kept as a CSR matrix and polynomial bases
are applied by recurrence (``S^k x = S S^{k-1} x``, Chebyshev ``T_k = 2 L̂ T_{k-1} - T_{k-2}``), and
their adjoint sums ``Σ_k A_kᵀ z_k`` by Horner / Clenshaw, so that every primitive costs as many
SpMMs as the highest power. No matrix power is ever formed.

Argument checks and normalisations are the public ``basis.edges``; the column layouts of the
SpMMs ``basis.layout``; the structure cache (``cache=True`` in the constructors) ``basis.cache``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor

from ..sparse import SparseMatrix
from .base import Basis, Sparse
from .cache import cached, clear_graph_cache, graph_cache_info
from .edges import (
    EdgeForm,
    check_edge_type,
    check_edges,
    check_K,
    check_norm,
    check_num_nodes,
    check_sorts,
    gcn_norm,
    infer_num_relations,
    laplacian,
    random_walk,
    relation_values,
    value_dtype,
)
from .layout import cols, heads, uncols, uncols_heads
from .sorts import parse_sorts, sort_name  # noqa: F401  (sort_name re-exported)

__all__ = [
    "gcn", "chebyshev", "diffusion", "sgc", "relational",
    "SparseOperator", "OperatorBasis", "PowerBasis", "ChebyshevBasis", "RelationalBasis",
    "clear_graph_cache", "graph_cache_info", "operator_of", "diffusion_form",
    "relation_operators", "pair_nodes",
]


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

    def apply_t(self, X: Tensor, bias: Tensor | None = None) -> Tensor:
        """Sᵀ X (+ bias (C,), in the same sparse kernel): (M, C) -> (N, C)."""
        return self.t.matmul(X, bias)

    def to_dense(self) -> Tensor:
        return self.t.to_dense().t().contiguous()


class OperatorBasis(Basis):
    """A basis applied by sparse operators that cast themselves lazily (a CSR per dtype and
    device, cached): ``cast_like`` copies no structure, and ``to_dense`` computes in the dtype
    of the call it was cast for (a polynomial's recurrence rounds in the operator's dtype
    otherwise: float32 accuracy for a float64 ``basis_param`` route)."""

    cost_kernel = "graph"
    #: the dtype ``to_dense`` computes in (None: the operators'); set on ``cast_like``'s views
    compute_dtype: torch.dtype | None = None

    def cast_like(self, t):
        if not t.is_floating_point() or t.dtype == (self.compute_dtype or self.dtype):
            return self
        memo, key = self.memo, ("compute_dtype", t.dtype)
        view = memo.get(key)
        if view is None:
            # a shallow copy sharing the operators and the plan cache (plans key on dtype)
            view = copy.copy(self)
            view.compute_dtype = t.dtype
            memo[key] = view
        return view

    def to_dense(self) -> Tensor:
        eye = torch.eye(self.M, dtype=self.compute_dtype or self.dtype,
                        device=self.device).unsqueeze(0)
        return self.propagate(eye)[0].permute(1, 2, 0).contiguous()  # (N, K, M) -> (K, M, N)


class _GraphBasis(OperatorBasis):
    """Common plumbing of the polynomial bases: one operator S."""

    def __init__(self, K: int, op: SparseOperator):
        super().__init__(K, op.M, op.N)
        self.op = op

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
        cur = cols(x)
        outs = [cur] if self.powers[0] == 0 else []
        for p in range(1, self.powers[-1] + 1):
            cur = self.op.apply_t(cur)
            if p in self._pos:
                outs.append(cur)
        return uncols_heads(outs, B)

    def propagate_sum(self, z, bias=None):
        # Horner: Σ_k (Sᵀ)^{p_k} z_k = Sᵀ(...Sᵀ(Sᵀ z_top + z_next)...) + z_0
        B = z.shape[0]
        zs = heads(z)
        # a bias joins the last sparse product when that product ends the sum (no z_0 term
        # after it, one batch item: the columns are then exactly the channels)
        fused = bias is not None and 0 not in self._pos and B == 1
        acc = None
        for p in range(self.powers[-1], 0, -1):
            if p in self._pos:
                zp = zs[self._pos[p]]
                acc = zp if acc is None else acc + zp
            if acc is not None:
                # (an operator subclass written before the bias argument still works)
                acc = self.op.apply_t(acc, bias) if fused and p == 1 else self.op.apply_t(acc)
        if 0 in self._pos:
            acc = acc + zs[0] if acc is not None else zs[0].clone()
        out = uncols(acc, B)
        return out if bias is None or fused else out + bias

    def propagate_sum_bias(self, z, bias):
        return self.propagate_sum(z, bias)

    def propagate_heads(self, z):
        # all heads step together: one SpMM per power on the heads that still need it
        B, _, K, C = z.shape
        cur = heads(z)
        for step in range(1, self.powers[-1] + 1):
            active = [k for k in range(K) if self.powers[k] >= step]
            if len(active) == 1:
                cur[active[0]] = self.op.apply_t(cur[active[0]])
                continue
            out = self.op.apply_t(torch.cat([cur[k] for k in active], 1))
            for k, blk in zip(active, out.split(cur[active[0]].shape[1], 1)):
                cur[k] = blk
        return uncols_heads(cur, B)


class ChebyshevBasis(_GraphBasis):
    """A_k = T_k(L̂), k < K, Chebyshev polynomials of a square operator L̂ (by recurrence)."""

    def __init__(self, op: SparseOperator, K: int):
        if op.M != op.N:
            raise ValueError(f"Chebyshev needs a square operator, got (M, N)=({op.M}, {op.N})")
        super().__init__(check_K(K), op)

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
        return uncols_heads(self._recurrence(cols(x), self.K), x.shape[0])

    def propagate_sum(self, z):
        # Clenshaw: b_k = z_k + 2 L̂ᵀ b_{k+1} - b_{k+2};  y = z_0 + L̂ᵀ b_1 - b_2  (K-1 SpMMs)
        B, K = z.shape[0], self.K
        zs = heads(z)
        if K == 1:
            return uncols(zs[0].clone(), B)
        b1, b2 = zs[K - 1], None
        for k in range(K - 2, 0, -1):
            t = 2.0 * self.op.apply_t(b1) + zs[k]
            if b2 is not None:
                t = t - b2
            b1, b2 = t, b1
        y = self.op.apply_t(b1) + zs[0]
        if b2 is not None:
            y = y - b2
        return uncols(y, B)

    def propagate_heads(self, z):
        B = z.shape[0]
        zs = heads(z)
        return uncols_heads([self._recurrence(zs[k], k + 1)[k] for k in range(self.K)], B)


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
                 identity: bool, M: int, N: int, num_relations: int | None = None):
        self.sorts = [tuple(s) for s in sorts]
        #: the relations of the graph (ids 0..num_relations-1), where known
        self.num_relations = num_relations
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
        X = cols(x)
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
        X, memo = cols(x), {}
        for k, s in self._walks:
            # walks sharing a prefix share its SpMMs
            cur, done = X, ()
            for r in s:
                done = done + (r,)
                if done not in memo:
                    memo[done] = self.ops[r].apply_t(cur)
                cur = memo[done]
            parts[k] = uncols(cur, B).unsqueeze(2)
        return self._assemble(parts)

    def propagate_sum(self, z):
        if self._flat_is_all:
            return self._flat.propagate_sum(z)
        B = z.shape[0]
        y = None
        if self._flat is not None:
            y = self._flat.propagate_sum(z[:, :, self._flat_k])
        zs = heads(z)
        for k, s in self._walks:
            w = uncols(self._walk(zs[k], s), B)
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
        zs = heads(z)
        for k, s in self._walks:
            parts[k] = uncols(self._walk(zs[k], s), B).unsqueeze(2)
        return self._assemble(parts)


# ------------------------------------------------------------------------------------------------
# public constructors
def operator_of(form: EdgeForm, M: int | None = None, N: int | None = None) -> SparseOperator:
    """The ``SparseOperator`` of an edge form (its kept edges, then its diagonal entries)."""
    n = form.num_nodes
    return SparseOperator(*form.coo(), n if M is None else M, n if N is None else N)


def gcn(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None,
        add_self_loops: bool = True, normalize: bool = True, *, improved: bool = False,
        dtype: torch.dtype | None = None, cache: bool = False) -> PowerBasis:
    """K=1 basis D̂^-1/2 Â D̂^-1/2 (N, N) exactly as PyG's ``gcn_norm`` (degree on targets).

    ``improved`` gives remaining self loops weight 2 where edge weights are given (as PyG).
    """
    n = check_num_nodes(num_nodes)
    opts = ("gcn", n, bool(add_self_loops), bool(normalize), bool(improved), dtype)

    def build():
        # validated on a miss only: a hit is the same, unchanged tensor as a checked one
        check_edges(edge_index, n, edge_weight=edge_weight)
        form = gcn_norm(edge_index, n, edge_weight, add_self_loops=add_self_loops,
                        normalize=normalize, improved=improved, dtype=dtype)
        return PowerBasis(operator_of(form), (1,))

    return cached(cache, (edge_index, edge_weight), opts, build)


def sgc(edge_index: Tensor, num_nodes: int, K: int, edge_weight: Tensor | None = None,
        add_self_loops: bool = True, *, dtype: torch.dtype | None = None,
        cache: bool = False) -> PowerBasis:
    """K=1 basis S^K with S the GCN-normalised adjacency (PyG's ``SGConv``), applied K times."""
    n = check_num_nodes(num_nodes)
    K = check_K(K)
    opts = ("sgc", n, K, bool(add_self_loops), dtype)

    def build():
        check_edges(edge_index, n, edge_weight=edge_weight)
        form = gcn_norm(edge_index, n, edge_weight, add_self_loops=add_self_loops, dtype=dtype)
        return PowerBasis(operator_of(form), (K,))

    return cached(cache, (edge_index, edge_weight), opts, build)


def chebyshev(edge_index: Tensor, num_nodes: int, K: int, edge_weight: Tensor | None = None,
              normalization: str | None = "sym", lambda_max=None, *, batch: Tensor | None = None,
              dtype: torch.dtype | None = None, cache: bool = False) -> ChebyshevBasis:
    """T_0..T_{K-1} of the scaled Laplacian 2L/lambda_max - I, as PyG's ``ChebConv``.

    ``normalization`` is ``"sym"``, ``"rw"`` or None (L = D - A); ``lambda_max`` a number, a
    0-d tensor or one value per graph of ``batch``; None means PyG's default 2·max(L).
    """
    n = check_num_nodes(num_nodes)
    K = check_K(K)
    check_norm(normalization, (None, "sym", "rw"), "Chebyshev")
    if batch is not None and (batch.dim() != 1 or batch.shape[0] != n):
        raise ValueError(f"batch must be ({n},) for {n} nodes, got {tuple(batch.shape)}")
    lam_key = lambda_max if not isinstance(lambda_max, Tensor) else None
    tensors = (edge_index, edge_weight, batch,
               lambda_max if isinstance(lambda_max, Tensor) else None)
    opts = ("cheb", n, K, normalization, lam_key, dtype)

    def build():
        check_edges(edge_index, n, edge_weight=edge_weight)
        form = laplacian(edge_index, n, edge_weight, normalization=normalization,
                         lambda_max=lambda_max, batch=batch, dtype=dtype)
        return ChebyshevBasis(operator_of(form), K)

    return cached(cache, tensors, opts, build)


def diffusion_form(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None,
                   normalization: str | None = "sym", dtype=None) -> EdgeForm:
    """The one-step operator S of ``diffusion``: "sym" D_in^-1/2 A D_in^-1/2 (no added loops),
    "rw" D_out^-1 A, None the (weighted) adjacency."""
    if normalization == "sym":
        return gcn_norm(edge_index, num_nodes, edge_weight, add_self_loops=False, dtype=dtype)
    if normalization == "rw":
        return random_walk(edge_index, num_nodes, edge_weight, dtype=dtype)
    src, dst = edge_index[0].long(), edge_index[1].long()
    v = edge_weight if edge_weight is not None else torch.ones(
        src.shape[0], dtype=value_dtype(None, dtype), device=src.device)
    return EdgeForm(src, dst, v, None, None, num_nodes)


def diffusion(edge_index: Tensor, num_nodes: int, K: int, edge_weight: Tensor | None = None,
              normalization: str | None = "sym", *, dtype: torch.dtype | None = None,
              cache: bool = False) -> PowerBasis:
    """Monomials S^0..S^K (K+1 matrices) of the normalised adjacency, applied by recurrence.

    ``"sym"``: D_in^-1/2 A D_in^-1/2 without added loops (PyG's ``TAGConv``); ``"rw"``:
    S = D_out^-1 A (rows of nodes without out-edges stay zero); None: the (weighted) adjacency.
    """
    n = check_num_nodes(num_nodes)
    K = check_K(K, low=0)
    check_norm(normalization, (None, "sym", "rw"), "diffusion")
    opts = ("diffusion", n, K, normalization, dtype)

    def build():
        check_edges(edge_index, n, edge_weight=edge_weight)
        form = diffusion_form(edge_index, n, edge_weight, normalization, dtype)
        return PowerBasis(operator_of(form), tuple(range(K + 1)))

    return cached(cache, (edge_index, edge_weight), opts, build)


def pair_nodes(num_nodes) -> tuple[int, int]:
    """(M, N) from an int or a (num_sources, num_targets) pair."""
    if isinstance(num_nodes, (tuple, list)):
        if len(num_nodes) != 2:
            raise ValueError(f"num_nodes must be an int or a (M, N) pair, got {num_nodes!r}")
        return (check_num_nodes(num_nodes[0], "num_nodes[0]"),
                check_num_nodes(num_nodes[1], "num_nodes[1]"))
    M = check_num_nodes(num_nodes)
    return M, M


def relation_operators(edge_index: Tensor, edge_type: Tensor, relations, M: int, N: int,
                       edge_weight: Tensor | None = None, normalization: str | None = "mean",
                       dtype=None) -> dict[int, SparseOperator]:
    """Relation id -> its normalised (M, N) operator, for each id in ``relations``."""
    E = edge_index.shape[1]
    src, dst, et = edge_index[0].long(), edge_index[1].long(), edge_type.long()
    w = edge_weight if edge_weight is not None else torch.ones(
        E, dtype=value_dtype(None, dtype), device=src.device)
    ops = {}
    if torch.compiler.is_compiling():
        for r in sorted(relations):
            # static shapes: every edge, weighted zero outside relation r
            m = (et == r).to(w.dtype)
            ops[r] = SparseOperator(src, dst, relation_values(src, dst, w * m, M, N,
                                                              normalization), M, N)
        return ops
    # the edges grouped by relation once (a stable sort keeps each relation's edge order):
    # one pass for thousands of relations, not a comparison of every edge per relation
    order = torch.argsort(et, stable=True)
    src, dst, et, w = src[order], dst[order], et[order], w[order]
    bounds = torch.searchsorted(et, torch.tensor(sorted(relations), dtype=et.dtype,
                                                 device=et.device), side="left")
    ends = torch.searchsorted(et, torch.tensor(sorted(relations), dtype=et.dtype,
                                               device=et.device), side="right")
    for r, a, b in zip(sorted(relations), bounds.tolist(), ends.tolist()):
        s_r, d_r, w_r = src[a:b], dst[a:b], w[a:b]
        ops[r] = SparseOperator(s_r, d_r, relation_values(s_r, d_r, w_r, M, N, normalization),
                                M, N)
    return ops


def _named_sorts(sorts, relations, num_relations, edge_type):
    """(sorts as id tuples, num_relations) where sorts or ``relations`` use names."""
    if relations is not None:
        if num_relations is not None and num_relations != len(relations):
            raise ValueError(f"relations names {len(relations)} relations but num_relations="
                             f"{num_relations}")
        num_relations = len(relations)
    if sorts is not None and (relations is not None or any(
            isinstance(s, str) or (isinstance(s, (tuple, list)) and
                                   any(isinstance(r, str) for r in s)) for s in sorts)):
        R = num_relations if num_relations is not None else infer_num_relations(edge_type)
        return parse_sorts(sorts, relations, R), R
    return sorts, num_relations


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
    ``(num_sources, num_targets)`` pair (bipartite, 1-sorts only). Without ``num_relations``
    the relations are the edge types present; a sort naming another id is an error.
    """
    M, N = pair_nodes(num_nodes)
    check_edges(edge_index, M, N, edge_weight=edge_weight)
    check_edge_type(edge_type, edge_index.shape[1])
    check_norm(normalization, (None, "mean", "sym"), "relational")
    sorts, num_relations = _named_sorts(sorts, relations, num_relations, edge_type)
    num_relations = infer_num_relations(edge_type, num_relations)
    norm_sorts = check_sorts(sorts, num_relations, identity, M, N)
    opts = ("relational", M, N, tuple(norm_sorts), normalization, bool(identity),
            num_relations, dtype)

    def build():
        ops = relation_operators(edge_index, edge_type, {r for s in norm_sorts for r in s}, M,
                                 N, edge_weight, normalization, dtype)
        return RelationalBasis(ops, norm_sorts, identity, M, N, num_relations)

    return cached(cache, (edge_index, edge_type, edge_weight), opts, build)

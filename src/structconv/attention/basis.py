"""Attention bases: A_k = a(x', y'; Ξ_k) computed from auxiliary inputs, usable by ``sc.convolve``.

* ``AttentionBasis``       dense weights (B, K, M, N) from any mechanism (small M, N).
* ``DotProductAttention``  softmax(k qᵀ / sqrt(D) + H) applied through
  ``torch.nn.functional.scaled_dot_product_attention`` (never builds M x N unless asked).
* ``GraphAttention``       attention restricted to a graph: per-edge weights (E, K), applied by a
  sparse kernel in O(E) memory.
* ``shift_basis``, ``CausalShift``  index-based shift heads for mixing with attention heads
  (``sc.basis.Shift``).

An attention basis may carry a batch dimension B (one basis per batch item, since it is computed
from the batch's content); its ``propagate*`` then take bundles with the same B (or B = 1 bases
apply to every item).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_index_tensor, floating, int_in, number_in
from ..basis.base import Basis
from ..basis.shift import Shift
from ..sparse import SparseMatrix
from .masks import dead_columns, edge_softmax

__all__ = ["AttentionBasis", "DotProductAttention", "GraphAttention", "GraphStructure",
           "shift_basis", "CausalShift"]


def _check_z(basis: Basis, z: Tensor, batch: int) -> None:
    if z.dim() != 4 or z.shape[1] != basis.M or z.shape[2] != basis.K:
        raise ValueError(f"{type(basis).__name__}.propagate_heads expects z (B, M={basis.M}, "
                         f"K={basis.K}, C), got shape {tuple(z.shape)}")
    if batch != 1 and z.shape[0] != batch:
        raise ValueError(f"{type(basis).__name__} was computed for a batch of {batch} but z has "
                         f"batch {z.shape[0]} (shape {tuple(z.shape)})")


class _Batched(Basis):
    """Shared helpers of bases that carry a batch dimension."""

    batch: int = 1

    def propagate(self, x: Tensor) -> Tensor:
        B, M, C = x.shape
        return self.propagate_heads(x.unsqueeze(2).expand(B, M, self.K, C))

    def _dense_out(self, A: Tensor) -> Tensor:
        # (B, K, M, N): the contract's (K, M, N) when the basis has a single batch item
        return A[0] if A.shape[0] == 1 else A


# ------------------------------------------------------------------------------------------------
class AttentionBasis(_Batched):
    """A basis given by dense attention weights A (K, M, N) or (B, K, M, N); differentiable."""

    def __init__(self, weights: Tensor):
        if not isinstance(weights, Tensor) or weights.dim() not in (3, 4):
            got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
            raise ValueError(f"AttentionBasis needs weights (K, M, N) or (B, K, M, N), got {got}")
        floating(weights, "AttentionBasis: weights")
        A = weights if weights.dim() == 4 else weights.unsqueeze(0)
        super().__init__(*A.shape[1:])
        self.A, self.batch = A, A.shape[0]

    @classmethod
    def from_mechanism(cls, mechanism, x1: Tensor, x2: Tensor) -> AttentionBasis:
        """The dense basis ``mechanism(x1, x2)`` (see ``sc.attention.attention_basis``)."""
        return cls(mechanism(x1, x2))

    def to_dense(self):
        return self._dense_out(self.A)

    def propagate_heads(self, z):
        _check_z(self, z, self.batch)
        out = self.A.transpose(-1, -2).to(z.dtype) @ z.transpose(1, 2)  # (B, K, N, C)
        return out.transpose(1, 2)

    def propagate_sum(self, z):
        _check_z(self, z, self.batch)
        B, M, K, C = z.shape
        At = self.A.to(z.dtype).permute(0, 3, 2, 1).reshape(self.batch, self.N, M * K)
        return At @ z.reshape(B, M * K, C)


# ------------------------------------------------------------------------------------------------
def _check_dot_inputs(query, key, mask, sdpa_mask, dropout_p) -> None:
    """``DotProductAttention``'s arguments, before anything is computed from them."""
    if not isinstance(query, Tensor) or not isinstance(key, Tensor) or query.dim() != 4 \
            or key.dim() != 4:
        raise ValueError("DotProductAttention needs query (B, K, N, D) and key (B, K, M, D)")
    floating(query, "DotProductAttention: query")
    floating(key, "DotProductAttention: key")
    if query.dtype != key.dtype:
        raise TypeError(f"DotProductAttention: query and key must share a dtype, got "
                        f"{query.dtype} and {key.dtype}")
    if not number_in(dropout_p, 0.0, 1.0, open_hi=True):
        raise ValueError(f"DotProductAttention: dropout_p must be a probability in [0, 1), got "
                         f"{dropout_p!r}")
    if mask is not None and sdpa_mask is not None:
        raise ValueError("give mask (paper orientation) or sdpa_mask, not both")
    for name, m in (("mask", mask), ("sdpa_mask", sdpa_mask)):
        if m is not None and (not isinstance(m, Tensor) or m.dim() < 2 or not (
                m.dtype == torch.bool or m.is_floating_point())):
            got = f"{m.dtype} {tuple(m.shape)}" if isinstance(m, Tensor) else type(m).__name__
            raise TypeError(f"DotProductAttention: {name} must be a bool (True = allowed) or "
                            f"floating (additive) tensor of at least 2 dims, got {got}")


class DotProductAttention(_Batched):
    """A_k = softmax over inputs of (key_k query_kᵀ · scale + H), applied with SDPA.

    ``query`` (B, K, N, D) and ``key`` (B, K, M, D) are the projected auxiliary inputs (y' Λ_query
    and x' Λ_key); ``mask`` is a log-domain (0 / -inf, or any additive float) or bool (True =
    allowed) mask broadcastable to (B, K, M, N) in the paper's orientation; ``causal`` allows
    input m on output n iff m <= n; ``sdpa_mask`` gives the mask already in SDPA's orientation
    (.., N, M) instead. ``scale`` defaults to 1/sqrt(D). Columns that are entirely masked are
    zero (the output there is 0, and so is its gradient), never NaN; ``check_dead=False`` skips
    looking for them (one pass over the mask) where the caller knows every output keeps an
    input, e.g. a mask of finite position scores, causal or not.
    """

    def __init__(self, query: Tensor, key: Tensor, mask: Tensor | None = None, *,
                 causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
                 sdpa_mask: Tensor | None = None, check_dead: bool = True):
        _check_dot_inputs(query, key, mask, sdpa_mask, dropout_p)
        Bq, K, N, D = query.shape
        Bk, Kk, M, Dk = key.shape
        if K != Kk or D != Dk or (Bq != Bk and 1 not in (Bq, Bk)):
            raise ValueError(f"DotProductAttention: query {tuple(query.shape)} (B, K, N, D) and "
                             f"key {tuple(key.shape)} (B, K, M, D) disagree on B, K or D")
        super().__init__(K, M, N)
        if mask is not None:
            sdpa_mask = mask.transpose(-1, -2)
        if sdpa_mask is not None:
            if sdpa_mask.dim() > 4:
                raise ValueError(f"mask must broadcast to (B, K, M, N), got {tuple(mask.shape)}")
            while sdpa_mask.dim() < 4:
                sdpa_mask = sdpa_mask.unsqueeze(0)
            try:
                torch.broadcast_shapes(sdpa_mask.shape, (max(Bq, Bk), K, N, M))
            except RuntimeError:
                raise ValueError(
                    f"mask of shape {tuple(sdpa_mask.transpose(-1, -2).shape)} (paper "
                    f"orientation) does not broadcast to (B, K, M, N)=({max(Bq, Bk)}, {K}, {M}, "
                    f"{N})") from None
            if sdpa_mask.dtype != torch.bool:
                sdpa_mask = sdpa_mask.to(query.dtype)
        if causal and sdpa_mask is not None:
            # SDPA takes either a mask or the causal flag: fold the causal mask in
            allowed = torch.ones(N, M, dtype=torch.bool, device=query.device).tril()
            if sdpa_mask.dtype == torch.bool:
                sdpa_mask = sdpa_mask & allowed
            else:
                sdpa_mask = sdpa_mask.masked_fill(~allowed, float("-inf"))
            causal = False
        self.query, self.key = query, key
        self.batch = max(Bq, Bk)
        self.causal, self.dropout_p = bool(causal), float(dropout_p)
        self.scale = 1.0 / D ** 0.5 if scale is None else float(scale)
        self.dead = None
        if sdpa_mask is not None and check_dead:
            dead = dead_columns(sdpa_mask, -1)  # (.., N, 1): queries with no allowed key
            # (whether any is dead needs the data: a compiled graph and a shape-only (meta)
            # call keep the fix, which changes nothing where no query is dead)
            if torch.compiler.is_compiling() or dead.device.type == "meta" or \
                    bool(dead.any()):
                # unmask those rows for the kernel (finite, gradient-safe) and zero them after
                self.dead = dead
                sdpa_mask = sdpa_mask | dead if sdpa_mask.dtype == torch.bool else \
                    sdpa_mask.masked_fill(dead, 0.0)
        self.sdpa_mask = sdpa_mask

    def apply_flops(self):
        return float(self.K * self.M * self.N)

    def _qk(self, B: int) -> tuple[Tensor, Tensor]:
        q, k = self.query, self.key
        if q.shape[0] != B:
            q = q.expand(B, *q.shape[1:])
        if k.shape[0] != B:
            k = k.expand(B, *k.shape[1:])
        return q, k

    def propagate_heads(self, z):
        _check_z(self, z, self.batch)
        B = max(z.shape[0], self.batch)
        if z.shape[0] != B:
            z = z.expand(B, *z.shape[1:])
        q, k = self._qk(B)
        v = z.transpose(1, 2)  # (B, K, M, C): SDPA's values are the bundle's head slices
        out = F.scaled_dot_product_attention(
            q, k, v.to(q.dtype), attn_mask=self.sdpa_mask, dropout_p=self.dropout_p,
            is_causal=self.causal, scale=self.scale)
        if self.dead is not None:
            out = out.masked_fill(self.dead, 0.0)
        return out.transpose(1, 2)

    def _logits(self) -> Tensor:
        # scores with the kernel's mask (dead rows unmasked), SDPA orientation (B, K, N, M)
        s = (self.query * self.scale) @ self.key.transpose(-1, -2)
        if self.causal:
            allowed = torch.ones(self.N, self.M, dtype=torch.bool, device=s.device).tril()
            s = s.masked_fill(~allowed, float("-inf"))
        m = self.sdpa_mask
        if m is not None:
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
        return s

    def scores(self) -> Tensor:
        """Pre-softmax scores in SDPA orientation (B, K, N, M), masks added (-inf masked)."""
        s = self._logits()
        return s if self.dead is None else s.masked_fill(self.dead, float("-inf"))

    def weights(self, average: bool = False) -> Tensor:
        """Attention probabilities in SDPA orientation (B, K, N, M), or their mean over heads
        (B, N, M) with ``average``; dead queries are zero rows.

        Computed in row blocks that stay in cache (never several B x K x N x M temporaries);
        differentiable in query and key (the backward pass recomputes the blocks).
        """
        return _BlockAttention.apply(self.query, self.key, None, self.sdpa_mask, self.dead,
                                     self.causal, self.scale, bool(average))[0]

    def propagate_heads_and_weights(self, z: Tensor, average: bool = False):
        """(``propagate_heads(z)``, ``weights(average)``) computed together.

        On CPU the fused attention kernel gives the output and each row's log-sum-exp, and the
        weights are then built block by block with one GEMM and one exp each; elsewhere each
        block of probabilities serves both outputs while in cache. The B x K x N x M scores are
        never built (only the returned weights are).
        """
        _check_z(self, z, self.batch)
        if self.dropout_p > 0:  # the kernel's dropout on the output; weights before dropout
            return self.propagate_heads(z), self.weights(average)
        B = max(z.shape[0], self.batch)
        if z.shape[0] != B:
            z = z.expand(B, *z.shape[1:])
        q, k = self._qk(B)
        v = z.transpose(1, 2).to(q.dtype)
        m = self.sdpa_mask
        op = _flash_cpu()
        if op is not None and q.device.type == "cpu" and v.shape[-1] == q.shape[-1] and \
                (m is None or m.dtype == q.dtype):
            # the fused kernel gives the output and each row's log-sum-exp; the weights are
            # then one GEMM and one exp per block
            out, lse = op(q, k, v, 0.0, self.causal, attn_mask=m, scale=self.scale)
            if self.dead is not None:
                out = out.masked_fill(self.dead, 0.0)
            w = _BlockAttention.apply(q, k, None, m, self.dead, self.causal, self.scale,
                                      bool(average), lse.detach())[0]
            return out.transpose(1, 2), w
        w, out = _BlockAttention.apply(q, k, v, m, self.dead, self.causal, self.scale,
                                       bool(average))
        return out.transpose(1, 2), w

    def to_dense(self):
        return self._dense_out(self.weights().transpose(-1, -2))


#: elements of one block of scores (K x rows x M) in ``weights``: small enough to stay in cache
BLOCK_ELEMENTS = 2**21


def _blocks(q: Tensor, k: Tensor, mask, dead, causal: bool, scale: float, lse=None):
    """Yield (b, row slice, probabilities (K, rows, M)) for every row block of every item.

    With ``lse`` (B, K, N), each row's log-sum-exp from the attention kernel, a block's
    probabilities are exp(score - lse) instead of a softmax.
    """
    B = max(q.shape[0], k.shape[0])
    K, N, M = q.shape[1], q.shape[2], k.shape[2]
    rows = max(1, min(N, BLOCK_ELEMENTS // max(1, K * M)))
    qs = q * scale
    if lse is not None:
        # fold "- lse" into the GEMM: [q·scale, -lse] · [k, 1]ᵀ = q kᵀ·scale - lse, so a block
        # needs a single exp pass after its GEMM
        qs = torch.cat([qs, -lse.unsqueeze(-1).to(qs.dtype)], -1)
        k = torch.cat([k, k.new_ones(*k.shape[:-1], 1)], -1)
    for b in range(B):
        qb = qs[b if q.shape[0] > 1 else 0]
        kt = k[b if k.shape[0] > 1 else 0].transpose(-1, -2)
        mb = None if mask is None else mask[b if mask.shape[0] > 1 else 0]
        db = None if dead is None else dead[b if dead.shape[0] > 1 else 0]
        for r0 in range(0, N, rows):
            sl = slice(r0, min(N, r0 + rows))
            if mb is not None and mb.dtype != torch.bool:
                a = torch.baddbmm(mb[:, sl].expand(K, -1, -1), qb[:, sl], kt)
            else:
                a = qb[:, sl] @ kt
                if mb is not None:
                    a.masked_fill_(~mb[:, sl], float("-inf"))
            if causal:
                n = torch.arange(sl.start, sl.stop, device=a.device).unsqueeze(1)
                a.masked_fill_(torch.arange(M, device=a.device) > n, float("-inf"))
            a = torch.softmax(a, -1) if lse is None else a.exp_()
            if db is not None:
                a.masked_fill_(db[:, sl], 0.0)
            yield b, sl, a


def _head_mean(a: Tensor, out: Tensor) -> None:
    # (K, rows, M) -> (rows, M) into a contiguous ``out``: a GEMV with 1/K weights is one pass
    # (mean is three on CPU)
    K = a.shape[0]
    w = torch.full((1, K), 1.0 / K, dtype=a.dtype, device=a.device)
    torch.mm(w, a.reshape(K, -1), out=out.view(1, -1))


def _flash_cpu():
    # torch's CPU flash kernel (behind SDPA) also returns each row's log-sum-exp
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


class _BlockAttention(torch.autograd.Function):
    """(probabilities @ v, probabilities or their head mean), built block by block.

    q (B, K, N, D), k (B, K, M, D), v (B, K, M, C) or None (weights only). The backward pass
    recomputes each block (like flash attention) and takes gradients from both outputs.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, dead, causal, scale, average, lse=None):
        # per-head slices of a packed projection are strided: BLAS batched GEMMs want them dense
        q, k = q.contiguous(), k.contiguous()
        v = None if v is None else v.contiguous()
        B = max(q.shape[0], k.shape[0])
        K, N, M = q.shape[1], q.shape[2], k.shape[2]
        w = torch.empty((B, N, M) if average else (B, K, N, M), dtype=q.dtype, device=q.device)
        out = None if v is None else torch.empty(B, K, N, v.shape[-1], dtype=q.dtype,
                                                 device=q.device)
        for b, sl, a in _blocks(q, k, mask, dead, causal, scale, lse):
            if average:
                _head_mean(a, w[b, sl])
            else:
                w[b, :, sl] = a
            if v is not None:
                out[b, :, sl] = a @ v[b]  # (matmul into a strided out= slice is very slow)
        ctx.save_for_backward(q, k, v)
        ctx.rest = (mask, dead, causal, scale, average, lse)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        return (w, out) if v is not None else (w, w.new_empty(0))

    @staticmethod
    def backward(ctx, gw, gout):
        q, k, v = ctx.saved_tensors
        mask, dead, causal, scale, average, lse = ctx.rest
        K = q.shape[1]
        gout = None if gout is None else gout.contiguous()
        gq, gk = torch.zeros_like(q), torch.zeros_like(k)
        gv = None if v is None else torch.zeros_like(v)
        for b, sl, a in _blocks(q, k, mask, dead, causal, scale, lse):
            ga = None
            if gw is not None:
                ga = gw[b, sl].unsqueeze(0) / K if average else gw[b, :, sl]
            if v is not None and gout is not None and gout.numel():
                go = gout[b, :, sl]
                gv[b] += a.transpose(-1, -2) @ go
                gav = go @ v[b].transpose(-1, -2)
                ga = gav if ga is None else ga + gav
            if ga is None:
                continue
            # softmax backward a * (ga - Σ ga a), fused; (K, rows, M)
            ds = torch._softmax_backward_data(ga.expand_as(a).contiguous(), a, -1, a.dtype)
            bq, bk = (b if q.shape[0] > 1 else 0), (b if k.shape[0] > 1 else 0)
            gq[bq, :, sl] += (ds @ k[bk]).mul_(scale)
            gk[bk] += (ds.transpose(-1, -2) @ q[bq, :, sl]).mul_(scale)
        return gq, gk, gv, None, None, None, None, None, None


# ------------------------------------------------------------------------------------------------
class GraphStructure:
    """CSR layouts of a graph's K-head attention operator, built once per graph.

    The operator maps (M*K) rows (m, k) to (N*K) rows (n, k): entry ((n, k), (m, k)) holds the
    weight of edge m -> n for head k. ``gather`` reorders edge-major weights (E*K,) into CSR
    order; the ``t`` variants are the transpose (for the backward pass).
    """

    def __init__(self, edge_index: Tensor, M: int, N: int, K: int):
        check_index_tensor(edge_index, 2, "edge_index")
        for name, v in (("M", M), ("N", N), ("K", K)):
            if not (isinstance(v, torch.SymInt) or int_in(v, 1 if name == "K" else 0, 2**62)):
                raise ValueError(f"GraphStructure: {name} must be an int >= "
                                 f"{1 if name == 'K' else 0}, got {v!r}")
        ei = edge_index.long()
        # (the range check reads the ids: not while compiling, nor on the meta device)
        if ei.numel() and not torch.compiler.is_compiling() and ei.device.type != "meta" and \
                (int(ei.min()) < 0 or int(ei[0].max()) >= M or int(ei[1].max()) >= N):
            raise ValueError(f"edge_index has node ids outside [0, {M}) x [0, {N}) "
                             f"(sources < M={M}, targets < N={N})")
        self.edge_index, self.M, self.N, self.K = ei, M, N, K
        self.E = ei.shape[1]
        self._layouts = None

    def _apply(self, fn) -> GraphStructure:
        """The same structure with ``fn`` applied to its edges (how a basis moves it)."""
        return GraphStructure(fn(self.edge_index), self.M, self.N, self.K)

    def _csr_layouts(self):
        # built on the first eager use (a compiled graph applies the entries directly)
        if self._layouts is None:
            ei, M, N, K = self.edge_index, self.M, self.N, self.K
            self._layouts = (self._layout(ei[1], ei[0], N, M, K),
                             self._layout(ei[0], ei[1], M, N, K))
        return self._layouts

    @property
    def gather(self) -> Tensor:
        return self._csr_layouts()[0][2]

    def entries(self, alpha: Tensor) -> SparseMatrix:
        """The (N*K, M*K) operator of edge-major weights ``alpha`` (E*K,) as COO entries: row
        (n, k), column (m, k) for edge m -> n and head k."""
        src, dst = self.edge_index
        k = torch.arange(self.K, device=src.device)
        rows = (dst.unsqueeze(1) * self.K + k).reshape(-1)
        cols = (src.unsqueeze(1) * self.K + k).reshape(-1)
        return SparseMatrix(rows, cols, alpha, (self.N * self.K, self.M * self.K))

    @staticmethod
    def _layout(rows: Tensor, cols: Tensor, R: int, C: int, K: int):
        E, dev = rows.shape[0], rows.device
        order = torch.argsort(rows * C + cols, stable=True)
        r, c = rows[order], cols[order]
        deg = torch.bincount(rows, minlength=R)
        start = torch.cumsum(deg, 0) - deg
        j = torch.arange(E, device=dev) - start[r]  # position of the edge within its row
        k = torch.arange(K, device=dev)
        # row (n, k) starts at K*start[n] + k*deg[n] and holds the row's edges in column order
        pos = (K * start[r]).unsqueeze(1) + k * deg[r].unsqueeze(1) + j.unsqueeze(1)
        pos = pos.reshape(-1)
        gather = torch.empty(E * K, dtype=torch.long, device=dev)
        gather[pos] = (order.unsqueeze(1) * K + k).reshape(-1)
        col = torch.empty(E * K, dtype=torch.long, device=dev)
        col[pos] = (c.unsqueeze(1) * K + k).reshape(-1)
        crow = torch.zeros(R * K + 1, dtype=torch.long, device=dev)
        crow[1:] = torch.cumsum(deg.repeat_interleave(K), 0)
        return crow, col, gather

    def csr(self, values: Tensor, transpose: bool = False) -> Tensor:
        """The operator (N*K, M*K) (or its transpose) with edge-major weights ``values`` (E*K,)."""
        (crow, col, gather), (crow_t, col_t, gather_t) = self._csr_layouts()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # CSR is flagged beta; SpMM is stable
            if transpose:
                return torch.sparse_csr_tensor(crow_t, col_t, values[gather_t],
                                               (self.M * self.K, self.N * self.K))
            return torch.sparse_csr_tensor(crow, col, values[gather],
                                           (self.N * self.K, self.M * self.K))


class _EdgeSpMM(torch.autograd.Function):
    """Y (N*K, C) = S(alpha) @ Z (M*K, C) for the graph operator S with per-edge-head weights."""

    @staticmethod
    def forward(ctx, alpha, Z, st):
        ctx.st = st
        ctx.save_for_backward(alpha, Z)
        return st.csr(alpha) @ Z

    @staticmethod
    def backward(ctx, G):
        alpha, Z = ctx.saved_tensors
        st = ctx.st
        G = G.contiguous()
        ga = gz = None
        if ctx.needs_input_grad[1]:
            gz = st.csr(alpha, transpose=True) @ G
        if ctx.needs_input_grad[0]:
            # dL/dalpha[e, k] = <G[(n, k)], Z[(m, k)]>: the sampled product on S's pattern
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                vals = torch.sparse.sampled_addmm(st.csr(alpha.detach()), G, Z.t(),
                                                  beta=0.0).values()
            ga = torch.empty_like(alpha)
            ga[st.gather] = vals
        return ga, gz, None


class GraphAttention(_Batched):
    """Attention restricted to a graph: A_k[m, n] = alpha[e, k] for each edge e = (m -> n).

    ``alpha`` (E, K) or (B, E, K) are the normalised per-edge weights (duplicate edges add up);
    ``from_scores`` builds them by a softmax over each target's incoming edges. Applied with a
    CSR kernel in O(E*K) memory, never M x N. ``probabilities`` (same shape) are the weights
    before any dropout (default ``alpha``), what a layer reports as its attention weights;
    both are held as (B, E, K).
    """

    cost_kernel = "graph_attention"

    def __init__(self, edge_index: Tensor, alpha: Tensor, M: int, N: int | None = None, *,
                 structure: GraphStructure | None = None, probabilities: Tensor | None = None):
        N = M if N is None else N
        if not isinstance(alpha, Tensor) or alpha.dim() not in (2, 3):
            raise ValueError("GraphAttention needs alpha (E, K) or (B, E, K)")
        floating(alpha, "GraphAttention: alpha")
        a = alpha if alpha.dim() == 3 else alpha.unsqueeze(0)
        K = a.shape[2]
        super().__init__(K, M, N)
        if structure is None:
            structure = GraphStructure(edge_index, M, N, K)
        elif (structure.M, structure.N, structure.K) != (M, N, K):
            raise ValueError("GraphAttention: structure was built for another (M, N, K)")
        if structure.edge_index.device != a.device:
            raise ValueError(f"GraphAttention: edge_index is on {structure.edge_index.device} "
                             f"but alpha on {a.device}: put both on one device")
        if a.shape[1] != structure.E:
            raise ValueError(f"GraphAttention: alpha {tuple(alpha.shape)} needs E={structure.E} "
                             f"edges to match edge_index (2, {structure.E})")
        self.structure, self.alpha, self.batch = structure, a, a.shape[0]
        if probabilities is None:
            probabilities = a
        elif tuple(probabilities.shape[-2:]) != tuple(a.shape[-2:]):
            raise ValueError(f"GraphAttention: probabilities {tuple(probabilities.shape)} must "
                             f"match alpha {tuple(alpha.shape)}")
        # (B, E, K) like alpha
        self.probabilities = probabilities if probabilities.dim() == 3 else \
            probabilities.unsqueeze(0)

    @classmethod
    def from_scores(cls, edge_index: Tensor, scores: Tensor, M: int, N: int | None = None, *,
                    structure: GraphStructure | None = None) -> GraphAttention:
        """Softmax over inputs of per-edge scores (E, K) or (B, E, K) (-inf = masked edge)."""
        N = M if N is None else N
        check_index_tensor(edge_index, 2, "edge_index")
        alpha = edge_softmax(scores, edge_index[1].long(), N)
        return cls(edge_index, alpha, M, N, structure=structure)

    @property
    def edge_index(self) -> Tensor:
        return self.structure.edge_index

    def apply_flops(self):
        return float(max(1, self.structure.E) * self.K)

    def to_dense(self):
        src, dst = self.structure.edge_index
        K, M, N = self.shape
        # (E, K) positions in a flattened (K, M, N) block; duplicate edges add up
        flat = ((torch.arange(K, device=self.device) * (M * N)).unsqueeze(0)
                + (src * N + dst).unsqueeze(1)).reshape(-1)
        zero = torch.zeros(K * M * N, dtype=self.dtype, device=self.device)
        out = torch.stack([zero.index_add(0, flat, self.alpha[b].reshape(-1))
                           for b in range(self.batch)]).reshape(self.batch, K, M, N)
        return self._dense_out(out)

    def propagate_heads(self, z):
        _check_z(self, z, self.batch)
        B, M, K, C = z.shape
        st = self.structure
        if st.E == 0:
            return z.new_zeros(B, self.N, K, C)
        if z.device.type == "meta":
            return z.new_empty(B, self.N, K, C)  # shape inference: the sparse kernels need ids
        alpha = self.alpha.to(z.dtype)
        if torch.compiler.is_compiling():
            # the one sparse operator's traceable path on the same entries (differentiable in
            # alpha through the gather)
            outs = [st.entries(alpha[min(b, self.batch - 1)].reshape(-1)).matmul(
                z[b].reshape(M * K, C)) for b in range(B)]
            return torch.stack(outs).reshape(B, self.N, K, C)
        if self.batch == 1:
            # all items share the weights: one SpMM with the batch folded into the columns
            Z = z.permute(1, 2, 0, 3).reshape(M * K, B * C)
            Y = _EdgeSpMM.apply(alpha[0].reshape(-1), Z, st)  # (N*K, B*C)
            return Y.reshape(self.N, K, B, C).permute(2, 0, 1, 3)
        outs = [_EdgeSpMM.apply(alpha[b].reshape(-1), z[b].reshape(M * K, C), st)
                for b in range(B)]
        return torch.stack(outs).reshape(B, self.N, K, C)

    def propagate_edges(self, values: Tensor, nodes: Tensor | None = None) -> Tensor:
        """Per-edge messages (E, K, C) (or (B, E, K, C)) weighted and summed into their targets:
        out[b, n, k] = Σ_{e = m -> n} alpha[e, k] · (values[e, k] + nodes[m, k]), (B, N, K, C).

        The edge-valued counterpart of ``propagate_heads`` (messages that depend on the edge,
        e.g. TransformerConv's edge features added to the values); ``nodes`` (M, K, C) /
        (B, M, K, C) adds ``propagate_heads(nodes)`` in the same pass (one gather, one
        scatter: cheaper than the two products when the edge messages are needed anyway).
        """
        E, K = self.structure.E, self.K
        if values.dim() not in (3, 4) or tuple(values.shape[-3:-1]) != (E, K):
            raise ValueError(f"GraphAttention.propagate_edges expects values (E={E}, K={K}, C) "
                             f"or (B, E, K, C), got {tuple(values.shape)}")
        src, dst = self.structure.edge_index
        v = values
        if nodes is not None:
            if nodes.dim() not in (3, 4) or tuple(nodes.shape[-3:]) != (self.M, K, v.shape[-1]):
                raise ValueError(f"GraphAttention.propagate_edges: nodes must be (M={self.M}, "
                                 f"K={K}, C={v.shape[-1]}) or batched, got {tuple(nodes.shape)}")
            v = v + nodes.index_select(-3, src)
        # one item and one set of weights: work on (E, K, C) along dim 0 (index_add on a
        # leading batch dim of 1 is ~30% slower)
        alpha = self.alpha[0] if (self.batch == 1 and v.dim() == 3) else self.alpha
        w = alpha.to(v.dtype).unsqueeze(-1) * v  # (E, K, C) or (B, E, K, C)
        out = w.new_zeros(*w.shape[:-3], self.N, K, w.shape[-1])
        out = out.index_add_(-3, dst, w)
        return out if out.dim() == 4 else out.unsqueeze(0)


# ------------------------------------------------------------------------------------------------
def shift_basis(length: int, shifts: Sequence[int] = (1,), *, dtype=None, device=None) -> Shift:
    """Index-based heads: A_s[m, n] = 1 iff m = n - s, for each shift s (a 1-d grid's shifts).

    A positive s brings the entry s steps before (causal), a negative one an entry after;
    K = len(shifts), M = N = length: ``sc.basis.Shift(length, shifts, causal=False)`` (on
    ``dtype`` / ``device`` where given).
    """
    if not (isinstance(length, torch.SymInt) or int_in(length, 1, 2**62)) or \
            not isinstance(shifts, Sequence) or \
            not all(int_in(s, -2**62, 2**62) for s in shifts):
        raise ValueError(f"shift_basis needs an int length >= 1 and a list of int shifts, got "
                         f"length={length!r}, shifts={shifts!r}")
    shifts = [int(s) for s in shifts]
    if length < 1 or not shifts:
        raise ValueError(f"shift_basis needs length >= 1 and at least one shift, got "
                         f"length={length}, shifts={shifts}")
    out = Shift(length, shifts, causal=False)
    return out if dtype is None and device is None else out.to(device=device, dtype=dtype)


class CausalShift(Shift):
    """Causal shift heads: ``sc.basis.Shift(length, shifts, causal=True, past=past)``,
    A_s[m, n] = 1 iff m = n + past − shifts[s]; (S, past + L, L). Output n (of L) reads input
    n + past − shift_s: with ``past = 0`` input and output are the same sequence (zero before
    the start); with ``past = R`` the first R inputs are cached entries before the L outputs
    (generation)."""

    def __init__(self, length: int, shifts: Sequence[int], past: int = 0):
        super().__init__(length, shifts, causal=True, past=past)

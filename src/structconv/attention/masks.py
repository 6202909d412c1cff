"""Masks in log domain (0 = allowed, -inf = masked) and the softmaxes that never give NaN.

Orientation follows the paper: a mask H is (M, N) (or broadcastable to (B, K, M, N)) and
H[m, n] = -inf forbids input entry m from acting on output entry n. torch's attention masks are
the transpose, (L, S) = (N, M) [query, key]; ``from_torch_mask`` converts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_index_tensor

__all__ = ["log_mask", "causal_mask", "padding_mask", "graph_mask", "from_torch_mask",
           "masked_softmax", "softmax_inputs", "softmax_outputs", "edge_softmax", "dead_columns"]

NEG_INF = float("-inf")


def log_mask(allowed: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """0 where ``allowed`` (a bool tensor) is True, -inf elsewhere; same shape."""
    if not isinstance(allowed, Tensor) or allowed.dtype != torch.bool:
        raise TypeError(f"log_mask expects a bool tensor, got "
                        f"{getattr(allowed, 'dtype', type(allowed).__name__)}")
    dtype = dtype or torch.get_default_dtype()
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, NEG_INF)


def causal_mask(M: int, N: int | None = None, *, offset: int = 0, dtype=None,
                device=None) -> Tensor:
    """(M, N) log mask allowing input m on output n iff m <= n + offset (no look-ahead)."""
    N = M if N is None else N
    if M < 1 or N < 1:
        raise ValueError(f"causal_mask needs M, N >= 1, got M={M}, N={N}")
    m = torch.arange(M, device=device).unsqueeze(1)
    n = torch.arange(N, device=device).unsqueeze(0)
    return log_mask(m <= n + offset, dtype)


def padding_mask(padded: Tensor, dtype=None) -> Tensor:
    """(B, M) bool, True at padding entries -> (B, 1, M, 1) log mask over inputs."""
    if not isinstance(padded, Tensor) or padded.dtype != torch.bool or padded.dim() != 2:
        raise ValueError(f"padding_mask expects a (B, M) bool tensor, got "
                         f"{getattr(padded, 'dtype', None)} {tuple(getattr(padded, 'shape', ()))}")
    return log_mask(~padded, dtype)[:, None, :, None]


def graph_mask(edge_index: Tensor, M: int, N: int | None = None, dtype=None) -> Tensor:
    """Dense (M, N) log mask of a graph: 0 on edges m -> n, -inf elsewhere (small graphs only)."""
    check_index_tensor(edge_index, 2, "graph_mask edge_index")
    N = M if N is None else N
    if edge_index.numel() and (int(edge_index[0].max()) >= M or int(edge_index[1].max()) >= N
                               or int(edge_index.min()) < 0):
        raise ValueError(f"graph_mask: edge_index has node ids outside [0, {M}) x [0, {N})")
    allowed = torch.zeros(M, N, dtype=torch.bool, device=edge_index.device)
    allowed[edge_index[0], edge_index[1]] = True
    return log_mask(allowed, dtype)


def from_torch_mask(mask: Tensor, dtype=None) -> Tensor:
    """A torch attention mask (.., L, S) (bool True = masked, or additive float) -> (.., M, N)."""
    if mask.dtype == torch.bool:
        mask = log_mask(~mask, dtype)
    return mask.transpose(-1, -2)


def masked_softmax(scores: Tensor, dim: int) -> Tensor:
    """softmax along ``dim`` where a slice that is entirely -inf gives zeros, never NaN.

    A slice holding +inf scores puts its whole mass on them, equally (softmax's limit); its
    gradient is zero there.
    """
    pos = torch.isposinf(scores)
    has_pos = pos.any(dim, keepdim=True)
    # +inf entries would make exp give inf / inf: take them out of the ordinary path (always
    # while compiling, where the test below is data-dependent)
    fix = torch.compiler.is_compiling() or bool(has_pos.any())
    if fix:
        scores = scores.masked_fill(pos, 0.0)
    mx = scores.detach().amax(dim, keepdim=True)
    # an all -inf slice has max -inf: shift by 0 instead, so exp gives exact zeros
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    ex = torch.exp(scores - mx)
    den = ex.sum(dim, keepdim=True)
    out = ex / torch.where(den > 0, den, torch.ones_like(den))
    if not fix:
        return out
    limit = pos.to(out.dtype) / pos.sum(dim, keepdim=True).clamp_min(1).to(out.dtype)
    return torch.where(has_pos, limit, out)


def softmax_inputs(scores: Tensor) -> Tensor:
    """Normalise each column A[.., :, n] (softmax over input entries m, dim -2)."""
    return masked_softmax(scores, -2)


def softmax_outputs(scores: Tensor) -> Tensor:
    """Normalise each row A[.., m, :] (softmax over output entries n, dim -1)."""
    return masked_softmax(scores, -1)


def edge_softmax(scores: Tensor, index: Tensor, num_nodes: int) -> Tensor:
    """Softmax of per-edge scores (.., E, K) over the edges sharing ``index[e]`` (E,).

    O(E) memory; a node whose edges are all -inf (or that has none) gets zeros, never NaN.
    """
    if scores.dim() < 2 or index.dim() != 1 or scores.shape[-2] != index.shape[0]:
        raise ValueError(f"edge_softmax: scores must be (.., E, K) with E={index.shape[0]} "
                         f"edges, got {tuple(scores.shape)}")
    s = scores.movedim(-2, 0)  # (E, .., K)
    E = s.shape[0]
    rest = s.shape[1:]
    idx = index.view(E, *([1] * len(rest))).expand(s.shape)
    mx = torch.full((num_nodes, *rest), NEG_INF, dtype=s.dtype, device=s.device)
    # softmax is shift invariant: the max needs no gradient
    mx = mx.scatter_reduce(0, idx, s.detach(), "amax", include_self=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    ex = torch.exp(s - mx.index_select(0, index))
    den = torch.zeros((num_nodes, *rest), dtype=s.dtype, device=s.device).index_add_(0, index, ex)
    den = torch.where(den > 0, den, torch.ones_like(den))
    return (ex / den.index_select(0, index)).movedim(0, -2)


def dead_columns(mask: Tensor, dim: int = -2) -> Tensor:
    """Bool tensor, True where every entry along ``dim`` of a log mask is -inf (keepdim)."""
    if mask.dtype == torch.bool:  # SDPA's convention: True = may attend
        return ~mask.any(dim, keepdim=True)
    return torch.isneginf(mask).all(dim, keepdim=True)

"""Masks in log domain (0 = allowed, -inf = masked) and the softmaxes that never give NaN.

Orientation follows the paper: a mask H is (M, N) (or broadcastable to (B, K, M, N)) and
H[m, n] = -inf forbids input entry m from acting on output entry n. torch's attention masks are
the transpose, (L, S) = (N, M) [query, key]; ``from_torch_mask`` converts.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import check_index_tensor, floating, int_in

__all__ = ["log_mask", "causal_mask", "padding_mask", "graph_mask", "from_torch_mask",
           "masked_softmax", "softmax_inputs", "softmax_outputs", "edge_softmax", "dead_columns"]

NEG_INF = float("-inf")


def log_mask(allowed: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """0 where ``allowed`` (a bool tensor) is True, -inf elsewhere; same shape."""
    if not isinstance(allowed, Tensor) or allowed.dtype != torch.bool:
        raise TypeError(f"log_mask expects a bool tensor, got "
                        f"{getattr(allowed, 'dtype', type(allowed).__name__)}")
    dtype = _float_dtype(dtype or torch.get_default_dtype(), "log_mask")
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, NEG_INF)


def causal_mask(M: int, N: int | None = None, *, offset: int = 0, dtype=None,
                device=None) -> Tensor:
    """(M, N) log mask allowing input m on output n iff m <= n + offset (no look-ahead)."""
    N = M if N is None else N
    if not (int_in(M, 1, math.inf) and int_in(N, 1, math.inf)):
        raise ValueError(f"causal_mask needs ints M, N >= 1, got M={M!r}, N={N!r}")
    if not int_in(offset, -math.inf, math.inf):
        raise ValueError(f"causal_mask: offset must be an int, got {offset!r}")
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
    if not (int_in(M, 0, math.inf) and int_in(N, 0, math.inf)):
        raise ValueError(f"graph_mask needs ints M, N >= 0 (inputs, outputs), got M={M!r}, "
                         f"N={N!r}")
    # (the range check reads the ids: not on the meta device, which has shapes only)
    if edge_index.numel() and edge_index.device.type != "meta" and (
            int(edge_index[0].max()) >= M or int(edge_index[1].max()) >= N
            or int(edge_index.min()) < 0):
        raise ValueError(f"graph_mask: edge_index has node ids outside [0, {M}) x [0, {N})")
    allowed = torch.zeros(M, N, dtype=torch.bool, device=edge_index.device)
    allowed[edge_index[0], edge_index[1]] = True
    return log_mask(allowed, dtype)


def from_torch_mask(mask: Tensor, dtype=None) -> Tensor:
    """A torch attention mask (.., L, S) (bool True = masked, or additive float) -> (.., M, N)."""
    if not isinstance(mask, Tensor) or mask.dim() < 2:
        got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"from_torch_mask: mask must be a tensor (.., L, S), got {got}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"from_torch_mask: mask must be bool (True = masked) or an additive "
                        f"float mask, got dtype {mask.dtype}")
    if mask.dtype == torch.bool:
        mask = log_mask(~mask, dtype)
    return mask.transpose(-1, -2)


def masked_softmax(scores: Tensor, dim: int) -> Tensor:
    """softmax along ``dim`` where a slice that is entirely -inf gives zeros, never NaN.

    A slice holding +inf scores puts its whole mass on them, equally (softmax's limit); its
    gradient is zero there.
    """
    _scores(scores, dim, "masked_softmax")
    pos = torch.isposinf(scores)
    has_pos = pos.any(dim, keepdim=True)
    # +inf entries would make exp give inf / inf: take them out of the ordinary path (always
    # while compiling and on the meta device, where the test below is data-dependent)
    fix = torch.compiler.is_compiling() or scores.device.type == "meta" or bool(has_pos.any())
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
    _scores(scores, -2, "softmax_inputs")
    return masked_softmax(scores, -2)


def softmax_outputs(scores: Tensor) -> Tensor:
    """Normalise each row A[.., m, :] (softmax over output entries n, dim -1)."""
    _scores(scores, -1, "softmax_outputs")
    return masked_softmax(scores, -1)


def edge_softmax(scores: Tensor, index: Tensor, num_nodes: int) -> Tensor:
    """Softmax of per-edge scores (.., E, K) over the edges sharing ``index[e]`` (E,).

    O(E) memory; a node whose edges are all -inf (or that has none) gets zeros, never NaN.
    """
    floating(scores, "edge_softmax: scores")
    if not isinstance(index, Tensor) or index.dim() != 1 or index.is_floating_point() or \
            index.is_complex() or index.dtype == torch.bool:
        got = f"{index.dtype} {tuple(index.shape)}" if isinstance(index, Tensor) else \
            type(index).__name__
        raise TypeError(f"edge_softmax: index must be an integer tensor (E,) (each edge's "
                        f"node), got {got}")
    if not (isinstance(num_nodes, torch.SymInt) or int_in(num_nodes, 0, math.inf)):
        raise ValueError(f"edge_softmax: num_nodes must be an int >= 0, got {num_nodes!r}")
    if scores.dim() < 2 or scores.shape[-2] != index.shape[0]:
        raise ValueError(f"edge_softmax: scores must be (.., E, K) with E={index.shape[0]} "
                         f"edges, got {tuple(scores.shape)}")
    if index.device != scores.device:
        raise ValueError(f"edge_softmax: index is on {index.device} but scores on "
                         f"{scores.device}: put both on one device")
    index = index.long()
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
    if not isinstance(mask, Tensor) or not (mask.dtype == torch.bool or
                                            mask.is_floating_point()):
        got = getattr(mask, "dtype", type(mask).__name__)
        raise TypeError(f"dead_columns: mask must be a bool or floating log mask, got {got}")
    if not -mask.dim() <= dim < max(1, mask.dim()):
        raise ValueError(f"dead_columns: dim={dim} is not a dim of the mask (shape "
                         f"{tuple(mask.shape)})")
    if mask.dtype == torch.bool:  # SDPA's convention: True = may attend
        return ~mask.any(dim, keepdim=True)
    return torch.isneginf(mask).all(dim, keepdim=True)


def _float_dtype(dtype, who: str) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{who}: dtype must be a floating torch.dtype (a log mask holds -inf), "
                        f"got {dtype!r}")
    return dtype


def _scores(scores, dim, who: str) -> None:
    """Floating scores with a dim ``dim`` (else a TypeError / ValueError naming them)."""
    floating(scores, f"{who}: scores")
    if not isinstance(dim, int) or not -scores.dim() <= dim < scores.dim():
        raise ValueError(f"{who}: dim={dim!r} is not a dim of the scores (shape "
                         f"{tuple(scores.shape)})")

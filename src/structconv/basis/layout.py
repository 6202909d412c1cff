"""Column layouts of bundles for sparse products: a (B, M, C) bundle as one (M, B*C) matrix.

A sparse operator multiplies one dense matrix at a time; folding the batch into the columns lets
one SpMM serve every item (and every head, for per-head inputs). Shared by the graph bases and
their restrictions to sampled blocks.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["cols", "uncols", "uncols_heads", "heads"]


def cols(x: Tensor) -> Tensor:
    """(B, M, C) -> (M, B*C), a free view when B == 1 (squeeze, whose backward is free too)."""
    B, M, C = x.shape
    return x.squeeze(0) if B == 1 else x.permute(1, 0, 2).reshape(M, B * C)


def uncols(Y: Tensor, B: int) -> Tensor:
    """(N, B*C) -> (B, N, C)."""
    N = Y.shape[0]
    return Y.unsqueeze(0) if B == 1 else Y.reshape(N, B, -1).transpose(0, 1)


def uncols_heads(Ys: list[Tensor], B: int) -> Tensor:
    """K blocks (N, B*C) -> (B, N, K, C)."""
    out = torch.stack(Ys, 1)  # (N, K, B*C)
    N, K, BC = out.shape
    if B == 1:
        return out.unsqueeze(0)
    return out.reshape(N, K, B, BC // B).permute(2, 0, 1, 3)


def heads(z: Tensor) -> list[Tensor]:
    """(B, M, K, C) -> K blocks (M, B*C).

    ``unbind`` (a view per head, one stack in backward) rather than K ``select``s, whose
    backward would zero-fill and add K copies of the whole of z.
    """
    if z.shape[2] == 1:
        return [cols(z.squeeze(2))]
    return [cols(h) for h in z.unbind(2)]

"""Dropout that draws random numbers only for the nonzero entries of a mostly-zero input."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import floating

__all__ = ["SparseDropout", "sparse_dropout"]

#: above this share of nonzero entries the plain F.dropout is as fast
DENSE_SHARE = 0.25


def sparse_dropout(x: Tensor, p: float, training: bool = True,
                   nonzero: Tensor | None = None) -> Tensor:
    """Dropout of x (any shape) drawing one random number per nonzero entry.

    Zeros stay zero under dropout, so drawing for the nonzeros only has the same distribution
    as ``F.dropout``; on bag-of-words features (Cora: 1.3 % nonzero) it is ~10x faster on CPU.
    ``nonzero``: the flat positions of x's nonzeros when already known (a fixed input: then
    the sparse draw is always taken); otherwise inputs denser than ``DENSE_SHARE`` take
    ``F.dropout``, which is as fast there.
    """
    if not training or not p:
        return x
    flat = x.reshape(-1)
    idx = flat.nonzero().squeeze(1) if nonzero is None else nonzero
    if nonzero is None and idx.numel() > DENSE_SHARE * flat.numel():
        return F.dropout(x, p, True)
    keep = torch.rand(idx.numel(), dtype=x.dtype, device=x.device) >= p
    vals = flat[idx] * keep / (1.0 - p)
    return torch.zeros_like(flat).index_put((idx,), vals).reshape(x.shape)


class SparseDropout(nn.Module):
    """``sparse_dropout`` as a module; for a fixed input (node features, no grad) the nonzero
    positions are found once and kept (keyed on the tensor's storage, version and shape)."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)
        self._key = self._idx = None

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x: Tensor) -> Tensor:
        floating(x, "SparseDropout: x")
        if not self.training or not self.p:
            return x
        if torch.compiler.is_compiling():
            # the sparse draw is an eager-mode saving whose nonzero() has a data-dependent size
            # (and whose key reads the storage address): the compiled graph fuses F.dropout
            return F.dropout(x, self.p, True)
        idx = None
        if not x.requires_grad:
            key = (x.data_ptr(), x._version, tuple(x.shape), x.dtype, x.device)
            if key != self._key:
                self._idx, self._key = x.reshape(-1).nonzero().squeeze(1), key
            idx = self._idx
        return sparse_dropout(x, self.p, True, idx)

"""The seed rule every epoch's random stream derives from (data order, negatives, batches)."""

from __future__ import annotations

import torch

__all__ = ["epoch_generator"]


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The random generator of one epoch's data order (and negatives): it depends only on
    (seed, epoch), so a resumed run draws what an uninterrupted one would, on every rank."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)

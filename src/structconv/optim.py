"""What every training loop shares: the optimizer by name and the data-order seed of an epoch."""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["OPTIMIZERS", "make_optimizer", "epoch_generator"]

#: the optimizers a config or a recipe may name
OPTIMIZERS = ("adam", "adamw", "sgd", "adagrad")


def make_optimizer(name: str, params: Iterable, lr: float, weight_decay: float = 0.0,
                   momentum: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer ``name`` (one of ``OPTIMIZERS``) over ``params`` (``momentum``: SGD's)."""
    params = [p for p in params if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=weight_decay)
    if name in ("adam", "adamw"):
        cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
        return cls(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The random generator of one epoch's data order (and negatives): it depends only on
    (seed, epoch), so a resumed run draws what an uninterrupted one would, on every rank."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)

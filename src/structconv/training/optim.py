"""What every training loop shares: the optimizer by name, its parameter groups, the learning-rate
schedule and the data-order seed of an epoch."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ..config import NO_DECAY, SCHEDULES
from ..seeds import epoch_generator

__all__ = ["OPTIMIZERS", "NO_DECAY", "SCHEDULES", "make_optimizer", "epoch_generator",
           "param_groups", "lr_factor"]

#: the optimizers a config or a recipe may name
OPTIMIZERS = ("adam", "adamw", "sgd", "adagrad")


def make_optimizer(name: str, params: Iterable, lr: float, weight_decay: float = 0.0,
                   momentum: float = 0.0, betas=(0.9, 0.999)) -> torch.optim.Optimizer:
    """The optimizer ``name`` (one of ``OPTIMIZERS``) over ``params`` (``momentum``: SGD's,
    ``betas``: Adam's and AdamW's): tensors, or parameter groups (``param_groups``) whose own
    weight decay wins."""
    params = list(params)
    if params and isinstance(params[0], dict):
        params = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in params]
    else:
        params = [p for p in params if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=weight_decay)
    if name in ("adam", "adamw"):
        cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
        return cls(params, lr=lr, weight_decay=weight_decay, betas=tuple(betas))
    raise ValueError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")


def param_groups(model: torch.nn.Module, weight_decay: float, no_decay=()) -> list:
    """The optimizer's parameter groups of ``model``'s trainable parameters: one group with
    ``weight_decay``, or, with ``no_decay`` (a subset of ``NO_DECAY``), a second group at 0
    decay holding the biases (``"bias"``: 1-d parameters named ``*bias``), the parameters of
    normalisation layers (``"norm"``) and of embeddings (``"embedding"``) where named."""
    bad = sorted(set(no_decay) - set(NO_DECAY))
    if bad:
        raise ValueError(f"no_decay names {bad}; it may name {', '.join(NO_DECAY)}")
    if not no_decay:
        return [{"params": [p for p in model.parameters() if p.requires_grad],
                 "weight_decay": weight_decay}]
    exempt = set()
    for mod in model.modules():
        # LayerNorm, BatchNorm1d, GroupNorm, RMSNorm and this library's norms alike
        kind = ("embedding" if isinstance(mod, torch.nn.Embedding) else
                "norm" if "norm" in type(mod).__name__.lower() else None)
        if kind in no_decay:
            exempt.update(id(p) for p in mod.parameters(recurse=False))
    if "bias" in no_decay:
        exempt.update(id(p) for n, p in model.named_parameters() if n.endswith("bias"))
    decay = [p for p in model.parameters() if p.requires_grad and id(p) not in exempt]
    rest = [p for p in model.parameters() if p.requires_grad and id(p) in exempt]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": rest, "weight_decay": 0.0}]


def lr_factor(schedule: str, step: int, warmup: int = 0, total: int = 0,
              floor: float = 0.0) -> float:
    """The learning rate's factor at optimizer step ``step`` (0-based): a linear warm-up over
    ``warmup`` steps, then constant, or linear / cosine decay to ``floor`` at step ``total``
    (nanoGPT decays to a tenth: ``floor=0.1``)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
    if schedule != "constant" and total <= warmup:
        raise ValueError(f"a {schedule} schedule needs a step budget beyond the warm-up "
                         f"({warmup} steps), got {total}")
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    done = min(1.0, (step - warmup) / (total - warmup))
    decay = 1.0 - done if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
    return floor + (1.0 - floor) * decay if floor else decay

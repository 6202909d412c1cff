"""Training link predictors: the one step, epoch and loop that the API, configs and recipes run.

``LinkObjective`` says how a batch of training queries is scored (1-vs-all cross-entropy with
label smoothing, or R-GCN's negative sampling with binary cross-entropy; an N3 or L2
regulariser). ``link_epoch`` is one pass over the queries in the order drawn from (seed,
epoch); ``train_link`` loops epochs with validation, checkpoints and resume. ``structconv
train`` of a ``[model.link]`` config and ``structconv reproduce kg-link`` both run
``link_epoch`` (the recipe through ``train_link``), with ``structconv.optim``'s optimizer builder
and seed rule and ``structconv.checkpoint``'s resume path.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import CHECKPOINT_JSON, resume_training, save_checkpoint
from ..optim import epoch_generator, make_optimizer
from .evaluate import check_triples
from .model import LinkPredictor, corrupt_triples, score_triples

__all__ = ["LinkObjective", "training_queries", "link_loss", "link_epoch", "train_link",
           "regularizer"]

MODES = ("1vsall", "negative")
REGULARIZERS = ("n3", "l2", "none")


@dataclass(frozen=True)
class LinkObjective:
    """How a batch of (B, 3) training queries is scored: ``mode`` "1vsall" (every entity a
    candidate tail, cross-entropy) or "negative" (``negatives`` corruptions per query, binary
    cross-entropy); ``label_smoothing``; ``reg`` "n3" / "l2" / None times ``reg_weight``."""

    mode: str = "1vsall"
    label_smoothing: float = 0.0
    reg: str | None = None
    reg_weight: float = 0.0
    negatives: int = 1

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"link training mode must be one of {MODES}, got {self.mode!r}")
        if self.reg not in (None, *REGULARIZERS):
            raise ValueError(f"regulariser must be 'n3', 'l2' or None, got {self.reg!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        if not (math.isfinite(self.reg_weight) and self.reg_weight >= 0):
            raise ValueError(f"reg_weight must be a finite number >= 0, got {self.reg_weight!r}")
        if isinstance(self.negatives, bool) or not isinstance(self.negatives, int) or \
                self.negatives < 1:
            raise ValueError(f"negatives must be an int >= 1, got {self.negatives!r}")


def regularizer(kind: str | None, vectors: list[Tensor]) -> Tensor | float:
    """N3 (Σ|v|³, Lacroix et al. 2018) or L2 (Σ v²) of the vectors a batch used, per query."""
    if kind is None or kind == "none":
        return 0.0
    if kind == "n3":
        return sum(v.abs().pow(3).sum() for v in vectors) / vectors[0].shape[0]
    if kind == "l2":
        return sum(v.pow(2).sum() for v in vectors) / vectors[0].shape[0]
    raise ValueError(f"unknown regularizer {kind!r}: use 'n3', 'l2' or None")


def training_queries(model: LinkPredictor, train: Tensor, mode: str) -> Tensor:
    """The queries one epoch passes over: each triple, and its reverse (t, r + R, h) for
    1-vs-all or a reciprocal decoder (whose inverse relations train on the reversed triples;
    otherwise one vector per relation serves both directions)."""
    if mode == "1vsall" or model.decoder.reciprocal:
        R = model.num_relations
        return torch.cat([train, torch.stack([train[:, 2], train[:, 1] + R, train[:, 0]], 1)])
    return train


def link_loss(model: LinkPredictor, q: Tensor, objective: LinkObjective,
              gen: torch.Generator) -> Tensor:
    """The loss of one batch of (B, 3) training queries (negatives drawn from ``gen``)."""
    ent = model.entities()
    r, o = q[:, 1], objective
    if o.mode == "1vsall":
        scores = model.decoder.score_all(ent[q[:, 0]], r, ent)
        loss = F.cross_entropy(scores, q[:, 2], label_smoothing=o.label_smoothing)
    else:
        n = q.shape[0]
        neg = corrupt_triples(q, model.num_entities, o.negatives, gen)
        s = score_triples(model.decoder, ent, torch.cat([q, neg]))
        y = torch.cat([torch.ones(n, dtype=s.dtype, device=s.device),
                       torch.zeros(neg.shape[0], dtype=s.dtype, device=s.device)])
        if o.label_smoothing:
            y = y * (1 - o.label_smoothing) + o.label_smoothing / 2
        loss = F.binary_cross_entropy_with_logits(s, y)
    if o.reg_weight and o.reg not in (None, "none"):
        h, t = ent[q[:, 0]], ent[q[:, 2]]
        loss = loss + o.reg_weight * regularizer(o.reg, [h, model.decoder.relation_vectors(r), t])
    return loss


def link_epoch(model: LinkPredictor, queries: Tensor, optimizer, objective: LinkObjective, *,
               batch_size: int, seed: int, epoch: int, grad_clip: float = 0.0,
               on_step: Callable[[int, float], None] | None = None,
               start: dict | None = None, stop: Callable[[], bool] | None = None) -> dict:
    """One pass over (T, 3) ``queries`` in the order drawn from (seed, epoch), a step per
    batch; returns ``{"loss": mean per query, "queries", "seconds", "steps", "stopped"}``.

    ``on_step(step, mean loss so far)`` after each step (a progress bar). ``stop()`` is asked
    after each step: when it says so the epoch returns at once with ``"stopped": True`` and
    ``"position"``, which ``start=`` takes to go on from that batch exactly (the step, the
    running sums and the state of the epoch's generator, which also draws the negatives). A
    non-finite loss stops it (ValueError naming the epoch and step)."""
    t0 = time.perf_counter()
    model.train()
    # batch order and negatives from (seed, epoch): the same after a resume
    gen = epoch_generator(seed, epoch)
    perm = torch.randperm(queries.shape[0], generator=gen)
    first, total, count = 0, 0.0, 0
    if start is not None:
        first, total, count = int(start["step"]), float(start["loss_sum"]), int(start["count"])
        gen.set_state(start["generator"])
    dev = queries.device
    starts = range(0, perm.numel(), batch_size)
    for step in range(first, len(starts)):
        i = starts[step]
        q = queries[perm[i:i + batch_size].to(dev)]
        loss = link_loss(model, q, objective, gen)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise ValueError(f"loss is {value} at epoch {epoch}, step {step + 1}; lower the "
                             "learning rate or check the data")
        if grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        total += value * q.shape[0]
        count += q.shape[0]
        if on_step is not None:
            on_step(step, total / count)
        if stop is not None and step + 1 < len(starts) and stop():
            return {"stopped": True, "steps": len(starts), "seconds": time.perf_counter() - t0,
                    "position": {"step": step + 1, "loss_sum": total, "count": count,
                                 "generator": gen.get_state()}}
    return {"loss": total / max(count, 1), "queries": count, "stopped": False,
            "steps": len(starts), "seconds": time.perf_counter() - t0}


def train_link(model: LinkPredictor, train: Tensor, *, mode: str = "1vsall", epochs: int = 10,
               batch_size: int = 1000, lr: float = 1e-3, optimizer: str = "adam",
               label_smoothing: float = 0.0, reg: str | None = None, reg_weight: float = 0.0,
               negatives: int = 1, seed: int = 0, time_limit: float | None = None,
               valid: Callable[[int], dict] | None = None, eval_every: int = 1,
               log: Callable[[str], None] | None = None,
               checkpoint_dir=None) -> list[dict]:
    """Train ``model`` on ``train`` (T, 3) triples; returns the per-epoch log (loss, time,
    validation metrics when ``valid(epoch)`` is given, every ``eval_every`` epochs).

    ``mode="1vsall"``: each triple gives two queries, (h, r) -> t and (t, r + R) -> h, scored
    against all entities with cross-entropy. ``mode="negative"``: each triple (and its reverse
    ``(t, r + R, h)`` where the decoder is reciprocal) and ``negatives`` corruptions of its head
    or tail (uniform), binary cross-entropy (R-GCN's setting). ``optimizer`` is one of
    ``structconv.optim.OPTIMIZERS``. Stops after ``time_limit`` seconds at an epoch's end.
    With ``checkpoint_dir`` every epoch ends with a checkpoint (safetensors, atomic) and a
    later call continues from the last one: batches are drawn from a per-epoch seed, so a
    resumed run equals an uninterrupted one.
    """
    objective = LinkObjective(mode, label_smoothing, None if reg == "none" else reg, reg_weight,
                              negatives)
    train = check_triples(train, model.num_entities, model.num_relations, "train")
    opt = make_optimizer(optimizer, model.parameters(), lr)
    torch.manual_seed(seed)
    history, first = [], 1
    if checkpoint_dir is not None and (Path(checkpoint_dir) / CHECKPOINT_JSON).is_file():
        ck = resume_training(checkpoint_dir, model, opt)
        history, first = list(ck["trainer"]["history"]), ck["epoch"] + 1
    queries = training_queries(model, train, mode)
    start = time.perf_counter()
    for epoch in range(first, epochs + 1):
        stats = link_epoch(model, queries, opt, objective, batch_size=batch_size, seed=seed,
                           epoch=epoch)
        row = {"epoch": epoch, "loss": stats["loss"], "seconds": stats["seconds"]}
        if valid is not None and (epoch % eval_every == 0 or epoch == epochs):
            model.eval()
            row.update({f"valid_{k}": v for k, v in valid(epoch).items()})
        history.append(row)
        if checkpoint_dir is not None:
            save_checkpoint(checkpoint_dir, epoch, model.state_dict(), opt.state_dict(),
                            {"history": history})
        if log is not None:
            log("  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in row.items()))
        if time_limit is not None and time.perf_counter() - start > time_limit:
            break
    return history

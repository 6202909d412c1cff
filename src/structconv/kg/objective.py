"""What a link predictor trains on: the queries of an epoch and the loss of a batch of them.

``LinkObjective`` says how a batch of training queries is scored (1-vs-all cross-entropy with
label smoothing, or R-GCN's negative sampling with binary cross-entropy; an N3 or L2
regulariser); ``link_loss`` scores one. The training loop (``structconv.training``: a
``[model.link]`` config, ``train_link``, ``structconv reproduce kg-link``) runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .model import LinkPredictor, corrupt_triples, score_triples

__all__ = ["LinkObjective", "training_queries", "link_loss", "regularizer"]

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

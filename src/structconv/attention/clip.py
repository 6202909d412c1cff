"""Tanh clipping: a term-wise transform of attention scores, C · tanh(s) (Bello et al. 2016).

The attention model for routing (Kool, van Hoof & Welling, ICLR 2019) clips the logits of its
pointer, C · tanh(q·k / sqrt(D)) with C = 10, before masking the visited cities and taking
the softmax: the scores stay in [−C, C], which keeps the policy from becoming deterministic
too early (exploration). In the paper's terms it is a term-wise transform of a mechanism,
like LeakyReLU. A masked score (−inf) stays −inf (tanh would map it to −C and unmask it), so
masking and clipping commute: ``TanhClip(Masked(a, H)) == Masked(TanhClip(a), H)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import floating
from .mechanisms import Mechanism

__all__ = ["TanhClip", "tanh_clip"]


def tanh_clip(scores: Tensor, C: float) -> Tensor:
    """C · tanh(scores), term-wise; −inf (masked) entries stay −inf."""
    floating(scores, "tanh_clip: scores")
    _check_C(C)
    out = C * torch.tanh(scores)
    return out.masked_fill(torch.isneginf(scores), float("-inf"))


def _check_C(C) -> None:
    if isinstance(C, bool) or not isinstance(C, (int, float)) or not math.isfinite(C) or C <= 0:
        raise ValueError(f"TanhClip: C (the clipping range) must be a finite number > 0, got "
                         f"{C!r}")


class TanhClip(Mechanism):
    """The mechanism C · tanh(inner(x1, x2)) term-wise (masked entries kept masked), densely
    (K, M, N) and on a graph's edges (E, K); ``C`` > 0 is the clipping range."""

    def __init__(self, inner: Mechanism, C: float = 10.0):
        super().__init__()
        if not isinstance(inner, Mechanism):
            raise TypeError(f"TanhClip wraps a Mechanism, got {type(inner).__name__}")
        _check_C(C)
        self.inner, self.C = inner, float(C)
        self.K = inner.K
        self.reads_inputs = inner.reads_inputs

    def extra_repr(self):
        return f"C={self.C:g}"

    def base(self) -> Mechanism:
        return self.inner.base()

    def entries(self, x):
        return self.inner.entries(x)

    def forward(self, x1, x2, edge_attr=None, **kw):
        return tanh_clip(self.inner(x1, x2, edge_attr, **kw), self.C)

    def edge_scores(self, x1, x2, edge_index, edge_attr=None, **kw):
        return tanh_clip(self.inner.edge_scores(x1, x2, edge_index, edge_attr, **kw), self.C)

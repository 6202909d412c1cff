"""A sequence-to-sequence forecaster whose attention is a structured convolution.

The attention from the observed context (M = L inputs at positions 0..L-1) to the forecast
horizon (N = H outputs at positions L..L+H-1) is an attention convolution
y = Σ_k A_kᵀ x Θ_k with A_k = softmax over inputs of a sum of mechanisms:

* ``"content"``   the scaled dot product of encoder states (keys) and decoder states (queries):
  a content-based term alone (the plain attention of a seq2seq RNN);
* ``"position"``  content + ``OffsetBias``: a learned bias per head and per exact offset
  d = n − m (Cinar et al.'s position-based content attention, ICONIP 2017): an index term;
* ``"period"``    content + for each given period P, ``sc.attention.PeriodicBias`` in its two
  forms: a bias per phase d mod P (inputs a whole number of periods back share it) and per
  number of whole periods floor(d / P) (Cinar et al.'s period-aware content attention,
  Neurocomputing 2018): index terms at the multiples of the period.

The index terms enter SDPA's fused kernel as an additive mask (``sc.attention.index_bias``
with the outputs placed after the inputs); Θ_k is ``sc.params.LowRank`` (value/output form).
The encoder and the decoder are GRUs (as Cinar et al.'s RNNs): the encoder reads the scaled
context, the decoder unrolls H steps from the encoder's last state on learned step inputs, and
each step's forecast is read from its state and its attention output. Inputs are scaled per
window (mean and standard deviation of the context), so the model forecasts the shape of the
next H steps relative to the recent level: the forecast at origin t depends on the context
``values[t - L:t]`` only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..attention.basis import DotProductAttention
from ..attention.index import IndexTerm, PeriodicBias, index_bias
from ..attention.mechanisms import DotProduct
from ..data.series import windows
from ..engine import convolve
from ..params import LowRank, reset_children, reset_module

__all__ = ["FORMS", "OffsetBias", "SeriesAttention", "Forecaster", "forecast_at"]

FORMS = ("content", "position", "period")
"""The forecaster's attention forms: content alone, plus offset biases, plus period biases."""


class OffsetBias(IndexTerm):
    """A learned bias per head and per exact offset d = n − m: weight[d, k] for d in
    [0, span), offsets outside clamped to the ends. (span, K), starts at zero.

    Unlike T5's ``RelativeBias`` (exact only up to half its buckets, logarithmic beyond), every
    offset of a forecasting window has its own value, so a learned peak at d = P, 2P, ... shows
    the period directly."""

    def __init__(self, K: int, span: int):
        super().__init__()
        for what, v in (("K", K), ("span", span)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"OffsetBias: {what} must be an int >= 1, got {v!r}")
        self.K, self.span = K, span
        self.weight = nn.Parameter(torch.zeros(span, K))

    def reset_parameters(self) -> None:
        """The biases start at zero again."""
        with torch.no_grad():
            self.weight.zero_()

    def extra_repr(self):
        return f"K={self.K}, span={self.span}"

    def offset_scores(self, d: Tensor) -> Tensor:
        return self.weight[d.clamp(0, self.span - 1)]


def _index_terms(form: str, K: int, span: int, periods: Sequence[int]) -> list[IndexTerm]:
    if form == "content":
        return []
    if form == "position":
        return [OffsetBias(K, span)]
    if not periods:
        raise ValueError("the period form needs at least one period")
    terms: list[IndexTerm] = []
    for p in periods:
        terms += [PeriodicBias(K, p, mode="phase"),
                  PeriodicBias(K, p, mode="multiple", num_periods=max(1, math.ceil(span / p)))]
    return terms


class SeriesAttention(nn.Module):
    """The attention convolution from L context entries to H horizon entries.

    ``forward(x, keys, queries)``: x (B, L, P) the main input, keys (B, L, C) and queries
    (B, H, C) the auxiliary inputs -> (B, H, Q) = Σ_k A_kᵀ x Θ_k, where A_k (L, H) is the
    softmax over inputs of (keys Λ_key,k)(queries Λ_query,k)ᵀ/√D plus the index terms of
    ``form`` at offsets d = n − m (outputs at positions L..L+H-1). Θ_k = value_k out_k
    (``LowRank``, rank D). ``heads`` = K, ``dim`` = D.
    """

    def __init__(self, form: str, in_channels: int, aux_channels: int, out_channels: int, *,
                 heads: int, dim: int, span: int, periods: Sequence[int] = ()):
        super().__init__()
        if form not in FORMS:
            raise ValueError(f"unknown attention form {form!r}: choose one of {', '.join(FORMS)}")
        self.form, self.heads, self.dim = form, heads, dim
        self.content = DotProduct(heads, aux_channels, aux_channels, dim)
        self.terms = nn.ModuleList(_index_terms(form, heads, span, list(periods)))
        self.param = LowRank(heads, in_channels, out_channels, dim)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        reset_children(self)

    def basis(self, keys: Tensor, queries: Tensor) -> DotProductAttention:
        """The attention basis (B, K, L, H) of these keys and queries (applied with SDPA)."""
        q, k = self.content.project(keys, queries)  # (B, K, H, D), (B, K, L, D)
        L, H = k.shape[2], q.shape[2]
        mask = None
        if len(self.terms):
            # SDPA orientation (K, H, L); the outputs sit after the L inputs
            mask = index_bias(list(self.terms), L, H, dtype=q.dtype, device=q.device,
                              output_start=L).unsqueeze(0)
        # finite position scores leave every output some input: no dead columns to look for
        return DotProductAttention(q, k, sdpa_mask=mask, scale=self.content.scale,
                                   check_dead=False)

    def forward(self, x: Tensor, keys: Tensor, queries: Tensor) -> Tensor:
        if x.dim() != 3 or keys.dim() != 3 or queries.dim() != 3 or \
                x.shape[:2] != keys.shape[:2] or queries.shape[0] != x.shape[0]:
            raise ValueError(f"SeriesAttention expects x (B, L, P), keys (B, L, C), queries "
                             f"(B, H, C), got {tuple(x.shape)}, {tuple(keys.shape)}, "
                             f"{tuple(queries.shape)}")
        return convolve(x, self.basis(keys, queries), self.param)

    def offset_terms(self, offsets: Tensor) -> dict[str, Tensor]:
        """The learned index terms at ``offsets`` (n,) long: {name: (n, K)} (one entry per
        term; empty for the content form)."""
        out = {}
        for t in self.terms:
            name = "offset" if isinstance(t, OffsetBias) else f"{t.mode}{t.period}"
            out[name] = t.offset_scores(offsets).detach()
        return out


class Forecaster(nn.Module):
    """GRU encoder, GRU decoder and one ``SeriesAttention`` between them.

    ``forward(past)``: past (B, context) raw values -> (B, horizon) raw forecasts;
    ``scaled(past)`` (or ``forward(past, scaled=True)``, through a DDP wrapper) gives
    (forecasts in window units (B, horizon), loc (B, 1), scale (B, 1)), the quantities a loss
    compares with (target − loc) / scale.
    """

    def __init__(self, context: int, horizon: int, form: str = "content", *, width: int = 32,
                 heads: int = 4, periods: Sequence[int] = ()):
        super().__init__()
        for what, v in (("context", context), ("horizon", horizon), ("width", width),
                        ("heads", heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Forecaster: {what} must be an int >= 1, got {v!r}")
        if width % heads:
            raise ValueError(f"Forecaster: width={width} must be divisible by heads={heads}")
        self.context, self.horizon, self.form = context, horizon, form
        self.periods = [int(p) for p in periods]
        self.encoder = nn.GRU(1, width, batch_first=True)
        self.decoder = nn.GRU(width, width, batch_first=True)
        self.steps = nn.Parameter(torch.randn(horizon, width) / math.sqrt(width))
        # the values the attention mixes: encoder states and the scaled input itself
        self.attention = SeriesAttention(form, width + 1, width, width, heads=heads,
                                         dim=width // heads, span=context + horizon,
                                         periods=self.periods)
        self.head = nn.Sequential(nn.Linear(2 * width, width), nn.GELU(), nn.Linear(width, 1))

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does, in its order: the GRUs (torch's
        init), the decoder's step inputs N(0, 1/width), the attention and the head."""
        self.encoder.reset_parameters()
        self.decoder.reset_parameters()
        with torch.no_grad():
            self.steps.normal_().div_(math.sqrt(self.steps.shape[1]))
        self.attention.reset_parameters()
        reset_module(self.head)

    def extra_repr(self):
        return (f"context={self.context}, horizon={self.horizon}, form={self.form!r}, "
                f"periods={self.periods}")

    def scaled(self, past: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if past.dim() != 2 or past.shape[1] != self.context:
            raise ValueError(f"Forecaster expects past values (B, context={self.context}), got "
                             f"{tuple(past.shape)}")
        x = past.to(self.steps.dtype)
        loc = x.mean(1, keepdim=True)
        scale = x.std(1, keepdim=True, unbiased=False).clamp_min(1e-8)
        z = ((x - loc) / scale).unsqueeze(-1)  # (B, L, 1)
        enc, last = self.encoder(z)  # (B, L, W), (1, B, W)
        dec, _ = self.decoder(self.steps.expand(x.shape[0], -1, -1), last)  # (B, H, W)
        att = self.attention(torch.cat([enc, z], -1), enc, dec)
        out = self.head(torch.cat([dec, att], -1)).squeeze(-1)
        return out, loc, scale

    def forward(self, past: Tensor, scaled: bool = False):
        out, loc, scale = self.scaled(past)
        return (out, loc, scale) if scaled else loc + scale * out


@torch.no_grad()
def forecast_at(model: Forecaster, values: Tensor, origins, chunk: int = 512) -> Tensor:
    """Forecasts (n, horizon) made at each origin t of ``origins`` from ``values[t - L:t]``
    (L = the model's context) alone, in the values' dtype."""
    was = model.training
    model.eval()
    past, _ = windows(values, origins, model.context, 0)  # the context alone
    dev = model.steps.device  # values may live elsewhere (a series on the CPU)
    outs = [model(past[i:i + chunk].to(dev)).to(values.device, values.dtype)
            for i in range(0, len(past), chunk)]
    model.train(was)
    return torch.cat(outs) if outs else values.new_zeros(0, model.horizon)

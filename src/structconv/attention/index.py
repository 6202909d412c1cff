"""Index terms: attention scores that depend only on the positions of the entries.

An index term scores the pair (input m, output n) by a function of the offset d = n − m
(d > 0: the input lies d steps before the output), one value per head:

* ``RelativeBias``  a learned bias per T5 bucket of d (exact below ``num_buckets / 2`` (or a
  quarter, bidirectional), logarithmic up to ``max_distance``, constant beyond: any length);
* ``PeriodicBias``  a learned bias per multiple of a period (``mode="multiple"``: bucket
  floor(d / period)) or per phase within it (``mode="phase"``: bucket d mod period);
* ``ALiBi``         the fixed −slope_k·|d| of Press et al. (slopes from
  ``positions.alibi_slopes``); with a causal mask exactly ALiBi's −slope_k·(n − m).

They add to content terms (``DotProduct(...) + RelativeBias(K)``) like any mechanism, densely,
on a graph's edges, and on SDPA's fused path as an additive mask built by ``index_bias`` from
an O(M + N) table of offsets (``positions.toeplitz``), in the compute dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._checks import int_in
from .mechanisms import Mechanism, edges
from .positions import alibi_slopes, relative_offsets, toeplitz

__all__ = ["IndexTerm", "RelativeBias", "PeriodicBias", "ALiBi", "index_bias"]


class IndexTerm(Mechanism):
    """Base class: score_k(m, n) = f_k(n − m) at input position m, output position n.

    Subclasses implement ``offset_scores(d)`` (offsets (L,) long -> (L, K)). Called with entry
    counts M, N (or inputs, whose entries are counted along dim -2) and an optional ``dtype`` /
    ``device``: ``forward`` gives (K, M, N), ``edge_scores`` (E, K) at d = target − source.
    """

    reads_inputs = False

    def offset_scores(self, d: Tensor) -> Tensor:
        """Scores (L, K) of offsets d = n − m (L,) (long)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement offset_scores")

    def _device(self, device):
        if device is not None:
            return device
        for t in self.parameters():
            return t.device
        for t in self.buffers():
            return t.device
        return torch.device("cpu")

    def _out(self, s: Tensor, dtype) -> Tensor:
        return s if dtype is None else s.to(dtype)

    def table(self, M: int, N: int, *, dtype=None, device=None, input_start: int = 0,
              output_start: int = 0) -> Tensor:
        """(K, M + N − 1): the scores of every offset of an (N outputs, M inputs) block, in
        increasing order of d (inputs at positions input_start.., outputs at output_start..)."""
        _block(type(self).__name__, M, N, input_start, output_start)
        d = relative_offsets(N, M, output_start, input_start, device=self._device(device))
        return self._out(self.offset_scores(d), dtype).t()

    def forward(self, x1, x2, edge_attr=None, *, dtype=None, device=None):
        M, N = self.entries(x1), self.entries(x2)
        # (K, N, M) in SDPA's orientation, shown in the paper's (K, M, N) as a transposed view
        return toeplitz(self.table(M, N, dtype=dtype, device=device), N, M).transpose(-1, -2)

    def edge_scores(self, x1, x2, edge_index, edge_attr=None, *, dtype=None, device=None):
        src, dst = edges(edge_index)
        return self._out(self.offset_scores(dst - src), dtype)


def _block(who: str, M, N, input_start=0, output_start=0) -> None:
    """Entry counts M, N (ints >= 0) and start positions (ints) of a block of index scores."""
    # (a SymInt is an int here: a compiled graph with dynamic shapes passes sizes as such)
    for name, v, what in (("M", M, "inputs"), ("N", N, "outputs")):
        if not (isinstance(v, torch.SymInt) or int_in(v, 0, math.inf)):
            raise ValueError(f"{who}: {name} (the number of {what}) must be an int >= 0, got "
                             f"{v!r}")
    for name, v in (("input_start", input_start), ("output_start", output_start)):
        if not (isinstance(v, torch.SymInt) or int_in(v, -math.inf, math.inf)):
            raise ValueError(f"{who}: {name} must be an int, got {v!r}")


def _positive(name: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {v!r}")
    return v


class RelativeBias(IndexTerm):
    """T5's relative position bias: a learned weight[bucket(n − m), k] (Raffel et al. 2020).

    Buckets as T5's ``relative_position_bucket`` (key − query = m − n): with ``bidirectional``
    half the buckets hold inputs after the output; within a direction the first half of the
    buckets are exact offsets, the rest logarithmic up to ``max_distance``, the last bucket
    everything beyond (so any length works). Unidirectional: inputs after the output share
    bucket 0 (a causal mask hides them anyway). ``weight`` (num_buckets, K) starts at zero.
    """

    def __init__(self, K: int, num_buckets: int = 32, max_distance: int = 128, *,
                 bidirectional: bool = True):
        super().__init__()
        self.K = _positive("K", K)
        self.num_buckets = _positive("num_buckets", num_buckets, 4 if bidirectional else 2)
        exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
        if isinstance(max_distance, bool) or not isinstance(max_distance, int) or \
                max_distance <= exact:
            raise ValueError(f"max_distance must be an int above the {exact} exact buckets, got "
                             f"{max_distance!r}")
        self.max_distance, self.bidirectional = max_distance, bool(bidirectional)
        self.weight = nn.Parameter(torch.zeros(num_buckets, K))

    def reset_parameters(self) -> None:
        """``weight`` = 0 (no bias before training)."""
        with torch.no_grad():
            self.weight.zero_()

    def extra_repr(self):
        return (f"K={self.K}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
                f"bidirectional={self.bidirectional}")

    def bucket(self, d: Tensor) -> Tensor:
        """T5's bucket of each offset d = n − m (long, same shape)."""
        rel = -d  # T5's relative_position = memory (input) − context (output)
        n = self.num_buckets
        out = torch.zeros_like(rel)
        if self.bidirectional:
            n //= 2
            out = out + (rel > 0).long() * n
            rel = rel.abs()
        else:
            rel = (-rel).clamp_min(0)
        exact = n // 2
        # float32 logarithms, as T5's reference computes them (the same buckets at the edges)
        large = exact + (torch.log(rel.float().clamp_min(1) / exact)
                         / math.log(self.max_distance / exact) * (n - exact)).long()
        large = large.clamp_max(n - 1)
        return out + torch.where(rel < exact, rel, large)

    def offset_scores(self, d):
        return self.weight[self.bucket(d)]


class PeriodicBias(IndexTerm):
    """A learned bias per period of the offset d = n − m (period-aware attention).

    ``mode="multiple"``: weight[floor(d / period), k], the number of whole periods between the
    input and the output, clamped to ``num_periods`` buckets (0 .. num_periods − 1; with
    ``bidirectional`` also −num_periods .. −1 for inputs after the output, 2·num_periods rows).
    ``mode="phase"``: weight[d mod period, k], the position within the period (inputs a whole
    number of periods back share a bias, e.g. the same weekday; ``period`` rows).
    ``weight`` starts at zero.
    """

    def __init__(self, K: int, period: int, *, mode: str = "multiple", num_periods: int = 8,
                 bidirectional: bool = False):
        super().__init__()
        if mode not in ("multiple", "phase"):
            raise ValueError(f"PeriodicBias mode must be 'multiple' or 'phase', got {mode!r}")
        self.K = _positive("K", K)
        self.period = _positive("period", period)
        self.num_periods = _positive("num_periods", num_periods)
        self.mode, self.bidirectional = mode, bool(bidirectional)
        rows = period if mode == "phase" else num_periods * (2 if bidirectional else 1)
        self.weight = nn.Parameter(torch.zeros(rows, K))

    def reset_parameters(self) -> None:
        """``weight`` = 0 (no bias before training)."""
        with torch.no_grad():
            self.weight.zero_()

    def extra_repr(self):
        return (f"K={self.K}, period={self.period}, mode={self.mode!r}, "
                f"num_periods={self.num_periods}, bidirectional={self.bidirectional}")

    def bucket(self, d: Tensor) -> Tensor:
        """The weight row of each offset d = n − m (long, same shape)."""
        if self.mode == "phase":
            return torch.remainder(d, self.period)
        q = torch.div(d, self.period, rounding_mode="floor")
        if self.bidirectional:
            return q.clamp(-self.num_periods, self.num_periods - 1) + self.num_periods
        return q.clamp(0, self.num_periods - 1)

    def offset_scores(self, d):
        return self.weight[self.bucket(d)]


class ALiBi(IndexTerm):
    """ALiBi (Press et al., ICLR 2022) as an index term: score_k(m, n) = −slope_k·|n − m|.

    ``slopes`` (K,) default to ``positions.alibi_slopes(K)``; fixed (no parameters), applied in
    float64 and rounded once to the compute dtype. Under a causal mask this is exactly ALiBi's
    −slope_k·(n − m); unmasked it is its symmetric form.
    """

    def __init__(self, K: int, slopes: Sequence[float] | Tensor | None = None):
        super().__init__()
        self.K = _positive("K", K)
        s = alibi_slopes(K) if slopes is None else torch.as_tensor(slopes, dtype=torch.float64)
        if tuple(s.shape) != (K,):
            raise ValueError(f"ALiBi slopes must be ({K},), got {tuple(s.shape)}")
        if not bool(torch.isfinite(s).all()):
            raise ValueError(f"ALiBi slopes must be finite, got {s.tolist()}")
        # kept in float64 whatever the module is cast to (a plain attribute, not a buffer)
        self.slopes = s.to(torch.float64)

    def extra_repr(self):
        return f"K={self.K}"

    def _out(self, s, dtype):
        return s.to(torch.get_default_dtype() if dtype is None else dtype)

    def offset_scores(self, d):
        return -self.slopes.to(d.device) * d.abs().to(torch.float64).unsqueeze(-1)


def index_bias(terms: Sequence[IndexTerm], M: int, N: int, *, dtype, device=None,
               causal: bool = False, input_start: int = 0, output_start: int = 0) -> Tensor:
    """The index terms' summed scores as SDPA's additive mask (K|1, N, M), in ``dtype``, on
    ``device`` (default the terms'): inputs at positions input_start.., outputs at
    output_start.. (a KV cache puts the queries after the cached keys).

    The terms' tables (O(M + N) offsets each) are added in float64, masked (−inf for inputs
    after the output) when ``causal``, rounded once to ``dtype`` and expanded once: no
    (K, N, M) temporary beyond the mask itself.
    """
    terms = _index_terms(terms)
    _block("index_bias", M, N, input_start, output_start)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"index_bias: dtype must be a floating torch.dtype (the mask holds "
                        f"-inf), got {dtype!r}")
    d = relative_offsets(N, M, output_start, input_start, device=terms[0]._device(device))
    table = None
    for t in terms:
        s = t.offset_scores(d).to(torch.float64)  # (L, K_t)
        table = s if table is None else table + s
    if causal:
        table = table.masked_fill((d < 0).unsqueeze(1), float("-inf"))
    return toeplitz(table.to(dtype).t(), N, M)


def _index_terms(terms) -> list[IndexTerm]:
    """``terms`` as a non-empty list of index terms whose K agree (or are 1)."""
    if isinstance(terms, IndexTerm):
        terms = [terms]
    if not isinstance(terms, Sequence) or not terms:
        raise ValueError(f"index_bias needs a non-empty list of index terms, got {terms!r}")
    bad = [type(t).__name__ for t in terms if not isinstance(t, IndexTerm)]
    if bad:
        raise TypeError(f"index_bias: terms must be index terms (RelativeBias, PeriodicBias, "
                        f"ALiBi, IndexTerm), got {', '.join(bad)}")
    K = max(t.K for t in terms)
    if any(t.K not in (1, K) for t in terms):
        got = ", ".join(f"{type(t).__name__}(K={t.K})" for t in terms)
        raise ValueError(f"index_bias: the terms must share K heads (or K=1), got {got}")
    return list(terms)

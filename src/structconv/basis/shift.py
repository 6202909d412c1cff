"""Shift matrices of a sequence: the index-based heads that attention layers stack with their
attention heads (the paper's alternative to positional encodings).

``Shift(length, shifts, causal=..., past=...)`` is the one basis: A_s[m, n] = 1 iff
m = n + past − shifts[s], K = len(shifts), M = past + length, N = length. Head s of output n
reads the input ``shifts[s]`` steps before it (after it, for a negative offset: ``causal=False``);
entries outside the sequence read zero. Applied as one padded copy and one gather
(``gather_shifts``), never as a matrix product.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Basis

__all__ = ["Shift", "gather_shifts", "gather_offsets"]


def gather_offsets(ext: Tensor, offsets: Sequence[int], length: int) -> Tensor:
    """out[:, n, s] = ext[:, offsets[s] + n, s] for n < ``length``: ext (B, T, S, D) ->
    (B, length, S, D), each offset in 0 .. T − length (unchecked: see ``gather_shifts``).

    One ``index_select`` over the flattened (position, head) rows: forward one gather, backward
    one scatter-add (per-head slices stacked cost a copy per head and a zero-filled buffer per
    head in the backward pass, about twice the time at nanoGPT's shape). Equal offsets are a
    view.
    """
    B, T, S, D = ext.shape
    if not offsets or all(o == offsets[0] for o in offsets):
        first = offsets[0] if offsets else T - length
        return ext[:, first: first + length]
    off = torch.tensor(list(offsets), device=ext.device)
    rows = (torch.arange(length, device=ext.device)[:, None] + off) * S \
        + torch.arange(S, device=ext.device)
    return ext.flatten(1, 2).index_select(1, rows.flatten()).view(B, length, S, D)


def gather_shifts(ext: Tensor, shifts: Sequence[int], length: int) -> Tensor:
    """The last ``length`` positions of ext (B, P + length, S, D), each head shifted:
    out[:, n, s] = ext[:, P + n − shifts[s], s] -> (B, length, S, D); P >= max(shifts) entries
    come before the outputs (padding or a cache). One gather (``gather_offsets``)."""
    B, T, S, D = ext.shape
    P = T - length
    if len(shifts) != S or length < 0 or (shifts and (min(shifts) < 0 or max(shifts) > P)):
        raise ValueError(f"gather_shifts: ext {tuple(ext.shape)} (B, P + length, S, D) with "
                         f"length {length} cannot give shifts {list(shifts)} (S heads, each "
                         f"0..P)")
    return gather_offsets(ext, [P - s for s in shifts], length)


class Shift(Basis):
    """Shift heads as a basis: A_s[m, n] = 1 iff m = n + past − shifts[s]; (S, past + L, L).

    ``causal=True``: offsets >= 0 (head s brings the entry s steps before, zero before the
    start); ``past = R`` puts R cached entries before the L outputs (generation: R >=
    max(shifts)). ``causal=False``: signed offsets (a 1-d grid convolution's taps; a negative
    offset reads a later entry, zero past the end), no cache. ``propagate_heads`` is one padded
    copy and one gather: K·N multiply-adds of cost, no matrix product.
    """

    cost_kernel = "element"

    def __init__(self, length: int, shifts: Sequence[int], *, causal: bool = True,
                 past: int = 0):
        who = type(self).__name__
        shifts = [int(s) for s in shifts]
        if causal and (not shifts or min(shifts) < 0):
            raise ValueError(f"{who} needs at least one shift, all >= 0, got {shifts}")
        if not shifts:
            raise ValueError(f"{who} needs at least one offset")
        past = int(past)
        if past and (not causal or past < max(shifts)):
            raise ValueError(f"{who}: past={past} cached entries cannot feed a shift of "
                             f"{max(shifts)} (need past >= max(shifts) or past = 0)" if causal
                             else f"{who}: signed shifts take no cached entries (past={past})")
        super().__init__(len(shifts), past + length, length)
        self.shifts, self.past, self.causal = shifts, past, bool(causal)

    def __repr__(self):
        return (f"{type(self).__name__}(length={self.N}, shifts={self.shifts}, "
                f"causal={self.causal}, past={self.past})")

    def apply_flops(self):
        return float(self.K * self.N)

    def propagate_heads(self, z: Tensor) -> Tensor:
        if z.dim() != 4 or z.shape[1] != self.M or z.shape[2] != self.K:
            raise ValueError(f"{type(self).__name__}.propagate_heads expects z (B, M={self.M}, "
                             f"K={self.K}, C), got shape {tuple(z.shape)}")
        # rows before the first input and after the last that some head reads (zeros)
        before = max(0, max(self.shifts) - self.past)
        after = max(0, -min(self.shifts))
        ext = F.pad(z, (0, 0, 0, 0, before, after)) if before or after else z
        return gather_offsets(ext, [before + self.past - s for s in self.shifts], self.N)

    def to_dense(self) -> Tensor:
        A = torch.zeros(self.K, self.M, self.N, dtype=self.dtype, device=self.device)
        n = torch.arange(self.N, device=self.device)
        for k, s in enumerate(self.shifts):
            m = n + self.past - s
            ok = (m >= 0) & (m < self.M)
            A[k, m[ok], n[ok]] = 1.0
        return A

"""Position information for sequence models: encodings, rotary, ALiBi and causal shift heads.

* ``sinusoidal(positions, E)``  the Transformer's fixed encoding, any positions.
* ``rotary(t, positions)``       RoFormer's rotation of query/key pairs by absolute position.
* ``alibi_slopes(H)``            the geometric head slopes of Press et al. (ICLR 2022).
* ``alibi_mask(...)``            the log-domain mask −m_h·(i − j) on allowed pairs, −inf on the
  future: an index-based prior on content-based heads (the framework's mask term H); built
  from a table of offsets (``toeplitz``) in the compute dtype, O(L) beyond the mask itself.
* ``causal_shift(z, shifts)``    index-based heads: head s of the output at position n is the
  input at n − shift_s (zero before the start), i.e. A_sᵀ z_s for the causal shift matrix A_s
  of ``shift_basis``; applied as one gather (``gather_shifts``), never as a matrix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..basis.shift import gather_shifts  # re-exported: the shift heads' gather

__all__ = ["sinusoidal", "rotary", "rotary_angles", "alibi_slopes", "alibi_mask",
           "causal_shift", "gather_shifts", "toeplitz", "relative_offsets"]


def sinusoidal(positions: Tensor, E: int, dtype=torch.float32) -> Tensor:
    """The (L, E) sinusoidal encoding of integer ``positions`` (L,): sin on even channels, cos
    on odd ones, wavelengths 2π..10000·2π (Vaswani et al.)."""
    if not isinstance(positions, Tensor) or positions.dim() != 1:
        got = tuple(positions.shape) if isinstance(positions, Tensor) else \
            type(positions).__name__
        raise ValueError(f"sinusoidal: positions must be a tensor (L,), got {got}")
    if isinstance(E, bool) or not isinstance(E, int) or E < 1:
        raise ValueError(f"sinusoidal: E (the encoding's width) must be an int >= 1, got {E!r}")
    pos = positions.to(torch.float64)[:, None]
    div = torch.exp(torch.arange(0, E, 2, dtype=torch.float64, device=positions.device)
                    * (-math.log(10000.0) / E))
    pe = torch.zeros(positions.shape[0], E, dtype=torch.float64, device=positions.device)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)[:, : E // 2]
    return pe.to(dtype)


def rotary_angles(L: int, D: int, start: int = 0, base: float = 10000.0, *,
                  dtype=torch.float32, device=None) -> tuple[Tensor, Tensor]:
    """(cos, sin), each (L, D/2): the rotary angles position · base^(−2i/D) of positions
    start..start+L-1 (computed in float64, then cast)."""
    half = D // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
    ang = torch.arange(start, start + L, dtype=torch.float64, device=device)[:, None] * freq
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotary(t: Tensor, start: int = 0, base: float = 10000.0,
           angles: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Rotary embedding of t (B, H, L, D), D even, at positions start..start+L-1: channel pairs
    (i, i + D/2) rotated by angle position · base^(−2i/D) (``angles`` from ``rotary_angles``
    when already computed)."""
    D, L = t.shape[-1], t.shape[-2]
    if D % 2:
        raise ValueError(f"rotary embedding needs an even head size, got D={D}")
    cos, sin = angles if angles is not None else rotary_angles(L, D, start, base, dtype=t.dtype,
                                                               device=t.device)
    half = D // 2
    a, b = t[..., :half], t[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


def alibi_slopes(heads: int) -> Tensor:
    """ALiBi's per-head slopes m_h (float64, (heads,)): for H a power of two the geometric
    sequence 2^(−8/H), 2^(−16/H), …, 2^(−8); otherwise the slopes of the largest power of two
    below H followed by every other slope of twice that power (Press et al., section 3)."""
    if heads < 1:
        raise ValueError(f"alibi_slopes needs heads >= 1, got {heads}")

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    p = 2 ** int(math.floor(math.log2(heads)))
    slopes = power_of_two(p)
    if p < heads:
        slopes += power_of_two(2 * p)[0::2][: heads - p]
    return torch.tensor(slopes, dtype=torch.float64)


def relative_offsets(rows: int, cols: int, row_start: int = 0, col_start: int = 0, *,
                     device=None) -> Tensor:
    """Every offset d = (row_start + i) − (col_start + j) of a (rows, cols) block, increasing:
    (rows + cols − 1,) long, the positions a ``toeplitz`` table is indexed by (entry t of the
    table holds offset d[t]; i = 0, j = cols − 1 gives d[0])."""
    lo = row_start - (col_start + cols - 1)
    return torch.arange(lo, lo + rows + cols - 1, device=device)


#: elements of one block of a ``toeplitz`` expansion's temporary (stays in cache)
TOEPLITZ_BLOCK = 2**20


def toeplitz(table: Tensor, rows: int, cols: int) -> Tensor:
    """(K, rows, cols) contiguous, out[k, i, j] = table[k, i − j + cols − 1], from table
    (K, rows + cols − 1): the expansion of a function of the offset i − j.

    Written block of rows by block of rows from strided views of the (reversed) table: the
    only temporaries are the O(rows + cols) table and one cache-sized block, so a
    relative-position mask costs its own memory and no more.
    """
    if table.dim() != 2 or table.shape[1] != rows + cols - 1:
        raise ValueError(f"toeplitz: table must be (K, rows + cols - 1) = (K, {rows + cols - 1})"
                         f", got {tuple(table.shape)}")
    # r[k, s] = table[k, L - 1 - s], so out[k, i, j] = r[k, rows - 1 - i + j]
    r = table.flip(1).contiguous()
    K, L = r.shape
    out = torch.empty((K, rows, cols), dtype=r.dtype, device=r.device)
    step = max(1, TOEPLITZ_BLOCK // max(1, K * cols))
    for a in range(0, rows, step):
        b = min(rows, a + step)
        # h[k, u, j] = r[k, rows - b + u + j] (non-negative strides: a Hankel view); row u of
        # the block is output row b - 1 - u, hence the flip of the (small) block
        h = r[:, rows - b:].as_strided((K, b - a, cols), (L, 1, 1))
        out[:, a:b].copy_(h.flip(1))
    return out


def alibi_mask(slopes: Tensor, queries: int, keys: int, offset: int = 0, *,
               dtype=torch.float32, device=None) -> Tensor:
    """ALiBi's causal mask in SDPA orientation (H, queries, keys): −m_h·(i − j) where key j is
    at or before query i, −inf after it. Query i sits at position offset + i and key j at j
    (offset = the number of cached keys before the queries).

    Built in ``dtype`` from a table of the queries + keys − 1 offsets (each value −m_h·d
    rounded once from float64, as the formula gives it): no (H, queries, keys) temporary beyond
    the mask itself.
    """
    if queries < 1 or keys < 1:
        raise ValueError(f"alibi_mask needs queries, keys >= 1, got {queries}, {keys}")
    m = slopes.to(device=device, dtype=torch.float64)
    d = relative_offsets(queries, keys, offset, device=device).to(torch.float64)  # i - j
    table = (-m[:, None] * d).masked_fill(d < 0, float("-inf")).to(dtype)
    return toeplitz(table, queries, keys)


def causal_shift(z: Tensor, shifts: Sequence[int], past: Tensor | None = None) -> Tensor:
    """Causal shift heads on z (B, L, S, D) -> (B, L, S, D): out[:, n, s] = z[:, n − shifts[s], s].

    ``past`` (B, R, S, D), R >= max(shifts), holds the inputs just before z (a generation
    cache); without it the sequence starts at z and earlier positions read zero. Equal to
    ``shift_basis(L, shifts).propagate_heads(z)``: one padded copy and one gather
    (``gather_shifts``).
    """
    B, L, S, D = z.shape
    if any(isinstance(s, bool) or not isinstance(s, int) for s in shifts):
        raise ValueError(f"causal_shift: shifts must be ints, got {list(shifts)}")
    if len(shifts) != S:
        raise ValueError(f"causal_shift: z has {S} heads (B, L, S, D)={tuple(z.shape)} but "
                         f"{len(shifts)} shifts were given")
    R = max(shifts) if shifts else 0
    if past is None:
        ext = F.pad(z, (0, 0, 0, 0, R, 0)) if R else z
    else:
        if past.shape[1] < R or past.shape[0] != B or past.shape[2:] != z.shape[2:]:
            raise ValueError(f"causal_shift: past {tuple(past.shape)} must be (B={B}, R>={R}, "
                             f"S={S}, D={D})")
        ext = torch.cat([past[:, past.shape[1] - R:], z], 1) if R else z
    return gather_shifts(ext, shifts, L)

"""Input validation with errors that name the shapes and the dimension that disagrees."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor


def int_in(v, lo: int, hi: int) -> bool:
    """Whether ``v`` is an int (not a bool) in [lo, hi]."""
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def number_in(v, lo: float, hi: float, open_hi: bool = False) -> bool:
    """Whether ``v`` is a finite int or float (not a bool) in [lo, hi] (or [lo, hi))."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
        lo <= v and (v < hi if open_hi else v <= hi)


def count(v, what: str, minimum: int = 1) -> int:
    """``v`` if it is an int (not a bool) >= ``minimum``, else a ValueError naming ``what``."""
    if not int_in(v, minimum, math.inf):
        raise ValueError(f"{what} must be an int >= {minimum}, got {v!r}")
    return v


def floating(t, what: str) -> Tensor:
    """``t`` if it is a floating tensor, else a TypeError naming ``what`` and what it got."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{what} must be a floating tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{what} must be a floating tensor, got dtype {t.dtype} (shape "
                        f"{tuple(t.shape)})")
    return t


def shape_error(what: str, expected: str, got) -> ValueError:
    """A ValueError 'what: expected ..., got shape (...)'."""
    return ValueError(f"{what}: expected {expected}, got shape {tuple(got)}")


def check_index_tensor(t, rows: int, what: str) -> None:
    """Raise unless ``t`` is an integer tensor of shape (rows, E)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{what} must be a tensor, got {type(t).__name__}")
    if t.dim() != 2 or t.shape[0] != rows:
        raise shape_error(what, f"({rows}, E)", t.shape)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{what} must be an integer tensor, got dtype {t.dtype}")


def token_ids(ids, vocab: int, who: str, what: str = "ids", *, keep_int32: bool = False,
              name_vocab: bool = False) -> Tensor:
    """Token ids (B, L), L >= 1, of an integer dtype with 0 <= id < ``vocab``, as long (int32
    kept with ``keep_int32``, as an embedding takes it); ``ValueError`` naming ``who``, ``what``
    and the offending shape, dtype or values (``name_vocab``: the message names vocab_size)."""
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        got = f"shape {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{who}: {what} must be integer token ids (B, L), got {got}")
    dt = ids.dtype
    if dt == torch.bool or dt.is_floating_point or dt.is_complex:
        raise ValueError(f"{who}: {what} must be integer token ids (B, L), got dtype {dt} "
                         f"(shape {tuple(ids.shape)}): token ids are integers 0..{vocab - 1}")
    if ids.shape[1] == 0:
        raise ValueError(f"{who}: {what} needs at least one token per sequence, got ids of "
                         f"shape {tuple(ids.shape)}")
    if ids.numel() and not torch.compiler.is_compiling() and ids.device.type != "meta":
        # a value check needs the data: skipped inside a compiled graph (and on meta)
        lo, hi = (int(v) for v in ids.aminmax())
        if lo < 0 or hi >= vocab:
            bad = ids[(ids < 0) | (ids >= vocab)].unique()
            more = "" if bad.numel() <= 8 else f" (and {bad.numel() - 8} more)"
            span = f"0..{vocab - 1}" + (f" (vocab_size {vocab})" if name_vocab else "")
            raise ValueError(f"{who}: {what} must be in {span}, got {bad[:8].tolist()}{more}")
    return ids if keep_int32 and dt in (torch.int64, torch.int32) else ids.long()


def as_batched(x: Tensor, M: int, what: str = "x") -> tuple[Tensor, bool]:
    """(M, P) or (B, M, P) -> (B, M, P), and whether a batch dim was added."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{what} must be a tensor, got {type(x).__name__}")
    if x.dim() == 2:
        x, added = x.unsqueeze(0), True
    elif x.dim() == 3:
        added = False
    else:
        raise shape_error(what, f"(B, M, P) or (M, P) with M={M}", x.shape)
    if x.shape[1] != M:
        raise ValueError(
            f"{what} has M={x.shape[1]} entries (shape {tuple(x.shape)}) but the basis has "
            f"M={M} (input entries)"
        )
    return x, added


def gib(n: float) -> str:
    """Bytes as ``1.5 GiB`` (from 256 MiB up) or ``12 MiB``."""
    return f"{n / 2**30:,.1f} GiB" if n >= 2**28 else f"{n / 2**20:,.0f} MiB"


def available_memory(device: str | torch.device = "cpu") -> int | None:
    """Bytes free for a new run on ``device``: MemAvailable of /proc/meminfo (CPU) or the
    driver's free memory (CUDA); None where it cannot be read."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0]) if torch.cuda.is_available() else None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None

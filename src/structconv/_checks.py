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

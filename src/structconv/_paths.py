"""Per-user folders: where structconv keeps caches (cost calibration, parsed datasets) and,
unless ``$STRUCTCONV_DATA`` says otherwise, the datasets themselves."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["user_cache_dir"]


def user_cache_dir() -> Path | None:
    """``$XDG_CACHE_HOME/structconv``, default ``~/.cache/structconv`` (it may not exist);
    None where no home folder can be found (no ``$HOME`` and no password entry)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    # the XDG spec: a relative value is invalid and must be ignored
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "structconv"
    try:
        return Path.home() / ".cache" / "structconv"
    except (RuntimeError, KeyError):  # Path.home() without $HOME or a pwd entry
        return None

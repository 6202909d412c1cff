"""Atomic file writing: a file is either its old content or its complete new content."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    um = os.umask(0)
    os.umask(um)
    return um


#: the mode an ordinary ``open`` gives a new file (mkstemp's temp files are 0600)
_FILE_MODE = 0o666 & ~_umask()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder, fsync, then rename.

    The file gets the mode an ordinary write would give it (0644 under the usual umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path, text: str) -> None:
    """Atomic write of a UTF-8 text file."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path, obj, indent: int = 2) -> None:
    """Atomic write of a JSON file."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False, default=str) + "\n")

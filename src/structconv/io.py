"""Atomic file writing: a file is either its old content or its complete new content."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path


def _umask() -> int:
    um = os.umask(0)
    os.umask(um)
    return um


#: the mode an ordinary ``open`` gives a new file (mkstemp's temp files are 0600)
_FILE_MODE = 0o666 & ~_umask()


def atomic_write_bytes(path: str | os.PathLike, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` via a temp file of its own in the same folder (unique per
    process and call: concurrent writers never share one), fsync, then rename.

    The file gets the mode an ordinary write would give it (0644 under the usual umask).
    ``fsync=False`` skips the flush to disk (files rebuilt from elsewhere after a crash).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path, text: str, fsync: bool = True) -> None:
    """Atomic write of a UTF-8 text file."""
    atomic_write_bytes(path, text.encode("utf-8"), fsync)


def atomic_write_json(path, obj, indent: int = 2) -> None:
    """Atomic write of a JSON file."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False, default=str) + "\n")


class RunLocked(ValueError):
    """Another process is writing the run directory (the message names it)."""


class RunLock:
    """An advisory lock (``flock``) on a run directory's ``.lock`` file, held while a run writes
    the directory: a second writer is refused, naming the holder (pid, host, start, command).
    The kernel drops the lock when its process ends, however it ends: a lock never goes stale.
    Used as a context manager it is released at the block's end.
    """

    def __init__(self, run: str | os.PathLike, what: str = ""):
        self.path = Path(run) / ".lock"
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock (once; a second call while held does nothing), or raise RunLocked."""
        import fcntl

        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise RunLocked(f"{self.path.parent} is being written by another run ({holder}): "
                            "wait for it to end, or give another --out") from None
        os.ftruncate(fd, 0)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {stamp}"
                      f"{', ' + self.what if self.what else ''}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        # a ``with`` block releases the lock at its end; taking it is ``acquire``'s (a run
        # takes it at its first write, after the checks that may refuse it)
        return self

    def __exit__(self, *exc) -> None:
        self.release()

"""A line on the terminal while the command line waits for torch to import (seconds on a cold
machine), so that a first command does not look hung; nothing when the import is quick, when
the output is not a terminal, or for a program that imports structconv as a library."""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["slow_import_notice", "is_command_line"]

#: seconds the import may take before the line is printed
DELAY = 1.5
MESSAGE = "structconv: loading torch..."


def is_command_line() -> bool:
    """Whether this process runs the ``structconv`` command (the console script or ``python -m
    structconv``), not a program or a test that imports the package."""
    if os.environ.get("PYTEST_CURRENT_TEST"):
        return False
    argv0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    if argv0.removesuffix(".exe") == "structconv":
        return True
    orig = list(getattr(sys, "orig_argv", []))
    return any(a == "-m" and b.split(".")[0] == "structconv" for a, b in zip(orig, orig[1:]))


class slow_import_notice:
    """Context manager: prints ``MESSAGE`` on ``stream`` (default stderr) if the block runs
    longer than ``delay`` seconds, only when ``stream`` and stdout are terminals and ``enabled``
    (default: ``is_command_line()``)."""

    def __init__(self, delay: float = DELAY, stream=None, enabled: bool | None = None,
                 stdout=None):
        self.stream = sys.stderr if stream is None else stream
        out = sys.stdout if stdout is None else stdout
        on = is_command_line() if enabled is None else enabled
        self.active = bool(on and _tty(self.stream) and _tty(out))
        self.delay, self._timer = delay, None

    def _say(self) -> None:
        try:
            print(MESSAGE, file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed terminal: nothing to tell
            pass

    def __enter__(self):
        if self.active:
            self._timer = threading.Timer(self.delay, self._say)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False

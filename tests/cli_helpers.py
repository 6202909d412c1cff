"""The command line as the tests run it: one torch thread, warnings off, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
CLI = [sys.executable, "-m", "structconv.cli"]


def run_cli(*args, cwd=None, env=None, timeout=None) -> subprocess.CompletedProcess:
    """``structconv ARGS`` in a subprocess; stdout and stderr captured as text."""
    return subprocess.run(CLI + [str(a) for a in args], env=env or ENV, capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)

"""Interrupts that lose nothing: SIGINT and SIGTERM ask a training loop to stop at its next batch
boundary, after it has written a checkpoint that resumes exactly.

``StopRequest`` is a context manager installing handlers that only set a flag (the loop polls
``requested``); a second SIGINT stops at once (``KeyboardInterrupt``: the last checkpoint
stays). ``TrainingInterrupted`` is what the loop raises after its checkpoint: a
``KeyboardInterrupt`` (so Python code stops as it does on Ctrl-C) whose message says what was
saved and how to resume, and whose ``exit_code`` is the shell's 128 + signal number.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["StopRequest", "TrainingInterrupted", "SIGNALS"]

#: the signals a run stops cleanly on: Ctrl-C, and a scheduler's or ``kill``'s default
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on a signal after writing its checkpoint; ``str()`` is one line."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return str(self.args[0])


class StopRequest:
    """While active, SIGINT / SIGTERM set ``signum`` instead of stopping the process; a second
    SIGINT raises ``KeyboardInterrupt``. Handlers are only installed in the main thread (a
    signal handler can live nowhere else); elsewhere the flag stays 0 unless ``request`` is
    called."""

    def __init__(self):
        self.signum = 0
        self._old: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum != 0

    def request(self, signum: int = signal.SIGINT) -> None:
        """Ask the loop to stop as the signal ``signum`` would (the first request wins)."""
        self.signum = self.signum or int(signum)

    def _handle(self, signum, frame):
        if self.signum and signum == signal.SIGINT:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.request(signum)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    @staticmethod
    def name(signum: int) -> str:
        return signal.Signals(signum).name

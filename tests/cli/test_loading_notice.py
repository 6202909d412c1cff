"""The command line's line while torch loads: only when slow, only on a terminal."""

import io
import sys
import time

from structconv import _loading
from structconv._loading import MESSAGE, is_command_line, slow_import_notice


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _slow_import(seconds):  # stands in for a cold `import torch`
    time.sleep(seconds)


def test_a_slow_import_prints_one_line_on_a_terminal():
    err = _Terminal()
    with slow_import_notice(delay=0.05, stream=err, enabled=True, stdout=_Terminal()):
        _slow_import(0.4)
    assert err.getvalue() == MESSAGE + "\n"


def test_a_quick_import_prints_nothing():
    err = _Terminal()
    with slow_import_notice(delay=0.3, stream=err, enabled=True, stdout=_Terminal()):
        _slow_import(0.0)
    time.sleep(0.5)  # the timer was cancelled, not merely late
    assert err.getvalue() == ""


def test_nothing_without_a_terminal_or_outside_the_command_line():
    for err, out, on in ((io.StringIO(), _Terminal(), True), (_Terminal(), io.StringIO(), True),
                         (_Terminal(), _Terminal(), False), (_Terminal(), _Terminal(), None)):
        with slow_import_notice(delay=0.01, stream=err, enabled=on, stdout=out) as n:
            _slow_import(0.1)
        assert not n.active and err.getvalue() == ""  # None: a test is no command line


def test_the_command_line_is_the_script_or_python_m(monkeypatch):
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/structconv", "train"])
    assert is_command_line()
    monkeypatch.setattr(sys, "argv", ["-m"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "structconv", "bench"], raising=False)
    assert is_command_line()
    monkeypatch.setattr(sys, "orig_argv", ["python", "-c", "import structconv"], raising=False)
    monkeypatch.setattr(sys, "argv", ["-c"])
    assert not is_command_line()
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "x")
    monkeypatch.setattr(sys, "argv", ["/venv/bin/structconv"])
    assert not is_command_line()
    assert _loading.DELAY <= 2.0

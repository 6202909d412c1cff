"""The Ctrl-C message starts a line of its own (issue 25: it landed on the progress bar's line).

On a terminal an epoch shows a tqdm bar; an interrupt clears the bar (the cursor back at the
start of an empty line) before the one line saying what was saved is printed.
"""

from __future__ import annotations

import sys

from structconv.cli import main
from tests.conftest import stop_at as _stop_at
from tests.training.test_interrupts import IMAGE


def test_the_interrupt_message_follows_a_cleared_bar(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # as on a terminal: a bar
    _stop_at(monkeypatch, 3)
    run = tmp_path / "run"
    rc = main(["train", "--config", "cnn_digits", *IMAGE, "--out", str(run)])
    err = capsys.readouterr().err
    assert rc == 130, err
    bar, _, message = err.rpartition("\r")
    assert "epoch 1:" in bar, err  # the bar was drawn, then cleared
    assert bar.endswith(" " * 10), err  # cleared by overwriting it with blanks
    assert message.startswith("structconv: interrupted by SIGINT at epoch 1, step 3/5"), err
    assert message.count("\n") == 1, err

"""What a run writes as it goes: metrics files, learning curves, TensorBoard, and progress.

``Progress`` shows an epoch's progress on the main process: a tqdm bar on a terminal, otherwise
one line on stderr every ``PROGRESS_SECONDS`` (a run writing to a log file or a pipe shows that it
is alive), nothing when it is off.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
import warnings
from pathlib import Path

from .._extras import MissingExtra, require
from ..io import atomic_write_bytes, atomic_write_text

__all__ = ["write_metrics", "plot_curves", "tensorboard", "Progress", "progress_mode",
           "CLASSIFICATION_PANELS", "LINK_PANELS", "PROGRESS_SECONDS"]

#: seconds between progress lines when stderr is not a terminal
PROGRESS_SECONDS = float(os.environ.get("STRUCTCONV_PROGRESS_SECONDS", "30") or 30)


def write_metrics(run: Path, history: list[dict]) -> None:
    """``metrics.jsonl`` and ``metrics.csv``: one row per epoch. They are rebuilt from the
    checkpoint on resume, so they are written atomically (a temp file of their own) but not
    flushed to disk."""
    atomic_write_text(run / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in history),
                      fsync=False)
    buf = io.StringIO()
    if history:
        w = csv.DictWriter(buf, fieldnames=list(history[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(history)
    atomic_write_text(run / "metrics.csv", buf.getvalue(), fsync=False)


#: the two panels of ``curves.png``: (title, y label, [(metrics key, legend label)])
CLASSIFICATION_PANELS = (("loss", "cross-entropy", (("train_loss", "train"), ("val_loss", "val"))),
                         ("accuracy", "accuracy", (("train_acc", "train"), ("val_acc", "val"))))
LINK_PANELS = (("loss", "training loss", (("loss", "train"),)),
               ("filtered ranking (validation)", "value",
                (("val_mrr", "MRR"), ("val_hits@1", "Hits@1"), ("val_hits@10", "Hits@10"))))


def plot_curves(run: Path, history: list[dict], panels=CLASSIFICATION_PANELS) -> None:
    """Learning curves (loss and accuracy per epoch, or the ``panels`` given) as
    ``curves.png`` (with the plots extra); epochs without a value (None) are left out."""
    try:
        Figure = require("matplotlib.figure", "plots", "curves.png").Figure
    except MissingExtra as e:  # the run's results stand without its picture
        warnings.warn(f"{e}; curves.png skipped", stacklevel=2)
        return

    fig = Figure(figsize=(9, 3.5))
    for ax, (title, ylabel, curves) in zip(fig.subplots(1, len(panels)), panels):
        for key, label in curves:
            pts = [(h["epoch"], h[key]) for h in history if h.get(key) is not None]
            ax.plot([e for e, _ in pts], [v for _, v in pts], label=label,
                    marker="." if len(pts) < len(history) else None)
        ax.set(xlabel="epoch", ylabel=ylabel, title=title)
        ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    atomic_write_bytes(run / "curves.png", buf.getvalue())


def tensorboard(run: Path):
    """A TensorBoard writer into ``run/tensorboard`` when tensorboard is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # optional: TensorBoard logging only when it is installed
        return None
    return SummaryWriter(str(run / "tensorboard"))


def progress_mode(progress) -> str | None:
    """``"bar"`` (a terminal), ``"lines"`` (a log or pipe) or None (off) for a ``progress``
    setting: True / None pick by whether stderr is a terminal, False is off, a mode stays."""
    if progress in ("bar", "lines"):
        return progress
    if progress is False:
        return None
    return "bar" if sys.stderr.isatty() else "lines"


class Progress:
    """One epoch's progress: ``update(done, loss, rate)`` after each step, ``close()`` after
    the last (also on an interrupt: a bar is cleared before any message is printed)."""

    def __init__(self, mode: str | None, epoch: int, total: int, done: int = 0,
                 unit: str = "batch"):
        self.mode, self.epoch, self.total, self.unit = mode, epoch, total, unit
        self.bar, self.last = None, time.monotonic()
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=f"epoch {epoch}", leave=False,
                            unit=unit)

    def update(self, done: int, loss: float, rate: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", items_s=f"{rate:.0f}")
            self.bar.update(done - self.bar.n)
        elif self.mode == "lines" and time.monotonic() - self.last >= PROGRESS_SECONDS:
            self.last = time.monotonic()
            print(f"epoch {self.epoch}: {done}/{self.total} {self.unit}es  loss {loss:.4f}  "
                  f"{rate:.0f} items/s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

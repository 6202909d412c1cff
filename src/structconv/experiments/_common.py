"""Helpers shared by the experiment recipes: hardware record, statistics, output files, plots."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from ..bench._util import conditions
from ..io import RunLock, atomic_write_bytes, atomic_write_json
from ..plots import pyplot

__all__ = ["hardware", "mean_std", "write_result", "save_figure", "set_threads", "fmt_pm",
           "param_count", "run_lock", "run_once", "finished", "Bounded", "Listed", "COUNT",
           "NATURAL", "SEED", "POSITIVE", "NONNEGATIVE", "FRACTION", "UNIT", "DROPOUT",
           "THREADS", "check_finite", "publish", "heads_divide", "heartbeat"]


# -- argument types: every recipe option is checked by argparse, before any work ----------------
class Bounded:
    """An argparse ``type=``: a finite ``kind`` (int or float) in [lo, hi] (``open``: the ends
    excluded); a value outside is refused as ``argument --NAME: must be <range>, got <value>``."""

    def __init__(self, kind=int, lo=None, hi=None, open_lo=False, open_hi=False, note=""):
        self.kind, self.lo, self.hi, self.open_lo, self.open_hi = kind, lo, hi, open_lo, open_hi
        self.note = note
        self.__name__ = kind.__name__  # argparse names the type by it

    def describe(self) -> str:
        """The allowed values in words, e.g. 'an integer >= 1', 'a number in (0, 1)'."""
        what = "an integer" if self.kind is int else "a number"
        lo, hi = ((v if v is None or self.kind is int else f"{v:g}") for v in (self.lo, self.hi))
        if lo is not None and hi is not None:
            left, right = "([" [not self.open_lo], ")]" [not self.open_hi]
            text = f"{what} in {left}{lo}, {hi}{right}"
        elif lo is not None:
            text = f"{what} {'>' if self.open_lo else '>='} {lo}"
        elif hi is not None:
            text = f"{what} {'<' if self.open_hi else '<='} {hi}"
        else:
            text = f"a finite {'integer' if self.kind is int else 'number'}"
        return f"{text} ({self.note})" if self.note else text

    def ok(self, v) -> bool:
        """Whether the (converted) value ``v`` is allowed."""
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.open_lo else v < self.lo):
            return False
        return not (self.hi is not None and (v >= self.hi if self.open_hi else v > self.hi))

    def __call__(self, text: str):
        try:
            v = self.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {text!r}") from None
        if not self.ok(v):
            raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {text}")
        return v

    def bad(self) -> list[str]:
        """Values this type refuses (for the tests): past each end, and not a number."""
        out = ["x", "nan"] if self.kind is float else ["x", "1.5"]
        for end, step, is_open in ((self.lo, -1, self.open_lo), (self.hi, 1, self.open_hi)):
            if end is not None:
                out.append(str(self.kind(end)) if is_open else str(self.kind(end + step)))
        return out

    def __repr__(self) -> str:
        return f"Bounded({self.describe()})"


def items(text: str) -> list[str]:
    """The items of a comma list option (``"a, b,"`` -> ``["a", "b"]``)."""
    return [t.strip() for t in text.split(",") if t.strip()]


class Listed:
    """An argparse ``type=``: a comma list whose every item ``check(item)`` accepts (it raises
    ValueError naming the item otherwise); at least one item. Returns the text unchanged."""

    def __init__(self, check, known=None, empty: bool = False):
        self.check, self.known, self.empty = check, known, empty
        self.__name__ = "list"

    def __call__(self, text: str) -> str:
        names = items(text)
        if not names and not self.empty:
            raise argparse.ArgumentTypeError(f"must name at least one item, got {text!r}")
        for item in names:
            if self.known is not None and item not in self.known:
                raise argparse.ArgumentTypeError(
                    f"unknown item {item!r}: choose from {', '.join(self.known)}")
            try:
                self.check(item)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e).splitlines()[0]) from None
        return text

    @classmethod
    def of(cls, known) -> Listed:
        """A comma list of names from ``known``."""
        return cls(lambda item: None, list(known))


#: the shared ranges: counts (seeds, steps, sizes), counts where 0 means none/default, seeds
COUNT = Bounded(int, 1)
NATURAL = Bounded(int, 0)
SEED = Bounded(int, 0, 2**32 - 1)
POSITIVE = Bounded(float, 0, open_lo=True)
NONNEGATIVE = Bounded(float, 0)
FRACTION = Bounded(float, 0, 1, open_lo=True, open_hi=True)
UNIT = Bounded(float, 0, 1)
DROPOUT = Bounded(float, 0, 1, open_hi=True)
THREADS = Bounded(int, 0, 4096, note="0: torch's default")
#: upper bounds a recipe's sizes and counts keep (a value past them is a typo, refused by name
#: before any work, not an allocation that fails minutes later)
SEEDS = Bounded(int, 1, 1000)
EPOCHS = Bounded(int, 1, 100_000)
BATCH = Bounded(int, 1, 1_000_000)
SAMPLES = Bounded(int, 1, 100_000_000)
WIDTH = Bounded(int, 1, 65_536)


def heads_divide(a) -> None:
    """ValueError unless ``--heads`` divides ``--width`` (each head takes width/heads)."""
    if a.width % a.heads:
        raise ValueError(f"--heads must divide --width ({a.width}), got {a.heads}")


def check_finite(result, where: str = "") -> None:
    """ValueError naming the first entry of ``result`` (nested dicts and lists) that is a float
    but not finite: a published result never holds NaN or infinity."""
    if isinstance(result, float) and not math.isfinite(result):
        raise ValueError(f"{where or 'the result'} is {result}")
    items = result.items() if isinstance(result, dict) else (
        enumerate(result) if isinstance(result, (list, tuple)) else ())
    for k, v in items:
        check_finite(v, f"{where}.{k}" if where else str(k))


def publish(path: str | Path, result: dict) -> Path:
    """Write a published result file atomically, refused (not written) when a metric in it
    is not finite: ValueError naming the file and the metric."""
    path = Path(path)
    try:
        check_finite(result)
    except ValueError as e:
        raise ValueError(f"not writing {path}: {e} (a run diverged or had nothing to "
                         "score: check the recipe's options)") from None
    atomic_write_json(path, result)
    return path


class _Stamped:
    """A text stream that notes when it was last written to (for ``heartbeat``)."""

    def __init__(self, stream, clock: list):
        self._stream, self._clock = stream, clock

    def write(self, text):
        if text:
            self._clock[0] = time.monotonic()
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def heartbeat(what: str, every: float = 8.0):
    """While the block runs, a line on stdout (``<what>: working, N s so far``; stdout, where
    the recipes print their progress, keeps stderr for errors) whenever this
    process has printed nothing for ``every`` seconds (checked each 0.5 s: a line at least
    every 10 s): a long step never looks like a hang."""
    clock, stop, t0 = [time.monotonic()], threading.Event(), time.monotonic()
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Stamped(out, clock), _Stamped(err, clock)

    def beat():
        while not stop.wait(min(0.5, every)):
            if time.monotonic() - clock[0] >= every:
                print(f"{what}: working, {time.monotonic() - t0:.0f} s so far", file=sys.stdout,
                      flush=True)

    thread = threading.Thread(target=beat, name="structconv-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sys.stdout, sys.stderr = out, err


@contextlib.contextmanager
def run_lock(folder: str | Path, name: str, recipe: str):
    """Hold the lock of one run of a recipe (``<folder>/.locks/<name>/.lock``) while it trains:
    a second process asked for the same run (two invocations sharing an ``--out``) is refused
    by name (``io.RunLocked``) instead of training it twice into the same files. The caller
    checks again under the lock whether the run has finished meanwhile."""
    lock = RunLock(Path(folder) / ".locks" / name, f"structconv reproduce {recipe} ({name})")
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def finished(path: str | Path) -> dict | None:
    """The finished run's JSON at ``path``, or None when it has not been written."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def run_once(folder: str | Path, name: str, recipe: str, read, make):
    """A recipe's run, made at most once: ``read()`` (its finished result, or None), else
    ``make()`` under the run's lock (``run_lock``), after reading again there (another
    process may have finished it while this one looked)."""
    done = read()
    if done is not None:
        return done
    with run_lock(folder, name, recipe):
        done = read()
        return done if done is not None else make()


def hardware() -> dict:
    """The machine a result was measured on: CPU, cores, torch threads, load at the start."""
    return conditions()


def set_threads(args) -> None:
    """Apply ``--threads`` (0 or absent: torch's default)."""
    n = getattr(args, "threads", 0) or 0
    if n > 0:
        torch.set_num_threads(n)


def device(args) -> torch.device:
    """The ``--device`` of a run (``auto``: CUDA when there is one), CPU when absent."""
    d = getattr(args, "device", None) or "cpu"
    if d == "auto":
        d = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(d)


def add_recipe_arguments(parser, data_help: str, quick_help: str) -> None:
    """The options the published-number recipes (planetoid, rgcn) share."""
    parser.add_argument("--seeds", type=SEEDS, default=10, help="number of seeds (runs)")
    parser.add_argument("--seed", type=SEED, default=0, help="first seed")
    parser.add_argument("--data", default=None, help=data_help)
    parser.add_argument("--out", default="bench-results", help="output folder")
    parser.add_argument("--epochs", type=EPOCHS, default=None,
                        help="override the recipe's epochs")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--threads", type=THREADS, default=1,
                        help="torch intra-op threads (default 1: full-batch ops on these small "
                             "graphs gain little from more, and contend on a shared CPU; 0 keeps "
                             "torch's default)")


def mean_std(values) -> tuple[float, float]:
    """(mean, sample std) of a list of numbers (std 0 for a single value)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_std needs at least one value")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt_pm(values, digits: int = 2) -> str:
    """'mean ± std' of ``values``."""
    m, s = mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def param_count(module: torch.nn.Module) -> int:
    """Trainable parameters of a module."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def write_result(args, name: str, result: dict) -> Path:
    """Write ``<out>/<name>.json`` atomically and return its path."""
    path = publish(Path(args.out) / f"{name}.json", result)
    print(f"wrote {path}")
    return path


def save_figure(fig, args, name: str, use_plot: bool = True) -> Path:
    """Save a matplotlib figure as ``--plot`` (if given and ``use_plot``: a recipe's first
    figure) or ``<out>/<name>.png``, atomically."""
    import io

    plt = pyplot()
    path = Path(use_plot and getattr(args, "plot", None) or Path(args.out) / f"{name}.png")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    print(f"wrote {path}")
    return path



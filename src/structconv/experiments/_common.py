"""Helpers shared by the experiment recipes: hardware record, statistics, output files, plots."""

from __future__ import annotations

import contextlib
import json
import statistics
from pathlib import Path

import torch

from .._extras import require
from ..bench._util import conditions
from ..io import RunLock, atomic_write_bytes, atomic_write_json

__all__ = ["hardware", "mean_std", "write_result", "save_figure", "set_threads", "fmt_pm",
           "param_count", "run_lock", "run_once", "finished"]


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
    parser.add_argument("--seeds", type=int, default=10, help="number of seeds (runs)")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--data", default=None, help=data_help)
    parser.add_argument("--out", default="bench-results", help="output folder")
    parser.add_argument("--epochs", type=int, default=None, help="override the recipe's epochs")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--threads", type=int, default=1,
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
    path = Path(args.out) / f"{name}.json"
    atomic_write_json(path, result)
    print(f"wrote {path}")
    return path


def save_figure(fig, args, name: str) -> Path:
    """Save a matplotlib figure as ``--plot`` (if given) or ``<out>/<name>.png``, atomically."""
    import io

    plt = pyplot()
    path = Path(getattr(args, "plot", None) or Path(args.out) / f"{name}.png")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    print(f"wrote {path}")
    return path


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (the plots extra)."""
    require("matplotlib", "plots", "the experiment plots").use("Agg")
    return require("matplotlib.pyplot", "plots", "the experiment plots")

"""Recipe: GIN on a TU dataset by 10-fold cross-validation, mean ± std test accuracy over the folds.

``structconv reproduce tu-gin --dataset proteins --out DIR``. Each outer fold trains the shipped
``gin_<dataset>`` config with ``data.options.fold`` set (``structconv train``'s loop): selection on
the fold's inner holdout (Errica et al.'s for PROTEINS and NCI1, a stratified 10% for MUTAG), the
best-validation epoch's weights scored on the fold's test graphs. One fixed configuration, one
run per fold (Errica et al. select among a grid and average three runs per fold: say so beside
their numbers). Every fold is a run directory ``<out>/tu-gin-<dataset>/fold-<i>``, trained at most
once under its lock; an interrupted sweep run again resumes the fold it stopped in and reuses the
finished ones, so it ends with the numbers of an uninterrupted sweep. Writes
``<out>/tu-gin-<dataset>.json``. ``--readout mean`` (or ``max``, ``attention``) trains the same
GIN with that readout in place of the config's sum, under its own name
``tu-gin-<dataset>-<readout>`` (the readout study: the same folds and seed, one key changed).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..models.gin import GIN_READOUTS
from ._common import THREADS, Bounded, fmt_pm, hardware, mean_std, publish, set_threads
from .sweep import Run, config_run

__all__ = ["DATASETS", "QUICK", "QUICK_MODEL", "add_arguments", "run", "fold_run", "sweep_name"]

DATASETS = ("mutag", "proteins", "nci1")
#: the defaults of ``--quick``: three folds for a few epochs (a value given on the command line
#: is kept), of a small GIN (``QUICK_MODEL``): a smoke test, not a result
QUICK = dict(folds=3, epochs=3)
QUICK_MODEL = ["model.gin.hidden=16", "model.gin.layers=2"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="mutag", choices=DATASETS,
                        help="the TU dataset (default mutag); its config is gin_<dataset>")
    parser.add_argument("--folds", type=Bounded(int, 1, 10), default=10,
                        help="outer folds to run, 0..N-1 (default all 10)")
    parser.add_argument("--epochs", type=Bounded(int, 1, 100000), default=None,
                        help="override the config's epochs")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (0: torch's)")
    parser.add_argument("--readout", default=None, choices=GIN_READOUTS,
                        help="the readout in place of the config's (sum); the sweep is then "
                             "named tu-gin-<dataset>-<readout>")


def sweep_name(args) -> str:
    """The sweep's folder and JSON name: ``tu-gin-<dataset>``, plus ``-<readout>`` when one
    is given."""
    readout = getattr(args, "readout", None)
    return f"tu-gin-{args.dataset}" + (f"-{readout}" if readout else "")


def _overrides(args) -> list[str]:
    over = list(QUICK_MODEL) if args.quick else []
    if args.epochs:
        over.append(f"train.epochs={args.epochs}")
    if getattr(args, "readout", None):
        over.append(f"model.gin.readout={args.readout}")
    return [*over, f"seed={args.seed}"]


def fold_run(args, fold: int, folder: Path) -> dict:
    """Fold ``fold``'s result: read where finished, resumed where a checkpoint was left,
    trained otherwise (under the fold's lock)."""
    run = Run(f"fold-{fold}", f"gin_{args.dataset}",
              (*_overrides(args), f"data.options.fold={fold}"))
    return config_run(folder, run, "tu-gin", args.device)


def run(args) -> int:
    """Train every fold (or read it), print each and the mean ± std, write the JSON."""
    set_threads(args)
    folds = args.folds
    name = sweep_name(args)
    folder = Path(args.out) / name
    t0 = time.perf_counter()
    rows = []
    for i in range(folds):
        r = fold_run(args, i, folder)
        rows.append({"fold": i, "test_acc": 100 * r["test_acc"], "val_acc": 100 * r["val_acc"],
                     "best_epoch": r["best_epoch"], "epochs": r["epochs"],
                     "train_time_s": r["train_time_s"]})
        print(f"  fold {i}  test {rows[-1]['test_acc']:.1f}  val {rows[-1]['val_acc']:.1f}  "
              f"epoch {r['best_epoch']}/{r['epochs']}  {r['train_time_s']:.1f}s", flush=True)
    accs = [r["test_acc"] for r in rows]
    m, s = mean_std(accs)
    print(f"GIN ({args.readout or 'config'} readout) on {args.dataset.upper()}: test accuracy "
          f"{fmt_pm(accs, 1)} % over {folds} folds")
    out = Path(args.out) / f"{name}.json"
    publish(out, dict(experiment="tu-gin", dataset=args.dataset, config=f"gin_{args.dataset}",
                      readout=args.readout,
                      overrides=_overrides(args), folds=folds, quick=bool(args.quick),
                      test_acc_mean=m, test_acc_std=s, runs=rows, hardware=hardware(),
                      seconds=time.perf_counter() - t0))
    print(f"wrote {out}")
    return 0

"""Recipe: node classification on typed graphs (DBLP authors, IMDB movies), Macro-F1 and Micro-F1.

``structconv reproduce hetero --models sage,rgcn,hgt,han,gat --datasets dblp,imdb --seeds 10``
(seeds ``--seed`` on). Each (model, dataset, seed) trains the shipped
``hetero_<model>_<dataset>`` config (full batch, ``structconv train``'s loop) with ``seed`` set:
the best-validation epoch's weights (validation accuracy, i.e. Micro-F1) scored on the test
nodes. Every run is a run directory
``<out>/hetero/<model>-<dataset>-seed<s>``, trained at most once under its lock; an interrupted
sweep run again resumes where it stopped. Prints and writes ``<out>/hetero.json``: mean ± std
of the test Macro-F1 and Micro-F1 per model and dataset, and every run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ._common import (
    THREADS,
    Bounded,
    Listed,
    fmt_pm,
    hardware,
    items,
    mean_std,
    publish,
    set_threads,
)
from .sweep import Run, sweep

__all__ = ["MODELS", "DATASETS", "QUICK", "QUICK_MODEL", "add_arguments", "check_arguments",
           "run", "runs"]

MODELS = ("sage", "rgcn", "hgt", "han", "gat")
DATASETS = ("dblp", "imdb")
#: the defaults of ``--quick`` (a value given on the command line is kept): two seeds of two
#: epochs on IMDB, of narrow models (``QUICK_MODEL``): a smoke test, not a result
QUICK = dict(seeds=2, epochs=2, datasets="imdb")
QUICK_MODEL = ["model.hetero.hidden=8"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", type=Listed.of(MODELS), default=",".join(MODELS),
                        help=f"comma list of models (default {','.join(MODELS)}); the config "
                             "of each is hetero_<model>_<dataset>")
    parser.add_argument("--datasets", type=Listed.of(DATASETS), default=",".join(DATASETS),
                        help="comma list of typed graphs (default dblp,imdb)")
    parser.add_argument("--seeds", type=Bounded(int, 1, 100), default=10,
                        help="seeds per model and dataset (default 10)")
    parser.add_argument("--epochs", type=Bounded(int, 1, 100_000), default=None,
                        help="override the configs' epochs")
    parser.add_argument("--data", default=None,
                        help="folder of the dataset's raw files (one dataset only; default: "
                             "the data home's hetero/DBLP or hetero/IMDB)")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (0: torch's)")


def check_arguments(args) -> None:
    """ValueError where options do not fit together."""
    if args.data is not None and len(items(args.datasets)) != 1:
        raise ValueError(f"--data is one dataset's folder: give one --datasets, got "
                         f"{args.datasets!r}")


def runs(args) -> list[tuple[str, str, int, Run]]:
    """The sweep's (model, dataset, seed, run): models innermost, then seeds, datasets
    outermost (a sweep cut short has as many seeds of every model)."""
    over = list(QUICK_MODEL) if args.quick else []
    if args.epochs:
        over.append(f"train.epochs={args.epochs}")
    if args.data is not None:
        over.append(f"data.root={str(args.data)!r}")
    out = []
    for ds in items(args.datasets):
        for s in range(args.seed, args.seed + args.seeds):
            for model in items(args.models):
                out.append((model, ds, s, Run(f"{model}-{ds}-seed{s}", f"hetero_{model}_{ds}",
                                              (*over, f"seed={s}"))))
    return out


def _summary(rows: list[dict]) -> list[dict]:
    """Mean ± std of the test F1 scores per (model, dataset), in the runs' order."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["dataset"]), []).append(r)
    out = []
    for (model, ds), rs in groups.items():
        entry = {"model": model, "dataset": ds, "seeds": len(rs)}
        for k in ("test_macro_f1", "test_micro_f1", "val_micro_f1"):
            entry[f"{k}_mean"], entry[f"{k}_std"] = mean_std([r[k] for r in rs])
        out.append(entry)
    return out


def run(args) -> int:
    """Train every run (or read it), print each and the table, write the JSON."""
    set_threads(args)
    folder = Path(args.out) / "hetero"
    t0 = time.perf_counter()
    todo, rows = runs(args), []
    meta = {r.name: (model, ds, seed) for model, ds, seed, r in todo}

    def report(r: Run, res: dict) -> None:
        model, ds, seed = meta[r.name]
        rows.append({"model": model, "dataset": ds, "seed": seed,
                     **{k: 100 * res[k] for k in ("test_macro_f1", "test_micro_f1",
                                                  "val_macro_f1", "val_micro_f1")},
                     "best_epoch": res["best_epoch"], "epochs": res["epochs"],
                     "train_time_s": res["train_time_s"]})
        print(f"  {r.name:22s} test Macro-F1 {rows[-1]['test_macro_f1']:.2f}  Micro-F1 "
              f"{rows[-1]['test_micro_f1']:.2f}  epoch {res['best_epoch']}/{res['epochs']}  "
              f"{res['train_time_s']:.1f}s", flush=True)

    sweep(folder, [r for *_, r in todo], "hetero", args.device, report)
    table = _summary(rows)
    for e in table:
        rs = [r for r in rows if (r["model"], r["dataset"]) == (e["model"], e["dataset"])]
        print(f"{e['model']:5s} {e['dataset']:5s} test Macro-F1 "
              f"{fmt_pm([r['test_macro_f1'] for r in rs])}  Micro-F1 "
              f"{fmt_pm([r['test_micro_f1'] for r in rs])}  ({e['seeds']} seeds)")
    out = Path(args.out) / "hetero.json"
    publish(out, dict(experiment="hetero", models=items(args.models),
                      datasets=items(args.datasets), seeds=args.seeds,
                      first_seed=args.seed, epochs=args.epochs, quick=bool(args.quick),
                      summary=table, runs=rows, hardware=hardware(),
                      seconds=time.perf_counter() - t0))
    print(f"wrote {out}")
    return 0

"""Recipe: GIN and GINE on HIV molecules (OGB-like scaffold split), test ROC-AUC over seeds.

``structconv reproduce hiv --models gin,gine --seeds 10 --out DIR``. Each (model, seed) trains the
shipped ``gin_hiv`` config (OGB's GIN: 5 layers of 300 channels, batch norm, mean readout,
dropout 0.5, Adam at 1e-3, batches of 32, 100 epochs): ``gine`` reads OGB's bond features
through a projection per layer (what OGB's leaderboard calls GIN), ``gin`` turns them off. The
epoch of best validation ROC-AUC is scored on the test molecules. The split is computed here
(Bemis-Murcko scaffolds, the sizes of OGB's split), not read from OGB's files: results are
"OGB-like". Every run is a run directory ``<out>/hiv/<model>-seed<s>``, trained at most once
under its lock (an interrupted sweep resumes). Writes ``<out>/hiv.json``.
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

__all__ = ["MODELS", "QUICK", "QUICK_OVERRIDES", "add_arguments", "runs", "run"]

#: the recipe's models: the overrides that make each from ``gin_hiv``
MODELS = {"gin": ("model.gin.edge_features=false",),
          "gine": ("model.gin.edge_features=true",)}
#: the defaults of ``--quick`` (a value given on the command line is kept), with
#: ``QUICK_OVERRIDES``: one seed of a 2-layer GIN of 16 channels on the first 1,000 molecules
#: for one epoch (a smoke test, not a result)
QUICK = dict(seeds=1, epochs=1)
QUICK_OVERRIDES = ("data.options.limit=1000", "model.gin.hidden=16", "model.gin.layers=2")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", type=Listed.of(MODELS), default="gin,gine",
                        help="comma list from gin, gine (default both)")
    parser.add_argument("--seeds", type=Bounded(int, 1, 1000), default=10,
                        help="runs per model, seeds SEED..SEED+N-1 (default 10, OGB's count)")
    parser.add_argument("--epochs", type=Bounded(int, 1, 100000), default=None,
                        help="override the config's 100")
    parser.add_argument("--hidden", type=Bounded(int, 1, 4096), default=None,
                        help="override the config's 300 channels (a smaller CPU budget)")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (0: torch's)")


def runs(args) -> list[Run]:
    """The sweep: one run of ``gin_hiv`` per (model, seed), in that order."""
    over = list(QUICK_OVERRIDES) if args.quick else []
    if args.hidden:
        over.append(f"model.gin.hidden={args.hidden}")
    if args.epochs:
        over.append(f"train.epochs={args.epochs}")
    return [Run(f"{m}-seed{s}", "gin_hiv", (*MODELS[m], *over, f"seed={s}"))
            for m in items(args.models) for s in range(args.seed, args.seed + args.seeds)]


def run(args) -> int:
    """Train (or read) every run, print each and each model's mean ± std, write the JSON."""
    set_threads(args)
    t0 = time.perf_counter()
    todo = runs(args)
    rows = []

    def report(r: Run, res: dict) -> None:
        model, seed = r.name.rsplit("-seed", 1)
        rows.append({"model": model, "seed": int(seed), "test_auc": res.get("test_auc"),
                     "val_auc": res.get("val_auc"), "best_epoch": res.get("best_epoch"),
                     "epochs": res.get("epochs"), "train_time_s": res.get("train_time_s")})
        print(f"  {r.name}  test ROC-AUC {res.get('test_auc', float('nan')):.4f}  val "
              f"{res.get('val_auc', float('nan')):.4f}  epoch {res.get('best_epoch')}/"
              f"{res.get('epochs')}  {res.get('train_time_s', 0.0):.0f}s", flush=True)

    sweep(Path(args.out) / "hiv", todo, "hiv", args.device, report)
    summary = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        aucs = [r["test_auc"] for r in rows if r["model"] == model and r["test_auc"] is not None]
        if aucs:
            m, s = mean_std(aucs)
            summary[model] = {"test_auc_mean": m, "test_auc_std": s, "runs": len(aucs)}
            print(f"{model.upper()} on HIV (OGB-like scaffold split): test ROC-AUC "
                  f"{fmt_pm(aucs, 4)} over {len(aucs)} seeds")
    out = Path(args.out) / "hiv.json"
    publish(out, dict(experiment="hiv", config="gin_hiv", quick=bool(args.quick),
                      overrides={r.name: list(r.overrides) for r in todo}, summary=summary,
                      runs=rows, split="OGB-like scaffold split (computed, not OGB's files)",
                      hardware=hardware(), seconds=time.perf_counter() - t0))
    print(f"wrote {out}")
    return 0

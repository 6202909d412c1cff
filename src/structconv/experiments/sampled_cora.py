"""Recipe: GCN on Cora full batch vs sampled mini-batches, mean ± std test accuracy over seeds.

``structconv reproduce sampled-cora --seeds 10 --out DIR``. Each seed trains the shipped
``gcn_cora`` config three ways with ``structconv train``'s trainer: full batch; ``[train.sampler]``
with fanouts ["all", "all"] (every neighbour: the same gradients up to the dropout masks, so the
accuracy must agree with full batch within the seeds' spread); and fanouts (10, 10) (the
accuracy cost of sampling). Batches of 256 seeds cover Cora's 140 training nodes, so every way
takes one step per epoch. Every (variant, seed) is a run of the training engine in
``<out>/sampled-cora-<tag>/<variant>-seed-<s>`` (``tag``: a hash of the settings), read back where
finished and resumed where interrupted, under the run's lock (``experiments.sweep``): two
processes sharing an ``--out`` split the runs between them. Writes ``<out>/sampled-cora.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..config import load_config
from ._common import (  # argument types
    THREADS,
    Bounded,
    fmt_pm,
    hardware,
    mean_std,
    publish,
    set_threads,
)
from .sweep import Run, quoted, settings_tag, sweep

__all__ = ["VARIANTS", "CONFIG", "add_arguments", "overrides", "seed_runs", "run"]

#: the shipped config every variant overrides
CONFIG = "gcn_cora"
#: the ways of training, as overrides of the shipped gcn_cora config
VARIANTS = {
    "full_batch": [],
    "fanout_all": ['train.sampler={fanouts = ["all", "all"], batch_size = 256}'],
    "fanout_10_10": ["train.sampler={fanouts = [10, 10], batch_size = 256}"],
}


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(seeds=1, epochs=20)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=Bounded(int, 1, 1000), default=10,
                        help="number of seeds (runs)")
    parser.add_argument("--data", default=None, help="folder with Cora's ind.cora.* files "
                                                     "(default: planetoid/ in the data home, see "
                                                     "`structconv datasets`)")
    parser.add_argument("--epochs", type=Bounded(int, 1, 100000), default=None,
                        help="override the 200 epochs")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (0: torch's)")


def overrides(args) -> list[str]:
    """The overrides of the config that the arguments ask for (all but variant and seed)."""
    over = []
    if args.epochs:
        over.append(f"train.epochs={args.epochs}")
    if args.data:
        over.append(f"data.root={quoted(args.data)}")
    return over


def seed_runs(args, seed0: int) -> list[Run]:
    """Every run of the sweep, seed by seed and variant by variant (the order they train in)."""
    over = overrides(args)
    return [Run(f"{v}-seed-{s}", CONFIG, (*VARIANTS[v], f"seed={s}", *over))
            for s in range(seed0, seed0 + args.seeds) for v in VARIANTS]


def _row(run: Run, res: dict) -> dict:
    seed = int(run.name.rsplit("-", 1)[1])
    return dict(seed=seed, test_acc=100 * res["test_acc"], val_acc=100 * res["val_acc"],
                best_epoch=res["best_epoch"], epochs=res["epochs"],
                seconds=res["train_time_s"])


def run(args) -> int:
    """Train every variant for every seed, print a table and write the JSON."""
    set_threads(args)
    n_seeds = args.seeds
    seed0 = args.seed or 0
    t0 = time.perf_counter()
    load_config(CONFIG, overrides(args))  # refuses a bad override before any run
    folder = Path(args.out) / f"sampled-cora-{settings_tag(CONFIG, overrides(args))}"
    runs: dict[str, list] = {v: [] for v in VARIANTS}

    def report(run: Run, res: dict) -> None:
        r, v = _row(run, res), run.name.rsplit("-seed-", 1)[0]
        runs[v].append(r)
        print(f"  seed {r['seed']:>3}  {v:<13} test {r['test_acc']:.1f}  val "
              f"{r['val_acc']:.1f}  epoch {r['best_epoch']}/{r['epochs']}  "
              f"{r['seconds']:.1f}s", flush=True)

    device = getattr(args, "device", None) or "cpu"
    sweep(folder, seed_runs(args, seed0), "sampled-cora", device, report)
    summary = {}
    for v, rs in runs.items():
        m, s = mean_std([r["test_acc"] for r in rs])
        summary[v] = dict(test_acc_mean=m, test_acc_std=s,
                          seconds_mean=mean_std([r["seconds"] for r in rs])[0])
        print(f"{v:<13} test accuracy {fmt_pm([r['test_acc'] for r in rs])} %  "
              f"({summary[v]['seconds_mean']:.1f} s a run)")
    full = summary["full_batch"]["test_acc_mean"]
    for v in ("fanout_all", "fanout_10_10"):
        summary[v]["minus_full_batch"] = summary[v]["test_acc_mean"] - full
    print(f"fanout all - full batch: {summary['fanout_all']['minus_full_batch']:+.2f} points; "
          f"fanouts (10, 10) - full batch: {summary['fanout_10_10']['minus_full_batch']:+.2f}")
    out = Path(args.out) / "sampled-cora.json"
    publish(out, dict(experiment="sampled-cora", seeds=n_seeds, quick=bool(args.quick),
                                variants=VARIANTS, summary=summary, runs=runs,
                                hardware=hardware(), seconds=time.perf_counter() - t0))
    print(f"wrote {out}")
    return 0

"""Recipe: GCN / ChebNet / SGC / GAT on Planetoid's public split, mean ± std test accuracy.

``structconv reproduce planetoid --model gcn --dataset cora --seeds 10 --data DIR --out DIR``.
Each model is a shipped config (``planetoid_<model>``: PyG's reference hyper-parameters, L2 on
the first layer for GCN and ChebNet) with the dataset's own settings as overrides
(``PER_DATASET``); every seed is a run of the training engine in
``<out>/planetoid-<model>-<dataset>-<tag>/seed-<s>`` (``tag``: a hash of the settings), read
back where finished and resumed where interrupted. The reported test accuracy is the one at
the epoch of best validation accuracy (ties: lower validation loss; ``train.select``). The
engine draws the same random numbers as the loop this recipe had before (the seed, then the
model, then each epoch's dropout), so the numbers are those of that loop. Writes
``<out>/planetoid-<model>-<dataset>.json``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch

from ..config import load_config
from ..data.planetoid import PLANETOID_NAMES, shared_dir
from ..data.registry import data_root
from ..training import load_run
from ..training.tasks import task_for
from ._common import add_recipe_arguments, publish, set_threads
from .sweep import Run, history, quoted, settings_tag, sweep

__all__ = ["CONFIGS", "PER_DATASET", "PUBLISHED", "QUICK", "add_arguments", "run", "overrides",
           "settings", "seed_runs"]

#: published test accuracy (%) on the public split (REFERENCES.md)
PUBLISHED = {
    "gcn": {"cora": 81.5, "citeseer": 70.3, "pubmed": 79.0},
    "cheb": {"cora": 81.2, "citeseer": 69.8, "pubmed": 74.4},
    "sgc": {"cora": 81.0, "citeseer": 71.9, "pubmed": 78.9},
    "gat": {"cora": 83.0, "citeseer": 72.5, "pubmed": 79.0},
}
#: each model's shipped config (its Cora settings)
CONFIGS = {m: f"planetoid_{m}" for m in PUBLISHED}
#: PyG's reference settings where a dataset's differ from Cora's
PER_DATASET = {
    "cheb": {"citeseer": ["model.graph.K=2"], "pubmed": ["model.graph.K=2"]},
    "sgc": {"citeseer": ["model.graph.K=2", "train.weight_decay=5e-3"],
            "pubmed": ["model.graph.K=2"]},
    "gat": {"pubmed": ["model.graph.out_heads=8", "train.lr=0.01", "train.weight_decay=1e-3"]},
}
_DISPLAY = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(seeds=2, epochs=20)


def overrides(model: str, dataset: str, data: str | None = None, epochs: int | None = None,
              stopping: str | None = None) -> list[str]:
    """The overrides of ``model``'s config for ``dataset`` (every seed's but the seed)."""
    if model not in CONFIGS:
        raise ValueError(f"unknown model {model!r}: choose one of {sorted(CONFIGS)}")
    over = [f'data.name="{dataset}"', *PER_DATASET.get(model, {}).get(dataset, [])]
    if data is not None:
        over.append(f"data.root={quoted(data)}")
    if epochs:
        over.append(f"train.epochs={epochs}")
    if stopping == "gat":
        over.append('train.select="gat"')
    return over



def settings(model: str, dataset: str, **kw) -> dict:
    """The recipe's hyper-parameters for ``model`` on ``dataset`` (the config's model table
    and training keys after the overrides)."""
    over = overrides(model, dataset, **kw)
    cfg = load_config(CONFIGS[model], over)
    t = cfg["train"]
    return {**cfg["model"]["graph"], **{k: t[k] for k in (
        "lr", "weight_decay", "decay", "epochs", "patience", "select")}}


def seed_runs(args) -> tuple[str, list[Run]]:
    """(the sweep's folder name, one run per seed)."""
    over = overrides(args.model, args.dataset, args.data, args.epochs,
                     getattr(args, "stopping", None))
    name = f"planetoid-{args.model}-{args.dataset}-{settings_tag(CONFIGS[args.model], over)}"
    seed0 = getattr(args, "seed", 0) or 0
    return name, [Run(f"seed-{s}", CONFIGS[args.model], (*over, f"seed={s}"))
                  for s in range(seed0, seed0 + args.seeds)]


def _last_test_acc(run_dir: Path, device: str) -> float:
    """The test accuracy of the last epoch's weights (what the validation selection adds)."""
    cfg, data, model = load_run(run_dir, "last", device)
    return 100 * task_for(cfg, data).evaluate(model, "test")["acc"]


def _row(folder: Path, run: Run, r: dict, device: str) -> dict:
    h = history(folder, run)
    return dict(seed=int(run.name.split("-")[1]), epoch=r["best_epoch"],
                val_acc=100 * r["val_acc"], test_acc=100 * r["test_acc"], epochs_run=len(h),
                last_val_acc=100 * h[-1]["val_acc"],
                last_test_acc=_last_test_acc(folder / run.name, device),
                seconds=r["train_time_s"], train_loss=[row["train_loss"] for row in h])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=sorted(CONFIGS), default="gcn")
    parser.add_argument("--dataset", choices=PLANETOID_NAMES, default="cora")
    add_recipe_arguments(parser, "folder with the ind.<name>.* files (default: planetoid/ "
                                 "in the data home, see `structconv datasets`)",
                         "2 seeds, 20 epochs (smoke test)")
    parser.add_argument("--stopping", choices=("val_acc", "gat"), default=None,
                        help="model selection: best validation accuracy (default), or the GAT "
                             "paper's rule (best accuracy and loss; patience counts epochs in "
                             "which neither improves)")


def run(args) -> int:
    """Run the recipe over seeds, print a table and write the JSON; returns an exit code."""
    set_threads(args)
    if args.data is None and shared_dir("planetoid") is None:
        raise FileNotFoundError(f"no Planetoid folder in the data home ({data_root()}): pass "
                                "--data DIR or set STRUCTCONV_DATA (see `structconv datasets`)")
    dev = getattr(args, "device", None) or "cpu"
    name, runs = seed_runs(args)
    folder = Path(args.out) / name
    t0 = time.perf_counter()
    rows = []

    def report(run: Run, r: dict) -> None:
        rows.append(_row(folder, run, r, dev))
        x = rows[-1]
        print(f"  seed {x['seed']:>3}: test {x['test_acc']:.1f}  val {x['val_acc']:.1f}  "
              f"epoch {x['epoch']}/{x['epochs_run']}  {x['seconds']:.1f}s", flush=True)

    sweep(folder, runs, "planetoid", dev, report)
    wall = time.perf_counter() - t0
    accs = [r["test_acc"] for r in rows]
    mean = statistics.fmean(accs)
    std = statistics.stdev(accs) if len(accs) > 1 else 0.0
    last = [r["last_test_acc"] for r in rows]
    pub = PUBLISHED[args.model][args.dataset]
    display = _DISPLAY[args.dataset]
    result = dict(
        recipe="planetoid", model=args.model, dataset=display,
        settings=settings(args.model, args.dataset, data=args.data, epochs=args.epochs,
                          stopping=getattr(args, "stopping", None)),
        config=CONFIGS[args.model], overrides=list(runs[0].overrides[:-1]), seeds=len(rows),
        test_acc_mean=mean, test_acc_std=std, published=pub,
        last_epoch_test_acc_mean=statistics.fmean(last),
        last_epoch_test_acc_std=statistics.stdev(last) if len(last) > 1 else 0.0,
        within_one_std=abs(mean - pub) <= std, wall_seconds=wall,
        hardware=dict(machine=platform.machine(), processor=platform.processor(),
                      threads=torch.get_num_threads(), device=dev),
        torch=torch.__version__, runs=rows,
    )
    print(f"{'model':<6} {'dataset':<9} {'test acc (%)':>16} {'published':>9} {'wall':>8}")
    print(f"{args.model:<6} {display:<9} {mean:>9.2f} ± {std:<4.2f} {pub:>9.1f} {wall:>7.1f}s")
    publish(Path(args.out) / f"planetoid-{args.model}-{args.dataset}.json", result)
    return 0

"""Index-based plus content-based heads on graphs: GAT heads and GCN heads in one layer.

``structconv reproduce mixed-heads --datasets cora,citeseer --seeds 3 --out runs``. Every model
is two layers of one structured convolution each, basis ``sc.basis.Stack([GAT attention heads
(content-based, per-edge softmax), Â^1..Â^h (index-based, GCN-normalised powers)])`` and a
``LowRank`` theta (one value map per head, head outputs concatenated in layer 1 and averaged in
layer 2). Variants (layer-1 heads × channels per head):

* ``gat``: 8 attention heads × 8 (the GAT of Veličković et al.);
* ``gcn``: 1 index head Â × 64 (a 64-wide GCN);
* ``diffusion``: index heads Â^1..Â^4 × 16;
* ``mixed``: 4 attention heads + Â^1..Â^4, × 8 (the same 64 width);
* ``gat+gcn``: the 8 GAT heads + Â^1, Â^2, × 8 (80 wide).

All train with GAT's recipe on the public Planetoid split (Adam 0.005, L2 5e-4, dropout 0.6),
shortened to at most 250 epochs with patience 50; test accuracy at the epoch of best validation
accuracy (ties: lower validation loss), mean ± std over seeds. Each variant is the shipped
config ``mixed_heads_cora`` (``[model.graph] kind = "heads"``) with the variant's heads and the
dataset as overrides; every seed is a run of the training engine in
``<out>/mixed-heads-<hash>/<dataset>-<variant>-seed-<s>``, read back where finished and resumed
where interrupted. The engine draws the random numbers the loop this recipe had before drew
(the seed, the model, each epoch's dropout) and sums the loss where the loop averaged it: the
last digits of a run's numbers may differ.
Writes ``<out>/mixed_heads.json`` and a PNG.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..data.planetoid import PLANETOID_NAMES, shared_dir
from ..data.registry import data_root
from ..models.mixed import HeadsLayer, HeadsNet
from ._common import (
    DROPOUT,
    NONNEGATIVE,
    POSITIVE,
    SEEDS,
    THREADS,
    Bounded,
    Listed,
    hardware,
    mean_std,
    pyplot,
    save_figure,
    set_threads,
    write_result,
)
from .sweep import Run, quoted, settings_tag, sweep

__all__ = ["VARIANTS", "CONFIG", "HeadsLayer", "HeadsNet", "add_arguments", "run",
           "variant_overrides"]

CONFIG = "mixed_heads_cora"
#: variant -> (attention heads, index hops h (heads Â^1..Â^h), channels per head) in layer 1
VARIANTS = {
    "gat": (8, 0, 8),
    "gcn": (0, 1, 64),
    "diffusion": (0, 4, 16),
    "mixed": (4, 4, 8),
    "gat+gcn": (8, 2, 8),
}


def _overrides(args) -> list[str]:
    """The overrides every run shares (the training settings the arguments give)."""
    over = [f"train.epochs={args.epochs}", f"train.patience={args.patience}",
            f"train.lr={args.lr}", f"train.weight_decay={args.weight_decay}",
            f"model.graph.dropout={args.dropout}",
            f"model.graph.sparse={str(not args.dense_input).lower()}"]
    return over + ([f"data.root={quoted(args.data)}"] if args.data else [])


def variant_overrides(variant: str, dataset: str) -> list[str]:
    """The overrides that make ``mixed_heads_cora`` the variant ``variant`` on ``dataset``."""
    att, hops, r = VARIANTS[variant]
    return [f'data.name="{dataset}"', f"model.graph.heads={att}", f"model.graph.hops={hops}",
            f"model.graph.hidden={r}"]


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(seeds=1, epochs=3, datasets="cora")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--datasets", default="cora,citeseer", type=Listed.of(PLANETOID_NAMES),
                        help="comma list of Planetoid datasets")
    parser.add_argument("--variants", default=",".join(VARIANTS), type=Listed.of(VARIANTS),
                        help=f"comma list of {list(VARIANTS)}")
    parser.add_argument("--seeds", type=SEEDS, default=3)
    parser.add_argument("--data", default=None, help="Planetoid folder (ind.* files)")
    parser.add_argument("--epochs", type=Bounded(int, 1, 100_000), default=250,
                        help="maximum epochs")
    parser.add_argument("--patience", type=Bounded(int, 1, 100_000), default=50)
    parser.add_argument("--lr", type=POSITIVE, default=0.005)
    parser.add_argument("--weight-decay", type=NONNEGATIVE, default=5e-4)
    parser.add_argument("--dropout", type=DROPOUT, default=0.6)
    parser.add_argument("--dense-input", action="store_true",
                        help="feed the features dense (default: sparse COO, same results)")
    parser.add_argument("--threads", type=THREADS, default=0, help="torch threads (0: default)")
    parser.add_argument("--plot", default=None, help="PNG path (default <out>/mixed_heads.png)")


def _cell(args, folder: Path, shared: list, ds: str, v: str) -> dict:
    """Variant ``v`` on dataset ``ds`` over the seeds: the sweep's runs, mean ± std."""
    runs = [Run(f"{ds}-{v}-seed-{s}", CONFIG, (*shared, *variant_overrides(v, ds), f"seed={s}"))
            for s in range(args.seed, args.seed + args.seeds)]
    res = sweep(folder, runs, "mixed-heads", getattr(args, "device", None) or "cpu")
    rows = [dict(seed=args.seed + i, epoch=r["best_epoch"], val_acc=100 * r["val_acc"],
                 test_acc=100 * r["test_acc"], epochs_run=r["epochs"],
                 seconds=r["train_time_s"], params=r["parameters"]) for i, r in enumerate(res)]
    m, s = mean_std([r["test_acc"] for r in rows])
    cell = dict(test_acc_mean=m, test_acc_std=s, params=rows[0]["params"],
                seconds_per_run=mean_std([r["seconds"] for r in rows])[0], runs=rows)
    print(f"  {ds:<9} {v:<10} test {m:6.2f} ± {s:4.2f}  params {rows[0]['params']:>7}  "
          f"{cell['seconds_per_run']:.1f}s/run", flush=True)
    return cell


def run(args) -> int:
    """All variants × datasets × seeds; prints the table, writes JSON and PNG."""
    set_threads(args)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variants {bad}: choose from {list(VARIANTS)}")
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if args.data is None and shared_dir("planetoid") is None:
        raise FileNotFoundError(f"no Planetoid folder in the data home ({data_root()}): pass "
                                "--data DIR or set STRUCTCONV_DATA (see `structconv datasets`)")
    t_all = time.perf_counter()
    shared = _overrides(args)
    folder = Path(args.out) / f"mixed-heads-{settings_tag(CONFIG, shared)}"
    table = {ds: {v: _cell(args, folder, shared, ds, v) for v in variants}
             for ds in datasets}
    wall = time.perf_counter() - t_all
    print(f"{'variant':<10} {'heads (att, hops, r)':>20} " +
          " ".join(f"{d:>16}" for d in datasets))
    for v in variants:
        cells = " ".join(f"{table[d][v]['test_acc_mean']:>9.2f} ± "
                         f"{table[d][v]['test_acc_std']:<4.2f}" for d in datasets)
        print(f"{v:<10} {str(VARIANTS[v]):>20} {cells}")
    result = dict(experiment="mixed_heads", variants={v: VARIANTS[v] for v in variants},
                  settings=dict(seeds=args.seeds, epochs=args.epochs, patience=args.patience,
                                lr=args.lr, weight_decay=args.weight_decay,
                                dropout=args.dropout),
                  results=table, wall_seconds=wall, hardware=hardware())
    write_result(args, "mixed_heads", result)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    w = 0.8 / max(1, len(datasets))
    for j, d in enumerate(datasets):
        xs = [i + j * w for i in range(len(variants))]
        ax.bar(xs, [table[d][v]["test_acc_mean"] for v in variants], w,
               yerr=[table[d][v]["test_acc_std"] for v in variants], capsize=3, label=d)
    ax.set_xticks([i + w * (len(datasets) - 1) / 2 for i in range(len(variants))])
    ax.set_xticklabels(variants)
    lo = min(table[d][v]["test_acc_mean"] for d in datasets for v in variants)
    ax.set_ylim(max(0.0, lo - 10), None)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"attention + index heads, Planetoid public split ({args.seeds} seeds)")
    ax.legend()
    save_figure(fig, args, "mixed_heads")
    return 0

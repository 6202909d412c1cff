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
accuracy, mean ± std over seeds.
Writes ``<out>/mixed_heads.json`` and a PNG.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

from ..data.planetoid import PLANETOID_NAMES, load_planetoid, shared_dir
from ..data.registry import data_root
from ..models.mixed import HeadsLayer, HeadsNet
from ._common import (
    COUNT,
    DROPOUT,
    NONNEGATIVE,
    POSITIVE,
    THREADS,
    Listed,
    hardware,
    mean_std,
    pyplot,
    save_figure,
    set_threads,
    write_result,
)

__all__ = ["VARIANTS", "HeadsLayer", "HeadsNet", "add_arguments", "run"]

#: variant -> (attention heads, index hops h (heads Â^1..Â^h), channels per head) in layer 1
VARIANTS = {
    "gat": (8, 0, 8),
    "gcn": (0, 1, 64),
    "diffusion": (0, 4, 16),
    "mixed": (4, 4, 8),
    "gat+gcn": (8, 2, 8),
}


def train_seed(data, variant: str, seed: int, args) -> dict:
    """One run; test accuracy at the epoch of best validation accuracy (ties: lower loss)."""
    torch.manual_seed(seed)
    att, hops, r = VARIANTS[variant]
    net = HeadsNet(data.edge_index, data.num_nodes, data.num_features, data.num_classes, att,
                   hops, r, args.dropout, sparse=not args.dense_input)
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=args.lr, weight_decay=args.weight_decay)
    x, y = data.x, data.y
    best, out, since = (-1.0, math.inf), {}, 0
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        net.train()
        opt.zero_grad()
        F.cross_entropy(net(x)[data.train_mask], y[data.train_mask]).backward()
        opt.step()
        net.eval()
        with torch.no_grad():
            logits = net(x)
            pred = logits.argmax(1)
            vl = float(F.cross_entropy(logits[data.val_mask], y[data.val_mask]))
            va = float((pred[data.val_mask] == y[data.val_mask]).float().mean())
            te = float((pred[data.test_mask] == y[data.test_mask]).float().mean())
        if (va, -vl) > (best[0], -best[1]):
            best, since = (va, vl), 0
            out = dict(epoch=epoch, val_acc=100 * va, test_acc=100 * te)
        else:
            since += 1
            if since >= args.patience:
                break
    out.update(seed=seed, epochs_run=epoch, seconds=time.perf_counter() - t0,
               params=sum(p.numel() for p in params))
    return out


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(seeds=1, epochs=3, datasets="cora")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--datasets", default="cora,citeseer", type=Listed.of(PLANETOID_NAMES),
                        help="comma list of Planetoid datasets")
    parser.add_argument("--variants", default=",".join(VARIANTS), type=Listed.of(VARIANTS),
                        help=f"comma list of {list(VARIANTS)}")
    parser.add_argument("--seeds", type=COUNT, default=3)
    parser.add_argument("--data", default=None, help="Planetoid folder (ind.* files)")
    parser.add_argument("--epochs", type=COUNT, default=250, help="maximum epochs")
    parser.add_argument("--patience", type=COUNT, default=50)
    parser.add_argument("--lr", type=POSITIVE, default=0.005)
    parser.add_argument("--weight-decay", type=NONNEGATIVE, default=5e-4)
    parser.add_argument("--dropout", type=DROPOUT, default=0.6)
    parser.add_argument("--dense-input", action="store_true",
                        help="feed the features dense (default: sparse COO, same results)")
    parser.add_argument("--threads", type=THREADS, default=0, help="torch threads (0: default)")
    parser.add_argument("--plot", default=None, help="PNG path (default <out>/mixed_heads.png)")


def run(args) -> int:
    """All variants × datasets × seeds; prints the table, writes JSON and PNG."""
    set_threads(args)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variants {bad}: choose from {list(VARIANTS)}")
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    root = args.data or shared_dir("planetoid")
    if root is None:
        raise FileNotFoundError(f"no Planetoid folder in the data home ({data_root()}): pass "
                                "--data DIR or set STRUCTCONV_DATA (see `structconv datasets`)")
    t_all = time.perf_counter()
    table: dict = {}
    for ds in datasets:
        data = load_planetoid(root, ds, normalize_features=True)
        table[ds] = {}
        for v in variants:
            runs = [train_seed(data, v, args.seed + i, args) for i in range(args.seeds)]
            m, s = mean_std([r["test_acc"] for r in runs])
            table[ds][v] = dict(test_acc_mean=m, test_acc_std=s, params=runs[0]["params"],
                                seconds_per_run=mean_std([r["seconds"] for r in runs])[0],
                                runs=runs)
            print(f"  {ds:<9} {v:<10} test {m:6.2f} ± {s:4.2f}  params {runs[0]['params']:>7}  "
                  f"{table[ds][v]['seconds_per_run']:.1f}s/run", flush=True)
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

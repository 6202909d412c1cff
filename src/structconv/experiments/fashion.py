"""Fashion-MNIST: a small CNN as grid convolutions vs the same network in plain torch.

``structconv reproduce fashion --train-size 20000 --epochs 3 --out runs``. The torch network is
Conv(1→16, 3×3) ReLU AvgPool(2) Conv(16→32, 3×3) ReLU AvgPool(2) Linear(1568→10); its structconv
twin is built by ``sc.nn.from_torch`` (weights copied, so the same initialisation), and a second
twin keeps the grid layers off ``F.conv2d`` (``native=False``: the planner's shift-and-accumulate
contraction orders). All three train on the same mini-batches in the same order (Adam), one
step of each in turn, so that they share the machine's load; the table gives test accuracy and
seconds of training per epoch. Writes ``<out>/fashion.json`` and a PNG.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..data.images import load_idx_images
from ..data.registry import DatasetError, data_root
from ._common import (
    BATCH,
    EPOCHS,
    POSITIVE,
    SAMPLES,
    THREADS,
    Listed,
    hardware,
    items,
    param_count,
    pyplot,
    save_figure,
    set_threads,
    write_result,
)

__all__ = ["torch_cnn", "structconv_cnn", "train_lockstep", "add_arguments", "run"]

VARIANTS = ("torch", "structconv", "structconv-shift")


def torch_cnn(channels=(16, 32), side: int = 28, classes: int = 10) -> nn.Sequential:
    """The reference CNN in plain torch: images (B, 1, side, side) -> logits (B, classes)."""
    c1, c2 = channels
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(c2 * (side // 4) ** 2, classes))


def structconv_cnn(reference: nn.Sequential, native: bool = True) -> nn.Sequential:
    """The same network with every conv / pool a structconv grid layer (weights copied).

    ``native=False`` keeps the grid layers on the paper's contraction orders (no F.conv2d).
    """
    from ..nn.convert import from_torch

    layers = []
    for m in reference:
        if isinstance(m, (nn.Conv2d, nn.AvgPool2d)):
            g = from_torch(m)
            if not native:
                if isinstance(m, nn.Conv2d):
                    g.native = False
                else:
                    g.route = "basis"
            layers.append(g)
        else:
            layers.append(copy.deepcopy(m))
    return nn.Sequential(*layers)


def _load(args):
    root = Path(args.data) if args.data else (data_root() or Path("/nonexistent")) / \
        "fashion-mnist"
    if not root.is_dir():
        raise DatasetError(f"no Fashion-MNIST folder at {root}: pass --data DIR or set "
                           "STRUCTCONV_DATA (see `structconv datasets`)")
    d = load_idx_images(root, "fashion-mnist", val=0, mean=0.2860, std=0.3530)
    xtr, ytr = d.splits["train"]
    xte, yte = d.splits["test"]
    g = torch.Generator().manual_seed(args.seed)
    idx = torch.randperm(xtr.shape[0], generator=g)[:args.train_size]
    return xtr[idx], ytr[idx], xte[:args.test_size], yte[:args.test_size]


@torch.no_grad()
def _accuracy(net, x, y, batch=1000) -> float:
    net.eval()
    correct = 0
    for i in range(0, x.shape[0], batch):
        correct += int((net(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    return 100.0 * correct / x.shape[0]


def train_lockstep(nets: dict, xtr, ytr, xte, yte, epochs: int, batch: int, lr: float,
                   seed: int) -> dict:
    """Adam on the same seeded batches for every network, one step of each in turn.

    Interleaving the networks batch by batch exposes them to the same load on a shared machine,
    so their step times compare fairly. Returns each network's per-epoch history.
    """
    opts = {k: torch.optim.Adam(n.parameters(), lr=lr) for k, n in nets.items()}
    hist: dict = {k: [] for k in nets}
    for epoch in range(epochs):
        perm = torch.randperm(xtr.shape[0], generator=torch.Generator().manual_seed(
            seed * 1000 + epoch))
        secs = dict.fromkeys(nets, 0.0)
        total = dict.fromkeys(nets, 0.0)
        for n in nets.values():
            n.train()
        for i in range(0, xtr.shape[0], batch):
            b = perm[i:i + batch]
            xb, yb = xtr[b], ytr[b]
            for k, net in nets.items():
                t0 = time.perf_counter()
                opts[k].zero_grad()
                loss = F.cross_entropy(net(xb), yb)
                loss.backward()
                opts[k].step()
                secs[k] += time.perf_counter() - t0
                total[k] += float(loss.detach()) * b.numel()
        for k, net in nets.items():
            acc = _accuracy(net, xte, yte)
            hist[k].append(dict(epoch=epoch + 1, train_loss=total[k] / xtr.shape[0],
                                test_acc=acc, seconds=secs[k]))
            print(f"    epoch {epoch + 1} {k:<17}: loss {total[k] / xtr.shape[0]:.4f}  "
                  f"test {acc:.2f}%  {secs[k]:.1f}s", flush=True)
    return hist


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(train_size=512, test_size=512, epochs=1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, help="Fashion-MNIST folder (IDX gz files)")
    parser.add_argument("--train-size", type=SAMPLES, default=20000, help="training images used")
    parser.add_argument("--test-size", type=SAMPLES, default=10000, help="test images used")
    parser.add_argument("--epochs", type=EPOCHS, default=3)
    parser.add_argument("--batch", type=BATCH, default=128)
    parser.add_argument("--lr", type=POSITIVE, default=1e-3)
    parser.add_argument("--variants", default=",".join(VARIANTS), type=Listed.of(VARIANTS),
                        help=f"comma list of {VARIANTS}")
    parser.add_argument("--threads", type=THREADS, default=0, help="torch threads (0: default)")
    parser.add_argument("--plot", default=None, help="PNG path (default <out>/fashion.png)")


def run(args) -> int:
    """Train the variants, print the table, write JSON and PNG; returns an exit code."""
    set_threads(args)
    variants = items(args.variants)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variants {bad}: choose from {VARIANTS}")
    t_all = time.perf_counter()
    xtr, ytr, xte, yte = _load(args)
    torch.manual_seed(args.seed)
    ref = torch_cnn()
    nets = {"torch": ref, "structconv": structconv_cnn(ref, native=True),
            "structconv-shift": structconv_cnn(ref, native=False)}
    # every variant starts from the same weights: the copies were taken before any training
    init = {k: copy.deepcopy(v) for k, v in nets.items()}
    with torch.no_grad():
        probe = xte[:8]
        gap = max(float((init[k](probe) - init["torch"](probe)).abs().max()) for k in variants)
    hists = train_lockstep({k: init[k] for k in variants}, xtr, ytr, xte, yte, args.epochs,
                           args.batch, args.lr, args.seed)
    rows = {}
    for name, hist in hists.items():
        rows[name] = dict(params=param_count(init[name]), history=hist,
                          test_acc=hist[-1]["test_acc"],
                          seconds_per_epoch=sum(h["seconds"] for h in hist) / len(hist))
    wall = time.perf_counter() - t_all
    anchor = rows.get("torch")
    print(f"{'variant':<18} {'params':>7} {'test acc (%)':>12} {'s/epoch':>8} {'vs torch':>9}")
    for name, r in rows.items():
        # no ratio without the torch anchor (null in the JSON, "-" in the table)
        ratio = r["seconds_per_epoch"] / anchor["seconds_per_epoch"] if anchor else None
        r["time_vs_torch"] = ratio
        print(f"{name:<18} {r['params']:>7} {r['test_acc']:>12.2f} "
              f"{r['seconds_per_epoch']:>8.1f} " + (f"{ratio:>8.2f}x" if ratio else f"{'-':>9}"))
    result = dict(experiment="fashion", train_size=int(xtr.shape[0]), test_size=int(xte.shape[0]),
                  epochs=args.epochs, batch=args.batch, lr=args.lr, seed=args.seed,
                  initial_output_gap=gap, variants=rows, wall_seconds=wall, hardware=hardware())
    write_result(args, "fashion", result)
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    for name, r in rows.items():
        ep = [h["epoch"] for h in r["history"]]
        ax[0].plot(ep, [h["test_acc"] for h in r["history"]], marker="o", label=name)
        ax[1].bar(name, r["seconds_per_epoch"])
    ax[0].set_xlabel("epoch")
    ax[0].set_ylabel("test accuracy (%)")
    ax[0].legend()
    ax[1].set_ylabel("seconds / epoch")
    ax[1].tick_params(axis="x", labelsize=8)
    fig.suptitle(f"Fashion-MNIST, {xtr.shape[0]} train / {xte.shape[0]} test images")
    save_figure(fig, args, "fashion")
    return 0

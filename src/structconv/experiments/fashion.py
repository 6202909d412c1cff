"""Fashion-MNIST: a small CNN as grid convolutions vs the same network in plain torch.

``structconv reproduce fashion --train-size 20000 --epochs 3 --out runs``. The torch network
(``models.fashion.torch_cnn``) is Conv(1→16, 3×3) ReLU AvgPool(2) Conv(16→32, 3×3) ReLU
AvgPool(2) Linear(1568→10); its structconv twin is built by ``sc.nn.from_torch`` (weights
copied, so the same initialisation), and a second twin keeps the grid layers off ``F.conv2d``
(``native=False``: the planner's shift-and-accumulate contraction orders). The settings are the
shipped config ``fashion_cnn`` (its data and train tables, which the flags override). Each
network trains through the training engine (a ``Loop`` over an ``ImageTask``), all three on the
same mini-batches in the same order, one optimizer step of each in turn (``Loop.steps``), so
that they share the machine's load; the table gives test accuracy and the seconds of each
network's own steps per epoch (timed here around each step, the loop's own per-step work
included, the same for every network). The study selects nothing: the engine's validation after
each epoch scores the test images, the accuracy reported, and the last epoch's is the result.
The engine draws each epoch's batch order from (seed, epoch), as every run of it does; the loop
this study had before drew it from seed * 1000 + epoch, so a run's accuracies are not that
loop's (a quick run's included). Writes ``<out>/fashion.json`` and a PNG.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch

from ..config import load_config
from ..data.images import load_idx_images
from ..data.registry import DatasetError, ImageData, data_root
from ..models.fashion import structconv_cnn, torch_cnn
from ..training import Loop, make_optimizer
from ..training.tasks import ImageTask
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

__all__ = ["CONFIG", "torch_cnn", "structconv_cnn", "study_config", "engine_loops",
           "lockstep_epoch", "add_arguments", "run"]

VARIANTS = ("torch", "structconv", "structconv-shift")
#: the shipped config of the study's data and train settings
CONFIG = "fashion_cnn"


def study_config(args) -> dict:
    """The study's validated config: ``fashion_cnn`` with the flags' seed, batch, lr, epochs."""
    over = [f"seed={getattr(args, 'seed', 0) or 0}"]
    for key, value in (("data.batch_size", args.batch), ("train.lr", args.lr),
                       ("train.epochs", args.epochs)):
        if value is not None:
            over.append(f"{key}={value}")
    return load_config(CONFIG, over)


def _load(args) -> ImageData:
    """A seeded random ``--train-size`` of the training images and the first ``--test-size``
    test images; the test images are the split validated after each epoch too."""
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
    test = (xte[:args.test_size], yte[:args.test_size])
    return ImageData("fashion-mnist", {"train": (xtr[idx], ytr[idx]), "val": test,
                                       "test": test}, 10)


def engine_loops(nets: dict, cfg: dict, data) -> dict:
    """One training loop per network (Adam as ``cfg`` says, an ``ImageTask`` on ``data``): no
    run directory, nothing written."""
    loops = {}
    for name, net in nets.items():
        task = ImageTask(cfg, data)
        task.setup(net, torch.device("cpu"), task.world)
        loops[name] = Loop(task, net, make_optimizer(cfg, net), cfg["train"], seed=cfg["seed"],
                           name=name, run=None, files=False)
    return loops


def lockstep_epoch(loops: dict, epoch: int) -> dict:
    """Epoch ``epoch`` of every loop, one optimizer step of each in turn (the same batches:
    one seed); the seconds of each one's steps. Interleaving the networks step by step
    exposes them to the same load on a shared machine, so their step times compare fairly;
    each epoch's record (validation) is not timed."""
    live = {name: loop.steps(epoch) for name, loop in loops.items()}
    secs = dict.fromkeys(loops, 0.0)
    while live:
        for name, steps in list(live.items()):
            t0 = time.perf_counter()
            try:
                next(steps)
            except StopIteration:  # the epoch's steps are done and it is recorded
                del live[name]
                continue
            secs[name] += time.perf_counter() - t0
    return secs


def _train(loops: dict, epochs: int) -> dict:
    """Every epoch of the loops in lockstep; each network's per-epoch history."""
    hist: dict = {name: [] for name in loops}
    for epoch in range(1, epochs + 1):
        secs = lockstep_epoch(loops, epoch)
        for name, loop in loops.items():
            row = loop.state["history"][-1]
            acc = 100.0 * row["val_acc"]
            hist[name].append(dict(epoch=epoch, train_loss=row["train_loss"], test_acc=acc,
                                   seconds=secs[name]))
            print(f"    epoch {epoch} {name:<17}: loss {row['train_loss']:.4f}  "
                  f"test {acc:.2f}%  {secs[name]:.1f}s", flush=True)
    return hist


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(train_size=512, test_size=512, epochs=1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, help="Fashion-MNIST folder (IDX gz files)")
    parser.add_argument("--train-size", type=SAMPLES, default=20000, help="training images used")
    parser.add_argument("--test-size", type=SAMPLES, default=10000, help="test images used")
    parser.add_argument("--epochs", type=EPOCHS, default=None,
                        help=f"epochs (default: the config {CONFIG}'s, 3)")
    parser.add_argument("--batch", type=BATCH, default=None,
                        help=f"batch size (default: the config {CONFIG}'s, 128)")
    parser.add_argument("--lr", type=POSITIVE, default=None,
                        help=f"Adam's learning rate (default: the config {CONFIG}'s, 1e-3)")
    parser.add_argument("--variants", default=",".join(VARIANTS), type=Listed.of(VARIANTS),
                        help=f"comma list of {VARIANTS}")
    parser.add_argument("--threads", type=THREADS, default=0, help="torch threads (0: default)")
    parser.add_argument("--plot", default=None, help="PNG path (default <out>/fashion.png)")


def _plot(rows: dict, data, args) -> None:
    """Test accuracy per epoch and seconds per epoch, one line / bar per network."""
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
    n_train, n_test = (int(data.splits[k][0].shape[0]) for k in ("train", "test"))
    fig.suptitle(f"Fashion-MNIST, {n_train} train / {n_test} test images")
    save_figure(fig, args, "fashion")


def run(args) -> int:
    """Train the variants, print the table, write JSON and PNG; returns an exit code."""
    set_threads(args)
    variants = items(args.variants)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variants {bad}: choose from {VARIANTS}")
    t_all = time.perf_counter()
    cfg = study_config(args)
    data = _load(args)
    torch.manual_seed(args.seed)
    ref = torch_cnn()
    nets = {"torch": ref, "structconv": structconv_cnn(ref, native=True),
            "structconv-shift": structconv_cnn(ref, native=False)}
    # every variant starts from the same weights: the copies were taken before any training
    init = {k: copy.deepcopy(nets[k]) for k in variants}
    with torch.no_grad():
        probe = data.splits["test"][0][:8]
        gap = max(float((init[k](probe) - ref(probe)).abs().max()) for k in variants)
    hists = _train(engine_loops(init, cfg, data), cfg["train"]["epochs"])
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
    t = cfg["train"]
    result = dict(experiment="fashion", config=CONFIG,
                  train_size=int(data.splits["train"][0].shape[0]),
                  test_size=int(data.splits["test"][0].shape[0]), epochs=t["epochs"],
                  batch=cfg["data"]["batch_size"], lr=t["lr"], seed=cfg["seed"],
                  initial_output_gap=gap, variants=rows, wall_seconds=wall, hardware=hardware())
    write_result(args, "fashion", result)
    _plot(rows, data, args)
    return 0

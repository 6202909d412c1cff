"""Fashion-MNIST: a small CNN as grid convolutions vs the same network in plain torch.

``structconv reproduce fashion --train-size 20000 --epochs 3 --out runs``. The torch network
(``models.fashion.torch_cnn``) is Conv(1→16, 3×3) ReLU AvgPool(2) Conv(16→32, 3×3) ReLU
AvgPool(2) Linear(1568→10); its structconv twin is built by ``sc.nn.from_torch`` from the torch
network drawn under the same seed (so the same initial weights), and a second twin keeps the
grid layers off ``F.conv2d`` (``native=False``: the planner's shift-and-accumulate contraction
orders). The study is the shipped config ``fashion_cnn`` and one arm per network, the override
``model.twin.network=...``; every (network, seed) is a run of the training engine in
``<out>/fashion-<hash>/<network>-seed-<s>``, read back where finished and resumed where
interrupted, under the run's lock (``experiments.sweep``). The flags set the data
(``data.options.sample``: a seeded random ``--train-size`` of the training images;
``test_limit``: the first ``--test-size`` test images, which are the validation split too),
batch, learning rate and epochs. The engine draws each epoch's batch order from (seed, epoch),
so the runs of one seed train on the same batches in the same order; the study then compares
their logged train losses and test accuracies epoch by epoch (``agreement``). The study
selects nothing: the engine's validation after each epoch scores the test images, and the last
epoch's accuracy is the result. Seconds per epoch are each run's own training steps (the
metrics' ``time_s``); the networks train one after another, so on a loaded machine their times
see different loads (the study trained them a step of each in turn before). Writes
``<out>/fashion.json`` and a PNG.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..config import load_config
from ..data.registry import DatasetError, data_root
from ..models.build import build_model
from ..models.fashion import structconv_cnn, torch_cnn
from ..training.tasks import load_data
from ._common import (
    BATCH,
    EPOCHS,
    POSITIVE,
    SAMPLES,
    SEEDS,
    THREADS,
    Listed,
    hardware,
    items,
    mean_std,
    pyplot,
    save_figure,
    set_threads,
    write_result,
)
from .sweep import Run, history, quoted, settings_tag, sweep

__all__ = ["CONFIG", "VARIANTS", "QUICK", "torch_cnn", "structconv_cnn", "study_config",
           "overrides", "study_runs", "agreement", "add_arguments", "run"]

VARIANTS = ("torch", "structconv", "structconv-shift")
#: the shipped config of the study (its arms: ``model.twin.network``)
CONFIG = "fashion_cnn"
#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(train_size=512, test_size=512, epochs=1)


def overrides(args) -> list[str]:
    """The overrides of ``fashion_cnn`` that the flags ask for (all but network and seed)."""
    over = [f"data.options.sample={args.train_size}",
            f"data.options.test_limit={args.test_size}"]
    if args.data is not None:
        over.append(f"data.root={quoted(args.data)}")
    for key, value in (("data.batch_size", args.batch), ("train.lr", args.lr),
                       ("train.epochs", args.epochs)):
        if value is not None:
            over.append(f"{key}={value}")
    return over


def study_config(args, network: str = "structconv", seed: int = 0) -> dict:
    """The validated config of one run: ``fashion_cnn`` with the flags, the network and the
    seed (of the model's draw and of the training images' sample)."""
    return load_config(CONFIG, [*overrides(args), f'model.twin.network="{network}"',
                                f"seed={seed}", f"data.options.seed={seed}"])


def study_runs(args, variants, seeds) -> list[Run]:
    """The sweep's runs: every (network, seed), named ``<network>-seed-<s>``."""
    over = overrides(args)
    return [Run(f"{v}-seed-{s}", CONFIG, (*over, f'model.twin.network="{v}"', f"seed={s}",
                                          f"data.options.seed={s}"))
            for s in seeds for v in variants]


def agreement(rows: dict, anchor: str = "torch") -> dict:
    """How far each network's logged epochs are from the anchor's (same seed, same batches):
    the largest relative gap of the epochs' mean train loss and the largest gap of test
    accuracy (points), per network; {} without the anchor."""
    if anchor not in rows:
        return {}
    out = {}
    for name, hist in rows.items():
        ref = rows[anchor]
        out[name] = dict(
            train_loss_rel=max(abs(a["train_loss"] - b["train_loss"]) / abs(b["train_loss"])
                               for a, b in zip(hist, ref)),
            test_acc_points=max(abs(100 * a["val_acc"] - 100 * b["val_acc"])
                                for a, b in zip(hist, ref)))
    return out


def _initial_gap(args, variants, seed: int) -> tuple[float, int, int]:
    """The largest gap between a twin's and the torch network's outputs at their initial
    weights (each network as its run builds it), on 8 test images; the numbers of training
    and test images."""
    cfg = study_config(args, "torch", seed)
    data = load_data(cfg)
    probe = data.splits["test"][0][:8]
    outs = {}
    for v in dict.fromkeys(("torch", *variants)):
        torch.manual_seed(seed)  # as the engine seeds a run before it builds the model
        with torch.no_grad():
            outs[v] = build_model(study_config(args, v, seed), data)(probe)
    sizes = (int(data.splits[k][0].shape[0]) for k in ("train", "test"))
    return max(float((outs[v] - outs["torch"]).abs().max()) for v in variants), *sizes


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
    parser.add_argument("--seeds", type=SEEDS, default=1,
                        help="seeds from --seed on (each: the initial weights and the sample)")
    parser.add_argument("--variants", default=",".join(VARIANTS), type=Listed.of(VARIANTS),
                        help=f"comma list of {VARIANTS}")
    parser.add_argument("--threads", type=THREADS, default=0, help="torch threads (0: default)")
    parser.add_argument("--plot", default=None, help="PNG path (default <out>/fashion.png)")


def _plot(rows: dict, result: dict, args) -> None:
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
    fig.suptitle(f"Fashion-MNIST, {result['train_size']} train / {result['test_size']} test "
                 "images")
    save_figure(fig, args, "fashion")


def _check_data(args) -> None:
    """DatasetError (before any run) where the Fashion-MNIST folder is missing."""
    root = Path(args.data) if args.data else (data_root() or Path("/nonexistent")) / \
        "fashion-mnist"
    if not root.is_dir():
        raise DatasetError(f"no Fashion-MNIST folder at {root}: pass --data DIR or set "
                           "STRUCTCONV_DATA (see `structconv datasets`)")


def _report(run: Run, r: dict) -> None:
    print(f"    {run.name:<26}: test {100 * r['test_acc']:.2f}%  {r['train_time_s']:.1f}s "
          "training", flush=True)


def _rows(folder: Path, runs: list[Run], results: list[dict], variants, seeds) -> dict:
    """Each network's row: its runs' per-epoch histories (mean over seeds), final test
    accuracy (mean, std) and seconds per epoch; and the agreement with torch per seed."""
    keys = [(v, s) for s in seeds for v in variants]  # study_runs' order
    hists = {k: history(folder, rn) for k, rn in zip(keys, runs)}
    res = {rn.name: r for rn, r in zip(runs, results)}
    rows = {}
    for v in variants:
        per = [hists[v, s] for s in seeds]
        hist = [dict(epoch=rs[0]["epoch"],
                     train_loss=mean_std([r["train_loss"] for r in rs])[0],
                     test_acc=mean_std([100 * r["val_acc"] for r in rs])[0],
                     seconds=mean_std([r["time_s"] for r in rs])[0]) for rs in zip(*per)]
        accs = [100 * res[f"{v}-seed-{s}"]["test_acc"] for s in seeds]
        m, sd = mean_std(accs)
        rows[v] = dict(params=res[f"{v}-seed-{seeds[0]}"]["parameters"], history=hist,
                       test_acc=m, test_acc_std=sd, test_acc_per_seed=accs,
                       seconds_per_epoch=sum(h["seconds"] for h in hist) / len(hist),
                       agreement=[agreement({w: hists[w, s] for w in variants}).get(v)
                                  for s in seeds])
    return rows


def _table(rows: dict) -> None:
    anchor = rows.get("torch")
    print(f"{'variant':<18} {'params':>7} {'test acc (%)':>12} {'s/epoch':>8} {'vs torch':>9} "
          f"{'loss gap':>9}")
    for name, r in rows.items():
        # no ratio without the torch anchor (null in the JSON, "-" in the table)
        ratio = r["seconds_per_epoch"] / anchor["seconds_per_epoch"] if anchor else None
        r["time_vs_torch"] = ratio
        gap = max((a["train_loss_rel"] for a in r["agreement"] if a), default=None)
        print(f"{name:<18} {r['params']:>7} {r['test_acc']:>12.2f} "
              f"{r['seconds_per_epoch']:>8.1f} " + (f"{ratio:>8.2f}x" if ratio else f"{'-':>9}")
              + (f" {gap:>9.1e}" if gap is not None else f" {'-':>9}"))


def run(args) -> int:
    """Train every (network, seed) through the sweep, print the table, write JSON and PNG;
    returns an exit code."""
    set_threads(args)
    variants = items(args.variants)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variants {bad}: choose from {VARIANTS}")
    _check_data(args)
    t_all = time.perf_counter()
    seed0 = getattr(args, "seed", 0) or 0
    seeds = list(range(seed0, seed0 + args.seeds))
    cfg = study_config(args, variants[0], seed0)  # validates the flags before any run
    folder = Path(args.out) / f"fashion-{settings_tag(CONFIG, overrides(args))}"
    runs = study_runs(args, variants, seeds)
    results = sweep(folder, runs, "fashion", getattr(args, "device", None) or "cpu", _report)
    rows = _rows(folder, runs, results, variants, seeds)
    gap, n_train, n_test = _initial_gap(args, variants, seed0)
    wall = time.perf_counter() - t_all
    _table(rows)
    t = cfg["train"]
    result = dict(experiment="fashion", config=CONFIG, overrides=overrides(args),
                  runs=str(folder), train_size=n_train, test_size=n_test, epochs=t["epochs"],
                  batch=cfg["data"]["batch_size"], lr=t["lr"],
                  seed=seed0, seeds=args.seeds, initial_output_gap=gap, variants=rows,
                  wall_seconds=wall, hardware=hardware())
    write_result(args, "fashion", result)
    _plot(rows, result, args)
    return 0

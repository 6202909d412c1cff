"""Controlled separability (paper eq. "separable"): accuracy against parameter count as H varies.

``structconv reproduce separability --model cnn`` (digits CNN) and ``--model rgcn`` (R-GCN on
AIFB). The parameter form of one convolution is swept: ``ControlledSeparable`` with H in
``--H``, against ``Full`` and ``DepthwiseSeparable``.

* cnn: GridConv(1→16, 5×5) ReLU GridConv(16→32, 5×5, *form*) ReLU AvgPool(2) Linear(→10) on
  scikit-learn's 8×8 digits (or ``--dataset fashion-mnist``, a subset); the form is that of the
  second convolution (K = 25). Test accuracy at the epoch of best validation accuracy.
* rgcn: the 2-layer R-GCN recipe of ``structconv reproduce rgcn`` (featureless, 16 hidden,
  50 epochs) with the form on both relational convolutions (K = number of relations, so
  ControlledSeparable is R-GCN's basis decomposition and Full is no decomposition).

Writes ``<out>/separability-<model>.json`` and a PNG of accuracy against parameters.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.registry import DatasetError, data_root
from ..models.separable import DigitsCNN, RelationalNet, make_form
from ._common import (
    BATCH,
    EPOCHS,
    POSITIVE,
    SAMPLES,
    SEEDS,
    THREADS,
    WIDTH,
    Listed,
    hardware,
    mean_std,
    param_count,
    pyplot,
    save_figure,
    set_threads,
    write_result,
)

__all__ = ["make_form", "DigitsCNN", "RelationalNet", "add_arguments", "run"]


# ------------------------------------------------------------------------------------------------
def _images(args):
    if args.dataset == "digits":
        from ..data.images import load_digits

        return load_digits(seed=0)
    from ..data.images import load_idx_images

    root = Path(args.data) if args.data else (data_root() or Path("/nonexistent")) / \
        "fashion-mnist"
    if not root.is_dir():
        raise DatasetError(f"no Fashion-MNIST folder at {root}: pass --data DIR")
    d = load_idx_images(root, "fashion-mnist", val=5000, seed=0, mean=0.2860, std=0.3530)
    n = args.train_size
    d.splits = {"train": tuple(t[:n] for t in d.splits["train"]),
                "val": tuple(t[:n // 4] for t in d.splits["val"]),
                "test": d.splits["test"]}
    return d


@torch.no_grad()
def _acc(net, x, y, batch=1000):
    net.eval()
    c = sum(int((net(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
            for i in range(0, x.shape[0], batch))
    net.train()
    return 100.0 * c / x.shape[0]


def train_cnn(data, form: str, seed: int, args) -> dict:
    """One CNN run; test accuracy at the epoch of best validation accuracy."""
    torch.manual_seed(seed)
    side = data.splits["train"][0].shape[-1]
    net = DigitsCNN(form, side=side)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    xtr, ytr = data.splits["train"]
    best, t0 = (-1.0, 0.0, 0), time.perf_counter()
    for epoch in range(args.epochs):
        perm = torch.randperm(xtr.shape[0], generator=torch.Generator().manual_seed(
            seed * 1000 + epoch))
        for i in range(0, xtr.shape[0], args.batch):
            b = perm[i:i + args.batch]
            opt.zero_grad()
            F.cross_entropy(net(xtr[b]), ytr[b]).backward()
            opt.step()
        val = _acc(net, *data.splits["val"])
        if val > best[0]:
            best = (val, _acc(net, *data.splits["test"]), epoch + 1)
    return dict(seed=seed, val_acc=best[0], test_acc=best[1], epoch=best[2],
                params=param_count(net), form_params=net.form_parameters(),
                seconds=time.perf_counter() - t0)


def train_rgcn(data, form: str, seed: int, args) -> dict:
    """One R-GCN run (the recipe: Adam 0.01, no L2, evaluated after the last epoch)."""
    torch.manual_seed(seed)
    net = RelationalNet(data, args.hidden, form)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        net.train()
        opt.zero_grad()
        F.cross_entropy(net()[data.train_idx], data.train_y).backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        pred = net().argmax(1)
    test = 100.0 * float((pred[data.test_idx] == data.test_y).float().mean())
    train = 100.0 * float((pred[data.train_idx] == data.train_y).float().mean())
    return dict(seed=seed, test_acc=test, train_acc=train, params=param_count(net),
                form_params=net.form_parameters(), seconds=time.perf_counter() - t0)


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(seeds=1, epochs=2, train_size=500)


def check_arguments(a) -> None:
    """The dataset must be one of the model's."""
    allowed = ("digits", "fashion-mnist") if a.model == "cnn" else ("aifb", "mutag")
    if a.dataset is not None and a.dataset not in allowed:
        raise ValueError(f"--dataset for --model {a.model} must be one of "
                         f"{', '.join(allowed)}, got {a.dataset!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=("cnn", "rgcn"), default="cnn")
    parser.add_argument("--dataset", default=None,
                        choices=("digits", "fashion-mnist", "aifb", "mutag"),
                        help="cnn: digits (default) or fashion-mnist; rgcn: aifb (default)")
    parser.add_argument("--data", default=None, help="dataset folder (default: the data home, "
                        "see `structconv datasets`)")
    parser.add_argument("--forms", default=None, type=Listed(lambda f: make_form(f, 2, 2, 2)),
                        help="comma list of full, depthwise, H<n> (default per model)")
    parser.add_argument("--seeds", type=SEEDS, default=3)
    parser.add_argument("--epochs", type=EPOCHS, default=None)
    parser.add_argument("--lr", type=POSITIVE, default=None)
    parser.add_argument("--batch", type=BATCH, default=64)
    parser.add_argument("--hidden", type=WIDTH, default=16)
    parser.add_argument("--train-size", type=SAMPLES, default=10000,
                        help="fashion-mnist: training images used")
    parser.add_argument("--threads", type=THREADS, default=0, help="torch threads (0: default)")
    parser.add_argument("--plot", default=None, help="PNG path")


_DEFAULTS = {
    "cnn": dict(forms="H1,H2,H4,H8,H16,depthwise,full", epochs=30, lr=3e-3, dataset="digits"),
    "rgcn": dict(forms="H1,H2,H5,H10,H30,depthwise,full", epochs=50, lr=0.01, dataset="aifb"),
}


def _data_and_trainer(args):
    """The dataset of ``args.model`` and the function that trains one form on it."""
    if args.model == "cnn":
        data = _images(args)
        if args.quick:
            data.splits = {k: (x[:200], y[:200]) for k, (x, y) in data.splits.items()}
        return data, train_cnn
    if args.dataset not in ("aifb", "mutag"):
        raise ValueError(f"rgcn dataset must be aifb or mutag, got {args.dataset!r}")
    from ..data.rgcn import load_entities

    root = Path(args.data) if args.data else (data_root() or Path("/nonexistent")) / \
        "rgcn" / args.dataset
    if not root.is_dir():
        raise DatasetError(f"no R-GCN folder at {root}: pass --data DIR")
    return load_entities(root, args.dataset), train_rgcn


def _plot(rows: dict, forms: list, args):
    """Accuracy against the swept convolutions' parameter count, one marker per form."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    hs = [f for f in forms if f.startswith("H")]
    if hs:
        ax.errorbar([rows[f]["form_params"] for f in hs], [rows[f]["test_acc_mean"] for f in hs],
                    yerr=[rows[f]["test_acc_std"] for f in hs], marker="o", capsize=3,
                    label="ControlledSeparable (H)")
        for f in hs:
            ax.annotate(f, (rows[f]["form_params"], rows[f]["test_acc_mean"]),
                        textcoords="offset points", xytext=(4, -10), fontsize=8)
    for f, mk in (("depthwise", "s"), ("full", "^")):
        if f in rows:
            ax.errorbar([rows[f]["form_params"]], [rows[f]["test_acc_mean"]],
                        yerr=[rows[f]["test_acc_std"]], marker=mk, capsize=3, linestyle="none",
                        label=f)
    ax.set_xscale("log")
    ax.set_xlabel("parameters of the swept convolution(s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{args.model} on {args.dataset}: accuracy vs parameters ({args.seeds} seeds)")
    ax.legend()
    return fig


def run(args) -> int:
    """Sweep the forms over seeds; print the table, write JSON and PNG."""
    set_threads(args)
    d = _DEFAULTS[args.model]
    for k in ("forms", "epochs", "lr", "dataset"):
        if getattr(args, k) is None:
            setattr(args, k, d[k])
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    for f in forms:
        make_form(f, 2, 2, 2)  # validates the name before any training
    t_all = time.perf_counter()
    data, trainer = _data_and_trainer(args)
    rows = {}
    for form in forms:
        runs = [trainer(data, form, args.seed + i, args) for i in range(args.seeds)]
        m, s = mean_std([r["test_acc"] for r in runs])
        rows[form] = dict(test_acc_mean=m, test_acc_std=s, params=runs[0]["params"],
                          form_params=runs[0]["form_params"],
                          seconds_per_run=mean_std([r["seconds"] for r in runs])[0], runs=runs)
        print(f"  {form:<10} test {m:6.2f} ± {s:4.2f}  form params {runs[0]['form_params']:>8}  "
              f"total {runs[0]['params']:>8}  {rows[form]['seconds_per_run']:.1f}s/run",
              flush=True)
    wall = time.perf_counter() - t_all
    print(f"{'form':<10} {'form params':>11} {'total params':>12} {'test acc (%)':>15}")
    for f, r in rows.items():
        print(f"{f:<10} {r['form_params']:>11} {r['params']:>12} "
              f"{r['test_acc_mean']:>8.2f} ± {r['test_acc_std']:.2f}")
    name = f"separability-{args.model}"
    result = dict(experiment="separability", model=args.model, dataset=args.dataset,
                  epochs=args.epochs, lr=args.lr, seeds=args.seeds, forms=rows,
                  wall_seconds=wall, hardware=hardware())
    write_result(args, name, result)
    fig = _plot(rows, forms, args)
    save_figure(fig, args, name)
    return 0

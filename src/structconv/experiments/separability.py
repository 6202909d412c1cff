"""Controlled separability (paper eq. "separable"): accuracy against parameter count as H varies.

``structconv reproduce separability --model cnn`` (digits CNN) and ``--model rgcn`` (R-GCN on
AIFB). The parameter form of one convolution is swept: ``ControlledSeparable`` with H in
``--forms`` (``H<n>``), against ``Full`` and ``DepthwiseSeparable``. Each arm is a shipped config
and each form a set of overrides of it (``form_overrides``); every (form, seed) is a run of the
training engine in ``<out>/separability-<model>-<dataset>-<hash>/<form>-seed-<s>``, read back
where finished and resumed where interrupted (``experiments.sweep``).

* cnn: the config ``separability_cnn``, GridConv(1→16, 5×5) ReLU GridConv(16→32, 5×5, *form*)
  ReLU AvgPool(2) Linear(→10) on scikit-learn's 8×8 digits (or ``--dataset fashion-mnist``:
  ``--train-size`` training images, a quarter as many held out for validation, at most as many
  test images); the form is that of the second convolution (``model.layers.1.param`` and
  ``H``; K = 25). Test accuracy at the epoch of best validation accuracy.
* rgcn: the config ``rgcn_entities`` of ``structconv reproduce rgcn`` (featureless, 16 hidden,
  50 epochs, the last epoch's model) with the form on both relational convolutions
  (``model.graph.param`` and ``bases``; K = number of relations, so ControlledSeparable is
  R-GCN's basis decomposition and Full is no decomposition).

Random draws. The rgcn arm draws what the loop this recipe had before drew (the seed, then the
model), but sums the loss over the training entities in node order, as ``reproduce rgcn``
does: a loss's last digits differ, and a run's accuracy may differ by an entity (a ``--quick``
run on AIFB ends with the former loop's test and train accuracies for every form). The cnn arm's
runs are not that loop's: the engine draws each epoch's batch order from (seed, epoch) (the
loop drew it from seed * 1000 + epoch), the declared layers start their biases at zero and the
classifier reads the features position by position (the loop's network drew its biases and
read them channel by channel), and ``--quick`` trains on the whole digits split (the loop took
200 images of each split). Writes ``<out>/separability-<model>.json`` and a PNG of accuracy
against parameters.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..config import load_config
from ..data.planetoid import shared_dir
from ..data.registry import DatasetError, data_root
from ..training import load_run
from ..training.tasks import task_for
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
    items,
    mean_std,
    param_count,
    pyplot,
    save_figure,
    set_threads,
    write_result,
)
from .sweep import Run, quoted, settings_tag, sweep

__all__ = ["CONFIGS", "QUICK", "form_overrides", "overrides", "form_parameters",
           "add_arguments", "check_arguments", "run"]

#: each arm's shipped config
CONFIGS = {"cnn": "separability_cnn", "rgcn": "rgcn_entities"}
#: each arm's datasets, its default first
DATASETS = {"cnn": ("digits", "fashion-mnist"), "rgcn": ("aifb", "mutag")}
#: each arm's forms by default
FORMS = {"cnn": "H1,H2,H4,H8,H16,depthwise,full", "rgcn": "H1,H2,H5,H10,H30,depthwise,full"}
#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(seeds=1, epochs=2, train_size=500)


def form_overrides(model: str, form: str) -> list[str]:
    """The overrides that give the swept convolution(s) of ``model``'s config the parameter
    form ``form``: 'full', 'depthwise' or 'H<n>' (``ControlledSeparable`` with H = n)."""
    key = "model.layers.1" if model == "cnn" else "model.graph"
    if form in ("full", "depthwise"):
        return [f'{key}.param="{form}"']
    if form.startswith("H") and form[1:].isdigit() and int(form[1:]) > 0:
        return [f'{key}.param="separable"',
                f"{key}.{'H' if model == 'cnn' else 'bases'}={int(form[1:])}"]
    raise ValueError(f"unknown form {form!r}: use 'full', 'depthwise' or 'H<n>' (e.g. H4)")


def overrides(args) -> list[str]:
    """The overrides of the arm's config that the arguments ask for (all but form and seed)."""
    over = [f'data.name="{args.dataset}"']
    if args.data is not None:
        over.append(f"data.root={quoted(args.data)}")
    if args.epochs:
        over.append(f"train.epochs={args.epochs}")
    if args.lr is not None:
        over.append(f"train.lr={args.lr}")
    if args.model == "rgcn":
        return [*over, f"model.graph.hidden={args.hidden}"]
    over.append(f"data.batch_size={args.batch}")
    if args.dataset == "fashion-mnist":
        n = args.train_size
        over += [f"data.options.val={max(1, n // 4)}", f"data.options.limit={n}"]
    return over


def form_parameters(model: str, net) -> int:
    """The parameters of the swept convolution(s) of a built arm's model."""
    convs = [net.blocks[1].conv] if model == "cnn" else [net.conv1.conv, net.conv2.conv]
    return sum(param_count(c.param) for c in convs)


def _row(folder: Path, run: Run, r: dict, model: str) -> dict:
    """One run's numbers: its result's, and those of the weights it ended with (the best
    validation epoch's for cnn, the last epoch's for rgcn)."""
    cfg, data, net = load_run(folder / run.name, "best")
    row = dict(seed=cfg["seed"], test_acc=100 * r["test_acc"], params=r["parameters"],
               form_params=form_parameters(model, net), seconds=r["train_time_s"])
    if model == "cnn":
        return dict(row, val_acc=100 * r["val_acc"], epoch=r["best_epoch"])
    return dict(row, train_acc=100 * task_for(cfg, data).evaluate(net, "train")["acc"])


def check_arguments(a) -> None:
    """The dataset must be one of the model's."""
    allowed = DATASETS[a.model]
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
    parser.add_argument("--forms", default=None,
                        type=Listed(lambda f: form_overrides("cnn", f)),
                        help="comma list of full, depthwise, H<n> (default per model)")
    parser.add_argument("--seeds", type=SEEDS, default=3)
    parser.add_argument("--epochs", type=EPOCHS, default=None,
                        help="default: the config's (cnn 30, rgcn 50)")
    parser.add_argument("--lr", type=POSITIVE, default=None,
                        help="default: the config's (cnn 3e-3, rgcn 0.01)")
    parser.add_argument("--batch", type=BATCH, default=64)
    parser.add_argument("--hidden", type=WIDTH, default=16)
    parser.add_argument("--train-size", type=SAMPLES, default=10000,
                        help="fashion-mnist: training images used")
    parser.add_argument("--threads", type=THREADS, default=0, help="torch threads (0: default)")
    parser.add_argument("--plot", default=None, help="PNG path")


def _check_data(args) -> None:
    """DatasetError (before any run) where the arm's dataset folder is missing."""
    sub = None if args.dataset == "digits" else \
        "fashion-mnist" if args.dataset == "fashion-mnist" else f"rgcn/{args.dataset}"
    if sub is None:
        return
    root = Path(args.data) if args.data else shared_dir(sub)
    if root is None or not root.is_dir():
        raise DatasetError(f"no {args.dataset} folder at "
                           f"{root or (data_root() or Path('/nonexistent')) / sub}: pass "
                           "--data DIR or set STRUCTCONV_DATA (see `structconv datasets`)")


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


def _sweep(args, forms: list, seed0: int) -> dict:
    """Every form's runs over the seeds from ``seed0`` (``experiments.sweep``); each form's
    row."""
    config, over = CONFIGS[args.model], overrides(args)
    folder = Path(args.out) / f"separability-{args.model}-{args.dataset}-" \
                              f"{settings_tag(config, over)}"
    dev = getattr(args, "device", None) or "cpu"
    rows = {}
    for form in forms:
        runs = [Run(f"{form}-seed-{s}", config, (*over, *form_overrides(args.model, form),
                                                 f"seed={s}"))
                for s in range(seed0, seed0 + args.seeds)]
        done = [_row(folder, rn, r, args.model)
                for rn, r in zip(runs, sweep(folder, runs, "separability", dev))]
        m, s = mean_std([r["test_acc"] for r in done])
        rows[form] = dict(test_acc_mean=m, test_acc_std=s, params=done[0]["params"],
                          form_params=done[0]["form_params"],
                          seconds_per_run=mean_std([r["seconds"] for r in done])[0], runs=done)
        print(f"  {form:<10} test {m:6.2f} ± {s:4.2f}  form params {done[0]['form_params']:>8}  "
              f"total {done[0]['params']:>8}  {rows[form]['seconds_per_run']:.1f}s/run",
              flush=True)
    return rows


def run(args) -> int:
    """Sweep the forms over seeds; print the table, write JSON and PNG."""
    set_threads(args)
    args.dataset = args.dataset or DATASETS[args.model][0]
    forms = items(args.forms or FORMS[args.model])
    for f in forms:
        form_overrides(args.model, f)  # validates the name before any training
    _check_data(args)
    cfg = load_config(CONFIGS[args.model], overrides(args))
    t_all = time.perf_counter()
    rows = _sweep(args, forms, getattr(args, "seed", 0) or 0)
    wall = time.perf_counter() - t_all
    print(f"{'form':<10} {'form params':>11} {'total params':>12} {'test acc (%)':>15}")
    for f, r in rows.items():
        print(f"{f:<10} {r['form_params']:>11} {r['params']:>12} "
              f"{r['test_acc_mean']:>8.2f} ± {r['test_acc_std']:.2f}")
    name = f"separability-{args.model}"
    result = dict(experiment="separability", model=args.model, dataset=args.dataset,
                  config=CONFIGS[args.model], overrides=overrides(args),
                  epochs=cfg["train"]["epochs"], lr=cfg["train"]["lr"], seeds=args.seeds,
                  forms=rows, wall_seconds=wall, hardware=hardware())
    write_result(args, name, result)
    fig = _plot(rows, forms, args)
    save_figure(fig, args, name)
    return 0

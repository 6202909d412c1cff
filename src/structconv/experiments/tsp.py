"""The attention model for routing on TSP20: REINFORCE with a greedy-rollout baseline.

``structconv reproduce tsp --out runs`` trains ``structconv.models.routing.AttentionModel``
(Kool, van Hoof & Welling, ICLR 2019) as the shipped config ``tsp_20`` says, with the options
as overrides (one run of the training engine, ``structconv.training.tasks.routing``), on random
instances (n cities uniform in the unit
square, drawn from the epoch's seed) by REINFORCE: the loss of a batch is the mean of
(length of the sampled tour − baseline) × its log-likelihood. The baseline is, during the
first ``--warmup-epochs`` epoch(s), an exponential moving average of the batch's mean length
(β = 0.8), then the length of the greedy tour of a frozen copy of the policy (the rollout
baseline). At the end of every epoch the policy and the baseline decode the same
``--bl-eval`` instances greedily; the baseline becomes a copy of the policy when the policy's
mean is lower and a one-sided paired t-test says so at level ``--alpha`` (5%), and then draws
fresh evaluation instances (the paper's rule).

Evaluation: a fixed test set (``--test-size`` instances from seed 1234), reference tours
from LKH-3 through ``elkai`` (the ``routing`` extra); the optimality gap of greedy decoding
on the whole test set and of the best of ``--samples`` sampled tours on the first
``--sample-instances`` instances. The learning curve is the greedy gap on ``--val-size``
validation instances (their own LKH references) against training seconds. The run is a run
directory ``<out>/tsp_runs/tsp<n>-w<width>-b<batch>-e<epoch size>-s<seed>-E<epochs>``, trained
at most once under its lock; a stopped run resumes where it stopped (inside an epoch too) and
ends as an uninterrupted one; LKH references are cached per chunk in ``<out>/tsp_runs``.
Writes ``<out>/tsp.json``, ``tsp_curve.png`` and ``tsp_tours.png``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from ..config import MAX_BATCHES, shipped_configs
from ..data.tsp import LKH_SCALE, TEST_SEED, VAL_SEED, lkh_tours, reference, uniform_instances
from ..models.routing import AttentionModel, tour_length
from ..training import load_run
from ..training.tasks.routing import baseline_update, gaps, greedy_lengths
from ._common import (
    FRACTION,
    POSITIVE,
    THREADS,
    Bounded,
    hardware,
    heads_divide,
    pyplot,
    save_figure,
    set_threads,
    write_result,
)
from .sweep import Run, config_run

__all__ = ["add_arguments", "run", "uniform_instances", "lkh_tours", "reference",
           "greedy_lengths", "sample_best", "baseline_update", "tsp_run", "KOOL", "LKH_SCALE",
           "TEST_SEED", "VAL_SEED"]

#: Kool et al. 2019, Table 1 (10,000 test instances): mean optimal length (Concorde), and the
#: attention model's greedy and 1,280-sample gaps; 100 epochs of 1,280,000 instances
KOOL = {20: {"optimal": 3.84, "greedy_gap": 0.34, "sample_gap": 0.08},
        50: {"optimal": 5.70, "greedy_gap": 1.76, "sample_gap": 0.52},
        100: {"optimal": 7.76, "greedy_gap": 4.53, "sample_gap": 2.26}}


def add_arguments(parser) -> None:
    # sizes bounded as the config schema and the tsp dataset bound them
    big = 10**7
    parser.add_argument("--n", type=Bounded(int, 3, 10_000), default=20,
                        help="cities per instance")
    parser.add_argument("--epochs", type=Bounded(int, 1, 10**6), default=None,
                        help="epochs (default 10; 2 with --quick)")
    parser.add_argument("--epoch-size", type=Bounded(int, 1, 10**12), default=64_000,
                        help="instances per epoch (at most 1,000,000 batches)")
    parser.add_argument("--batch", type=Bounded(int, 1, 10**6), default=512)
    parser.add_argument("--lr", type=POSITIVE, default=1e-4)
    parser.add_argument("--lr-decay", type=Bounded(float, 0, 1, open_lo=True), default=1.0,
                        help="learning rate factor per epoch (the paper: 1.0)")
    parser.add_argument("--width", type=Bounded(int, 1, 10**6), default=128)
    parser.add_argument("--heads", type=Bounded(int, 1, 10**6), default=8)
    parser.add_argument("--layers", type=Bounded(int, 1, 10**6), default=3)
    parser.add_argument("--ffn", type=Bounded(int, 0, 10**6), default=0,
                        help="feed-forward width (0: 4 x width)")
    parser.add_argument("--clip", type=Bounded(float, 0, 1e6, open_lo=True), default=10.0,
                        help="tanh clipping C")
    parser.add_argument("--warmup-epochs", type=Bounded(int, 0, 10**6), default=1,
                        help="epochs with the exponential baseline before the rollout one")
    parser.add_argument("--bl-eval", type=Bounded(int, 2, big), default=10_000,
                        help="instances of the baseline's paired t-test")
    parser.add_argument("--alpha", type=FRACTION, default=0.05, help="the t-test's level")
    parser.add_argument("--test-size", type=Bounded(int, 1, big), default=10_000)
    parser.add_argument("--val-size", type=Bounded(int, 1, big), default=1_000)
    parser.add_argument("--samples", type=Bounded(int, 1, big), default=1280,
                        help="samples per instance")
    parser.add_argument("--sample-instances", type=Bounded(int, 1, big), default=1_000,
                        help="test instances decoded by sampling")
    parser.add_argument("--lkh-runs", type=Bounded(int, 1, 10_000), default=10,
                        help="elkai's runs per instance")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (0: default)")


# -- decoding ------------------------------------------------------------------------------------
@torch.no_grad()
def sample_best(model: AttentionModel, coords: torch.Tensor, samples: int, seed: int = 0,
                chunk: int = 1280) -> torch.Tensor:
    """The shortest of ``samples`` tours sampled from the policy, per instance: (B,) float64.
    The city embeddings are computed once per instance and shared by its samples."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)  # sampling draws on the model's device
    best = torch.empty(len(coords), dtype=torch.float64)
    for i, c in enumerate(coords.to(dev)):
        prep = model.decoder.prepare(model.encode(c.unsqueeze(0)))
        shortest = float("inf")
        for s in range(0, samples, chunk):
            k = min(chunk, samples - s)
            rep = {key: v.expand(k, *v.shape[1:]) for key, v in prep.items()}
            t, _ = model.decode(rep, "sample", g)
            length = tour_length(c.to(torch.float64).expand(k, -1, -1), t)
            shortest = min(shortest, float(length.min()))
        best[i] = shortest
    model.train(was)
    return best


# -- the recipe ----------------------------------------------------------------------------------
#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(epochs=2, epoch_size=32, batch=16, width=16, heads=2, layers=1, ffn=32, bl_eval=64,
             test_size=40, val_size=20, samples=16, sample_instances=4, n=10, lkh_runs=1)


def check_arguments(a) -> None:
    """The checks that join options (each option's range is its argparse type)."""
    heads_divide(a)
    if a.sample_instances > a.test_size:
        raise ValueError(f"--sample-instances {a.sample_instances} exceeds --test-size "
                         f"{a.test_size}")
    if math.ceil(a.epoch_size / a.batch) > MAX_BATCHES:
        raise ValueError(f"--epoch-size {a.epoch_size} makes more than {MAX_BATCHES:,} batches "
                         f"of --batch {a.batch} an epoch")


def _overrides(a, folder: Path) -> list[str]:
    """The recipe's options as config keys over ``tsp_20`` (an epoch: ``--epoch-size``
    instances in batches of ``--batch``, the last batch whole)."""
    return [f"seed={a.seed}", f"train.epochs={a.epochs}", f"data.batch_size={a.batch}",
            f"data.batches_per_epoch={math.ceil(a.epoch_size / a.batch)}", f"train.lr={a.lr!r}",
            f"train.lr_decay={a.lr_decay!r}", f"model.routing.width={a.width}",
            f"model.routing.heads={a.heads}", f"model.routing.layers={a.layers}",
            f"model.routing.ffn={a.ffn or 4 * a.width}", f"model.routing.clip={a.clip!r}",
            f"train.routing.warmup_epochs={a.warmup_epochs}",
            f"train.routing.bl_eval={a.bl_eval}", f"train.routing.alpha={a.alpha!r}",
            f"data.options.n={a.n}", f"data.options.val_size={a.val_size}",
            f"data.options.test_size={a.test_size}", f"data.options.lkh_runs={a.lkh_runs}",
            f"data.options.cache={json.dumps(str(folder.resolve()))}"]


def tsp_run(a, folder: Path) -> Run:
    """The engine's run of the recipe's options: the shipped config of ``--n`` cities
    (``tsp_20`` where none is shipped) with the options as overrides."""
    config = f"tsp_{a.n}" if f"tsp_{a.n}" in shipped_configs() else "tsp_20"
    tag = f"tsp{a.n}-w{a.width}-b{a.batch}-e{a.epoch_size}-s{a.seed}-E{a.epochs}"
    return Run(tag, config, tuple(_overrides(a, folder)))


def _history(where: Path, a) -> tuple[list, list]:
    """(the learning curve, the baseline's tests) from the run's rows, one per epoch."""
    rows = [json.loads(x) for x in (where / "metrics.jsonl").read_text().splitlines()]
    curve, tests, seconds = [], [], 0.0
    for r in rows:
        seconds += r["time_s"]  # training and the baseline's test
        curve.append({"epoch": r["epoch"], "seconds": seconds,
                      "instances": r["epoch"] * a.epoch_size, "loss": r["train_loss"],
                      "val_length": r["val_length"], "val_gap": r["val_gap"]})
        tests.append({"epoch": r["epoch"] - 1, "candidate": r["bl_candidate"],
                      "baseline": r["bl_baseline"], "t": r["bl_t"], "p": r["bl_p"],
                      "replaced": r["bl_replaced"]})
        kept = "replaced" if r["bl_replaced"] else "kept"
        print(f"  epoch {r['epoch']}: loss {r['train_loss']:.3f}  val greedy "
              f"{r['val_length']:.4f} (gap {r['val_gap']:.2f}%)  baseline {kept} (p "
              f"{r['bl_p']:.3g})  {seconds:.0f}s", flush=True)
    return curve, tests


def _evaluate(r: dict, model, test: dict, a) -> dict:
    """The run's greedy test result and the best of ``--samples`` sampled tours on the first
    ``--sample-instances`` test instances."""
    k = a.sample_instances
    t1 = time.perf_counter()
    sampled = sample_best(model, test["coords"][:k], a.samples, seed=a.seed)
    t2 = time.perf_counter()
    opt = test["lengths"]
    greedy_k = greedy_lengths(model, test["coords"][:k])
    return {"greedy": {"mean_length": r["test_length"], "lkh_mean": r["test_lkh"],
                       "gap_of_means": r["test_gap"], "mean_gap": r["test_mean_gap"],
                       "instances": r["test_instances"], "seconds": r["greedy_seconds"]},
            "sampling": {**gaps(sampled, opt[:k]), "greedy_same_instances":
                         gaps(greedy_k, opt[:k]), "instances": k, "samples": a.samples,
                         "seconds": t2 - t1},
            "tours": r["test_tours"]}


def run(args) -> int:
    """Train (or read, or resume) the run, evaluate, print, write JSON and plots."""
    args.epochs = 10 if args.epochs is None else args.epochs
    check_arguments(args)
    set_threads(args)
    folder = Path(args.out) / "tsp_runs"
    t_all = time.perf_counter()
    run = tsp_run(args, folder)
    r = config_run(folder, run, "tsp", args.device)
    _, data, model = load_run(folder / run.name, device=args.device)
    curve, tests = _history(folder / run.name, args)
    test = data.reference("test")
    ev = _evaluate(r, model, test, args)
    result = {"experiment": "tsp", "n": args.n, "settings": {
        k: v for k, v in vars(args).items() if isinstance(v, (int, float, str))},
        "params": r["parameters"], "train_seconds": r["train_time_s"],
        "instances_seen": r["epochs"] * args.epoch_size, "curve": curve,
        "baseline_tests": tests, "evaluation": ev, "kool2019": KOOL.get(args.n),
        "wall_seconds": time.perf_counter() - t_all, "hardware": hardware()}
    _print(result)
    write_result(args, "tsp", result)
    _plot_curve(result, args)
    _plot_tours(test, ev["tours"], args)
    return 0


def _print(r: dict) -> None:
    ev, k = r["evaluation"], r["kool2019"]
    g, s = ev["greedy"], ev["sampling"]
    print(f"\nTSP{r['n']}: {r['params']} parameters, {r['instances_seen']} training instances "
          f"in {r['train_seconds']:.0f}s")
    print(f"LKH mean length {g['lkh_mean']:.4f} ({g['instances']} test instances)")
    print(f"greedy:   {g['mean_length']:.4f}  gap {g['gap_of_means']:.2f}% (mean per-instance "
          f"{g['mean_gap']:.2f}%)" + (f"  [Kool et al.: {k['greedy_gap']}%]" if k else ""))
    print(f"sampling: {s['mean_length']:.4f}  gap {s['gap_of_means']:.2f}% (best of "
          f"{s['samples']}, first {s['instances']} instances; greedy there "
          f"{s['greedy_same_instances']['gap_of_means']:.2f}%)"
          + (f"  [Kool et al.: {k['sample_gap']}%]" if k else ""))


def _plot_curve(r: dict, a) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    c = r["curve"]
    ax.plot([p["seconds"] / 60 for p in c], [p["val_gap"] for p in c], marker="o")
    if r["kool2019"]:
        ax.axhline(r["kool2019"]["greedy_gap"], color="grey", ls=":",
                   label="Kool et al. after 100 x 1.28M instances (GPU)")
        ax.legend(fontsize=8)
    ax.set_xlabel("training minutes (one CPU thread)")
    ax.set_ylabel("greedy optimality gap on validation (%)")
    ax.set_yscale("log")
    ax.set_title(f"TSP{r['n']}: attention model, REINFORCE + rollout baseline")
    save_figure(fig, a, "tsp_curve")


def _plot_tours(test: dict, tours: list, a) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(tours), figsize=(3.2 * len(tours), 3.3), squeeze=False)
    for ax, i in zip(axes[0], range(len(tours))):
        c = test["coords"][i]
        for t, style, label in ((test["tours"][i].tolist(), "--", "LKH"),
                                (tours[i], "-", "model (greedy)")):
            p = c[t + t[:1]]
            ax.plot(p[:, 0], p[:, 1], style, lw=1.1, label=label)
        ax.scatter(c[:, 0], c[:, 1], s=10, color="black", zorder=3)
        model_len = float(tour_length(c[None], torch.tensor([tours[i]]))[0])
        ax.set_title(f"model {model_len:.3f} / LKH {float(test['lengths'][i]):.3f}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][0].legend(fontsize=7)
    save_figure(fig, a, "tsp_tours")

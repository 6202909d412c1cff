"""The attention model for routing on TSP20: REINFORCE with a greedy-rollout baseline.

``structconv reproduce tsp --out runs`` trains ``structconv.models.routing.AttentionModel``
(Kool, van Hoof & Welling, ICLR 2019) on random instances (n cities uniform in the unit
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
validation instances (their own LKH references) against training seconds. Runs resume from
the last finished epoch (checkpoints in safetensors, no pickle); LKH references are cached
per chunk. Writes ``<out>/tsp.json``, ``tsp_curve.png`` and ``tsp_tours.png``.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from pathlib import Path

import torch

from .._extras import require
from ..models.routing import AttentionModel, check_tours, tour_length
from ..training import resolve_device
from ..training.checkpoint import (
    CHECKPOINT_JSON,
    load_weights,
    resume_training,
    save_checkpoint,
    save_weights,
)
from ..training.optim import epoch_generator
from ._common import (
    COUNT,
    FRACTION,
    NATURAL,
    POSITIVE,
    THREADS,
    Bounded,
    hardware,
    heads_divide,
    param_count,
    pyplot,
    run_lock,
    save_figure,
    write_result,
)

__all__ = ["add_arguments", "run", "uniform_instances", "lkh_tours", "reference",
           "greedy_lengths", "sample_best", "baseline_update", "train", "KOOL"]

#: Kool et al. 2019, Table 1 (10,000 test instances): mean optimal length (Concorde), and the
#: attention model's greedy and 1,280-sample gaps; 100 epochs of 1,280,000 instances
KOOL = {20: {"optimal": 3.84, "greedy_gap": 0.34, "sample_gap": 0.08},
        50: {"optimal": 5.70, "greedy_gap": 1.76, "sample_gap": 0.52},
        100: {"optimal": 7.76, "greedy_gap": 4.53, "sample_gap": 2.26}}
TEST_SEED, VAL_SEED = 1234, 4321
#: LKH works on integer distances (EUC_2D rounds): coordinates are scaled by this first
LKH_SCALE = 1e6


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=Bounded(int, 3), default=20, help="cities per instance")
    parser.add_argument("--epochs", type=COUNT, default=None,
                        help="epochs (default 10; 2 with --quick)")
    parser.add_argument("--epoch-size", type=COUNT, default=64_000, help="instances per epoch")
    parser.add_argument("--batch", type=COUNT, default=512)
    parser.add_argument("--lr", type=POSITIVE, default=1e-4)
    parser.add_argument("--lr-decay", type=POSITIVE, default=1.0,
                        help="learning rate factor per epoch (the paper: 1.0)")
    parser.add_argument("--width", type=COUNT, default=128)
    parser.add_argument("--heads", type=COUNT, default=8)
    parser.add_argument("--layers", type=COUNT, default=3)
    parser.add_argument("--ffn", type=NATURAL, default=0, help="feed-forward width (0: 4 x width)")
    parser.add_argument("--clip", type=POSITIVE, default=10.0, help="tanh clipping C")
    parser.add_argument("--warmup-epochs", type=NATURAL, default=1,
                        help="epochs with the exponential baseline before the rollout one")
    parser.add_argument("--bl-eval", type=Bounded(int, 2), default=10_000,
                        help="instances of the baseline's paired t-test")
    parser.add_argument("--alpha", type=FRACTION, default=0.05, help="the t-test's level")
    parser.add_argument("--test-size", type=COUNT, default=10_000)
    parser.add_argument("--val-size", type=COUNT, default=1_000)
    parser.add_argument("--samples", type=COUNT, default=1280, help="samples per instance")
    parser.add_argument("--sample-instances", type=COUNT, default=1_000,
                        help="test instances decoded by sampling")
    parser.add_argument("--lkh-runs", type=COUNT, default=10, help="elkai's runs per instance")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (0: default)")


# -- instances and references --------------------------------------------------------------------
def uniform_instances(count: int, n: int, seed: int) -> torch.Tensor:
    """(count, n, 2) float64 cities uniform in the unit square, fixed by ``seed``."""
    if count < 1 or n < 3:
        raise ValueError(f"uniform_instances needs count >= 1 and n >= 3, got {count}, {n}")
    return torch.rand(count, n, 2, generator=torch.Generator().manual_seed(seed),
                      dtype=torch.float64)


def lkh_tours(coords: torch.Tensor, runs: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """(lengths (B,) float64, tours (B, n) long) of LKH-3's tours (``elkai``) of each
    instance (B, n, 2); the lengths are recomputed from the float coordinates."""
    elkai = require("elkai", "routing", "the LKH reference tours")
    tours = []
    for inst in coords.to(torch.float64).numpy() * LKH_SCALE:
        cities = {i: (float(x), float(y)) for i, (x, y) in enumerate(inst)}
        tour = elkai.Coordinates2D(cities).solve_tsp(runs=runs)
        tours.append(tour[:-1])  # elkai closes the tour on its first city
    t = torch.tensor(tours, dtype=torch.long)
    check_tours(t, coords.shape[1])
    return tour_length(coords.to(torch.float64), t), t


def reference(which: str, count: int, n: int, seed: int, folder: Path, runs: int,
              chunk: int = 500) -> dict:
    """{"coords", "lengths", "tours"} of a fixed instance set and its LKH tours, computed in
    chunks cached under ``folder`` (a killed run keeps the chunks it finished)."""
    coords = uniform_instances(count, n, seed)
    name = f"tsp{n}-{which}-{seed}-{count}"
    full = folder / f"{name}.safetensors"
    if full.is_file():
        t = load_weights(full)
        if torch.equal(t["coords"], coords):
            return t
    parts = []
    for i in range(0, count, chunk):
        part = folder / f"{name}.part{i // chunk:04d}.safetensors"
        if part.is_file():
            parts.append(load_weights(part))
            continue
        lengths, tours = lkh_tours(coords[i:i + chunk], runs)
        save_weights(part, {"lengths": lengths, "tours": tours})
        parts.append({"lengths": lengths, "tours": tours})
        print(f"  LKH {which}: {min(count, i + chunk)}/{count} instances", flush=True)
    out = {"coords": coords, "lengths": torch.cat([p["lengths"] for p in parts]),
           "tours": torch.cat([p["tours"] for p in parts])}
    save_weights(full, out)
    for p in folder.glob(f"{name}.part*.safetensors"):
        p.unlink()
    return out


# -- decoding ------------------------------------------------------------------------------------
@torch.no_grad()
def greedy_lengths(model: AttentionModel, coords: torch.Tensor, batch: int = 1000,
                   tours: bool = False):
    """Greedy tour lengths (B,) float64 of each instance (and the tours with ``tours``)."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    lens, all_tours = [], []
    for i in range(0, len(coords), batch):
        c = coords[i:i + batch].to(dev)
        t, _ = model(c, "greedy")
        lens.append(tour_length(c.to(torch.float64), t).cpu())
        all_tours.append(t.cpu())
    model.train(was)
    out = torch.cat(lens)
    return (out, torch.cat(all_tours)) if tours else out


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


# -- the rollout baseline ------------------------------------------------------------------------
def baseline_update(candidate: torch.Tensor, baseline: torch.Tensor,
                    alpha: float) -> tuple[bool, float, float]:
    """(replace, t, p): replace the baseline by the candidate policy when the candidate's mean
    length on the same instances is lower and a one-sided paired t-test rejects "not
    shorter" at level ``alpha`` (Kool et al.'s rule; p = the two-sided p-value / 2)."""
    stats = require("scipy.stats", "routing", "the rollout baseline's t-test")
    if candidate.shape != baseline.shape or candidate.dim() != 1 or len(candidate) < 2:
        raise ValueError(f"baseline_update needs two (B >= 2,) length vectors of the same "
                         f"instances, got {tuple(candidate.shape)} and {tuple(baseline.shape)}")
    diff_mean = float((candidate - baseline).mean())
    if diff_mean >= 0:
        return False, float("nan"), 1.0
    t, p = stats.ttest_rel(candidate.numpy(), baseline.numpy())
    p_one = float(p) / 2
    return bool(p_one < alpha), float(t), p_one


class _State:
    """What a run carries between epochs (not a module: weights live in the models)."""

    def __init__(self, a):
        ffn = a.ffn or 4 * a.width
        self.device = resolve_device(getattr(a, "device", "cpu") or "cpu")
        self.model = AttentionModel(a.width, a.heads, a.layers, ffn, a.clip).to(self.device)
        self.baseline = copy.deepcopy(self.model)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=a.lr)
        self.epoch, self.seconds, self.curve, self.updates = 0, 0.0, [], []
        self.ema = None  # the warm-up's exponential baseline
        self.bl_seed = 0  # the seed of the baseline's evaluation instances
        self.bl_costs = None

    def trainer(self) -> dict:
        return {"epoch": self.epoch, "seconds": self.seconds, "curve": self.curve,
                "updates": self.updates, "ema": self.ema, "bl_seed": self.bl_seed}


def _bl_instances(state: _State, a) -> torch.Tensor:
    return uniform_instances(a.bl_eval, a.n, 100_000 + state.bl_seed)


def _resume(state: _State, run_dir: Path, a) -> None:
    if not (run_dir / CHECKPOINT_JSON).is_file():
        return
    ck = resume_training(run_dir, state.model, state.opt)
    state.baseline.load_state_dict(ck["best"])
    tr = ck["trainer"]
    state.epoch, state.seconds, state.curve = tr["epoch"], tr["seconds"], tr["curve"]
    state.updates, state.ema, state.bl_seed = tr["updates"], tr["ema"], tr["bl_seed"]
    print(f"  resumed after epoch {state.epoch} ({state.seconds:.0f}s of training)")


def _train_epoch(state: _State, a) -> float:
    """One epoch of REINFORCE; returns the mean training loss."""
    gen = epoch_generator(a.seed, state.epoch)
    warm = state.epoch < a.warmup_epochs
    for g in state.opt.param_groups:
        g["lr"] = a.lr * a.lr_decay ** state.epoch
    state.model.train()
    total, batches = 0.0, 0
    for _ in range(0, a.epoch_size, a.batch):
        # instances drawn on the CPU from the epoch's seed: the same on any device
        coords = torch.rand(a.batch, a.n, 2, generator=gen).to(state.device)
        tours, ll = state.model(coords, "sample")
        cost = tour_length(coords, tours)
        if warm:
            m = float(cost.mean())
            state.ema = m if state.ema is None else 0.8 * state.ema + 0.2 * m
            bl = torch.full_like(cost, state.ema)
        else:
            bl = greedy_lengths(state.baseline, coords).to(device=cost.device, dtype=cost.dtype)
        loss = ((cost - bl) * ll).mean()
        state.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), 1.0)
        state.opt.step()
        total, batches = total + float(loss.detach()), batches + 1
    return total / max(1, batches)


def _end_epoch(state: _State, a) -> dict:
    """The baseline's t-test (and update) on its evaluation instances."""
    bl_coords = _bl_instances(state, a)
    if state.bl_costs is None:
        state.bl_costs = greedy_lengths(state.baseline, bl_coords)
    cand = greedy_lengths(state.model, bl_coords)
    replace, t, p = baseline_update(cand, state.bl_costs, a.alpha)
    info = {"epoch": state.epoch, "candidate": float(cand.mean()),
            "baseline": float(state.bl_costs.mean()),
            # no t statistic when the candidate is not shorter (null, not NaN, in the JSON)
            "t": t if math.isfinite(t) else None, "p": p, "replaced": replace}
    if replace:
        state.baseline.load_state_dict(state.model.state_dict())
        state.bl_seed = state.epoch + 1  # fresh instances for the next test
        state.bl_costs = None
    state.updates.append(info)
    return info


def train(a, run_dir: Path, val: dict) -> _State:
    """Train (or resume) for ``a.epochs`` epochs; checkpoints after every epoch."""
    torch.manual_seed(a.seed)
    state = _State(a)
    _resume(state, run_dir, a)
    lkh_val = float(val["lengths"].mean())
    while state.epoch < a.epochs:
        t0 = time.perf_counter()
        loss = _train_epoch(state, a)
        bl = _end_epoch(state, a)
        state.seconds += time.perf_counter() - t0  # training and the baseline's test
        v = greedy_lengths(state.model, val["coords"]).mean()
        state.epoch += 1
        state.curve.append({"epoch": state.epoch, "seconds": state.seconds,
                            "instances": state.epoch * a.epoch_size, "loss": loss,
                            "val_length": float(v), "val_gap": 100 * (float(v) / lkh_val - 1)})
        save_checkpoint(run_dir, state.epoch, state.model.state_dict(), state.opt.state_dict(),
                        state.trainer(), best_state=state.baseline.state_dict())
        kept = "replaced" if bl["replaced"] else "kept"
        print(f"  epoch {state.epoch}: loss {loss:.3f}  val greedy {float(v):.4f} (gap "
              f"{state.curve[-1]['val_gap']:.2f}%)  baseline {kept} (p {bl['p']:.3g})  "
              f"{state.seconds:.0f}s", flush=True)
    return state


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


def _evaluate(state: _State, test: dict, a) -> dict:
    t0 = time.perf_counter()
    greedy, tours = greedy_lengths(state.model, test["coords"], tours=True)
    t1 = time.perf_counter()
    k = a.sample_instances
    sampled = sample_best(state.model, test["coords"][:k], a.samples, seed=a.seed)
    t2 = time.perf_counter()
    opt = test["lengths"]

    def gaps(lengths, ref):
        return {"mean_length": float(lengths.mean()), "lkh_mean": float(ref.mean()),
                "gap_of_means": 100 * (float(lengths.mean()) / float(ref.mean()) - 1),
                "mean_gap": 100 * float((lengths / ref - 1).mean())}

    return {"greedy": {**gaps(greedy, opt), "instances": len(greedy), "seconds": t1 - t0},
            "sampling": {**gaps(sampled, opt[:k]), "greedy_same_instances":
                         gaps(greedy[:k], opt[:k]), "instances": k, "samples": a.samples,
                         "seconds": t2 - t1},
            "tours": tours[:4].tolist()}


def run(args) -> int:
    """Train (or resume), evaluate, print, write JSON and plots."""
    args.epochs = 10 if args.epochs is None else args.epochs
    check_arguments(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(args.out) / "tsp_runs"
    folder.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    test = reference("test", args.test_size, args.n, TEST_SEED, folder, args.lkh_runs)
    val = reference("val", args.val_size, args.n, VAL_SEED, folder, args.lkh_runs)
    tag = f"tsp{args.n}-w{args.width}-b{args.batch}-e{args.epoch_size}-s{args.seed}"
    with run_lock(folder, tag, "tsp"):  # one process trains a run folder at a time
        state = train(args, folder / tag, val)
    ev = _evaluate(state, test, args)
    result = {"experiment": "tsp", "n": args.n, "settings": {
        k: v for k, v in vars(args).items() if isinstance(v, (int, float, str))},
        "params": param_count(state.model), "train_seconds": state.seconds,
        "instances_seen": state.epoch * args.epoch_size, "curve": state.curve,
        "baseline_tests": state.updates, "evaluation": ev, "kool2019": KOOL.get(args.n),
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
    save_figure(fig, argparse.Namespace(**{**vars(a), "plot": None}), "tsp_curve")


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
    save_figure(fig, argparse.Namespace(**{**vars(a), "plot": None}), "tsp_tours")

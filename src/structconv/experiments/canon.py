"""Shift heads against Canon layers on a multi-hop task: accuracy per number of hops.

``structconv reproduce canon --out runs`` trains the shipped ``transformer_depo`` config
(``sc.nn.TransformerLM`` on the Depo-style k-hop task of ``structconv.data.depo``, the ``depo``
dataset: a shuffled list of the directed pairs of a random cycle, then questions "start, k ->
k-th successor", k = 1..8) for every model kind of ``--kinds`` (default ``STUDY_KINDS``: none,
rotary and shift with and without Canon-ABCD, ALiBi, the learned T5-style relative bias, and
each Canon place alone on none) and seed, each an arm of config overrides (its position, Canon
places, seed, and the feed-forward width that equalises its parameters to the ``none`` model;
the options' values), trained by ``structconv.training.train`` (the task:
``structconv.training.tasks.hops``). Training draws fresh sequences every step (the same ones
for every kind of a seed) and is scored on the answer tokens only. The number of hops of the
training questions is drawn uniformly from 1 up to a limit that grows from 1 to 8 over the
first half of training (``--curriculum``, ``train.depo.curriculum``): in pilots
(none+Canon-ABCD, width 64 and 128, 12 pairs) hops drawn from 1..8 from the start left even
one hop at chance after 1,500 steps, while one hop alone was learned within 250. Evaluation
uses ``--eval-per-k`` fixed sequences per k with one question each (so no earlier answer can
shorten the chain), greedy over the whole vocabulary, every ``--eval-every`` steps (an epoch
of the engine). Chance is about 1/n (the instance's nodes).

Reports, per kind: accuracy at every k (mean ± std over seeds), the depth reached (the largest
k up to which every accuracy is at least ``--depth-at``), final training loss (the last
step's), parameters and seconds (training with its evaluations); ``canon.png`` plots accuracy
against k. Every run is a run directory ``<out>/canon_runs/<kind>-s<seed>-<steps>`` trained at
most once under its lock: a finished run is read back, an interrupted one resumed from its
checkpoint (``--checkpoint-every`` steps, rounded up to whole ``--eval-every`` intervals; 0:
every 10 s) to the numbers of an uninterrupted one, and one made with other options refused.
``--jobs 2`` runs two at once with one thread each. Writes ``<out>/canon.json``.

``--quick`` ends with the numbers of the recipe's former hand-written loop bit for bit (every
arm's accuracies, losses and final weights, compared before that loop was removed): the same
initial weights, sequences, loss, optimizer and schedule. The engine computes a step's learning
rate as ``lr x factor`` where the former loop wrote ``lr/10 + cosine x (lr - lr/10)``; the two
could differ in a rate's last bit, and did not in the runs compared.

The Tiny Shakespeare half of the study (validation loss, 1x-16x extrapolation) is
``reproduce shift-heads --kinds ...`` with the same model kinds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import time
from pathlib import Path

import torch

from ..config import LM_KEYS, MAX_BATCHES, config_from
from ..data.depo import DepoTask
from ..io import atomic_write_json
from ..models.build import lm_shape
from ..models.sizes import ffn_at_budget, lm_parameters
from ..nn.lm import split_kind
from ..training import load_data, resolve_device
from ..training.tasks.hops import depth
from ._common import (
    POSITIVE,
    THREADS,
    UNIT,
    Bounded,
    Listed,
    hardware,
    heads_divide,
    mean_std,
    pyplot,
    save_figure,
    write_result,
)
from .shift_heads import kind_styles, parse_kinds, run_all, run_name, warmup_steps
from .sweep import Run, config_run, history

__all__ = ["add_arguments", "run", "STUDY_KINDS", "CONFIG", "QUICK", "task_of", "overrides",
           "kind_run", "equalised", "depth", "check_arguments"]

#: the shipped config every arm overrides
CONFIG = "transformer_depo"
#: the study's arms: none, rotary and shift with and without Canon-ABCD, ALiBi, the learned
#: T5-style relative bias, and each Canon place alone on none
STUDY_KINDS = ("none", "none+Canon-ABCD", "rotary", "rotary+Canon-ABCD", "shift",
               "shift+Canon-ABCD", "alibi", "relative", "none+Canon-A", "none+Canon-B",
               "none+Canon-C", "none+Canon-D")


#: upper bounds of the size and count options: far past any run of this study, low enough that
#: a slip of the keyboard (a few extra zeros) is refused at once instead of filling the memory
SEEDS, STEPS, BATCH, WIDTH = Bounded(int, 1, 1000), Bounded(int, 1, 10**7), \
    Bounded(int, 1, 65536), Bounded(int, 1, 16384)
LAYERS, HEADS, TAPS, TOKENS = Bounded(int, 1, 256), Bounded(int, 1, 256), Bounded(int, 1, 64), \
    Bounded(int, 1, 65536)
EVALS, EVERY, JOBS = Bounded(int, 1, 10**6), Bounded(int, 1, MAX_BATCHES), Bounded(int, 1, 256)
PER_SEQUENCE = Bounded(int, 1, 4096)  # nodes, hops and queries of one sequence


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kinds", default=",".join(STUDY_KINDS), type=Listed(split_kind),
                        help="comma list of model kinds (position[+Canon-places])")
    parser.add_argument("--seeds", type=SEEDS, default=3)
    parser.add_argument("--steps", type=STEPS, default=3000)
    parser.add_argument("--batch", type=BATCH, default=32)
    parser.add_argument("--width", type=WIDTH, default=128)
    parser.add_argument("--layers", type=LAYERS, default=4)
    parser.add_argument("--heads", type=HEADS, default=4, help="attention heads per layer")
    parser.add_argument("--shifts", type=HEADS, default=4, help="shift heads of the shift kinds")
    parser.add_argument("--canon-kernel", type=TAPS, default=4, help="taps of the Canon layers")
    parser.add_argument("--lr", type=POSITIVE, default=1e-3)
    parser.add_argument("--nodes", type=TOKENS, default=32, help="node tokens")
    parser.add_argument("--n", type=PER_SEQUENCE, default=12, help="nodes (pairs) per sequence")
    parser.add_argument("--max-hops", type=PER_SEQUENCE, default=8, help="k runs over 1..max-hops")
    parser.add_argument("--queries", type=PER_SEQUENCE, default=8,
                        help="questions per training sequence (evaluation asks one)")
    parser.add_argument("--curriculum", type=UNIT, default=0.5,
                        help="the largest k trained grows from 1 to --max-hops over this "
                             "fraction of the steps (0: every k from the start)")
    parser.add_argument("--eval-per-k", type=EVALS, default=512,
                        help="evaluation sequences per number of hops")
    parser.add_argument("--eval-every", type=EVERY, default=250,
                        help="steps between evaluations (the config's batches_per_epoch)")
    parser.add_argument("--depth-at", type=UNIT, default=0.9,
                        help="accuracy a number of hops must reach to count in the depth")
    parser.add_argument("--checkpoint-every", type=Bounded(int, 0, 10**7), default=500,
                        help="steps between a run's checkpoints, rounded up to whole "
                             "--eval-every intervals (0: every 10 s)")
    parser.add_argument("--jobs", type=JOBS, default=1, help="runs at once (one thread each)")
    parser.add_argument("--threads", type=THREADS, default=0,
                        help="torch threads with --jobs 1 (0: torch's default)")
    parser.add_argument("--plot", default=None, help="accuracy plot PNG path")


# -- the arms: the shipped config and its overrides ------------------------------------------------
def task_of(a) -> DepoTask:
    """The run's task sizes (``ValueError`` for sizes that do not make one)."""
    return DepoTask(nodes=a.nodes, n=a.n, max_hops=a.max_hops, queries=a.queries)


def overrides(a) -> list[str]:
    """The overrides every arm shares: the options' values as config keys."""
    task = (f"{{nodes={a.nodes}, n={a.n}, max_hops={a.max_hops}, queries={a.queries}, "
            f"eval_per_k={a.eval_per_k}}}")
    return [f"data.options={task}", f"data.batch_size={a.batch}",
            f"data.batches_per_epoch={a.eval_every}", f"model.lm.width={a.width}",
            f"model.lm.layers={a.layers}", f"model.lm.heads={a.heads}",
            f"model.lm.shifts={a.shifts}", f"train.lr={a.lr!r}", f"train.max_steps={a.steps}",
            f"train.epochs={math.ceil(a.steps / a.eval_every)}",
            f"train.warmup_steps={warmup_steps(a.steps)}",
            f"train.checkpoint_every={math.ceil(a.checkpoint_every / a.eval_every)}",
            f"train.depo.curriculum={float(a.curriculum)!r}"]


def _kind(kind: str, a, ffn: int) -> list[str]:
    position, canon = split_kind(kind)
    out = [f"model.lm.position={position}", f"model.lm.canon={json.dumps(canon)}",
           f"model.lm.ffn={ffn}"]
    return out + ([f"model.lm.canon_kernel={a.canon_kernel}"] if canon else [])


def kind_run(kind: str, seed: int, a, ffn: int) -> Run:
    """The run of ``kind`` with ``seed``: the shipped config and its overrides."""
    return Run(run_name(kind, seed, a.steps, a), CONFIG,
               (*overrides(a), *_kind(kind, a, ffn), f"seed={seed}"))


def equalised(kinds: list[str], a) -> tuple[int, dict]:
    """(the ``none`` model's parameter count, {kind: the feed-forward width that matches it}),
    counted from the sizes of the runs' config and data (``models.sizes``)."""
    cfg = config_from(CONFIG, overrides(a))
    vocab, length = lm_shape(cfg, load_data(cfg))
    spec = {**LM_KEYS, **cfg["model"]["lm"], "canon_kernel": a.canon_kernel}
    budget = lm_parameters({**spec, "position": "none", "canon": "", "ffn": 0}, vocab, length)
    ffns = {}
    for k in dict.fromkeys(kinds):
        position, canon = split_kind(k)
        ffns[k] = ffn_at_budget({**spec, "position": position, "canon": canon}, budget, vocab,
                                length)
    return budget, ffns


# -- the sweep: train (the engine) and read each run -----------------------------------------------
def _cpu_seconds(where: Path, spent: float) -> float:
    """The CPU seconds of the call that trained (or resumed) the run in ``where``, kept in
    its ``cpu.json`` (written by the first call that reads the run)."""
    path = where / "cpu.json"
    if path.is_file():
        return json.loads(path.read_text())["cpu_seconds"]
    atomic_write_json(path, {"cpu_seconds": spent})
    return spent


def _summary(kind: str, seed: int, ffn: int, res: dict, rows: list[dict], cpu: float, a) -> dict:
    """A run's record from its result and metrics rows: the final accuracy per k and the
    curve (step, the step's loss, accuracy per k) at every evaluation."""
    final = {k: res[f"val_acc@{k}"] for k in range(1, a.max_hops + 1)}
    curve = [dict(step=r["step"], train_loss=r["step_loss"],
                  accuracy={k: r[f"val_acc@{k}"] for k in sorted(final)}) for r in rows]
    return dict(kind=kind, seed=seed, steps=a.steps, accuracy=final,
                depth=depth(final, a.depth_at), train_loss=rows[-1]["step_loss"], curve=curve,
                seconds=res["train_time_s"], cpu_seconds=cpu, params=res["parameters"], ffn=ffn,
                device=resolve_device(a.device).type)


def _job(spec) -> dict:
    """One run (in a worker with one thread, or inline): trained, resumed or read."""
    kind, seed, ffn, a, threads, folder = spec
    if threads:
        torch.set_num_threads(threads)
    run = kind_run(kind, seed, a, ffn)
    where = Path(folder) / run.name
    fresh = not (where / "result.json").is_file()
    c0 = time.process_time()
    res = config_run(folder, run, "canon", a.device)
    cpu = _cpu_seconds(where, time.process_time() - c0)
    out = _summary(kind, seed, ffn, res, history(folder, run), cpu, a)
    if fresh:  # trained (or finished) by this call
        accs = " ".join(f"{out['accuracy'][k]:.2f}" for k in sorted(out["accuracy"]))
        print(f"  {kind:<18} seed {seed} ({a.steps} steps): accuracy by k {accs}  depth "
              f"{out['depth']}  params {out['params']}  {out['seconds']:.0f}s "
              f"({out['cpu_seconds']:.0f}s CPU)", flush=True)
    return out


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(steps=12, seeds=1, eval_every=6, eval_per_k=16, batch=4, width=16, layers=1,
             heads=2, shifts=2, nodes=12, n=6, max_hops=3, queries=2, curriculum=0.5)


def check_arguments(a) -> None:
    """The checks that join options (each option's range is its argparse type), and every
    arm's config validated (``ConfigError`` naming the key) before anything trains."""
    try:
        task_of(a)
    except ValueError as e:  # the task names its fields: name the options instead
        raise ValueError(re.sub(r"\b(nodes|n|max_hops|queries)=",
                                lambda m: f"--{m.group(1).replace('_', '-')} ", str(e))) from None
    heads_divide(a)
    if a.steps < 2:
        raise ValueError(f"--steps must be at least 2 (a warm-up step, then the cosine "
                         f"decay), got {a.steps}")
    for k in dict.fromkeys(parse_kinds(a.kinds)):
        config_from(CONFIG, list(kind_run(k, a.seed, a, 4 * a.width).overrides))


def run(args) -> int:
    """Every kind x seed; prints the tables, writes JSON and the plot."""
    check_arguments(args)
    kinds = parse_kinds(args.kinds)
    task = task_of(args)
    t_all = time.perf_counter()
    budget, ffns = equalised(kinds, args)
    folder = Path(args.out) / "canon_runs"
    folder.mkdir(parents=True, exist_ok=True)
    threads = 1 if args.jobs > 1 else args.threads
    specs = [(k, args.seed + i, ffns[k], args, threads, str(folder))
             for k in kinds for i in range(args.seeds)]
    runs = run_all(_job, specs, args.jobs)
    rows = _summarise(runs, kinds, args.depth_at)
    result = dict(experiment="canon", config=CONFIG, task=dataclasses.asdict(task),
                  vocab=task.vocab_size, length=task.length,
                  settings={k: v for k, v in vars(args).items()
                            if isinstance(v, (int, float, str))},
                  budget=budget, ffn=ffns, kinds=rows, runs=runs,
                  wall_seconds=time.perf_counter() - t_all, hardware=hardware())
    _print_table(rows, task)
    write_result(args, "canon", result)
    _plot(rows, task, args)
    return 0


def _summarise(runs: list[dict], kinds: list[str], at: float) -> dict:
    rows = {}
    for kind in kinds:
        rs = [r for r in runs if r["kind"] == kind]
        per = [{int(k): v for k, v in r["accuracy"].items()} for r in rs]
        acc = {k: mean_std([p[k] for p in per]) for k in sorted(per[0])}
        rows[kind] = dict(accuracy=acc, depth=depth({k: m for k, (m, _) in acc.items()}, at),
                          depths=[r["depth"] for r in rs], params=rs[0]["params"],
                          ffn=rs[0]["ffn"], train_loss=mean_std([r["train_loss"] for r in rs]),
                          seconds=mean_std([r["seconds"] for r in rs])[0],
                          cpu_seconds=sum(r.get("cpu_seconds", 0.0) for r in rs),
                          seeds=len(rs))
    return rows


def _print_table(rows: dict, task: DepoTask) -> None:
    K = task.max_hops
    print(f"\naccuracy by number of hops (mean ± std over seeds; chance ~{1 / task.n:.2f})")
    print(f"{'kind':<18} {'params':>8} {'ffn':>4} " + " ".join(f"{f'k={k}':>11}"
                                                          for k in range(1, K + 1))
          + f" {'depth':>5} {'s/run':>6}")
    for kind, r in rows.items():
        cells = " ".join(f"{r['accuracy'][k][0]:.2f} ± {r['accuracy'][k][1]:.2f}"
                         for k in range(1, K + 1))
        print(f"{kind:<18} {r['params']:>8} {r['ffn']:>4} {cells} {r['depth']:>5} "
              f"{r['seconds']:>6.0f}")


def _plot(rows: dict, task: DepoTask, a) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ks = list(range(1, task.max_hops + 1))
    style = kind_styles(rows)  # one colour per arm (twelve arms: no shared colours)
    for i, (kind, r) in enumerate(rows.items()):
        m = [r["accuracy"][k][0] for k in ks]
        s = [r["accuracy"][k][1] for k in ks]
        # arms offset a little along k so that equal accuracies and their bars stay apart
        x = [k + (i - (len(rows) - 1) / 2) * 0.012 for k in ks]
        ax.errorbar(x, m, yerr=s, marker="o", capsize=2, color=style[kind]["color"],
                    linestyle="--" if "Canon" in kind else "-", label=kind)
    ax.set_xticks(ks)
    ax.axhline(1 / task.n, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("hops k")
    ax.set_ylabel("answer accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"k-hop task: {task.n} pairs, {a.layers}x{a.width}, {a.steps} steps")
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    save_figure(fig, a, "canon")

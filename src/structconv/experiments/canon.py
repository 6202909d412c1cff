"""Shift heads against Canon layers on a multi-hop task: accuracy per number of hops.

``structconv reproduce canon --out runs`` trains ``sc.nn.TransformerLM`` of every model kind of
``--kinds`` (default ``STUDY_KINDS``: none, rotary and shift with and without Canon-ABCD,
ALiBi, the learned T5-style relative bias, and each Canon place alone on none) on the
Depo-style k-hop task of ``structconv.data.depo`` (a shuffled list of the directed pairs of a
random cycle, then questions "start, k -> k-th successor", k = 1..8), parameters equalised to
the ``none`` model through the feed-forward width, for ``--seeds`` seeds. Training draws fresh
sequences every step (the same ones for every kind of a seed) and is scored on the answer
tokens only. The number of hops of the training questions is drawn uniformly from 1 up to a
limit that grows from 1 to 8 over the first half of training (``--curriculum``): in pilots
(none+Canon-ABCD, width 64 and 128, 12 pairs) hops drawn from 1..8 from the start left even
one hop at chance after 1,500 steps, while one hop alone was learned within 250. Evaluation
uses ``--eval-per-k`` fixed sequences per k with one question each
(so no earlier answer can shorten the chain), greedy over the whole vocabulary. Chance is about
1/n (the instance's nodes).

Reports, per kind: accuracy at every k (mean ± std over seeds), the depth reached (the largest
k up to which every accuracy is at least ``--depth-at``), final training loss, parameters and
seconds; ``canon.png`` plots accuracy against k. Every run writes JSON and safetensors under
``<out>/canon_runs/`` and is skipped when already there (resumes); ``--jobs 2`` runs two at
once with one thread each. Writes ``<out>/canon.json``.

The Tiny Shakespeare half of the study (validation loss, 1x-16x extrapolation) is
``reproduce shift-heads --kinds ...`` with the same model kinds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.depo import DepoTask, generate
from ..io import atomic_write_bytes, atomic_write_json
from ..nn.lm import TransformerLM, split_kind
from ..training.checkpoint import CHECKPOINT_JSON, resume_training, save_checkpoint
from ._common import (
    POSITIVE,
    THREADS,
    UNIT,
    Bounded,
    Listed,
    device,
    hardware,
    heads_divide,
    mean_std,
    param_count,
    pyplot,
    run_once,
    save_figure,
    write_result,
)
from .shift_heads import equalised, kind_styles, parse_kinds, run_all, run_name

__all__ = ["add_arguments", "run", "STUDY_KINDS", "task_of", "build", "answer_loss",
           "eval_sets", "accuracy_per_k", "train_one", "depth", "train_steps", "lr_at", "adamw",
           "save_state", "resumed", "finish_run", "checkpoint_dir", "run_settings"]

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
EVALS, EVERY, JOBS = Bounded(int, 1, 10**6), Bounded(int, 1, 10**7), Bounded(int, 1, 256)
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
    parser.add_argument("--eval-every", type=EVERY, default=250)
    parser.add_argument("--depth-at", type=UNIT, default=0.9,
                        help="accuracy a number of hops must reach to count in the depth")
    parser.add_argument("--checkpoint-every", type=Bounded(int, 0, 10**7), default=500,
                        help="steps between a run's checkpoints (0: none)")
    parser.add_argument("--jobs", type=JOBS, default=1, help="runs at once (one thread each)")
    parser.add_argument("--threads", type=THREADS, default=0,
                        help="torch threads with --jobs 1 (0: torch's default)")
    parser.add_argument("--plot", default=None, help="accuracy plot PNG path")


# -- the task and the models ---------------------------------------------------------------------
def task_of(a) -> DepoTask:
    """The run's task (``ValueError`` for sizes that do not make one)."""
    return DepoTask(nodes=a.nodes, n=a.n, max_hops=a.max_hops, queries=a.queries)


def build(kind: str, task: DepoTask, a, ffn: int | None = None) -> TransformerLM:
    """The ``kind`` model for ``task`` (a learned position table covers a training sequence)."""
    position, canon = split_kind(kind)
    return TransformerLM(task.vocab_size, a.width, a.layers, a.heads, position, a.shifts, ffn,
                         context=task.length, canon=canon, canon_kernel=a.canon_kernel)


def answer_loss(model, ids, answers, task: DepoTask):
    """Cross-entropy of the answers (B, Q) predicted at the hop tokens of ids (B, T)."""
    pos = task.positions[:answers.shape[1]]
    logits = model(ids[:, :int(pos[-1]) + 1])[:, pos.to(ids.device)]  # the answers are never read
    return F.cross_entropy(logits.flatten(0, 1), answers.flatten())


def eval_sets(task: DepoTask, per_k: int, seed: int = 12345) -> dict[int, tuple]:
    """{k: (ids (per_k, T), answers (per_k,))}: one question per sequence, all with k hops."""
    one = dataclasses.replace(task, queries=1)
    out = {}
    for k in range(1, task.max_hops + 1):
        b = generate(one, per_k, torch.Generator().manual_seed(seed + k), hops=k)
        out[k] = (b.ids, b.answers[:, 0])
    return out


@torch.no_grad()
def accuracy_per_k(model, sets: dict[int, tuple], task: DepoTask,
                   chunk: int = 256) -> dict[int, float]:
    """Greedy accuracy (argmax over the vocabulary) of the answers of each k's set."""
    was = model.training
    model.eval()
    pos = int(task.positions[0])
    acc = {}
    for k, (ids, answers) in sets.items():
        hits = sum(int((model(ids[i:i + chunk, :pos + 1])[:, pos].argmax(-1)
                        == answers[i:i + chunk]).sum()) for i in range(0, len(ids), chunk))
        acc[k] = hits / len(ids)
    model.train(was)
    return acc


def reach_at(step: int, a, K: int) -> int:
    """The largest number of hops trained at ``step``: 1 at the start, growing linearly to K
    at ``a.curriculum`` x ``a.steps`` (K throughout when the curriculum is 0). The schedule
    depends on the step only, so every kind of a seed trains on the same sequences."""
    span = a.curriculum * a.steps
    return K if span <= 0 else min(K, 1 + int(step * K / span))


def depth(acc: dict, at: float) -> int:
    """The largest k such that every number of hops up to k has accuracy >= ``at`` (0: none)."""
    d = 0
    for k in sorted(acc, key=int):
        if acc[k] < at:
            break
        d = int(k)
    return d


# -- canon's own training loop (not yet on structconv.training's engine) ---------------------
def lr_at(step: int, a) -> float:
    """The learning rate at ``step`` of ``a.steps`` (peak ``a.lr``)."""
    # nanoGPT's schedule: linear warm-up, cosine decay to a tenth at the last step
    warm, lo = max(1, min(100, a.steps // 10)), a.lr / 10
    if step < warm:
        return a.lr * (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, a.steps - warm))
    return lo + 0.5 * (1 + math.cos(math.pi * t)) * (a.lr - lo)


def adamw(model, lr: float) -> torch.optim.AdamW:
    """nanoGPT's optimizer: AdamW, betas (0.9, 0.99), weight decay 0.1 on matrices (and
    tables) only; ``train_steps`` sets the learning rate every step (``lr_at``)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.99))


def train_steps(model, opt, a, batch_loss, evaluate, gen: torch.Generator,
                run_dir: Path | None = None) -> tuple[list[dict], float, float]:
    """The recipes' training loop: ``a.steps`` steps at ``lr_at``, gradients clipped to norm 1;
    ``batch_loss(step)`` draws a batch from ``gen`` and returns its loss, ``evaluate(step,
    train_loss)`` a curve entry every ``a.eval_every`` steps and at the last. Returns (curve,
    wall seconds of training, CPU seconds of this process while training).

    With ``run_dir`` and ``a.checkpoint_every`` > 0 a checkpoint (model, optimizer, RNG states,
    the batch generator, the curve so far; ``sc.checkpoint``) is committed every that many
    steps and resumed from when present: a run killed midway continues where it stopped and
    ends as the uninterrupted run would (the same batches and the same arithmetic).
    """
    start, curve, before, cpu_before = 0, [], 0.0, 0.0
    every = getattr(a, "checkpoint_every", 0) if run_dir is not None else 0
    if every and (Path(run_dir) / CHECKPOINT_JSON).is_file():
        tr = resume_training(run_dir, model, opt)["trainer"]
        start, curve, before, cpu_before = tr["step"], tr["curve"], tr["seconds"], tr["cpu"]
        # the batch generator goes on from where it stood (the RNG states are the checkpoint's)
        gen.set_state(torch.tensor(tr["generator"], dtype=torch.uint8))
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(start, a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        loss = batch_loss(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            curve.append(evaluate(step + 1, float(loss.detach())))
        if every and (step + 1) % every == 0 and step + 1 < a.steps:
            save_checkpoint(run_dir, step + 1, model.state_dict(), opt.state_dict(), dict(
                step=step + 1, curve=curve, seconds=before + time.perf_counter() - t0,
                cpu=cpu_before + time.process_time() - c0, generator=gen.get_state().tolist()))
    return curve, before + time.perf_counter() - t0, cpu_before + time.process_time() - c0


def save_state(model, path: Path) -> None:
    """The model's weights as safetensors at ``path`` (atomically)."""
    from safetensors.torch import save

    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    atomic_write_bytes(path, save(state))


def run_settings(a, keys: Sequence[str]) -> dict:
    """The values of ``keys`` in the run's options (absent ones as None)."""
    return {k: getattr(a, k, None) for k in keys}


def resumed(path: Path, settings: dict) -> dict | None:
    """The finished run at ``path`` (JSON), None when there is none; ``ValueError`` naming the
    options that differ when it was made with other ``settings`` (runs written before runs
    recorded their settings are taken as they are)."""
    if not path.is_file():
        return None
    res = json.loads(path.read_text())
    saved = res.get("settings")
    if saved is not None:
        diff = {k: (saved.get(k), v) for k, v in settings.items() if saved.get(k) != v}
        if diff:
            raise ValueError(f"{path} was made with other settings (" + ", ".join(
                f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
                + "): use another --out, or remove it")
    return res


def finish_run(folder: Path, name: str, model, res: dict, settings: dict) -> None:
    """Write a finished run (weights, then the JSON that marks it done) and drop its
    checkpoints."""
    res["settings"] = settings
    save_state(model, folder / f"{name}.safetensors")
    atomic_write_json(folder / f"{name}.json", res)
    shutil.rmtree(folder / f"{name}.ckpt", ignore_errors=True)


def checkpoint_dir(folder: Path, name: str, settings: dict) -> Path:
    """The run's checkpoint folder, made (with its settings) if new; ``ValueError`` when a
    checkpoint there was made with other settings."""
    d = folder / f"{name}.ckpt"
    d.mkdir(parents=True, exist_ok=True)
    marker = d / "settings.json"
    if marker.is_file():
        resumed(marker, settings)
    else:
        atomic_write_json(marker, {"settings": settings})
    return d



# -- training ------------------------------------------------------------------------------------
def train_one(kind: str, seed: int, task: DepoTask, a, ffn: int,
              run_dir: Path | None = None) -> tuple[dict, TransformerLM]:
    """Train one model for ``a.steps`` steps on fresh sequences (resuming from ``run_dir``'s
    checkpoint, see ``train_steps``); (result with the curve, model)."""
    torch.manual_seed(seed)
    dev = device(a)
    # built on the CPU, then moved; sequences drawn on the CPU from CPU generators, then moved:
    # the same weights and sequences on every device
    model = build(kind, task, a, ffn).to(dev)
    opt = adamw(model, a.lr)
    gen = torch.Generator().manual_seed(20_000 + seed)  # the same sequences for every kind
    sets = {k: (ids.to(dev), ans.to(dev)) for k, (ids, ans) in
            eval_sets(task, a.eval_per_k).items()}

    def batch_loss(step):
        hops = torch.randint(1, reach_at(step, a, task.max_hops) + 1,
                             (a.batch, task.queries), generator=gen)
        b = generate(task, a.batch, gen, hops=hops)
        return answer_loss(model, b.ids.to(dev), b.answers.to(dev), task)

    def evaluate(step, train_loss):
        return dict(step=step, train_loss=train_loss, accuracy=accuracy_per_k(model, sets, task))

    curve, seconds, cpu = train_steps(model, opt, a, batch_loss, evaluate, gen, run_dir)
    final = {int(k): v for k, v in curve[-1]["accuracy"].items()}
    return dict(kind=kind, seed=seed, steps=a.steps, accuracy=final,
                depth=depth(final, a.depth_at), train_loss=curve[-1]["train_loss"],
                curve=curve, seconds=seconds, cpu_seconds=cpu, params=param_count(model),
                ffn=ffn, device=dev.type), model


#: the options a run's result depends on (besides kind and seed)
RUN_KEYS = ("steps", "batch", "width", "layers", "heads", "shifts", "canon_kernel", "lr",
            "nodes", "n", "max_hops", "queries", "curriculum", "eval_per_k", "eval_every",
            "depth_at", "quick")


def _job(spec):
    """One run (in a worker with one thread, or inline): train, evaluate, write, return."""
    kind, seed, ffn, a, threads, folder = spec
    if threads:
        torch.set_num_threads(threads)
    folder = Path(folder)
    name = run_name(kind, seed, a.steps, a)
    settings = run_settings(a, RUN_KEYS)

    def make() -> dict:
        res, model = train_one(kind, seed, task_of(a), a, ffn,
                               checkpoint_dir(folder, name, settings))
        finish_run(folder, name, model, res, settings)
        accs = " ".join(f"{res['accuracy'][k]:.2f}" for k in sorted(res["accuracy"]))
        print(f"  {kind:<18} seed {seed} ({a.steps} steps): accuracy by k {accs}  depth "
              f"{res['depth']}  params {res['params']}  {res['seconds']:.0f}s "
              f"({res['cpu_seconds']:.0f}s CPU)", flush=True)
        return res

    return run_once(folder, name, "canon", lambda: resumed(folder / f"{name}.json", settings),
                    make)


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(steps=12, seeds=1, eval_every=6, eval_per_k=16, batch=4, width=16, layers=1,
             heads=2, shifts=2, nodes=12, n=6, max_hops=3, queries=2, curriculum=0.5)


def check_arguments(a) -> None:
    """The checks that join options (each option's range is its argparse type)."""
    try:
        task_of(a)
    except ValueError as e:  # the task names its fields: name the options instead
        raise ValueError(re.sub(r"\b(nodes|n|max_hops|queries)=",
                                lambda m: f"--{m.group(1).replace('_', '-')} ", str(e))) from None
    heads_divide(a)


def run(args) -> int:
    """Every available kind x seed; prints the tables, writes JSON and the plot."""
    check_arguments(args)
    kinds = parse_kinds(args.kinds)
    task = task_of(args)
    t_all = time.perf_counter()
    shaped = argparse.Namespace(**{**vars(args), "context": task.length})
    budget, ffns = equalised(kinds, task.vocab_size, shaped)
    folder = Path(args.out) / "canon_runs"
    folder.mkdir(parents=True, exist_ok=True)
    threads = 1 if args.jobs > 1 else args.threads
    specs = [(k, args.seed + i, ffns[k], args, threads, str(folder))
             for k in kinds for i in range(args.seeds)]
    runs = run_all(_job, specs, args.jobs)
    rows = _summarise(runs, kinds, args.depth_at)
    result = dict(experiment="canon", task=dataclasses.asdict(task), vocab=task.vocab_size,
                  length=task.length, settings={k: v for k, v in vars(args).items()
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
        # runs read back from JSON have string keys, fresh ones int keys
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

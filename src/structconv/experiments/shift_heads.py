"""Shift-matrix heads instead of positional encodings, tested as the literature tests encodings.

``structconv reproduce shift-heads --out runs`` trains ``sc.nn.TransformerLM`` on Tiny
Shakespeare in nanoGPT's CPU configuration (4 layers, 4 heads, width 128, context 64, batch 12,
2,000 AdamW steps: lr 1e-3 with 100 warm-up steps and cosine decay to 1e-4, betas (0.9, 0.99),
weight decay 0.1 on matrices, clipping 1.0, no dropout; 90/10 split) for every position kind
and seed, parameters equalised to the ``none`` model through the feed-forward width. Then:

1. validation loss mean ± std and learning curves (``shift_heads.png``);
2. length extrapolation: every model evaluated at 1, 2, 4, 8, 16 x the training context on
   non-overlapping windows and with a sliding window that scores only each window's last
   ``--stride`` positions (``shift_heads_extrapolation.png``);
3. how close each attention head is to a shift matrix: the largest mean attention mass on a
   single relative offset, per head and layer (1.0 = a shift head);
4. ``--long-kinds``: one longer run of the given kinds (``--long-steps``).

``--kinds`` takes model kinds: a position kind, optionally with Canon layers (Allen-Zhu 2025)
at some of the places A-D, e.g. ``none+Canon-ABCD`` or ``rotary+Canon-B`` (``--canon-kernel``
taps, default 4); their parameters are counted and equalised like any other.

Runs are independent: ``--jobs 2`` runs two at once with one thread each. Every run writes its
result (JSON) and weights (safetensors) under ``<out>/shift_heads_runs/`` and is skipped when
already there, so an interrupted reproduction resumes. Writes ``<out>/shift_heads.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.registry import DatasetError, data_root
from ..data.text import encode_text, load_text_file
from ..io import atomic_write_bytes, atomic_write_json
from ..nn.lm import POSITIONS, TransformerLM, equalised_ffn, split_kind
from ..training.checkpoint import CHECKPOINT_JSON, resume_training, save_checkpoint
from ._common import (
    COUNT,
    NATURAL,
    POSITIVE,
    THREADS,
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

__all__ = ["add_arguments", "run", "build", "train_one", "extrapolation", "shift_likeness",
           "lr_at", "save_state", "run_all", "parse_kinds", "run_name", "equalised", "adamw",
           "train_steps", "run_settings", "resumed", "finish_run", "checkpoint_dir", "RUN_KEYS"]

FACTORS = (1, 2, 4, 8, 16)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, help="folder with input.txt")
    parser.add_argument("--kinds", default=",".join(POSITIONS), type=Listed(split_kind),
                        help=f"comma list of model kinds: position kinds ({', '.join(POSITIONS)})"
                             ", each optionally with Canon layers, e.g. none+Canon-ABCD")
    parser.add_argument("--seeds", type=COUNT, default=3)
    parser.add_argument("--steps", type=COUNT, default=2000)
    parser.add_argument("--batch", type=COUNT, default=12)
    parser.add_argument("--context", type=COUNT, default=64)
    parser.add_argument("--width", type=COUNT, default=128)
    parser.add_argument("--layers", type=COUNT, default=4)
    parser.add_argument("--heads", type=COUNT, default=4, help="attention heads per layer")
    parser.add_argument("--shifts", type=COUNT, default=4,
                        help="shift heads of the shift kinds (offsets 0..S-1)")
    parser.add_argument("--canon-kernel", type=COUNT, default=4,
                        help="taps of the Canon layers of the +Canon- kinds")
    parser.add_argument("--lr", type=POSITIVE, default=1e-3)
    parser.add_argument("--eval-every", type=COUNT, default=100)
    parser.add_argument("--val-batches", type=COUNT, default=40)
    parser.add_argument("--eval-chars", type=COUNT, default=16384,
                        help="validation characters scored per extrapolation length")
    parser.add_argument("--sliding-chars", type=COUNT, default=8192,
                        help="validation characters scored by the sliding window")
    parser.add_argument("--stride", type=NATURAL, default=0,
                        help="sliding-window stride = scored positions (0: the context)")
    parser.add_argument("--long-kinds", default="", type=Listed(split_kind, empty=True),
                        help="comma list of kinds for one longer run each")
    parser.add_argument("--long-steps", type=COUNT, default=5000)
    parser.add_argument("--checkpoint-every", type=NATURAL, default=500,
                        help="steps between a run's checkpoints (0: none; a killed run then "
                             "starts again)")
    parser.add_argument("--jobs", type=COUNT, default=1, help="runs at once (one thread each)")
    parser.add_argument("--threads", type=THREADS, default=0,
                        help="torch threads with --jobs 1 (0: torch's default)")
    parser.add_argument("--plot", default=None, help="learning-curve PNG path")


# -- the models and their training ---------------------------------------------------------------
def build(kind: str, vocab: int, a, ffn: int | None = None) -> TransformerLM:
    """The ``kind`` model (a model kind: position[+Canon-places]) of the run's shape (``ffn``
    default 4·width)."""
    position, canon = split_kind(kind)
    return TransformerLM(vocab, a.width, a.layers, a.heads, position, a.shifts, ffn,
                         context=a.context, canon=canon,
                         canon_kernel=getattr(a, "canon_kernel", 4))


def parse_kinds(text: str) -> list[str]:
    """The model kinds of a comma list (``ValueError`` naming an unknown one)."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    for k in kinds:
        split_kind(k)
    return kinds


def equalised(kinds: list[str], vocab: int, a) -> tuple[int, dict]:
    """(the ``none`` model's parameter count, {kind: the feed-forward width that matches it})."""
    budget = param_count(build("none", vocab, a))
    ffns = {}
    for k in dict.fromkeys(kinds):
        position, canon = split_kind(k)
        ffns[k] = equalised_ffn(vocab, a.width, a.layers, a.heads, position, a.shifts, budget,
                                a.context, canon=canon,
                                canon_kernel=getattr(a, "canon_kernel", 4))
    return budget, ffns


def run_name(kind: str, seed: int, steps: int, a) -> str:
    """A run's file name: kind, seed and steps (and the Canon taps when not the default 4)."""
    k = getattr(a, "canon_kernel", 4)
    tag = f"-k{k}" if split_kind(kind)[1] and k != 4 else ""
    return f"{kind}{tag}-s{seed}-{steps}"


def _load(args):
    root = Path(args.data) if args.data else (data_root() or Path("/nonexistent")) / \
        "tinyshakespeare"
    path = root / "input.txt"
    if not path.is_file():
        raise DatasetError(f"no Tiny Shakespeare at {path}: pass --data DIR or set "
                           "STRUCTCONV_DATA (see `structconv datasets`)")
    if args.quick:
        return encode_text("tinyshakespeare", path.read_text(encoding="utf-8")[:60000],
                           val=0.1, test=0.0)
    return load_text_file(path, "tinyshakespeare", val=0.1, test=0.0)


def _batch(ids, B: int, L: int, gen: torch.Generator):
    start = torch.randint(0, ids.numel() - L - 1, (B,), generator=gen)
    off = torch.arange(L)
    return ids[start[:, None] + off], ids[start[:, None] + off + 1]


@torch.no_grad()
def _val_loss(model, batches) -> float:
    model.eval()
    tot = sum(float(F.cross_entropy(model(x).flatten(0, 1), y.flatten())) for x, y in batches)
    model.train()
    return tot / len(batches)


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


def train_one(kind: str, seed: int, data, a, ffn: int,
              run_dir: Path | None = None) -> tuple[dict, TransformerLM]:
    """Train one model for ``a.steps`` steps (resuming from ``run_dir``'s checkpoint, see
    ``train_steps``); (result with the learning curve, model)."""
    torch.manual_seed(seed)
    dev = device(a)
    # built (and initialised) on the CPU, then moved: the same initial weights on every device
    model = build(kind, len(data.vocab), a, ffn).to(dev)
    opt = adamw(model, a.lr)
    # batches are drawn on the CPU from CPU generators, then moved: the same batches on every
    # device, and a checkpoint's generator state is device-independent
    gen = torch.Generator().manual_seed(10_000 + seed)  # the same batches for every kind
    vgen = torch.Generator().manual_seed(12345)
    val = [tuple(t.to(dev) for t in _batch(data.splits["val"], a.batch, a.context, vgen))
           for _ in range(a.val_batches)]
    train = data.splits["train"]

    def batch_loss(step):
        x, y = (t.to(dev, non_blocking=True) for t in _batch(train, a.batch, a.context, gen))
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    def evaluate(step, train_loss):
        return dict(step=step, train_loss=train_loss, val_loss=_val_loss(model, val))

    curve, seconds, cpu = train_steps(model, opt, a, batch_loss, evaluate, gen, run_dir)
    return dict(kind=kind, seed=seed, steps=a.steps, val_loss=curve[-1]["val_loss"],
                curve=curve, seconds=seconds, cpu_seconds=cpu, params=param_count(model),
                ffn=ffn, device=dev.type), model


# -- evaluation at length --------------------------------------------------------------------------
@torch.no_grad()
def window_loss(model, ids, length: int, stride: int | None = None) -> float:
    """Mean cross-entropy on ``ids`` with windows of ``length``: non-overlapping (every
    position scored), or advanced by ``stride`` scoring only each window's last ``stride``
    positions (each scored token then sees at least length - stride tokens before it)."""
    model.eval()
    dev = next(model.parameters()).device
    total, count = 0.0, 0
    n = ids.numel() - 1
    if stride is None:
        starts, score = list(range(0, n - length + 1, length)), length
    else:
        starts, score = list(range(0, n - length + 1, stride)), stride
    for i in range(0, len(starts), 8):
        st = torch.tensor(starts[i:i + 8])
        off = torch.arange(length)
        x, y = ids[st[:, None] + off], ids[st[:, None] + off + 1]
        x, y = x.to(dev), y.to(dev)
        logits = model(x)[:, -score:]
        total += float(F.cross_entropy(logits.flatten(0, 1), y[:, -score:].flatten(),
                                       reduction="sum"))
        count += y[:, -score:].numel()
    return total / max(count, 1)


def extrapolation(model, val, a) -> dict:
    """{"nonoverlap"|"sliding": {factor: loss}} at each length factor x the context; a
    learned-position model is scored only at 1x (it cannot take longer inputs)."""
    stride = a.stride or a.context
    out = {"nonoverlap": {}, "sliding": {}}
    for f in FACTORS:
        L = f * a.context
        if model.position == "learned" and f > 1:
            continue
        ev = val[: max(a.eval_chars, L + 1) + 1]
        out["nonoverlap"][f] = window_loss(model, ev, L)
        sl = val[: max(a.sliding_chars, L + stride) + 1]
        out["sliding"][f] = window_loss(model, sl, L, stride)
    return out


@torch.no_grad()
def shift_likeness(model, val, a, windows: int = 32) -> list[list[dict]]:
    """Per layer and attention head: the largest mean attention mass on one relative offset
    (queries at positions >= 16, so every offset up to 16 is available) and that offset."""
    gen = torch.Generator().manual_seed(777)
    x, _ = _batch(val, windows, a.context, gen)
    x = x.to(next(model.parameters()).device)
    model.eval()
    out = []
    for w in model.attention_maps(x):  # (B, H, L, L), query x key
        L = w.shape[-1]
        n0 = min(16, L - 1)
        q = torch.arange(n0, L, device=w.device)
        layer = []
        for h in range(w.shape[1]):
            prof = torch.stack([w[:, h, q, q - o].mean() for o in range(n0 + 1)])
            o = int(prof.argmax())
            layer.append(dict(mass=float(prof[o]), offset=o))
        out.append(layer)
    return out


# -- orchestration ---------------------------------------------------------------------------------
def save_state(model, path: Path) -> None:
    """The model's weights as safetensors at ``path`` (atomically)."""
    from safetensors.torch import save

    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    atomic_write_bytes(path, save(state))


#: the options a run's result depends on (besides kind and seed): a run found on disk with
#: other values is refused rather than reused
RUN_KEYS = ("steps", "batch", "context", "width", "layers", "heads", "shifts", "canon_kernel",
            "lr", "eval_every", "val_batches", "eval_chars", "sliding_chars", "stride", "quick")


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


def _job(spec):
    """One run (in a worker with one thread, or inline): train, evaluate, write, return."""
    kind, seed, ffn, a, threads, folder = spec
    if threads:
        torch.set_num_threads(threads)
    folder = Path(folder)
    name = run_name(kind, seed, a.steps, a)
    settings = run_settings(a, RUN_KEYS)
    return run_once(folder, name, "shift-heads",
                    lambda: resumed(folder / f"{name}.json", settings),
                    lambda: _train_job(kind, seed, ffn, a, folder, name, settings))


def _train_job(kind, seed, ffn, a, folder: Path, name: str, settings: dict) -> dict:
    data = _load(a)
    res, model = train_one(kind, seed, data, a, ffn, checkpoint_dir(folder, name, settings))
    val = data.splits["val"]
    res["extrapolation"] = extrapolation(model, val, a)
    res["shift_likeness"] = shift_likeness(model, val, a)
    finish_run(folder, name, model, res, settings)
    print(f"  {kind:<18} seed {seed} ({a.steps} steps): val {res['val_loss']:.4f}  "
          f"params {res['params']}  ffn {ffn}  {res['seconds']:.0f}s", flush=True)
    return res


def run_all(job, specs, jobs: int) -> list[dict]:
    """``job(spec)`` for every spec: inline, or ``jobs`` at once in spawned workers."""
    if jobs <= 1 or len(specs) <= 1:
        return [job(s) for s in specs]
    with mp.get_context("spawn").Pool(jobs) as pool:
        return pool.map(job, specs, chunksize=1)


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(steps=6, seeds=1, eval_every=3, val_batches=2, width=16, layers=1, context=8,
             batch=2, eval_chars=300, sliding_chars=200, long_steps=8)


def check_arguments(a) -> None:
    """The checks that join options (each option's range is its argparse type)."""
    heads_divide(a)
    if a.stride > a.context:
        raise ValueError(f"--stride must be at most --context ({a.context}), got {a.stride}")


def run(args) -> int:
    """Every kind x seed (+ the long runs); prints the tables, writes JSON and the plots."""
    check_arguments(args)
    kinds, longk = parse_kinds(args.kinds), parse_kinds(args.long_kinds)
    t_all = time.perf_counter()
    data = _load(args)
    V = len(data.vocab)
    budget, ffns = equalised(kinds + longk, V, args)
    folder = Path(args.out) / "shift_heads_runs"
    folder.mkdir(parents=True, exist_ok=True)
    threads = 1 if args.jobs > 1 else args.threads
    specs = [(k, args.seed + i, ffns[k], args, threads, str(folder))
             for k in kinds for i in range(args.seeds)]
    runs = run_all(_job, specs, args.jobs)
    long_runs = []
    if longk:
        la = argparse.Namespace(**{**vars(args), "steps": args.long_steps})
        long_runs = run_all(_job, [(k, args.seed, ffns[k], la, threads, str(folder))
                                   for k in longk], args.jobs)
    rows = _summarise(runs, kinds)
    result = dict(experiment="shift_heads", settings={k: v for k, v in vars(args).items()
                                                      if isinstance(v, (int, float, str))},
                  vocab=V, budget=budget, ffn=ffns, kinds=rows, runs=runs, long_runs=long_runs,
                  wall_seconds=time.perf_counter() - t_all, hardware=hardware())
    _print_tables(rows, long_runs, args)
    write_result(args, "shift_heads", result)
    _plots(rows, runs, args)
    return 0


def _summarise(runs: list[dict], kinds: list[str]) -> dict:
    rows = {}
    for k in kinds:
        rs = [r for r in runs if r["kind"] == k]
        m, s = mean_std([r["val_loss"] for r in rs])
        ext = {}
        for mode in ("nonoverlap", "sliding"):
            ext[mode] = {}
            for f in FACTORS:
                vals = [r["extrapolation"][mode].get(str(f), r["extrapolation"][mode].get(f))
                        for r in rs]
                if all(v is not None for v in vals):
                    ext[mode][f] = mean_std(vals)
        sl = rs[0]["shift_likeness"]
        rows[k] = dict(val_loss=(m, s), params=rs[0]["params"], ffn=rs[0]["ffn"],
                       seconds=mean_std([r["seconds"] for r in rs])[0], extrapolation=ext,
                       cpu_seconds=sum(r.get("cpu_seconds", 0.0) for r in rs),
                       shift_likeness=sl, seeds=len(rs))
    return rows


def _print_tables(rows: dict, long_runs: list[dict], a) -> None:
    print(f"\n{'kind':<18} {'params':>8} {'ffn':>4} {'val loss':>17} {'s/run':>6}")
    for k, r in rows.items():
        m, s = r["val_loss"]
        print(f"{k:<18} {r['params']:>8} {r['ffn']:>4} {m:>9.4f} ± {s:.4f} {r['seconds']:>6.0f}")
    for mode in ("nonoverlap", "sliding"):
        print(f"\nextrapolation ({mode}), loss at n x context {a.context}:")
        print(f"{'kind':<18} " + " ".join(f"{f'{f}x':>15}" for f in FACTORS))
        for k, r in rows.items():
            cells = [r["extrapolation"][mode].get(f) for f in FACTORS]
            print(f"{k:<18} " + " ".join(f"{'n/a':>15}" if c is None else
                                         f"{c[0]:>7.3f} ± {c[1]:.3f}" for c in cells))
    print("\nshift-likeness of attention heads (seed 0): mean mass on the top offset "
          "(offset), per layer")
    for k, r in rows.items():
        cells = ["  ".join(f"{h['mass']:.2f}({h['offset']})" for h in layer)
                 for layer in r["shift_likeness"]]
        print(f"{k:<18} " + " | ".join(cells))
    for r in long_runs:
        print(f"\nlong run {r['kind']}: {r['steps']} steps, val {r['val_loss']:.4f}, "
              f"{r['seconds']:.0f}s")


def kind_styles(kinds) -> dict:
    """A colour and line style per kind: twenty colours, then dashed (twelve arms and more
    never share a line's look, as matplotlib's ten-colour cycle would make them)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {k: {"color": cmap(i % 20), "linestyle": ("-", "--", ":")[i // 20 % 3]}
            for i, k in enumerate(kinds)}


def _plots(rows: dict, runs: list[dict], a) -> None:
    plt = pyplot()
    style = kind_styles(rows)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for k, r in rows.items():
        rs = [x for x in runs if x["kind"] == k]
        steps = [c["step"] for c in rs[0]["curve"]]
        vals = torch.tensor([[c["val_loss"] for c in x["curve"]] for x in rs])
        ax.plot(steps, vals.mean(0), label=f"{k} ({r['val_loss'][0]:.3f})", **style[k])
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats / char)")
    ax.set_title(f"Tiny Shakespeare, {a.layers}x{a.width}, context {a.context}")
    ax.legend(fontsize=8)
    save_figure(fig, a, "shift_heads")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, mode in zip(axes, ("nonoverlap", "sliding")):
        for k, r in rows.items():
            fs = sorted(r["extrapolation"][mode])
            ax.plot([f * a.context for f in fs], [r["extrapolation"][mode][f][0] for f in fs],
                    marker="o", label=k, **style[k])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_title(f"{mode} windows")
    axes[0].set_ylabel("validation loss (nats / char)")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, argparse.Namespace(out=a.out, plot=None), "shift_heads_extrapolation")

"""Shift-matrix heads instead of positional encodings, tested as the literature tests encodings.

``structconv reproduce shift-heads --out runs`` trains the shipped ``transformer_shakespeare``
config (``sc.nn.TransformerLM`` on Tiny Shakespeare in nanoGPT's CPU configuration: 4 layers, 4
heads, width 128, context 64, batch 12, 2,000 AdamW steps: lr 1e-3 with 100 warm-up steps and
cosine decay to 1e-4, betas (0.9, 0.99), weight decay 0.1 on matrices, clipping 1.0, no
dropout; 90/10 split) for every position kind and seed, each an arm of config overrides (its
position, Canon places, seed, and the feed-forward width that equalises its parameters to the
``none`` model), trained by ``structconv.training.train``. Then, on each trained run (read back
with ``load_run``):

1. validation loss mean ± std (the last validation, on a fixed sample of 480 windows) and
   learning curves (``shift_heads.png``);
2. length extrapolation: every model evaluated at 1, 2, 4, 8, 16 x the training context on
   non-overlapping windows and with a sliding window that scores only each window's last
   ``--stride`` positions (``shift_heads_extrapolation.png``);
3. how close each attention head is to a shift matrix: the largest mean attention mass on a
   single relative offset, per head and layer (1.0 = a shift head);
4. ``--long-kinds``: one longer run of the given kinds (``--long-steps``).

``--kinds`` takes model kinds: a position kind, optionally with Canon layers (Allen-Zhu 2025)
at some of the places A-D, e.g. ``none+Canon-ABCD`` or ``rotary+Canon-B`` (``--canon-kernel``
taps, default 4); their parameters are counted and equalised like any other.

Runs are independent: ``--jobs 2`` runs two at once with one thread each. Every run is a run
directory ``<out>/shift_heads_runs/<kind>-s<seed>-<steps>`` trained at most once under its
lock: a finished run is read back, an interrupted one resumed from its checkpoint (to the
numbers of an uninterrupted one), and one made with other options refused. Writes
``<out>/shift_heads.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..config import LM_KEYS, config_from
from ..io import atomic_write_json
from ..models.sizes import lm_parameters
from ..nn.lm import POSITIONS, split_kind
from ._common import (
    POSITIVE,
    THREADS,
    Bounded,
    Listed,
    hardware,
    heads_divide,
    mean_std,
    pyplot,
    save_figure,
    write_result,
)
from .sweep import Run, config_run

__all__ = ["add_arguments", "run", "CONFIG", "QUICK", "FACTORS", "extrapolation",
           "shift_likeness", "window_loss", "run_all", "parse_kinds", "run_name", "equalised",
           "overrides", "kind_run", "warmup_steps", "analyse", "kind_styles"]

#: the shipped config every arm overrides
CONFIG = "transformer_shakespeare"
#: the options' ranges: every size bounded above
SEEDS, STEPS, SIZE = Bounded(int, 1, 1000), Bounded(int, 1, 10**8), Bounded(int, 1, 65536)
FEW, EVERY, CHARS = Bounded(int, 1, 1024), Bounded(int, 1, 10**6), Bounded(int, 1, 10**9)
FACTORS = (1, 2, 4, 8, 16)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, help="folder with input.txt")
    parser.add_argument("--kinds", default=",".join(POSITIONS), type=Listed(split_kind),
                        help=f"comma list of model kinds: position kinds ({', '.join(POSITIONS)})"
                             ", each optionally with Canon layers, e.g. none+Canon-ABCD")
    parser.add_argument("--seeds", type=SEEDS, default=3)
    parser.add_argument("--steps", type=STEPS, default=2000)
    parser.add_argument("--batch", type=SIZE, default=12)
    parser.add_argument("--context", type=SIZE, default=64)
    parser.add_argument("--width", type=SIZE, default=128)
    parser.add_argument("--layers", type=FEW, default=4)
    parser.add_argument("--heads", type=FEW, default=4, help="attention heads per layer")
    parser.add_argument("--shifts", type=FEW, default=4,
                        help="shift heads of the shift kinds (offsets 0..S-1)")
    parser.add_argument("--canon-kernel", type=FEW, default=4,
                        help="taps of the Canon layers of the +Canon- kinds")
    parser.add_argument("--lr", type=POSITIVE, default=1e-3)
    parser.add_argument("--eval-every", type=EVERY, default=100,
                        help="steps between validations (the config's batches_per_epoch)")
    parser.add_argument("--val-batches", type=EVERY, default=40,
                        help="validation batches (of --batch windows: the config's val_sample)")
    parser.add_argument("--eval-chars", type=CHARS, default=16384,
                        help="validation characters scored per extrapolation length")
    parser.add_argument("--sliding-chars", type=CHARS, default=8192,
                        help="validation characters scored by the sliding window")
    parser.add_argument("--stride", type=Bounded(int, 0, 65536), default=0,
                        help="sliding-window stride = scored positions (0: the context)")
    parser.add_argument("--long-kinds", default="", type=Listed(split_kind, empty=True),
                        help="comma list of kinds for one longer run each")
    parser.add_argument("--long-steps", type=STEPS, default=5000)
    parser.add_argument("--checkpoint-every", type=Bounded(int, 0, 10**8), default=500,
                        help="steps between a run's checkpoints, rounded up to whole "
                             "--eval-every intervals (0: every 10 s)")
    parser.add_argument("--jobs", type=Bounded(int, 1, 256), default=1,
                        help="runs at once (one thread each)")
    parser.add_argument("--threads", type=THREADS, default=0,
                        help="torch threads with --jobs 1 (0: torch's default)")
    parser.add_argument("--plot", default=None, help="learning-curve PNG path")


# -- the arms: the shipped config and its overrides ------------------------------------------------
def parse_kinds(text: str) -> list[str]:
    """The model kinds of a comma list (``ValueError`` naming an unknown one)."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    for k in kinds:
        split_kind(k)
    return kinds


def warmup_steps(steps: int) -> int:
    """nanoGPT's warm-up: 100 steps, a tenth of a shorter run (at least 1)."""
    return max(1, min(100, steps // 10))


def overrides(a, steps: int) -> list[str]:
    """The overrides every arm of a run of ``steps`` steps shares: the options' values."""
    out = [f"data.batch_size={a.batch}", f"data.seq_len={a.context}",
           f"data.batches_per_epoch={a.eval_every}", f"data.val_sample={a.val_batches * a.batch}",
           f"model.lm.width={a.width}", f"model.lm.layers={a.layers}",
           f"model.lm.heads={a.heads}", f"model.lm.shifts={a.shifts}", f"train.lr={a.lr}",
           f"train.max_steps={steps}", f"train.epochs={math.ceil(steps / a.eval_every)}",
           f"train.warmup_steps={warmup_steps(steps)}",
           f"train.checkpoint_every={math.ceil(a.checkpoint_every / a.eval_every)}"]
    if a.quick:  # the first 60,000 characters
        out.append("data.options={val=0.1, test=0.0, limit=60000}")
    if a.data:
        out.append(f"data.root={json.dumps(str(a.data))}")
    return out


def _kind(kind: str, a, ffn: int) -> list[str]:
    position, canon = split_kind(kind)
    out = [f"model.lm.position={position}", f"model.lm.canon={json.dumps(canon)}",
           f"model.lm.ffn={ffn}"]
    return out + ([f"model.lm.canon_kernel={a.canon_kernel}"] if canon else [])


def run_name(kind: str, seed: int, steps: int, a) -> str:
    """A run's name: kind, seed and steps (and the Canon taps when not the default 4)."""
    k = a.canon_kernel
    tag = f"-k{k}" if split_kind(kind)[1] and k != 4 else ""
    return f"{kind}{tag}-s{seed}-{steps}"


def kind_run(kind: str, seed: int, steps: int, a, ffn: int) -> Run:
    """The run of ``kind`` with ``seed`` for ``steps`` steps: the config and its overrides."""
    return Run(run_name(kind, seed, steps, a), CONFIG,
               (*overrides(a, steps), *_kind(kind, a, ffn), f"seed={seed}"))


def _spec(kind: str, a, ffn: int = 0) -> dict:
    position, canon = split_kind(kind)
    return {**LM_KEYS, "width": a.width, "layers": a.layers, "heads": a.heads,
            "position": position, "shifts": a.shifts, "ffn": ffn, "canon": canon,
            "canon_kernel": a.canon_kernel}


def equalised(kinds: list[str], vocab: int, a) -> tuple[int, dict]:
    """(the ``none`` model's parameter count, {kind: the feed-forward width that matches it}),
    counted from the sizes (``models.sizes``): one unit of width costs 2·width + 1 parameters
    per layer (plus the Canon-D taps)."""
    budget = lm_parameters(_spec("none", a), vocab, a.context)
    ffns = {}
    for k in dict.fromkeys(kinds):
        spec = _spec(k, a, 4 * a.width)
        p0 = lm_parameters(spec, vocab, a.context)
        unit = 2 * a.width + 1 + (a.canon_kernel if "D" in spec["canon"] else 0)
        ffns[k] = max(1, 4 * a.width + round((budget - p0) / (a.layers * unit)))
    return budget, ffns


def _vocab(a) -> int:
    """The vocabulary size of the runs' data (as the engine loads it)."""
    from ..training import load_data

    cfg = config_from(CONFIG, overrides(a, a.steps))
    return len(load_data(cfg).vocab)


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


def _batch(ids, B: int, L: int, gen: torch.Generator):
    start = torch.randint(0, ids.numel() - L - 1, (B,), generator=gen)
    off = torch.arange(L)
    return ids[start[:, None] + off], ids[start[:, None] + off + 1]


# -- the sweep: train (the engine) and analyse each run ------------------------------------------
def _curve(where: Path, steps: int, every: int) -> list[dict]:
    """The run's learning curve from its metrics: (step, train loss: the mean over the
    interval, validation loss) after each validation."""
    rows = [json.loads(line) for line in (where / "metrics.jsonl").read_text().splitlines()]
    return [dict(step=min(r["epoch"] * every, steps), train_loss=r["train_loss"],
                 val_loss=r["val_loss"]) for r in rows]


def analyse(where: Path, a, device: str = "cpu") -> dict:
    """Extrapolation and shift-likeness of the run in ``where`` (its last weights), written to
    ``analysis.json`` there and read back when made with the same options."""
    from ..training import load_run

    path = where / "analysis.json"
    settings = {k: getattr(a, k) for k in ("eval_chars", "sliding_chars", "stride")}
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("settings") == settings:
            return saved
    cfg, data, model = load_run(where, "last", device)
    val = data.splits["val"]
    out = {"settings": settings, "extrapolation": extrapolation(model, val, a),
           "shift_likeness": shift_likeness(model, val, a)}
    atomic_write_json(path, out)
    return json.loads(json.dumps(out))  # the factors as the file has them (strings)


def _job(spec) -> dict:
    """One run (in a worker with one thread, or inline): trained or read, analysed."""
    kind, seed, steps, ffn, a, threads, folder = spec
    if threads:
        torch.set_num_threads(threads)
    run = kind_run(kind, seed, steps, a, ffn)
    where = Path(folder) / run.name
    fresh = not (where / "result.json").is_file()
    c0 = time.process_time()
    res = config_run(folder, run, "shift-heads", a.device)
    cpu = time.process_time() - c0
    ana = analyse(where, a, a.device)
    if "cpu_seconds" not in ana:  # the CPU time of the call that trained it (or resumed it)
        ana["cpu_seconds"] = cpu
        atomic_write_json(where / "analysis.json", ana)
    curve = _curve(where, steps, a.eval_every)
    out = dict(kind=kind, seed=seed, steps=steps, val_loss=curve[-1]["val_loss"], curve=curve,
               seconds=res["train_time_s"], cpu_seconds=ana["cpu_seconds"],
               params=res["parameters"], ffn=ffn, device=a.device,
               extrapolation=ana["extrapolation"], shift_likeness=ana["shift_likeness"])
    if fresh:  # trained (or finished) by this call
        print(f"  {kind:<18} seed {seed} ({steps} steps): val {out['val_loss']:.4f}  "
              f"params {out['params']}  ffn {ffn}  {out['seconds']:.0f}s", flush=True)
    return out


def run_all(job, specs, jobs: int) -> list[dict]:
    """``job(spec)`` for every spec: inline, or ``jobs`` at once in spawned workers."""
    if jobs <= 1 or len(specs) <= 1:
        return [job(s) for s in specs]
    with mp.get_context("spawn").Pool(jobs) as pool:
        return pool.map(job, specs, chunksize=1)


#: the defaults of ``--quick`` (a value given on the command line is kept): the first 60,000
#: characters, a tiny model for a few steps; a smoke test, not a result
QUICK = dict(steps=6, seeds=1, eval_every=3, val_batches=2, width=16, layers=1, context=8,
             batch=2, eval_chars=300, sliding_chars=200, long_steps=8)


def check_arguments(a) -> None:
    """The checks that join options (each option's range is its argparse type), and every
    arm's config validated (``ConfigError`` naming the key) before anything trains."""
    heads_divide(a)
    if a.stride > a.context:
        raise ValueError(f"--stride must be at most --context ({a.context}), got {a.stride}")
    for k in dict.fromkeys(parse_kinds(a.kinds) + parse_kinds(a.long_kinds)):
        config_from(CONFIG, list(kind_run(k, a.seed, a.steps, a, 4 * a.width).overrides))


def run(args) -> int:
    """Every kind x seed (+ the long runs); prints the tables, writes JSON and the plots."""
    check_arguments(args)
    kinds, longk = parse_kinds(args.kinds), parse_kinds(args.long_kinds)
    t_all = time.perf_counter()
    V = _vocab(args)
    budget, ffns = equalised(kinds + longk, V, args)
    folder = Path(args.out) / "shift_heads_runs"
    folder.mkdir(parents=True, exist_ok=True)
    threads = 1 if args.jobs > 1 else args.threads
    specs = [(k, args.seed + i, args.steps, ffns[k], args, threads, str(folder))
             for k in kinds for i in range(args.seeds)]
    runs = run_all(_job, specs, args.jobs)
    long_runs = run_all(_job, [(k, args.seed, args.long_steps, ffns[k], args, threads,
                                str(folder)) for k in longk], args.jobs) if longk else []
    rows = _summarise(runs, kinds)
    result = dict(experiment="shift_heads", config=CONFIG, settings={
        k: v for k, v in vars(args).items() if isinstance(v, (int, float, str))},
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
    save_figure(fig, a, "shift_heads_extrapolation", use_plot=False)

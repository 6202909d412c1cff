"""Grapheme-to-phoneme conversion on CMUdict: two of the paper's cited attention
models on one task, beside a baseline that reads spellings only.

``structconv reproduce g2p --out runs`` trains, for ``--seeds`` model seeds on one split
(``--data-seed``; words, not pronunciations, held out: 5 % valid, 10 % test, stress dropped):

* ``transformer``: ``sc.nn.Seq2Seq`` with sinusoidal positions (Vaswani et al.'s model: the
  encoder's self-attention, the decoder's masked self-attention and cross-attention, each an
  attention convolution);
* ``transformer-shift``: the same without positional encodings, with shift-matrix heads
  instead (causal offsets 0..S-1 in the decoder, signed offsets in the encoder: the paper's
  proposal), its feed-forward width lowered to the ``transformer``'s parameter count;
* ``pervasive``: ``sc.nn.PervasiveAttention`` (Elbayad et al. 2018), attention pooling;
  ``pervasive-max``: the same with max pooling (not in the default arms);
* ``nearest``: the pronunciation of the training word closest in spelling (character trigrams
  to shortlist, edit distance to choose), once (it has no seed).

Training: AdamW (betas 0.9, 0.98, weight decay 0.01), linear warm-up and cosine decay,
clipping 1.0, label smoothing 0.1, dropout 0.1, batches of words of similar length; every
``--eval-every`` steps the validation loss and the greedy PER / WER of ``--eval-words``
validation words make the learning curves. At the end: greedy PER / WER on the whole
validation and test splits, beam search (``--beam``) on test, decoded examples, the
cross-attention maps (the alignment) and the pervasive model's pooling maps.

Every run checkpoints every ``--checkpoint-every`` steps under ``<out>/g2p_runs/<run>/`` and
resumes there when killed; a finished run writes ``<run>.json`` and ``<run>.safetensors`` and
is skipped next time. One process, ``--threads`` torch threads (default 1). Writes
``<out>/g2p.json``, ``g2p_curves.png`` and ``g2p_attention.png``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..data.g2p import PAD, G2PData, edit_distance, load_cmudict
from ..io import atomic_write_json
from ..models.seq2seq import decode_words, epoch_batches, pair_tensors, score
from ..nn.decoding import strip
from ..nn.pervasive import PervasiveAttention
from ..nn.seq2seq import Seq2Seq
from ..training.checkpoint import CHECKPOINT_JSON, resume_training, save_checkpoint
from ._common import (
    COUNT,
    DROPOUT,
    NATURAL,
    POSITIVE,
    SEED,
    THREADS,
    Listed,
    finished,
    hardware,
    heads_divide,
    mean_std,
    param_count,
    pyplot,
    run_once,
    save_figure,
    write_result,
)
from .shift_heads import lr_at, save_state

__all__ = ["add_arguments", "run", "ARMS", "build", "train_run", "decode_words", "scored_entries",
           "nearest_predictions", "epoch_batches", "equalised_ffn"]

#: the arms this recipe knows; ``DEFAULT_ARMS`` run unless ``--arms`` says otherwise
ARMS = ("nearest", "transformer", "transformer-shift", "pervasive", "pervasive-max")
DEFAULT_ARMS = ("nearest", "transformer", "transformer-shift", "pervasive")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS), type=Listed.of(ARMS),
                        help=f"comma list of arms from {', '.join(ARMS)}")
    parser.add_argument("--seeds", type=COUNT, default=3, help="model seeds per neural arm")
    parser.add_argument("--data-seed", type=SEED, default=0, help="the split's seed")
    parser.add_argument("--limit", type=NATURAL, default=0, help="use a sample of this many words")
    parser.add_argument("--steps", type=COUNT, default=6000, help="Transformer training steps")
    parser.add_argument("--pervasive-steps", type=COUNT, default=6000,
                        help="pervasive training steps (a step costs about what the "
                             "Transformer's does at the default sizes)")
    parser.add_argument("--batch", type=COUNT, default=64, help="words per batch")
    parser.add_argument("--lr", type=POSITIVE, default=1e-3)
    parser.add_argument("--dropout", type=DROPOUT, default=0.1)
    parser.add_argument("--label-smoothing", type=DROPOUT, default=0.1)
    parser.add_argument("--width", type=COUNT, default=128)
    parser.add_argument("--layers", type=COUNT, default=3, help="encoder and decoder layers")
    parser.add_argument("--heads", type=COUNT, default=4, help="attention heads per layer")
    parser.add_argument("--shifts", type=COUNT, default=4,
                        help="decoder shift heads of transformer-shift (offsets 0..S-1)")
    parser.add_argument("--src-shifts", type=COUNT, default=5,
                        help="encoder shift heads of transformer-shift (centred offsets)")
    parser.add_argument("--embed", type=COUNT, default=32, help="pervasive: embedding size")
    parser.add_argument("--grid-layers", type=COUNT, default=6, help="pervasive: layers")
    parser.add_argument("--growth", type=COUNT, default=24, help="pervasive: growth rate")
    parser.add_argument("--bottleneck", type=COUNT, default=48, help="pervasive: bottleneck")
    parser.add_argument("--kernel", type=COUNT, default=3, help="pervasive: k x k taps")
    parser.add_argument("--eval-every", type=COUNT, default=500)
    parser.add_argument("--eval-words", type=COUNT, default=500,
                        help="validation words decoded for the learning curves")
    parser.add_argument("--beam", type=COUNT, default=4, help="beam width of the test decoding")
    parser.add_argument("--eval-limit", type=NATURAL, default=0,
                        help="score valid and test on a seeded sample of this many words each "
                             "(0: every word; for reduced runs)")
    parser.add_argument("--checkpoint-every", type=COUNT, default=500)
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (0: default)")
    parser.add_argument("--plot", default=None, help="learning-curve PNG path")


# -- models ----------------------------------------------------------------------------------------
def equalised_ffn(data: G2PData, a) -> int:
    """The feed-forward width at which ``transformer-shift`` has the parameter count of
    ``transformer`` (one unit of width costs 2·width + 1 parameters in each of the
    2·layers blocks)."""
    base = param_count(build("transformer", data, a))
    shift = param_count(build("transformer-shift", data, a, ffn=4 * a.width))
    unit = 2 * a.layers * (2 * a.width + 1)
    return max(1, 4 * a.width + round((base - shift) / unit))


def build(arm: str, data: G2PData, a, ffn: int | None = None):
    """The model of a neural arm for ``data``'s vocabularies."""
    V_s, V_t = len(data.graphemes), len(data.phonemes)
    if arm in ("pervasive", "pervasive-max"):
        return PervasiveAttention(V_s, V_t, a.embed, a.grid_layers, a.growth, a.kernel,
                                  bottleneck=a.bottleneck, dropout=a.dropout,
                                  pooling="max" if arm == "pervasive-max" else "attention")
    if arm == "transformer":
        return Seq2Seq(V_s, V_t, a.width, a.layers, a.heads, "sinusoidal", dropout=a.dropout)
    if arm == "transformer-shift":
        return Seq2Seq(V_s, V_t, a.width, a.layers, a.heads, "shift", a.shifts,
                       ffn or equalised_ffn(data, a), a.dropout, src_shifts=a.src_shifts)
    raise ValueError(f"unknown arm {arm!r}: choose from {', '.join(ARMS)}")


# -- batches, loss and scoring: models.seq2seq's (shared with `structconv train`) ----------------
def _loss(model, src, tin, tout, smoothing: float) -> torch.Tensor:
    # the mean of models.seq2seq.token_losses (tested equal), in torch's fused form: the
    # published tables were made with it, bit for bit
    logits = model(src, tin)
    return F.cross_entropy(logits.flatten(0, 1), tout.flatten(), ignore_index=PAD,
                           label_smoothing=smoothing)


@torch.no_grad()
def _valid_loss(model, data: G2PData, entries, smoothing: float) -> float:
    pairs = [(w, p[0]) for w, p in entries]
    tot = n = 0.0
    for k in range(0, len(pairs), 256):
        src, tin, tout = pair_tensors(data, pairs, range(k, min(len(pairs), k + 256)))
        tokens = float((tout != PAD).sum())
        tot += float(_loss(model, src, tin, tout, 0.0)) * tokens
        n += tokens
    return tot / n


def _checkpoint_eval(model, data: G2PData, entries, a) -> dict:
    was = model.training
    model.eval()
    preds = decode_words(model, data, [w for w, _ in entries])
    out = {"valid_loss": _valid_loss(model, data, entries, a.label_smoothing),
           **{f"valid_{k}": v for k, v in score(preds, entries).items() if k != "words"}}
    model.train(was)
    return out


# -- the nearest-spelling baseline ---------------------------------------------------------------
def _trigrams(word: str) -> list[str]:
    w = f"^{word}$"
    return [w[i:i + 3] for i in range(len(w) - 2)]


def nearest_predictions(train: list, words: list[str], shortlist: int = 20) -> list:
    """For each word, the first pronunciation of the training word closest in spelling: the
    ``shortlist`` training words sharing the most character trigrams (with word boundaries),
    then the smallest edit distance among them (ties: more shared trigrams, then the first)."""
    index: dict[str, list[int]] = {}
    for i, (w, _) in enumerate(train):
        for t in set(_trigrams(w)):
            index.setdefault(t, []).append(i)
    postings = {t: np.asarray(v, dtype=np.int64) for t, v in index.items()}
    out = []
    for word in words:
        hits = [postings[t] for t in set(_trigrams(word)) if t in postings]
        if not hits:
            out.append(train[0][1][0])
            continue
        counts = np.bincount(np.concatenate(hits), minlength=len(train))
        top = np.argpartition(-counts, min(shortlist, len(train) - 1))[:shortlist]
        best = min(top.tolist(), key=lambda i: (edit_distance(word, train[i][0]), -counts[i], i))
        out.append(train[best][1][0])
    return out


def _nearest(data: G2PData, folder: Path, examples: list[str], a) -> dict:
    done = folder / "nearest.json"
    if done.is_file():
        return json.loads(done.read_text())
    t0, c0 = time.perf_counter(), time.process_time()
    res = {"arm": "nearest", "seed": None, "params": 0}
    for split in ("valid", "test"):
        entries = scored_entries(data, split, a)
        preds = nearest_predictions(data.splits["train"], [w for w, _ in entries])
        res[split] = score(preds, entries)
    got = nearest_predictions(data.splits["train"], examples)
    res["examples"] = {w: " ".join(p) for w, p in zip(examples, got)}
    res["cpu_seconds"], res["seconds"] = time.process_time() - c0, time.perf_counter() - t0
    atomic_write_json(done, res)
    print(f"  nearest: test PER {res['test']['per']:.2f} WER {res['test']['wer']:.2f}",
          flush=True)
    return res


# -- training ------------------------------------------------------------------------------------
def steps_of(arm: str, a) -> int:
    """Training steps of an arm (``--pervasive-steps`` for the pervasive arms)."""
    return a.pervasive_steps if arm.startswith("pervasive") else a.steps


def run_name(arm: str, seed: int, a) -> str:
    return f"{arm}-s{seed}-{steps_of(arm, a)}"


def _optimizer(model, a) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                              {"params": rest, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.98))


def scored_entries(data: G2PData, split: str, a) -> list:
    """The words of ``split`` that the final scores use: all of them, or with
    ``--eval-limit n`` a seeded sample of n (the same for every arm)."""
    entries, n = data.splits[split], getattr(a, "eval_limit", 0)
    if not n or n >= len(entries):
        return entries
    g = torch.Generator().manual_seed(2718 + ("valid", "test").index(split))
    pick = torch.randperm(len(entries), generator=g)[:n]
    return [entries[i] for i in sorted(pick.tolist())]


def monitor_entries(data: G2PData, a) -> list:
    """The validation words of the learning curves: a fixed seeded sample."""
    entries = data.splits["valid"]
    pick = torch.randperm(len(entries), generator=torch.Generator().manual_seed(4321))
    return [entries[i] for i in sorted(pick[:a.eval_words].tolist())]


def example_words(data: G2PData, n: int = 8) -> list[str]:
    """Test words shown in the results: a seeded sample of ``n`` of 5-12 letters, a quarter of
    them with several pronunciations."""
    test = data.splits["test"]
    order = torch.randperm(len(test), generator=torch.Generator().manual_seed(77)).tolist()
    multi = [test[i][0] for i in order if len(test[i][1]) > 1 and 5 <= len(test[i][0]) <= 12]
    single = [test[i][0] for i in order if len(test[i][1]) == 1 and 5 <= len(test[i][0]) <= 12]
    k = min(len(multi), n // 4)
    return (multi[:k] + single[:n - k]) if single else [w for w, _ in test[:n]]


def _train_steps(arm, model, opt, data: G2PData, a, seed: int, state: dict, run_dir: Path,
                 stop_after: int | None) -> bool:
    """Train from ``state["step"]`` to the arm's steps (checkpointing, recording the curve);
    False when stopped early at ``stop_after`` steps (a test's simulated kill)."""
    pairs = data.pairs("train")
    lengths = [len(w) for w, _ in pairs]
    steps, sched = steps_of(arm, a), argparse.Namespace(steps=steps_of(arm, a), lr=a.lr)
    monitor, epochs = monitor_entries(data, a), {}
    per_epoch = len(epoch_batches(lengths, a.batch, seed, 0))
    model.train()
    while state["step"] < steps:
        e, i = divmod(state["step"], per_epoch)
        if e not in epochs:
            epochs = {e: epoch_batches(lengths, a.batch, seed, e)}
        src, tin, tout = pair_tensors(data, pairs, epochs[e][i])
        for g in opt.param_groups:
            g["lr"] = lr_at(state["step"], sched)
        c0, t0 = time.process_time(), time.perf_counter()
        loss = _loss(model, src, tin, tout, a.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["cpu"] += time.process_time() - c0
        state["wall"] += time.perf_counter() - t0
        state["step"] += 1
        state["loss_sum"] += float(loss.detach())
        state["loss_n"] += 1
        s = state["step"]
        if s % a.eval_every == 0 or s == steps:
            _record(model, data, monitor, a, state, per_epoch, arm, seed)
        if s % a.checkpoint_every == 0 and s < steps:
            save_checkpoint(run_dir, s, model.state_dict(), opt.state_dict(), trainer=state)
        if stop_after is not None and s >= stop_after and s < steps:
            return False
    return True


def _record(model, data, monitor, a, state: dict, per_epoch: int, arm: str, seed: int):
    c0 = time.process_time()
    entry = {"step": state["step"], "epoch": state["step"] / per_epoch,
             "train_loss": state["loss_sum"] / max(1, state["loss_n"]),
             **_checkpoint_eval(model, data, monitor, a), "cpu": state["cpu"]}
    state["eval_cpu"] += time.process_time() - c0
    state["loss_sum"], state["loss_n"] = 0.0, 0
    state["curve"].append(entry)
    print(f"    {arm} seed {seed} step {entry['step']} (epoch {entry['epoch']:.2f}): train "
          f"{entry['train_loss']:.3f} valid {entry['valid_loss']:.3f} PER "
          f"{entry['valid_per']:.2f} WER {entry['valid_wer']:.2f}  cpu {state['cpu']:.0f}s",
          flush=True)


def train_run(arm: str, seed: int, data: G2PData, a, folder: Path, examples: list[str],
              stop_after: int | None = None) -> dict | None:
    """One neural run: trained (resuming from its checkpoint when there is one), evaluated,
    written; a finished run is read back. None when stopped at ``stop_after`` steps."""
    name = run_name(arm, seed, a)
    done = folder / f"{name}.json"
    return run_once(folder, name, "g2p",
                    lambda: finished(done),
                    lambda: _train_and_write(arm, seed, data, a, folder, examples, stop_after,
                                             name, done))


def _train_and_write(arm, seed, data, a, folder: Path, examples, stop_after, name: str,
                     done: Path) -> dict | None:
    torch.manual_seed(seed)
    model = build(arm, data, a)
    opt = _optimizer(model, a)
    run_dir = folder / name
    state = {"step": 0, "curve": [], "cpu": 0.0, "wall": 0.0, "eval_cpu": 0.0,
             "loss_sum": 0.0, "loss_n": 0}
    if (run_dir / CHECKPOINT_JSON).is_file():
        state = resume_training(run_dir, model, opt)["trainer"]
        print(f"  {name}: resumed at step {state['step']}", flush=True)
    if not _train_steps(arm, model, opt, data, a, seed, state, run_dir, stop_after):
        return None
    res = _final_eval(arm, seed, model, data, a, state, examples)
    save_state(model, folder / f"{name}.safetensors")
    atomic_write_json(done, res)
    shutil.rmtree(run_dir, ignore_errors=True)
    print(f"  {name}: test PER {res['test']['per']:.2f} WER {res['test']['wer']:.2f} (beam "
          f"{a.beam}: {res['test_beam']['per']:.2f} / {res['test_beam']['wer']:.2f})  params "
          f"{res['params']}  cpu {res['cpu_seconds']:.0f}s", flush=True)
    return res


def _final_eval(arm, seed, model, data: G2PData, a, state: dict, examples) -> dict:
    model.eval()
    c0 = time.process_time()
    res = {"arm": arm, "seed": seed, "params": param_count(model), "steps": state["step"],
           "epochs": state["curve"][-1]["epoch"], "curve": state["curve"],
           "cpu_seconds": state["cpu"], "seconds": state["wall"],
           "monitor_cpu_seconds": state["eval_cpu"]}
    for split in ("valid", "test"):
        entries = scored_entries(data, split, a)
        res[split] = score(decode_words(model, data, [w for w, _ in entries]), entries)
    res["examples"] = {w: " ".join(p) for w, p in zip(examples,
                                                       decode_words(model, data, examples))}
    test = scored_entries(data, "test", a)
    res["test_beam"] = score(decode_words(model, data, [w for w, _ in test], beam=a.beam), test)
    res["maps"] = attention_maps(model, data, examples[:3])
    res["eval_cpu_seconds"] = time.process_time() - c0
    return res


@torch.no_grad()
def attention_maps(model, data: G2PData, words: list[str]) -> list[dict]:
    """Per word: the greedy pronunciation and how each of its phonemes reads the letters: the
    last decoder layer's cross-attention (mean over heads) of a ``Seq2Seq``, the pooling
    weights of a ``PervasiveAttention``; (phonemes, letters) nested lists."""
    out = []
    for w in words:
        src = data.encode_source([w])
        toks = strip(model.generate(src), data.phonemes.index("</s>"), PAD)[0]
        tgt = torch.tensor([[1, *toks]])
        if isinstance(model, Seq2Seq):
            m = model.cross_attention_maps(src, tgt)[-1][0].mean(0)
        else:
            m = model.pooling_maps(src, tgt)[0]
        out.append({"word": w, "phonemes": data.decode_target([toks])[0],
                    "map": [[round(float(v), 4) for v in row] for row in m[:len(toks) + 1]]})
    return out


# -- the study -----------------------------------------------------------------------------------
#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(limit=1500, seeds=1, steps=24, pervasive_steps=16, batch=16, width=32, layers=1,
             heads=2, embed=8, grid_layers=2, growth=8, bottleneck=16, eval_every=8,
             eval_words=40, checkpoint_every=8, beam=2)


def parse_arms(text: str) -> list[str]:
    arms = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in arms if x not in ARMS]
    if bad or not arms:
        raise ValueError(f"--arms: unknown arm(s) {', '.join(map(repr, bad)) or '(none)'}; "
                         f"choose from {', '.join(ARMS)}")
    return list(dict.fromkeys(arms))


def check_arguments(a) -> None:
    """The checks that join options or cut a range (each option's range is its argparse type)."""
    heads_divide(a)
    if a.limit < 0 or (0 < a.limit < 3):
        raise ValueError(f"--limit must be 0 (every word) or >= 3, got {a.limit}")


def run(args) -> int:
    """Every arm x seed; prints the table, writes JSON and the plots."""
    check_arguments(args)
    arms = parse_arms(args.arms)
    if args.threads:
        torch.set_num_threads(args.threads)
    t_all = time.perf_counter()
    data = load_cmudict(seed=args.data_seed, limit=args.limit or None)
    folder = Path(args.out) / "g2p_runs"
    folder.mkdir(parents=True, exist_ok=True)
    examples = example_words(data)
    print(f"{data.describe()}; arms {', '.join(arms)}", flush=True)
    runs = []
    for arm in arms:
        if arm == "nearest":
            runs.append(_nearest(data, folder, examples, args))
            continue
        for i in range(args.seeds):
            runs.append(train_run(arm, args.seed + i, data, args, folder, examples))
    rows = _summarise(runs, arms)
    refs = {w: [" ".join(p) for p in prons] for w, prons in data.splits["test"]
            if w in set(examples)}
    result = dict(experiment="g2p", data=data.describe(), split=data.meta, settings={
        k: v for k, v in vars(args).items() if isinstance(v, (int, float, str))},
        arms=rows, runs=runs, examples={w: refs[w] for w in examples},
        cpu_hours=sum(r["all_cpu_minutes"] for r in rows.values()) / 60,
        wall_seconds=time.perf_counter() - t_all, hardware=hardware())
    _print_table(rows)
    write_result(args, "g2p", result)
    _plots(rows, runs, args)
    return 0


def _summarise(runs: list[dict], arms: list[str]) -> dict:
    rows = {}
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm]
        row = {"params": rs[0]["params"], "seeds": len(rs),
               "cpu_minutes": mean_std([r["cpu_seconds"] / 60 for r in rs])[0],
               "all_cpu_minutes": sum(_cpu(r) for r in rs) / 60}
        for split in ("valid", "test", "test_beam"):
            if split in rs[0]:
                row[split] = {k: mean_std([r[split][k] for r in rs]) for k in ("per", "wer")}
        if "steps" in rs[0]:
            row["steps"], row["epochs"] = rs[0]["steps"], rs[0]["epochs"]
        rows[arm] = row
    return rows


def _cpu(run: dict) -> float:
    """Every CPU second a run took: training, its learning-curve evaluations, the final one."""
    return sum(run.get(k, 0.0) for k in ("cpu_seconds", "monitor_cpu_seconds",
                                          "eval_cpu_seconds"))


def _print_table(rows: dict) -> None:
    print(f"\n{'arm':<18} {'params':>9} {'epochs':>6} {'cpu min':>7}  {'test PER':>13} "
          f"{'test WER':>13}  {'beam PER':>13} {'beam WER':>13}")
    for arm, r in rows.items():
        cells = []
        for split in ("test", "test_beam"):
            for k in ("per", "wer"):
                v = r.get(split, {}).get(k)
                cells.append(f"{'-':>13}" if v is None else f"{v[0]:>6.2f} ± {v[1]:4.2f}")
        print(f"{arm:<18} {r['params']:>9,} {r.get('epochs', 0):>6.2f} "
              f"{r['cpu_minutes']:>7.1f}  {cells[0]} {cells[1]}  {cells[2]} {cells[3]}")
    total = sum(r["all_cpu_minutes"] for r in rows.values())
    print(f"CPU time of the whole study (training and evaluation, every seed): "
          f"{total / 60:.2f} h")


def _plots(rows: dict, runs: list[dict], a) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, r in rows.items():
        rs = [x for x in runs if x["arm"] == arm and x.get("curve")]
        if not rs:
            axes[0].axhline(r["valid"]["wer"][0], color="grey", linestyle=":", label=arm)
            continue
        ep = [c["epoch"] for c in rs[0]["curve"]]
        for ax, key in zip(axes, ("valid_wer", "valid_loss")):
            v = np.array([[c[key] for c in x["curve"]] for x in rs])
            ax.plot(ep, v.mean(0), marker=".", label=arm)
            if len(rs) > 1:
                ax.fill_between(ep, v.min(0), v.max(0), alpha=0.2)
    axes[0].set_ylabel(f"validation WER, greedy ({a.eval_words} words), %")
    axes[1].set_ylabel("validation cross-entropy (nats / phoneme)")
    for ax in axes:
        ax.set_xlabel("epochs")
        ax.legend(fontsize=8)
    save_figure(fig, a, "g2p_curves")
    _plot_maps(runs, a, plt)


def _plot_maps(runs: list[dict], a, plt) -> None:
    shown = [r for r in runs if r.get("maps") and r["seed"] == a.seed]
    if not shown:
        return
    words = len(shown[0]["maps"])
    fig, axes = plt.subplots(words, len(shown), figsize=(3.2 * len(shown), 2.6 * words),
                             squeeze=False)
    for j, r in enumerate(shown):
        for i, m in enumerate(r["maps"]):
            ax = axes[i][j]
            ax.imshow(np.array(m["map"]), cmap="viridis", vmin=0, aspect="auto")
            ax.set_xticks(range(len(m["word"])), list(m["word"]))
            ax.set_yticks(range(len(m["phonemes"]) + 1), [*m["phonemes"], "</s>"], fontsize=7)
            if i == 0:
                kind = "cross-attention" if r["arm"].startswith("transformer") else "pooling"
                ax.set_title(f"{r['arm']} ({kind})", fontsize=9)
    save_figure(fig, argparse.Namespace(out=a.out, plot=None), "g2p_attention")

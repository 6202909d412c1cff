"""Grapheme-to-phoneme conversion on CMUdict: two of the paper's cited attention
models on one task, beside a baseline that reads spellings only.

``structconv reproduce g2p --out runs`` trains, for ``--seeds`` model seeds on one split
(``--data-seed``; words, not pronunciations, held out: 5 % valid, 10 % test, stress dropped):

* ``transformer``: the shipped ``g2p_transformer`` config, ``sc.nn.Seq2Seq`` with sinusoidal
  positions (Vaswani et al.'s model: the encoder's self-attention, the decoder's masked
  self-attention and cross-attention, each an attention convolution);
* ``transformer-shift``: the same without positional encodings, with shift-matrix heads
  instead (causal offsets 0..S-1 in the decoder, signed offsets in the encoder: the paper's
  proposal), its feed-forward width lowered to the ``transformer``'s parameter count;
* ``pervasive``: the shipped ``g2p_pervasive`` config, ``sc.nn.PervasiveAttention`` (Elbayad
  et al. 2018), attention pooling; ``pervasive-max``: the same with max pooling (not in the
  default arms);
* ``nearest``: the pronunciation of the training word closest in spelling (character trigrams
  to shortlist, edit distance to choose), once (it has no seed).

Each neural arm is its config plus overrides (the options' values, the arm's model, the
seed), trained by ``structconv.training.train``: AdamW (betas 0.9, 0.98, weight decay 0.01 on
matrices), linear warm-up and cosine decay to a tenth, clipping 1.0, label smoothing 0.1,
dropout 0.1, batches of words of similar length; every ``--eval-every`` steps the validation
loss and the greedy PER / WER of ``--eval-words`` validation words make the learning curves,
and the weights of the lowest validation loss are kept. Then, on each trained run (read back
with ``load_run``): greedy PER / WER on the whole validation and test splits, beam search
(``--beam``) on test, decoded examples, the cross-attention maps (the alignment) and the
pervasive model's pooling maps.

Every run is a run directory ``<out>/g2p_runs/<arm>-s<seed>-<steps>`` trained at most once
under its lock: a finished run is read back, an interrupted one resumed from its checkpoint
(to the numbers of an uninterrupted one), one made with other options refused. One process,
``--threads`` torch threads (default 1). Writes ``<out>/g2p.json``, ``g2p_curves.png`` and
``g2p_attention.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from ..config import SEQ2SEQ_KEYS, config_from
from ..data.g2p import PAD, G2PData, edit_distance
from ..io import atomic_write_json
from ..models.seq2seq import decode_words, epoch_batches, score
from ..models.sizes import seq2seq_parameters
from ..nn.decoding import strip
from ..nn.seq2seq import Seq2Seq
from ._common import (
    DROPOUT,
    POSITIVE,
    SEED,
    THREADS,
    Bounded,
    Listed,
    hardware,
    heads_divide,
    mean_std,
    pyplot,
    save_figure,
    set_threads,
    write_result,
)
from .sweep import Run, config_run

__all__ = ["add_arguments", "run", "ARMS", "CONFIGS", "arm_run", "scored_entries",
           "nearest_predictions", "equalised_ffn", "example_words", "analyse", "run_name",
           "attention_maps", "train_run"]

#: the arms this recipe knows; ``DEFAULT_ARMS`` run unless ``--arms`` says otherwise
ARMS = ("nearest", "transformer", "transformer-shift", "pervasive", "pervasive-max")
DEFAULT_ARMS = ("nearest", "transformer", "transformer-shift", "pervasive")
#: the options' ranges: every size bounded above
SEEDS, STEPS, SIZE = Bounded(int, 1, 1000), Bounded(int, 1, 10**8), Bounded(int, 1, 65536)
FEW, WORDS = Bounded(int, 1, 1024), Bounded(int, 1, 10**7)
#: the shipped config of each neural arm
CONFIGS = {"transformer": "g2p_transformer", "transformer-shift": "g2p_transformer",
           "pervasive": "g2p_pervasive", "pervasive-max": "g2p_pervasive"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS), type=Listed.of(ARMS),
                        help=f"comma list of arms from {', '.join(ARMS)}")
    parser.add_argument("--seeds", type=SEEDS, default=3, help="model seeds per neural arm")
    parser.add_argument("--data-seed", type=SEED, default=0, help="the split's seed")
    parser.add_argument("--limit", type=Bounded(int, 0, 10**7), default=0,
                        help="use a sample of this many words")
    parser.add_argument("--steps", type=STEPS, default=6000, help="Transformer training steps")
    parser.add_argument("--pervasive-steps", type=STEPS, default=6000,
                        help="pervasive training steps (a step costs about what the "
                             "Transformer's does at the default sizes)")
    parser.add_argument("--batch", type=SIZE, default=64, help="words per batch")
    parser.add_argument("--lr", type=POSITIVE, default=1e-3)
    parser.add_argument("--dropout", type=DROPOUT, default=0.1)
    parser.add_argument("--label-smoothing", type=DROPOUT, default=0.1)
    parser.add_argument("--width", type=SIZE, default=128)
    parser.add_argument("--layers", type=FEW, default=3, help="encoder and decoder layers")
    parser.add_argument("--heads", type=FEW, default=4, help="attention heads per layer")
    parser.add_argument("--shifts", type=FEW, default=4,
                        help="decoder shift heads of transformer-shift (offsets 0..S-1)")
    parser.add_argument("--src-shifts", type=FEW, default=5,
                        help="encoder shift heads of transformer-shift (centred offsets)")
    parser.add_argument("--embed", type=SIZE, default=32, help="pervasive: embedding size")
    parser.add_argument("--grid-layers", type=FEW, default=6, help="pervasive: layers")
    parser.add_argument("--growth", type=SIZE, default=24, help="pervasive: growth rate")
    parser.add_argument("--bottleneck", type=SIZE, default=48, help="pervasive: bottleneck")
    parser.add_argument("--kernel", type=Bounded(int, 1, 63), default=3,
                        help="pervasive: k x k taps")
    parser.add_argument("--eval-every", type=Bounded(int, 1, 10**6), default=500,
                        help="steps between validations (the configs' batches_per_epoch)")
    parser.add_argument("--eval-words", type=WORDS, default=500,
                        help="validation words decoded for the learning curves")
    parser.add_argument("--beam", type=FEW, default=4, help="beam width of the test decoding")
    parser.add_argument("--eval-limit", type=Bounded(int, 0, 10**7), default=0,
                        help="score valid and test on a seeded sample of this many words each "
                             "(0: every word; for reduced runs)")
    parser.add_argument("--checkpoint-every", type=STEPS, default=500,
                        help="steps between a run's checkpoints, rounded up to whole "
                             "--eval-every intervals")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (0: default)")
    parser.add_argument("--plot", default=None, help="learning-curve PNG path")


# -- the arms: shipped configs and their overrides -------------------------------------------------
def steps_of(arm: str, a) -> int:
    """Training steps of an arm (``--pervasive-steps`` for the pervasive arms)."""
    return a.pervasive_steps if arm.startswith("pervasive") else a.steps


def run_name(arm: str, seed: int, a) -> str:
    return f"{arm}-s{seed}-{steps_of(arm, a)}"


def _data(a) -> list[str]:
    limit = f", limit={a.limit}" if a.limit else ""
    return [f"data.options={{seed={a.data_seed}{limit}}}", f"data.batch_size={a.batch}",
            f"data.batches_per_epoch={a.eval_every}", f"data.val_sample={a.eval_words}"]


def _model(arm: str, a, ffn: int) -> list[str]:
    m = "model.seq2seq"
    if arm.startswith("pervasive"):
        return [f"{m}.embed={a.embed}", f"{m}.layers={a.grid_layers}", f"{m}.growth={a.growth}",
                f"{m}.bottleneck={a.bottleneck}", f"{m}.kernel={a.kernel}",
                f"{m}.pooling={'max' if arm == 'pervasive-max' else 'attention'}",
                f"{m}.dropout={a.dropout}"]
    out = [f"{m}.width={a.width}", f"{m}.layers={a.layers}", f"{m}.heads={a.heads}",
           f"{m}.dropout={a.dropout}"]
    if arm == "transformer-shift":
        out += [f"{m}.position=shift", f"{m}.shifts={a.shifts}", f"{m}.src_shifts={a.src_shifts}",
                f"{m}.ffn={ffn}"]
    return out


def arm_run(arm: str, seed: int, a, ffn: int = 0) -> Run:
    """The run of a neural ``arm`` with ``seed``: its shipped config and overrides (``ffn``:
    transformer-shift's feed-forward width, ``equalised_ffn``)."""
    steps = steps_of(arm, a)
    return Run(run_name(arm, seed, a), CONFIGS[arm], (
        *_data(a), *_model(arm, a, ffn), f"train.lr={a.lr}", f"train.max_steps={steps}",
        f"train.epochs={math.ceil(steps / a.eval_every)}",
        f"train.warmup_steps={max(1, min(100, steps // 10))}",
        f"train.label_smoothing={a.label_smoothing}",
        f"train.checkpoint_every={math.ceil(a.checkpoint_every / a.eval_every)}",
        f"seed={seed}"))


def equalised_ffn(data: G2PData, a) -> int:
    """The feed-forward width at which ``transformer-shift`` has the parameter count of
    ``transformer`` (one unit of width costs 2·width + 1 parameters in each of the
    2·layers blocks), counted from the sizes (``models.sizes``)."""
    V_s, V_t = len(data.graphemes), len(data.phonemes)
    spec = {**SEQ2SEQ_KEYS, "width": a.width, "layers": a.layers, "heads": a.heads}
    base = seq2seq_parameters(spec, V_s, V_t, 0)
    shift = seq2seq_parameters({**spec, "position": "shift", "shifts": a.shifts,
                                "src_shifts": a.src_shifts, "ffn": 4 * a.width}, V_s, V_t, 0)
    unit = 2 * a.layers * (2 * a.width + 1)
    return max(1, 4 * a.width + round((base - shift) / unit))


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


def scored_entries(data: G2PData, split: str, a) -> list:
    """The words of ``split`` that the final scores use: all of them, or with
    ``--eval-limit n`` a seeded sample of n (the same for every arm)."""
    entries, n = data.splits[split], getattr(a, "eval_limit", 0)
    if not n or n >= len(entries):
        return entries
    g = torch.Generator().manual_seed(2718 + ("valid", "test").index(split))
    pick = torch.randperm(len(entries), generator=g)[:n]
    return [entries[i] for i in sorted(pick.tolist())]


def example_words(data: G2PData, n: int = 8) -> list[str]:
    """Test words shown in the results: a seeded sample of ``n`` of 5-12 letters, a quarter of
    them with several pronunciations."""
    test = data.splits["test"]
    order = torch.randperm(len(test), generator=torch.Generator().manual_seed(77)).tolist()
    multi = [test[i][0] for i in order if len(test[i][1]) > 1 and 5 <= len(test[i][0]) <= 12]
    single = [test[i][0] for i in order if len(test[i][1]) == 1 and 5 <= len(test[i][0]) <= 12]
    k = min(len(multi), n // 4)
    return (multi[:k] + single[:n - k]) if single else [w for w, _ in test[:n]]


# -- training (the engine) and the analysis of each trained run ---------------------------------
def _curve(where: Path, a, steps: int, per_pass: int) -> list[dict]:
    """The learning curve from the run's metrics: after each validation the step, the passes
    over the words, the training loss (mean over the interval) and the validation sample's
    loss and greedy PER / WER."""
    rows = [json.loads(line) for line in (where / "metrics.jsonl").read_text().splitlines()]
    out = []
    for r in rows:
        step = min(r["epoch"] * a.eval_every, steps)
        out.append({"step": step, "epoch": step / per_pass, "train_loss": r["train_loss"],
                    "valid_loss": r["val_loss"], "valid_per": r["val_per"],
                    "valid_wer": r["val_wer"]})
    return out


def analyse(where: Path, result: dict, a, examples: list[str]) -> dict:
    """The final scores of the run in ``where`` (its best-validation weights): greedy PER /
    WER on valid and test (the engine's result's, or on ``--eval-limit`` samples), beam search
    on test, the examples and the attention maps; written to ``analysis.json`` there and read
    back when made with the same options."""
    from ..training import load_run

    path = where / "analysis.json"
    settings = {"beam": a.beam, "eval_limit": a.eval_limit, "examples": examples}
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("settings") == settings:
            return saved
    c0 = time.process_time()
    _, data, model = load_run(where, "best")
    model.eval()
    out = {"settings": settings}
    for split, key in (("valid", "val"), ("test", "test")):
        entries = scored_entries(data, split, a)
        out[split] = score(decode_words(model, data, [w for w, _ in entries]), entries) \
            if a.eval_limit else {"per": result[f"{key}_per"], "wer": result[f"{key}_wer"],
                                  "words": len(entries)}
    out["examples"] = {w: " ".join(p) for w, p in zip(examples,
                                                       decode_words(model, data, examples))}
    test = scored_entries(data, "test", a)
    out["test_beam"] = score(decode_words(model, data, [w for w, _ in test], beam=a.beam), test)
    out["maps"] = attention_maps(model, data, examples[:3])
    out["eval_cpu_seconds"] = time.process_time() - c0
    atomic_write_json(path, out)
    return json.loads(json.dumps(out))  # as the file has it (lists, not tuples)


def train_run(arm: str, seed: int, data: G2PData, a, folder: Path, examples: list[str],
              ffn: int = 0) -> dict:
    """One neural run: trained by the engine (resumed from its checkpoint where one was
    left, read back where finished), then analysed; its record in ``g2p.json``."""
    run = arm_run(arm, seed, a, ffn)
    where = folder / run.name
    fresh = not (where / "result.json").is_file()
    c0 = time.process_time()
    res = config_run(folder, run, "g2p", a.device)
    cpu = time.process_time() - c0
    if fresh:  # the CPU time of the call that trained it (a resumed run: since the resume)
        atomic_write_json(where / "cpu.json", {"cpu_seconds": cpu})
    ana = analyse(where, res, a, examples)
    pairs = data.pairs("train")
    per_pass = len(epoch_batches([len(w) for w, _ in pairs], a.batch, seed, 1))
    steps = steps_of(arm, a)
    curve = _curve(where, a, steps, per_pass)
    cpu_file = where / "cpu.json"
    out = {"arm": arm, "seed": seed, "params": res["parameters"], "steps": steps,
           "epochs": curve[-1]["epoch"], "curve": curve, "best_step": min(
               res["best_epoch"] * a.eval_every, steps),
           "cpu_seconds": json.loads(cpu_file.read_text())["cpu_seconds"]
           if cpu_file.is_file() else 0.0, "seconds": res["train_time_s"],
           **{k: ana[k] for k in ("valid", "test", "examples", "test_beam", "maps",
                                  "eval_cpu_seconds")}}
    if fresh:
        print(f"  {run.name}: test PER {out['test']['per']:.2f} WER {out['test']['wer']:.2f} "
              f"(beam {a.beam}: {out['test_beam']['per']:.2f} / {out['test_beam']['wer']:.2f})"
              f"  params {out['params']}  cpu {out['cpu_seconds']:.0f}s", flush=True)
    return out


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


def check_arguments(a) -> None:
    """The checks that join options or cut a range (each option's range is its argparse
    type), and every arm's config validated (``ConfigError`` naming the key)."""
    heads_divide(a)
    if a.limit < 0 or (0 < a.limit < 3):
        raise ValueError(f"--limit must be 0 (every word) or >= 3, got {a.limit}")
    for arm in dict.fromkeys(a.arms.split(",") if isinstance(a.arms, str) else a.arms):
        if arm.strip() in CONFIGS:
            config_from(CONFIGS[arm.strip()], list(arm_run(arm.strip(), a.seed, a,
                                                           4 * a.width).overrides))


def _load(a) -> G2PData:
    """The words as the runs' configs load them."""
    from ..training import load_data

    return load_data(config_from("g2p_transformer", _data(a)))


def run(args) -> int:
    """Every arm x seed; prints the table, writes JSON and the plots."""
    check_arguments(args)
    arms = list(dict.fromkeys(x.strip() for x in args.arms.split(",") if x.strip())) \
        if isinstance(args.arms, str) else list(dict.fromkeys(args.arms))
    set_threads(args)
    t_all = time.perf_counter()
    data = _load(args)
    folder = Path(args.out) / "g2p_runs"
    folder.mkdir(parents=True, exist_ok=True)
    examples = example_words(data)
    ffn = equalised_ffn(data, args)
    print(f"{data.describe()}; arms {', '.join(arms)}", flush=True)
    runs = []
    for arm in arms:
        if arm == "nearest":
            runs.append(_nearest(data, folder, examples, args))
            continue
        for i in range(args.seeds):
            runs.append(train_run(arm, args.seed + i, data, args, folder, examples, ffn))
    rows = _summarise(runs, arms)
    refs = {w: [" ".join(p) for p in prons] for w, prons in data.splits["test"]
            if w in set(examples)}
    result = dict(experiment="g2p", data=data.describe(), split=data.meta, configs={
        arm: CONFIGS[arm] for arm in arms if arm in CONFIGS}, settings={
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
    save_figure(fig, a, "g2p_attention", use_plot=False)

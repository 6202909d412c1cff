"""The trainer: a config (see ``structconv.config``) -> a run directory with metrics and weights.

``train(config, out=...)`` is the entry point, exported as ``sc.train`` (calling this module
calls it) and run by ``structconv train``.

A run directory holds ``config.json``, ``metrics.jsonl`` and ``metrics.csv`` (one row per epoch),
``curves.png``, checkpoints (``checkpoint.json`` + ``ckpt-*.safetensors``), ``best.safetensors``
(weights of the best validation epoch) and ``result.json``. Data order, dropout and every other
random draw derive from the seed and the epoch, and the RNG states travel in the checkpoint, so a
resumed run ends exactly as an uninterrupted one. With ``WORLD_SIZE > 1`` each global batch is
split across the processes and the per-process losses are scaled so that DDP's gradient average
is the gradient of the global batch's mean loss. With ``[train.sampler]`` a node-classification
model trains on sampled mini-batches (``structconv.minibatch``): each optimizer step takes
``accumulate`` batches on every process, the same global batches whatever the process count, and
evaluation is exact (full batch, or layer by layer over whole neighbourhoods). A ``[model.link]``
config trains a ``sc.kg.LinkPredictor`` on a knowledge graph's triples (one process), validated
and tested by filtered ranking (``evaluate_link``). A ``[model.seq2seq]`` config trains a
sequence-to-sequence model on word pairs (teacher-forced loss per target token), and its result
adds the phoneme and word error rates of decoding every validation and test word.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import re
import signal
import sys
import time
import types
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from . import distributed as D
from .checkpoint import (
    CHECKPOINT_JSON,
    CheckpointError,
    check_fits,
    load_checkpoint,
    load_model_weights,
    load_weights,
    resume_training,
    save_checkpoint,
    save_weights,
)
from .config import (
    ConfigError,
    config_from,
    import_paths,
    is_link,
    is_seq2seq,
    link_train_spec,
    sampler_spec,
    seq2seq_spec,
    validate,
)
from .data.g2p import PAD
from .data.registry import load_dataset
from .interrupt import StopRequest, TrainingInterrupted
from .io import RunLock, atomic_write_json
from .minibatch import SampledEval, batch_inputs, dropout_seed, make_loader, restrictions
from .models.build import build_model, check_memory
from .models.seq2seq import decode_scores, epoch_batches, pair_tensors, token_losses
from .optim import epoch_generator
from .optim import make_optimizer as _named_optimizer
from .registry import untrusted
from .runlog import LINK_PANELS, Progress, plot_curves, progress_mode, tensorboard, write_metrics

__all__ = ["TrainingError", "train", "evaluate", "evaluate_link", "decode_result", "load_data",
           "resolve_device", "load_run", "make_optimizer", "count_parameters", "prepare_run",
           "check_world_size", "check_train_split", "resume_command", "default_run_dir"]


class TrainingError(ValueError):
    """Training cannot go on (NaN loss, bad resume); the message says where and why."""


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto``; a clear error when CUDA is asked but absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available "
                         "(torch.cuda.is_available() is False); use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}: use cpu or cuda")
    return dev


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def load_data(cfg: dict):
    """The dataset named by ``cfg['data']`` (image, node, text, link or g2p task)."""
    d = cfg["data"]
    try:
        data = load_dataset(d["name"], d.get("root"), **d.get("options", {}))
    except TypeError as e:  # an option the loader does not take
        raise ConfigError(f"data.options for {d['name']!r}: {e}") from None
    task = getattr(data, "task", None)
    if is_link(cfg) and task != "link":
        raise ConfigError(f"model.link predicts links: it needs a knowledge-graph dataset "
                          f"(fb15k-237, wn18rr or a folder of train/valid/test.txt triples), but "
                          f"dataset {d['name']!r} is a {task} task")
    if task == "link" and not is_link(cfg):
        raise ConfigError(f"dataset {d['name']!r} is a link-prediction task: describe the model "
                          "with a [model.link] table (decoder, dim, ...), not layers")
    if task == "g2p" and not is_seq2seq(cfg):
        raise ConfigError(f"dataset {d['name']!r} maps words to pronunciations: describe the "
                          "model with a [model.seq2seq] table (kind, width, ...), not layers")
    if is_seq2seq(cfg) and task != "g2p":
        raise ConfigError(f"model.seq2seq maps a sequence to a sequence: it needs a "
                          f"grapheme-to-phoneme dataset (cmudict), but dataset {d['name']!r} is "
                          f"a {task} task")
    if task not in ("image", "node", "text", "link", "g2p"):
        raise ConfigError(f"dataset {d['name']!r} is a {task or '?'} task; train handles "
                          "image, node, text, link and g2p tasks")
    if sampler_spec(cfg) and data.task != "node":
        raise ConfigError(f"train.sampler samples graph neighbourhoods, but dataset "
                          f"{d['name']!r} is a {data.task} task: use a node-classification "
                          "(graph) dataset or remove [train.sampler]")
    return data


def check_train_split(data) -> None:
    """Refuse (ConfigError) a dataset whose training split is empty: nothing can train."""
    if data.task == "node":
        n = int(data.masks["train"].sum())
    elif data.task == "link":
        n = int(data.train.shape[0])
    elif data.task == "text":
        n = int(data.splits["train"].numel())
    elif data.task == "g2p":
        n = len(data.splits["train"])
    else:
        n = int(data.splits["train"][0].shape[0])
    if n == 0:
        raise ConfigError(f"the train split of {data.name} is empty: there is nothing to train "
                          "on (check data.options: the split sizes or the limit)")


def make_optimizer(cfg: dict, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of ``cfg['train']`` over the model's trainable parameters."""
    t = cfg["train"]
    return _named_optimizer(t["optimizer"], model.parameters(), t["lr"], t["weight_decay"],
                            t["momentum"])


# -- batches -------------------------------------------------------------------------------------
def _train_batches(data, cfg: dict, epoch: int):
    """Global batches of one epoch: (inputs, targets) on CPU; node tasks give node indices."""
    d, seed = cfg["data"], cfg["seed"]
    g = epoch_generator(seed, epoch)
    if data.task == "image":
        x, y = data.splits["train"]
        perm = torch.randperm(x.shape[0], generator=g)
        n = d["batches_per_epoch"] or math.ceil(x.shape[0] / d["batch_size"])
        for i in range(n):
            idx = perm[i * d["batch_size"]:(i + 1) * d["batch_size"]]
            if idx.numel():
                yield x[idx], y[idx]
    elif data.task == "node":
        yield None, torch.nonzero(data.masks["train"]).flatten()
    elif data.task == "g2p":
        # every pronunciation of a training word is a pair; batches of similar lengths
        pairs = data.pairs("train")
        batches = epoch_batches([len(w) for w, _ in pairs], d["batch_size"], seed, epoch)
        for idx in batches[:d["batches_per_epoch"] or None]:
            src, tin, tout = pair_tensors(data, pairs, idx)
            yield (src, tin), tout
    else:
        ids, T = data.splits["train"], d["seq_len"]
        if ids.numel() <= T + 1:
            raise ConfigError(f"data.seq_len={T} must be shorter than the {ids.numel()} "
                              "training characters")
        for _ in range(d["batches_per_epoch"] or 20):
            start = torch.randint(0, ids.numel() - T - 1, (d["batch_size"],), generator=g)
            win = torch.stack([ids[s:s + T + 1] for s in start.tolist()])
            yield win[:, :-1], win[:, 1:]


def _eval_batches(data, cfg: dict, split: str):
    d = cfg["data"]
    if data.task == "image":
        x, y = data.splits[split]
        for i in range(0, x.shape[0], d["eval_batch_size"]):
            yield x[i:i + d["eval_batch_size"]], y[i:i + d["eval_batch_size"]]
    elif data.task == "node":
        yield None, torch.nonzero(data.masks[split]).flatten()
    elif data.task == "g2p":
        # a word's first pronunciation, words in order of length (little padding)
        entries = sorted(data.splits[_G2P_SPLITS.get(split, split)], key=lambda e: len(e[0]))
        pairs = [(w, prons[0]) for w, prons in entries]
        for i in range(0, len(pairs), d["eval_batch_size"]):
            src, tin, tout = pair_tensors(data, pairs, range(i, min(len(pairs),
                                                                  i + d["eval_batch_size"])))
            yield (src, tin), tout
    else:
        ids, T = data.splits[split], d["seq_len"]
        n = (ids.numel() - 1) // T
        if n < 1:
            raise ConfigError(f"the {split} split has {ids.numel()} characters, fewer than "
                              f"data.seq_len + 1 = {T + 1}")
        win = torch.stack([ids[i * T:i * T + T + 1] for i in range(n)])
        for i in range(0, n, d["eval_batch_size"]):
            yield win[i:i + d["eval_batch_size"], :-1], win[i:i + d["eval_batch_size"], 1:]


def _node_input(data, device, dtype):
    if data.x is None:
        return torch.zeros(data.num_nodes, 0, device=device, dtype=dtype)
    return data.x.to(device=device, dtype=dtype)


#: the trainer's split names -> a grapheme-to-phoneme dataset's
_G2P_SPLITS = {"val": "valid"}


def _items(data, targets: Tensor) -> int:
    """The items a batch's loss averages over: its targets (a word pair's target tokens that
    are not padding)."""
    return int((targets != PAD).sum()) if data.task == "g2p" else targets.numel()


def _rows(inputs, rows: Tensor):
    """Rows ``rows`` of a batch's inputs (None, a tensor or a tuple of tensors)."""
    if inputs is None:
        return None
    return tuple(x[rows] for x in inputs) if isinstance(inputs, tuple) else inputs[rows]


def _losses(model, data, inputs, targets, device, dtype,
            smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """Per-item cross-entropy (n,) and correct predictions (n,) for a batch (items: samples,
    nodes, or target tokens of a text or word pair); ``smoothing`` is the label smoothing."""
    if data.task == "g2p":
        src, tin = (x.to(device) for x in inputs)
        return token_losses(model, src, tin, targets.to(device), smoothing)
    if data.task == "node":
        logits = model(_node_input(data, device, dtype))[targets.to(device)]
        y = data.y.to(device)[targets.to(device)]
    else:  # image or text
        x = inputs.to(device)
        logits = model(x if data.task == "text" else x.to(dtype))
        y = targets.to(device)
        if data.task == "text":
            logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
    return (F.cross_entropy(logits, y, reduction="none", label_smoothing=smoothing),
            logits.argmax(-1) == y)


@torch.no_grad()
def evaluate(model: nn.Module, data, cfg: dict, split: str, device=None,
             sampled: SampledEval | None = None) -> dict:
    """``{loss, acc, n}`` of a model on a split (mean cross-entropy, accuracy). A model
    trained on sampled mini-batches is evaluated exactly by ``sampled`` (a ``SampledEval``,
    made here when not given)."""
    device = device or next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    was = model.training
    model.eval()
    if data.task == "node" and sampler_spec(cfg) and sampled is None:
        sampled = SampledEval(model, cfg, data)
    tot, correct, n = 0.0, 0, 0
    for inputs, targets in _eval_batches(data, cfg, split):
        if sampled is not None:
            idx = targets.to(device)
            logits, y = sampled.logits(device)[idx], data.y.to(device)[idx]
            loss, ok = F.cross_entropy(logits, y, reduction="none"), logits.argmax(-1) == y
        else:
            loss, ok = _losses(model, data, inputs, targets, device, dtype)
        tot += loss.double().sum().item()
        correct += int(ok.sum())
        n += ok.numel()
    model.train(was)
    if n == 0:
        raise ConfigError(f"the {split} split of {data.name} is empty")
    return {"loss": tot / n, "acc": correct / n, "n": n}


# -- training ------------------------------------------------------------------------------------
def _check_partial(part, epoch: int, run: Path) -> None:
    """A mid-epoch position read from a checkpoint has the fields the trainer writes, in range
    (a hand-edited field is named, never acted on)."""
    if part is None:
        return

    def bad(what: str):
        raise CheckpointError(f"{run / CHECKPOINT_JSON}: corrupt trainer.partial ({what})")

    if not isinstance(part, dict) or set(part) != {"epoch", "step", "totals", "seconds"}:
        bad("must have the keys epoch, step, totals, seconds")
    if part["epoch"] != epoch + 1:
        bad(f"epoch must be {epoch + 1}, the epoch after the checkpoint's, got "
            f"{part['epoch']!r}")
    if isinstance(part["step"], bool) or not isinstance(part["step"], int) or part["step"] < 1:
        bad(f"step must be an int >= 1, got {part['step']!r}")
    nums = part["totals"] if isinstance(part["totals"], list) else None
    if nums is None or len(nums) != 3 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0 for v in nums + [part["seconds"]]):
        bad("totals must be 3 numbers >= 0 and seconds a number >= 0")


def _improved(cfg, val: dict, best) -> bool:
    if best is None:
        return True
    if cfg["train"]["monitor"] == "val_loss":
        return val["loss"] < best
    return val["acc"] > best


def prepare_run(run: Path, cfg: dict | None, resume: bool, allow_imports: bool = False) -> dict:
    """The config of a run in ``run``: read (and validated) from its ``config.json`` to
    resume, or ``cfg`` when ``run`` holds no run yet (else TrainingError). A run directory is
    data: its config may name no import path unless ``allow_imports`` (see
    ``structconv.registry.untrusted``)."""
    cfg_path = run / "config.json"
    if resume:
        if not cfg_path.is_file():
            raise CheckpointError(f"{cfg_path}: not found; --resume needs a run directory made "
                                  "by structconv train")
        try:
            saved = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as e:  # also a 5,000-digit number, deep nesting
            raise CheckpointError(f"{cfg_path}: corrupt JSON ({type(e).__name__}: "
                                  f"{str(e)[:200]})") from None
        if not isinstance(saved, dict):
            raise CheckpointError(f"{cfg_path}: a config is a JSON object, got "
                                  f"{type(saved).__name__}")
        with untrusted(run, allow_imports):
            return validate(saved, str(cfg_path))
    if (run / CHECKPOINT_JSON).exists():
        raise TrainingError(f"{run} already holds a run; use --resume {run} to continue it "
                            "or choose another --out")
    return cfg


def resume_command(run, cfg: dict, nproc: int = 1) -> str:
    """The command that continues the run in ``run`` whose config is ``cfg``: with
    ``--allow-imports`` where the config names import paths (a run directory is data: its
    imports are refused unless allowed)."""
    return (f"structconv train --resume {run}" + (f" --nproc {nproc}" if nproc > 1 else "")
            + (" --allow-imports" if import_paths(cfg) else ""))


def train(config: dict | str | Path | None = None, out: str | Path | None = None,
          device: str = "cpu", resume: bool = False, progress: bool | str | None = False,
          stop_after: int = 0, lock: bool = True, *, overrides=(), seed: int | None = None,
          allow_imports: bool = False) -> dict:
    """Train the model a config describes into a run directory; returns the run's result.

    This is ``sc.train`` and what ``structconv train`` runs. ``config`` is a shipped config's
    name (``"cnn_digits"``, see ``structconv configs``), a TOML file's path, or a dict of the
    same tables (merged over ``structconv.config.DEFAULTS`` and validated); ``overrides`` are
    ``key=value`` strings as on the command line (``"train.epochs=3"``); ``seed`` replaces
    the config's. ``out`` is the run directory (default ``runs/<name>-<date>-<time>``).

    ``resume=True`` continues the run in ``out`` from its last checkpoint with the config saved
    there (give no ``config``: a run directory is data, so its import-path kinds are refused
    unless ``allow_imports``), inside an epoch where it stopped inside one; the result is the
    uninterrupted run's. ``progress``: True for a bar on a terminal and a line every 30 s
    elsewhere, False for none. The run directory is locked while the run writes it
    (``lock=False``: the caller holds the lock). SIGINT and SIGTERM stop at the next batch
    boundary after a checkpoint, raising ``TrainingInterrupted`` (a ``KeyboardInterrupt``
    whose message gives the resume command). ``stop_after`` stops after that many epochs of
    this call, with a checkpoint, and returns ``{"interrupted": True, "epoch": ..., "run":
    ...}``.

    Returns the ``result.json`` summary (``model``, ``dataset``, ``parameters``, ``epochs``,
    ``best_epoch``, the validation and test metrics, ``train_time_s``) with ``run``, the run
    directory, added. Bad input raises ``ConfigError`` / ``TrainingError`` (ValueErrors)
    naming the key or file.
    """
    if resume:
        if config is not None or overrides or seed is not None:
            raise TrainingError("resume=True continues the run in `out` with the config saved "
                                "there: give no config, overrides or seed")
        if out is None:
            raise TrainingError("resume=True needs out=, the run directory to continue")
        cfg = None
    else:
        if config is None:
            raise TrainingError("train needs a config: a shipped config's name, a TOML file "
                                "or a dict (or resume=True with out=RUN)")
        cfg = config_from(config, overrides)
        if seed is not None:
            cfg["seed"] = seed
        if not cfg.get("name"):
            cfg["name"] = "run" if isinstance(config, dict) else Path(config).stem
    run = Path(out) if out is not None else default_run_dir(cfg["name"])
    result = _run(cfg, run, device, resume, progress, stop_after, lock, allow_imports)
    return {**result, "run": str(run)}


def default_run_dir(name: str) -> Path:
    """``runs/<name>-<date>-<time>``, the name made one safe directory name (no separators,
    no leading dots: a config's ``name = "../../x"`` must not escape ``runs/``)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).lstrip(".") or "run"
    return Path("runs") / f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"


def _run(cfg: dict | None, run: Path, device: str, resume: bool, progress, stop_after: int,
         lock: bool, allow_imports: bool = False) -> dict:
    """The training loop of ``train``: epochs until the last, a stop or ``stop_after``."""
    main = int(os.environ.get("RANK", "0")) == 0
    # taken by the trainer at its first write (nothing is written for a refused config)
    run_lock = RunLock(run, "structconv train") if lock and main else None
    with run_lock or contextlib.nullcontext(), StopRequest() as stop:
        # a resumed run's config is validated and its model built as data (no imports)
        with untrusted(run, allow_imports) if resume else contextlib.nullcontext():
            link = is_link(cfg if not resume else prepare_run(run, None, True))
            t = (_LinkTrainer if link else _Trainer)(cfg, run, device, resume, progress, stop,
                                                     run_lock)
        epochs_run = 0
        for epoch in range(t.start + 1, t.cfg["train"]["epochs"] + 1):
            if t.state["stopped"]:
                break
            last = t.epoch(epoch)
            epochs_run += 1
            if last:
                break
            if t.stop_seen:  # asked at the epoch's last step: stop after its record
                t.checkpoint(epoch)
                t.interrupted(epoch, None)
            if stop_after and epochs_run >= stop_after:
                t.checkpoint(epoch)  # whatever checkpoint_seconds says: the run resumes
                return {"interrupted": True, "epoch": epoch}
        return t.finish()


class _Trainer:
    """One training run: the model, optimizer, data and the state a checkpoint holds.

    An epoch is a sequence of optimizer steps; after each, ``_boundary`` shows progress,
    writes a mid-epoch checkpoint when ``train.checkpoint_seconds`` have passed, and on a stop
    request writes one and raises ``TrainingInterrupted``. A mid-epoch checkpoint records
    where the epoch stood (``state["partial"]``: epoch, steps done, running sums, seconds);
    resuming replays the epoch's plan from that step, so the run ends as an uninterrupted one.
    """

    def __init__(self, cfg: dict | None, run: Path, device: str, resume: bool, progress,
                 stop: StopRequest, run_lock: RunLock | None = None):
        self.run, self.stop = run, stop
        self.progress = progress_mode(progress)
        self.w = w = D.init(device)
        dev = resolve_device(device)
        if dev.type == "cuda" and w.size > 1:
            dev = torch.device("cuda", w.local_rank)
        self.dev = dev
        self.cfg = cfg = prepare_run(run, cfg, resume)
        self.data = load_data(cfg)
        check_train_split(self.data)
        torch.manual_seed(cfg["seed"])
        # built once; the memory check reads its sizes before anything trains
        model = build_model(cfg, self.data)
        check_memory(cfg, self.data, dev, model)
        self.model = model = model.to(dev)
        self.dtype = next(model.parameters()).dtype
        self.opt = make_optimizer(cfg, model)
        self.net, self.loader, self.sampled = model, None, None
        if sampler_spec(cfg):
            # mini-batches: the model on restricted bases, each rank its share of the batches
            restr = restrictions(model, cfg, self.data, sampler_spec(cfg)["degrees"])
            self.loader = make_loader(cfg, self.data, restr, self.dtype, w.rank, w.size)
            self.sampled = SampledEval(model, cfg, self.data)
        if w.size > 1:
            check_world_size(cfg, w.size)
            # a size-1 dim's stride is arbitrary: a (1, P, Q) weight's grad can carry another
            # one than DDP's bucket view; the copy it warns about costs nothing at these sizes
            warnings.filterwarnings("ignore", message=".*Grad strides do not match bucket view")
            self.net = nn.parallel.DistributedDataParallel(
                self.net, device_ids=[dev.index] if dev.type == "cuda" else None)
        self.state = {"best": None, "best_epoch": 0, "bad_epochs": 0, "history": [],
                      "stopped": False}
        self.best_state, self.start, self.extra = None, 0, {}
        #: whether the last step's (global) stop flag asked to stop
        self.stop_seen = False
        if run_lock is not None:
            run_lock.acquire()
            if not resume:  # under the lock: another run may have finished here meanwhile
                prepare_run(run, cfg, False)
        if resume:
            self._resume()
        elif w.main:
            run.mkdir(parents=True, exist_ok=True)
            atomic_write_json(run / "config.json", cfg)
        D.barrier()
        self.tb = tensorboard(run) if w.main else None
        self.n_params = count_parameters(model)
        self.last_ckpt = time.monotonic()

    def _resume(self) -> None:
        ck = resume_training(self.run, self.model, self.opt)
        self.state, self.best_state, self.start = ck["trainer"], ck["best"], ck["epoch"]
        self.extra = ck["extra"]
        _check_partial(self.state.get("partial"), self.start, self.run)

    # -- an epoch: steps, each ending at a boundary -------------------------------------------
    def _position(self, epoch: int) -> tuple[int, list, float]:
        """(steps done, running sums, seconds) where this epoch stands: where a mid-epoch
        checkpoint left it, or its start."""
        part = self.state.pop("partial", None)
        if part is not None and part["epoch"] == epoch:
            return part["step"], list(part["totals"]), part["seconds"]
        return 0, [0.0, 0.0, 0.0], 0.0

    def epoch(self, epoch: int) -> bool:
        """Train one epoch, validate, record and checkpoint; True when it is the last."""
        done, totals, before = self._position(epoch)
        t0 = time.perf_counter() - before
        self.net.train()
        if self.loader is not None:
            steps, n_steps = self._sampled_steps(epoch, done), self.loader.steps()
        else:
            batches = list(_train_batches(self.data, self.cfg, epoch))
            steps = (self._step(inputs, targets, epoch, step)
                     for step, (inputs, targets) in enumerate(batches) if step >= done)
            n_steps = len(batches)
        bar = Progress(self.progress if self.w.main else None, epoch, n_steps, done)
        try:
            for stats in steps:
                done += 1
                totals = [a + b for a, b in zip(totals, stats[:3].tolist())]
                rate = totals[2] / max(time.perf_counter() - t0, 1e-9)
                bar.update(done, totals[0] / totals[2], rate)
                self._boundary(epoch, done, n_steps, totals, t0, bool(stats[3] > 0))
        finally:
            bar.close()
        return self._record(epoch, totals, time.perf_counter() - t0)

    def _boundary(self, epoch: int, done: int, n_steps: int, totals: list, t0: float,
                  stop: bool, extra: dict | None = None) -> None:
        """After a step: a mid-epoch checkpoint when due by time or asked for by a signal
        (``stop`` is the global flag: every rank stops at the same step), then the stop; at
        the epoch's last step the stop waits for the epoch's record (``train``)."""
        self.stop_seen = stop
        if done >= n_steps:
            return
        every, secs = self.cfg["train"]["checkpoint_every"], self.cfg["train"]["checkpoint_seconds"]
        if stop or (not every and secs and time.monotonic() - self.last_ckpt >= secs):
            part = {"epoch": epoch, "step": done, "totals": totals,
                    "seconds": time.perf_counter() - t0}
            self.checkpoint(epoch - 1, part, extra)
        if stop:
            self.interrupted(epoch, (done, n_steps))

    def interrupted(self, epoch: int, step: tuple[int, int] | None):
        """Raise ``TrainingInterrupted`` for a stop after its checkpoint, at ``step`` (done,
        of) of ``epoch``, or after the epoch (None)."""
        sig = self.stop.signum or signal.SIGTERM  # another rank's signal: stop as SIGTERM
        where = f"epoch {epoch}, step {step[0]}/{step[1]}" if step else f"the end of epoch {epoch}"
        raise TrainingInterrupted(sig, f"interrupted by {StopRequest.name(sig)} at {where}: "
                                       f"checkpoint saved in {self.run}; resume with: "
                                       f"{resume_command(self.run, self.cfg, self.w.size)}")

    def checkpoint(self, epoch: int, partial: dict | None = None,
                   extra: dict | None = None) -> None:
        """Write a checkpoint (main rank): after ``epoch`` complete epochs, or ``partial``
        steps into the next one."""
        if self.w.main:
            state = self.state if partial is None else {**self.state, "partial": partial}
            save_checkpoint(self.run, epoch, self.model.state_dict(), self.opt.state_dict(),
                            state, self.best_state, step=None if partial is None
                            else partial["step"], extra=extra)
        self.last_ckpt = time.monotonic()

    def _sampled_steps(self, epoch: int, done: int):
        """The epoch's optimizer steps over sampled mini-batches from step ``done`` on; yields
        each step's global (loss sum, correct, items, stop)."""
        L = self.loader
        # what iterating L yields, in order: the batches' random seeds
        plan = L.plan(epoch)[done * L.accumulate:]
        L.set_epoch(epoch, done * L.accumulate)
        group, step = [], done
        for batch, (_, rng) in zip(L, plan, strict=True):
            group.append((batch, rng))
            if len(group) == L.accumulate:
                yield self._sampled_step(group, epoch, step)
                group, step = [], step + 1

    def _sampled_step(self, group: list, epoch: int, step: int):
        """One optimisation step on this rank's mini-batches (gradients summed over them);
        the global (loss sum, correct, items)."""
        w = self.w
        n_global = D.all_reduce_sum(torch.tensor(
            float(sum(b.batch_size for b, _ in group)), dtype=torch.float64,
            device=self.dev)).item()
        self.opt.zero_grad(set_to_none=True)
        sums = torch.zeros(3, dtype=torch.float64, device=self.dev)
        for j, (batch, rng) in enumerate(group):
            batch = batch.to(self.dev)
            # dropout from the batch's own seed: the same masks in whichever process
            torch.manual_seed(dropout_seed(rng))
            last = j == len(group) - 1
            ctx = self.net.no_sync() if w.size > 1 and not last else contextlib.nullcontext()
            with ctx:
                logits = self.net(*batch_inputs(batch, self.dtype))
                smoothing = self.cfg["train"].get("label_smoothing", 0.0)
                loss = F.cross_entropy(logits, batch.y, reduction="none",
                                       label_smoothing=smoothing)
                # as _step: DDP's mean of the scaled gradients is the gradient of the mean loss
                # over every seed of the step
                (loss.sum() * (w.size / n_global)).backward()
            ok = logits.argmax(-1) == batch.y
            sums += torch.stack([loss.detach().double().sum(), ok.double().sum(),
                                 torch.tensor(float(ok.numel()), dtype=torch.float64,
                                              device=ok.device)])
        return self._apply_step(sums, epoch, step)

    def _apply_step(self, sums: Tensor, epoch: int, step: int) -> Tensor:
        """Clip, check the global loss and step the optimizer; the global stats (loss sum,
        correct, items, ranks asked to stop: one collective carries the stop flag too)."""
        t_cfg = self.cfg["train"]
        if t_cfg["grad_clip"]:
            nn.utils.clip_grad_norm_(self.model.parameters(), t_cfg["grad_clip"])
        flag = torch.tensor([float(self.stop.requested)], dtype=sums.dtype, device=sums.device)
        stats = D.all_reduce_sum(torch.cat([sums, flag]))
        if not torch.isfinite(stats[0]):
            raise TrainingError(f"loss is {stats[0].item()} at epoch {epoch}, step {step + 1}"
                                f"; lower train.lr (now {t_cfg['lr']}) or check the data")
        self.opt.step()
        return stats

    def _step(self, inputs, targets, epoch: int, step: int) -> Tensor:
        """One optimisation step on this rank's share of a global batch; the global
        (loss sum, correct, items)."""
        w = self.w
        n_global = _items(self.data, targets)
        # this rank's contiguous share of the global batch
        share = torch.arange(targets.shape[0]).tensor_split(w.size)[w.rank]
        if share.numel() == 0:
            raise ConfigError(f"batch of {targets.shape[0]} items cannot be split over "
                              f"{w.size} processes; raise data.batch_size")
        loss, ok = _losses(self.net, self.data, _rows(inputs, share), targets[share], self.dev,
                           self.dtype, self.cfg["train"].get("label_smoothing", 0.0))
        # sum / global count, times world size: DDP's mean of gradients is then the
        # gradient of the global mean loss
        scaled = loss.sum() * (w.size / n_global)
        self.opt.zero_grad(set_to_none=True)
        scaled.backward()
        return self._apply_step(torch.stack([
            loss.detach().double().sum(), ok.double().sum(),
            torch.tensor(float(ok.numel()), dtype=torch.float64, device=ok.device)]), epoch, step)

    def _record(self, epoch: int, totals: list, dt: float) -> bool:
        """Validate, keep the best weights, stop early, write metrics and checkpoints."""
        t_cfg, state = self.cfg["train"], self.state
        tot_loss, tot_ok, tot_n = totals
        val = evaluate(self.model, self.data, self.cfg, "val", self.dev, self.sampled)
        row = {"epoch": epoch, "train_loss": tot_loss / tot_n, "train_acc": tot_ok / tot_n,
               "val_loss": val["loss"], "val_acc": val["acc"], "time_s": round(dt, 4),
               "items_per_s": round(tot_n / max(dt, 1e-9), 1),
               "lr": self.opt.param_groups[0]["lr"]}
        state["history"].append(row)
        if _improved(self.cfg, val, state["best"]):
            state["best"] = val["loss"] if t_cfg["monitor"] == "val_loss" else val["acc"]
            state["best_epoch"], state["bad_epochs"] = epoch, 0
            self.best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        else:
            state["bad_epochs"] += 1
        if t_cfg["patience"] and state["bad_epochs"] >= t_cfg["patience"]:
            state["stopped"] = True
        last = epoch == t_cfg["epochs"] or state["stopped"]
        if self.w.main:
            self._write(epoch, row, last)
        D.barrier()
        return last

    def _write(self, epoch: int, row: dict, last: bool) -> None:
        t_cfg = self.cfg["train"]
        write_metrics(self.run, self.state["history"])
        if self.tb is not None:
            for k, v in row.items():
                if k != "epoch" and v is not None:  # None: not validated this epoch
                    self.tb.add_scalar(k, v, epoch)
        every = t_cfg["checkpoint_every"]
        # every N epochs, or (0) whenever checkpoint_seconds have passed: a checkpoint
        # costs a few fsyncs, far more than an epoch of a small graph model
        due = epoch % every == 0 if every else \
            time.monotonic() - self.last_ckpt >= t_cfg["checkpoint_seconds"]
        if last or due:
            self.checkpoint(epoch)
        if self.progress:
            print(self._line(row), flush=True)

    def _line(self, row: dict) -> str:
        return (f"epoch {row['epoch']:3d}  train_loss {row['train_loss']:.4f}  "
                f"val_loss {row['val_loss']:.4f}  val_acc {row['val_acc']:.4f}  "
                f"{row['items_per_s']:.0f} items/s")

    def finish(self) -> dict:
        """The result: the best-validation weights evaluated on the test split, written out."""
        model, data, cfg, state, w = self.model, self.data, self.cfg, self.state, self.w
        if self.best_state is not None:
            model.load_state_dict(self.best_state)
        test = evaluate(model, data, cfg, "test", self.dev, self.sampled) \
            if "test" in _splits(data) else None
        val = evaluate(model, data, cfg, "val", self.dev, self.sampled)
        result = {"model": cfg.get("name", "model"), "dataset": data.name,
                  "parameters": self.n_params, "epochs": len(state["history"]),
                  "best_epoch": state["best_epoch"], "val_loss": val["loss"],
                  "val_acc": val["acc"], "test_loss": test["loss"] if test else None,
                  "test_acc": test["acc"] if test else None,
                  "early_stopped": state["stopped"], "world_size": w.size,
                  "train_time_s": round(sum(h["time_s"] for h in state["history"]), 3)}
        if w.main and data.task == "g2p":
            result.update(decode_result(model, data, cfg))
        if w.main:
            save_weights(self.run / "best.safetensors", model.state_dict(),
                         {"epoch": state["best_epoch"]})
            atomic_write_json(self.run / "result.json", result)
            if state["history"]:
                plot_curves(self.run, state["history"])
            if self.tb is not None:
                self.tb.close()
        D.barrier()
        return result


# -- link prediction -----------------------------------------------------------------------------
#: the trainer's split names -> a knowledge graph's
_KG_SPLITS = {"train": "train", "val": "valid", "test": "test"}
_RANKS = ("mrr", "hits@1", "hits@3", "hits@10")


def check_world_size(cfg: dict, size: int) -> None:
    """Refuse (ConfigError) a run of ``cfg`` over ``size`` processes that it cannot use."""
    # the 1-vs-all loss needs every entity vector on each process: DDP would gain little
    if is_link(cfg):
        raise ConfigError(f"link-prediction ([model.link]) training runs in one process; "
                          f"--nproc {size} (DDP) is not supported for it: use --nproc 1")


def _link_known(data) -> Tensor:
    # the filter of the standard filtered setting: every true triple of every split
    return torch.cat([data.train, data.valid, data.test])


@torch.no_grad()
def evaluate_link(model: nn.Module, data, cfg: dict, split: str, limit: int = 0,
                  known: Tensor | None = None) -> dict:
    """Filtered and raw MRR, MR and Hits@1/3/10 (``sc.kg.evaluate``, both directions, filtered
    by train + valid + test) of a link predictor on ``split`` (``val``: the valid triples), its
    first ``limit`` triples (0: all); ``n`` is the number of rankings."""
    from .kg import link_metrics

    triples = data.split(_KG_SPLITS[split])
    if limit:
        triples = triples[:limit]
    dev, was = next(model.parameters()).device, model.training
    known = _link_known(data) if known is None else known
    m = link_metrics(model, triples.to(dev), known, cfg["data"]["eval_batch_size"])
    model.train(was)
    return {**m, "n": 2 * int(triples.shape[0])}


class _LinkTrainer(_Trainer):
    """A link predictor's run (``[model.link]``): shuffled batches of training queries (each
    triple, and its inverse (t, r + R, h) for 1-vs-all or a reciprocal decoder), the loss of
    ``sc.kg`` (1-vs-all or negative sampling, label smoothing, N3/L2), filtered validation
    ranking every ``eval_every`` epochs; checkpoints, resume and best weights as other tasks."""

    def __init__(self, *args):
        from .kg import LinkObjective, training_queries

        super().__init__(*args)
        self.spec = sp = link_train_spec(self.cfg)
        self.objective = LinkObjective(sp["mode"], float(sp["label_smoothing"]),
                                       None if sp["reg"] == "none" else sp["reg"],
                                       float(sp["reg_weight"]), sp["negatives"])
        self.queries = training_queries(self.model, self.data.train, sp["mode"]).to(self.dev)
        self.known = _link_known(self.data)

    def epoch(self, epoch: int) -> bool:
        """One pass over the training queries (``sc.kg.link_epoch``), validation ranking when
        due, checkpoint; stopped at a batch boundary on a signal (and resumed there)."""
        from .kg import link_epoch

        B = self.cfg["data"]["batch_size"]
        n_steps = -(-self.queries.shape[0] // B)
        done, totals, before = self._position(epoch)
        start = None
        if done:  # where a mid-epoch checkpoint left the epoch, its generator included
            start = {"step": done, "loss_sum": totals[0], "count": int(totals[2]),
                     "generator": self.extra["epoch_generator"]}
        t0 = time.perf_counter() - before
        bar = Progress(self.progress, epoch, n_steps, done)
        secs, every = self.cfg["train"]["checkpoint_seconds"], self.cfg["train"]["checkpoint_every"]

        def stop() -> bool:  # asked after each step: a signal, or a checkpoint due by time
            return self.stop.requested or bool(
                not every and secs and time.monotonic() - self.last_ckpt >= secs)
        try:
            while True:
                stats = link_epoch(self.model, self.queries, self.opt, self.objective,
                                   batch_size=B, seed=self.cfg["seed"], epoch=epoch,
                                   grad_clip=self.cfg["train"]["grad_clip"], start=start,
                                   stop=stop, on_step=lambda step, loss: bar.update(
                                       step + 1, loss,
                                       (step + 1) * B / max(time.perf_counter() - t0, 1e-9)))
                if not stats["stopped"]:
                    break
                start = pos = stats["position"]
                sums = [pos["loss_sum"], 0.0, float(pos["count"])]
                self._boundary(epoch, pos["step"], n_steps, sums, t0, self.stop.requested,
                               {"epoch_generator": pos["generator"]})
            self.stop_seen = self.stop.requested  # a signal during the epoch's last step
        except ValueError as e:  # a non-finite loss
            raise TrainingError(f"{e} (train.lr is {self.cfg['train']['lr']})") from None
        finally:
            bar.close()
        n = stats["queries"]
        return self._record(epoch, [stats["loss"] * n, 0.0, n], time.perf_counter() - t0)

    def _record(self, epoch: int, totals: list, dt: float) -> bool:
        """Rank the validation triples when due, keep the best weights by the monitor, stop
        early, write metrics and checkpoints."""
        t_cfg, state, sp = self.cfg["train"], self.state, self.spec
        row = {"epoch": epoch, "loss": totals[0] / totals[2],
               **{f"val_{k}": None for k in _RANKS}, "seconds": round(dt, 4),
               "lr": self.opt.param_groups[0]["lr"]}
        last = epoch == t_cfg["epochs"]
        if epoch % sp["eval_every"] == 0 or last:
            m = evaluate_link(self.model, self.data, self.cfg, "val", sp["val_limit"], self.known)
            row.update({f"val_{k}": m[k] for k in _RANKS})
            score = row[t_cfg["monitor"]]
            if state["best"] is None or score > state["best"]:
                state["best"], state["best_epoch"], state["bad_epochs"] = score, epoch, 0
                self.best_state = {k: v.detach().clone()
                                   for k, v in self.model.state_dict().items()}
            else:
                state["bad_epochs"] += 1
            if t_cfg["patience"] and state["bad_epochs"] >= t_cfg["patience"]:
                state["stopped"] = True
        state["history"].append(row)
        last = last or state["stopped"]
        self._write(epoch, row, last)
        return last

    def _line(self, row: dict) -> str:
        val = "  ".join(f"{k} {row[k]:.4f}" for k in ("val_mrr", "val_hits@1", "val_hits@10")
                        if row[k] is not None)
        rate = self.queries.shape[0] / max(row["seconds"], 1e-9)
        return (f"epoch {row['epoch']:3d}  loss {row['loss']:.4f}  {val}{'  ' if val else ''}"
                f"{rate:.0f} queries/s")

    def finish(self) -> dict:
        """The best-validation weights ranked on the full valid and test sets, written out."""
        model, data, cfg, state = self.model, self.data, self.cfg, self.state
        if self.best_state is not None:
            model.load_state_dict(self.best_state)
        t0 = time.perf_counter()
        test = evaluate_link(model, data, cfg, "test", 0, self.known)
        val = evaluate_link(model, data, cfg, "val", 0, self.known)
        result = {"model": cfg.get("name", "model"), "dataset": data.name, "task": "link",
                  "parameters": self.n_params, "epochs": len(state["history"]),
                  "best_epoch": state["best_epoch"],
                  **{f"val_{k}": val[k] for k in _RANKS}, **{f"test_{k}": test[k] for k in _RANKS},
                  "val": val, "test": test, "early_stopped": state["stopped"], "world_size": 1,
                  "train_time_s": round(sum(h["seconds"] for h in state["history"]), 3),
                  "eval_time_s": round(time.perf_counter() - t0, 3)}
        save_weights(self.run / "best.safetensors", model.state_dict(),
                     {"epoch": state["best_epoch"]})
        atomic_write_json(self.run / "result.json", result)
        if state["history"]:
            plot_curves(self.run, state["history"], LINK_PANELS)
        if self.tb is not None:
            self.tb.close()
        return result


def decode_result(model: nn.Module, data, cfg: dict, splits=("val", "test")) -> dict:
    """A sequence-to-sequence model's decoding of every word of ``splits`` with the config's
    ``beam`` (1: greedy): ``{<split>_per, <split>_wer}`` in percent, and ``beam``."""
    beam = seq2seq_spec(cfg)["beam"]
    out: dict = {"beam": beam}
    for split in splits:
        r = decode_scores(model, data, _G2P_SPLITS.get(split, split), beam)
        out[f"{split}_per"], out[f"{split}_wer"] = r["per"], r["wer"]
    return out


def _splits(data) -> set:
    return set(data.masks) if data.task == "node" else set(data.splits)


def load_run(run: str | Path, weights: str = "best", device: str = "cpu",
             allow_imports: bool = False):
    """(cfg, data, model) of a finished or checkpointed run, weights ``best`` or ``last``.
    The run directory is data: its config's import-path kinds are refused (``ImportRefused``)
    unless ``allow_imports``."""
    run = Path(run)
    if not run.is_dir():
        raise CheckpointError(f"{run}: run directory not found")
    if not (run / "config.json").is_file():
        raise CheckpointError(f"{run}: not a run directory (no config.json); give a directory "
                              "made by structconv train")
    with untrusted(run, allow_imports):
        cfg = prepare_run(run, None, resume=True)
        data = load_data(cfg)
        model = build_model(cfg, data).to(resolve_device(device))
    if weights == "best":
        path = run / "best.safetensors"
        if path.is_file():
            sd = load_weights(path)
        else:  # an interrupted run: its best weights live in the last checkpoint
            ck = load_checkpoint(run)
            sd = ck["best"] or ck["model"]
    elif weights == "last":
        sd = load_checkpoint(run)["model"]
    else:
        sd = load_model_weights(weights)
    check_fits(model, sd, weights if weights not in ("best", "last") else run)
    model.load_state_dict(sd)
    return cfg, data, model


class _EntryPoint(types.ModuleType):
    """This module, callable: ``sc.train(...)`` is ``structconv.train.train(...)``.

    The package exports ``train``, the function, under the name of this module. Python sets
    ``structconv.train`` to the module whenever it is first imported (``from structconv.train
    import ...`` anywhere), which would replace an exported function; a callable module keeps
    ``sc.train(config, out=...)`` and ``sc.train.load_data`` both working, whatever was
    imported first.
    """

    def __call__(self, *args, **kwargs):
        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _EntryPoint
sys.modules[__name__].__signature__ = inspect.signature(train)

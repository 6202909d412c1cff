"""A config -> a run directory: ``train`` builds the task, model and optimizer a config
describes and runs the loop (``structconv.training.loop``) over them.

A run directory holds ``config.json``, ``metrics.jsonl`` and ``metrics.csv`` (one row per epoch),
``curves.png``, checkpoints (``checkpoint.json`` + ``ckpt-*.safetensors``), ``best.safetensors``
(weights of the best validation epoch) and ``result.json``; ``.lock`` while a run writes it.
Data order, dropout and every other random draw derive from the seed and the epoch, and the RNG
states travel in the checkpoint, so a resumed run ends exactly as an uninterrupted one. With
``WORLD_SIZE > 1`` each global batch is split across the processes and the per-process losses
are scaled so that DDP's gradient average is the gradient of the global batch's mean loss.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from torch import nn

from ..config import ConfigError, apply_overrides, config_from, is_link, validate
from ..io import RunLock, atomic_write_json
from ..models.build import build_model, check_memory, estimated_from_config
from ..registry import untrusted
from . import distributed as D
from .checkpoint import (
    CheckpointError,
    check_fits,
    load_checkpoint,
    load_model_weights,
    load_weights,
)
from .common import (
    TrainingError,
    count_parameters,
    default_run_dir,
    prepare_run,
    resolve_device,
    resume_command,
)
from .interrupt import StopRequest
from .loop import Loop
from .optim import make_optimizer as named_optimizer
from .optim import param_groups
from .runlog import progress_mode
from .tasks import check_train_split, load_data, task_for

__all__ = ["train", "load_run", "make_optimizer", "first_layer_groups", "check_world_size",
           "batch_norm_note"]


def make_optimizer(cfg: dict, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of ``cfg['train']`` over the model's trainable parameters (biases, norms
    and embeddings without weight decay where ``train.no_decay`` names them; only the first
    layer's with it where ``train.decay = "first"``)."""
    t = cfg["train"]
    no_decay = t.get("no_decay") or ()
    if t.get("decay", "all") == "first":
        params = first_layer_groups(model, t["weight_decay"])
    else:
        params = param_groups(model, t["weight_decay"], no_decay) if no_decay else \
            model.parameters()
    return named_optimizer(t["optimizer"], params, t["lr"], t["weight_decay"], t["momentum"],
                           t.get("betas", (0.9, 0.999)))


def first_layer_groups(model: nn.Module, weight_decay: float) -> list:
    """Two parameter groups: the first layer's parameters with ``weight_decay``, the rest
    without (``train.decay = "first"``: the L2 of Kipf & Welling and of R-GCN)."""
    first = getattr(model, "first_layer_parameters", None)
    if first is None:
        raise ConfigError(f"train.decay = \"first\": a {type(model).__name__} does not name "
                          "its first layer; use train.decay = \"all\"")
    ids = {id(p) for p in first()}
    return [{"params": [p for p in model.parameters() if id(p) in ids],
             "weight_decay": weight_decay},
            {"params": [p for p in model.parameters() if id(p) not in ids],
             "weight_decay": 0.0}]


#: what a resumed run may be given (``train(resume=True, overrides=...)``): how long it trains.
#: Every draw derives from (seed, epoch), so the epochs a run has trained are those of a
#: longer run of the same config, and more epochs continue it as that run would have gone on
RESUME_KEYS = ("train.epochs", "train.time_limit")


def _check_resume_overrides(overrides) -> None:
    """Refuse (TrainingError) a resumed run's override of any key but ``RESUME_KEYS``."""
    for item in overrides:
        key = str(item).split("=", 1)[0].strip()
        if key not in RESUME_KEYS:
            raise TrainingError(f"resume=True continues the run in `out` with the config saved "
                                f"there; an override may only train it longer ("
                                f"{', '.join(RESUME_KEYS)}), got {str(item)[:80]!r}")


def lengthened(cfg: dict, overrides, source: str) -> dict:
    """The saved config ``cfg`` of a run with its length's ``overrides`` (``RESUME_KEYS``)
    applied and validated; ConfigError where ``train.epochs`` would shrink (the epochs a
    run has trained are not undone)."""
    new = validate(apply_overrides(cfg, overrides), source)
    was, now = cfg["train"]["epochs"], new["train"]["epochs"]
    if now < was:
        raise ConfigError(f"{source}: train.epochs may only grow when a run is resumed: the run "
                          f"has {was}, got {now}")
    return new


def check_world_size(cfg: dict, size: int) -> None:
    """Refuse (ConfigError) a run of ``cfg`` over ``size`` processes that it cannot use."""
    # the 1-vs-all loss needs every entity vector on each process: DDP would gain little
    if is_link(cfg):
        raise ConfigError(f"link-prediction ([model.link]) training runs in one process; "
                          f"--nproc {size} (DDP) is not supported for it: use --nproc 1")


#: the batch norms whose statistics are per process under DDP (torch's SyncBatchNorm is not one)
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def batch_norm_note(model: nn.Module, size: int) -> str | None:
    """The run log's note for a model with batch norms trained over ``size`` > 1 processes
    (None otherwise): each process normalises by its own share of a batch, as torch's DDP
    does without ``SyncBatchNorm`` (torch 2.13's refuses CPU tensors: it runs on CUDA, HPU,
    XPU or a PrivateUse1 device), so the run does not equal a 1-process run."""
    n = sum(isinstance(m, BATCH_NORMS) for m in model.modules())
    if size <= 1 or not n:
        return None
    return (f"note: the model has {n} batch norm layer(s): under DDP each of the {size} "
            "processes normalises by the statistics of its own share of a batch (torch's DDP "
            "without SyncBatchNorm, which refuses CPU tensors), so this run's numbers differ "
            "from a 1-process run's; see docs/guide/scale.md")


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
        if config is not None or seed is not None:
            raise TrainingError("resume=True continues the run in `out` with the config saved "
                                "there: give no config or seed (overrides: only "
                                + " and ".join(RESUME_KEYS) + ", to train it longer)")
        _check_resume_overrides(overrides)
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
    result = _run(cfg, run, device, resume, progress, stop_after, lock, allow_imports,
                  list(overrides) if resume else [])
    return {**result, "run": str(run)}


def _run(cfg: dict | None, run: Path, device: str, resume: bool, progress, stop_after: int,
         lock: bool, allow_imports: bool = False, longer: list | None = None) -> dict:
    """Build the run, train its epochs left (or ``stop_after`` of them), finish it."""
    main = int(os.environ.get("RANK", "0")) == 0
    # taken at the run's first write (nothing is written for a refused config)
    run_lock = RunLock(run, "structconv train") if lock and main else None
    with run_lock or contextlib.nullcontext(), StopRequest() as stop:
        # a resumed run's config is validated and its model built as data (no imports)
        with untrusted(run, allow_imports) if resume else contextlib.nullcontext():
            loop, n_params = _build(cfg, run, device, resume, progress, stop, run_lock,
                                    longer or [])
        out = loop.fit(stop_after)
        if out is not None:
            return out
        result = loop.finish(n_params)
        if main and (run_lock is not None or not lock):
            # a finished run is no longer written: its lock file goes while the lock is held
            # (here, or by the caller: ``structconv train --nproc``'s parent)
            (run / ".lock").unlink(missing_ok=True)
        return result


def _build(cfg: dict | None, run: Path, device: str, resume: bool, progress, stop: StopRequest,
           run_lock: RunLock | None, longer: list) -> tuple[Loop, int]:
    """The loop of a run: its data and task, the model (after the memory check), optimizer,
    the run directory written or the checkpoint resumed (``longer``: its length's overrides,
    ``RESUME_KEYS``)."""
    w = D.init(device)
    dev = resolve_device(device)
    if dev.type == "cuda" and w.size > 1:
        dev = torch.device("cuda", w.local_rank)
    saved = cfg = prepare_run(run, cfg, resume)
    if longer:
        cfg = lengthened(cfg, longer, str(run / "config.json"))
    data = load_data(cfg)
    check_train_split(data)
    task = task_for(cfg, data)
    grows = cfg["train"]["epochs"] > saved["train"]["epochs"]
    if grows and task.schedules_by_epochs(cfg):
        raise TrainingError(f"{run}: this run's schedule spans its train.epochs "
                            f"({saved['train']['epochs']}), so more epochs would not continue "
                            "it as one longer run: start a new run")
    # the memory check reads the config before any model is built (a model too large for
    # the machine is refused before it takes the memory); the seed is set again after it,
    # so the model is the one a run without the check would build
    est = check_memory(cfg, data, dev) if estimated_from_config(cfg) else None
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg, data)
    if est is None:  # declared layers: the estimate reads the built model
        check_memory(cfg, data, dev, model)
    model = model.to(dev)
    opt = make_optimizer(cfg, model)
    task.setup(model, dev, w)
    if w.size > 1:
        check_world_size(cfg, w.size)
        note = batch_norm_note(model, w.size)
        if note and w.main:
            print(note, flush=True)
    loop = Loop(task, model, opt, cfg["train"], seed=cfg["seed"], name=cfg.get("name", "model"),
                run=run, world=w, dev=dev, progress=progress_mode(progress), stop=stop,
                resume_hint=resume_command(run, cfg, w.size))
    if run_lock is not None:
        run_lock.acquire()
        if not resume:  # under the lock: another run may have finished here meanwhile
            prepare_run(run, cfg, False)
    if resume:
        loop.resume()
        if cfg is not saved and w.main:  # a longer run: its config says so from now on
            atomic_write_json(run / "config.json", cfg)
            if grows:  # and it is not finished until its new last epoch
                (run / "result.json").unlink(missing_ok=True)
    elif w.main:
        run.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run / "config.json", cfg)
    D.barrier()
    loop.open_log()
    return loop, count_parameters(model)


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

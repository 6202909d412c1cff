"""What every part of a run shares: its errors, devices, run directory and resume command."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import torch
from torch import nn

from ..config import import_paths, validate
from ..registry import untrusted
from .checkpoint import CHECKPOINT_JSON, CheckpointError

__all__ = ["TrainingError", "resolve_device", "count_parameters", "prepare_run",
           "resume_command", "default_run_dir"]


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


def default_run_dir(name: str) -> Path:
    """``runs/<name>-<date>-<time>``, the name made one safe directory name (no separators,
    no leading dots: a config's ``name = "../../x"`` must not escape ``runs/``)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).lstrip(".") or "run"
    return Path("runs") / f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"

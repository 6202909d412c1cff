"""Checkpoints without pickle: tensors in safetensors, everything else in JSON, atomic commits.

A run directory holds ``ckpt-EEEEEE.safetensors`` (model, best model, optimizer tensors, RNG
states; ``ckpt-EEEEEE-SSSSSS.safetensors`` when taken SSSSSS steps into the next epoch) and
``checkpoint.json``, which names that file with its sha256 and holds the scalars (epoch,
optimizer hyper-parameters and scalar state, trainer state, Python RNG state). The JSON is
written last, atomically, so it always points at a complete tensor file: a run killed at any
moment resumes from the last committed checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..io import atomic_write_bytes, atomic_write_json

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "save_weights",
           "load_weights", "tensors_digest", "optimizer_split", "optimizer_join", "rng_state",
           "set_rng_state", "check_optimizer_state", "resume_training", "check_fits",
           "load_model_weights", "CHECKPOINT_JSON"]

CHECKPOINT_JSON = "checkpoint.json"
FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt or does not fit the model."""


def _tensors(d: dict, prefix: str) -> dict:
    # safetensors refuses shared or non-contiguous storage: store independent contiguous copies
    return {f"{prefix}{k}": v.detach().to("cpu").contiguous().clone() for k, v in d.items()}


def optimizer_split(state: dict) -> tuple[dict, dict]:
    """An optimizer ``state_dict`` -> (tensors by ``"i.key"``, JSON-able scalars)."""
    tensors, scalars = {}, {}
    for i, st in state["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{i}.{k}"] = v
            else:
                scalars[f"{i}.{k}"] = v
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
              for g in state["param_groups"]]
    return tensors, {"scalars": scalars, "param_groups": groups}


def optimizer_join(tensors: dict, meta: dict) -> dict:
    """Inverse of ``optimizer_split``: the ``state_dict`` to load into the optimizer."""
    state: dict = {}
    for key, v in list(tensors.items()) + list(meta["scalars"].items()):
        i, k = key.split(".", 1)
        state.setdefault(int(i), {})[k] = v
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


def rng_state() -> tuple[dict, dict]:
    """(tensors, JSON) of the torch, CUDA, NumPy and Python random states."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    np_state = np.random.get_state()
    tensors["numpy"] = torch.from_numpy(np_state[1].astype(np.int64))
    py = random.getstate()
    meta = {"python": [py[0], list(py[1]), py[2]],
            "numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])]}
    return tensors, meta


def set_rng_state(tensors: dict, meta: dict) -> None:
    """Restore what ``rng_state`` saved."""
    torch.set_rng_state(tensors["torch"])
    cuda = sorted(k for k in tensors if k.startswith("cuda."))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    n = meta["numpy"]
    np.random.set_state((n[0], tensors["numpy"].numpy().astype(np.uint32), n[1], n[2], n[3]))
    p = meta["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


def tensors_digest(tensors: dict) -> str:
    """sha256 of named tensors: names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach().to("cpu").contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_weights(path, state_dict: dict, metadata: dict | None = None) -> None:
    """Atomically write a model ``state_dict`` as safetensors, with its sha256 in the header."""
    tensors = _tensors(state_dict, "")
    meta = {k: str(v) for k, v in (metadata or {}).items()}
    meta["sha256"] = tensors_digest(tensors)
    atomic_write_bytes(path, st_save(tensors, metadata=meta))


def _header_metadata(data: bytes) -> dict:
    """The ``__metadata__`` of a safetensors file's JSON header ({} where there is none)."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}



def _safetensors_bytes(path: Path) -> bytes:
    """The bytes of the weights file ``path`` (CheckpointError where there is none)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found (expected a safetensors file)")
    return path.read_bytes()


def load_weights(path, verify: bool = True) -> dict:
    """A model ``state_dict`` from a safetensors file written by ``save_weights``.

    With ``verify``, the file must carry its checksum and match it, and every floating tensor
    must be finite: a tampered, truncated or NaN-filled weights file is refused, never used.
    """
    path = Path(path)
    data = _safetensors_bytes(path)
    try:
        tensors = st_load(data)
        meta = _header_metadata(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors file ({e})") from None
    if not verify:
        return tensors
    if "sha256" not in meta:
        raise CheckpointError(f"{path}: the weights carry no checksum (not written by structconv "
                              "save_weights, or by a version before checksums)")
    if tensors_digest(tensors) != meta["sha256"]:
        raise CheckpointError(f"{path}: corrupt weights (sha256 differs from the one recorded "
                              "in the file)")
    for k, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: tensor {k!r} holds NaN or infinite values")
    return tensors


def save_checkpoint(run_dir, epoch: int, model_state: dict, optimizer_state: dict,
                    trainer: dict, best_state: dict | None = None, keep: int = 2,
                    step: int | None = None, extra: dict | None = None) -> Path:
    """Write ``ckpt-<epoch>.safetensors`` then commit ``checkpoint.json``; prune old files.

    ``epoch`` is the last completed epoch; a checkpoint taken within the next one (after
    ``step`` of its steps; the trainer state says where) gets a file of its own,
    ``ckpt-<epoch>-<step>.safetensors``, so the committed one is never overwritten."""
    run_dir = Path(run_dir)
    opt_t, opt_meta = optimizer_split(optimizer_state)
    rng_t, rng_meta = rng_state()
    tensors = {**_tensors(model_state, "model."), **_tensors(opt_t, "optim."),
               **_tensors(rng_t, "rng.")}
    if best_state is not None:
        tensors.update(_tensors(best_state, "best."))
    if extra:
        tensors.update(_tensors(extra, "extra."))
    data = st_save(tensors)
    name = f"ckpt-{epoch:06d}.safetensors" if step is None else \
        f"ckpt-{epoch:06d}-{step:06d}.safetensors"
    atomic_write_bytes(run_dir / name, data)
    atomic_write_json(run_dir / CHECKPOINT_JSON, {
        "format": FORMAT, "epoch": epoch, "file": name,
        "sha256": hashlib.sha256(data).hexdigest(), "optimizer": opt_meta, "rng": rng_meta,
        "trainer": trainer, "has_best": best_state is not None,
    })
    # only after the commit may older tensor files go
    old = sorted(run_dir.glob("ckpt-*.safetensors"))
    for p in old[:-keep] if keep else []:
        if p.name != name:
            p.unlink(missing_ok=True)
    return run_dir / name


def _check_structure(meta: dict, where: Path) -> None:
    """Refuse metadata whose fields do not have the shapes that ``save_checkpoint`` writes."""
    rng, opt = meta.get("rng"), meta.get("optimizer")
    checks = {
        "file": isinstance(meta.get("file"), str),
        "trainer": isinstance(meta.get("trainer"), dict),
        "rng": (isinstance(rng, dict) and isinstance(rng.get("python"), list)
                and len(rng["python"]) == 3 and isinstance(rng["python"][1], list)
                and isinstance(rng.get("numpy"), list) and len(rng["numpy"]) == 4),
        "optimizer": (isinstance(opt, dict) and isinstance(opt.get("scalars"), dict)
                      and isinstance(opt.get("param_groups"), list)
                      and all(isinstance(g, dict) for g in opt["param_groups"])),
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        what = "optimizer metadata" if bad == ["optimizer"] else "checkpoint metadata"
        raise CheckpointError(f"{where}: corrupt {what} (the {', '.join(bad)} field"
                              f"{'s do' if len(bad) > 1 else ' does'} not have the structure "
                              "structconv writes)")


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


#: optimizer hyper-parameters that torch's constructors require to be >= 0
_NON_NEGATIVE = ("lr", "eps", "weight_decay", "momentum", "dampening", "lr_decay",
                 "initial_accumulator_value")


def _group_problem(i: int, g: dict) -> str | None:
    """A hyper-parameter of optimizer parameter group ``i`` out of the range torch's
    constructors allow (None: none is). Kinds (a number, a list, a bool) are the trainer's to
    check against its fresh optimizer; the range of a number is checked here."""
    for k in _NON_NEGATIVE:
        v = g.get(k)
        if _real(v) and v < 0:
            return f"param_groups[{i}].{k} must be >= 0, got {v!r}"
    b = g.get("betas")
    if isinstance(b, list) and not all(0 <= u < 1 for u in b if _real(u)):
        return f"param_groups[{i}].betas must lie in [0, 1), got {b!r}"
    return None


def _scalar_problem(meta: dict) -> str | None:
    """The first scalar of checkpoint metadata (already of the right structure) that is not
    what ``save_checkpoint`` writes, as ``field must be ..., got ...`` (None: all are)."""
    epoch, name, digest = meta["epoch"], meta["file"], meta["sha256"]
    if not (_int(epoch) and epoch >= 0):
        return f"epoch must be an int >= 0, got {epoch!r}"
    if not name or Path(name).name != name or not name.endswith(".safetensors"):
        return f"file must be the name of a .safetensors file in the run directory, got {name!r}"
    if not (isinstance(digest, str) and len(digest) == 64 and
            all(c in "0123456789abcdef" for c in digest)):
        return f"sha256 must be 64 lowercase hex digits, got {digest!r}"
    if not isinstance(meta.get("has_best", False), bool):
        return f"has_best must be true or false, got {meta['has_best']!r}"
    version, words, gauss = meta["rng"]["python"]
    if version != 3 or len(words) != 625 or not all(_int(w) and 0 <= w < 2**32 for w in words):
        return "rng.python must be Python's random state (version 3, 625 ints in [0, 2^32))"
    if not (gauss is None or _real(gauss)):
        return f"rng.python's gauss must be null or a finite number, got {gauss!r}"
    kind, pos, has_gauss, cached = meta["rng"]["numpy"]
    if kind != "MT19937" or not (_int(pos) and 0 <= pos <= 624) or has_gauss not in (0, 1) \
            or not _real(cached):
        return ("rng.numpy must be NumPy's state [\"MT19937\", position 0..624, has_gauss 0 "
                f"or 1, a finite number], got {meta['rng']['numpy']!r}")
    return None


def load_checkpoint(run_dir) -> dict:
    """The committed checkpoint of a run: ``{epoch, model, best, optimizer, rng, trainer,
    extra}``."""
    run_dir = Path(run_dir)
    meta_path = run_dir / CHECKPOINT_JSON
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: run directory not found")
    if not meta_path.is_file():
        raise CheckpointError(f"{meta_path}: no checkpoint to resume from (file not found)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            raise CheckpointError(f"{meta_path}: corrupt checkpoint metadata (a JSON "
                                  f"{type(meta).__name__}, expected an object)")
        epoch, name, digest = meta["epoch"], meta["file"], meta["sha256"]
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT}")
        _check_structure(meta, meta_path)
        problem = _scalar_problem(meta)
        if problem:
            raise CheckpointError(f"{meta_path}: corrupt checkpoint metadata ({problem})")
        for i, g in enumerate(meta["optimizer"]["param_groups"]):
            problem = _group_problem(i, g)
            if problem:
                raise CheckpointError(f"{meta_path}: corrupt optimizer metadata ({problem})")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, UnicodeDecodeError,
            RecursionError) as e:
        if isinstance(e, CheckpointError):
            raise
        what = f"field {e} is missing" if isinstance(e, KeyError) else str(e)
        raise CheckpointError(f"{meta_path}: corrupt checkpoint metadata ({what})") from None
    path = run_dir / name
    if not path.is_file():
        raise CheckpointError(f"{path}: tensor file named by {meta_path} not found")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointError(f"{path}: corrupt checkpoint (sha256 differs from {meta_path})")
    try:
        tensors = st_load(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors file ({e})") from None

    def part(prefix):
        return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}

    try:
        optimizer = optimizer_join(part("optim."), meta["optimizer"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{meta_path}: corrupt optimizer metadata ({e})") from None
    if "torch" not in part("rng.") or "numpy" not in part("rng."):
        raise CheckpointError(f"{path}: the random-number states are missing")
    return {"epoch": epoch, "model": part("model."), "best": part("best.") or None,
            "optimizer": optimizer, "rng": (part("rng."), meta["rng"]),
            "trainer": meta["trainer"], "extra": part("extra.")}


def _value_kind(v) -> str:
    if v is None or isinstance(v, bool):
        return "a bool or null"
    if isinstance(v, (int, float)):
        return "a finite number"
    if isinstance(v, (list, tuple)):
        return f"a list of {len(v)} numbers"
    return type(v).__name__


def check_optimizer_state(fresh: dict, saved: dict, where) -> None:
    """The saved optimizer state has the fresh optimizer's parameter groups (count, params,
    keys, value kinds) and per-parameter state of its own parameters: a JSON field edited
    by hand is named instead of failing inside the optimizer's arithmetic."""
    def bad(what: str):
        raise CheckpointError(f"{where}: corrupt optimizer metadata ({what})")

    groups = saved.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(fresh["param_groups"]):
        bad(f"param_groups must be a list of {len(fresh['param_groups'])}")
    for i, (f, g) in enumerate(zip(fresh["param_groups"], groups)):
        if not isinstance(g, dict) or set(g) != set(f):
            bad(f"param_groups[{i}] must have the keys {', '.join(sorted(f))}")
        if g["params"] != f["params"]:
            bad(f"param_groups[{i}].params must be {f['params']}, got {g['params']!r}")
        for k, v in f.items():
            w = g[k]
            if k == "params":
                continue
            nums = [w] if _value_kind(w) == "a finite number" else \
                w if isinstance(w, (list, tuple)) else []
            ok = _value_kind(w) == _value_kind(v) and all(
                isinstance(u, (int, float)) and not isinstance(u, bool) and math.isfinite(u)
                for u in nums)
            if not ok:
                bad(f"param_groups[{i}].{k} must be {_value_kind(v)}, got {w!r}")
    ids = {p for f in fresh["param_groups"] for p in f["params"]}
    for i, st in saved.get("state", {}).items():
        if i not in ids:
            bad(f"state for parameter {i}, which the optimizer does not have")
        for k, v in st.items():
            if not torch.is_tensor(v) and not (isinstance(v, (int, float)) and
                                               not isinstance(v, bool)):
                bad(f"state {i}.{k} must be a tensor or a number, got {v!r}")


def resume_training(run_dir, model: torch.nn.Module, optimizer) -> dict:
    """Restore a training run from its last checkpoint: the optimizer metadata checked against
    the fresh optimizer (a hand-edited field is named), model and optimizer states loaded, the
    RNG states set; returns the checkpoint (``epoch``, ``trainer``, ``best``, ...)."""
    ck = load_checkpoint(run_dir)
    check_optimizer_state(optimizer.state_dict(), ck["optimizer"],
                          Path(run_dir) / CHECKPOINT_JSON)
    check_fits(model, ck["model"], Path(run_dir) / CHECKPOINT_JSON)
    try:
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(f"{run_dir}: checkpoint does not fit the model ({e})") from None
    set_rng_state(*ck["rng"])
    return ck


def check_fits(model: torch.nn.Module, state: dict, where) -> None:
    """Raise CheckpointError naming the keys and shapes when ``state`` does not fit ``model``
    (missing or unexpected keys, differing shapes; the first few of each)."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} is {tuple(state[k].shape)} but the model's is {tuple(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]

    def few(keys: list) -> str:
        return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")

    problems = ([f"missing {few(missing)}"] if missing else []) + \
        ([f"unexpected {few(unexpected)}"] if unexpected else []) + \
        ([few(shapes)] if shapes else [])
    if problems:
        raise CheckpointError(f"{where}: weights do not fit the model ({'; '.join(problems)})")


def load_model_weights(path) -> dict:
    """A model ``state_dict`` from weights written by structconv: ``save_weights``'s file
    (``best.safetensors``), or a checkpoint's tensor file (``ckpt-*.safetensors``), whose
    model part is taken, checked against the sha256 its run's ``checkpoint.json`` records
    when it names the file, and for finite values."""
    path = Path(path)
    data = _safetensors_bytes(path)
    try:
        meta = _header_metadata(data)
        keys = list(st_load(data)) if "sha256" not in meta else []
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors file ({e})") from None
    if "sha256" in meta or not any(k.startswith("model.") for k in keys):
        return load_weights(path)
    committed = path.with_name(CHECKPOINT_JSON)
    try:
        ck_meta = json.loads(committed.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        ck_meta = {}
    if isinstance(ck_meta, dict) and ck_meta.get("file") == path.name and \
            hashlib.sha256(data).hexdigest() != ck_meta.get("sha256"):
        raise CheckpointError(f"{path}: corrupt checkpoint (sha256 differs from {committed})")
    state = {k[len("model."):]: v for k, v in st_load(data).items() if k.startswith("model.")}
    for k, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: tensor {k!r} holds NaN or infinite values")
    return state

"""A recipe's sweep: named runs of shipped configs with overrides, each trained at most once.

A recipe is a set of configs plus a sweep: every run is ``(name, config, overrides)`` trained by
the one training engine (``structconv.training.train``) into its own run directory
``<folder>/<name>``. A run already finished is read back, one left with a checkpoint is resumed,
and one never started is trained, under the run's lock; so an interrupted sweep run again ends
with the numbers of an uninterrupted one, and two processes sharing an ``--out`` never train the
same run twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..config import config_from
from ..training import train
from ..training.run import RESUME_KEYS
from ._common import finished, run_once

__all__ = ["Run", "config_run", "sweep", "check_same_config", "settings_tag", "history", "quoted"]


@dataclass(frozen=True)
class Run:
    """One run of a sweep: its folder name, a config (shipped name, TOML path or dict) and
    ``key=value`` overrides applied over it, in order."""

    name: str
    config: str | Path | dict
    overrides: Sequence[str] = field(default_factory=tuple)


def _flat(d, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def check_same_config(where: Path, run: Run) -> list[str]:
    """Refuse (ValueError naming the keys) a run directory ``where`` made with another config
    than ``run``'s: a sweep never reads back or resumes a run of other options. Only its length
    may differ (``RESUME_KEYS``: more ``train.epochs``, another ``train.time_limit``): returns
    the overrides that continue it so ([] where none differs)."""
    path = where / "config.json"
    if not path.is_file():
        return []
    want = config_from(run.config, list(run.overrides))
    if not want.get("name"):
        want["name"] = "run" if isinstance(run.config, dict) else Path(run.config).stem
    want, saved = _flat(json.loads(json.dumps(want))), _flat(json.loads(path.read_text()))
    diff = sorted(k for k in set(want) | set(saved) if want.get(k) != saved.get(k))
    longer = [k for k in diff if k in RESUME_KEYS]
    was = saved.get("train.epochs")
    if "train.epochs" in longer and not (isinstance(was, int) and want["train.epochs"] > was):
        longer.remove("train.epochs")  # no more epochs than trained: another run
    diff = [k for k in diff if k not in longer]
    if diff:
        raise ValueError(f"{where} was made with another config (" + ", ".join(
            f"{k}: {saved.get(k)!r} there, {want.get(k)!r} now" for k in diff[:4])
            + "): use another --out, or remove it")
    return [f"{k}={json.dumps(want[k])}" for k in longer]


def config_run(folder: str | Path, run: Run, recipe: str, device: str = "cpu") -> dict:
    """The result (``result.json``'s summary) of ``run`` in ``<folder>/<run.name>``: read where
    finished, resumed where a checkpoint was left, trained otherwise (under the run's lock);
    refused (ValueError) where the folder holds a run of another config."""
    folder = Path(folder)
    where = folder / run.name
    longer = check_same_config(where, run)
    grows = any(o.startswith("train.epochs=") for o in longer)

    def read() -> dict | None:
        # a finished run asked for more epochs, or ended by its time limit, goes on
        done = finished(where / "result.json")
        return None if done is not None and (grows or done.get("time_limited")) else done

    def make() -> dict:
        if (where / "checkpoint.json").is_file():
            return train(None, where, resume=True, device=device, overrides=longer)
        return train(run.config, where, device=device, overrides=list(run.overrides))

    return run_once(folder, run.name, recipe, read, make)


def sweep(folder: str | Path, runs: Iterable[Run], recipe: str, device: str = "cpu",
          report: Callable[[Run, dict], None] | None = None) -> list[dict]:
    """The results of ``runs`` in order (each by ``config_run``); ``report(run, result)`` is
    called after each, to print a line as the sweep goes."""
    results = []
    for run in runs:
        result = config_run(folder, run, recipe, device)
        if report is not None:
            report(run, result)
        results.append(result)
    return results


def settings_tag(*parts) -> str:
    """A short hash of a sweep's settings (configs, overrides other than the seed): its runs'
    folder carries it, so a rerun with other settings never reads these runs back."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def history(folder: str | Path, run: Run) -> list[dict]:
    """The metrics rows (one per epoch) of a finished run of a sweep."""
    path = Path(folder) / run.name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def quoted(text) -> str:
    """``text`` as a TOML string, for an override's value (``data.root=...``)."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'

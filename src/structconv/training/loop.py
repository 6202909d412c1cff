"""The training loop: every run of every task is this loop over a ``Task``.

An epoch is a sequence of optimizer steps, each a group of micro-batches (gradient
accumulation), a learning-rate schedule and a step budget counting steps over the run; after
each step ``_boundary`` shows progress, writes a mid-epoch checkpoint when
``train.checkpoint_seconds`` have passed, and on a stop request writes one and raises
``TrainingInterrupted``. A mid-epoch checkpoint records where the epoch stood
(``state["partial"]``: epoch, steps done, running sums, seconds) and what the task needs to go
on (its ``position``); resuming replays the epoch's plan from that step, so the run ends as an
uninterrupted one. After each epoch the task validates; the best score (``train.monitor``, or
the rule ``train.select`` names: ``judge``), patience and the best weights are kept here, for
every task.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from ..io import atomic_write_json
from . import distributed as D
from .checkpoint import (
    CHECKPOINT_JSON,
    CheckpointError,
    resume_training,
    save_checkpoint,
    save_weights,
)
from .common import TrainingError
from .interrupt import StopRequest, TrainingInterrupted
from .optim import lr_factor
from .runlog import Progress, plot_curves, tensorboard, write_metrics

__all__ = ["Loop", "check_trainer_state", "judge"]

#: what ``train.*`` keys the loop reads beyond the config's own, with their defaults
LOOP_DEFAULTS = {"max_steps": 0, "accumulate": 1, "schedule": "constant", "warmup_steps": 0,
                 "amp": False, "monitor": "val_acc", "patience": 0, "grad_clip": 0.0,
                 "checkpoint_every": 0, "checkpoint_seconds": 10.0, "min_lr_ratio": 0.0,
                 "lr_decay": 1.0, "select": "monitor", "time_limit": 0.0}


def judge(select: str, monitor: str, row: dict, best, lower: bool | None = None):
    """(keep this epoch's weights, count it as progress for patience, the new best) of an
    epoch's ``row`` against ``best`` (None before the first) under ``train.select``:
    ``monitor`` keeps a better ``monitor``; ``acc_then_loss`` a higher validation accuracy,
    ties to the lower loss (best: [acc, loss]); ``gat`` keeps where accuracy and loss both
    match or beat their best so far and counts progress where either does (best: [best acc,
    best loss]). ``lower``: whether the monitor is minimised (default: a ``*loss`` monitor)."""
    if select == "monitor":
        score = row[monitor]
        lower = monitor.endswith("loss") if lower is None else lower
        ok = best is None or (score < best if lower else score > best)
        return ok, ok, score if ok else best
    acc, loss = row["val_acc"], row["val_loss"]
    if select == "acc_then_loss":
        ok = best is None or (acc, -loss) > (best[0], -best[1])
        return ok, ok, [acc, loss] if ok else best
    a, lo = (-math.inf, math.inf) if best is None else best
    keep, better = acc >= a and loss <= lo, acc >= a or loss <= lo
    return keep, better, [max(acc, a), min(loss, lo)]


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v, hi: float = math.inf) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi


def check_trainer_state(state, epoch: int, run) -> None:
    """Refuse (CheckpointError naming the field) a checkpoint's trainer state whose fields
    are not what the loop writes: kinds and ranges, the mid-epoch position included."""
    where = Path(run) / CHECKPOINT_JSON

    def bad(field: str, what: str):
        raise CheckpointError(f"{where}: corrupt trainer.{field} ({what})")

    if not isinstance(state, dict):
        bad("state", f"must be an object, got {type(state).__name__}")
    for k in ("best", "best_epoch", "bad_epochs", "history", "stopped"):
        if k not in state:
            bad(k, "missing")
    extra = sorted(set(state) - {"best", "best_epoch", "bad_epochs", "history", "stopped",
                                 "steps", "partial"})
    if extra:
        bad(extra[0], "not a field the trainer writes")
    b = state["best"]
    if b is not None and not _number(b) and not (
            isinstance(b, list) and len(b) == 2 and all(map(_number, b))):
        bad("best", f"must be null or a finite number (or two: accuracy, loss), got {b!r}")
    if not _count(state["best_epoch"], epoch):
        bad("best_epoch", f"must be an int in [0, {epoch}], got {state['best_epoch']!r}")
    if not _count(state["bad_epochs"], epoch):
        bad("bad_epochs", f"must be an int in [0, {epoch}], got {state['bad_epochs']!r}")
    h = state["history"]
    if not isinstance(h, list) or len(h) != epoch or not all(isinstance(r, dict) for r in h):
        bad("history", f"must be a list of {epoch} rows (one per epoch done), got "
                       f"{h if not isinstance(h, list) else f'{len(h)} items'!r}")
    if not isinstance(state["stopped"], bool):
        bad("stopped", f"must be true or false, got {state['stopped']!r}")
    if "steps" in state and not _count(state["steps"]):
        bad("steps", f"must be an int >= 0, got {state['steps']!r}")
    _check_partial(state.get("partial"), epoch, bad)


def _check_partial(part, epoch: int, bad) -> None:
    """A mid-epoch position has the fields the loop writes, in range."""
    if part is None:
        return
    if not isinstance(part, dict) or set(part) != {"epoch", "step", "totals", "seconds"}:
        bad("partial", "must have the keys epoch, step, totals, seconds")
    if part["epoch"] != epoch + 1:
        bad("partial", f"epoch must be {epoch + 1}, the epoch after the checkpoint's, got "
                       f"{part['epoch']!r}")
    if isinstance(part["step"], bool) or not isinstance(part["step"], int) or part["step"] < 1:
        bad("partial", f"step must be an int >= 1, got {part['step']!r}")
    nums = part["totals"] if isinstance(part["totals"], list) else None
    # (a loss sum may be negative: REINFORCE's is, where tours beat their baseline)
    if nums is None or len(nums) != 3 or not all(map(_number, nums)) or not all(
            _number(v) and v >= 0 for v in nums[1:] + [part["seconds"]]):
        bad("partial", "totals must be 3 numbers (correct and items >= 0) and seconds a "
                       "number >= 0")


class Loop:
    """One training run of ``task``'s model with ``optimizer``; ``settings`` is the config's
    ``train`` table (``LOOP_DEFAULTS`` fill what it lacks). ``run``: the directory of its
    checkpoints (None: none), and with ``files`` of its metrics, curves and result."""

    def __init__(self, task, model: nn.Module, optimizer, settings: dict, *, seed: int,
                 name: str = "model", run: Path | None = None, files: bool = True,
                 world: D.World | None = None, dev=None, progress: str | None = None,
                 stop: StopRequest | None = None, resume_hint: str = "", on_row=None):
        self.task, self.model, self.opt = task, model, optimizer
        self.t = {**LOOP_DEFAULTS, **settings}
        self.seed, self.name, self.run, self.files = seed, name, run, files
        self.w = world or D.World()
        self.dev = dev or next(model.parameters()).device
        self.progress, self.stop = progress, stop or StopRequest()
        self.resume_hint, self.on_row = resume_hint, on_row
        self.net = model
        if self.w.size > 1:
            # a size-1 dim's stride is arbitrary: a (1, P, Q) weight's grad can carry another
            # one than DDP's bucket view; the copy it warns about costs nothing at these sizes
            warnings.filterwarnings("ignore", message=".*Grad strides do not match bucket view")
            self.net = nn.parallel.DistributedDataParallel(
                model, device_ids=[self.dev.index] if self.dev.type == "cuda" else None)
        self.state = {"best": None, "best_epoch": 0, "bad_epochs": 0, "history": [],
                      "stopped": False, "steps": 0}
        self.best_state, self.start, self.extra = None, 0, {}
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        #: whether the last step's (global) stop flag asked to stop; the step budget spent
        self.stop_seen, self.spent = False, False
        #: whether train.time_limit ended the last fit
        self.time_limited = False
        self.tb, self.last_ckpt = None, time.monotonic()

    def open_log(self) -> None:
        """Start writing (TensorBoard where installed; the checkpoint clock from now)."""
        if self.files and self.run is not None and self.w.main:
            self.tb = tensorboard(self.run)
        self.last_ckpt = time.monotonic()

    def resume(self) -> None:
        """Continue from the run directory's checkpoint (model, optimizer, RNG, trainer)."""
        ck = resume_training(self.run, self.model, self.opt)
        check_trainer_state(ck["trainer"], ck["epoch"], self.run)
        self.state, self.best_state, self.start = ck["trainer"], ck["best"], ck["epoch"]
        self.state.setdefault("steps", 0)
        self.extra = ck["extra"]
        self.task.load_state(self.extra)
        self.spent = bool(self.t["max_steps"]) and self.state["steps"] >= self.t["max_steps"]

    # -- the run: epochs until the last, a stop or ``stop_after`` -------------------------------
    def fit(self, stop_after: int = 0, time_limit: float | None = None) -> dict | None:
        """Train the epochs left; ``{"interrupted": True, "epoch"}`` after ``stop_after``
        epochs of this call (with a checkpoint), None when the run is done. ``time_limit``
        (default ``train.time_limit``, where 0 is none): seconds of this call after which no
        new epoch starts; the run then ends there (``time_limited``), with a checkpoint that
        a resumed run continues from."""
        t_start, epochs_run = time.perf_counter(), 0
        limit = (self.t["time_limit"] or None) if time_limit is None else time_limit
        self.time_limited = False
        for epoch in range(self.start + 1, self.t["epochs"] + 1):
            if self.state["stopped"] or self.spent:
                break
            last = self.epoch(epoch)
            epochs_run += 1
            if last:
                break
            if self.stop_seen:  # asked at the epoch's last step: stop after its record
                self.checkpoint(epoch)
                self.interrupted(epoch, None)
            if stop_after and epochs_run >= stop_after:
                self.checkpoint(epoch)  # whatever checkpoint_seconds says: the run resumes
                return {"interrupted": True, "epoch": epoch}
            if limit is not None and self._out_of_time(limit, t_start):
                self.checkpoint(epoch)  # whatever checkpoint_seconds says: the run resumes
                self.time_limited = True
                break
        return None

    def _out_of_time(self, limit: float, t_start: float) -> bool:
        """Whether ``limit`` seconds have passed since ``t_start`` on any process (every
        rank stops at the same epoch: one that went on alone would wait in a collective)."""
        late = torch.tensor([float(time.perf_counter() - t_start > limit)], device=self.dev)
        return bool(D.all_reduce_sum(late)[0] > 0)

    def _position(self, epoch: int) -> tuple[int, list, float]:
        """(steps done, running sums, seconds) where this epoch stands: where a mid-epoch
        checkpoint left it, or its start."""
        part = self.state.pop("partial", None)
        if part is not None and part["epoch"] == epoch:
            return part["step"], list(part["totals"]), part["seconds"]
        return 0, [0.0, 0.0, 0.0], 0.0

    def epoch(self, epoch: int) -> bool:
        """Train one epoch, validate, record and checkpoint; True when it is the last."""
        steps = self.steps(epoch)
        while True:
            try:
                next(steps)
            except StopIteration as end:
                return end.value

    def steps(self, epoch: int):
        """One epoch step by step: a generator that yields the global stats (loss sum,
        correct, items, ranks asked to stop) after each optimizer step, then validates,
        records and checkpoints the epoch, returning whether it is the last. ``epoch`` runs it
        through; a caller may advance it a step at a time (several models' loops in turn, a
        step-level hook) without a second loop."""
        done, totals, before = self._position(epoch)
        t0 = time.perf_counter() - before
        self.net.train()
        n_steps, groups = self.task.epoch_steps(epoch, done, self.extra if done else None)
        bar = Progress(self.progress if self.w.main else None, epoch, n_steps, done)
        try:
            for group in groups:
                stats = self._step(group, epoch, done)
                done += 1
                totals = [a + b for a, b in zip(totals, stats[:3].tolist())]
                bar.update(done, totals[0] / totals[2], totals[2] / max(time.perf_counter() - t0,
                                                                         1e-9))
                self.spent = bool(self.t["max_steps"]) and \
                    self.state["steps"] >= self.t["max_steps"]
                if not self.spent:
                    self._boundary(epoch, done, n_steps, totals, t0, bool(stats[3] > 0))
                yield stats
                if self.spent:
                    break
        finally:
            bar.close()
        return self._record(epoch, totals, time.perf_counter() - t0)

    # -- a step: the one backward pass of every task ---------------------------------------------
    def _step(self, group: list, epoch: int, step: int) -> Tensor:
        """One optimisation step over the micro-batches of ``group`` (gradients summed over
        them); the global (loss sum, correct, items, ranks asked to stop)."""
        t = self.t
        if t["schedule"] != "constant" or t["warmup_steps"] or t["lr_decay"] != 1.0:
            # (min_lr_ratio: where the decay ends, as a share of train.lr; lr_decay: per epoch)
            f = lr_factor(t["schedule"], self.state["steps"], t["warmup_steps"],
                          t["max_steps"], t["min_lr_ratio"]) * t["lr_decay"] ** (epoch - 1)
            for g, base in zip(self.opt.param_groups, self.base_lrs):
                g["lr"] = base * f
        share = self.w.size / self.task.group_items(group)
        self.opt.zero_grad(set_to_none=True)
        sums = torch.zeros(3, dtype=torch.float64, device=self.dev)
        amp = self.t["amp"] and self.dev.type == "cuda"
        for j, batch in enumerate(group):
            # DDP averages gradients at the group's last backward only
            sync = self.w.size == 1 or j == len(group) - 1
            with contextlib.nullcontext() if sync else self.net.no_sync(), \
                    torch.autocast("cuda", torch.bfloat16) if amp else contextlib.nullcontext():
                objective, s = self.task.batch_loss(self.net, batch, share)
            objective.backward()
            sums += s
        return self._apply_step(sums, epoch, step)

    def _apply_step(self, sums: Tensor, epoch: int, step: int) -> Tensor:
        """Clip, check the global loss and step the optimizer; the global stats (loss sum,
        correct, items, ranks asked to stop: one collective carries the stop flag too)."""
        if self.t["grad_clip"]:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.t["grad_clip"])
        flag = torch.tensor([float(self.stop.requested)], dtype=sums.dtype, device=sums.device)
        stats = D.all_reduce_sum(torch.cat([sums, flag]))
        if not torch.isfinite(stats[0]):
            lr = self.base_lrs[0] if self.base_lrs else None
            raise TrainingError(f"loss is {stats[0].item()} at epoch {epoch}, step {step + 1}"
                                f"; lower train.lr (now {lr}) or check the data")
        self.opt.step()
        self.state["steps"] += 1
        return stats

    def _boundary(self, epoch: int, done: int, n_steps: int, totals: list, t0: float,
                  stop: bool) -> None:
        """After a step: a mid-epoch checkpoint when due by time or asked for by a signal
        (``stop`` is the global flag: every rank stops at the same step), then the stop; at
        the epoch's last step the stop waits for the epoch's record (``fit``)."""
        self.stop_seen = stop
        if done >= n_steps:
            return
        every, secs = self.t["checkpoint_every"], self.t["checkpoint_seconds"]
        if stop or (not every and secs and time.monotonic() - self.last_ckpt >= secs):
            part = {"epoch": epoch, "step": done, "totals": totals,
                    "seconds": time.perf_counter() - t0}
            self.checkpoint(epoch - 1, part, self.task.position())
        if stop:
            self.interrupted(epoch, (done, n_steps))

    def interrupted(self, epoch: int, step: tuple[int, int] | None):
        """Raise ``TrainingInterrupted`` for a stop after its checkpoint, at ``step`` (done,
        of) of ``epoch``, or after the epoch (None)."""
        sig = self.stop.signum or signal.SIGTERM  # another rank's signal: stop as SIGTERM
        where = f"epoch {epoch}, step {step[0]}/{step[1]}" if step else f"the end of epoch {epoch}"
        raise TrainingInterrupted(sig, f"interrupted by {StopRequest.name(sig)} at {where}: "
                                       f"checkpoint saved in {self.run}; resume with: "
                                       f"{self.resume_hint}")

    def checkpoint(self, epoch: int, partial: dict | None = None,
                   extra: dict | None = None) -> None:
        """Write a checkpoint (main rank): after ``epoch`` complete epochs, or ``partial``
        steps into the next one."""
        if self.w.main and self.run is not None:
            state = self.state if partial is None else {**self.state, "partial": partial}
            # what the task carries between steps (a baseline model, a running mean) too
            extra = {**self.task.state(), **(extra or {})}
            save_checkpoint(self.run, epoch, self.model.state_dict(), self.opt.state_dict(),
                            state, self.best_state, step=None if partial is None
                            else partial["step"], extra=extra)
        self.last_ckpt = time.monotonic()

    # -- an epoch's record: validation, the best weights, patience -------------------------------
    def _record(self, epoch: int, totals: list, dt: float) -> bool:
        """Validate (when the task says it is due), keep the best weights by the monitor,
        stop early, write metrics and checkpoints; True when the run ends here."""
        t, state = self.t, self.state
        last = epoch == t["epochs"] or self.spent
        val = self.task.validate(self.model, epoch, last)
        row = self.task.row(epoch, totals, dt, val, self.opt.param_groups[0]["lr"])
        state["history"].append(row)
        if val is not None and t["select"] != "last" and t["monitor"] in row:
            keep, better, state["best"] = judge(t["select"], t["monitor"], row, state["best"],
                                                self.task.minimized(t["monitor"]))
            if keep:
                state["best_epoch"] = epoch
                self.best_state = {k: v.detach().clone()
                                   for k, v in self.model.state_dict().items()}
            state["bad_epochs"] = 0 if better else state["bad_epochs"] + 1
            if t["patience"] and state["bad_epochs"] >= t["patience"]:
                state["stopped"] = True
        last = last or state["stopped"]
        if self.w.main:
            self._write(epoch, row, last)
        D.barrier()
        return last

    def _write(self, epoch: int, row: dict, last: bool) -> None:
        if self.files and self.run is not None:
            write_metrics(self.run, self.state["history"])
        if self.tb is not None:
            for k, v in row.items():
                if k != "epoch" and v is not None:  # None: not validated this epoch
                    self.tb.add_scalar(k, v, epoch)
        every = self.t["checkpoint_every"]
        # every N epochs, or (0) whenever checkpoint_seconds have passed: a checkpoint
        # costs a few fsyncs, far more than an epoch of a small graph model
        due = epoch % every == 0 if every else \
            time.monotonic() - self.last_ckpt >= self.t["checkpoint_seconds"]
        if last or due:
            self.checkpoint(epoch)
        if self.progress:
            print(self.task.line(row), flush=True)
        if self.on_row is not None:
            self.on_row(row)

    # -- the end ---------------------------------------------------------------------------------
    def finish(self, n_params: int) -> dict:
        """The result: the best-validation weights evaluated by the task, written out."""
        model, state, w = self.model, self.state, self.w
        if self.best_state is not None:
            model.load_state_dict(self.best_state)
        result = {"model": self.name, "dataset": self.task.data.name, "parameters": n_params,
                  "epochs": len(state["history"]), "best_epoch": state["best_epoch"],
                  **self.task.result(model, w.main), "early_stopped": state["stopped"],
                  "time_limited": self.time_limited,
                  "world_size": w.size,
                  "train_time_s": round(sum(h[self.task.time_key] for h in state["history"]),
                                        3)}
        if w.main and self.files and self.run is not None:
            save_weights(self.run / "best.safetensors", model.state_dict(),
                         {"epoch": state["best_epoch"]})
            atomic_write_json(self.run / "result.json", result)
            if state["history"]:
                plot_curves(self.run, state["history"], self.task.panels)
            self.prune()
        if self.tb is not None:
            self.tb.close()
        D.barrier()
        return result

    def prune(self) -> None:
        """Remove the mid-epoch checkpoints a finished run no longer needs: every
        ``ckpt-E-S`` file but the committed one (an epoch's own files stay)."""
        try:
            committed = json.loads((self.run / CHECKPOINT_JSON).read_text())["file"]
        except (OSError, ValueError, KeyError, TypeError):
            return
        for p in self.run.glob("ckpt-*-*.safetensors"):
            if p.name != committed:
                p.unlink(missing_ok=True)

"""A task: how a run makes its batches, scores them and reports. The loop knows none of this.

A ``Task`` gives the loop an epoch's optimizer steps, each a group of micro-batches
(``epoch_steps``, seeded by (seed, epoch), from any step on), the items a step's loss averages
over (``group_items``), a micro-batch's loss (``batch_loss``), the validation metrics
(``validate``), a metrics row and progress line, and the result's metrics (``result``).
``ItemTask`` is a per-item cross-entropy task (samples, nodes, tokens): its subclasses say only
how batches are cut and how a batch is scored.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...config import ConfigError
from ..distributed import World
from ..runlog import CLASSIFICATION_PANELS

__all__ = ["Task", "ItemTask", "batch_sums", "rank_rows", "rows_of"]


def batch_sums(loss: Tensor, ok: Tensor | None, items: int) -> Tensor:
    """(loss sum, correct, items) of a micro-batch in float64: what the loop adds up."""
    correct = ok.double().sum() if ok is not None else torch.zeros((), dtype=torch.float64,
                                                                     device=loss.device)
    return torch.stack([loss.detach().double().sum(), correct,
                        torch.tensor(float(items), dtype=torch.float64, device=loss.device)])


def rank_rows(n: int, world: World, what: str) -> Tensor:
    """This process's contiguous share (ids into 0..n-1) of a global batch of ``n`` ``what``;
    a ConfigError when the batch is too small to give every process one."""
    rows = torch.arange(n).tensor_split(world.size)[world.rank]
    if rows.numel() == 0:
        raise ConfigError(f"a batch of {n} {what} cannot be split over {world.size} processes; "
                          "raise data.batch_size")
    return rows


def rows_of(inputs, rows: Tensor):
    """Rows ``rows`` of a batch's inputs (None, a tensor or a tuple of tensors)."""
    if inputs is None:
        return None
    return tuple(x[rows] for x in inputs) if isinstance(inputs, tuple) else inputs[rows]


class Task:
    """What the loop asks of a run's data; ``setup`` binds it to the model being trained."""

    #: the metrics row's seconds key and the curves' panels
    time_key = "time_s"
    panels = CLASSIFICATION_PANELS

    def __init__(self, cfg: dict, data):
        self.cfg, self.data = cfg, data
        self.world, self.dev, self.dtype, self.model = World(), torch.device("cpu"), None, None

    @staticmethod
    def train_size(data) -> int:
        """The number of training items (0: nothing can train)."""
        raise NotImplementedError

    def setup(self, model, dev: torch.device, world: World) -> None:
        """Bind to the (unwrapped) model on ``dev`` in this process of ``world``."""
        self.model, self.dev, self.world = model, dev, world
        self.dtype = next(model.parameters()).dtype

    @staticmethod
    def schedules_by_epochs(cfg: dict) -> bool:
        """Whether what the task draws or schedules depends on ``train.epochs`` (then a run
        resumed with more epochs would not continue as one longer run)."""
        return False

    @staticmethod
    def minimized(monitor: str) -> bool:
        """Whether the monitored metric is better lower (a loss, an error, a length)."""
        return monitor.endswith(("loss", "mase", "smape", "gap", "length"))

    def epoch_steps(self, epoch: int, done: int, extra: dict | None):
        """(steps in the epoch, an iterator of the steps from ``done`` on, each a list of
        micro-batches); ``extra`` is what ``position`` gave at a mid-epoch checkpoint."""
        raise NotImplementedError

    def position(self) -> dict | None:
        """Tensors a mid-epoch checkpoint keeps to resume the epoch exactly (None: none)."""
        return None

    def state(self) -> dict:
        """Tensors every checkpoint keeps of what the task itself learns or carries between
        steps (a baseline model, a running mean); ``load_state`` takes them back on resume."""
        return {}

    def load_state(self, extra: dict) -> None:
        """Take back what ``state`` gave, from a checkpoint's extra tensors."""

    def group_items(self, group: list) -> float:
        """The global number of items a step's loss averages over."""
        raise NotImplementedError

    def batch_loss(self, net, batch, share: float) -> tuple[Tensor, Tensor]:
        """(the micro-batch's objective, whose gradient is its part of the step's, and its
        ``batch_sums``); ``share`` is world size / the step's global items."""
        raise NotImplementedError

    def validate(self, model, epoch: int, last: bool) -> dict | None:
        """The validation metrics of the row (None: not validated this epoch)."""
        raise NotImplementedError

    def row(self, epoch: int, totals: list, dt: float, val: dict | None, lr: float) -> dict:
        """The epoch's metrics row from the summed (loss, correct, items), its seconds, the
        validation metrics and the learning rate."""
        raise NotImplementedError

    def line(self, row: dict) -> str:
        """The row as one progress line."""
        raise NotImplementedError

    def result(self, model, main: bool) -> dict:
        """The result's metrics of the (best) model, written by the main process."""
        raise NotImplementedError


class ItemTask(Task):
    """A mean cross-entropy over items (samples, nodes, target tokens); DDP splits each global
    batch into contiguous shares and scales each share's loss so that DDP's gradient average
    is the gradient of the global mean."""

    def train_batches(self, epoch: int):
        """Global batches of one epoch: (inputs, targets) on CPU."""
        raise NotImplementedError

    def eval_batches(self, split: str):
        """A split's batches in order: (inputs, targets) on CPU."""
        raise NotImplementedError

    def losses(self, model, inputs, targets, device, dtype,
               smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
        """Per-item cross-entropy (n,) and correct predictions (n,) of a batch."""
        raise NotImplementedError

    def items(self, targets: Tensor) -> int:
        return targets.numel()

    def splits(self) -> set:
        return set(self.data.splits)

    def epoch_steps(self, epoch: int, done: int, extra: dict | None):
        acc = self.cfg["train"].get("accumulate", 1)
        batches = list(self.train_batches(epoch))
        groups = [batches[i:i + acc] for i in range(0, len(batches), acc)]
        return len(groups), iter(groups[done:])

    def group_items(self, group: list) -> float:
        return sum(self.items(targets) for _, targets in group)

    def batch_loss(self, net, batch, share: float) -> tuple[Tensor, Tensor]:
        inputs, targets = batch
        rows = rank_rows(targets.shape[0], self.world, "items")
        loss, ok = self.losses(net, rows_of(inputs, rows), targets[rows], self.dev, self.dtype,
                               self.cfg["train"].get("label_smoothing", 0.0))
        # sum / global count, times world size: DDP's mean of gradients is then the
        # gradient of the global mean loss
        return loss.sum() * share, batch_sums(loss, ok, ok.numel())

    def eval_losses(self, model, inputs, targets, device, dtype):
        return self.losses(model, inputs, targets, device, dtype)

    def val_batches(self):
        """The batches validation scores after each epoch: the whole split (a task may score a
        fixed sample of it instead: ``data.val_sample``)."""
        return self.eval_batches("val")

    @torch.no_grad()
    def evaluate(self, model, split: str, device=None, batches=None) -> dict:
        """``{loss, acc, n}`` of a model on a split (mean cross-entropy, accuracy), or on
        ``batches`` of it."""
        device = device or next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        was = model.training
        model.eval()
        tot, correct, n = 0.0, 0, 0
        for inputs, targets in self.eval_batches(split) if batches is None else batches:
            loss, ok = self.eval_losses(model, inputs, targets, device, dtype)
            tot += loss.double().sum().item()
            correct += int(ok.sum())
            n += ok.numel()
        model.train(was)
        if n == 0:
            raise ConfigError(f"the {split} split of {self.data.name} is empty")
        return {"loss": tot / n, "acc": correct / n, "n": n}

    def validate(self, model, epoch: int, last: bool) -> dict:
        val = self.evaluate(model, "val", self.dev, self.val_batches())
        return {"val_loss": val["loss"], "val_acc": val["acc"]}

    def row(self, epoch: int, totals: list, dt: float, val: dict | None, lr: float) -> dict:
        loss, ok, n = totals
        return {"epoch": epoch, "train_loss": loss / n, "train_acc": ok / n, **(val or {}),
                "time_s": round(dt, 4), "items_per_s": round(n / max(dt, 1e-9), 1), "lr": lr}

    def line(self, row: dict) -> str:
        val = f"val_loss {row['val_loss']:.4f}  val_acc {row['val_acc']:.4f}  " \
            if "val_loss" in row else ""
        return (f"epoch {row['epoch']:3d}  train_loss {row['train_loss']:.4f}  {val}"
                f"{row['items_per_s']:.0f} items/s")

    def result(self, model, main: bool) -> dict:
        test = self.evaluate(model, "test", self.dev) if "test" in self.splits() else None
        val = self.evaluate(model, "val", self.dev)
        return {"val_loss": val["loss"], "val_acc": val["acc"],
                "test_loss": test["loss"] if test else None,
                "test_acc": test["acc"] if test else None}


"""Node classification on a typed graph (``sc.data.HeteroGraph``), full batch: an epoch is one
step on the target node type's training nodes; accuracy, Macro-F1 and Micro-F1 per split.

The model (``[model.hetero]``, ``models.hetero``) reads the whole graph's ``typed_inputs`` and
returns the target type's logits. A sampled mode is a subclass, as ``SampledNodeTask`` is of
``NodeTask``: its ``epoch_steps`` yields typed mini-batches (seeds of the target type, a fanout
per relation), its ``batch_loss`` scores a batch's seeds, and ``task_for`` picks it where a
config has ``[train.sampler]`` (``SampledTypedNodeTask`` in ``typed_sampled``).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ...config import ConfigError, hetero_spec
from ...models.hetero import typed_inputs, typed_target
from .base import ItemTask

__all__ = ["TypedNodeTask", "f1_scores"]


def f1_scores(pred: Tensor, y: Tensor) -> tuple[float, float]:
    """(Macro-F1, Micro-F1) of predicted labels ``pred`` (n,) against ``y`` (n,): the Macro
    mean over the classes present in either (as scikit-learn's), Micro = accuracy for one
    label per item."""
    if y.numel() == 0:
        return 0.0, 0.0
    classes = torch.unique(torch.cat([pred, y]))
    hit = pred.unsqueeze(0) == classes.unsqueeze(1)  # (C, n)
    true = y.unsqueeze(0) == classes.unsqueeze(1)
    tp = (hit & true).sum(1).double()
    f1 = 2 * tp / (hit.sum(1) + true.sum(1)).double()
    return f1.mean().item(), (pred == y).double().mean().item()


def _labelled(data) -> str:
    types = [t for t in data.masks if t in data.y]
    if not types:
        raise ConfigError(f"{data.name} has no labelled node type with a split")
    return types[0]


class TypedNodeTask(ItemTask):
    """Full batch on ``data`` (a ``HeteroGraph``): the target type's ``masks`` split it."""

    def __init__(self, cfg: dict, data):
        super().__init__(cfg, data)
        self.spec = hetero_spec(cfg)
        self.target = typed_target(self.spec, data)
        self.masks, self.y = data.masks[self.target], data.y[self.target]
        self._inputs, self._cpu = None, None

    @staticmethod
    def train_size(data) -> int:
        return int(data.masks[_labelled(data)]["train"].sum())

    def splits(self) -> set:
        return set(self.masks)

    def inputs(self, device, dtype):
        """(x_dict, edge_index_dict) on ``device``, features in ``dtype`` (made once)."""
        if self._cpu is None:
            self._cpu = typed_inputs(self.spec, self.data)
        key = (torch.device(device), dtype)
        if self._inputs is None or self._inputs[0] != key:
            x, ei = self._cpu
            self._inputs = (key, {t: v.to(device, dtype) for t, v in x.items()},
                            {k: v.to(device) for k, v in ei.items()})
        return self._inputs[1], self._inputs[2]

    def train_batches(self, epoch: int):
        yield None, torch.nonzero(self.masks["train"]).flatten()

    def eval_batches(self, split: str):
        yield None, torch.nonzero(self.masks[split]).flatten()

    def losses(self, model, inputs, targets, device, dtype, smoothing: float = 0.0):
        idx = targets.to(device)
        logits = model(*self.inputs(device, dtype))[idx]
        y = self.y.to(device)[idx]
        return (F.cross_entropy(logits, y, reduction="none", label_smoothing=smoothing),
                logits.argmax(-1) == y)

    @torch.no_grad()
    def evaluate(self, model, split: str, device=None) -> dict:
        """``{loss, acc, macro_f1, micro_f1, n}`` of a model on a split of the target type."""
        if split not in self.masks or not bool(self.masks[split].any()):
            raise ConfigError(f"the {split} split of {self.data.name} is empty")
        device = device or next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        was = model.training
        model.eval()
        idx = torch.nonzero(self.masks[split]).flatten().to(device)
        logits = model(*self.inputs(device, dtype))[idx]
        model.train(was)
        y = self.y.to(device)[idx]
        macro, micro = f1_scores(logits.argmax(-1), y)
        return {"loss": F.cross_entropy(logits.double(), y).item(), "acc": micro,
                "macro_f1": macro, "micro_f1": micro, "n": int(idx.numel())}

    def _named(self, res: dict, prefix: str) -> dict:
        return {f"{prefix}_{k}": v for k, v in res.items() if k != "n"}

    def validate(self, model, epoch: int, last: bool) -> dict:
        return self._named(self.evaluate(model, "val", self.dev), "val")

    def line(self, row: dict) -> str:
        return (f"epoch {row['epoch']:3d}  train_loss {row['train_loss']:.4f}  "
                f"val_loss {row['val_loss']:.4f}  val Macro-F1 {row['val_macro_f1']:.4f}  "
                f"Micro-F1 {row['val_micro_f1']:.4f}")

    def result(self, model, main: bool) -> dict:
        out = self._named(self.evaluate(model, "val", self.dev), "val")
        if "test" in self.masks and bool(self.masks["test"].any()):
            out.update(self._named(self.evaluate(model, "test", self.dev), "test"))
        return out

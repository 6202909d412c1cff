"""Node classification on one graph: full batch, or sampled neighbourhoods (``[train.sampler]``)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ...config import sampler_spec
from .. import distributed as D
from ..minibatch import SampledEval, batch_inputs, dropout_seed, make_loader, restrictions
from .base import ItemTask, batch_sums

__all__ = ["NodeTask", "SampledNodeTask"]


def node_input(data, device, dtype):
    """The graph's node features on ``device`` ((N, 0) for a featureless graph)."""
    if data.x is None:
        return torch.zeros(data.num_nodes, 0, device=device, dtype=dtype)
    return data.x.to(device=device, dtype=dtype)


class NodeTask(ItemTask):
    """Full batch: an epoch is one step on every training node (``data.masks``)."""

    @staticmethod
    def train_size(data) -> int:
        return int(data.masks["train"].sum())

    def splits(self) -> set:
        return set(self.data.masks)

    def train_batches(self, epoch: int):
        yield None, torch.nonzero(self.data.masks["train"]).flatten()

    def eval_batches(self, split: str):
        yield None, torch.nonzero(self.data.masks[split]).flatten()

    def _unvalidated(self) -> bool:
        """Whether this run keeps its last weights (``train.select = "last"``) and has no
        validation nodes: nothing is validated then (R-GCN's split has none)."""
        val = self.data.masks.get("val")
        return self.cfg["train"].get("select") == "last" and (val is None or not bool(val.any()))

    def validate(self, model, epoch: int, last: bool) -> dict | None:
        return None if self._unvalidated() else super().validate(model, epoch, last)

    def result(self, model, main: bool) -> dict:
        if not self._unvalidated():
            return super().result(model, main)
        test = self.evaluate(model, "test", self.dev)
        return {"val_loss": None, "val_acc": None, "test_loss": test["loss"],
                "test_acc": test["acc"]}

    def losses(self, model, inputs, targets, device, dtype, smoothing: float = 0.0):
        idx = targets.to(device)
        logits = model(node_input(self.data, device, dtype))[idx]
        y = self.data.y.to(device)[idx]
        return (F.cross_entropy(logits, y, reduction="none", label_smoothing=smoothing),
                logits.argmax(-1) == y)


class SampledNodeTask(NodeTask):
    """Sampled mini-batches (``structconv.training.minibatch``): each optimizer step takes
    ``accumulate`` batches on every process, the same global batches whatever the process
    count; evaluation is exact (full batch, or layer by layer over whole neighbourhoods)."""

    def __init__(self, cfg: dict, data, sampled: SampledEval | None = None):
        super().__init__(cfg, data)
        self.sampled, self.loader = sampled, None

    def setup(self, model, dev, world) -> None:
        super().setup(model, dev, world)
        # the model on restricted bases, each rank its share of the batches
        restr = restrictions(model, self.cfg, self.data, sampler_spec(self.cfg)["degrees"])
        self.loader = make_loader(self.cfg, self.data, restr, self.dtype, world.rank,
                                  world.size)
        self.sampled = SampledEval(model, self.cfg, self.data)

    def epoch_steps(self, epoch: int, done: int, extra: dict | None):
        return self.loader.steps(), self._groups(epoch, done)

    def _groups(self, epoch: int, done: int):
        L = self.loader
        # what iterating L yields, in order: the batches' random seeds
        plan = L.plan(epoch)[done * L.accumulate:]
        L.set_epoch(epoch, done * L.accumulate)
        group = []
        for batch, (_, rng) in zip(L, plan, strict=True):
            group.append((batch, rng))
            if len(group) == L.accumulate:
                yield group
                group = []

    def group_items(self, group: list) -> float:
        return D.all_reduce_sum(torch.tensor(float(sum(b.batch_size for b, _ in group)),
                                             dtype=torch.float64, device=self.dev)).item()

    def batch_loss(self, net, batch, share: float):
        batch, rng = batch
        batch = batch.to(self.dev)
        # dropout from the batch's own seed: the same masks in whichever process
        torch.manual_seed(dropout_seed(rng))
        logits = net(*batch_inputs(batch, self.dtype))
        loss = F.cross_entropy(logits, batch.y, reduction="none",
                               label_smoothing=self.cfg["train"].get("label_smoothing", 0.0))
        ok = logits.argmax(-1) == batch.y
        # DDP's mean of the scaled gradients is the gradient of the mean loss over every
        # seed of the step
        return loss.sum() * share, batch_sums(loss, ok, ok.numel())

    def eval_losses(self, model, inputs, targets, device, dtype):
        if self.sampled is None or self.sampled.model is not model:
            self.sampled = SampledEval(model, self.cfg, self.data)
        idx = targets.to(device)
        logits, y = self.sampled.logits(device)[idx], self.data.y.to(device)[idx]
        return F.cross_entropy(logits, y, reduction="none"), logits.argmax(-1) == y

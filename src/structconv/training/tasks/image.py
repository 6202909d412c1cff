"""Image classification: shuffled batches of images, one cross-entropy per image."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..optim import epoch_generator
from .base import ItemTask

__all__ = ["ImageTask"]


class ImageTask(ItemTask):
    """``data.splits[split] = (images, labels)``; an epoch is a permutation of the training
    images drawn from (seed, epoch), cut into batches (``data.batches_per_epoch`` of them, or
    one pass)."""

    @staticmethod
    def train_size(data) -> int:
        return int(data.splits["train"][0].shape[0])

    def train_batches(self, epoch: int):
        d = self.cfg["data"]
        x, y = self.data.splits["train"]
        perm = torch.randperm(x.shape[0], generator=epoch_generator(self.cfg["seed"], epoch))
        n = d["batches_per_epoch"] or math.ceil(x.shape[0] / d["batch_size"])
        for i in range(n):
            idx = perm[i * d["batch_size"]:(i + 1) * d["batch_size"]]
            if idx.numel():
                yield x[idx], y[idx]

    def eval_batches(self, split: str):
        x, y = self.data.splits[split]
        b = self.cfg["data"]["eval_batch_size"]
        for i in range(0, x.shape[0], b):
            yield x[i:i + b], y[i:i + b]

    def losses(self, model, inputs, targets, device, dtype, smoothing: float = 0.0):
        logits = model(inputs.to(device).to(dtype))
        y = targets.to(device)
        return (F.cross_entropy(logits, y, reduction="none", label_smoothing=smoothing),
                logits.argmax(-1) == y)

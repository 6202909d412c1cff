"""Language modelling: random windows of a token stream, one cross-entropy per next token."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ...config import ConfigError
from ..optim import epoch_generator
from .base import ItemTask

__all__ = ["TextTask", "VAL_SAMPLE_SEED"]

#: the seed of the fixed sample of validation windows (``data.val_sample``): one sample for
#: every run, whatever its seed
VAL_SAMPLE_SEED = 12345


class TextTask(ItemTask):
    """``data.splits[split]`` a 1-D token tensor; an epoch is ``data.batches_per_epoch`` (20
    when 0) batches of windows at random starts drawn from (seed, epoch); evaluation reads the
    split in consecutive windows (validation: a fixed seeded sample of ``data.val_sample`` of
    them where set)."""

    @staticmethod
    def train_size(data) -> int:
        return int(data.splits["train"].numel())

    def splits(self) -> set:
        # a split of no characters (e.g. test = 0 in data.options) is not scored
        return {k for k, v in self.data.splits.items() if v.numel()}

    def train_batches(self, epoch: int):
        d = self.cfg["data"]
        g = epoch_generator(self.cfg["seed"], epoch)
        ids, T = self.data.splits["train"], d["seq_len"]
        if ids.numel() <= T + 1:
            raise ConfigError(f"data.seq_len={T} must be shorter than the {ids.numel()} "
                              "training characters")
        for _ in range(d["batches_per_epoch"] or 20):
            start = torch.randint(0, ids.numel() - T - 1, (d["batch_size"],), generator=g)
            win = torch.stack([ids[s:s + T + 1] for s in start.tolist()])
            yield win[:, :-1], win[:, 1:]

    def windows(self, split: str) -> Tensor:
        """The split's consecutive windows of seq_len + 1 tokens, (n, seq_len + 1)."""
        ids, T = self.data.splits[split], self.cfg["data"]["seq_len"]
        n = (ids.numel() - 1) // T
        if n < 1:
            raise ConfigError(f"the {split} split has {ids.numel()} characters, fewer than "
                              f"data.seq_len + 1 = {T + 1}")
        return torch.stack([ids[i * T:i * T + T + 1] for i in range(n)])

    def _batched(self, win: Tensor):
        b = self.cfg["data"]["eval_batch_size"]
        for i in range(0, win.shape[0], b):
            yield win[i:i + b, :-1], win[i:i + b, 1:]

    def eval_batches(self, split: str):
        return self._batched(self.windows(split))

    def val_batches(self):
        n = self.cfg["data"].get("val_sample", 0)
        win = self.windows("val")
        if n and n < win.shape[0]:
            g = torch.Generator().manual_seed(VAL_SAMPLE_SEED)
            win = win[torch.randperm(win.shape[0], generator=g)[:n].sort().values]
        return self._batched(win)

    def losses(self, model, inputs, targets, device, dtype, smoothing: float = 0.0):
        logits = model(inputs.to(device))
        logits, y = logits.reshape(-1, logits.shape[-1]), targets.to(device).reshape(-1)
        return (F.cross_entropy(logits, y, reduction="none", label_smoothing=smoothing),
                logits.argmax(-1) == y)

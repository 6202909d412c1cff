"""Sequence to sequence on word pairs (grapheme to phoneme): teacher-forced token losses."""

from __future__ import annotations

from torch import Tensor, nn

from ...config import seq2seq_spec
from ...data.g2p import PAD
from ...models.seq2seq import decode_scores, epoch_batches, pair_tensors, token_losses
from .base import ItemTask

__all__ = ["Seq2SeqTask", "decode_result"]

#: the trainer's split names -> a grapheme-to-phoneme dataset's
G2P_SPLITS = {"val": "valid"}


def decode_result(model: nn.Module, data, cfg: dict, splits=("val", "test")) -> dict:
    """A sequence-to-sequence model's decoding of every word of ``splits`` with the config's
    ``beam`` (1: greedy): ``{<split>_per, <split>_wer}`` in percent, and ``beam``."""
    beam = seq2seq_spec(cfg)["beam"]
    out: dict = {"beam": beam}
    for split in splits:
        r = decode_scores(model, data, G2P_SPLITS.get(split, split), beam)
        out[f"{split}_per"], out[f"{split}_wer"] = r["per"], r["wer"]
    return out


class Seq2SeqTask(ItemTask):
    """Every pronunciation of a training word is a pair, batched with pairs of similar
    lengths; the loss averages over target tokens that are not padding; the result adds the
    phoneme and word error rates of decoding every validation and test word."""

    @staticmethod
    def train_size(data) -> int:
        return len(data.splits["train"])

    def items(self, targets: Tensor) -> int:
        return int((targets != PAD).sum())

    def train_batches(self, epoch: int):
        d = self.cfg["data"]
        pairs = self.data.pairs("train")
        batches = epoch_batches([len(w) for w, _ in pairs], d["batch_size"], self.cfg["seed"],
                                epoch)
        for idx in batches[:d["batches_per_epoch"] or None]:
            src, tin, tout = pair_tensors(self.data, pairs, idx)
            yield (src, tin), tout

    def eval_batches(self, split: str):
        # a word's first pronunciation, words in order of length (little padding)
        b = self.cfg["data"]["eval_batch_size"]
        entries = sorted(self.data.splits[G2P_SPLITS.get(split, split)], key=lambda e: len(e[0]))
        pairs = [(w, prons[0]) for w, prons in entries]
        for i in range(0, len(pairs), b):
            src, tin, tout = pair_tensors(self.data, pairs, range(i, min(len(pairs), i + b)))
            yield (src, tin), tout

    def losses(self, model, inputs, targets, device, dtype, smoothing: float = 0.0):
        src, tin = (x.to(device) for x in inputs)
        return token_losses(model, src, tin, targets.to(device), smoothing)

    def result(self, model, main: bool) -> dict:
        out = super().result(model, main)
        if main:
            out.update(decode_result(model, self.data, self.cfg))
        return out

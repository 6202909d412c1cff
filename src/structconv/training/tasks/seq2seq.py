"""Sequence to sequence on word pairs (grapheme to phoneme): teacher-forced token losses."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...config import seq2seq_spec
from ...data.g2p import PAD
from ...models.seq2seq import (
    decode_scores,
    decode_words,
    epoch_batches,
    pair_tensors,
    score,
    token_losses,
)
from .base import ItemTask

__all__ = ["Seq2SeqTask", "decode_result"]

#: the trainer's split names -> a grapheme-to-phoneme dataset's
G2P_SPLITS = {"val": "valid"}
#: the seed of the fixed sample of validation words (``data.val_sample``)
VAL_SAMPLE_SEED = 4321


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
    phoneme and word error rates of decoding every validation and test word.

    An epoch is one pass over the pairs, or with ``data.batches_per_epoch`` that many batches
    of the passes in turn (pass p drawn from (seed, p + 1)), so every word is seen once per
    pass whatever the epoch's length. ``data.val_sample`` validates on a fixed seeded sample
    of that many validation words, decoded greedily too (the row's ``val_per``, ``val_wer``).
    """

    @staticmethod
    def train_size(data) -> int:
        return len(data.splits["train"])

    def items(self, targets: Tensor) -> int:
        return int((targets != PAD).sum())

    def train_batches(self, epoch: int):
        d, seed = self.cfg["data"], self.cfg["seed"]
        pairs = self.data.pairs("train")
        lengths = [len(w) for w, _ in pairs]
        bpe, passes = d["batches_per_epoch"], {}
        if not bpe:
            order = [(epoch, i) for i in range(len(epoch_batches(lengths, d["batch_size"],
                                                                 seed, epoch)))]
        else:
            per_pass = len(epoch_batches(lengths, d["batch_size"], seed, 1))
            order = [(s // per_pass + 1, s % per_pass)
                     for s in range((epoch - 1) * bpe, epoch * bpe)]
        for p, i in order:
            if p not in passes:
                passes = {p: epoch_batches(lengths, d["batch_size"], seed, p)}
            src, tin, tout = pair_tensors(self.data, pairs, passes[p][i])
            yield (src, tin), tout

    def _entries(self, entries):
        # a word's first pronunciation, words in order of length (little padding)
        b = self.cfg["data"]["eval_batch_size"]
        pairs = [(w, prons[0]) for w, prons in sorted(entries, key=lambda e: len(e[0]))]
        for i in range(0, len(pairs), b):
            src, tin, tout = pair_tensors(self.data, pairs, range(i, min(len(pairs), i + b)))
            yield (src, tin), tout

    def eval_batches(self, split: str):
        return self._entries(self.data.splits[G2P_SPLITS.get(split, split)])

    def val_sample(self) -> list | None:
        """The validation words ``data.val_sample`` names (a seeded sample, in split order),
        None for the whole split."""
        n, entries = self.cfg["data"].get("val_sample", 0), self.data.splits["valid"]
        if not n:
            return None
        pick = torch.randperm(len(entries), generator=torch.Generator().manual_seed(
            VAL_SAMPLE_SEED))
        return [entries[i] for i in sorted(pick[:n].tolist())]

    def val_batches(self):
        sample = self.val_sample()
        return self.eval_batches("val") if sample is None else self._entries(sample)

    def validate(self, model, epoch: int, last: bool) -> dict:
        out = super().validate(model, epoch, last)
        sample = self.val_sample()
        if sample is not None:
            was = model.training
            model.eval()
            r = score(decode_words(model, self.data, [w for w, _ in sample]), sample)
            model.train(was)
            out.update(val_per=r["per"], val_wer=r["wer"])
        return out

    def losses(self, model, inputs, targets, device, dtype, smoothing: float = 0.0):
        src, tin = (x.to(device) for x in inputs)
        return token_losses(model, src, tin, targets.to(device), smoothing)

    def result(self, model, main: bool) -> dict:
        out = super().result(model, main)
        if main:
            out.update(decode_result(model, self.data, self.cfg))
        return out

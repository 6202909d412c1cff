"""Sequence-to-sequence models of a config, and what training and scoring them needs.

``build_seq2seq`` turns a ``[model.seq2seq]`` table (``structconv.config.SEQ2SEQ_KEYS``) into a
``sc.nn.Seq2Seq`` (kind ``transformer``) or a ``sc.nn.PervasiveAttention`` (kind ``pervasive``)
for a dataset's source and target vocabularies (``structconv.data.g2p.G2PData``). The batching,
the teacher-forced loss, the decoding and the error rates here are the ones both
``structconv train`` of such a config and ``structconv reproduce g2p`` use.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import SEQ2SEQ_KINDS
from ..data.g2p import PAD, error_rates
from ..nn.decoding import strip
from ..seeds import epoch_generator

__all__ = ["build_seq2seq", "epoch_batches", "pair_tensors", "token_losses",
           "decode_words", "score", "decode_scores"]

def build_seq2seq(spec: dict, data) -> nn.Module:
    """The model of a complete ``[model.seq2seq]`` spec (defaults filled in) for ``data``'s
    vocabularies (``graphemes`` -> ``phonemes``)."""
    from ..nn.pervasive import PervasiveAttention
    from ..nn.seq2seq import Seq2Seq

    V_s, V_t = len(data.graphemes), len(data.phonemes)
    if spec["kind"] == "pervasive":
        return PervasiveAttention(V_s, V_t, spec["embed"], spec["layers"], spec["growth"],
                                  spec["kernel"], bottleneck=spec["bottleneck"] or None,
                                  pooling=spec["pooling"], heads=spec["heads"],
                                  dropout=float(spec["dropout"]))
    if spec["kind"] != "transformer":
        raise ValueError(f"model.seq2seq.kind must be one of {', '.join(SEQ2SEQ_KINDS)}, "
                         f"got {spec['kind']!r}")
    # learned positions: a table as long as the longest decoding (generate's default length
    # for the longest word), unless the config says
    context = spec["context"] or 2 * data.longest()[0] + 8
    return Seq2Seq(V_s, V_t, spec["width"], spec["layers"], spec["heads"], spec["position"],
                   spec["shifts"], spec["ffn"] or None, float(spec["dropout"]),
                   src_shifts=spec["src_shifts"] or None, context=context,
                   canon=spec["canon"], canon_kernel=spec["canon_kernel"])


# -- batches -------------------------------------------------------------------------------------
def epoch_batches(lengths: list[int], batch: int, seed: int, epoch: int) -> list[list[int]]:
    """One epoch's batches of item indices: a permutation drawn from (seed, epoch), cut into
    pools of 32 batches whose items are sorted by length (little padding), batches shuffled.
    Every epoch has the same number of batches, so a step number names its batch."""
    g = epoch_generator(seed, epoch)
    perm = torch.randperm(len(lengths), generator=g).tolist()
    out = []
    pool = 32 * batch
    for i in range(0, len(perm), pool):
        chunk = sorted(perm[i:i + pool], key=lambda j: lengths[j])
        out += [chunk[k:k + batch] for k in range(0, len(chunk), batch)]
    order = torch.randperm(len(out), generator=g).tolist()
    return [out[i] for i in order]


def pair_tensors(data, pairs, idx) -> tuple[Tensor, Tensor, Tensor]:
    """(source (B, S), decoder input (B, T), targets (B, T)) of the (word, pronunciation)
    ``pairs`` at indices ``idx``, right-padded with ``PAD``."""
    words, prons = [pairs[i][0] for i in idx], [pairs[i][1] for i in idx]
    return (data.encode_source(words), *data.encode_target(prons))


def token_losses(model, src: Tensor, tin: Tensor, tout: Tensor,
                 smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """Teacher-forced cross-entropy of every target token that is not padding (n,), and
    whether the model's most likely token is right (n,); their mean is the training loss."""
    logits = model(src, tin)
    keep = tout.flatten() != PAD
    logits, y = logits.flatten(0, 1)[keep], tout.flatten()[keep]
    loss = F.cross_entropy(logits, y, reduction="none", label_smoothing=smoothing)
    return loss, logits.argmax(-1) == y


# -- decoding and scoring ------------------------------------------------------------------------
@torch.no_grad()
def decode_words(model, data, words: list[str], beam: int = 1,
                 batch: int = 256) -> list[tuple[str, ...]]:
    """The model's pronunciation of each word (greedy, or beam search of width ``beam``),
    decoded in batches of words of similar length."""
    order = sorted(range(len(words)), key=lambda i: len(words[i]))
    out: list = [None] * len(words)
    dev = next(model.parameters()).device
    for k in range(0, len(order), batch):
        ids = order[k:k + batch]
        toks = model.generate(data.encode_source([words[i] for i in ids]).to(dev), beam=beam)
        for i, p in zip(ids, data.decode_target(strip(toks.cpu(), data.phonemes.index("</s>"),
                                                      PAD))):
            out[i] = p
    return out


def score(predictions, entries) -> dict:
    """PER / WER (percent) of predictions for (word, pronunciations) entries."""
    r = error_rates(predictions, [p for _, p in entries])
    return {"per": 100 * r["per"], "wer": 100 * r["wer"], "words": r["words"]}


def decode_scores(model, data, split: str, beam: int = 1) -> dict:
    """Decode every word of ``split`` and score it: ``{per, wer, words}`` (percent; a word
    is right when it matches any of its pronunciations)."""
    entries = data.splits[split]
    was = model.training
    model.eval()
    try:
        return score(decode_words(model, data, [w for w, _ in entries], beam=beam), entries)
    finally:
        model.train(was)

"""Greedy and beam-search decoding of sequence-to-sequence models, over one step protocol.

A model that decodes hands out a *decoding state* (``Seq2Seq.decoding_state``,
``PervasiveAttention.decoding_state``): an object with

* ``step(tokens)``: the last emitted token of every row, (N,) long -> next-token logits (N, V);
  it updates the state in place (a KV cache, or the prefix itself when decoding without one);
* ``select(index)``: keep (and reorder, or repeat) the rows ``index`` (N',) long, in place.

``greedy`` and ``beam_search`` drive any such state; with beam width 1 the beam search is the
greedy search (same tokens, same scores). Outputs are (B, L) long: the emitted tokens without
the start token, each row ending with ``eos`` (when reached) and padded with ``pad`` after it.
Neither search ever emits ``pad`` or ``bos`` before ``eos`` (they are never targets).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

__all__ = ["greedy", "beam_search", "strip", "check_decoding", "generate"]


def check_decoding(max_len, beam: int = 1, length_penalty: float = 0.0) -> None:
    """``ValueError`` unless ``max_len`` and ``beam`` are ints >= 1 and ``length_penalty`` a
    finite number."""
    for name, v in (("max_len", max_len), ("beam", beam)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"decoding: {name} must be an int >= 1, got {v!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, numbers.Real) or \
            not math.isfinite(length_penalty):
        raise ValueError(f"decoding: length_penalty must be a finite number (0: rank by "
                         f"log-probability), got {length_penalty!r}")


def _empty(device) -> tuple[Tensor, Tensor]:
    """The decoding of no rows: tokens (0, 0), scores (0,)."""
    return (torch.zeros(0, 0, dtype=torch.long, device=device),
            torch.zeros(0, dtype=torch.float64, device=device))


def _log_probs(state, last: Tensor, bos: int, pad: int) -> Tensor:
    """log-softmax (N, V) in float64 of the state's next-token logits, with the padding and
    start tokens taken out (a model that has not learned to avoid them yet must not stop)."""
    logits = state.step(last).double()
    logits[:, [bos, pad]] = float("-inf")
    return torch.log_softmax(logits, -1)


@torch.no_grad()
def greedy(state, batch: int, bos: int, eos: int, pad: int, max_len: int,
           device=None) -> tuple[Tensor, Tensor]:
    """The most likely token at every step, for ``batch`` rows of ``state``: (tokens (B, L),
    summed log-probabilities (B,)). Stops when every row has emitted ``eos`` or after
    ``max_len`` tokens; rows that are done emit ``pad`` and score nothing more."""
    check_decoding(max_len)
    if not batch:
        return _empty(device)
    last = torch.full((batch,), bos, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    score = torch.zeros(batch, dtype=torch.float64, device=device)
    out = []
    for _ in range(max_len):
        logp = _log_probs(state, last, bos, pad)
        tok = logp.argmax(-1)
        score += torch.where(done, 0.0, logp.gather(1, tok[:, None])[:, 0])
        tok = tok.masked_fill(done, pad)
        out.append(tok)
        done = done | (tok == eos)
        last = tok.masked_fill(done, eos)  # a finished row's input no longer matters
        if bool(done.all()):
            break
    return torch.stack(out, 1), score


@torch.no_grad()
def beam_search(state, batch: int, bos: int, eos: int, pad: int, max_len: int, beam: int = 4,
                length_penalty: float = 0.0, device=None) -> tuple[Tensor, Tensor]:
    """Beam search with ``beam`` hypotheses per row: (best tokens (B, L), their summed
    log-probabilities (B,)). A hypothesis ends at ``eos``; the search stops when every
    hypothesis of every row has ended or after ``max_len`` tokens. The final choice ranks
    hypotheses by score / length^``length_penalty`` (0: the plain log-probability, so that
    ``beam = 1`` is exactly ``greedy``). ``state`` holds ``batch`` rows; it is expanded to
    ``batch * beam`` rows (row b's hypotheses are rows b*beam .. b*beam + beam - 1)."""
    check_decoding(max_len, beam, length_penalty)
    if not batch:
        return _empty(device)
    B, K = batch, beam
    state.select(torch.arange(B, device=device).repeat_interleave(K))
    # only the first hypothesis of a row is live at the start (the others would repeat it)
    score = torch.full((B, K), float("-inf"), dtype=torch.float64, device=device)
    score[:, 0] = 0.0
    done = torch.zeros(B, K, dtype=torch.bool, device=device)
    length = torch.zeros(B, K, dtype=torch.long, device=device)
    seqs = torch.zeros(B, K, 0, dtype=torch.long, device=device)
    last = torch.full((B * K,), bos, dtype=torch.long, device=device)
    for _ in range(max_len):
        logp = _log_probs(state, last, bos, pad).view(B, K, -1)
        V = logp.shape[-1]
        # a finished hypothesis continues with one free padding token and nothing else
        frozen = torch.full_like(logp, float("-inf"))
        frozen[..., pad] = 0.0
        logp = torch.where(done[..., None], frozen, logp)
        cand = (score[..., None] + logp).view(B, K * V)
        score, idx = cand.topk(K, -1)
        origin, tok = idx // V, idx % V
        rows = (torch.arange(B, device=device)[:, None] * K + origin).view(-1)
        state.select(rows)
        keep = done.gather(1, origin)
        seqs = torch.cat([seqs.gather(1, origin[..., None].expand(-1, -1, seqs.shape[-1])),
                          tok[..., None]], -1)
        length = length.gather(1, origin) + (~keep).long()
        done = keep | (tok == eos)
        last = tok.view(-1).masked_fill(done.view(-1), eos)
        if bool(done.all()):
            break
    rank = score / length.clamp_min(1).double() ** length_penalty if length_penalty else score
    best = rank.argmax(-1)
    pick = torch.arange(B, device=device)
    return seqs[pick, best], score[pick, best]


@torch.no_grad()
def generate(model, src, max_len: int | None = None, *, beam: int = 1, use_cache: bool = True,
             length_penalty: float = 0.0) -> Tensor:
    """Decode src (B, S) -> tokens (B, L) with a sequence-to-sequence ``model`` (``Seq2Seq``,
    ``PervasiveAttention``: ``check_ids``, ``src_vocab``, ``decoding_state`` and the
    ``bos_id`` / ``eos_id`` / ``pad_id`` ids), in eval mode: greedy for ``beam = 1``, else
    beam search; ``max_len`` defaults to 2·S + 8."""
    was = model.training
    model.eval()
    try:
        src = model.check_ids(src, model.src_vocab, "src")
        max_len = 2 * src.shape[1] + 8 if max_len is None else max_len
        check_decoding(max_len, beam, length_penalty)
        if not src.shape[0]:
            return _empty(src.device)[0]  # no rows: nothing to decode (nor a state to build)
        state = model.decoding_state(src, use_cache)
        args = (src.shape[0], model.bos_id, model.eos_id, model.pad_id, max_len)
        if beam == 1:
            return greedy(state, *args, device=src.device)[0]
        return beam_search(state, *args, beam=beam, length_penalty=length_penalty,
                           device=src.device)[0]
    finally:
        model.train(was)


def strip(tokens: Tensor, eos: int, pad: int) -> list[list[int]]:
    """Decoded rows (B, L) -> lists of token ids before the first ``eos`` (padding dropped)."""
    out = []
    for row in tokens.tolist():
        seq = []
        for t in row:
            if t == eos:
                break
            if t != pad:
                seq.append(t)
        out.append(seq)
    return out

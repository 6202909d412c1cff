"""Filtered link-prediction ranking (MRR, MR, Hits@K), both directions, ties averaged.

Each test triple (h, r, t) is ranked twice: t among all entities as the tail of (h, r), and h as
the tail of (t, r + R, ·), the inverse query. The filtered rank ignores every other candidate
that forms a known triple; a tie counts as the mean of the optimistic and pessimistic ranks, so
a constant scorer gets the middle rank, never the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["evaluate", "FilterIndex", "check_triples"]


def check_triples(triples, num_entities: int, num_relations: int, what: str = "triples") -> Tensor:
    """``triples`` as a (T, 3) long tensor [head, relation, tail], ids checked against the sizes."""
    if not isinstance(triples, Tensor):
        raise TypeError(f"{what} must be a (T, 3) integer tensor, got {type(triples).__name__}")
    if triples.dim() != 2 or triples.shape[1] != 3:
        raise ValueError(f"{what} must be (T, 3) rows [head, relation, tail], got "
                         f"{tuple(triples.shape)}")
    if triples.is_floating_point() or triples.dtype == torch.bool or triples.is_complex():
        raise TypeError(f"{what} must hold integer ids, got {triples.dtype}")
    t = triples.long()
    if t.numel():
        for col, name, n in ((0, "head", num_entities), (1, "relation", num_relations),
                             (2, "tail", num_entities)):
            lo, hi = int(t[:, col].min()), int(t[:, col].max())
            if lo < 0 or hi >= n:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{what}: {name} id {bad} is out of range [0, {n - 1}]")
    return t


class FilterIndex:
    """The known answers of every query (entity, relation), both directions, as sorted keys.

    A query key is ``e * 2R + r`` with relation ``r + R`` the inverse of ``r``; ``answers(q)``
    gives, for a batch of query keys, the (row, entity) pairs of their known answers.
    """

    def __init__(self, known: Tensor, num_entities: int, num_relations: int):
        R2 = 2 * num_relations
        h, r, t = known[:, 0], known[:, 1], known[:, 2]
        q = torch.cat([h * R2 + r, t * R2 + r + num_relations])
        a = torch.cat([t, h])
        # unique (query, answer) pairs sorted by query: a triple listed twice filters once
        pair = torch.unique(q * num_entities + a)
        self.queries, self.entities = pair // num_entities, pair % num_entities
        self.R2 = R2

    def answers(self, heads: Tensor, rels: Tensor) -> tuple[Tensor, Tensor]:
        """(rows, entities): every known answer of query i = (heads[i], rels[i])."""
        q = heads * self.R2 + rels
        lo = torch.searchsorted(self.queries, q)
        cnt = torch.searchsorted(self.queries, q, right=True) - lo
        rows = torch.repeat_interleave(torch.arange(q.numel(), device=q.device), cnt)
        start = torch.repeat_interleave(lo - (cnt.cumsum(0) - cnt), cnt)
        return rows, self.entities[start + torch.arange(rows.numel(), device=q.device)]


def _ranks(scores: Tensor, target: Tensor, rows: Tensor, ents: Tensor) -> tuple[Tensor, Tensor]:
    """(raw, filtered) mean of optimistic and pessimistic 1-based ranks of ``target`` per row
    (float64); the filtered rank leaves out the candidates ``ents`` of rows ``rows``.

    The filtered counts are the raw ones minus those of the left-out candidates, gathered from
    their (few) positions, so no (B, E) mask is built.
    """
    true = scores.gather(1, target[:, None])
    above = (scores > true).sum(1)
    tied = (scores == true).sum(1) - 1  # the target itself
    s_out, t_out = scores[rows, ents], true[rows, 0]
    n = target.numel()
    above_f = above - torch.zeros(n, dtype=above.dtype, device=above.device).index_add_(
        0, rows, (s_out > t_out).to(above.dtype))
    tied_f = tied - torch.zeros(n, dtype=tied.dtype, device=tied.device).index_add_(
        0, rows, (s_out == t_out).to(tied.dtype))
    return (above.double() + 1.0 + tied.double() / 2.0,
            above_f.double() + 1.0 + tied_f.double() / 2.0)


def evaluate(score_tails: Callable[[Tensor, Tensor], Tensor], triples: Tensor, known: Tensor,
             num_entities: int, num_relations: int, ks: Sequence[int] = (1, 3, 10),
             batch_size: int = 256) -> dict[str, float]:
    """Filtered and raw MRR, MR and Hits@K of ``score_tails`` on ``triples``, both directions.

    ``triples`` (T, 3) and ``known`` (U, 3) are long rows (head, relation, tail), relations in
    ``0..num_relations-1``; ``known`` holds every true triple (train, valid and test).
    ``score_tails(h, r)`` maps (B,) heads and relations (``r + num_relations`` = inverse of r)
    to (B, num_entities) scores, higher = more plausible. Returns Python floats over the 2T
    rankings: ``mrr``, ``mr``, ``hits@K`` (filtered) and the same with ``raw_``.
    """
    for name, v in (("num_entities", num_entities), ("num_relations", num_relations),
                    ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"evaluate: {name} must be an int >= 1, got {v!r}")
    ks = tuple(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"evaluate: ks must be ints >= 1, got {ks!r}")
    triples = check_triples(triples, num_entities, num_relations)
    known = check_triples(known, num_entities, num_relations, "known")
    if not triples.shape[0]:
        raise ValueError("evaluate: no triples to rank (triples is (0, 3))")
    index = FilterIndex(known.cpu(), num_entities, num_relations)
    R, T = num_relations, triples.shape[0]
    # both directions as one list of queries: (h, r) -> t and (t, r + R) -> h
    heads = torch.cat([triples[:, 0], triples[:, 2]])
    rels = torch.cat([triples[:, 1], triples[:, 1] + R])
    targets = torch.cat([triples[:, 2], triples[:, 0]])
    filt, raw = [], []
    with torch.no_grad():
        for i in range(0, 2 * T, batch_size):
            h, r, t = heads[i:i + batch_size], rels[i:i + batch_size], targets[i:i + batch_size]
            s = score_tails(h, r)
            if not isinstance(s, Tensor) or tuple(s.shape) != (h.numel(), num_entities):
                got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
                raise ValueError(f"score_tails must return ({h.numel()}, {num_entities}) scores "
                                 f"for a batch of {h.numel()} queries, got {got}")
            s = s.detach().float() if s.dtype in (torch.float16, torch.bfloat16) else s.detach()
            if torch.isnan(s).any():
                raise ValueError("score_tails returned NaN scores: ranks are undefined")
            rows, ents = index.answers(h.cpu(), r.cpu())
            keep = ents != t[rows]  # the true answer stays a candidate
            r_raw, r_filt = _ranks(s, t.to(s.device), rows[keep].to(s.device),
                                   ents[keep].to(s.device))
            raw.append(r_raw.cpu())
            filt.append(r_filt.cpu())
    out: dict[str, float] = {}
    for prefix, ranks in (("", torch.cat(filt)), ("raw_", torch.cat(raw))):
        out[f"{prefix}mrr"] = float((1.0 / ranks).mean())
        out[f"{prefix}mr"] = float(ranks.mean())
        for k in ks:
            out[f"{prefix}hits@{k}"] = float((ranks <= k).double().mean())
    return out

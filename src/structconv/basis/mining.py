"""Sort mining: the relation paths (random-walk sorts) a graph holds, with their support and
the confidence of the path rules they form, in the spirit of rule miners such as AMIE/AnyBURL.

Walk counts come from per-relation degree vectors (no path is materialised to count it);
distinct endpoint pairs, needed for confidences, are joined edge list by edge list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .edges import check_edge_type, check_edges, check_num_nodes
from .sorts import inverse_name, sort_name

__all__ = ["MinedSort", "mine_sorts", "single_and_mined_sorts"]


@dataclass
class MinedSort:
    """A relation path found in a graph.

    ``support``: walk instances (1ᵀ A_r1 ··· A_rL 1); ``pairs``: distinct (start, end) node
    pairs the walks join; ``head``/``confidence``: the relation r that most often links those
    pairs directly and the fraction it links (the standard confidence of the path rule
    ``sort => r``); ``None`` where not computed (``confidence=False`` or over ``max_pairs``).
    """

    sort: tuple[int, ...]
    name: str
    support: int
    pairs: int | None = None
    head: int | None = None
    head_name: str | None = None
    confidence: float | None = None
    hits: int | None = None

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("sort", "name", "support", "pairs", "head",
                                              "head_name", "confidence", "hits")}


def _degrees(src, dst, et, R: int, N: int) -> tuple[Tensor, Tensor]:
    """(R, N) float64 counts of each relation's edges leaving (out) and entering (in) a node."""
    out = torch.zeros(R * N, dtype=torch.float64).index_add_(
        0, et * N + src, torch.ones(src.numel(), dtype=torch.float64)).view(R, N)
    inn = torch.zeros(R * N, dtype=torch.float64).index_add_(
        0, et * N + dst, torch.ones(dst.numel(), dtype=torch.float64)).view(R, N)
    return out, inn


def _backtracks(sort: tuple[int, ...], inverse: dict[int, int]) -> bool:
    return any(inverse.get(a) == b for a, b in zip(sort, sort[1:]))


def walk_pairs(src, dst, et, N: int, sort: tuple[int, ...], max_pairs: int) -> Tensor | None:
    """Sorted distinct keys start*N + end of the walks of ``sort`` (None past ``max_pairs``)."""
    frontier = None  # (2, P) distinct (start, current) pairs
    for r in sort:
        m = et == r
        s_r, d_r = src[m], dst[m]
        if frontier is None:
            frontier = torch.stack([s_r, d_r])
        else:
            # join frontier (start, z) with edges (z, y) of r: CSR of r by source
            order = torch.argsort(s_r, stable=True)
            s_r, d_r = s_r[order], d_r[order]
            lo = torch.searchsorted(s_r, frontier[1])
            cnt = torch.searchsorted(s_r, frontier[1], right=True) - lo
            total = int(cnt.sum())
            if total > max_pairs:
                return None
            rep = torch.repeat_interleave(torch.arange(frontier.shape[1]), cnt)
            pos = torch.arange(total) - torch.repeat_interleave(cnt.cumsum(0) - cnt, cnt)
            frontier = torch.stack([frontier[0][rep], d_r[lo[rep] + pos]])
        keys = torch.unique(frontier[0] * N + frontier[1])
        if keys.numel() > max_pairs:
            return None
        frontier = torch.stack([keys // N, keys % N])
    return frontier[0] * N + frontier[1]


def _rule_confidence(keys: Tensor, edge_keys: Tensor, edge_rel: Tensor, R: int):
    """(hits per relation (R,), pairs): how many of the distinct pairs each relation links."""
    lo = torch.searchsorted(edge_keys, keys)
    cnt = torch.searchsorted(edge_keys, keys, right=True) - lo
    idx = torch.repeat_interleave(lo, cnt) + (
        torch.arange(int(cnt.sum())) - torch.repeat_interleave(cnt.cumsum(0) - cnt, cnt))
    return torch.bincount(edge_rel[idx], minlength=R), keys.numel()


def _supports(src, dst, et, R: int, N: int, min_length: int, max_length: int,
              min_support: int, beam: int, allowed) -> list[tuple[tuple[int, ...], int]]:
    """(path, walk count) of every allowed path of length min..max_length with enough support;
    paths longer than 2 extend the ``beam`` best supported shorter ones."""
    out_deg, in_deg = _degrees(src, dst, et, R, N)
    found: list[tuple[tuple[int, ...], int]] = []
    if min_length <= 1:
        found += [((r,), int(c)) for r, c in enumerate(out_deg.sum(1).tolist()) if c > 0]
    # walk counts ending at each node for the current prefixes: (P, N)
    prefixes, ends = [(r,) for r in range(R)], in_deg
    for length in range(2, max_length + 1):
        sup = ends @ out_deg.t()  # (P, R): Σ_z ends[p, z] · out_deg[r, z]
        cand = (sup >= min_support).nonzero()
        vals = sup[cand[:, 0], cand[:, 1]]
        order = torch.argsort(vals, descending=True, stable=True)
        cand, vals = cand[order], vals[order]
        keep = [(prefixes[p] + (r,), int(v)) for (p, r), v in zip(cand.tolist(), vals.tolist())
                if allowed(prefixes[p] + (r,))]
        if length >= min_length:
            found += keep
        if length < max_length:  # extend the best supported paths by one relation
            where = {p: i for i, p in enumerate(prefixes)}
            prefixes = [s for s, _ in keep[:beam]]
            rows = []
            for s in prefixes:  # the ends of s: the ends of its prefix pushed along s[-1]
                m = et == s[-1]
                v = ends[where[s[:-1]]]
                rows.append(torch.zeros(N, dtype=torch.float64).index_add_(0, dst[m], v[src[m]]))
            ends = torch.stack(rows) if rows else torch.zeros(0, N, dtype=torch.float64)
    return found


def _confidences(out: list, src, dst, et, R: int, N: int, relations, max_pairs: int) -> None:
    """Fill pairs / head / confidence / hits of each mined path (in place)."""
    ek = src * N + dst
    order = torch.argsort(ek)
    ek, er = ek[order], et[order]
    for m in out:
        keys = walk_pairs(src, dst, et, N, m.sort, max_pairs)
        if keys is None:
            continue
        hits, pairs = _rule_confidence(keys, ek, er, R)
        if len(m.sort) == 1:  # "r => r" is no rule
            hits[m.sort[0]] = 0
        m.pairs = pairs
        if pairs:
            best = int(torch.argmax(hits))
            m.head, m.hits = best, int(hits[best])
            m.confidence = m.hits / pairs
            m.head_name = relations[best] if relations is not None else str(best)


def mine_sorts(edge_index: Tensor, edge_type: Tensor, num_nodes: int, *,
               num_relations: int | None = None, relations: Sequence[str] | None = None,
               max_length: int = 2, min_length: int = 2, top: int = 20,
               min_support: int = 1, rank: str = "support", confidence: bool = True,
               backtrack: bool = True, inverse: dict[int, int] | None = None,
               beam: int = 200, max_pairs: int = 20_000_000) -> list[MinedSort]:
    """The relation paths of length ``min_length..max_length`` that occur in a graph, best first.

    ``edge_index`` (2, E) [head; tail] and ``edge_type`` (E,) should be the *training* graph
    only (a valid/test edge here leaks into the model). Paths are ranked by ``support`` (walk
    instances) or by ``confidence`` (of the rule ``path => head relation``, among the
    ``beam`` best supported). Length-1 sorts exist in every graph and are not listed with the
    default ``min_length=2``. Longer paths extend the ``beam`` best supported prefixes.
    ``backtrack=False`` drops paths that step back along an inverse (``r . r^-1``), found from
    ``inverse`` ({relation: its inverse}) or from the ``^-1`` names.
    """
    N = check_num_nodes(num_nodes)
    check_edges(edge_index, N)
    check_edge_type(edge_type, edge_index.shape[1])
    for name, v, lo in (("max_length", max_length, 1), ("min_length", min_length, 1),
                        ("top", top, 1), ("beam", beam, 1), ("min_support", min_support, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"mine_sorts: {name} must be an int >= {lo}, got {v!r}")
    if min_length > max_length:
        raise ValueError(f"mine_sorts: min_length={min_length} > max_length={max_length}")
    if max_length > 4:
        raise ValueError(f"mine_sorts: max_length must be <= 4 (the number of paths grows as "
                         f"R^L), got {max_length}")
    if rank not in ("support", "confidence"):
        raise ValueError(f"mine_sorts: rank must be 'support' or 'confidence', got {rank!r}")
    src, dst, et = edge_index[0].long(), edge_index[1].long(), edge_type.long()
    R = num_relations if num_relations is not None else (
        len(relations) if relations is not None else int(et.max()) + 1 if et.numel() else 1)
    if et.numel() and int(et.max()) >= R:
        raise ValueError(f"edge_type ids must be < num_relations={R}, got max {int(et.max())}")
    if relations is not None and len(relations) != R:
        raise ValueError(f"relations names {len(relations)} relations, the graph has {R}")
    if inverse is None and relations is not None:
        index = {n: i for i, n in enumerate(relations)}
        inverse = {i: index[inverse_name(n)] for i, n in enumerate(relations)
                   if inverse_name(n) in index}
    inverse = inverse or {}
    found = _supports(src, dst, et, R, N, min_length, max_length, min_support, beam,
                      lambda s: backtrack or not _backtracks(s, inverse))
    found.sort(key=lambda t: -t[1])
    found = found[:top] if rank == "support" else found[:beam]
    out = [MinedSort(s, sort_name(s, relations), sup) for s, sup in found]
    if confidence or rank == "confidence":
        _confidences(out, src, dst, et, R, N, relations, max_pairs)
    if rank == "confidence":
        out = [m for m in out if m.confidence is not None]
        out.sort(key=lambda m: (-m.confidence, -m.support))
        out = out[:top]
    return out


def single_and_mined_sorts(edge_index: Tensor, edge_type: Tensor, num_nodes: int,
                           num_relations: int, *, relations: Sequence[str] | None = None,
                           max_length: int = 2, top: int = 10,
                           backtrack: bool = True) -> tuple[list[tuple[int, ...]], list]:
    """The sorts of an encoder over mined paths: every relation alone, then the ``top`` best
    supported paths of length 2..``max_length`` of this (training) graph; returns (sorts, the
    ``MinedSort``s)."""
    mined = mine_sorts(edge_index, edge_type, num_nodes, num_relations=num_relations,
                       relations=relations, max_length=max_length, top=top, confidence=False,
                       backtrack=backtrack)
    return [(r,) for r in range(num_relations)] + [m.sort for m in mined], mined

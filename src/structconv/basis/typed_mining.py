"""Metapath mining: the sorts over typed relations a typed graph holds, best supported first.

``mine_sorts`` mines relation paths on a graph with one node type; on a typed graph a path must
also respect the node types: relation ``(s, r, d)`` may only be followed by a relation leaving
``d``. ``mine_metapaths`` walks the graph's schema: each path of length L + 1 extends one of
length L by a relation starting where it ends, so a typed-invalid path is never formed. Walk
counts are pushed along the relations' edges (one (n_type,) vector of walks ending at each node
per path, no path materialised): the support of a path is 1ᵀ A_r1 ··· A_rL 1, its walk
instances, as ``mine_sorts`` counts them. The paths are named as ``metapath_edges``, ``HANConv``
and the ``[model.hetero]`` ``metapaths`` key take them (``"movie.to.actor.to.movie"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .edges import check_edges
from .typed import metapath_edges, typed_graph_parts

__all__ = ["MinedMetapath", "mine_metapaths", "metapath_name"]

EdgeType = tuple[str, str, str]


@dataclass
class MinedMetapath:
    """A typed relation path found in a graph: ``path`` its edge types (each one's dst type the
    next one's src type), ``name`` the dotted sort (``"movie.to.actor.to.movie"``),
    ``support`` its walk instances, ``pairs`` the distinct (start, end) node pairs its walks
    join (the edges of its metapath graph; None where not computed)."""

    path: tuple[EdgeType, ...]
    name: str
    support: int
    pairs: int | None = None

    @property
    def start(self) -> str:
        return self.path[0][0]

    @property
    def end(self) -> str:
        return self.path[-1][2]

    def as_dict(self) -> dict:
        return {"path": [list(e) for e in self.path], "name": self.name,
                "support": self.support, "pairs": self.pairs}


def metapath_name(path: Sequence[EdgeType]) -> str:
    """The dotted name of a typed path: node types and relations alternating
    (``"author.writes.paper.in.venue"``), what ``parse_metapath`` reads back where no name
    holds a dot."""
    path = [tuple(e) for e in path]
    if not path:
        raise ValueError("metapath_name: the path is empty")
    return ".".join([path[0][0], *(x for _, r, d in path for x in (r, d))])


def _parts(graph) -> tuple[dict[str, int], dict[EdgeType, Tensor]]:
    """(num_nodes, edge_index dict) of a ``HeteroGraph`` or a pair of them, checked."""
    num, edges = typed_graph_parts(graph, "mine_metapaths")
    out = {}
    for et, ei in edges.items():
        if len(et) != 3 or et[0] not in num or et[2] not in num:
            raise ValueError(f"mine_metapaths: edge type {et} must be (src, relation, dst) "
                             f"between node types of {sorted(num)}")
        check_edges(ei, max(num[et[0]], 1), max(num[et[2]], 1))
        out[et] = ei
    return num, out


def _check(max_length, min_length, top, beam, min_support, max_pairs) -> None:
    for name, v, lo, hi in (("max_length", max_length, 1, 4), ("min_length", min_length, 1, 4),
                            ("top", top, 1, None), ("beam", beam, 1, None),
                            ("min_support", min_support, 1, None),
                            ("max_pairs", max_pairs, 1, None)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi and v > hi):
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise ValueError(f"mine_metapaths: {name} must be an int {bound}, got {v!r}")
    if min_length > max_length:
        raise ValueError(f"mine_metapaths: min_length={min_length} > max_length={max_length}")


def _keys(ei: Tensor, n_dst: int, flip: bool = False) -> Tensor:
    """The sorted keys src * n_dst + dst of edges ``ei`` (read dst -> src where ``flip``)."""
    s, d = (ei[1], ei[0]) if flip else (ei[0], ei[1])
    return torch.sort(s.long() * n_dst + d.long())[0]


def _inverses(num, ets: list[EdgeType], edges: dict) -> set[tuple[int, int]]:
    """(a, b) where relation b is relation a reversed: types swapped, the same edges flipped."""
    out = set()
    for a, ea in enumerate(ets):
        for b, eb in enumerate(ets):
            if (eb[0], eb[2]) == (ea[2], ea[0]) and edges[ea].shape == edges[eb].shape and \
                    torch.equal(_keys(edges[ea], num[ea[2]]),
                                _keys(edges[eb], num[eb[0]], flip=True)):
                out.add((a, b))
    return out


def _push(v: Tensor, ei: Tensor, n_dst: int) -> Tensor:
    """(n_dst,) walk counts one step further along the edges ``ei`` from counts ``v``."""
    return torch.zeros(n_dst, dtype=torch.float64).index_add_(0, ei[1].long(), v[ei[0].long()])


def _levels(num, edges, ets, start, max_length, beam, back) -> dict[tuple[int, ...], int]:
    """{path (relation ids): support} of every supported typed path up to ``max_length``
    starting at ``start`` (any type where None); a length extends the ``beam`` best supported
    paths of the one before (all of them where there are no more). A candidate's support is
    its prefix's walk ends times the relation's out-degrees: only the beam's walk-end vectors
    are built."""
    outdeg = [torch.bincount(edges[et][0].long(), minlength=num[et[0]]).double() for et in ets]
    found: dict[tuple[int, ...], int] = {}
    prefixes: list = [((), None)]  # (path, (n_end,) walks ending at each node; None: start)
    for length in range(1, max_length + 1):
        cands = []
        for p, v in prefixes:
            for r, (s, _, _) in enumerate(ets):
                if (s != ets[p[-1]][2] or (p[-1], r) in back) if p else \
                        (start is not None and s != start):
                    continue
                sup = float(outdeg[r].sum() if v is None else v @ outdeg[r])
                if sup > 0:  # zero walks extend to zero
                    cands.append((p + (r,), sup, v))
        found.update((p, int(sup)) for p, sup, _ in cands)
        if length == max_length:
            break
        # the beam best supported, ties in path order: what the next length extends
        best = sorted(sorted(cands, key=lambda t: t[0]), key=lambda t: -t[1])[:beam]
        best.sort(key=lambda t: t[0])
        prefixes = [(p, _push(torch.ones(num[ets[p[-1]][0]], dtype=torch.float64) if v is None
                              else v, edges[ets[p[-1]]], num[ets[p[-1]][2]]))
                    for p, _, v in best]
    return found


def mine_metapaths(graph, start: str | None = None, end: str | None = None, *,
                   max_length: int = 2, min_length: int = 1, top: int = 10,
                   min_support: int = 1, beam: int = 200, backtrack: bool = True,
                   pairs: bool = False, max_pairs: int = 20_000_000) -> list[MinedMetapath]:
    """The typed relation paths of length ``min_length..max_length`` of a typed graph (a
    ``sc.data.HeteroGraph`` or a pair (num_nodes dict, edge_index dict)) from node type
    ``start`` to node type ``end`` (None: any), best supported first.

    A path follows the node types (each relation leaves the type the previous one enters), has
    at least ``min_support`` walk instances (1ᵀ A_r1 ··· A_rL 1 over the unnormalised
    relations: a repeated edge counts twice), and ties are broken by length, then by the order
    of the graph's edge types. Paths longer than one extend the ``beam`` best supported of the
    length before: the result is exact (every supported path, the brute force's ranking)
    where no length has more than ``beam`` supported paths. ``backtrack=False`` drops a step
    straight back along the reverse of the relation just taken (a relation whose edges are the
    previous one's flipped: ``movie.to.actor.to.movie`` steps back; typed metapaths such as
    HAN's usually do, so it is allowed by default). ``pairs`` counts each result's distinct
    (start, end) node pairs (its ``metapath_edges``), left None where a prefix has more than
    ``max_pairs`` walks (walks bound pairs; its product would be large). Each result's
    ``name`` feeds ``metapath_edges``, ``metapath_basis``, ``HANConv`` metadata and the
    ``[model.hetero]`` ``metapaths`` key.
    """
    num, edges = _parts(graph)
    _check(max_length, min_length, top, beam, min_support, max_pairs)
    for what, t in (("start", start), ("end", end)):
        if t is not None and t not in num:
            raise ValueError(f"mine_metapaths: {what} must be a node type of the graph "
                             f"({', '.join(num)}), got {t!r}")
    ets = list(edges)
    back = set() if backtrack else _inverses(num, ets, edges)
    found = _levels(num, edges, ets, start, max_length, beam, back)
    keep = [(p, s) for p, s in found.items() if len(p) >= min_length and s >= min_support
            and (end is None or ets[p[-1]][2] == end)]
    keep.sort(key=lambda t: (-t[1], len(t[0]), t[0]))
    out = []
    for p, s in keep[:top]:
        path = tuple(ets[r] for r in p)
        m = MinedMetapath(path, metapath_name(path), s)
        if pairs and max(found[p[:j]] for j in range(1, len(p) + 1)) <= max_pairs:
            m.pairs = int(metapath_edges((num, edges), path).shape[1])
        out.append(m)
    return out

"""Typed neighbour sampling: a fanout per relation and hop over a typed graph (``HeteroGraph``).

``TypedNeighborSampler`` holds one CSR of incoming edges per relation ``(src, rel, dst)`` (a
bipartite ``NeighborSampler``: targets of type dst, sources of type src) and draws, hop by hop,
for every relation, up to its fanout of the relation's incoming edges of each node of its target
type that the previous hop reached (the seeds at hop 1); each node type's new sources, over every
relation leaving that type, join its node set in increasing id. A ``TypedSample`` is therefore
nested per node type, as the homogeneous ``Sample``: U_0^t ⊆ U_1^t ⊆ ... (seeds first), and per
relation the block of hop h (targets in U_{h-1}^dst, sources in U_h^src) is the block of hop h-1
followed by the new frontier's edges. Fanout "all" (-1) keeps every edge of a relation; 0 draws
none of it at that hop.

The draws are the homogeneous sampler's (Floyd's algorithm, the smallest random keys above
``floyd_max_fanout``, uniform slots with replacement) with counter-based random numbers keyed by
(base seed, hop, relation, the node's index in its frontier, slot): relation r of hop h uses the
key ``hop_key(base, h, r)`` (relation 0's is the homogeneous hop key, so one relation sampled
typed or homogeneous draws the same). The compiled kernel (``sample_typed`` of
``kernels/sampler.cpp``: a loop over relations, each parallel over its frontier) and the torch
ops compute the same samples for a generator state, on any thread count.

A typed layer consumes a hop as a ``TypedBlock``: an ``edge_index`` dict in local ids (sources
index U_h^src, targets U_{h-1}^dst, the targets being the first rows of their type) with the node
counts per type, so ``layer(x_dict, block.edge_index)`` runs unchanged on the block's source
rows and its first ``block.num_dst[t]`` output rows per type are exact (``apply_typed_layers``
trims them). The whole sample (``TypedSample.block(H)``) serves a model as a graph: every layer
on every sampled node, the seeds' outputs exact at fanout "all" (PyG's sampled subgraph). The
layers normalise over the edges they are given (the sample's degrees; equal to the full
graph's at fanout "all"); ``TypedBlock.basis`` gives a relation's rectangular basis alone.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..basis.graph import PowerBasis
from ..basis.typed import TypedBasis, relation_operator, typed_basis
from .sampler import ALL, NeighborSampler, base_seed, check_fanout, check_seeds, hop_key

__all__ = ["TypedNeighborSampler", "TypedSample", "TypedBlock", "typed_fanouts",
           "apply_typed_layers", "trim"]

EdgeType = tuple[str, str, str]


def _graph(graph) -> tuple[dict[str, int], dict[EdgeType, Tensor]]:
    """(num_nodes per type, edge_index per edge type) of a ``HeteroGraph`` or such a pair."""
    num = getattr(graph, "num_nodes", None)
    edges = getattr(graph, "edge_index", None)
    if isinstance(graph, tuple) and len(graph) == 2:
        num, edges = graph
    if not isinstance(num, Mapping) or not isinstance(edges, Mapping):
        raise TypeError("a typed sampler needs a typed graph: a sc.data.HeteroGraph or a pair "
                        f"(num_nodes dict, edge_index dict), got {type(graph).__name__}")
    return {str(t): int(n) for t, n in num.items()}, {_edge_type(e): v for e, v in edges.items()}


def _edge_type(et) -> EdgeType:
    parts = tuple(et.split("__")) if isinstance(et, str) else tuple(et) \
        if isinstance(et, (tuple, list)) else ()
    if len(parts) == 2:
        parts = (parts[0], "to", parts[1])
    if len(parts) != 3 or not all(isinstance(p, str) for p in parts):
        raise ValueError(f"an edge type must be (src, relation, dst) strings, got {et!r}")
    return parts


def _typed_fanout(f, what: str) -> int:
    """A typed fanout: a positive int, -1 / "all" (every edge) or 0 (none of the relation)."""
    if isinstance(f, numbers.Integral) and not isinstance(f, bool) and int(f) == 0:
        return 0
    return check_fanout(f, what)


def typed_fanouts(fanouts, edge_types: Sequence[EdgeType]) -> list[list[int]]:
    """Fanouts as a (hops, relations) table: ``fanouts`` one list for every relation (entry h
    for hop h + 1, PyG's order: the first for the seeds) or a dict {edge type: list} naming
    every relation (an edge type as a triple or ``"src__rel__dst"``), all of one length. Each
    entry a positive int, -1 / "all" or 0 (the relation draws nothing at that hop)."""
    ets = [tuple(e) for e in edge_types]
    if isinstance(fanouts, Mapping):
        given = {_edge_type(k): v for k, v in fanouts.items()}
        unknown = [e for e in given if e not in ets]
        missing = [e for e in ets if e not in given]
        if unknown or missing:
            raise ValueError(f"fanouts must name every edge type of the graph {ets} (0 for none "
                             f"of one), got unknown {unknown} and missing {missing}")
        per = {e: given[e] for e in ets}
    else:
        per = {e: fanouts for e in ets}
    lengths = set()
    for e, fs in per.items():
        if isinstance(fs, (str, Tensor)) or not isinstance(fs, Sequence):
            raise ValueError(f"fanouts of {e} must be a list (one per hop), got {fs!r}")
        lengths.add(len(fs))
    if len(lengths) > 1:
        raise ValueError(f"fanouts must give every relation the same number of hops, got "
                         f"{ {e: len(v) for e, v in per.items()} }")
    H = lengths.pop() if lengths else len(fanouts) if not isinstance(fanouts, Mapping) else 0
    return [[_typed_fanout(per[e][h], f"fanouts[{e}][{h}]") for e in ets] for h in range(H)]


# ------------------------------------------------------------------------------------------------
@dataclass
class TypedBlock:
    """One hop of a typed sample as typed layers take it: ``edge_index`` {(s, rel, d): (2, E)}
    local [source in U_h^s; target in U_{h-1}^d], ``num_src`` {t: |U_h^t|}, ``num_dst``
    {t: |U_{h-1}^t|} (the first rows of each type's sources), ``edge_ids`` {(s, rel, d): (E,)}
    the edges' positions in the graph's edge_index of that type, ``edge_attr`` their features
    (empty without)."""

    edge_index: dict[EdgeType, Tensor]
    num_src: dict[str, int]
    num_dst: dict[str, int]
    edge_ids: dict[EdgeType, Tensor]
    edge_attr: dict[EdgeType, Tensor] = field(default_factory=dict)

    @property
    def edge_index_dict(self) -> dict[EdgeType, Tensor]:
        return dict(self.edge_index)

    @property
    def edge_attr_dict(self) -> dict[EdgeType, Tensor]:
        return dict(self.edge_attr)

    def basis(self, edge_type, normalization: str | None = "mean", dtype=None) -> PowerBasis:
        """Relation ``edge_type``'s restricted rectangular basis (1, |U_h^s|, |U_{h-1}^d|),
        normalised over the block's edges (``"mean"``, ``"sym"`` or None); a relation without
        edges gives a zero basis. A basis has at least one row and column: a relation whose
        source or target type has no node in the block raises (its convolution is empty)."""
        s, _, d = et = _edge_type(edge_type)
        if et not in self.edge_index:
            raise ValueError(f"no edge type {et} in this block: it has {list(self.edge_index)}")
        if not self.num_src[s] or not self.num_dst[d]:
            raise ValueError(f"relation {et} has {self.num_src[s]} source and "
                             f"{self.num_dst[d]} target nodes in this block: a basis needs "
                             "at least one of each")
        return PowerBasis(relation_operator(self.edge_index[et], self.num_src[s],
                                            self.num_dst[d], normalization, dtype=dtype), (1,))

    def typed_basis(self, normalization: str | None = "mean", dtype=None) -> TypedBasis:
        """Every relation of the block as one ``TypedBasis`` over the concatenated source sets
        U_h^t (square: the targets are their first rows)."""
        return typed_basis(self.num_src, self.edge_index, list(self.edge_index), normalization,
                           dtype)

    def with_features(self, edge_attr: Mapping | None) -> TypedBlock:
        """This block carrying its edges' rows of the graph's ``edge_attr`` {type: (E_t, ...)}."""
        if not edge_attr:
            return self
        got = {et: a[self.edge_ids[et].to(a.device)] for et, a in edge_attr.items()
               if et in self.edge_ids}
        return TypedBlock(self.edge_index, self.num_src, self.num_dst, self.edge_ids, got)

    def _map(self, fn) -> TypedBlock:
        return TypedBlock({k: fn(v) for k, v in self.edge_index.items()}, dict(self.num_src),
                          dict(self.num_dst), {k: fn(v) for k, v in self.edge_ids.items()},
                          {k: fn(v) for k, v in self.edge_attr.items()})

    def to(self, device=None, non_blocking: bool = False) -> TypedBlock:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))


class TypedSample:
    """A typed sampled neighbourhood over H hops, nested per node type (module doc).

    ``node_ids`` {t: (n_t,)} global ids of type t, seeds first; ``node_counts`` {t: H+1 ints}
    cumulative |U_0^t| <= ... <= |U_H^t|; ``edge_index`` {(s, rel, d): (2, E)} local [source;
    target] grouped by hop, ``edge_ids`` {(s, rel, d): (E,)} positions in the graph's edges of
    that type, ``edge_counts`` {(s, rel, d): H ints} cumulative. Every node type and edge type
    of the graph is present (with no rows where the sample has none).
    """

    def __init__(self, node_ids: dict, node_counts: dict, edge_index: dict, edge_ids: dict,
                 edge_counts: dict, *, check: bool = True):
        self.node_ids, self.edge_index, self.edge_ids = node_ids, edge_index, edge_ids
        self.node_counts = {t: tuple(int(c) for c in v) for t, v in node_counts.items()}
        self.edge_counts = {e: tuple(int(c) for c in v) for e, v in edge_counts.items()}
        self.num_hops = len(next(iter(self.node_counts.values()), (0,))) - 1
        for t, c in self.node_counts.items():
            if len(c) != self.num_hops + 1 or c[-1] != node_ids[t].shape[0] or \
                    list(c) != sorted(c):
                raise ValueError(f"TypedSample: node_counts[{t!r}] {c} must be {self.num_hops+1}"
                                 f" cumulative counts ending at {node_ids[t].shape[0]} nodes")
        for e, c in self.edge_counts.items():
            if len(c) != self.num_hops or (c and c[-1] != edge_index[e].shape[1]) or \
                    list(c) != sorted(c) or edge_ids[e].shape[0] != edge_index[e].shape[1]:
                raise ValueError(f"TypedSample: edge_counts[{e}] {c} must be {self.num_hops} "
                                 f"cumulative counts of its {edge_index[e].shape[1]} edges")
        if check:
            self._check_hops()

    def _check_hops(self) -> None:
        for (s, r, d), ei in self.edge_index.items():
            lo, cs, cd = 0, self.node_counts[s], self.node_counts[d]
            for h in range(1, self.num_hops + 1):
                e = ei[:, lo:self.edge_counts[(s, r, d)][h - 1]]
                t_lo = cd[h - 2] if h >= 2 else 0
                if e.shape[1] and (int(e[1].min()) < t_lo or int(e[1].max()) >= cd[h - 1] or
                                   int(e[0].min()) < 0 or int(e[0].max()) >= cs[h]):
                    raise ValueError(f"TypedSample: hop {h} of {(s, r, d)} must go from "
                                     f"sources in [0, {cs[h]}) to targets in [{t_lo}, "
                                     f"{cd[h - 1]})")
                lo = self.edge_counts[(s, r, d)][h - 1]

    @property
    def node_types(self) -> list[str]:
        return list(self.node_ids)

    @property
    def edge_types(self) -> list[EdgeType]:
        return list(self.edge_index)

    @property
    def seeds(self) -> dict[str, Tensor]:
        """{t: (S_t,)} the seeds of each type (the first S_t of ``node_ids[t]``)."""
        return {t: v[:self.node_counts[t][0]] for t, v in self.node_ids.items()}

    def block(self, hop: int) -> TypedBlock:
        """The block of hop ``hop`` (1..H): every sampled edge into U_{hop-1}, sources in
        U_hop, per relation."""
        if not 1 <= hop <= self.num_hops:
            raise ValueError(f"hop must lie in [1, {self.num_hops}], got {hop}")
        k = {e: c[hop - 1] for e, c in self.edge_counts.items()}
        return TypedBlock({e: v[:, :k[e]] for e, v in self.edge_index.items()},
                          {t: c[hop] for t, c in self.node_counts.items()},
                          {t: c[hop - 1] for t, c in self.node_counts.items()},
                          {e: v[:k[e]] for e, v in self.edge_ids.items()})

    def to(self, device=None, non_blocking: bool = False) -> TypedSample:
        def mv(d):
            return {k: v.to(device, non_blocking=non_blocking) for k, v in d.items()}
        return TypedSample(mv(self.node_ids), self.node_counts, mv(self.edge_index),
                           mv(self.edge_ids), self.edge_counts, check=False)

    def __repr__(self):
        return (f"TypedSample(hops={self.num_hops}, node_counts={self.node_counts}, "
                f"edges={ {e: c[-1] if c else 0 for e, c in self.edge_counts.items()} })")


# ------------------------------------------------------------------------------------------------
class TypedNeighborSampler:
    """The incoming edges of each relation of a typed graph as a CSR, and nested per-hop typed
    neighbour sampling (module doc).

    ``graph`` a ``HeteroGraph`` (or a pair (num_nodes dict, edge_index dict)); an edge type
    with no edges, and a node type with no nodes, are fine. Memory per relation: two (E_r,)
    int64 tensors and a (n_dst + 1,) row pointer. ``native``: the compiled sampler on CPU (None:
    where it can be built; False: the torch ops); both give the same samples.
    """

    #: uniform draws of at most this many neighbours use Floyd's algorithm (as NeighborSampler)
    floyd_max_fanout = NeighborSampler.floyd_max_fanout

    def __init__(self, graph, *, native: bool | None = None):
        self.num_nodes, edges = _graph(graph)
        self.node_types = list(self.num_nodes)
        self.edge_types = list(edges)
        self.native = native
        self.relations: dict[EdgeType, NeighborSampler] = {}
        for (s, r, d), ei in edges.items():
            for t in (s, d):
                if t not in self.num_nodes:
                    raise ValueError(f"edge type {(s, r, d)} names node type {t!r}, not among "
                                     f"{self.node_types}")
            # a type without nodes has no edges: its CSR has one empty row
            self.relations[(s, r, d)] = NeighborSampler(
                ei, max(self.num_nodes[d], 1), num_src=max(self.num_nodes[s], 1), native=False)
        self._index = {t: i for i, t in enumerate(self.node_types)}

    def __repr__(self):
        return (f"TypedNeighborSampler(types={len(self.node_types)}, relations="
                f"{len(self.edge_types)})")

    def compiled(self):
        """The compiled sampler module when this sampler uses it (CPU, built), else None."""
        dev = next((rs.rowptr.device for rs in self.relations.values()), torch.device("cpu"))
        if self.native is False or dev.type != "cpu":
            return None
        from ..kernels import native

        ext = native.sampler()
        return ext if ext is not None and hasattr(ext, "sample_typed") else None

    def check_seeds(self, seeds) -> dict[str, Tensor]:
        """``seeds`` {type: ids} (or a pair (type, ids)) as {t: (S_t,) int64} for every node
        type (empty where none are given); raise on an unknown type or bad ids."""
        if isinstance(seeds, tuple) and len(seeds) == 2 and isinstance(seeds[0], str):
            seeds = {seeds[0]: seeds[1]}
        if not isinstance(seeds, Mapping):
            raise TypeError(f"seeds must be a dict {{node type: ids}} or a pair (type, ids), "
                            f"got {type(seeds).__name__}")
        unknown = [t for t in seeds if t not in self.num_nodes]
        if unknown:
            raise ValueError(f"seeds name node types {unknown}, not among {self.node_types}")
        dev = next((rs.rowptr.device for rs in self.relations.values()), torch.device("cpu"))
        out = {}
        for t in self.node_types:
            if t in seeds:
                out[t] = check_seeds(seeds[t], max(self.num_nodes[t], 1),
                                     f"seeds[{t!r}]").to(dev)
            else:
                out[t] = torch.zeros(0, dtype=torch.long, device=dev)
        return out

    def sample(self, seeds, fanouts, *, replace: bool = False,
               generator: torch.Generator | None = None) -> TypedSample:
        """The nested typed neighbourhood of ``seeds`` ({type: ids}) over the hops of
        ``fanouts`` (``typed_fanouts``: one list for every relation, or a dict per edge type;
        the first entry for the seeds). ``replace`` draws f uniform edges per node with
        replacement. One number is drawn from ``generator`` unless every fanout is "all" / 0."""
        seeds = self.check_seeds(seeds)
        fs = typed_fanouts(fanouts, self.edge_types)
        draws = any(f not in (ALL, 0) for row in fs for f in row)
        base = base_seed(generator) if draws else 0
        keys = [[hop_key(base, h, r) for r in range(len(self.edge_types))]
                for h in range(len(fs))]
        ext = self.compiled()
        if ext is not None:
            return self._sample_native(ext, seeds, fs, keys, bool(replace))
        return self._sample_torch(seeds, fs, keys, bool(replace))

    def _sample_native(self, ext, seeds, fs, keys, replace) -> TypedSample:
        rels = [self.relations[e] for e in self.edge_types]
        T, R, H = len(self.node_types), len(self.edge_types), len(fs)
        out = ext.sample_typed([r.rowptr for r in rels], [r.sources for r in rels],
                               [r.perm for r in rels],
                               [self._index[e[0]] for e in self.edge_types],
                               [self._index[e[2]] for e in self.edge_types],
                               [seeds[t] for t in self.node_types],
                               [f for row in fs for f in row], [k for row in keys for k in row],
                               H, replace, self.floyd_max_fanout)
        nc, ec = out[T].tolist(), out[T + 1 + 2 * R].tolist()
        return TypedSample(dict(zip(self.node_types, out[:T])), dict(zip(self.node_types, nc)),
                           dict(zip(self.edge_types, out[T + 1:T + 1 + R])),
                           dict(zip(self.edge_types, out[T + 1 + R:T + 1 + 2 * R])),
                           dict(zip(self.edge_types, ec)), check=False)

    def _draws(self, frontier: dict, lo: dict, fs_h, keys_h, replace) -> dict:
        """One hop's draws per relation: {r: (sources (global), edge ids, targets (local))}."""
        out = {}
        for r, et in enumerate(self.edge_types):
            f, d = fs_h[r], et[2]
            if f == 0 or not frontier[d].numel():
                continue
            rs = self.relations[et]
            rs.floyd_max_fanout = self.floyd_max_fanout
            eid, src, seg = rs.draw_keyed(frontier[d], f, keys_h[r], replace=replace)
            out[r] = (src, eid, lo[d] + seg)
        return out

    def _sample_torch(self, seeds, fs, keys, replace) -> TypedSample:
        types, ets = self.node_types, self.edge_types
        state = {t: list(torch.sort(seeds[t])) for t in types}  # sorted ids, their local ids
        parts = {t: [seeds[t]] for t in types}
        counts = {t: [seeds[t].shape[0]] for t in types}
        edges = {e: [] for e in ets}
        ecounts = {e: [] for e in ets}
        for h in range(len(fs)):
            frontier = {t: parts[t][-1] for t in types}
            lo = {t: counts[t][-1] - frontier[t].shape[0] for t in types}
            drawn = self._draws(frontier, lo, fs[h], keys[h], replace)
            for t in types:
                mine = [r for r in drawn if ets[r][0] == t]
                src = torch.cat([drawn[r][0] for r in mine]) if mine else seeds[t][:0]
                loc, new = _relabel(state[t], src, counts[t][-1])
                for r, v in zip(mine, loc.split([drawn[r][0].shape[0] for r in mine])):
                    edges[ets[r]].append((torch.stack([v, drawn[r][2]]), drawn[r][1]))
                parts[t].append(new)
                counts[t].append(counts[t][-1] + new.shape[0])
            for e in ets:
                ecounts[e].append(sum(ei.shape[1] for ei, _ in edges[e]))
        dev = seeds[types[0]].device if types else torch.device("cpu")
        none = torch.zeros(0, dtype=torch.long, device=dev)
        ei = {e: torch.cat([a for a, _ in v], 1) if v else none.view(2, 0)
              for e, v in edges.items()}
        eid = {e: torch.cat([b for _, b in v]) if v else none for e, v in edges.items()}
        return TypedSample({t: torch.cat(parts[t]) for t in types}, counts, ei, eid, ecounts)


def _relabel(state: list, src: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Local ids of ``src`` (global ids of one node type): seen nodes keep theirs, the new ones
    (sorted) are numbered from ``n``; ``state`` [sorted ids, their local ids] is updated.
    Returns (local ids, the new nodes)."""
    sorted_ids, local_of = state
    at = torch.searchsorted(sorted_ids, src).clamp(max=max(sorted_ids.shape[0] - 1, 0))
    seen = sorted_ids[at] == src if sorted_ids.numel() else torch.zeros_like(
        src, dtype=torch.bool)
    loc = torch.where(seen, local_of[at], torch.zeros_like(src)) if sorted_ids.numel() else \
        torch.zeros_like(src)
    new, inv = torch.unique(src[~seen], return_inverse=True)
    loc[~seen] = n + inv
    new_local = torch.arange(n, n + new.shape[0], device=src.device)
    state[0], o = torch.sort(torch.cat([sorted_ids, new]))
    state[1] = torch.cat([local_of, new_local])[o]
    return loc, new


# ------------------------------------------------------------------------------------------------
def trim(out: Mapping, sizes: Mapping[str, int]) -> dict:
    """{t: out[t][:sizes[t]]}: a layer's outputs cut to its block's target rows per type."""
    return {t: v[:sizes[t]] if t in sizes else v for t, v in out.items()}


def apply_typed_layers(layers: Sequence, x_dict: Mapping, blocks: Sequence[TypedBlock],
                       act=None, edge_attr: bool = False) -> dict:
    """Typed layers in order on a typed mini-batch's blocks (input layer first): each called
    ``layer(x_dict, block.edge_index)`` (and ``block.edge_attr`` with ``edge_attr``) on its
    block's source rows, its outputs trimmed to the block's targets; ``act`` (per type) between
    layers, not after the last. Returns {t: (|U_0^t|, Q)} for the types the last layer yields."""
    if len(layers) != len(blocks):
        raise ValueError(f"{len(layers)} layers but {len(blocks)} blocks")
    x = dict(x_dict)
    for i, (layer, b) in enumerate(zip(layers, blocks)):
        x = {t: v[:b.num_src[t]] if t in b.num_src else v for t, v in x.items()}
        out = layer(x, b.edge_index, b.edge_attr) if edge_attr else layer(x, b.edge_index)
        x = trim(out, b.num_dst)
        if act is not None and i < len(layers) - 1:
            x = {t: act(v) for t, v in x.items()}
    return x

"""Neighbour sampling over a CSR index of incoming edges, vectorised and reproducible.

``NeighborSampler`` sorts a graph's edges by target once (CSR over targets: the incoming edges of
every node are one contiguous range) and draws, hop by hop, up to ``fanout`` incoming edges of
every node of the frontier: uniformly or weighted by edge weight, without replacement, in torch
ops over all frontier nodes at once. Uniform draws use Floyd's algorithm (a loop over the fanout's
slots, O(fanout²) per node whatever its degree, so hubs cost no more than other nodes); weighted
draws (and fanouts above ``floyd_max_fanout``) keep the f smallest random keys of each node, one
segmented sort: Efraimidis-Spirakis keys E/w with E ~ Exp(1) draw f edges without replacement
with probabilities proportional to w. ``replace=True`` draws f uniform slots per node instead.

Random numbers are counter based (SplitMix64 of a base seed drawn from the generator, the hop,
the node's index in the frontier and the slot), so the compiled sampler (``kernels/sampler.cpp``,
used on CPU where it can be built) computes the very same draws, in parallel over the frontier
and the same on any thread count: both paths give identical samples for a given generator state.

A ``Sample`` holds the result in the DGL / PyG layout: node ids with the seeds first and every
hop's node set a prefix of the next (``node_counts`` cumulative), the sampled edges with local ids
grouped by hop (``edge_counts`` cumulative). Every node is sampled once, at the first hop that
reaches it, so the block of hop h (edges into the first ``node_counts[h-1]`` nodes) is the block
of hop h-1 followed by the new frontier's edges: the per-hop blocks are nested prefixes of one
edge list, which is what makes multi-hop restrictions (``restrict``) well defined.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..basis.edges import check_edges, check_num_nodes

__all__ = ["NeighborSampler", "Sample", "Block", "check_fanout", "check_seeds"]

#: the fanout meaning "every neighbour" (also spelt "all")
ALL = -1
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _signed(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v >> 63 else v


def _mix_int(x: int) -> int:
    """SplitMix64's output of x + golden (Python ints, 64-bit wrap)."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _lsr(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


_C1, _C2, _G = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB), _signed(_GOLDEN)


def _mix(x: Tensor) -> Tensor:
    """``_mix_int`` elementwise on int64 tensors (torch's int64 products wrap as uint64's)."""
    x = x + _G
    x = (x ^ _lsr(x, 30)) * _C1
    x = (x ^ _lsr(x, 27)) * _C2
    return x ^ _lsr(x, 31)


def hop_key(base: int, hop: int, relation: int = 0) -> int:
    """The counter key of hop ``hop`` of a sample drawn from ``base`` (signed int64); a typed
    sample's relation ``relation`` (its index) is mixed into the hop word (relation 0: the
    homogeneous key)."""
    return _signed(_mix_int(_mix_int(base) ^ (hop << 40) ^ (relation << 20)))


def _node_keys(key: int, index: Tensor) -> Tensor:
    """Each frontier node's key from its index in the frontier."""
    return _mix(index ^ key)


def _units(keys: Tensor, slots: Tensor) -> Tensor:
    """Uniform float64 in [0, 1) of (node key, slot) pairs: the top 53 bits of SplitMix64."""
    return _lsr(_mix(keys + slots), 11).to(torch.float64) * 2.0 ** -53


def base_seed(generator: torch.Generator | None) -> int:
    """A sample's base seed, one draw from ``generator`` (torch's global one when None): the
    only state a sample consumes."""
    return int(torch.randint(0, 2 ** 62, (1,), generator=generator))


def check_fanout(f, what: str = "fanout") -> int:
    """A fanout as an int: a positive int, or -1 for every neighbour (``"all"`` also means -1)."""
    if isinstance(f, str):
        if f == "all":
            return ALL
        raise ValueError(f"{what} must be a positive int, -1 or 'all', got {f!r}")
    if isinstance(f, Tensor) and f.dim() == 0 and not f.is_floating_point():
        f = int(f)
    if isinstance(f, bool) or not isinstance(f, numbers.Integral):
        raise ValueError(f"{what} must be a positive int, -1 or 'all', got {f!r}")
    f = int(f)
    if f == ALL:
        return ALL
    if f < 1:
        raise ValueError(f"{what} must be a positive int, -1 or 'all', got {f}")
    return f


def check_seeds(seeds, num_nodes: int, what: str = "seed ids") -> Tensor:
    """``seeds`` as a 1-d int64 tensor of distinct node ids in [0, num_nodes - 1] (else raise)."""
    if not isinstance(seeds, Tensor):
        seeds = torch.as_tensor(seeds)
    if seeds.dim() != 1:
        raise ValueError(f"{what} must be a 1-d tensor of node ids, got shape "
                         f"{tuple(seeds.shape)}")
    if seeds.is_floating_point() or seeds.is_complex() or seeds.dtype == torch.bool:
        raise TypeError(f"{what} must be integer node ids, got dtype {seeds.dtype}")
    seeds = seeds.long()
    if seeds.numel():
        lo, hi = int(seeds.min()), int(seeds.max())
        if lo < 0 or hi >= num_nodes:
            raise ValueError(f"{what} must lie in [0, {num_nodes - 1}] for {num_nodes} nodes, "
                             f"got values in [{lo}, {hi}]")
        if torch.unique(seeds).numel() != seeds.numel():
            raise ValueError(f"{what} must be distinct: {seeds.numel()} ids hold "
                             f"{torch.unique(seeds).numel()} distinct values")
    return seeds


def _ranges(start: Tensor, count: Tensor) -> tuple[Tensor, Tensor]:
    """The concatenated ranges [start_i, start_i + count_i) and each entry's range index i."""
    seg = torch.repeat_interleave(torch.arange(count.shape[0], device=count.device), count)
    first = torch.cumsum(count, 0) - count  # where each range begins in the output
    pos = start[seg] + torch.arange(seg.shape[0], device=count.device) - first[seg]
    return pos, seg


@dataclass
class Block:
    """One bipartite block: sampled edges (2, E) [source; target] in local ids, sources < num_src,
    targets < num_dst, the targets being the first num_dst sources; ``edge_ids`` (E,) the edges'
    positions in the full graph's edge_index; ``edge_attr`` (E, ...) their features, gathered by
    ``edge_ids`` (``with_features``), or None."""

    edge_index: Tensor
    num_src: int
    num_dst: int
    edge_ids: Tensor
    edge_attr: Tensor | None = None

    def to(self, device=None, non_blocking: bool = False) -> Block:
        return Block(self.edge_index.to(device, non_blocking=non_blocking), self.num_src,
                     self.num_dst, self.edge_ids.to(device, non_blocking=non_blocking),
                     None if self.edge_attr is None else
                     self.edge_attr.to(device, non_blocking=non_blocking))

    def with_features(self, edge_attr: Tensor | None) -> Block:
        """This block carrying its edges' rows of the full graph's ``edge_attr`` (E_full, ...)
        (None: as it is)."""
        if edge_attr is None:
            return self
        return Block(self.edge_index, self.num_src, self.num_dst, self.edge_ids,
                     edge_attr[self.edge_ids.to(edge_attr.device)])


class Sample:
    """A sampled neighbourhood of seed nodes over H hops, nested (see the module doc).

    ``node_ids`` (n_H,) global ids, seeds first; ``node_counts`` (H+1 ints) the cumulative sizes
    |U_0| <= ... <= |U_H| (U_0 the seeds, U_h the nodes within h hops); ``edge_index`` (2, E_s)
    local [source; target]; ``edge_ids`` (E_s,) their ids in the full graph; ``edge_counts`` (H
    ints) cumulative: the first edge_counts[h-1] edges are the block of hop h, with targets in
    U_{h-1} and sources in U_h. The nesting is checked on construction.
    """

    def __init__(self, node_ids: Tensor, edge_index: Tensor, edge_ids: Tensor,
                 node_counts: Sequence[int], edge_counts: Sequence[int], *, check: bool = True):
        self.node_ids, self.edge_index, self.edge_ids = node_ids, edge_index, edge_ids
        self.cache: dict = {}  # per-sample results of restrictions (the compiled CSR)
        self.node_counts = tuple(int(c) for c in node_counts)
        self.edge_counts = tuple(int(c) for c in edge_counts)
        H = len(self.edge_counts)
        if len(self.node_counts) != H + 1 or self.node_counts[-1] != node_ids.shape[0] or \
                (H and self.edge_counts[-1] != edge_index.shape[1]) or \
                edge_ids.shape != edge_index.shape[1:]:
            raise ValueError(f"Sample sizes disagree: node_counts {self.node_counts} for "
                             f"{node_ids.shape[0]} nodes, edge_counts {self.edge_counts} for "
                             f"{edge_index.shape[1]} edges and {edge_ids.shape[0]} edge ids")
        if list(self.node_counts) != sorted(self.node_counts) or \
                list(self.edge_counts) != sorted(self.edge_counts):
            raise ValueError(f"Sample node_counts {self.node_counts} and edge_counts "
                             f"{self.edge_counts} must be cumulative (non-decreasing)")
        if check:  # the compiled sampler's samples are nested by construction
            self._check_hops()

    def _check_hops(self) -> None:
        H, edge_index, lo_e = self.num_hops, self.edge_index, 0
        for h in range(1, H + 1):  # hop h's new edges: targets in the frontier U_{h-1} \ U_{h-2}
            e = edge_index[:, lo_e:self.edge_counts[h - 1]]
            t_lo = self.node_counts[h - 2] if h >= 2 else 0
            if e.shape[1] and (int(e[1].min()) < t_lo or int(e[1].max()) >= self.node_counts[
                    h - 1] or int(e[0].min()) < 0 or int(e[0].max()) >= self.node_counts[h]):
                raise ValueError(
                    f"Sample hop {h}: edges must go from sources in [0, {self.node_counts[h]}) "
                    f"to targets in [{t_lo}, {self.node_counts[h - 1]}), got sources in "
                    f"[{int(e[0].min())}, {int(e[0].max())}] and targets in "
                    f"[{int(e[1].min())}, {int(e[1].max())}]")
            lo_e = self.edge_counts[h - 1]

    def __getstate__(self):
        # the cache is keyed by restrictions (whole-graph values): never sent to another process
        return {**self.__dict__, "cache": {}}

    @property
    def num_hops(self) -> int:
        return len(self.edge_counts)

    @property
    def seeds(self) -> Tensor:
        """(S,) the seed (target) node ids, the first S of ``node_ids``."""
        return self.node_ids[:self.node_counts[0]]

    def block(self, hop: int) -> Block:
        """The block of hop ``hop`` (1..H): every sampled edge into U_{hop-1}, sources in U_hop."""
        if not 1 <= hop <= self.num_hops:
            raise ValueError(f"hop must lie in [1, {self.num_hops}], got {hop}")
        e = self.edge_counts[hop - 1]
        return Block(self.edge_index[:, :e], self.node_counts[hop], self.node_counts[hop - 1],
                     self.edge_ids[:e])

    def to(self, device=None, non_blocking: bool = False) -> Sample:
        return Sample(self.node_ids.to(device, non_blocking=non_blocking),
                      self.edge_index.to(device, non_blocking=non_blocking),
                      self.edge_ids.to(device, non_blocking=non_blocking),
                      self.node_counts, self.edge_counts)

    def __repr__(self):
        return (f"Sample(seeds={self.node_counts[0]}, node_counts={self.node_counts}, "
                f"edge_counts={self.edge_counts})")


class NeighborSampler:
    """The incoming edges of a graph's nodes as CSR, and nested per-hop neighbour sampling.

    Built once from ``edge_index`` (2, E) [source; target] over ``num_nodes`` nodes;
    ``edge_weight`` (E,) non-negative is needed only for weighted draws. Memory: two (E,) int64
    tensors (edge ids and sources in CSR order), the (num_nodes + 1,) row pointer, and the
    weights in CSR order when given. ``native``: the compiled sampler on CPU (None: where it can
    be built; False: the torch ops); both give the same samples. ``num_src`` makes it bipartite
    (one relation of a typed graph): sources in [0, num_src), targets in [0, num_nodes); its
    draws (``sample_neighbors``) are those of a square graph, but ``sample`` needs one node set.
    """

    #: uniform draws of at most this many neighbours use Floyd's algorithm (O(fanout²) work per
    #: node); larger fanouts, and weighted draws, sort random keys over whole neighbourhoods
    floyd_max_fanout = 64

    def __init__(self, edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None,
                 *, native: bool | None = None, num_src: int | None = None):
        n = check_num_nodes(num_nodes)
        m = n if num_src is None else check_num_nodes(num_src)
        check_edges(edge_index, m, n, edge_weight=edge_weight)
        src, dst = edge_index[0].long(), edge_index[1].long()
        perm = torch.argsort(dst, stable=True)
        self.num_nodes, self.num_edges, self.num_src = n, int(src.shape[0]), m
        self.native = native
        self.rowptr = torch.zeros(n + 1, dtype=torch.long, device=src.device)
        torch.cumsum(torch.bincount(dst, minlength=n), 0, out=self.rowptr[1:])
        self.perm = perm  # CSR position -> edge id
        self.sources = src[perm]  # CSR position -> source node
        self.weight = None
        if edge_weight is not None:
            w = edge_weight.detach()
            bad = ~torch.isfinite(w) | (w < 0)
            if bool(bad.any()):
                raise ValueError(f"edge_weight must be finite and >= 0 for weighted sampling, "
                                 f"got {float(w[bad][0])} at edge {int(bad.nonzero()[0])}")
            self.weight = w[perm]

    def degree(self, nodes: Tensor) -> Tensor:
        """(S,) the in-degrees of ``nodes``."""
        return self.rowptr[nodes + 1] - self.rowptr[nodes]

    def compiled(self):
        """The compiled sampler module when this sampler uses it (CPU, built), else None."""
        if self.native is False or self.rowptr.device.type != "cpu":
            return None
        from ..kernels import native

        return native.sampler()

    def sample_neighbors(self, nodes: Tensor, fanout, *, weighted: bool = False,
                         replace: bool = False,
                         generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Up to ``fanout`` incoming edges of each of ``nodes`` (S,), without replacement
        (``replace``: exactly ``fanout`` uniform draws of each node with edges).

        Returns (edge ids (P,), index into ``nodes`` of each edge's target (P,)), ordered by
        target node then CSR position. A node with at most ``fanout`` edges keeps them all
        (draws no random numbers); ``fanout`` -1 / "all" keeps every edge.
        """
        f = check_fanout(fanout)
        key = hop_key(base_seed(generator) if f != ALL else 0, 0)
        pos, seg = self._draw(nodes, f, weighted, replace, key)
        return self.perm[pos], seg

    def draw_keyed(self, nodes: Tensor, fanout: int, key: int, *, replace: bool = False,
                   weighted: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """One hop's draws with the counter key ``key`` (``hop_key``): (edge ids (P,), their
        sources (P,), index into ``nodes`` (S,) of their targets (P,)), by target then CSR
        position; ``fanout`` a checked int (-1: every edge). A typed sampler's step."""
        pos, seg = self._draw(nodes, fanout, weighted, replace, key)
        return self.perm[pos], self.sources[pos], seg

    def _draw(self, nodes: Tensor, f: int, weighted: bool, replace: bool,
              key: int) -> tuple[Tensor, Tensor]:
        """(CSR positions (P,), index into ``nodes`` (P,)) of the drawn edges."""
        self._check_mode(weighted, replace)
        start, deg = self.rowptr[nodes], self.degree(nodes)
        keys = _node_keys(key, torch.arange(nodes.shape[0], device=nodes.device))
        every = torch.ones_like(deg, dtype=torch.bool) if f == ALL else \
            (deg == 0 if replace else deg <= f)
        pos_a, seg_a = _ranges(start[every], deg[every])
        seg_a = every.nonzero().squeeze(1)[seg_a]
        idx = (~every).nonzero().squeeze(1)  # the nodes that draw
        if idx.numel() and replace:
            pos_b, seg_b = self._replace(start[idx], deg[idx], f, keys[idx])
        elif idx.numel() and not weighted and f <= self.floyd_max_fanout:
            pos_b, seg_b = self._floyd(start[idx], deg[idx], f, keys[idx])
        elif idx.numel():
            pos_b, seg_b = self._keys(start[idx], deg[idx], f, weighted, keys[idx])
        else:
            return self._canonical(pos_a, seg_a)
        return self._canonical(torch.cat([pos_a, pos_b]), torch.cat([seg_a, idx[seg_b]]))

    def _check_mode(self, weighted: bool, replace: bool) -> None:
        if weighted and self.weight is None:
            raise ValueError("weighted sampling needs the sampler built with edge_weight")
        if weighted and replace:
            raise ValueError("weighted sampling draws without replacement: replace must be "
                             "False with weighted=True")

    @staticmethod
    def _canonical(pos: Tensor, seg: Tensor) -> tuple[Tensor, Tensor]:
        # canonical order: CSR position (targets are distinct, so grouped by target; a
        # position drawn twice with replacement is one target's)
        pos, order = torch.sort(pos, stable=True)
        return pos, seg[order]

    @staticmethod
    def _floyd(start: Tensor, deg: Tensor, f: int, keys: Tensor) -> tuple[Tensor, Tensor]:
        """f distinct positions of each range [start, start + deg) (deg > f), uniformly: Floyd's
        algorithm, vectorised over the ranges (a loop over the f slots): slot j draws t in
        [0, J], J = deg - f + j, and takes J instead when t was drawn before. O(f²) per node,
        independent of its degree."""
        S = start.shape[0]
        r = _units(keys.unsqueeze(1), torch.arange(f, device=start.device))
        chosen = torch.empty(S, f, dtype=torch.long, device=start.device)
        for j in range(f):
            J = deg - f + j
            t = torch.minimum((r[:, j] * (J + 1)).long(), J)  # floor (rounding guarded)
            if j:
                t = torch.where((chosen[:, :j] == t.unsqueeze(1)).any(1), J, t)
            chosen[:, j] = t
        seg = torch.arange(S, device=start.device).repeat_interleave(f)
        return (start.unsqueeze(1) + chosen).reshape(-1), seg

    @staticmethod
    def _replace(start: Tensor, deg: Tensor, f: int, keys: Tensor) -> tuple[Tensor, Tensor]:
        """f uniform positions of each range [start, start + deg) (deg > 0), with replacement."""
        r = _units(keys.unsqueeze(1), torch.arange(f, device=start.device))
        t = torch.minimum((r * deg.unsqueeze(1)).long(), (deg - 1).unsqueeze(1))
        seg = torch.arange(start.shape[0], device=start.device).repeat_interleave(f)
        return (start.unsqueeze(1) + t).reshape(-1), seg

    def _keys(self, start: Tensor, deg: Tensor, f: int, weighted: bool,
              keys: Tensor) -> tuple[Tensor, Tensor]:
        """The f smallest random keys of each range [start, start + deg) (deg > f): uniform keys,
        or Efraimidis-Spirakis keys E/w (E ~ Exp(1)) for draws proportional to the weights.
        O(deg log) per node: one segmented sort over every candidate."""
        pos, seg = _ranges(start, deg)
        u = _units(keys[seg], pos - start[seg])
        if weighted:
            # a weight 0 never wins against a positive one (key inf)
            e = -torch.log1p(-u)
            w = self.weight[pos].to(torch.float64)
            u = torch.where(w > 0, e / w.clamp_min(torch.finfo(torch.float64).tiny),
                            torch.full_like(e, float("inf")))
        # order by (range, key): the keys sorted, then a stable sort on the range
        o = torch.argsort(u, stable=True)
        o = o[torch.argsort(seg[o], stable=True)]
        first = torch.cumsum(deg, 0) - deg
        rank = torch.arange(o.shape[0], device=o.device) - first[seg]  # seg[o] == seg: sorted
        keep = o[rank < f]
        return pos[keep], seg[keep]

    def sample(self, seeds, fanouts: Sequence, *, weighted: bool = False, replace: bool = False,
               generator: torch.Generator | None = None) -> Sample:
        """The nested neighbourhood of ``seeds`` over ``len(fanouts)`` hops (``fanouts[0]`` for
        the seeds, as PyG's ``num_neighbors``); every node is sampled once, at the first hop
        that reaches it. New nodes of a hop are appended in increasing id order. ``replace``:
        f uniform draws per node with replacement (an edge may be drawn twice)."""
        if self.num_src != self.num_nodes:
            raise ValueError(f"a bipartite sampler ({self.num_src} sources, {self.num_nodes} "
                             "targets) draws one hop (sample_neighbors); nested sampling over "
                             "typed relations is TypedNeighborSampler's")
        seeds = check_seeds(seeds, self.num_nodes).to(self.rowptr.device)
        fs = [check_fanout(f, f"fanouts[{i}]") for i, f in enumerate(fanouts)]
        self._check_mode(weighted, replace)
        # fanout "all" draws nothing: no random state is consumed (as before the counters)
        base = base_seed(generator) if any(f != ALL for f in fs) else 0
        keys = [hop_key(base, h) for h in range(len(fs))]
        ext = self.compiled()
        if ext is not None:
            return self._sample_native(ext, seeds, fs, keys, weighted, replace)
        return self._sample_torch(seeds, fs, keys, weighted, replace)

    def _weight64(self) -> Tensor:
        """The CSR-ordered weights in float64, converted once (the compiled path reads them)."""
        w = getattr(self, "_w64", None)
        if w is None:
            w = self._w64 = self.weight.to(torch.float64).contiguous()
        return w

    def _sample_native(self, ext, seeds, fs, keys, weighted, replace) -> Sample:
        empty = torch.empty(0, dtype=torch.float64)
        w = self._weight64() if weighted else empty
        ids, ei, eid, nc, ec = ext.sample(self.rowptr, self.sources, self.perm, w, seeds, fs,
                                          keys, replace, self.floyd_max_fanout)
        return Sample(ids, ei, eid, nc.tolist(), ec.tolist(), check=False)

    def _sample_torch(self, seeds, fs, keys, weighted, replace) -> Sample:
        dev = seeds.device
        sorted_ids, order = torch.sort(seeds)  # the nodes so far, sorted, and their local ids
        local_of = order
        parts, frontier = [seeds], seeds
        counts = [seeds.shape[0]]
        edges, eids, ecounts = [], [], []
        for f, key in zip(fs, keys):
            lo = counts[-1] - frontier.shape[0]
            pos, seg = self._draw(frontier, f, weighted, replace, key)
            src, eid = self.sources[pos], self.perm[pos]
            # local ids: an already-seen node keeps its id, new ones are appended
            at = torch.searchsorted(sorted_ids, src).clamp(max=max(sorted_ids.shape[0] - 1, 0))
            seen = sorted_ids[at] == src if sorted_ids.numel() else torch.zeros_like(
                src, dtype=torch.bool)
            loc = torch.where(seen, local_of[at], torch.zeros_like(src))
            new, inv = torch.unique(src[~seen], return_inverse=True)
            loc[~seen] = counts[-1] + inv
            edges.append(torch.stack([loc, lo + seg]))
            eids.append(eid)
            ecounts.append((ecounts[-1] if ecounts else 0) + eid.shape[0])
            new_local = torch.arange(counts[-1], counts[-1] + new.shape[0], device=dev)
            sorted_ids, o = torch.sort(torch.cat([sorted_ids, new]))
            local_of = torch.cat([local_of, new_local])[o]
            parts.append(new)
            counts.append(counts[-1] + new.shape[0])
            frontier = new
        ei = torch.cat(edges, 1) if edges else torch.zeros(2, 0, dtype=torch.long, device=dev)
        eid = torch.cat(eids) if eids else torch.zeros(0, dtype=torch.long, device=dev)
        return Sample(torch.cat(parts), ei, eid, counts, ecounts)

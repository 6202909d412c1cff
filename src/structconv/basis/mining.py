"""Sort mining: the relation paths (random-walk sorts) a graph holds, with their support and
the confidence of the path rules they form, in the spirit of rule miners such as AMIE/AnyBURL.

Walk counts come from per-relation degree tables (no path is materialised to count it): the
supports of all 2-paths are one sparse product of the (R, N) in- and out-degree tables, taken
in blocks of prefixes so that memory stays bounded whatever the number of relations; longer
paths extend the ``beam`` best supported shorter ones. Distinct endpoint pairs, needed for
confidences, are the nonzero pattern of the path's sparse adjacency product A_r1 ··· A_rL,
taken in row blocks and given up past ``max_pairs`` pairs. ``mining_memory`` estimates the
memory before anything is allocated; ``mine_sorts`` refuses, naming the estimate, what would
not fit.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .._checks import available_memory, gib
from .edges import check_edge_type, check_edges, check_num_nodes
from .sorts import inverse_name, sort_name

__all__ = ["MinedSort", "mine_sorts", "single_and_mined_sorts", "mining_memory", "walk_pairs",
           "BLOCK", "BLOCK_BYTES", "EDGE_BYTES", "PAIR_BYTES", "MAX_SUPPORT"]

#: candidate (prefix, relation) pairs scored per block of the support stage, and walks
#: joined per block of the confidence stage: bounds their temporaries
BLOCK = 1 << 21
#: bytes a block holds per candidate at its peak (the sparse product, its coalesced copy,
#: the masks; measured: ~150)
BLOCK_BYTES = 160
#: bytes the graph's tables hold per edge while mining: the edges sorted by relation, the
#: sparse out- and in-degree tables and their coalesced copies
EDGE_BYTES = 100
#: bytes one joined (start, end) node pair holds in the confidence stage: the left factor and
#: the product's parts and their concatenation (indices and values; measured: ~80)
PAIR_BYTES = 96
#: support counts are float64 sums: exact up to 2^53
MAX_SUPPORT = 2 ** 53


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


def mining_memory(num_nodes: int, num_edges: int, num_relations: int, max_length: int = 2,
                  beam: int = 200) -> int:
    """Bytes ``mine_sorts`` allocates at most to count the supports of paths up to
    ``max_length`` (its confidence stage adds ``PAIR_BYTES`` per joined node pair, never
    more than ``max_pairs`` pairs, and one block): the edges sorted by relation and the
    sparse degree tables (``EDGE_BYTES`` an edge), one block of 2-path candidates
    (``BLOCK_BYTES`` each), and for longer paths the walk-end vectors and supports of the
    ``beam`` prefixes (float64)."""
    N, E, R = int(num_nodes), int(num_edges), int(num_relations)
    need = EDGE_BYTES * E + BLOCK_BYTES * min(BLOCK, R * R)
    for length in range(3, max_length + 1):
        P = min(beam, R ** (length - 1))
        need += 8 * (2 * P * N + P * R)
    return need


def _need_memory(need: int, what: str, hint: str) -> None:
    """Refuse (ValueError naming the estimate) what would not fit in the memory available."""
    free = available_memory("cpu")
    if free is not None and need > free:
        raise ValueError(f"mine_sorts: {what} needs about {gib(need)}, more than the "
                         f"{gib(free)} available on this machine: {hint}")


class _Graph:
    """The edges grouped by relation, the sparse (R, N) out- and in-degree tables, and the
    (N, N) adjacency pattern of each relation (built on first use)."""

    def __init__(self, src: Tensor, dst: Tensor, et: Tensor, R: int, N: int):
        order = torch.argsort(et, stable=True)
        self.src, self.dst, et = src[order], dst[order], et[order]
        self.R, self.N = R, N
        counts = torch.bincount(et, minlength=R)
        self.counts = counts.tolist()
        self.start = [0] + torch.cumsum(counts, 0).tolist()
        ones = torch.ones(et.numel(), dtype=torch.float64)
        # duplicate edges add up: a walk along a doubled edge counts twice
        self.out = _coo(torch.stack([et, self.src]), ones, (R, N)).coalesce()
        self.inn = _coo(torch.stack([et, self.dst]), ones, (R, N)).coalesce()
        self._adj: dict[int, Tensor] = {}
        #: bytes held while mining (see ``mining_memory``): every stage adds its own to these
        self.held = EDGE_BYTES * et.numel()

    def edges(self, r: int) -> tuple[Tensor, Tensor]:
        s = slice(self.start[r], self.start[r + 1])
        return self.src[s], self.dst[s]

    def push(self, v: Tensor, r: int) -> Tensor:
        """(N,) walk counts ending at each node, one step further along relation r."""
        s, d = self.edges(r)
        return torch.zeros(self.N, dtype=torch.float64).index_add_(0, d, v[s])

    def adjacency(self, r: int) -> Tensor:
        """The coalesced (N, N) pattern of relation r (ones where r links start to end)."""
        if r not in self._adj:
            s, d = self.edges(r)
            ones = torch.ones(s.numel(), dtype=torch.float64)
            self._adj[r] = _pattern(_coo(torch.stack([s, d]), ones, (self.N, self.N)).coalesce())
        return self._adj[r]


def _coo(indices: Tensor, values: Tensor, shape, is_coalesced: bool = False) -> Tensor:
    # the indices are built here, in range by construction: torch's invariant check is skipped
    return torch.sparse_coo_tensor(indices, values, shape, is_coalesced=is_coalesced,
                                   check_invariants=False)


def _mm(a: Tensor, b: Tensor) -> Tensor:
    """torch.sparse.mm, without its once-per-process note that sparse CSR support is beta."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse.mm(a, b)


def _pattern(a: Tensor) -> Tensor:
    """A coalesced sparse matrix with its values set to one."""
    return _coo(a.indices(), torch.ones(a._nnz(), dtype=torch.float64),
                                   a.shape, is_coalesced=True)


def _best(vals: Tensor, flat: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k best (value, flat index) pairs: by value, ties by flat index (row-major order)."""
    o = torch.argsort(flat, stable=True)
    vals, flat = vals[o], flat[o]
    o = torch.argsort(vals, descending=True, stable=True)[:k]
    return vals[o], flat[o]


def _blocks(bound: Tensor, size: int) -> list[tuple[int, int]]:
    """Ranges [a, b) of rows whose summed ``bound`` stays near ``size`` (one row at least)."""
    cum = torch.cumsum(bound, 0)
    out, a, n = [], 0, bound.numel()
    while a < n:
        base = float(cum[a - 1]) if a else 0.0
        b = int(torch.searchsorted(cum, torch.tensor(base + size, dtype=cum.dtype),
                                   right=True))
        b = min(n, max(b, a + 1))
        out.append((a, b))
        a = b
    return out


def _two_paths(g: _Graph, k: int, min_support: int, inverse_of: Tensor, progress) -> list:
    """The k best supported allowed 2-paths as [((a, b), support)], in rank order: the
    sparse product in-degree (R, N) @ out-degree (N, R), block by block of first relations."""
    R, N = g.R, g.N
    ip, iz = g.inn.indices()
    types_out = torch.bincount(g.out.indices()[1], minlength=N).double()
    # the candidates a first relation can have: the relations leaving the nodes it enters
    bound = torch.zeros(R, dtype=torch.float64).index_add_(0, ip, types_out[iz])
    out_t = g.out.t().coalesce()
    vals, flat = torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.long)
    blocks = _blocks(bound, BLOCK)
    for i, (a, b) in enumerate(blocks):
        lo, hi = torch.searchsorted(ip, torch.tensor([a, b])).tolist()
        sub = _coo(torch.stack([ip[lo:hi] - a, iz[lo:hi]]),
                                      g.inn.values()[lo:hi], (b - a, N))
        sup = _mm(sub, out_t).coalesce()
        p, r = sup.indices()
        p = p + a
        v = sup.values()
        keep = (v >= min_support) & (r != inverse_of[p])
        vals, flat = _best(torch.cat([vals, v[keep]]), torch.cat([flat, p[keep] * R + r[keep]]),
                           k)
        if progress is not None and len(blocks) > 1:
            progress(f"supports of 2-paths: block {i + 1} of {len(blocks)}")
    return [((f // R, f % R), int(v)) for v, f in zip(vals.tolist(), flat.tolist())]


def _extend(g: _Graph, prefixes: list[tuple], k: int, min_support: int,
            inverse_of: Tensor) -> list:
    """The k best supported allowed extensions of ``prefixes`` by one relation, as
    [(path, support)] in rank order (ties in the order of the prefixes, then relation id)."""
    R, N = g.R, g.N
    _need_memory(g.held + 8 * (2 * len(prefixes) * N + len(prefixes) * R),
                 f"extending {len(prefixes)} paths over {N:,} nodes",
                 "lower beam (the paths extended to the next length)")
    ends = {(): torch.ones(N, dtype=torch.float64)}
    rows = []
    for s in prefixes:  # walk counts ending at each node: the prefix's prefix pushed along s[-1]
        for j in range(1, len(s) + 1):
            if s[:j] not in ends:
                ends[s[:j]] = g.push(ends[s[:j - 1]], s[j - 1])
        rows.append(ends[s])
    sup = _mm(g.out, torch.stack(rows).t()).t()  # (P, R): Σ_z ends[p, z] out[r, z]
    del rows, ends
    inv = inverse_of[torch.tensor([s[-1] for s in prefixes])]
    back = inv >= 0  # a step straight back along the last relation's inverse is not allowed
    sup[torch.arange(len(prefixes))[back], inv[back]] = 0.0
    p, r = (sup >= min_support).nonzero(as_tuple=True)
    vals, flat = _best(sup[p, r], p * R + r, k)
    return [(prefixes[f // R] + (f % R,), int(v)) for v, f in zip(vals.tolist(), flat.tolist())]


def _supports(g: _Graph, min_length: int, max_length: int, min_support: int, k: int,
              beam: int, inverse_of: Tensor, progress) -> tuple[list, dict]:
    """[(path, walk count)] of the k best supported allowed paths of each length
    min..max_length (lengths in order, each in rank order), and the support of every path
    kept (prefixes included). Paths longer than 2 extend the ``beam`` best shorter ones."""
    found: list[tuple[tuple[int, ...], int]] = []
    ones = [((r,), c) for r, c in enumerate(g.counts) if c >= min_support]
    ones.sort(key=lambda t: -t[1])
    if min_length <= 1:
        found += ones[:k]
    level = _two_paths(g, k, min_support, inverse_of, progress)
    known = dict(ones) | dict(level)
    for length in range(2, max_length + 1):
        if length > 2:
            if progress is not None:
                progress(f"supports of {length}-paths: extending {min(beam, len(level))} paths")
            level = _extend(g, [s for s, _ in level[:beam]], k, min_support, inverse_of)
            known.update(level)
        if length >= min_length:
            found += level
    return found, known


def _product(P: Tensor, g: _Graph, r: int, max_pairs: int) -> Tensor | None:
    """The pattern of P @ A_r (None past ``max_pairs`` nonzeros), row block by row block so
    that no block's temporaries exceed about ``BLOCK`` entries."""
    rows, cols = P.indices()
    s, _ = g.edges(r)
    out_deg = torch.bincount(s, minlength=g.N).double()
    bound = torch.zeros(g.N, dtype=torch.float64).index_add_(0, rows, out_deg[cols])
    A, parts, total = g.adjacency(r), [], 0
    for a, b in _blocks(bound.clamp_max(g.N), BLOCK):
        lo, hi = torch.searchsorted(rows, torch.tensor([a, b])).tolist()
        if lo == hi:
            continue
        sub = _coo(P.indices()[:, lo:hi], P.values()[lo:hi], P.shape,
                                      is_coalesced=True)
        part = _mm(sub, A).coalesce()
        total += part._nnz()
        if total > max_pairs:
            return None
        parts.append(part.indices())
    idx = torch.cat(parts, 1) if parts else torch.zeros(2, 0, dtype=torch.long)
    # blocks hold disjoint, increasing rows: their coalesced parts concatenate coalesced
    return _coo(idx, torch.ones(idx.shape[1], dtype=torch.float64),
                                   P.shape, is_coalesced=True)


def _path_pattern(g: _Graph, sort: tuple[int, ...], max_pairs: int) -> Tensor | None:
    """The (N, N) pattern of A_r1 ··· A_rL (None past ``max_pairs`` nonzeros at any step)."""
    P = g.adjacency(sort[0])
    for r in sort[1:]:
        if P._nnz() > max_pairs:
            return None
        P = _product(P, g, r, max_pairs)
        if P is None:
            return None
    return None if P._nnz() > max_pairs else P


def walk_pairs(edge_index: Tensor, edge_type: Tensor, num_nodes: int, sort: Sequence[int],
               max_pairs: int = 20_000_000) -> Tensor | None:
    """The distinct (start, end) node pairs the walks of ``sort`` (relation ids) join, as the
    sorted keys ``start * num_nodes + end`` (what a materialised sort matrix holds nonzero);
    None past ``max_pairs`` pairs."""
    N = check_num_nodes(num_nodes)
    check_edges(edge_index, N)
    check_edge_type(edge_type, edge_index.shape[1])
    sort = tuple(int(r) for r in sort)
    et = edge_type.long()
    R = max([int(et.max()) + 1 if et.numel() else 1, *(r + 1 for r in sort)])
    if not sort or min(sort) < 0:
        raise ValueError(f"walk_pairs: sort must be a non-empty sequence of relation ids >= 0, "
                         f"got {sort!r}")
    g = _Graph(edge_index[0].long(), edge_index[1].long(), et, R, N)
    P = _path_pattern(g, sort, max_pairs)
    return None if P is None else P.indices()[0] * N + P.indices()[1]


def _pair_bound(out: list, known: dict, g: _Graph, max_pairs: int) -> int:
    """The most node pairs any step of the paths' products can hold: the walks of each
    prefix bound its distinct pairs (and N² bounds them all), capped at ``max_pairs``."""
    most = 0
    for m in out:
        walks = [g.counts[m.sort[0]]] + [known.get(m.sort[:j], max_pairs)
                                         for j in range(2, len(m.sort) + 1)]
        most = max(most, *walks)
    return min(most, max_pairs, g.N * g.N)


def _confidences(out: list, g: _Graph, relations, max_pairs: int, progress) -> None:
    """Fill pairs / head / confidence / hits of each mined path (in place)."""
    er = torch.repeat_interleave(torch.arange(g.R), torch.tensor(g.counts))
    # one (pair, relation) per link, sorted by pair: a doubled edge links its pair once
    ek, er = torch.unique(torch.stack([g.src * g.N + g.dst, er]), dim=1).contiguous()
    cached: tuple = ((), None)  # the last prefix's product: paths sharing it come in a row
    for i, m in enumerate(sorted(out, key=lambda m: m.sort)):
        if progress is not None:
            progress(f"confidence of path {i + 1} of {len(out)}")
        prefix = m.sort[:-1]
        if prefix and prefix != cached[0]:
            cached = (prefix, _path_pattern(g, prefix, max_pairs))
        P = cached[1]
        pat = g.adjacency(m.sort[0]) if not prefix else \
            None if P is None else _product(P, g, m.sort[-1], max_pairs)
        if pat is None or pat._nnz() > max_pairs:
            continue
        keys = pat.indices()[0] * g.N + pat.indices()[1]  # sorted: the pattern is coalesced
        _rule(m, keys, ek, er, g.R, relations)


def _rule(m: MinedSort, keys: Tensor, ek: Tensor, er: Tensor, R: int, relations) -> None:
    """The relation that links most of the path's distinct pairs ``keys`` (sorted start*N+end)
    directly: every edge (sorted keys ``ek``, relations ``er``) whose pair the path joins."""
    m.pairs = int(keys.numel())
    if not m.pairs:
        return
    pos = torch.searchsorted(keys, ek).clamp_max(m.pairs - 1)
    hits = torch.bincount(er[keys[pos] == ek], minlength=R)
    if len(m.sort) == 1:  # "r => r" is no rule
        hits[m.sort[0]] = 0
    best = int(torch.argmax(hits))
    m.head, m.hits = best, int(hits[best])
    m.confidence = m.hits / m.pairs
    m.head_name = relations[best] if relations is not None else str(best)


def _check_arguments(max_length, min_length, top, beam, min_support, max_pairs, rank) -> None:
    for name, v, lo, hi in (("max_length", max_length, 1, 4), ("min_length", min_length, 1, 4),
                            ("top", top, 1, None), ("beam", beam, 1, None),
                            ("min_support", min_support, 1, MAX_SUPPORT),
                            ("max_pairs", max_pairs, 1, None)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"mine_sorts: {name} must be an int >= {lo}, got {v!r}")
        if hi is not None and v > hi:
            why = "the number of paths grows as R^L" if name.endswith("length") else \
                "supports are counted exactly up to 2^53"
            raise ValueError(f"mine_sorts: {name} must be <= {hi} ({why}), got {v}")
    if min_length > max_length:
        raise ValueError(f"mine_sorts: min_length={min_length} > max_length={max_length}")
    if rank not in ("support", "confidence"):
        raise ValueError(f"mine_sorts: rank must be 'support' or 'confidence', got {rank!r}")


def _relations(et: Tensor, num_relations, relations, inverse) -> tuple[int, Tensor]:
    """R and the (R,) inverse of each relation id (-1 where it has none)."""
    R = num_relations if num_relations is not None else (
        len(relations) if relations is not None else int(et.max()) + 1 if et.numel() else 1)
    if isinstance(R, bool) or not isinstance(R, int) or R < 1:
        raise ValueError(f"mine_sorts: num_relations must be an int >= 1, got {R!r}")
    if et.numel() and int(et.max()) >= R:
        raise ValueError(f"edge_type ids must be < num_relations={R}, got max {int(et.max())}")
    if relations is not None and len(relations) != R:
        raise ValueError(f"relations names {len(relations)} relations, the graph has {R}")
    if inverse is None and relations is not None:
        index = {n: i for i, n in enumerate(relations)}
        inverse = {i: index[inverse_name(n)] for i, n in enumerate(relations)
                   if inverse_name(n) in index}
    inverse_of = torch.full((R,), -1, dtype=torch.long)
    for a, b in (inverse or {}).items():
        if 0 <= a < R and 0 <= b < R:
            inverse_of[a] = b
    return R, inverse_of


def mine_sorts(edge_index: Tensor, edge_type: Tensor, num_nodes: int, *,
               num_relations: int | None = None, relations: Sequence[str] | None = None,
               max_length: int = 2, min_length: int = 2, top: int = 20,
               min_support: int = 1, rank: str = "support", confidence: bool = True,
               backtrack: bool = True, inverse: dict[int, int] | None = None,
               beam: int = 200, max_pairs: int = 20_000_000,
               progress: Callable[[str], None] | None = None) -> list[MinedSort]:
    """The relation paths of length ``min_length..max_length`` that occur in a graph, best first.

    ``edge_index`` (2, E) [head; tail] and ``edge_type`` (E,) should be the *training* graph
    only (a valid/test edge here leaks into the model). Paths are ranked by ``support`` (walk
    instances, at least ``min_support``) or by ``confidence`` (of the rule ``path => head
    relation``, among the ``beam`` best supported). Length-1 sorts exist in every graph and are
    not listed with the default ``min_length=2``. Longer paths extend the ``beam`` best
    supported prefixes. ``backtrack=False`` drops paths that step back along an inverse
    (``r . r^-1``), found from ``inverse`` ({relation: its inverse}) or from the ``^-1`` names.
    Confidences join at most ``max_pairs`` distinct node pairs per path (None beyond).
    ``progress(message)``, when given, is called as the work advances (for a status line).
    What would not fit in the memory available is refused before it is allocated
    (``ValueError`` naming the estimate; see ``mining_memory``).
    """
    N = check_num_nodes(num_nodes)
    check_edges(edge_index, N)
    check_edge_type(edge_type, edge_index.shape[1])
    _check_arguments(max_length, min_length, top, beam, min_support, max_pairs, rank)
    src, dst, et = edge_index[0].long(), edge_index[1].long(), edge_type.long()
    R, inverse_of = _relations(et, num_relations, relations, inverse)
    if backtrack:
        inverse_of = torch.full_like(inverse_of, -1)
    _need_memory(mining_memory(N, src.numel(), R, 2), f"mining {src.numel():,} edges of {R:,} "
                 f"relations over {N:,} nodes", "mine a graph with fewer edges or relations")
    g = _Graph(src, dst, et, R, N)
    k = top if rank == "support" else beam
    found, known = _supports(g, min_length, max_length, min_support, max(k, beam) if
                             max_length > 2 else k, beam, inverse_of, progress)
    found.sort(key=lambda t: -t[1])
    out = [MinedSort(s, sort_name(s, relations), sup) for s, sup in found[:k]]
    if confidence or rank == "confidence":
        pairs = _pair_bound(out, known, g, max_pairs)
        _need_memory(g.held + PAIR_BYTES * pairs + BLOCK_BYTES * min(BLOCK, pairs),
                     f"the confidences of {len(out)} paths (up to "
                     f"{pairs:,} node pairs joined)", "lower max_pairs (paths joining more "
                     "pairs get no confidence) or leave confidences out")
        _confidences(out, g, relations, max_pairs, progress)
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

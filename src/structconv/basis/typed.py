"""Typed graphs as bases: relations between node types, their stack, and metapath sorts.

A relation ``(src, rel, dst)`` between two node types is a rectangular basis matrix
(n_src, n_dst). ``TypedBasis`` stacks the R relations of a typed graph into one sparse basis
(R, N, N) over the concatenated node sets (node type t owns rows ``offset[t] ..
offset[t] + n_t``): entry (r, offset[src] + m, offset[dst] + n) for each edge m -> n of
relation r. A typed convolution y = Σ_r A_rᵀ x θ_r is then one convolution over that basis;
``typed_convolve`` computes it with one sparse product and one segment product (a tiled batched
GEMM over node-type blocks), whatever the number of types, instead of a small GEMM per relation.
The node-type blocks pad every type to the most relations any type has; where that padding is
most of the work, the "relation" order multiplies each relation's distinct sources instead
(a segment GEMM over relations, then one sparse product).

A metapath (a sort over typed relations, e.g. ``"author.to.paper.to.conference"``) is the
product of its relations' rectangular bases (Proposition 2): ``metapath_basis`` builds it by
sparse-sparse products (never dense) or, with ``materialize=False``, as a lazy ``Product``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..sparse import SparseMatrix
from .base import Basis, Product, Sparse, Stack
from .edges import check_edges, check_norm, relation_values
from .graph import PowerBasis, SparseOperator

__all__ = ["TypedBasis", "typed_basis", "typed_convolve", "typed_order", "segment_matmul",
           "metapath_basis", "metapath_edges", "parse_metapath", "relation_operator"]

EdgeType = tuple[str, str, str]


# ------------------------------------------------------------------------------------------------
def _tiles(counts: tuple[int, ...], L: int, device) -> tuple[Tensor, Tensor, Tensor]:
    """(row index (T*L,) into x with padding rows = N, group of each tile (T,), position of
    each of x's N rows in the tiled layout (N,)) for contiguous groups of ``counts`` rows."""
    c = torch.tensor(counts, dtype=torch.long, device=device)
    ntile = (c + L - 1) // L
    group = torch.repeat_interleave(torch.arange(len(counts), device=device), ntile)
    start = torch.cumsum(c, 0) - c  # first row of each group
    tile_first = torch.cumsum(ntile, 0) - ntile  # first tile of each group
    j = torch.arange(int(ntile.sum()), device=device) - tile_first[group]  # tile within group
    rows = (start[group] + j * L).unsqueeze(1) + torch.arange(L, device=device)  # (T, L)
    end = (start + c)[group].unsqueeze(1)
    N = int(c.sum())
    index = torch.where(rows < end, rows, torch.full_like(rows, N)).reshape(-1)
    pos = torch.empty(N, dtype=torch.long, device=device)
    valid = index < N
    pos[index[valid]] = torch.arange(index.shape[0], device=device)[valid]
    return index, group, pos


_TILE_CACHE: dict = {}


def segment_rows(counts: Sequence[int], Q: int) -> int:
    """The rows ``segment_matmul`` multiplies for groups of ``counts`` rows and Q output
    columns: its tiles, their padding included."""
    top = max(counts, default=0)
    if len(counts) <= 1 or top == 0:
        return sum(counts)
    L = min(top, max(256, 2 * Q))
    return sum(-(-c // L) * L for c in counts)


def segment_matmul(x: Tensor, counts: Sequence[int], weight: Tensor,
                   tile: int | None = None) -> Tensor:
    """Rows of x (N, C) in contiguous groups of ``counts`` rows, group g times weight[g]
    (G, C, Q) -> (N, Q): one batched GEMM over fixed-size tiles of the groups (no loop over
    groups; at most one partly padded tile per group)."""
    counts = tuple(int(c) for c in counts)
    G, C, Q = weight.shape
    if len(counts) != G or sum(counts) != x.shape[0] or x.shape[-1] != C:
        raise ValueError(f"segment_matmul: x {tuple(x.shape)} with groups {counts} does not "
                         f"match weight {tuple(weight.shape)}")
    w = weight.to(x.dtype)
    if G == 1:
        return x @ w[0]
    if x.shape[0] == 0:
        return x.new_zeros(0, Q)
    top = max(counts)
    # tiles of >= 2Q rows keep the gathered weights (tiles, C, Q) below the rows' (tiles, L, C)
    L = tile or min(top, max(256, 2 * Q))
    key = (counts, L, x.device)
    hit = _TILE_CACHE.get(key)
    if hit is None:
        if len(_TILE_CACHE) > 64:
            _TILE_CACHE.clear()
        hit = _TILE_CACHE[key] = _tiles(counts, L, x.device)
    index, group, pos = hit
    xe = torch.cat([x, x.new_zeros(1, C)])
    xt = xe.index_select(0, index).view(-1, L, C)
    y = torch.bmm(xt, w.index_select(0, group))  # (tiles, L, Q)
    return y.reshape(-1, Q).index_select(0, pos)


# ------------------------------------------------------------------------------------------------
def relation_operator(edge_index: Tensor, M: int, N: int, normalization: str | None = "mean",
                      edge_weight: Tensor | None = None, dtype=None) -> SparseOperator:
    """One relation's normalised rectangular (M, N) operator: ``"mean"`` over each target's
    incoming edges, ``"sym"`` by sqrt(out-degree · in-degree), None the (weighted) adjacency."""
    check_norm(normalization, (None, "mean", "sym"), "relation")
    check_edges(edge_index, max(M, 1), max(N, 1), edge_weight=edge_weight)
    src, dst = edge_index[0].long(), edge_index[1].long()
    w = edge_weight if edge_weight is not None else torch.ones(
        src.shape[0], dtype=dtype or torch.get_default_dtype(), device=src.device)
    return SparseOperator(src, dst, relation_values(src, dst, w, M, N, normalization), M, N)


class TypedBasis(Sparse):
    """R relations of a typed graph as one sparse basis (R, N, N) over the concatenated node
    sets (module doc). ``node_types`` / ``counts`` / ``offsets`` give the blocks; relation r
    goes from ``node_types[src_type[r]]`` to ``node_types[dst_type[r]]``."""

    cost_kernel = "graph"

    def __init__(self, node_types: Sequence[str], counts: Sequence[int],
                 relations: Sequence[EdgeType], ops: Sequence[SparseOperator]):
        self.node_types = [str(t) for t in node_types]
        self.counts = tuple(int(c) for c in counts)
        self.relations = [tuple(r) for r in relations]
        pos = {t: i for i, t in enumerate(self.node_types)}
        off, acc = [], 0
        for c in self.counts:
            off.append(acc)
            acc += c
        self.offsets = tuple(off)
        self.src_type = [pos[r[0]] for r in self.relations]
        self.dst_type = [pos[r[2]] for r in self.relations]
        dev = ops[0].src.device if ops else torch.device("cpu")
        idx, vals = [], []
        for k, op in enumerate(ops):
            so, do = self.offsets[self.src_type[k]], self.offsets[self.dst_type[k]]
            idx.append(torch.stack([torch.full_like(op.src, k), op.src + so, op.dst + do]))
            vals.append(op.value)
        n = max(acc, 1)
        indices = torch.cat(idx, 1) if idx else torch.zeros(3, 0, dtype=torch.long, device=dev)
        values = torch.cat(vals) if vals else torch.zeros(0, device=dev)
        super().__init__(indices, values, (max(len(self.relations), 1), n, n))
        self.out_slots = self._slots(self.src_type)
        self.in_slots = self._slots(self.dst_type)
        # at most min(source rows, edges) distinct sources per relation: a bound known
        # without touching the edges (``typed_order`` reads it, also while compiling)
        self.source_bound = tuple(min(self.counts[s], int(op.src.shape[0]))
                                  for s, op in zip(self.src_type, ops))

    def __repr__(self):
        return (f"TypedBasis(types={len(self.node_types)}, relations={len(self.relations)}, "
                f"N={self.N}, nnz={self.nnz})")

    def _slots(self, types: list[int]) -> tuple[Tensor, list[int]]:
        """(table (T, S) of relation ids per node type, -1 padded; slot of each relation)."""
        T = len(self.node_types)
        slot, seen = [], [0] * T
        for t in types:
            slot.append(seen[t])
            seen[t] += 1
        S = max(max(seen, default=0), 1)
        table = torch.full((T, S), -1, dtype=torch.long)
        for r, (t, s) in enumerate(zip(types, slot)):
            table[t, s] = r
        return table, slot

    def block_operator(self, side: str) -> SparseMatrix:
        """The relations as one 2-d operator: ``"out"`` (N, N*S_out), column (m, slot of r
        among m's type's outgoing relations); ``"in"`` (N*S_in, N), row (n, slot of r among
        n's type's incoming relations). Built once."""
        key = ("block", side)
        memo = self.memo
        if key in memo:
            return memo[key]
        k, m, n = self.indices
        table, slot = self.out_slots if side == "out" else self.in_slots
        S = table.shape[1]
        s = torch.tensor(slot, dtype=torch.long, device=k.device)[k] if slot else k
        if side == "out":
            op = SparseMatrix(n, m * S + s, self.values, (self.N, self.M * S))
        else:
            op = SparseMatrix(n * S + s, m, self.values, (self.N * S, self.M))
        memo[key] = op
        return op

    def relation_rows(self) -> tuple[Tensor, tuple[int, ...], SparseMatrix]:
        """The distinct sources of each relation, relation-major: (their rows of x (U,),
        how many per relation, the (N, U) operator whose column for edge (r, m -> n) is r's
        first row + m's rank among r's sources). Built once."""
        memo = self.memo
        hit = memo.get("relation_rows")
        if hit is None:
            k, m, n = self.indices
            uniq, col = torch.unique(k * self.M + m, return_inverse=True)
            counts = torch.bincount(uniq // self.M, minlength=len(self.relations))
            op = SparseMatrix(n, col, self.values, (self.N, uniq.shape[0]))
            hit = memo["relation_rows"] = (uniq % self.M, tuple(counts.tolist()), op)
        return hit

    def type_weights(self, theta: Tensor, side: str) -> Tensor:
        """theta (R, P, Q) per node type: ``"out"`` (T, P, S_out*Q) (the relations leaving
        each type side by side), ``"in"`` (T, S_in*P, Q) (those entering it stacked); a slot
        without a relation holds zeros."""
        table = (self.out_slots if side == "out" else self.in_slots)[0].to(theta.device)
        R, P, Q = theta.shape
        pad = torch.cat([theta, theta.new_zeros(1, P, Q)])
        w = pad[torch.where(table < 0, torch.full_like(table, R), table)]  # (T, S, P, Q)
        T, S = table.shape
        if side == "out":
            return w.permute(0, 2, 1, 3).reshape(T, P, S * Q)
        return w.reshape(T, S * P, Q)


def _padded_order(basis: TypedBasis, P: int, Q: int) -> str:
    """Of the two padded orders, the one with the smaller intermediate."""
    So, Si = basis.out_slots[0].shape[1], basis.in_slots[0].shape[1]
    return "input" if So * Q <= Si * P else "basis"


def typed_order(basis: TypedBasis, P: int, Q: int) -> str:
    """The order ``typed_convolve``'s "auto" takes for x (N, P) -> (N, Q): of the two padded
    orders the one with the smaller intermediate; "relation" instead where its multiply-adds
    (bounded above) are at most half the padded order's (slots padded, tiles included)."""
    So, Si = basis.out_slots[0].shape[1], basis.in_slots[0].shape[1]
    order = _padded_order(basis, P, Q)
    if order == "input":
        padded = segment_rows(basis.counts, So * Q) * P * So * Q + basis.nnz * Q
    else:
        padded = segment_rows(basis.counts, Q) * Si * P * Q + basis.nnz * P
    U = basis.source_bound
    # the relation order gathers its U rows, multiplies them per relation, propagates Q wide;
    # it moves more rows around than the padded orders, so it must save half the work
    relation = sum(U) * P + segment_rows(U, Q) * P * Q + basis.nnz * Q
    return "relation" if 2 * relation <= padded else order


def typed_convolve(x: Tensor, basis: TypedBasis, theta: Tensor, order: str = "auto") -> Tensor:
    """y = Σ_r A_rᵀ x θ_r over the concatenated node sets: x (N, P), theta (R, P, Q) ->
    (N, Q). ``order`` "input" projects first (one segment GEMM over the source types, then one
    sparse product), "basis" propagates first (one sparse product into (node, incoming
    relation) rows, then one segment GEMM over the target types): both pad every type to the
    most relations any type has. "relation" projects the distinct sources of each relation by
    its θ_r (one segment GEMM over relations, no padding), then one sparse product. "auto":
    ``typed_order``."""
    R, P, Q = theta.shape
    if x.shape[-1] != P or x.shape[0] != sum(basis.counts):
        raise ValueError(f"typed_convolve: x {tuple(x.shape)} must be ({sum(basis.counts)}, "
                         f"{P}) for theta {tuple(theta.shape)}")
    if order not in ("auto", "input", "basis", "relation"):
        raise ValueError(f"typed_convolve: order must be 'auto', 'input', 'basis' or "
                         f"'relation', got {order!r}")
    if not basis.relations or x.shape[0] == 0:
        return x.new_zeros(x.shape[0], Q)
    if order == "auto":
        order = typed_order(basis, P, Q)
        # its rows are found once per graph by a sort, which a trace cannot hold
        if order == "relation" and torch.compiler.is_compiling() and \
                "relation_rows" not in basis.memo:
            order = _padded_order(basis, P, Q)
    if order == "relation":
        rows, counts, op = basis.relation_rows()
        z = segment_matmul(x.index_select(0, rows), counts, theta)
        return op.matmul(z)
    if order == "input":
        z = segment_matmul(x, basis.counts, basis.type_weights(theta, "out"))
        return basis.block_operator("out").matmul(z.reshape(-1, Q))
    u = basis.block_operator("in").matmul(x)  # (N*S_in, P)
    Si = basis.in_slots[0].shape[1]
    return segment_matmul(u.reshape(x.shape[0], Si * P), basis.counts,
                          basis.type_weights(theta, "in"))


def typed_basis(num_nodes: Mapping[str, int], edge_index_dict: Mapping, relations=None,
                normalization: str | None = "mean", dtype=None) -> TypedBasis:
    """The ``TypedBasis`` of a typed graph: node types in ``num_nodes``' order, relations
    ``relations`` (default: ``edge_index_dict``'s keys; a relation absent from it has no
    edges), each normalised on its own (``relation_operator``)."""
    rels = [tuple(r) for r in (relations if relations is not None else edge_index_dict)]
    ops = []
    dev = None
    for ei in edge_index_dict.values():
        dev = ei.device
        break
    for s, _, d in rels:
        for t in (s, d):
            if t not in num_nodes:
                raise ValueError(f"typed_basis: relation ({s}, ..., {d}) names node type "
                                 f"{t!r}, not among {list(num_nodes)}")
    for r in rels:
        ei = edge_index_dict.get(r)
        if ei is None:
            ei = torch.zeros(2, 0, dtype=torch.long, device=dev)
        ops.append(relation_operator(ei, num_nodes[r[0]], num_nodes[r[2]], normalization,
                                     dtype=dtype))
    return TypedBasis(list(num_nodes), [num_nodes[t] for t in num_nodes], rels, ops)


# ------------------------------------------------------------------------------------------------
# metapaths
def typed_graph_parts(graph, who: str) -> tuple[dict[str, int], dict[tuple, Tensor]]:
    """(nodes per type, edge_index (2, E) per edge type) of a ``sc.data.HeteroGraph`` or a pair
    (num_nodes dict, edge_index dict); a TypeError naming ``who`` for anything else."""
    num = getattr(graph, "num_nodes", None)
    edges = getattr(graph, "edge_index_dict", None)
    if isinstance(graph, tuple) and len(graph) == 2:
        num, edges = graph
    if not isinstance(num, Mapping) or not isinstance(edges, Mapping):
        raise TypeError(f"{who} needs a typed graph (a sc.data.HeteroGraph, or a pair "
                        f"(num_nodes dict, edge_index dict)), got {type(graph).__name__}")
    return {str(t): int(n) for t, n in num.items()}, {tuple(k): v for k, v in edges.items()}


def parse_metapath(sort, edge_types: Sequence[EdgeType]) -> list[EdgeType]:
    """A sort over typed relations as its edge types: a dotted name alternating node types and
    relations (``"author.to.paper.to.conference"``), a dotted chain of unique relation names
    (``"writes.published_in"``), or a sequence of edge types / ``"src__rel__dst"`` strings."""
    ets = [tuple(e) for e in edge_types]
    if isinstance(sort, str):
        tok = sort.split(".")
        types = {e[0] for e in ets} | {e[2] for e in ets}
        if len(tok) >= 3 and len(tok) % 2 == 1 and all(t in types for t in tok[::2]):
            steps = [(tok[i], tok[i + 1], tok[i + 2]) for i in range(0, len(tok) - 1, 2)]
        else:
            steps = []
            for name in tok:
                hits = [e for e in ets if e[1] == name]
                if len(hits) != 1:
                    raise ValueError(f"metapath {sort!r}: relation {name!r} names {len(hits)} "
                                     f"edge types; write node types too (src.rel.dst...)")
                steps.append(hits[0])
    else:
        steps = [tuple(s.split("__")) if isinstance(s, str) else tuple(s) for s in sort]
    if not steps:
        raise ValueError(f"metapath {sort!r} is empty")
    for s in steps:
        if s not in ets:
            raise ValueError(f"metapath {sort!r}: no edge type {s}; the graph has {ets}")
    for a, b in zip(steps, steps[1:]):
        if a[2] != b[0]:
            raise ValueError(f"metapath {sort!r}: {a} ends at {a[2]!r} but {b} starts at "
                             f"{b[0]!r}")
    return steps


def _coo(op: SparseOperator) -> Tensor:
    return torch.sparse_coo_tensor(torch.stack([op.src, op.dst]), op.value,
                                   (op.M, op.N), check_invariants=False).coalesce()


def metapath_basis(graph, sorts, normalization: str | None = "mean", *,
                   materialize: bool = True, dtype=None) -> Basis:
    """The basis (K, n_start, n_end) of K metapath sorts sharing start and end node types:
    sort k is the product S_{r1} S_{r2} ... of its relations' normalised rectangular bases.
    ``materialize`` computes each product by sparse-sparse products (a ``Sparse`` basis);
    False keeps it lazy (a ``Stack`` of ``Product``s applied factor by factor)."""
    num, edges = typed_graph_parts(graph, "metapath_basis")
    sorts = [sorts] if isinstance(sorts, str) else list(sorts)
    paths = [parse_metapath(s, list(edges)) for s in sorts]
    ends = {(p[0][0], p[-1][2]) for p in paths}
    if len(ends) != 1:
        raise ValueError(f"metapath_basis: the sorts must share their start and end node types "
                         f"to form one basis, got {sorted(ends)}")
    ops = {}
    for p in paths:
        for e in p:
            if e not in ops:
                ops[e] = relation_operator(edges[e], num[e[0]], num[e[2]], normalization,
                                           dtype=dtype)
    s0, s1 = next(iter(ends))
    if not materialize:
        lazy = []
        for p in paths:
            b = PowerBasis(ops[p[0]], (1,))
            for e in p[1:]:
                b = Product(b, PowerBasis(ops[e], (1,)))
            lazy.append(b)
        return lazy[0] if len(lazy) == 1 else Stack(lazy)
    idx, vals = [], []
    for k, p in enumerate(paths):
        A = _coo(ops[p[0]])
        for e in p[1:]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # CSR "beta": the product is stable
                A = torch.sparse.mm(A, _coo(ops[e])).coalesce()
        i = A.indices()
        idx.append(torch.cat([torch.full_like(i[:1], k), i]))
        vals.append(A.values())
    return Sparse(torch.cat(idx, 1), torch.cat(vals), (len(paths), num[s0], num[s1]))


def metapath_edges(graph, sort) -> Tensor:
    """The edges (2, E) of a metapath's graph: the nonzero pattern of the product of its
    relations' rectangular bases (start-type rows -> end-type rows, sorted), the input of a
    metapath layer such as ``sc.nn.HANConv``."""
    b = metapath_basis(graph, [sort], None, dtype=torch.float64)
    return b.indices[1:].clone()

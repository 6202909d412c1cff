"""A graph's edges as the graph bases read them: argument checks and normalised edge forms.

The graph family's shared helpers, public as PyG's ``gcn_norm`` is: the graph bases, the graph
layers, the sampler and the restricted bases all validate edges and normalise them here.

Each normalisation returns an ``EdgeForm``: the operator's value on every *input* edge (in the
order given, zero on an edge the operator drops) and, separately, the diagonal entry it adds per
node (GCN's self loops, the Laplacian's diagonal). Nothing downstream depends on the order in
which the entries of a built operator were laid out: a restriction to sampled edges reads the
value of edge ``e`` at ``value[e]`` and the diagonal of node ``i`` at ``diag[i]``.

Every value is computed as PyG computes it (``gcn_norm``: degree on targets; ``get_laplacian``:
degree on sources), in the same order, so that float64 results agree to rounding.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from .._checks import check_index_tensor

__all__ = ["EdgeForm", "EdgeInput", "as_edge_index", "check_num_nodes", "check_edges", "check_K",
           "check_norm",
           "check_edge_type", "infer_num_relations", "check_sorts", "value_dtype", "gcn_norm",
           "laplacian", "random_walk", "relation_values", "graph_hops", "FILL_REDUCTIONS"]

#: the reductions a self loop's edge features may be filled with (PyG's scatter reductions;
#: ``sc.attention.edges.self_loop_attr`` computes them, the graph_attention kind checks them)
FILL_REDUCTIONS = ("mean", "add", "sum", "max", "min", "amax", "amin", "mul")

_INF = float("inf")


# ------------------------------------------------------------------------------------------------
# the edge inputs PyG's layers accept, as one (2, E) edge list
class EdgeInput(NamedTuple):
    """A graph argument as an edge list: ``index`` (2, E) [source; target] (a plain tensor),
    ``value`` (E, ...) the entries a sparse adjacency carries (None for an edge list), ``size``
    (num_src, num_dst) where the input states it (a sparse adjacency, a sized ``EdgeIndex``),
    and ``kind``: "edge_index", "torch_sparse" or "sparse_tensor" (``torch_sparse``)."""

    index: Tensor
    value: Tensor | None
    size: tuple[int | None, int | None] | None
    kind: str


_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)

#: the last converted sparse adjacencies, by identity and checked against their content, so
#: that an ``adj_t`` reused every epoch gives the same edge list (the structure cache's key)
_CONVERTED: dict = {}
_CONVERTED_MAX = 8


def _bad_index(t: Tensor, what: str) -> None:
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"{what} must be an integer (2, E) tensor [source; target], got dtype "
                        f"{t.dtype}")
    if t.dim() != 2 or t.shape[0] != 2:
        raise ValueError(f"{what} must be an integer (2, E) tensor [source; target], got shape "
                         f"{tuple(t.shape)}")


def as_edge_index(edge_index, what: str = "edge_index") -> EdgeInput:
    """Any graph argument of PyG's layers as an ``EdgeInput``: a (2, E) integer tensor (returned
    as it is), PyG's ``EdgeIndex``, a torch sparse ``adj_t`` (COO/CSR/CSC, shape (num_dst,
    num_src): entry [n, m] is the edge m -> n, its values the edge weights) or a
    ``torch_sparse.SparseTensor`` ``adj_t`` (duck-typed). A bool or floating edge list is a
    TypeError; the edges of a sparse input come in its storage order."""
    if type(edge_index) is Tensor and edge_index.layout == torch.strided:
        _bad_index(edge_index, what)  # the common path: a few attribute reads
        return EdgeInput(edge_index, None, None, "edge_index")
    if isinstance(edge_index, Tensor):
        if edge_index.layout in _SPARSE_LAYOUTS:
            return _from_torch_sparse(edge_index, what)
        if edge_index.layout == torch.strided:  # a subclass: PyG's EdgeIndex
            _bad_index(edge_index, what)
            size = edge_index.sparse_size() if callable(getattr(edge_index, "sparse_size",
                                                                None)) else None
            # PyG's EdgeIndex holds its plain tensor (the same object every call: the
            # structure cache's key); another subclass is viewed as a plain tensor
            plain = edge_index.as_tensor() if callable(getattr(edge_index, "as_tensor", None)) \
                else edge_index.as_subclass(Tensor)
            return EdgeInput(plain, None, None if size is None else tuple(size), "edge_index")
    if callable(getattr(edge_index, "coo", None)) and \
            callable(getattr(edge_index, "sparse_sizes", None)):
        row, col, value = edge_index.coo()  # adj_t: rows are targets
        n_dst, n_src = edge_index.sparse_sizes()
        return EdgeInput(torch.stack([col, row]), value, (int(n_src), int(n_dst)),
                         "sparse_tensor")
    raise TypeError(f"{what} must be a (2, E) integer tensor, an EdgeIndex, a torch sparse "
                    f"adjacency adj_t (num_dst, num_src) or a torch_sparse.SparseTensor, got "
                    f"{type(edge_index).__name__}")


def _sparse_parts(adj: Tensor) -> tuple[Tensor, ...]:
    if adj.layout == torch.sparse_coo:
        return (adj._indices(), adj._values())
    if adj.layout == torch.sparse_csr:
        return (adj.crow_indices(), adj.col_indices(), adj.values())
    return (adj.ccol_indices(), adj.row_indices(), adj.values())


def _from_torch_sparse(adj: Tensor, what: str) -> EdgeInput:
    if adj.sparse_dim() != 2:
        raise ValueError(f"{what}: a sparse adjacency must have 2 sparse dims (num_dst, num_src), "
                         f"got shape {tuple(adj.shape)} with {adj.sparse_dim()} sparse dims")
    key = id(adj)
    hit = _CONVERTED.get(key)
    parts = _sparse_parts(adj)
    if hit is not None and hit[0]() is adj and len(hit[1]) == len(parts) and all(
            a.shape == b.shape and torch.equal(a, b) for a, b in zip(hit[1], parts)):
        return hit[2]
    out = _convert_sparse(adj)
    if not torch.compiler.is_compiling() and not adj.requires_grad and \
            adj.device.type != "meta":
        if len(_CONVERTED) >= _CONVERTED_MAX:
            _CONVERTED.pop(next(iter(_CONVERTED)))
        _CONVERTED[key] = (weakref.ref(adj, lambda _r, k=key: _CONVERTED.pop(k, None)),
                           tuple(p.detach().clone() for p in parts), out)
    return out


def _convert_sparse(adj: Tensor) -> EdgeInput:
    n_dst, n_src = int(adj.shape[0]), int(adj.shape[1])
    if adj.layout == torch.sparse_coo:
        c = adj if adj.is_coalesced() else adj.coalesce()
        idx, value = c.indices(), c.values()
        dst, src = idx[0], idx[1]
    elif adj.layout == torch.sparse_csr:
        crow, src, value = adj.crow_indices(), adj.col_indices(), adj.values()
        dst = torch.repeat_interleave(torch.arange(n_dst, device=crow.device), crow.diff())
    else:
        ccol, dst, value = adj.ccol_indices(), adj.row_indices(), adj.values()
        src = torch.repeat_interleave(torch.arange(n_src, device=ccol.device), ccol.diff())
    return EdgeInput(torch.stack([src.long(), dst.long()]), value, (n_src, n_dst),
                     "torch_sparse")


# ------------------------------------------------------------------------------------------------
# argument checks
def check_num_nodes(num_nodes, what: str = "num_nodes") -> int:
    """``num_nodes`` as a positive int: any integer (a Python int, a NumPy integer, a 0-d
    integer tensor), never a bool."""
    if isinstance(num_nodes, Tensor) and num_nodes.dim() == 0 and \
            not num_nodes.is_floating_point() and num_nodes.dtype != torch.bool:
        num_nodes = int(num_nodes)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, numbers.Integral) or \
            num_nodes < 1:
        raise ValueError(f"{what} must be a positive int, got {num_nodes!r}")
    return int(num_nodes)


def check_edges(edge_index: Tensor, num_src: int, num_dst: int | None = None,
                edge_weight: Tensor | None = None) -> None:
    """Raise unless edge_index is (2, E) integer with sources < num_src and targets < num_dst
    (and ``edge_weight``, where given, a floating (E,) tensor)."""
    check_index_tensor(edge_index, rows=2, what="edge_index [source; target]")
    num_dst = num_src if num_dst is None else num_dst
    E = edge_index.shape[1]
    # value checks need concrete data: while torch.compile traces, shapes are checked only
    if E and not torch.compiler.is_compiling():
        for row, name, lim in ((0, "source", num_src), (1, "target", num_dst)):
            lo, hi = int(edge_index[row].min()), int(edge_index[row].max())
            if lo < 0 or hi >= lim:
                raise ValueError(
                    f"edge_index {name} ids must lie in [0, {lim - 1}] for {lim} nodes, got "
                    f"values in [{lo}, {hi}]"
                )
    if edge_weight is not None:
        if not isinstance(edge_weight, Tensor):
            raise TypeError(f"edge_weight must be a tensor, got {type(edge_weight).__name__}")
        if edge_weight.dim() != 1 or edge_weight.shape[0] != E:
            raise ValueError(
                f"edge_weight must be ({E},) to match edge_index (2, {E}), got "
                f"{tuple(edge_weight.shape)}"
            )
        if not edge_weight.is_floating_point():
            raise TypeError(f"edge_weight must be a floating tensor, got {edge_weight.dtype}")


def check_K(K, what: str = "K", low: int = 1) -> int:
    """A polynomial order (or count) as an int >= ``low``."""
    if isinstance(K, bool) or not isinstance(K, int) or K < low:
        raise ValueError(f"{what} must be an int >= {low}, got {K!r}")
    return K


def check_norm(normalization, allowed: Sequence, what: str):
    """Raise unless ``normalization`` is one of ``allowed``."""
    if normalization not in allowed:
        raise ValueError(f"unknown {what} normalization {normalization!r}: use one of "
                         f"{list(allowed)}")
    return normalization


def check_edge_type(edge_type, E: int) -> None:
    """Raise unless ``edge_type`` is an integer (E,) tensor of ids >= 0."""
    if not isinstance(edge_type, Tensor):
        raise TypeError(f"edge_type must be a tensor, got {type(edge_type).__name__}")
    if edge_type.dim() != 1 or edge_type.shape[0] != E:
        raise ValueError(f"edge_type must be ({E},) to match edge_index (2, {E}), got "
                         f"{tuple(edge_type.shape)}")
    if edge_type.is_floating_point():
        raise TypeError(f"edge_type must be an integer tensor, got {edge_type.dtype}")
    if E and not torch.compiler.is_compiling() and int(edge_type.min()) < 0:
        raise ValueError(f"edge_type ids must be >= 0, got min {int(edge_type.min())}")


def infer_num_relations(edge_type: Tensor, num_relations=None) -> int:
    """The number of relations: given (and checked against the edge types) or, when None, the
    edge types present (max id + 1)."""
    if num_relations is not None and torch.compiler.is_compiling():
        return num_relations
    et_max = int(edge_type.max()) if edge_type.numel() else -1
    if num_relations is None:
        return et_max + 1
    if et_max >= num_relations:
        raise ValueError(f"edge_type ids must be < num_relations={num_relations}, got max "
                         f"{et_max}")
    return num_relations


def check_sorts(sorts, num_relations: int, identity: bool, M: int, N: int) -> list[tuple]:
    """Sorts as tuples of relation ids (None: every relation alone), each checked."""
    if sorts is None:
        sorts = [(r,) for r in range(num_relations)]
    out = []
    for s in sorts:
        s = (s,) if isinstance(s, int) else tuple(s)
        if not s or any(isinstance(r, bool) or not isinstance(r, int) or not
                        0 <= r < num_relations for r in s):
            # a sort naming a relation without edges would be an all-zero matrix: say so
            raise ValueError(f"each sort must be a non-empty tuple of relation ids in "
                             f"[0, {num_relations - 1}] ({num_relations} relations), got {s!r}; "
                             "pass num_relations= if the graph has relations without edges")
        if len(s) > 1 and M != N:
            raise ValueError(f"sort {s} of length {len(s)} needs M == N, got (M, N)=({M}, {N})")
        out.append(s)
    if identity and M != N:
        raise ValueError(f"identity needs M == N, got (M, N)=({M}, {N})")
    if not out and not identity:
        raise ValueError("relational needs at least one sort or identity=True")
    return out


def value_dtype(edge_weight: Tensor | None, dtype) -> torch.dtype:
    """The dtype of an operator's values: an explicit edge_weight keeps its dtype (as PyG),
    otherwise ones of ``dtype`` (the default dtype when None)."""
    if edge_weight is not None:
        return edge_weight.dtype
    return dtype if dtype is not None else torch.get_default_dtype()


def graph_hops(kind: str, K: int | None = None, sorts: Sequence | None = None) -> int:
    """Hops of a graph one basis of ``kind`` reaches (its receptive field): gcn 1, sgc K,
    diffusion K, chebyshev K - 1, relational the longest sort (0 for the identity alone)."""
    if kind == "gcn":
        return 1
    if kind in ("sgc", "diffusion"):
        return int(K)
    if kind == "chebyshev":
        return int(K) - 1
    if kind == "relational":
        return max((1 if isinstance(s, int) else len(s) for s in sorts or ()), default=0)
    raise ValueError(f"graph_hops: unknown graph basis kind {kind!r}")


# ------------------------------------------------------------------------------------------------
# normalisations
@dataclass(frozen=True)
class EdgeForm:
    """A sparse operator S (n, n) over a graph: ``value[e]`` on input edge e (src[e] -> dst[e]),
    zero where ``keep[e]`` is False (an input self loop the operator replaces), and ``diag[i]``
    on the diagonal entry (i, i) it adds per node (None: it adds none)."""

    src: Tensor
    dst: Tensor
    value: Tensor
    keep: Tensor | None
    diag: Tensor | None
    num_nodes: int

    def coo(self) -> tuple[Tensor, Tensor, Tensor]:
        """The operator's entries (src, dst, value): the kept input edges in their order, then
        one diagonal entry per node. While torch.compile traces, dropped edges stay in as
        zero-valued entries (static shapes; no sum changes)."""
        src, dst, v = self.src, self.dst, self.value
        if self.keep is not None and not torch.compiler.is_compiling():
            src, dst, v = src[self.keep], dst[self.keep], v[self.keep]
        if self.diag is not None:
            loop = torch.arange(self.num_nodes, device=src.device)
            src, dst, v = torch.cat([src, loop]), torch.cat([dst, loop]), torch.cat([v, self.diag])
        return src, dst, v


def _ones(n: int, dtype, device) -> Tensor:
    return torch.ones(n, dtype=dtype, device=device)


def _inv_sqrt(deg: Tensor) -> Tensor:
    d = deg.pow(-0.5)
    return d.masked_fill(d == _INF, 0.0)


def _loop_weights(src, dst, w, n: int, fill: float, dtype) -> Tensor:
    """(n,) PyG's add_remaining_self_loops weights: an existing loop keeps its weight (the last
    one where a node has several), the others get ``fill``. Without edge weights every loop
    weighs 1, ``improved`` or not (PyG adds the loops before it fills in the ones). While
    tracing, duplicate loops of a node add up instead (no data-dependent shapes)."""
    is_loop = src == dst
    if w is None:
        return torch.ones(n, dtype=dtype, device=src.device)
    if torch.compiler.is_compiling():
        has = torch.zeros(n, dtype=w.dtype, device=src.device).index_add(
            0, src, is_loop.to(w.dtype))
        old = torch.zeros(n, dtype=w.dtype, device=src.device).index_add(
            0, src, torch.where(is_loop, w, torch.zeros_like(w)))
        return torch.where(has > 0, old, torch.full_like(old, fill))
    loop_w = w.new_full((n,), fill)
    loop_w[src[is_loop]] = w[is_loop]
    return loop_w


def _kept(src: Tensor, dst: Tensor, w: Tensor, keep: Tensor):
    """The kept edges' (src, dst, w). While tracing, every edge with w zeroed where dropped
    (static shapes; an exact zero changes no sum); eagerly the dropped edges stay out of the
    arithmetic altogether (a zero weight next to an isolated node's infinite inverse degree
    would give NaN gradients)."""
    if torch.compiler.is_compiling():
        return src, dst, w * keep.to(w.dtype)
    return src[keep], dst[keep], w[keep]


def _spread(values: Tensor, keep: Tensor) -> Tensor:
    """Values of the kept edges (``_kept``'s order) back on every input edge, zero elsewhere."""
    if torch.compiler.is_compiling():
        return values
    return values.new_zeros(keep.shape[0]).masked_scatter(keep, values)


def gcn_norm(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None, *,
             add_self_loops: bool = True, normalize: bool = True, improved: bool = False,
             dtype=None) -> EdgeForm:
    """Kipf & Welling's D̂^-1/2 Â D̂^-1/2 exactly as PyG's ``gcn_norm`` (degree on targets):
    with ``add_self_loops`` the input's loops are replaced by one per node (weight ``2`` where
    ``improved`` and edge weights are given, an existing loop keeping its weight)."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    n, vd = num_nodes, value_dtype(edge_weight, dtype)
    w = edge_weight if edge_weight is not None else _ones(src.shape[0], vd, src.device)
    if not add_self_loops:
        if normalize:
            deg = torch.zeros(n, dtype=w.dtype, device=w.device).index_add(0, dst, w)
            dis = _inv_sqrt(deg)
            w = dis[src] * w * dis[dst]
        return EdgeForm(src, dst, w, None, None, n)
    keep = src != dst
    diag = _loop_weights(src, dst, edge_weight, n, 2.0 if improved else 1.0, vd)
    s, d, v = _kept(src, dst, w, keep)
    if normalize:
        # PyG's order: the edges, then the loops
        loop = torch.arange(n, device=src.device)
        deg = torch.zeros(n, dtype=v.dtype, device=v.device).index_add(
            0, torch.cat([d, loop]), torch.cat([v, diag]))
        dis = _inv_sqrt(deg)
        v, diag = dis[s] * v * dis[d], dis * diag * dis
    return EdgeForm(src, dst, _spread(v, keep), keep, diag, n)


def _lambda(v: Tensor, lambda_max, batch, entry_src: Tensor) -> Tensor:
    """The Laplacian's scale: PyG's default 2·max over the entries, a number, a 0-d tensor or
    one value per graph of ``batch`` (gathered per entry)."""
    if lambda_max is None:
        return 2.0 * v.max()
    if isinstance(lambda_max, Tensor):
        lam = lambda_max.to(v.device)
    else:
        lam = torch.tensor(float(lambda_max), dtype=v.dtype, device=v.device)
    if batch is not None and lam.numel() > 1:
        return lam[batch[entry_src]]
    if lam.numel() > 1:
        raise ValueError(
            f"lambda_max has {lam.numel()} entries (one per graph) but no batch vector was given"
        )
    return lam.reshape(())


def laplacian(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None, *,
              normalization: str | None = "sym", lambda_max=None, batch: Tensor | None = None,
              dtype=None) -> EdgeForm:
    """PyG ChebConv's scaled Laplacian 2 L / lambda_max - I: the input's self loops dropped,
    L = D - A (None), I - D^-1/2 A D^-1/2 ("sym") or I - D^-1 A ("rw"), degree on sources."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    n, vd = num_nodes, value_dtype(edge_weight, dtype)
    keep = src != dst
    w = edge_weight if edge_weight is not None else _ones(src.shape[0], vd, src.device)
    s, d, w = _kept(src, dst, w, keep)
    deg = torch.zeros(n, dtype=w.dtype, device=w.device).index_add(0, s, w)
    if normalization is None:
        off, diag = -w, deg
    elif normalization == "sym":
        dis = _inv_sqrt(deg)
        off, diag = -(dis[s] * w * dis[d]), _ones(n, w.dtype, w.device)
    else:  # "rw"
        dinv = 1.0 / deg
        dinv = dinv.masked_fill(dinv == _INF, 0.0)
        off, diag = -(dinv[s] * w), _ones(n, w.dtype, w.device)
    loop = torch.arange(n, device=src.device)
    v = torch.cat([off, diag])
    v = (2.0 * v) / _lambda(v, lambda_max, batch, torch.cat([s, loop]))
    v = v.masked_fill(v == _INF, 0.0)
    return EdgeForm(src, dst, _spread(v[:-n], keep), keep, v[-n:] - 1, n)


def random_walk(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None, *,
                dtype=None) -> EdgeForm:
    """The transition matrix S = D_out^-1 A, S[m, n] = w(m->n) / Σ_n' w(m->n') (rows of nodes
    with no out-edge stay zero)."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    vd = value_dtype(edge_weight, dtype)
    w = edge_weight if edge_weight is not None else _ones(src.shape[0], vd, src.device)
    deg = torch.zeros(num_nodes, dtype=w.dtype, device=w.device).index_add(0, src, w)
    dinv = 1.0 / deg
    dinv = dinv.masked_fill(dinv == _INF, 0.0)
    return EdgeForm(src, dst, dinv[src] * w, None, None, num_nodes)


def relation_values(src: Tensor, dst: Tensor, w: Tensor, M: int, N: int,
                    normalization: str | None) -> Tensor:
    """One relation's normalised edge values: ``"mean"`` over a target's incoming edges of the
    relation (R-GCN's 1/c_{n,r}), ``"sym"`` by sqrt(out-degree · in-degree), None: ``w``."""
    if normalization is None:
        return w
    if normalization == "mean":
        deg = torch.zeros(N, dtype=w.dtype, device=w.device).index_add(0, dst, w)
        dinv = 1.0 / deg
        return dinv.masked_fill(dinv == _INF, 0.0)[dst] * w
    din = torch.zeros(N, dtype=w.dtype, device=w.device).index_add(0, dst, w)
    dout = torch.zeros(M, dtype=w.dtype, device=w.device).index_add(0, src, w)
    return _inv_sqrt(dout)[src] * w * _inv_sqrt(din)[dst]

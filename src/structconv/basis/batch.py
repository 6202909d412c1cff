"""Bases of batches of graphs: the readout (nodes in, graphs out) and the plain sum adjacency.

A batch of small graphs is one graph whose adjacency is block diagonal; reading it out to one
vector per graph is a convolution whose basis is rectangular, ``(1, M, N)`` with ``M`` nodes
and ``N`` graphs: ``A[0, m, batch[m]] = 1`` (sum) or ``1 / n_g`` (mean), the paper's pooling
as a fixed basis with ``M != N``. It is applied as a segment sum (``index_add``), never dense.

``adjacency`` is the un-normalised ``(1, M, N)`` sum over incoming edges (GIN's aggregation),
one CSR SpMM per application like the other graph bases.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_index_tensor
from .base import Basis
from .cache import cached
from .edges import check_edges, value_dtype
from .graph import PowerBasis, SparseOperator, pair_nodes

__all__ = ["Readout", "readout", "adjacency", "READOUTS"]

READOUTS = ("sum", "mean")
"""The linear readouts (a max readout is a reduction, not a basis: ``sc.nn.global_max_pool``)."""


def _batch_vector(batch) -> tuple[Tensor, int | None]:
    """(batch vector, num_graphs or None) from a (M,) tensor or a batch object (``.batch``,
    ``.num_graphs``), e.g. ``sc.data.GraphBatch``."""
    if not isinstance(batch, Tensor) and hasattr(batch, "batch"):
        return batch.batch, getattr(batch, "num_graphs", None)
    if not isinstance(batch, Tensor):
        raise TypeError(f"readout expects batch as a (M,) integer tensor (the graph of each "
                        f"node) or a GraphBatch, got {type(batch).__name__}")
    if batch.dim() != 1 or batch.is_floating_point() or batch.dtype == torch.bool:
        raise ValueError(f"readout expects batch as a (M,) integer tensor, got shape "
                         f"{tuple(batch.shape)} and dtype {batch.dtype}")
    return batch, None


class Readout(Basis):
    """The rectangular ``K = 1`` basis ``(1, M, N)`` of a readout: ``A[0, m, batch[m]] = 1``
    (``reduce="sum"``) or ``1 / n_g`` (``"mean"``; an empty graph's column is zero).

    ``propagate`` is one ``index_add`` over the nodes (then a division by the graph sizes for
    the mean, as PyG's ``global_mean_pool`` computes it), O(M) work and no (M, N) matrix.
    """

    cost_kernel = "graph"
    #: (the engine reads ``batch`` as an attention basis's item count: the graph of each node
    #: is held as ``index``)

    def __init__(self, batch: Tensor, num_graphs: int, reduce: str = "sum"):
        if reduce not in READOUTS:
            raise ValueError(f"readout reduce must be one of {list(READOUTS)}, got {reduce!r}")
        M = batch.shape[0]
        if torch.compiler.is_compiling():
            # sizes stay symbolic while tracing (int() would specialise them: one compiled
            # graph per batch size); they were checked eagerly before
            self.K, self.M, self.N = 1, M, num_graphs
        else:
            super().__init__(1, M, num_graphs)
            if M and (int(batch.min()) < 0 or int(batch.max()) >= num_graphs):
                raise ValueError(f"readout: batch ids must lie in [0, {num_graphs - 1}] for "
                                 f"num_graphs={num_graphs}, got values in "
                                 f"[{int(batch.min())}, {int(batch.max())}]")
        self.index = batch.long()
        self.reduce = reduce
        self.counts = None
        if reduce == "mean":
            # graph sizes as floats (they take the basis's dtype; empty graphs divide by 1)
            ones = torch.ones(M, dtype=torch.get_default_dtype(), device=batch.device)
            self.counts = torch.zeros(num_graphs, dtype=ones.dtype,
                                      device=batch.device).index_add_(0, self.index, ones)

    def __repr__(self):
        return f"Readout(reduce={self.reduce!r}, M={self.M}, N={self.N})"

    def apply_flops(self):
        return float(self.M)

    def _segment_sum(self, x: Tensor) -> Tensor:
        """(B, M, C) -> (B, N, C): the sum over each graph's nodes (mean: divided by n_g)."""
        B, _, C = x.shape
        if B == 1:  # along dim 0 of (M, C): ~30% faster than on a leading batch dim
            out = x.new_zeros(self.N, C).index_add_(0, self.index, x[0]).unsqueeze(0)
        else:
            out = x.new_zeros(B, self.N, C).index_add_(1, self.index, x)
        if self.counts is not None:
            out = out / self.counts.to(x.dtype).clamp(min=1).unsqueeze(-1)
        return out

    def propagate(self, x):
        return self._segment_sum(x).unsqueeze(2)

    def propagate_sum(self, z):
        return self._segment_sum(z[:, :, 0])

    def propagate_heads(self, z):
        return self._segment_sum(z[:, :, 0]).unsqueeze(2)

    def to_dense(self):
        A = torch.zeros(1, self.M, self.N, dtype=self.dtype, device=self.index.device)
        v = torch.ones(self.M, dtype=self.dtype, device=self.index.device)
        if self.counts is not None:
            v = v / self.counts.to(self.dtype).clamp(min=1)[self.index]
        A[0, torch.arange(self.M, device=self.index.device), self.index] = v
        return A


def readout(batch, num_graphs: int | None = None, reduce: str = "sum") -> Readout:
    """The readout basis ``(1, M, N)`` of a batch vector ``batch`` (M,) (the graph of each
    node; a ``GraphBatch`` also works): ``A[0, m, batch[m]] = 1`` (``"sum"``) or ``1 / n_g``
    (``"mean"``). ``num_graphs`` defaults to ``batch.max() + 1`` (a GraphBatch's own count),
    so trailing empty graphs need it."""
    vec, n = _batch_vector(batch)
    if num_graphs is None:
        num_graphs = n
    if num_graphs is None:
        if torch.compiler.is_compiling():
            raise ValueError("readout under torch.compile needs num_graphs (the graph count "
                             "read from the data would end the traced graph)")
        num_graphs = int(vec.max()) + 1 if vec.numel() else 0
    if not torch.compiler.is_compiling() and (isinstance(num_graphs, bool) or
                                              int(num_graphs) != num_graphs or num_graphs < 1):
        raise ValueError(f"readout needs num_graphs >= 1 (and at least one node), got "
                         f"num_graphs={num_graphs!r} for {vec.shape[0]} nodes")
    if vec.shape[0] == 0:
        raise ValueError("readout needs at least one node (a batch of only empty graphs has no "
                         "basis; sc.nn.global_add_pool returns its zeros)")
    return Readout(vec, num_graphs, reduce)


def adjacency(edge_index: Tensor, num_nodes, edge_weight: Tensor | None = None, *,
              dtype: torch.dtype | None = None, cache: bool = False) -> PowerBasis:
    """The ``K = 1`` sum basis ``A[0, m, n] = Σ_{edges m -> n} w`` (weight 1 without
    ``edge_weight``): ``Aᵀ x`` sums each node's incoming messages (PyG's ``aggr="add"``), as
    GIN aggregates. ``num_nodes`` is an int or a ``(M_src, N_dst)`` pair (bipartite)."""
    M, N = pair_nodes(num_nodes)
    check_index_tensor(edge_index, rows=2, what="edge_index [source; target]")
    opts = ("adjacency", M, N, dtype)

    def build():
        check_edges(edge_index, M, N, edge_weight=edge_weight)
        src, dst = edge_index[0].long(), edge_index[1].long()
        w = edge_weight if edge_weight is not None else torch.ones(
            src.shape[0], dtype=value_dtype(None, dtype), device=src.device)
        return PowerBasis(SparseOperator(src, dst, w, M, N), (1,))

    return cached(cache, (edge_index, edge_weight), opts, build)

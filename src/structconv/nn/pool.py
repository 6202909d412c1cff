"""Readouts of batches of graphs: PyG's global pools and its attentional aggregation.

``global_add_pool`` and ``global_mean_pool`` apply the readout basis (``sc.basis.readout``,
``(1, M, N)``: M nodes in, N graphs out) to the node features; ``global_max_pool`` is a
reduction (a maximum is not linear, so it has no basis). ``AttentionalAggregation`` is an
attention convolution whose outputs are the graphs: a ``NodeGate`` mechanism scores every node,
the softmax over inputs normalises each graph's column, and the basis
(``sc.attention.GraphAttention`` on the node -> graph edges) applies the weights.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention.basis import GraphAttention
from ..attention.mechanisms import Mechanism, edges
from ..basis.batch import readout
from ..params import reset_module  # re-exported: PyG's ``reset``
from .convert import register_pyg

__all__ = ["global_add_pool", "global_mean_pool", "global_max_pool", "AttentionalAggregation",
           "NodeGate", "reset_module"]


def _pool_args(x, batch, size, who: str):
    """(x as (B, M, C), a restore function, batch, num_graphs) for the pools."""
    if not isinstance(x, Tensor) or x.dim() not in (1, 2, 3):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{who} expects x of shape (M,), (M, C) or (B, M, C), got {got}")
    if batch is not None and (not isinstance(batch, Tensor) or batch.dim() != 1 or
                              batch.is_floating_point()):
        raise ValueError(f"{who} expects batch as a (M,) integer tensor or None, got "
                         f"{tuple(batch.shape) if isinstance(batch, Tensor) else batch!r}")
    M = x.shape[0] if x.dim() == 1 else x.shape[-2]
    if batch is not None and batch.shape[0] != M:
        raise ValueError(f"{who}: batch has {batch.shape[0]} entries but x has {M} nodes "
                         f"(shape {tuple(x.shape)})")
    if size is None and batch is not None:
        if torch.compiler.is_compiling():
            raise ValueError(f"{who} under torch.compile needs size (the number of graphs)")
        size = int(batch.max()) + 1 if batch.numel() else 0
    if x.dim() == 1:
        return x.reshape(1, -1, 1), (lambda y: y.reshape(-1)), batch, size
    if x.dim() == 2:
        return x.unsqueeze(0), (lambda y: y[0]), batch, size
    return x, (lambda y: y), batch, size


def _pool(x, batch, size, reduce: str, who: str) -> Tensor:
    if batch is None:  # one graph: PyG keeps the node dim (size 1) for 1-d and 2-d inputs
        dim = -1 if x.dim() == 1 else -2
        if reduce == "max":
            return x.max(dim=dim, keepdim=x.dim() <= 2)[0]
        f = x.sum if reduce == "sum" else x.mean
        return f(dim=dim, keepdim=x.dim() <= 2)
    xb, restore, batch, size = _pool_args(x, batch, size, who)
    B, M, C = xb.shape
    if M == 0 or (not torch.compiler.is_compiling() and size == 0):
        return restore(xb.new_zeros(B, size, C))  # no nodes: every graph reads out zeros
    if reduce == "max":
        idx = batch.long().view(1, M, 1).expand(B, M, C)
        out = xb.new_zeros(B, size, C).scatter_reduce_(1, idx, xb, "amax", include_self=False)
        return restore(out)
    return restore(readout(batch, size, reduce).propagate(xb)[:, :, 0])


def global_add_pool(x: Tensor, batch: Tensor | None, size: int | None = None) -> Tensor:
    """PyG's ``global_add_pool``: the sum of each graph's node features, ``(N, C)`` from x
    ``(M, C)`` (also ``(M,)`` or ``(B, M, C)``), through the readout basis; ``size`` is the
    number of graphs N (default ``batch.max() + 1``; needed under ``torch.compile``)."""
    return _pool(x, batch, size, "sum", "global_add_pool")


def global_mean_pool(x: Tensor, batch: Tensor | None, size: int | None = None) -> Tensor:
    """PyG's ``global_mean_pool``: each graph's mean node features (an empty graph reads out
    zeros), through the readout basis with ``reduce="mean"``."""
    return _pool(x, batch, size, "mean", "global_mean_pool")


def global_max_pool(x: Tensor, batch: Tensor | None, size: int | None = None) -> Tensor:
    """PyG's ``global_max_pool``: each graph's channel-wise maximum (a reduction, not a
    basis; an empty graph reads out zeros, as PyG's)."""
    return _pool(x, batch, size, "max", "global_max_pool")


# ------------------------------------------------------------------------------------------------
class NodeGate(Mechanism):
    """Scores that depend on the input entry alone: ``score[k, m, n] = gate_nn(x1)[m, k]``.

    ``gate_nn`` maps x1 ``(M, P)`` to ``(M, K)``; with a softmax over inputs on the node ->
    graph edges it is the gate of an attentional readout (Li et al. 2019, PyG's
    ``AttentionalAggregation``). ``x2`` is only counted (an int N or a tensor (N, ..))."""

    def __init__(self, gate_nn: nn.Module, K: int | None = None):
        super().__init__()
        self.gate_nn, self.K = gate_nn, K

    def reset_parameters(self) -> None:
        reset_module(self.gate_nn)

    def forward(self, x1, x2, edge_attr=None):
        s = self.gate_nn(x1)  # (M, K)
        return s.t().unsqueeze(-1).expand(s.shape[1], s.shape[0], self.entries(x2))

    def edge_scores(self, x1, x2, edge_index, edge_attr=None):
        src, _ = edges(edge_index)
        return self.gate_nn(x1).index_select(0, src)


class AttentionalAggregation(nn.Module):
    """PyG's ``AttentionalAggregation(gate_nn, nn=None)``: ``r_g = Σ_{m in g}
    softmax_g(gate_nn(x))_m · nn(x)_m``, called ``(x, index=None, ptr=None, dim_size=None)``
    with x ``(M, P)``; the gate is ``(M, 1)`` (node-level) or ``(M, C)`` (per channel).

    An attention convolution from nodes to graphs: ``NodeGate`` scores, softmax over each
    graph's nodes, applied by ``GraphAttention`` (K = the gate's width)."""

    def __init__(self, gate_nn: nn.Module, nn: nn.Module | None = None):
        super().__init__()
        self.gate = NodeGate(gate_nn)
        self.nn = nn

    @property
    def gate_nn(self) -> nn.Module:
        return self.gate.gate_nn

    def reset_parameters(self) -> None:
        reset_module(self.gate_nn)
        if self.nn is not None:
            reset_module(self.nn)

    def basis(self, x: Tensor, index: Tensor, num_graphs: int) -> GraphAttention:
        """The attention readout basis (K, M, N) of this call: edges node m -> graph
        index[m], scores ``gate_nn(x)``, softmax over each graph's nodes."""
        M = x.shape[0]
        ei = torch.stack([torch.arange(M, device=index.device), index.long()])
        return GraphAttention.from_scores(ei, self.gate.edge_scores(x, num_graphs, ei), M,
                                          num_graphs)

    def forward(self, x: Tensor, index: Tensor | None = None, ptr: Tensor | None = None,
                dim_size: int | None = None) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != 2:
            raise ValueError(f"AttentionalAggregation expects x (M, P), got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        M = x.shape[0]
        if index is None and ptr is not None:
            index = torch.repeat_interleave(torch.arange(ptr.numel() - 1, device=ptr.device),
                                            ptr.diff())
        if index is None:
            index = torch.zeros(M, dtype=torch.long, device=x.device)
            dim_size = 1 if dim_size is None else dim_size
        h = self.nn(x) if self.nn is not None else x
        _, _, index, N = _pool_args(h, index, dim_size, "AttentionalAggregation")
        if M == 0 or N == 0:
            return h.new_zeros(N, h.shape[-1])
        b = self.basis(x, index, N)
        C = h.shape[-1]
        if b.K == 1:
            return b.propagate_heads(h.reshape(1, M, 1, C))[0, :, 0]
        if b.K != C:
            raise ValueError(f"AttentionalAggregation: gate_nn gives {b.K} scores per node but "
                             f"the features have {C} channels (use 1 or {C})")
        return b.propagate_heads(h.reshape(1, M, C, 1))[0, :, :, 0]


@register_pyg("AttentionalAggregation")
def _from_attentional(m):
    gate = m.gate_mlp if m.gate_mlp is not None else m.gate_nn
    inner = m.mlp if m.mlp is not None else m.nn
    return AttentionalAggregation(gate, inner).train(m.training)

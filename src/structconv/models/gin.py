"""A graph-level GIN (Xu et al. 2019): GIN (or GINE) layers with two-layer MLPs and batch norm,
a readout to one vector per graph, and a linear head.

``GIN(in_channels, hidden, num_classes, layers=5, readout="sum")`` is called
``(x, edge_index, batch, num_graphs=None, edge_attr=None)`` with the tensors of a
``sc.data.GraphBatch`` and returns ``(num_graphs, num_classes)`` logits. Pass ``num_graphs`` (an
int) under ``torch.compile``: reading it from the data would end the traced graph.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..basis.batch import adjacency
from ..nn.gin import GINConv, GINEConv
from ..nn.pool import (
    AttentionalAggregation,
    global_add_pool,
    global_max_pool,
    global_mean_pool,
)

__all__ = ["GIN", "gin_mlp", "GIN_READOUTS"]

GIN_READOUTS = ("sum", "mean", "max", "attention")


def gin_mlp(in_channels: int, hidden: int, batch_norm: bool = True) -> nn.Sequential:
    """GIN's update: Linear, BatchNorm, ReLU, Linear, BatchNorm, ReLU (norms optional)."""
    norm = (lambda: nn.BatchNorm1d(hidden)) if batch_norm else nn.Identity
    return nn.Sequential(nn.Linear(in_channels, hidden), norm(), nn.ReLU(),
                         nn.Linear(hidden, hidden), norm(), nn.ReLU())


class GIN(nn.Module):
    """GIN layers -> readout (``"sum"``, ``"mean"``, ``"max"`` or ``"attention"``) -> dropout ->
    linear head; ``edge_dim`` makes the layers GINE (edge features projected per layer);
    ``train_eps`` learns each layer's eps (GIN-eps) instead of GIN-0."""

    def __init__(self, in_channels: int, hidden: int, num_classes: int, layers: int = 5, *,
                 readout: str = "sum", dropout: float = 0.0, edge_dim: int | None = None,
                 train_eps: bool = False, batch_norm: bool = True):
        super().__init__()
        if readout not in GIN_READOUTS:
            raise ValueError(f"GIN readout must be one of {list(GIN_READOUTS)}, got {readout!r}")
        for name, v in (("in_channels", in_channels), ("hidden", hidden),
                        ("num_classes", num_classes), ("layers", layers)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GIN {name} must be a positive int, got {v!r}")
        convs = []
        for i in range(layers):
            mlp = gin_mlp(in_channels if i == 0 else hidden, hidden, batch_norm)
            convs.append(GINConv(mlp, train_eps=train_eps) if edge_dim is None else
                         GINEConv(mlp, train_eps=train_eps, edge_dim=edge_dim))
        self.convs = nn.ModuleList(convs)
        self.readout = readout
        self.attention = AttentionalAggregation(nn.Linear(hidden, 1)) \
            if readout == "attention" else None
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, num_classes)

    def reset_parameters(self) -> None:
        for c in self.convs:
            c.reset_parameters()
        if self.attention is not None:
            self.attention.reset_parameters()
        self.head.reset_parameters()

    def embed(self, x: Tensor, edge_index: Tensor, batch: Tensor, num_graphs: int | None = None,
              edge_attr: Tensor | None = None) -> Tensor:
        """The graph embeddings ``(num_graphs, hidden)`` before the head."""
        structure = edge_index
        if edge_attr is None and not torch.compiler.is_compiling() and x.shape[0]:
            # the sum basis built once for every layer (compiled code traces the sum itself)
            structure = adjacency(edge_index, x.shape[0], dtype=x.dtype)
        for conv in self.convs:
            x = conv(x, structure) if edge_attr is None or isinstance(conv, GINConv) else \
                conv(x, edge_index, edge_attr)
        if self.readout == "attention":
            return self.attention(x, batch, dim_size=num_graphs)
        pool = {"sum": global_add_pool, "mean": global_mean_pool,
                "max": global_max_pool}[self.readout]
        return pool(x, batch, num_graphs)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor,
                num_graphs: int | None = None, edge_attr: Tensor | None = None) -> Tensor:
        return self.head(self.dropout(self.embed(x, edge_index, batch, num_graphs, edge_attr)))

"""Recipes of graph models over ``sc.nn`` layers: GCN, ChebNet, SGC, GAT and R-GCN.

Each model is built for one graph (transductive node classification): the basis is computed
once from ``edge_index`` in the constructor, and ``forward(x)`` maps node features (N, F) to
logits (N, C). Weights are initialised as PyG's layers (Glorot, zero bias) so the reference
hyper-parameters reproduce the published accuracies.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .. import basis as _basis
from .._checks import check_index_tensor
from ..attention.edges import add_self_loops
from ..basis.base import Basis, Product, Sparse
from ..engine import featureless
from ..nn.attention import GATConv
from ..nn.dropout import SparseDropout
from ..nn.graph import GCNConv, RGCNConv
from ..nn.layers import Convolution
from ..params import ControlledSeparable, glorot_, reset_children
from ..sampling import apply_layers

__all__ = ["GCN", "ChebNet", "SGC", "GAT", "RGCN", "gcn_basis", "chebyshev_basis",
           "relational_basis", "identity_basis", "RelationalLayer", "glorot_",
           "featureless_convolve", "InputDropout", "TwoLayerGraphNet"]


def _check_graph(edge_index: Tensor, num_nodes: int) -> None:
    check_index_tensor(edge_index, rows=2, what="edge_index")
    if not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive int, got {num_nodes!r}")
    if edge_index.numel() and (edge_index.min() < 0 or edge_index.max() >= num_nodes):
        raise ValueError(f"edge_index has node ids in [{int(edge_index.min())}, "
                         f"{int(edge_index.max())}] but num_nodes={num_nodes}")


def identity_basis(num_nodes: int, dtype=None) -> Sparse:
    """The (1, N, N) identity: a node's self-connection (``sc.basis.identity``)."""
    return _basis.identity(num_nodes, dtype)


def gcn_basis(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None) -> Basis:
    """(1, N, N) D^-1/2 (A + I) D^-1/2 as PyG's ``gcn_norm`` (``sc.basis.gcn``)."""
    _check_graph(edge_index, num_nodes)
    return _basis.gcn(edge_index, num_nodes, edge_weight=edge_weight)


def chebyshev_basis(edge_index: Tensor, num_nodes: int, K: int,
                    edge_weight: Tensor | None = None) -> Basis:
    """(K, N, N) Chebyshev polynomials T_0..T_{K-1} of the scaled Laplacian (PyG's ChebConv)."""
    _check_graph(edge_index, num_nodes)
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"K (number of Chebyshev terms) must be a positive int, got {K!r}")
    return _basis.chebyshev(edge_index, num_nodes, K, edge_weight=edge_weight)


def relational_basis(edge_index: Tensor, edge_type: Tensor, num_nodes: int,
                     num_relations: int, sorts=None, relations=None) -> Basis:
    """(R, N, N): A[r, m, n] = 1 / |{edges of type r into n}| for each edge m -> n of type r.

    The mean-normalised neighbourhood of R-GCN (PyG's RGCNConv, ``aggr="mean"``), duplicates
    counted as PyG counts them (``sc.basis.relational``); with ``sorts`` one matrix per sort
    (ids, or names with ``relations``) instead of one per relation.
    """
    _check_graph(edge_index, num_nodes)
    return _basis.relational(edge_index, edge_type, num_nodes, sorts, normalization="mean",
                             num_relations=num_relations, relations=relations)


def featureless_convolve(conv: Convolution) -> Tensor:
    """``conv(I)`` for one-hot node features without forming I (``sc.engine.featureless``)."""
    return featureless(conv.basis, conv.param, bias=conv.bias)


#: dropout on the nonzero entries of fixed node features (``sc.nn.SparseDropout``)
InputDropout = SparseDropout


class GCN(nn.Module):
    """Kipf & Welling's 2-layer GCN: x (N, F) -> logits (N, C); dropout before each layer."""

    def __init__(self, edge_index: Tensor, num_nodes: int, in_channels: int, hidden: int,
                 out_channels: int, dropout: float = 0.5, edge_weight: Tensor | None = None):
        super().__init__()
        A = gcn_basis(edge_index, num_nodes, edge_weight)
        self.conv1 = Convolution(A, in_channels, hidden, init="glorot")
        self.conv2 = Convolution(A, hidden, out_channels, init="glorot")
        self.dropout = dropout
        self.input_dropout = InputDropout(dropout)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.input_dropout(x)
        x = F.relu(self.conv1(x))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x)

    def first_layer_parameters(self):
        return list(self.conv1.parameters())


class ChebNet(GCN):
    """Defferrard et al.'s ChebNet, 2 layers of K Chebyshev terms: x (N, F) -> (N, C)."""

    def __init__(self, edge_index: Tensor, num_nodes: int, in_channels: int, hidden: int,
                 out_channels: int, K: int = 3, dropout: float = 0.5,
                 edge_weight: Tensor | None = None):
        nn.Module.__init__(self)
        A = chebyshev_basis(edge_index, num_nodes, K, edge_weight)
        self.conv1 = Convolution(A, in_channels, hidden, init="glorot")
        self.conv2 = Convolution(A, hidden, out_channels, init="glorot")
        self.dropout = dropout
        self.input_dropout = InputDropout(dropout)


class SGC(nn.Module):
    """Wu et al.'s simplified GCN: one convolution with the basis S^K, x (N, F) -> (N, C).

    S^K is a ``Product`` of K normalised adjacencies, applied factor by factor, never formed.
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, in_channels: int, out_channels: int,
                 K: int = 2, edge_weight: Tensor | None = None):
        super().__init__()
        if not isinstance(K, int) or K < 1:
            raise ValueError(f"K (propagation steps) must be a positive int, got {K!r}")
        S = gcn_basis(edge_index, num_nodes, edge_weight)
        A: Basis = S
        for _ in range(K - 1):
            A = Product(A, S)
        # PyG's SGConv is a torch-initialised Linear, which Convolution's default init matches
        self.conv = Convolution(A, in_channels, out_channels)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        reset_children(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)

    def first_layer_parameters(self):
        return list(self.conv.parameters())


class GAT(nn.Module):
    """2-layer GAT: ``heads`` × ``hidden`` concatenated, ELU, ``out_heads`` averaged; (N, C).

    Two ``sc.nn.GATConv`` layers (the attention basis applied edge-wise), equal to PyG's.
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, in_channels: int, hidden: int,
                 out_channels: int, heads: int = 8, out_heads: int = 1, dropout: float = 0.6):
        super().__init__()
        _check_graph(edge_index, num_nodes)
        loops = add_self_loops(edge_index.long(), num_nodes)[0]  # self loops, as PyG
        self.conv1 = GATConv(in_channels, hidden, heads=heads, dropout=dropout,
                             add_self_loops=False)
        self.conv2 = GATConv(heads * hidden, out_channels, heads=out_heads, concat=False,
                             dropout=dropout, add_self_loops=False)
        self._glorot()
        self.register_buffer("edge_index", loops, persistent=False)
        self.dropout = dropout
        self.input_dropout = InputDropout(dropout)

    def _glorot(self) -> None:
        for conv in (self.conv1, self.conv2):
            glorot_(conv.lin.weight)  # PyG initialises the projection with Glorot

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does: the layers' own inits, then Glorot
        projections."""
        self.conv1.reset_parameters()
        self.conv2.reset_parameters()
        self._glorot()

    def forward(self, x: Tensor) -> Tensor:
        x = self.input_dropout(x)
        x = F.elu(self.conv1(x, self.edge_index))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, self.edge_index)

    def first_layer_parameters(self):
        return list(self.conv1.parameters())


class RelationalLayer(nn.Module):
    """R-GCN layer: mean over each relation's neighbours (R matrices) plus a self-connection;
    x (N, P) or None (one-hot nodes) -> (N, Q). ``param``: the relational theta's form (a name
    or a ``sc.params`` module; R-GCN's basis decomposition is ``ControlledSeparable``)."""

    def __init__(self, rel: Basis, eye: Basis, in_channels: int, out_channels: int,
                 param="full"):
        super().__init__()
        # the self-connection (the identity basis) keeps its own full weight, as in the paper
        self.conv = Convolution(rel, in_channels, out_channels, param, bias=False, init="glorot")
        self.root = Convolution(eye, in_channels, out_channels, init="glorot")

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        reset_children(self)

    def forward(self, x: Tensor | None) -> Tensor:
        if x is None:
            # the self-connection of one-hot features is the root weight itself
            return featureless_convolve(self.conv) + self.root.param()[0] + self.root.bias
        return self.conv(x) + self.root(x)


class RGCN(nn.Module):
    """Schlichtkrull et al.'s 2-layer R-GCN for entity classification: (N, C) logits.

    ``forward(x=None)`` treats nodes as one-hot features (featureless, as in the paper), as
    it does an (N, 0) ``x`` (a featureless dataset's input).
    ``num_bases`` (the paper's basis decomposition) is ``ControlledSeparable`` with H bases;
    without it the relational weights take the form ``param`` ("full", "depthwise").
    ``sorts``: one basis matrix per random-walk sort (default: one per relation).
    """

    def __init__(self, edge_index: Tensor, edge_type: Tensor, num_nodes: int, num_relations: int,
                 hidden: int, out_channels: int, num_bases: int | None = None,
                 in_channels: int | None = None, sorts=None, relations=None,
                 param: str = "full"):
        super().__init__()
        rel = relational_basis(edge_index, edge_type, num_nodes, num_relations, sorts, relations)
        eye = identity_basis(num_nodes)
        P = num_nodes if in_channels is None else in_channels
        # R-GCN's basis decomposition is controlled separability over the R relations
        def form(p, q):
            return param if num_bases is None else ControlledSeparable(rel.K, p, q, num_bases)
        self.conv1 = RelationalLayer(rel, eye, P, hidden, form(P, hidden))
        self.conv2 = RelationalLayer(rel, eye, hidden, out_channels, form(hidden, out_channels))

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        reset_children(self)

    def forward(self, x: Tensor | None = None) -> Tensor:
        if x is not None and x.shape[-1] == 0:  # a featureless graph's (N, 0) input
            x = None
        return self.conv2(F.relu(self.conv1(x)))

    def first_layer_parameters(self):
        return list(self.conv1.parameters())


class TwoLayerGraphNet(nn.Module):
    """Two graph layers with ReLU between, run full batch (``full``) or on a sampled
    ``MiniBatch`` (``forward``): ``kind`` "gcn" (``sc.nn.GCNConv``) or "sage" (GraphSAGE's
    mean aggregator: a one-relation ``sc.nn.RGCNConv`` with its root weight); (N, C) logits."""

    def __init__(self, kind: str, P: int, H: int, C: int):
        super().__init__()
        if kind == "gcn":
            self.layers = nn.ModuleList([GCNConv(P, H), GCNConv(H, C)])
        else:  # GraphSAGE's mean aggregator: one relation, mean, root weight
            self.layers = nn.ModuleList([RGCNConv(P, H, 1), RGCNConv(H, C, 1)])
        self.kind = kind

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        reset_children(self)

    def forward(self, batch):
        return apply_layers(list(self.layers), batch.x, batch.bases, act=F.relu)

    def full(self, x, edge_index, edge_type):
        for i, m in enumerate(self.layers):
            x = m(x, edge_index) if self.kind == "gcn" else m(x, edge_index, edge_type)
            x = F.relu(x) if i == 0 else x
        return x

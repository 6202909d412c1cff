"""Index-based plus content-based heads on graphs: GAT heads and GCN heads in one layer.

``HeadsLayer`` is one structured convolution whose basis is ``sc.basis.Stack([GAT attention
heads (content-based, per-edge softmax), Â^1..Â^h (index-based, GCN-normalised powers)])`` with a
``LowRank`` theta (a value map per head); ``HeadsNet`` is two of them (the models of
``structconv reproduce mixed-heads``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.basis import GraphAttention, GraphStructure
from ..attention.edges import add_self_loops
from ..basis.base import Stack
from ..basis.graph import PowerBasis, gcn
from ..engine import convolve
from ..params import LowRank, glorot_, reset_children
from .graph import InputDropout

__all__ = ["HeadsLayer", "HeadsNet"]


class HeadsLayer(nn.Module):
    """``att`` GAT heads plus the index heads of ``index`` in one convolution: (N, F) -> (N, Q).

    Head k has value map ``theta.value[k]`` (F, r); head outputs are concatenated (``concat``,
    Q = K r) or averaged (Q = r) through a fixed selector ``theta.out``.
    """

    def __init__(self, src: Tensor, dst: Tensor, num_nodes: int, in_channels: int, r: int,
                 att: int, index: PowerBasis | None, concat: bool, dropout: float,
                 negative_slope: float = 0.2):
        super().__init__()
        K = att + (index.K if index is not None else 0)
        if K == 0:
            raise ValueError("a HeadsLayer needs at least one attention or index head")
        self.register_buffer("src", src, persistent=False)
        self.register_buffer("dst", dst, persistent=False)
        self.N, self.A, self.r, self.K = num_nodes, att, r, K
        self.index, self.dropout, self.negative_slope = index, dropout, negative_slope
        self.concat = concat
        Q = K * r if concat else r
        self.theta = LowRank(K, in_channels, Q, r)
        self.theta.out.requires_grad_(False)  # a fixed concat / mean, as in GAT
        if att:
            self.att_src = nn.Parameter(torch.empty(att, r))
            self.att_dst = nn.Parameter(torch.empty(att, r))
        self.bias = nn.Parameter(torch.empty(Q))
        self._structure = None
        self._init()

    def _init(self) -> None:
        """Glorot value maps and attention vectors, the fixed selector, a zero bias (after
        ``LowRank``'s own draw, which the constructor made first)."""
        K, r, A = self.K, self.r, self.A
        glorot_(self.theta.value, self.theta.P, K * r)
        sel = torch.zeros_like(self.theta.out)
        for k in range(K):
            cols = slice(k * r, (k + 1) * r) if self.concat else slice(None)
            sel[k, :, cols] = torch.eye(r) / (1.0 if self.concat else K)
        with torch.no_grad():
            self.theta.out.copy_(sel)
            if A:
                glorot_(self.att_src, A, r)
                glorot_(self.att_dst, A, r)
            self.bias.zero_()

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does: ``LowRank``'s draw, then Glorot value
        maps and attention vectors, the fixed selector and a zero bias."""
        self.theta.reset_parameters()
        self._init()

    def attention(self, x: Tensor) -> GraphAttention:
        """The GAT basis (att, N, N) on x (N, F): softmax over each node's in-edges (+ self)."""
        return self.attention_from(torch.einsum("nf,kfr->nkr", x, self.theta.value[: self.A]))

    def attention_from(self, h: Tensor) -> GraphAttention:
        """The GAT basis from the attention heads' projected inputs h (N, att, r)."""
        a_s, a_d = (h * self.att_src).sum(-1), (h * self.att_dst).sum(-1)  # (N, att)
        e = F.leaky_relu(a_s[self.src] + a_d[self.dst], self.negative_slope)  # (E, att)
        mx = torch.zeros(self.N, self.A, dtype=e.dtype).scatter_reduce(
            0, self.dst[:, None].expand(-1, self.A), e.detach(), "amax", include_self=False)
        w = (e - mx[self.dst]).exp()
        den = torch.zeros(self.N, self.A, dtype=w.dtype).index_add_(0, self.dst, w)
        alpha = F.dropout(w / den[self.dst], self.dropout, self.training)
        if self._structure is None:
            self._structure = GraphStructure(torch.stack([self.src, self.dst]), self.N,
                                             self.N, self.A)
        # per-edge CSR kernels: O(E) work and memory, in the forward and the backward
        return GraphAttention(self._structure.edge_index, alpha, self.N, self.N,
                              structure=self._structure)

    def basis(self, x: Tensor):
        """The layer's basis on x: Stack([attention heads, index heads]) (or the one present)."""
        parts = ([self.attention(x)] if self.A else []) + \
            ([self.index] if self.index is not None else [])
        return parts[0] if len(parts) == 1 else Stack(parts)

    def forward(self, x: Tensor) -> Tensor:
        """(N, F) dense or sparse COO -> (N, Q)."""
        if not x.is_sparse:
            return convolve(x, self.basis(x), self.theta, route="lowrank_heads") + self.bias
        # bag-of-words input (~1% dense): LowRank's heads route, y = sum_k A_k^T (x V_k) O_k,
        # with the projection x V as one sparse product shared by the attention scores
        N, K, r = self.N, self.K, self.r
        V = self.theta.value.permute(1, 0, 2).reshape(-1, K * r)
        z = torch.sparse.mm(x, V).reshape(1, N, K, r)
        parts = ([self.attention_from(z[0, :, : self.A])] if self.A else []) + \
            ([self.index] if self.index is not None else [])
        basis = parts[0] if len(parts) == 1 else Stack(parts)
        h = basis.propagate_heads(z).reshape(N, K * r)
        return h @ self.theta.out.reshape(K * r, -1) + self.bias


class HeadsNet(nn.Module):
    """Two HeadsLayers (concat, ELU, then mean over one head of each kind): (N, F) -> (N, C).

    ``sparse=True`` feeds layer 1 the features as a sparse matrix (same dropout distribution).
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, in_channels: int, classes: int,
                 att: int, hops: int, r: int, dropout: float = 0.6, sparse: bool = False):
        super().__init__()
        self.sparse, self._key, self._xs = sparse, None, None
        src, dst = add_self_loops(edge_index.long(), num_nodes)[0]  # self loops, as GAT
        op = gcn(edge_index, num_nodes).op
        index1 = PowerBasis(op, tuple(range(1, hops + 1))) if hops else None
        index2 = PowerBasis(op, (1,)) if hops else None
        self.conv1 = HeadsLayer(src, dst, num_nodes, in_channels, r, att, index1, True, dropout)
        width = self.conv1.K * r
        self.conv2 = HeadsLayer(src, dst, num_nodes, width, classes, 1 if att else 0, index2,
                                False, dropout)
        self.dropout = dropout
        self.input_dropout = InputDropout(dropout)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        reset_children(self)

    def sparse_input(self, x: Tensor) -> Tensor:
        """x (N, F) as a coalesced COO tensor (cached), with dropout on its non-zeros."""
        key = (x.data_ptr(), x._version, tuple(x.shape))
        if key != self._key:
            self._xs, self._key = x.to_sparse_coo().coalesce(), key
        xs = self._xs
        if self.training and self.dropout > 0:
            v = xs.values()
            keep = torch.rand(v.shape, dtype=v.dtype) >= self.dropout
            xs = torch.sparse_coo_tensor(xs.indices(), v * keep / (1.0 - self.dropout),
                                         xs.shape, is_coalesced=True, check_invariants=False)
        return xs

    def forward(self, x: Tensor) -> Tensor:
        x = self.sparse_input(x) if self.sparse else self.input_dropout(x)
        x = F.elu(self.conv1(x))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x)

"""Graph models built from ``sc.nn.Convolution``: GCN, ChebNet, SGC, GAT and R-GCN.

Each model is built for one graph (transductive node classification): the basis is computed
once from ``edge_index`` in the constructor, and ``forward(x)`` maps node features (N, F) to
logits (N, C). Weights are initialised as PyG's layers (Glorot, zero bias) so the reference
hyper-parameters reproduce the published accuracies.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import basis as _basis
from .._checks import check_index_tensor
from ..basis.base import Basis, Product, Sparse, csr_matmul, to_csr
from ..nn.layers import Convolution
from ..params import ControlledSeparable, Full, LowRank

__all__ = ["GCN", "ChebNet", "SGC", "GAT", "RGCN", "gcn_basis", "chebyshev_basis",
           "relational_basis", "identity_basis", "glorot_", "featureless_convolve", "InputDropout"]


def _check_graph(edge_index: Tensor, num_nodes: int) -> None:
    check_index_tensor(edge_index, rows=2, what="edge_index")
    if not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive int, got {num_nodes!r}")
    if edge_index.numel() and (edge_index.min() < 0 or edge_index.max() >= num_nodes):
        raise ValueError(f"edge_index has node ids in [{int(edge_index.min())}, "
                         f"{int(edge_index.max())}] but num_nodes={num_nodes}")


def _sparse(rows: Tensor, cols: Tensor, vals: Tensor, N: int, k: Tensor | None = None,
            K: int = 1) -> Sparse:
    k = torch.zeros_like(rows) if k is None else k
    return Sparse(torch.stack([k, rows, cols]), vals, (K, N, N))


def identity_basis(num_nodes: int, dtype=None) -> Sparse:
    """The (1, N, N) identity: a node's self-connection."""
    i = torch.arange(num_nodes)
    return _sparse(i, i, torch.ones(num_nodes, dtype=dtype or torch.get_default_dtype()),
                   num_nodes)


def gcn_basis(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None) -> Basis:
    """(1, N, N) D^-1/2 (A + I) D^-1/2 as PyG's ``gcn_norm`` (degrees on targets).

    Uses ``sc.basis.gcn`` where the library provides it.
    """
    _check_graph(edge_index, num_nodes)
    if hasattr(_basis, "gcn"):
        return _basis.gcn(edge_index, num_nodes, edge_weight=edge_weight)
    src, dst = edge_index.long()
    w = (torch.ones(src.shape[0], dtype=torch.get_default_dtype()) if edge_weight is None
         else edge_weight.to(torch.get_default_dtype()))
    # PyG's add_remaining_self_loops: an existing self loop keeps its weight, others get 1
    loop = src == dst
    loop_w = torch.ones(num_nodes, dtype=w.dtype)
    loop_w[src[loop]] = w[loop]
    i = torch.arange(num_nodes)
    src, dst = torch.cat([src[~loop], i]), torch.cat([dst[~loop], i])
    w = torch.cat([w[~loop], loop_w])
    deg = torch.zeros(num_nodes, dtype=w.dtype).index_add_(0, dst, w)
    dis = deg.pow(-0.5).masked_fill(deg == 0, 0.0)
    return _sparse(src, dst, dis[src] * w * dis[dst], num_nodes)


def _cheb_lhat(edge_index: Tensor, num_nodes: int, edge_weight=None, lambda_max=2.0):
    """COO (rows, cols, vals) of the scaled Laplacian 2 L / lambda_max - I, sym normalisation."""
    src, dst = edge_index.long()
    w = (torch.ones(src.shape[0], dtype=torch.get_default_dtype()) if edge_weight is None
         else edge_weight.to(torch.get_default_dtype()))
    keep = src != dst  # ChebConv drops self loops before normalising
    src, dst, w = src[keep], dst[keep], w[keep]
    deg = torch.zeros(num_nodes, dtype=w.dtype).index_add_(0, src, w)
    dis = deg.pow(-0.5).masked_fill(deg == 0, 0.0)
    s = 2.0 / lambda_max
    i = torch.arange(num_nodes)
    vals = torch.cat([-s * dis[src] * w * dis[dst], torch.full((num_nodes,), s - 1.0,
                                                                dtype=w.dtype)])
    return torch.cat([src, i]), torch.cat([dst, i]), vals


def chebyshev_basis(edge_index: Tensor, num_nodes: int, K: int,
                    edge_weight: Tensor | None = None) -> Basis:
    """(K, N, N) Chebyshev polynomials T_0..T_{K-1} of the scaled Laplacian (PyG's ChebConv).

    Uses ``sc.basis.chebyshev`` where the library provides it; otherwise multiplies the sparse
    matrices out (fine for the small K of the recipes).
    """
    _check_graph(edge_index, num_nodes)
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"K (number of Chebyshev terms) must be a positive int, got {K!r}")
    if hasattr(_basis, "chebyshev"):
        return _basis.chebyshev(edge_index, num_nodes, K, edge_weight=edge_weight)
    N = num_nodes
    r, c, v = _cheb_lhat(edge_index, N, edge_weight)
    L = torch.sparse_coo_tensor(torch.stack([r, c]), v, (N, N),
                                check_invariants=True).coalesce()
    eye = torch.sparse_coo_tensor(torch.arange(N).repeat(2, 1), torch.ones(N, dtype=v.dtype),
                                  (N, N), check_invariants=True).coalesce()
    Ts = [eye, L][:K]
    while len(Ts) < K:
        Ts.append((2 * torch.sparse.mm(Ts[-1], L) - Ts[-2]).coalesce())
    ks, rows, cols, vals = [], [], [], []
    for k, T in enumerate(Ts):
        idx = T.indices()
        ks.append(torch.full((idx.shape[1],), k))
        rows.append(idx[0])
        cols.append(idx[1])
        vals.append(T.values())
    return _sparse(torch.cat(rows), torch.cat(cols), torch.cat(vals), N, torch.cat(ks), K)


def relational_basis(edge_index: Tensor, edge_type: Tensor, num_nodes: int,
                     num_relations: int) -> Sparse:
    """(R, N, N): A[r, m, n] = 1 / |{edges of type r into n}| for each edge m -> n of type r.

    The mean-normalised neighbourhood of R-GCN (PyG's RGCNConv, ``aggr="mean"``), duplicates
    counted as PyG counts them.
    """
    _check_graph(edge_index, num_nodes)
    if edge_type.dim() != 1 or edge_type.shape[0] != edge_index.shape[1]:
        raise ValueError(f"edge_type must be ({edge_index.shape[1]},) to match edge_index "
                         f"{tuple(edge_index.shape)}, got {tuple(edge_type.shape)}")
    t = edge_type.long()
    if t.numel() and (t.min() < 0 or t.max() >= num_relations):
        raise ValueError(f"edge_type values in [{int(t.min())}, {int(t.max())}] but "
                         f"num_relations={num_relations}")
    src, dst = edge_index.long()
    key = t * num_nodes + dst
    cnt = torch.bincount(key, minlength=num_relations * num_nodes).to(torch.get_default_dtype())
    return _sparse(src, dst, 1.0 / cnt[key], num_nodes, t, num_relations)


def glorot_(t: Tensor) -> Tensor:
    """PyG's glorot: uniform(±sqrt(6 / (fan_in + fan_out))) on the last two dims, in place."""
    b = math.sqrt(6.0 / (t.shape[-2] + t.shape[-1]))
    with torch.no_grad():
        return t.uniform_(-b, b)


def _reset(conv: Convolution) -> Convolution:
    p = conv.param
    if isinstance(p, Full):
        glorot_(p.weight)
    elif isinstance(p, ControlledSeparable):
        glorot_(p.channel)
        # PyG's comp is (R, bases); ours is its transpose, same bound
        glorot_(p.basis_coef)
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)
    return conv


def featureless_convolve(conv: Convolution) -> Tensor:
    """``conv(I)`` for one-hot node features without forming I: (N, Q) = Σ_k A_kᵀ Θ_k (+ bias).

    With X = I the input-side product X·Θ is Θ itself, so only the propagation remains; for a
    ``Sparse`` basis it is one SpMM of Aᵀ arranged (N, K*M) with theta viewed as (K*M, Q).
    """
    theta = conv.param()  # (K, N, Q)
    K, M, Q = theta.shape
    if M != conv.basis.M:
        raise ValueError(f"featureless input needs in_channels == num_nodes={conv.basis.M}, "
                         f"got theta {tuple(theta.shape)}")
    basis = conv.basis
    if isinstance(basis, Sparse) and not basis.values.requires_grad:
        key = (theta.dtype, theta.device)
        cache = conv.__dict__.setdefault("_featureless_csr", {})
        if key not in cache:
            k, m, n = basis.indices.to(theta.device)
            v = basis.values.detach().to(device=theta.device, dtype=theta.dtype)
            cache[key] = (to_csr(n, k * M + m, v, (basis.N, K * M)),
                          to_csr(k * M + m, n, v, (K * M, basis.N)))
        y = csr_matmul(*cache[key], theta.reshape(K * M, Q))
    else:
        y = basis._matching(theta).propagate_sum(theta.permute(1, 0, 2).unsqueeze(0))[0]
    return y if conv.bias is None else y + conv.bias

class InputDropout(nn.Module):
    """Dropout on the non-zero entries of a fixed, mostly-zero input x (N, F) (sparse dropout).

    Same distribution as ``F.dropout`` (a dropped zero is still zero) but it draws one number per
    non-zero: bag-of-words features are ~1% dense. The non-zero positions are cached per input.
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self._key = None
        self._idx = None

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.requires_grad:
            return F.dropout(x, self.p, True)
        key = (x.data_ptr(), x._version, tuple(x.shape), x.dtype, x.device)
        if key != self._key:
            self._idx = (x.reshape(-1) != 0).nonzero().squeeze(1)
            self._key = key
        flat = x.reshape(-1)
        vals = flat[self._idx]
        keep = torch.rand(vals.shape, dtype=vals.dtype, device=vals.device) >= self.p
        out = torch.zeros_like(flat)
        out[self._idx] = vals * keep / (1.0 - self.p)
        return out.reshape(x.shape)


class GCN(nn.Module):
    """Kipf & Welling's 2-layer GCN: x (N, F) -> logits (N, C); dropout before each layer."""

    def __init__(self, edge_index: Tensor, num_nodes: int, in_channels: int, hidden: int,
                 out_channels: int, dropout: float = 0.5, edge_weight: Tensor | None = None):
        super().__init__()
        A = gcn_basis(edge_index, num_nodes, edge_weight)
        self.conv1 = _reset(Convolution(A, in_channels, hidden))
        self.conv2 = _reset(Convolution(A, hidden, out_channels))
        self.dropout = dropout
        self.input_dropout = InputDropout(dropout)

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
        self.conv1 = _reset(Convolution(A, in_channels, hidden))
        self.conv2 = _reset(Convolution(A, hidden, out_channels))
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

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)

    def first_layer_parameters(self):
        return list(self.conv.parameters())


class _GATLayer(nn.Module):
    """GAT attention (Veličković et al.) as a content-computed sparse basis, one matrix per head.

    A[k, m, n] = softmax over m in N(n) ∪ {n} of LeakyReLU(a_src_k·W_k x_m + a_dst_k·W_k x_n),
    applied with ``LowRank`` theta (value W_k, output the head's block: concat or mean).
    """

    def __init__(self, src: Tensor, dst: Tensor, num_nodes: int, in_channels: int,
                 out_per_head: int, heads: int, concat: bool, dropout: float,
                 negative_slope: float = 0.2):
        super().__init__()
        self.register_buffer("src", src, persistent=False)
        self.register_buffer("dst", dst, persistent=False)
        self.N, self.H, self.C, self.concat = num_nodes, heads, out_per_head, concat
        self.dropout, self.negative_slope = dropout, negative_slope
        Q = heads * out_per_head if concat else out_per_head
        self.param = LowRank(heads, in_channels, Q, out_per_head)
        self.param.value.requires_grad_(True)
        # W_k: PyG's lin is glorot on (in, heads*out); the output map is a fixed selector
        b = math.sqrt(6.0 / (in_channels + heads * out_per_head))
        with torch.no_grad():
            self.param.value.uniform_(-b, b)
            sel = torch.zeros(heads, out_per_head, Q)
            for k in range(heads):
                cols = slice(k * out_per_head, (k + 1) * out_per_head) if concat else slice(None)
                sel[k, :, cols] = torch.eye(out_per_head) / (1.0 if concat else heads)
            self.param.out.copy_(sel)
        self.param.out.requires_grad_(False)
        self.att_src = nn.Parameter(glorot_(torch.empty(heads, out_per_head)))
        self.att_dst = nn.Parameter(glorot_(torch.empty(heads, out_per_head)))
        self.bias = nn.Parameter(torch.zeros(Q))

    def basis(self, x: Tensor) -> Sparse:
        """The attention basis (heads, N, N) for features x (N, F)."""
        h = (x @ self.param.value.permute(1, 0, 2).reshape(x.shape[1], -1))
        h = h.reshape(self.N, self.H, self.C)
        a_s = (h * self.att_src).sum(-1)  # (N, H)
        a_d = (h * self.att_dst).sum(-1)
        e = F.leaky_relu(a_s[self.src] + a_d[self.dst], self.negative_slope)  # (E, H)
        # softmax over the incoming edges of each target node
        idx = self.dst[:, None].expand(-1, self.H)
        e = e - torch.zeros(self.N, self.H, dtype=e.dtype).scatter_reduce(
            0, idx, e.detach(), "amax", include_self=False)[self.dst]
        w = e.exp()
        den = torch.zeros(self.N, self.H, dtype=w.dtype).index_add_(0, self.dst, w)
        alpha = F.dropout(w / den[self.dst], self.dropout, self.training)
        E = self.src.shape[0]
        k = torch.arange(self.H).repeat(E)
        return Sparse(torch.stack([k, self.src.repeat_interleave(self.H),
                                   self.dst.repeat_interleave(self.H)]),
                      alpha.reshape(-1), (self.H, self.N, self.N))

    def forward(self, x: Tensor) -> Tensor:
        from ..engine import convolve

        return convolve(x, self.basis(x), self.param, route="lowrank_heads") + self.bias


class GAT(nn.Module):
    """2-layer GAT: ``heads`` × ``hidden`` concatenated, ELU, ``out_heads`` averaged; (N, C).

    Uses ``sc.nn.attention.GATConv`` (attention basis applied edge-wise) where the library has
    it, otherwise this module's ``_GATLayer``; both equal PyG's GATConv.
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, in_channels: int, hidden: int,
                 out_channels: int, heads: int = 8, out_heads: int = 1, dropout: float = 0.6):
        super().__init__()
        _check_graph(edge_index, num_nodes)
        src, dst = edge_index.long()
        keep = src != dst
        i = torch.arange(num_nodes)
        src, dst = torch.cat([src[keep], i]), torch.cat([dst[keep], i])  # self loops, as PyG
        try:
            from ..nn.attention import GATConv
        except ImportError:
            GATConv = None
        if GATConv is not None:
            self.conv1 = GATConv(in_channels, hidden, heads=heads, dropout=dropout,
                                 add_self_loops=False)
            self.conv2 = GATConv(heads * hidden, out_channels, heads=out_heads, concat=False,
                                 dropout=dropout, add_self_loops=False)
            for conv in (self.conv1, self.conv2):
                glorot_(conv.lin.weight)  # PyG initialises the projection with Glorot
            self.register_buffer("edge_index", torch.stack([src, dst]), persistent=False)
        else:
            self.conv1 = _GATLayer(src, dst, num_nodes, in_channels, hidden, heads, True,
                                   dropout)
            self.conv2 = _GATLayer(src, dst, num_nodes, heads * hidden, out_channels, out_heads,
                                   False, dropout)
            self.edge_index = None
        self.dropout = dropout
        self.input_dropout = InputDropout(dropout)

    def _conv(self, conv, x):
        return conv(x) if self.edge_index is None else conv(x, self.edge_index)

    def forward(self, x: Tensor) -> Tensor:
        x = self.input_dropout(x)
        x = F.elu(self._conv(self.conv1, x))
        x = F.dropout(x, self.dropout, self.training)
        return self._conv(self.conv2, x)

    def first_layer_parameters(self):
        return list(self.conv1.parameters())


class _RelationalLayer(nn.Module):
    """R-GCN layer: mean over each relation's neighbours (R matrices) plus a self-connection."""

    def __init__(self, rel: Basis, eye: Basis, in_channels: int, out_channels: int,
                 num_bases: int | None):
        super().__init__()
        param = ("full" if num_bases is None
                 else ControlledSeparable(rel.K, in_channels, out_channels, num_bases))
        # R-GCN's basis decomposition is controlled separability over the R relations; the
        # self-connection (the identity basis) keeps its own full weight, as in the paper
        self.conv = _reset(Convolution(rel, in_channels, out_channels, param, bias=False))
        self.root = _reset(Convolution(eye, in_channels, out_channels))

    def forward(self, x: Tensor | None) -> Tensor:
        if x is None:
            # the self-connection of one-hot features is the root weight itself
            return featureless_convolve(self.conv) + self.root.param()[0] + self.root.bias
        return self.conv(x) + self.root(x)


class RGCN(nn.Module):
    """Schlichtkrull et al.'s 2-layer R-GCN for entity classification: (N, C) logits.

    ``forward(x=None)`` treats nodes as one-hot features (featureless, as in the paper).
    ``num_bases`` (the paper's basis decomposition) is ``ControlledSeparable`` with H bases.
    """

    def __init__(self, edge_index: Tensor, edge_type: Tensor, num_nodes: int, num_relations: int,
                 hidden: int, out_channels: int, num_bases: int | None = None,
                 in_channels: int | None = None):
        super().__init__()
        rel = relational_basis(edge_index, edge_type, num_nodes, num_relations)
        eye = identity_basis(num_nodes)
        P = num_nodes if in_channels is None else in_channels
        self.conv1 = _RelationalLayer(rel, eye, P, hidden, num_bases)
        self.conv2 = _RelationalLayer(rel, eye, hidden, out_channels, num_bases)

    def forward(self, x: Tensor | None = None) -> Tensor:
        return self.conv2(F.relu(self.conv1(x)))

    def first_layer_parameters(self):
        return list(self.conv1.parameters())

"""Graph-attention layers with PyG's signatures, built from ``sc.attention``'s algebra.

Each is an attention convolution y_n = Σ_k Σ_m A_k[m, n] · v_m,k whose basis A_k is a
mechanism (a sum of terms) softmaxed over each node's incoming edges, all through one path:
``attention_basis`` (edge scores -> transforms -> edge softmax -> dropout) and
``GraphAttention``'s CSR kernel, in O(E) memory, never N x N.

* ``GATConv``          Softmax(LeakyReLU(GATScores + EdgeTerm)) on h = xΘ_k (Veličković et al.),
* ``GATv2Conv``        Softmax(GATv2Scores) (Brody et al.: the attention vector after the
  nonlinearity of the summed projections, edge features inside it),
* ``TransformerConv``  Softmax(HeadDot + EdgeDot) on keys/queries (Shi et al.), values plus the
  projected edge features as messages, a skip (``root_weight``) gated by ``beta``.

Each layer's forward projects its inputs and calls its mechanism's function on the projected
features, ``gat_conv``, ``gatv2_conv`` or ``transformer_conv`` (heads kept, or summed as the
declared ``graph_attention`` layer of configs does, which calls the same functions).

Called ``(x, edge_index)`` or ``(x, edge_index, edge_attr)`` with ``edge_attr`` (E, edge_dim)
(or (E,) when edge_dim is 1), ``x`` (N, F) or a bipartite pair (x_src, x_dst), and
``return_attention_weights`` as PyG. ``from_pyg`` converts PyG's layers of the same names for
every constructor option, refusing by name what it cannot reproduce (flow, aggr).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.basis import GraphAttention, GraphStructure
from ..attention.build import attention_basis
from ..attention.edges import (
    FILL_REDUCTIONS,
    EdgeDot,
    EdgeTerm,
    GATv2Scores,
    add_self_loops,
    edge_features,
)
from ..attention.mechanisms import (
    GATScores,
    GraphMasked,
    HeadDot,
    LeakyReLU,
    Mechanism,
    Softmax,
)
from ..basis.edges import as_edge_index
from .convert import register_pyg
from .pyg import PyGCompatible, check_mask, is_lazy, lazy_parameter

__all__ = ["GATConv", "GATv2Conv", "TransformerConv", "gat_conv", "gatv2_conv",
           "transformer_conv", "gat_mechanism", "graph_softmax", "transformer_scores",
           "gated_root"]


# -- the mechanisms and the root term ------------------------------------------------------------
def gat_mechanism(scores: Mechanism, edge_index: Tensor, negative_slope: float) -> Softmax:
    """GAT's whole mechanism on a graph: Softmax(LeakyReLU(GraphMasked(scores, edge_index)))
    (``scores``: ``GATScores``, plus an ``EdgeTerm`` with edge features)."""
    return Softmax(LeakyReLU(GraphMasked(scores, edge_index), negative_slope))


def graph_softmax(scores: Mechanism, edge_index: Tensor) -> Softmax:
    """Softmax(GraphMasked(scores, edge_index)): GATv2's and TransformerConv's mechanism on a
    graph (the scores' own nonlinearity inside, if any)."""
    return Softmax(GraphMasked(scores, edge_index))


def transformer_scores(heads: int, channels: int, with_edges: bool) -> Mechanism:
    """TransformerConv's scores: HeadDot(k, q) (+ EdgeDot on the edge keys ê, which a layer
    projects once and also sends as messages)."""
    mech = HeadDot(heads, channels)
    return mech + EdgeDot(heads, channels) if with_edges else mech


def gated_root(out: Tensor, root: Tensor, lin_beta: nn.Module | None) -> Tensor:
    """The root term added to ``out``, or gated as PyG's TransformerConv (``beta``):
    b·root + (1 − b)·out with b = sigmoid(lin_beta([out, root, out − root]))."""
    if lin_beta is None:
        return out + root
    b = torch.sigmoid(lin_beta(torch.cat([out, root, out - root], -1)))
    return b * root + (1 - b) * out


# -- the convolutions on projected features: each mechanism's one implementation, which the
# layers below and the declared ``graph_attention`` layer (any projection, heads summed) call ----
def _heads(basis: GraphAttention, h: Tensor, sum_heads: bool) -> Tensor:
    """Σ_m A_k[m, n] h[m, k]: (N, K, C) per head, or (N, C) summed over heads in one product."""
    z = h.unsqueeze(0)
    return (basis.propagate_sum(z) if sum_heads else basis.propagate_heads(z))[0]


def gat_conv(h_src: Tensor, h_dst, edge_index: Tensor, scores: Mechanism, *,
             edge_attr: Tensor | None = None, negative_slope: float = 0.2, dropout: float = 0.0,
             structure: GraphStructure | None = None, sum_heads: bool = False):
    """GAT on projected features: out[n, k] = Σ_{m -> n} α_k[m, n] h_src[m, k] with α =
    Softmax(LeakyReLU(scores)) over each node's incoming edges (``gat_mechanism``).

    h_src (M, K, C) and h_dst (N, K, C) are any projections of the inputs (h_dst the int N:
    no target term); ``edge_index`` (2, E) the edges as used (self loops included);
    ``scores`` ``GATScores`` (+ an ``EdgeTerm`` reading ``edge_attr`` (E, D)); ``dropout`` on
    the weights as given (0 in eval); ``structure`` the graph's cached ``GraphStructure``.
    Returns (out, basis): out (N, K, C), or (N, C) with ``sum_heads`` (the paper's sum of
    heads); ``basis.alpha`` (1, E, K) holds the weights.
    """
    mech = gat_mechanism(scores, edge_index, negative_slope)
    basis = attention_basis(mech, h_src, h_dst, edge_attr=edge_attr, dropout=dropout,
                            structure=structure)
    return _heads(basis, h_src, sum_heads), basis


def gatv2_conv(h_src: Tensor, h_dst: Tensor, edge_index: Tensor, scores: GATv2Scores, *,
               edge_attr: Tensor | None = None, dropout: float = 0.0,
               structure: GraphStructure | None = None, sum_heads: bool = False):
    """GATv2 on projected features: out[n, k] = Σ_{m -> n} α_k[m, n] h_src[m, k] with α =
    Softmax(``GATv2Scores``(h_src, h_dst, edge_attr)) over each node's incoming edges.

    Arguments and result as ``gat_conv`` (h_dst (N, K, C) the targets' projection: the
    sources' one with shared weights).
    """
    basis = attention_basis(graph_softmax(scores, edge_index), h_src, h_dst,
                            edge_attr=edge_attr, dropout=dropout, structure=structure)
    return _heads(basis, h_src, sum_heads), basis


def transformer_conv(query: Tensor, key: Tensor, value: Tensor, edge_index: Tensor, *,
                     edge_keys: Tensor | None = None, dropout: float = 0.0,
                     structure: GraphStructure | None = None, sum_heads: bool = False):
    """TransformerConv's attention on projected features: out[n, k] = Σ_{m -> n} α_k[m, n]
    (value[m, k] + ê[e, k]) with α = Softmax(q_n·(k_m + ê_e) / √C) over each node's edges.

    query (N, K, C), key and value (M, K, C), ``edge_keys`` ê (E, K, C) the projected edge
    features (in the scores and the messages) or None; the rest as ``gat_conv`` (the root term
    is the caller's: ``gated_root``).
    """
    shapes = [tuple(t.shape) if isinstance(t, Tensor) else t for t in (query, key, value)]
    if any(not isinstance(t, tuple) or len(t) != 3 for t in shapes) or \
            not shapes[0][1:] == shapes[1][1:] == shapes[2][1:] or shapes[1][0] != shapes[2][0]:
        raise ValueError(f"transformer_conv expects query (N, K, C), key and value (M, K, C), "
                         f"got {shapes[0]}, {shapes[1]}, {shapes[2]}")
    K, C = query.shape[-2:]
    mech = graph_softmax(transformer_scores(K, C, edge_keys is not None), edge_index)
    basis = attention_basis(mech, key, query, edge_attr=edge_keys, dropout=dropout,
                            structure=structure)
    if edge_keys is None:
        return _heads(basis, value, sum_heads), basis
    # edge-valued messages Σ_e alpha[e, k] · (v[m, k] + ê[e, k]), in one pass
    out = basis.propagate_edges(edge_keys, nodes=value)[0]
    return (out.sum(1) if sum_heads else out), basis


def _linear(i: int, o: int, bias: bool = False, glorot: bool = True) -> nn.Linear:
    """A linear map i -> o; ``i = -1``: its weight is sized on the first call (lazy)."""
    if isinstance(i, bool) or not isinstance(i, int) or not (i >= 1 or i == -1):
        raise ValueError(f"in_channels must be a positive int or -1 (lazy), got {i!r}")
    lin = nn.Linear(max(i, 1), o, bias=bias)
    if i == -1:
        lin.weight, lin.in_features = lazy_parameter(), -1
    _init_linear(lin, glorot)
    return lin


def _glorot_linear(i: int, o: int, bias: bool = False) -> nn.Linear:
    return _linear(i, o, bias, glorot=True)


def _init_linear(lin: nn.Linear | None, glorot: bool) -> None:
    """PyG's init of a ``Linear``: glorot weight and zero bias, or torch's default."""
    if lin is None or is_lazy(lin.weight):
        return
    if glorot:
        nn.init.xavier_uniform_(lin.weight)
        if lin.bias is not None:
            nn.init.zeros_(lin.bias)
    else:
        lin.reset_parameters()


def _size_linear(lin: nn.Linear | None, x: Tensor | None, glorot: bool, who: str,
                 what: str) -> None:
    """Size a lazy ``lin`` for x's width (drawn as at construction), then check the width."""
    if lin is None or x is None:
        return
    if is_lazy(lin.weight):
        lin.weight.materialize((lin.out_features, x.shape[-1]))
        lin.in_features = x.shape[-1]
        _init_linear(lin, glorot)
    if x.shape[-1] != lin.in_features:
        raise ValueError(f"{who}: {what} must have {lin.in_features} features (in_channels), "
                         f"got {x.shape[-1]} (shape {tuple(x.shape)})")


def _reglorot(*params) -> None:
    with torch.no_grad():
        for p in params:
            if p is not None:
                s = math.sqrt(6.0 / (p.shape[-2] + p.shape[-1]))
                p.uniform_(-s, s)


def _edge_linear(lin: nn.Linear) -> nn.Linear:
    """``lin`` with its weight (out, in) kept in (in, out) memory (values unchanged).

    An edge projection maps E rows (many) of few features: autograd then computes its weight
    gradient as eᵀ·g, (D, E) x (E, K·C), instead of (gᵀ·e), (K·C, E) x (E, D), a GEMM shape
    that runs ~10x slower (about 40 ms of a PubMed-sized backward pass). In-place loads and
    optimizer steps keep the layout.
    """
    w = lin.weight.detach()
    lin.weight = nn.Parameter(w.t().contiguous().t())
    return lin


def _packed(x: Tensor, lins: list[nn.Linear]) -> list[Tensor]:
    """[lin(x) for lin in lins] as one GEMM with the weights stacked (the outputs are column
    slices): one (N, F) x (F, ΣQ) product runs 15-25% faster forward and backward than
    several narrow ones on Cora/PubMed-sized inputs."""
    if len(lins) == 1:
        return [lins[0](x)]
    w = torch.cat([lin.weight for lin in lins])
    b = None if lins[0].bias is None else torch.cat([lin.bias for lin in lins])
    return list(F.linear(x, w, b).split([lin.out_features for lin in lins], -1))


def _glorot(*shape) -> nn.Parameter:
    s = math.sqrt(6.0 / (shape[-2] + shape[-1]))
    return nn.Parameter(torch.empty(*shape).uniform_(-s, s))


def _fill(value, who: str):
    """``fill_value`` checked at construction: None, a number, a tensor or a reduction name."""
    ok = value is None or isinstance(value, (int, float, Tensor)) or \
        (isinstance(value, str) and value in FILL_REDUCTIONS)
    if not ok or isinstance(value, bool):
        raise ValueError(f"{who}: fill_value must be None, a number, a tensor or one of "
                         f"{FILL_REDUCTIONS}, got {value!r}")
    return value


def _pair(x, who: str) -> tuple[Tensor, Tensor | None]:
    """(x_src, x_dst) of ``x`` (N, F) or a pair; x_src must be (M, F) floats."""
    x_src, x_dst = (x, x) if isinstance(x, Tensor) else tuple(x)
    if not isinstance(x_src, Tensor) or x_src.dim() != 2:
        got = tuple(x_src.shape) if isinstance(x_src, Tensor) else type(x_src).__name__
        raise ValueError(f"{who} expects node features (N, F) or a pair (x_src, x_dst), got "
                         f"x_src {got}")
    for t, what in ((x_src, "x_src"), (x_dst, "x_dst")):
        if isinstance(t, Tensor) and not t.is_floating_point():
            raise TypeError(f"{who} expects floating node features, got {what} of dtype "
                            f"{t.dtype}")
    if x_dst is not None and (not isinstance(x_dst, Tensor) or x_dst.dim() != 2):
        got = tuple(x_dst.shape) if isinstance(x_dst, Tensor) else type(x_dst).__name__
        raise ValueError(f"{who} expects x_dst as (N, F) node features or None, got {got}")
    return x_src, x_dst


def _empty_heads(h: Tensor, N: int) -> Tensor:
    """(N, K, C) zeros tied to h (M, K, C) for autograd: the aggregate where no edge can be."""
    return (h.sum(0) * 0).expand(N, *h.shape[1:])


def _sparse_alpha(adj, ei: Tensor, alpha: Tensor, M: int, N: int):
    """Attention weights in the form of the adjacency given: a torch sparse (N, M, K) tensor
    (PyG's ``set_sparse_value``), or a ``SparseTensor`` (N, M) with the weights as values."""
    if not isinstance(adj, Tensor):  # torch_sparse.SparseTensor (duck-typed)
        return type(adj)(row=ei[1], col=ei[0], value=alpha, sparse_sizes=(N, M))
    return torch.sparse_coo_tensor(ei.flip(0), alpha, (N, M, alpha.shape[-1])).coalesce()


def _with_weights(out: Tensor, adj, ei: Tensor, alpha: Tensor, M: int, N: int):
    """(out, weights) as PyG's GAT layers return them for the graph input's kind."""
    if adj is None:
        return out, (ei, alpha)
    if isinstance(adj, Tensor):
        return out, (_sparse_alpha(adj, ei, alpha, M, N), alpha)
    return out, _sparse_alpha(adj, ei, alpha, M, N)


class _EdgeAttention(PyGCompatible):
    """What the three layers share: the graph (self loops, cached sparse structure), the edge
    features (with the loops'), the basis and the output (concat / mean)."""

    def _edge_input(self, edge_index, edge_attr):
        """(edge_index (2, E), edge_attr, (M, N) or None, the sparse input or None) of any graph
        input (``as_edge_index``); a ``SparseTensor``'s values are the edge features."""
        if type(edge_index) is Tensor and edge_index.layout == torch.strided:  # common path
            if edge_index.dtype == torch.bool or edge_index.is_floating_point():
                raise TypeError(f"{type(self).__name__}: edge_index must be an integer (2, E) "
                                f"tensor, got dtype {edge_index.dtype}")
            return edge_index, edge_attr, None, None
        e = as_edge_index(edge_index, f"{type(self).__name__}: edge_index")
        if e.kind == "sparse_tensor" and edge_attr is None and self.edge_dim is not None:
            edge_attr = e.value
        return e.index, edge_attr, e.size, (None if e.kind == "edge_index" else edge_index)

    def _explained(self, ei: Tensor, alpha: Tensor, msg: Tensor, N: int, E_in: int,
                   keep: Tensor | None, mask: Tensor) -> Tensor:
        """Σ_e alpha[e] · msg[e] · mask[e] at each target (PyG's ``explain_message``: the added
        self loops weigh 1): (N, K, C), under PyG's ``Explainer``."""
        check_mask(mask, E_in, type(self).__name__)
        if keep is not None:
            mask = torch.cat([mask[keep], mask.new_ones(ei.shape[1] - int(keep.sum()))])
        w = (alpha * mask.to(alpha.dtype).unsqueeze(-1)).unsqueeze(-1)
        out = msg.new_zeros(N, *msg.shape[1:])
        return out.index_add(0, ei[1].long(), w * msg)

    heads: int
    out_channels: int
    concat: bool
    dropout: float
    edge_dim: int | None
    add_self_loops: bool = False
    fill_value = "mean"

    def _graph(self, edge_index: Tensor, edge_attr, M: int, N: int, loops: int | None):
        """(edges (2, E'), their features (E', edge_dim) or None, GraphStructure): the graph
        with its self loops replaced by one per node < ``loops`` (None: as given) and the
        loops' features from ``fill_value``, both by ``add_self_loops``."""
        if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or \
                edge_index.shape[0] != 2:
            got = tuple(edge_index.shape) if isinstance(edge_index, Tensor) else edge_index
            raise ValueError(f"{type(self).__name__}: edge_index must be an integer (2, E) "
                             f"tensor, got {got}")
        e = self._features(edge_attr, edge_index.shape[1])
        if torch.compiler.is_compiling():
            # one add_self_loops for edges and features (the loop-free count is data-dependent:
            # the trace must see a single one)
            ei = edge_index.long()
            if loops is not None:
                ei, e = add_self_loops(ei, loops, e, self.fill_value)
            return ei, e, GraphStructure(ei, M, N, self.heads)
        ei, st = self._structure(edge_index, M, N, loops)
        if loops is not None and e is not None:
            e = add_self_loops(edge_index, loops, e, self.fill_value)[1]
        return ei, e, st

    def _structure(self, edge_index: Tensor, M: int, N: int, loops: int | None):
        """(edges with their loops, GraphStructure), cached per graph (eager)."""
        key = (tuple(edge_index.shape), edge_index.device, M, N, loops, self.heads)
        cache = self.__dict__.get("_cache")
        # checked against the content (an edit through another view bumps no version counter):
        # one O(E) comparison against the O(E log E) build
        if cache is not None and cache[0] == key and torch.equal(cache[3], edge_index):
            return cache[1], cache[2]
        ei = edge_index.long()
        if loops is not None:
            ei = add_self_loops(ei, loops)[0]
        st = GraphStructure(ei, M, N, self.heads)
        self._cache = (key, ei, st, edge_index.clone())
        return ei, st

    def _features(self, edge_attr, E: int) -> Tensor | None:
        """``edge_attr`` checked and as (E, edge_dim), or None."""
        if edge_attr is None:
            return None
        name = type(self).__name__
        if self.edge_dim is None:
            raise ValueError(f"{name} was built without edge_dim: edge_attr must be None (give "
                             f"edge_dim={edge_attr.shape[-1] if edge_attr.dim() > 1 else 1} to "
                             "use edge features)")
        e = edge_features(edge_attr, self.edge_dim, name, E)
        if e.dim() != 2:
            raise ValueError(f"{name}: edge_attr must be (E, {self.edge_dim}), got "
                             f"{tuple(edge_attr.shape)}")
        return e

    def _p(self) -> float:
        """The attention dropout of this call (none in eval mode)."""
        return self.dropout if self.training else 0.0

    def _basis(self, mech: Softmax, x1, x2, st, edge_attr) -> GraphAttention:
        """The layer's attention basis on its graph (dropout in training only)."""
        return attention_basis(mech, x1, x2, edge_attr=edge_attr, dropout=self._p(),
                               structure=st)

    def _merge(self, out: Tensor) -> Tensor:
        """(N, K, C) -> (N, K·C) concatenated, or the mean over heads (N, C)."""
        return out.reshape(out.shape[0], self.heads * self.out_channels) if self.concat \
            else out.mean(1)


def _out_size(x_src: Tensor, x_dst: Tensor | None, size) -> tuple[int, int]:
    M = x_src.shape[0]
    if size is not None:
        if len(size) != 2 or size[0] != M:
            raise ValueError(f"size must be (num_src, num_dst) with num_src={M}, got {size}")
        return M, int(size[1])
    return M, (x_dst.shape[0] if x_dst is not None else M)


# ------------------------------------------------------------------------------------------------
class GATConv(_EdgeAttention):
    """PyG's GATConv as a self-attention convolution on per-head inputs h_k = xΘ_k.

    Same constructor, parameter names and call ``(x, edge_index, edge_attr=None, size=None,
    return_attention_weights=None)``; x is (M, F) or a pair (x_src, x_dst). The mechanism is
    ``GATScores`` (μ·h_src + ν·h_dst) plus, with ``edge_dim``, an ``EdgeTerm`` whose weight is
    att_edge · W_edge; LeakyReLU, then the softmax over each node's incoming edges
    (``GraphAttention``, O(E)). Self loops carry ``fill_value`` features (PyG's
    ``add_self_loops``). An ``edge_attr`` without ``edge_dim`` is refused (PyG ignores it).
    """

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: int | None = None,
                 fill_value="mean", bias: bool = True, residual: bool = False):
        super().__init__()
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope = concat, float(negative_slope)
        self.dropout, self.add_self_loops = float(dropout), add_self_loops
        self.edge_dim, self.residual = edge_dim, residual
        self.fill_value = _fill(fill_value, "GATConv")
        HC = heads * out_channels
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = _glorot_linear(in_channels, HC)
        else:
            self.lin_src = _glorot_linear(in_channels[0], HC)
            self.lin_dst = _glorot_linear(in_channels[1], HC)
        self.att_src = _glorot(1, heads, out_channels)
        self.att_dst = _glorot(1, heads, out_channels)
        if edge_dim is not None:
            self.lin_edge = _glorot_linear(edge_dim, HC)
            self.att_edge = _glorot(1, heads, out_channels)
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        total = out_channels * (heads if concat else 1)
        if residual:
            d = in_channels if isinstance(in_channels, int) else in_channels[1]
            self.res = _glorot_linear(d, total)
        else:
            self.register_parameter("res", None)
        self.bias = nn.Parameter(torch.zeros(total)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the weights afresh as PyG's GATConv: glorot projections and attention
        vectors, zero bias (a lazy projection once it is sized)."""
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):
            _init_linear(lin, glorot=True)
        _reglorot(self.att_src, self.att_dst, self.att_edge)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, heads={self.heads}, "
                f"concat={self.concat}, edge_dim={self.edge_dim}")

    def scores(self, with_edges: bool):
        """GAT's scores as a sum of terms sharing this layer's parameters: GATScores(μ = att_src,
        ν = att_dst) (+ EdgeTerm(w = att_edge · W_edge) ``with_edges``)."""
        H, C = self.heads, self.out_channels
        mech = GATScores(H, C, mu=self.att_src, nu=self.att_dst)
        if with_edges and self.lin_edge is not None:
            # (att_edge · lin_edge(e))_k = e · w_k: one (E, D) x (D, K) product, not (E, K*C)
            w = torch.einsum("hcd,hc->hd", self.lin_edge.weight.view(H, C, self.edge_dim),
                             self.att_edge.view(H, C))
            mech = mech + EdgeTerm(H, self.edge_dim, weight=w)
        return mech

    def mechanism(self, edge_index: Tensor, with_edges: bool = False) -> Softmax:
        """GAT's whole mechanism on a graph (the paper's view), sharing this layer's weights."""
        return gat_mechanism(self.scores(with_edges), edge_index, self.negative_slope)

    def _project(self, x_src: Tensor, x_dst: Tensor | None):
        H, C = self.heads, self.out_channels
        if self.lin is not None:
            h_src = self.lin(x_src).view(-1, H, C)
            h_dst = h_src if x_dst is x_src else (None if x_dst is None else
                                                  self.lin(x_dst).view(-1, H, C))
        else:
            h_src = self.lin_src(x_src).view(-1, H, C)
            h_dst = None if x_dst is None else self.lin_dst(x_dst).view(-1, H, C)
        return h_src, h_dst

    def _size(self, x_src: Tensor, x_dst: Tensor | None) -> None:
        """Size lazy projections on the first call; check the feature widths."""
        if self.lin is not None:
            _size_linear(self.lin, x_src, True, "GATConv", "x_src")
            _size_linear(self.lin, x_dst, True, "GATConv", "x_dst")
        else:
            _size_linear(self.lin_src, x_src, True, "GATConv", "x_src")
            _size_linear(self.lin_dst, x_dst, True, "GATConv", "x_dst")
        _size_linear(self.res, x_dst, True, "GATConv", "x_dst")

    def forward(self, x, edge_index: Tensor, edge_attr: Tensor | None = None, size=None,
                return_attention_weights: bool | None = None):
        x_src, x_dst = _pair(x, "GATConv")
        self._size(x_src, x_dst)
        edge_index, edge_attr, given, adj = self._edge_input(edge_index, edge_attr)
        size = given if size is None and given is not None else size
        res = self.res(x_dst) if (self.res is not None and x_dst is not None) else None
        h_src, h_dst = self._project(x_src, x_dst)
        M, N = _out_size(x_src, h_dst, size)
        if x_src.device.type == "meta":
            return x_src.new_empty(N, self.out_channels * (self.heads if self.concat else 1))
        if M == 0 or N == 0:
            return self._finish(self._merge(_empty_heads(h_src, N)), res)
        loops = None
        if self.add_self_loops:
            loops = min(M, N) if size is None else min(size)
        ei, ea, st = self._graph(edge_index, edge_attr, M, N, loops)
        h_dst = N if h_dst is None else h_dst
        mask = self._explain_mask()
        if mask is None:
            out, basis = gat_conv(h_src, h_dst, ei, self.scores(ea is not None), edge_attr=ea,
                                  negative_slope=self.negative_slope, dropout=self._p(),
                                  structure=st)
        else:
            basis = self._basis(self.mechanism(ei, ea is not None), h_src, h_dst, st, ea)
            keep = None if loops is None else edge_index[0] != edge_index[1]
            out = self._explained(ei, basis.alpha[0], h_src[ei[0].long()], N,
                                  edge_index.shape[1], keep, mask)
        out = self._finish(self._merge(out), res)
        if return_attention_weights:
            return _with_weights(out, adj, ei, basis.alpha[0], M, N)
        return out

    def _finish(self, out: Tensor, res: Tensor | None) -> Tensor:
        if res is not None:
            out = out + res
        return out if self.bias is None else out + self.bias


# ------------------------------------------------------------------------------------------------
class GATv2Conv(_EdgeAttention):
    """PyG's GATv2Conv: score_k(m, n) = a_k · LeakyReLU(W_s x_m + W_t x_n (+ W_e e_mn)), the
    ``GATv2Scores`` mechanism, softmaxed over each node's incoming edges (O(E)).

    Same constructor (``share_weights``: W_t = W_s; ``residual``), parameter names (lin_l =
    sources, lin_r = targets, both with bias; att; lin_edge) and call ``(x, edge_index,
    edge_attr=None, return_attention_weights=None)``; x is (N, F) or a pair (x_src, x_dst).
    """

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: int | None = None,
                 fill_value="mean", bias: bool = True, share_weights: bool = False,
                 residual: bool = False):
        super().__init__()
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope = concat, float(negative_slope)
        self.dropout, self.add_self_loops = float(dropout), add_self_loops
        self.edge_dim, self.fill_value = edge_dim, _fill(fill_value, "GATv2Conv")
        self.residual, self.share_weights = residual, share_weights
        HC = heads * out_channels
        ins = (in_channels, in_channels) if isinstance(in_channels, int) else in_channels
        self.lin_l = _glorot_linear(ins[0], HC, bias)
        self.lin_r = self.lin_l if share_weights else _glorot_linear(ins[1], HC, bias)
        self.att = _glorot(1, heads, out_channels)
        self.lin_edge = None if edge_dim is None else _edge_linear(_glorot_linear(edge_dim, HC))
        total = out_channels * (heads if concat else 1)
        if residual:
            self.res = _glorot_linear(ins[1], total)
        else:
            self.register_parameter("res", None)
        self.bias = nn.Parameter(torch.zeros(total)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the weights afresh as PyG's GATv2Conv: glorot projections (zero biases) and
        attention vector, zero bias (a lazy projection once it is sized)."""
        for lin in (self.lin_l, self.lin_r, self.lin_edge, self.res):
            _init_linear(lin, glorot=True)
        _reglorot(self.att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, heads={self.heads}, "
                f"concat={self.concat}, edge_dim={self.edge_dim}, "
                f"share_weights={self.share_weights}")

    def scores(self) -> GATv2Scores:
        """GATv2's scores sharing this layer's parameters (att, lin_edge)."""
        return GATv2Scores(self.heads, self.out_channels, edge_dim=self.edge_dim,
                           negative_slope=self.negative_slope, att=self.att,
                           edge_weight=None if self.lin_edge is None else self.lin_edge.weight)

    def mechanism(self, edge_index: Tensor) -> Softmax:
        """GATv2's whole mechanism on a graph, sharing this layer's weights."""
        return graph_softmax(self.scores(), edge_index)

    def forward(self, x, edge_index: Tensor, edge_attr: Tensor | None = None,
                return_attention_weights: bool | None = None):
        H, C = self.heads, self.out_channels
        x_src, x_dst = _pair(x, "GATv2Conv")
        if x_dst is None:
            raise ValueError("GATv2Conv needs target features: x_dst of the pair is None")
        for lin, t, what in ((self.lin_l, x_src, "x_src"), (self.lin_r, x_dst, "x_dst"),
                             (self.res, x_dst, "x_dst")):
            _size_linear(lin, t, True, "GATv2Conv", what)
        edge_index, edge_attr, _, adj = self._edge_input(edge_index, edge_attr)
        res = self.res(x_dst) if self.res is not None else None
        if x_dst is x_src:  # one input: both projections in one GEMM
            lins = [self.lin_l] + ([] if self.share_weights else [self.lin_r])
            hs = _packed(x_src, lins)
            x_l = hs[0].view(-1, H, C)
            x_r = x_l if self.share_weights else hs[1].view(-1, H, C)
        else:
            x_l = self.lin_l(x_src).view(-1, H, C)
            x_r = self.lin_r(x_dst).view(-1, H, C)
        M, N = x_l.shape[0], x_r.shape[0]
        if x_src.device.type == "meta":
            return x_src.new_empty(N, C * (H if self.concat else 1))
        if M == 0 or N == 0:
            return self._finish(self._merge(_empty_heads(x_l, N)), res)
        loops = min(M, N) if self.add_self_loops else None
        ei, ea, st = self._graph(edge_index, edge_attr, M, N, loops)
        mask = self._explain_mask()
        if mask is None:
            out, basis = gatv2_conv(x_l, x_r, ei, self.scores(), edge_attr=ea,
                                    dropout=self._p(), structure=st)
        else:
            basis = self._basis(self.mechanism(ei), x_l, x_r, st, ea)
            keep = None if loops is None else edge_index[0] != edge_index[1]
            out = self._explained(ei, basis.alpha[0], x_l[ei[0].long()], N,
                                  edge_index.shape[1], keep, mask)
        out = self._finish(self._merge(out), res)
        if return_attention_weights:
            return _with_weights(out, adj, ei, basis.alpha[0], M, N)
        return out

    def _finish(self, out: Tensor, res: Tensor | None) -> Tensor:
        if res is not None:
            out = out + res
        return out if self.bias is None else out + self.bias


# ------------------------------------------------------------------------------------------------
class TransformerConv(_EdgeAttention):
    """PyG's TransformerConv (Shi et al. 2021): the attention convolution with mechanism
    ``HeadDot`` (q_n · k_m / √C) + ``EdgeDot`` (q_n · W_e e_mn / √C), messages v_m + W_e e_mn.

    Same constructor (``beta``: the skip gated by sigmoid(w·[out, skip, out − skip]), active
    only with ``root_weight``), parameter names (lin_key, lin_query, lin_value, lin_edge,
    lin_skip, lin_beta) and call ``(x, edge_index, edge_attr=None,
    return_attention_weights=None)``: weights are returned when it is a bool, True or False
    (as PyG), before dropout. No self loops are added. ``edge_dim`` requires ``edge_attr``.
    """

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, heads: int = 1,
                 concat: bool = True, beta: bool = False, dropout: float = 0.0,
                 edge_dim: int | None = None, bias: bool = True, root_weight: bool = True):
        super().__init__()
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.beta, self.root_weight = bool(beta and root_weight), root_weight
        self.concat, self.dropout, self.edge_dim = concat, float(dropout), edge_dim
        ins = (in_channels, in_channels) if isinstance(in_channels, int) else in_channels
        HC = heads * out_channels
        self.lin_key = _linear(ins[0], HC, bias, glorot=False)
        self.lin_query = _linear(ins[1], HC, bias, glorot=False)
        self.lin_value = _linear(ins[0], HC, bias, glorot=False)
        self.lin_edge = None if edge_dim is None else \
            _edge_linear(nn.Linear(edge_dim, HC, bias=False))
        total = HC if concat else out_channels
        self.lin_skip = _linear(ins[1], total, bias, glorot=False)
        self.lin_beta = nn.Linear(3 * total, 1, bias=False) if self.beta else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the weights afresh as PyG's TransformerConv: every projection with its
        default init (a lazy projection once it is sized)."""
        for lin in (self.lin_key, self.lin_query, self.lin_value, self.lin_edge, self.lin_skip,
                    self.lin_beta):
            _init_linear(lin, glorot=False)

    #: PyG's TransformerConv keeps the last attention weights here between two calls (None
    #: after each); this layer returns them directly and never keeps them
    _alpha = None

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, heads={self.heads}, "
                f"concat={self.concat}, beta={self.beta}, edge_dim={self.edge_dim}, "
                f"root_weight={self.root_weight}")

    def scores(self):
        """TransformerConv's scores: HeadDot(k, q) (+ EdgeDot on the edge keys ê = lin_edge(e),
        which the layer projects once and also sends as messages)."""
        return transformer_scores(self.heads, self.out_channels, self.lin_edge is not None)

    def mechanism(self, edge_index: Tensor) -> Softmax:
        """The whole mechanism on a graph: inputs keys k (M, K, C), queries q (N, K, C) and,
        with edge_dim, the edge keys ê (E, K, C) as edge features."""
        return graph_softmax(self.scores(), edge_index)

    def _skip(self, out: Tensor, x_r: Tensor) -> Tensor:
        """The root term x_r = lin_skip(x_dst) added to ``out``, or gated by beta."""
        return gated_root(out, x_r, self.lin_beta)

    def forward(self, x, edge_index: Tensor, edge_attr: Tensor | None = None,
                return_attention_weights: bool | None = None):
        H, C = self.heads, self.out_channels
        x_src, x_dst = _pair(x, "TransformerConv")
        if x_dst is None:
            raise ValueError("TransformerConv needs target features: x_dst of the pair is None")
        for lin, t, what in ((self.lin_key, x_src, "x_src"), (self.lin_value, x_src, "x_src"),
                             (self.lin_query, x_dst, "x_dst"), (self.lin_skip, x_dst, "x_dst")):
            _size_linear(lin, t, False, "TransformerConv", what)
        given = edge_index
        edge_index, edge_attr, _, adj = self._edge_input(edge_index, edge_attr)
        if self.edge_dim is not None and edge_attr is None:
            raise ValueError(f"TransformerConv(edge_dim={self.edge_dim}) needs edge_attr "
                             f"(E, {self.edge_dim})")
        skip = [self.lin_skip] if self.root_weight else []
        if x_dst is x_src:  # self-attention: the four projections in one GEMM
            q, k, v, *x_r = _packed(x_src, [self.lin_query, self.lin_key, self.lin_value, *skip])
        else:
            k, v = _packed(x_src, [self.lin_key, self.lin_value])
            q, *x_r = _packed(x_dst, [self.lin_query, *skip])
        q, k, v = q.view(-1, H, C), k.view(-1, H, C), v.view(-1, H, C)
        M, N = k.shape[0], q.shape[0]
        if x_src.device.type == "meta":
            return x_src.new_empty(N, C * (H if self.concat else 1))
        if M == 0 or N == 0:
            out = self._merge(_empty_heads(v, N))
            return self._skip(out, x_r[0]) if self.root_weight else out
        ei, ea, st = self._graph(edge_index, edge_attr, M, N, None)
        # the edge keys ê = W_e e, projected once: in the scores q·(k + ê) and in the messages
        ek = None if ea is None else self.lin_edge(ea).view(-1, H, C)
        mask = self._explain_mask()
        if mask is None:
            out, basis = transformer_conv(q, k, v, ei, edge_keys=ek, dropout=self._p(),
                                          structure=st)
        else:
            basis = self._basis(self.mechanism(ei), k, q, st, ek)
            msg = v[ei[0].long()] if ek is None else v[ei[0].long()] + ek
            out = self._explained(ei, basis.alpha[0], msg, N, ei.shape[1], None, mask)
        out = self._merge(out)
        if self.root_weight:
            out = self._skip(out, x_r[0])
        if isinstance(return_attention_weights, bool):
            p = basis.probabilities[0]
            if adj is not None and not isinstance(adj, Tensor):
                return out, adj.set_value(p, layout="coo")
            return out, (given if adj is not None else edge_index, p)
        return out


# ------------------------------------------------------------------------------------------------
def _check_pyg(m, who: str) -> None:
    """Refuse by name the MessagePassing options the layers do not reproduce."""
    flow, aggr = getattr(m, "flow", "source_to_target"), getattr(m, "aggr", "add")
    if flow != "source_to_target":
        raise ValueError(f"from_pyg({who}): flow={flow!r} is not supported (only "
                         "'source_to_target')")
    if aggr not in ("add", "sum"):
        raise ValueError(f"from_pyg({who}): aggr={aggr!r} is not supported (attention weights "
                         "are summed: only 'add')")
    for p in m.parameters():
        if isinstance(p, nn.parameter.UninitializedParameter):
            raise ValueError(f"from_pyg({who}) has lazy (uninitialised) weights: run it once "
                             "or give in_channels before converting")


def _in_dims(lin_a: nn.Module, lin_b: nn.Module | None = None):
    """in_channels read from the weights (a lazy in_channels=-1 stays -1 in PyG's attribute)."""
    a = lin_a.weight.shape[1]
    return a if lin_b is None else (a, lin_b.weight.shape[1])


def _finish(out: nn.Module, m: nn.Module) -> nn.Module:
    p = next(m.parameters())
    out = out.to(device=p.device, dtype=p.dtype)
    out.load_state_dict(m.state_dict())
    return out.train(m.training)


@register_pyg("GATConv")
def _from_pyg_gat(m) -> GATConv:
    _check_pyg(m, "GATConv")
    ins = _in_dims(m.lin) if m.lin is not None else _in_dims(m.lin_src, m.lin_dst)
    fill = m.fill_value.detach().clone() if isinstance(m.fill_value, Tensor) else m.fill_value
    out = GATConv(ins, m.out_channels, m.heads, m.concat, m.negative_slope, m.dropout,
                  m.add_self_loops, m.edge_dim, fill, m.bias is not None,
                  getattr(m, "res", None) is not None)
    return _finish(out, m)


@register_pyg("GATv2Conv")
def _from_pyg_gatv2(m) -> GATv2Conv:
    _check_pyg(m, "GATv2Conv")
    ins = _in_dims(m.lin_l, m.lin_r)
    if isinstance(m.in_channels, int) and ins[0] == ins[1]:
        ins = ins[0]
    fill = m.fill_value.detach().clone() if isinstance(m.fill_value, Tensor) else m.fill_value
    out = GATv2Conv(ins, m.out_channels, m.heads, m.concat, m.negative_slope, m.dropout,
                    m.add_self_loops, m.edge_dim, fill, m.lin_l.bias is not None,
                    m.share_weights, getattr(m, "res", None) is not None)
    return _finish(out, m)


@register_pyg("TransformerConv")
def _from_pyg_transformer(m) -> TransformerConv:
    _check_pyg(m, "TransformerConv")
    ins = _in_dims(m.lin_key, m.lin_query)
    if isinstance(m.in_channels, int) and ins[0] == ins[1]:
        ins = ins[0]
    out = TransformerConv(ins, m.out_channels, m.heads, m.concat, m.beta, m.dropout,
                          m.edge_dim, m.lin_key.bias is not None, m.root_weight)
    return _finish(out, m)

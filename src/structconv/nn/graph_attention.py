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
from ..attention.mechanisms import GATScores, GraphMasked, HeadDot, LeakyReLU, Softmax
from .convert import register_pyg

__all__ = ["GATConv", "GATv2Conv", "TransformerConv"]


def _glorot_linear(i: int, o: int, bias: bool = False) -> nn.Linear:
    lin = nn.Linear(i, o, bias=bias)
    nn.init.xavier_uniform_(lin.weight)
    if bias:
        nn.init.zeros_(lin.bias)
    return lin


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
    """(x_src, x_dst) of ``x`` (N, F) or a pair; x_src must be (M, F)."""
    x_src, x_dst = (x, x) if isinstance(x, Tensor) else tuple(x)
    if not isinstance(x_src, Tensor) or x_src.dim() != 2:
        got = tuple(x_src.shape) if isinstance(x_src, Tensor) else type(x_src).__name__
        raise ValueError(f"{who} expects node features (N, F) or a pair (x_src, x_dst), got "
                         f"x_src {got}")
    return x_src, x_dst


class _EdgeAttention(nn.Module):
    """What the three layers share: the graph (self loops, cached sparse structure), the edge
    features (with the loops'), the basis and the output (concat / mean)."""

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
                edge_index.shape[0] != 2 or edge_index.is_floating_point():
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

    def _basis(self, mech: Softmax, x1, x2, st, edge_attr) -> GraphAttention:
        """The layer's attention basis on its graph (dropout in training only)."""
        p = self.dropout if self.training else 0.0
        return attention_basis(mech, x1, x2, edge_attr=edge_attr, dropout=p, structure=st)

    def _merge(self, out: Tensor) -> Tensor:
        """(N, K, C) -> (N, K·C) concatenated, or the mean over heads (N, C)."""
        return out.reshape(out.shape[0], -1) if self.concat else out.mean(1)


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
        return Softmax(LeakyReLU(GraphMasked(self.scores(with_edges), edge_index),
                                 self.negative_slope))

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

    def forward(self, x, edge_index: Tensor, edge_attr: Tensor | None = None, size=None,
                return_attention_weights: bool | None = None):
        x_src, x_dst = _pair(x, "GATConv")
        res = self.res(x_dst) if (self.res is not None and x_dst is not None) else None
        h_src, h_dst = self._project(x_src, x_dst)
        M, N = _out_size(x_src, h_dst, size)
        loops = None
        if self.add_self_loops:
            loops = min(M, N) if size is None else min(size)
        ei, ea, st = self._graph(edge_index, edge_attr, M, N, loops)
        mech = self.mechanism(ei, with_edges=ea is not None)
        basis = self._basis(mech, h_src, N if h_dst is None else h_dst, st, ea)
        out = self._merge(basis.propagate_heads(h_src.unsqueeze(0))[0])
        if res is not None:
            out = out + res
        if self.bias is not None:
            out = out + self.bias
        if return_attention_weights:
            return out, (ei, basis.alpha[0])
        return out


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
        return Softmax(GraphMasked(self.scores(), edge_index))

    def forward(self, x, edge_index: Tensor, edge_attr: Tensor | None = None,
                return_attention_weights: bool | None = None):
        H, C = self.heads, self.out_channels
        x_src, x_dst = _pair(x, "GATv2Conv")
        if x_dst is None:
            raise ValueError("GATv2Conv needs target features: x_dst of the pair is None")
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
        loops = min(M, N) if self.add_self_loops else None
        ei, ea, st = self._graph(edge_index, edge_attr, M, N, loops)
        basis = self._basis(self.mechanism(ei), x_l, x_r, st, ea)
        out = self._merge(basis.propagate_heads(x_l.unsqueeze(0))[0])
        if res is not None:
            out = out + res
        if self.bias is not None:
            out = out + self.bias
        if return_attention_weights:
            return out, (ei, basis.alpha[0])
        return out


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
        self.lin_key = nn.Linear(ins[0], HC, bias=bias)
        self.lin_query = nn.Linear(ins[1], HC, bias=bias)
        self.lin_value = nn.Linear(ins[0], HC, bias=bias)
        self.lin_edge = None if edge_dim is None else \
            _edge_linear(nn.Linear(edge_dim, HC, bias=False))
        total = HC if concat else out_channels
        self.lin_skip = nn.Linear(ins[1], total, bias=bias)
        self.lin_beta = nn.Linear(3 * total, 1, bias=False) if self.beta else None

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, heads={self.heads}, "
                f"concat={self.concat}, beta={self.beta}, edge_dim={self.edge_dim}, "
                f"root_weight={self.root_weight}")

    def scores(self):
        """TransformerConv's scores: HeadDot(k, q) (+ EdgeDot on the edge keys ê = lin_edge(e),
        which the layer projects once and also sends as messages)."""
        H, C = self.heads, self.out_channels
        mech = HeadDot(H, C)
        return mech if self.lin_edge is None else mech + EdgeDot(H, C)

    def mechanism(self, edge_index: Tensor) -> Softmax:
        """The whole mechanism on a graph: inputs keys k (M, K, C), queries q (N, K, C) and,
        with edge_dim, the edge keys ê (E, K, C) as edge features."""
        return Softmax(GraphMasked(self.scores(), edge_index))

    def _skip(self, out: Tensor, x_r: Tensor) -> Tensor:
        """The root term x_r = lin_skip(x_dst) added to ``out``, or gated by beta."""
        if self.lin_beta is None:
            return out + x_r
        b = torch.sigmoid(self.lin_beta(torch.cat([out, x_r, out - x_r], -1)))
        return b * x_r + (1 - b) * out

    def forward(self, x, edge_index: Tensor, edge_attr: Tensor | None = None,
                return_attention_weights: bool | None = None):
        H, C = self.heads, self.out_channels
        x_src, x_dst = _pair(x, "TransformerConv")
        if x_dst is None:
            raise ValueError("TransformerConv needs target features: x_dst of the pair is None")
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
        ei, ea, st = self._graph(edge_index, edge_attr, k.shape[0], q.shape[0], None)
        # the edge keys ê = W_e e, projected once: in the scores q·(k + ê) and in the messages
        ek = None if ea is None else self.lin_edge(ea).view(-1, H, C)
        basis = self._basis(self.mechanism(ei), k, q, st, ek)
        if ek is None:
            out = basis.propagate_heads(v.unsqueeze(0))[0]
        else:
            # edge-valued messages Σ_e alpha[e, k] · (v[m, k] + ê[e, k]), in one pass
            out = basis.propagate_edges(ek, nodes=v)[0]
        out = self._merge(out)
        if self.root_weight:
            out = self._skip(out, x_r[0])
        if isinstance(return_attention_weights, bool):
            return out, (edge_index, basis.probabilities[0])
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

"""GraphSAGE (Hamilton et al., 2017) with PyG's signature: ``sc.nn.SAGEConv``.

y_n = W_l · agg_{m -> n} x_m + W_r · x_n + b. The mean and sum aggregations are a convolution
with a rectangular basis (1, M_src, N_dst) (the planner projects before propagating when the
output is narrower than the input, as the other graph layers); ``max`` is a reduction over each
target's incoming edges (not linear, so no basis); any other ``aggr`` (min, std, softmax,
lstm, a list of them combined by ``aggr_kwargs``' mode, ...: ``sc.nn.aggregation``) reads the
gathered messages. ``x`` is (N, F) or a bipartite pair
``(x_src, x_dst)`` (``x_dst`` None: no root term, as PyG).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..basis import graph as G
from ..basis.cache import cached
from ..basis.edges import as_edge_index, check_edges, relation_values
from ..engine import convolve
from ..params import Full
from .aggregation import MultiReadout, Readout, make_readout, readout_of_pyg
from .convert import register_pyg
from .pyg import PyGCompatible, check_mask, lazy_parameter

__all__ = ["SAGEConv", "sage_aggregate", "sage_basis"]

_AGGRS = ("mean", "sum", "add", "max")  # the basis (mean, sum) and the scatter (max) paths


def _pair_channels(in_channels) -> tuple[int, int]:
    """(P_src, P_dst) of ``in_channels`` (an int or a pair; -1: sized on the first call)."""
    pair = tuple(in_channels) if isinstance(in_channels, (tuple, list)) else (in_channels,) * 2
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or
                             not (v >= 1 or v == -1) for v in pair):
        raise ValueError(f"SAGEConv: in_channels must be a positive int, -1 (lazy) or a pair "
                         f"of them, got {in_channels!r}")
    return pair


def _uniform_(t: Tensor, fan_in: int) -> Tensor:
    # torch.nn.Linear's (and PyG Linear's) default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    b = 1.0 / math.sqrt(fan_in)
    with torch.no_grad():
        return t.uniform_(-b, b)


def sage_basis(edge_index: Tensor, M: int, N: int, aggr: str = "mean", dtype=None,
               cache: bool = True) -> G.PowerBasis:
    """The rectangular (1, M, N) basis of a mean (1/in-degree) or sum aggregation from M
    sources to N targets (PyG's ``[source; target]`` edges), cached per graph."""
    norm = "mean" if aggr == "mean" else None

    def build():
        check_edges(edge_index, M, N)
        src, dst = edge_index[0].long(), edge_index[1].long()
        w = torch.ones(src.shape[0], dtype=dtype or torch.get_default_dtype(),
                       device=src.device)
        op = G.SparseOperator(src, dst, relation_values(src, dst, w, M, N, norm), M, N)
        return G.PowerBasis(op, (1,))

    return cached(cache, (edge_index,), ("sage", M, N, norm, dtype), build)


def sage_aggregate(x_src: Tensor, edge_index: Tensor, N: int, aggr: str,
                   edge_mask: Tensor | None = None) -> Tensor:
    """agg_{m -> n} x_src[m] (N, P) for ``aggr`` "mean", "sum" or "max" (a target without
    incoming edges gets zeros, as PyG's scatter); ``edge_mask`` (E,) scales each message
    before the aggregation (PyG's ``explain_message``)."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    msg = x_src.index_select(0, src)
    if edge_mask is not None:
        msg = msg * edge_mask.to(msg.dtype).unsqueeze(1)
    idx = dst.unsqueeze(1).expand_as(msg)
    out = x_src.new_zeros(N, x_src.shape[1])
    if aggr == "max":
        return out.scatter_reduce(0, idx, msg, "amax", include_self=False)
    out = out.scatter_add(0, idx, msg)
    if aggr == "mean":
        cnt = x_src.new_zeros(N).index_add(0, dst, x_src.new_ones(dst.shape[0]))
        out = out / cnt.clamp_min(1).unsqueeze(1)
    return out


class SAGEConv(PyGCompatible):
    """PyG's SAGEConv: y = W_l agg(x_src) + W_r x_dst + b, x (N, P) or (x_src, x_dst) -> (N, Q).

    ``aggr`` is a name as PyG's ("mean", "sum"/"add", "max", "min", "mul", "var", "std",
    "softmax", "powermean", "lstm"), a list of names (combined as ``aggr_kwargs``' ``mode``
    says: cat, proj, attn, sum, ...) or an aggregation module called on the gathered messages
    as ``module(msg, index, dim_size=N)`` (e.g. one of PyG's); ``aggr_kwargs`` are its options.
    ``project`` first maps the sources by relu(x_src W_p + b_p); ``normalize`` L2-normalises
    the output rows. ``in_channels=-1`` (or -1 in a pair) sizes the weights on the first call.
    """

    def __init__(self, in_channels, out_channels: int, aggr="mean",
                 normalize: bool = False, root_weight: bool = True, project: bool = False,
                 bias: bool = True, *, aggr_kwargs: dict | None = None, cached: bool = True,
                 route: str = "auto"):
        super().__init__()
        P_src, P_dst = _pair_channels(in_channels)
        if isinstance(out_channels, bool) or not isinstance(out_channels, int) or \
                out_channels < 1:
            raise ValueError(f"SAGEConv: out_channels must be a positive int, got "
                             f"{out_channels!r}")
        if project and P_src == -1:
            raise ValueError("SAGEConv does not support lazy initialization (in_channels=-1) "
                             "with project=True")
        self.in_channels, self.out_channels = in_channels, out_channels
        self._init_aggregation(aggr, aggr_kwargs, P_src)
        self.normalize, self.root_weight, self.project = bool(normalize), bool(root_weight), \
            bool(project)
        self.cached, self.route = bool(cached), route
        #: input widths the weights are sized for (None until a lazy side's first call);
        #: plain attributes, read on every call
        self._P_src = None if P_src == -1 else P_src
        self._P_dst = None if P_dst == -1 else P_dst
        if self.project:
            self.lin = nn.Linear(P_src, P_src, bias=True)
        #: width of the aggregated features (W_l's fan-in; None until a lazy first call)
        self._W = None if P_src == -1 else self._width(P_src)
        self.param = Full(1, self._W or 1, out_channels)  # W_l as theta (1, W, Q)
        if P_src == -1:
            self.param.weight = lazy_parameter()
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        if root_weight:
            self.root = lazy_parameter() if P_dst == -1 else \
                nn.Parameter(torch.empty(P_dst, out_channels))
        else:
            self.root = None
        self.reset_parameters()

    def _init_aggregation(self, aggr, aggr_kwargs, P_src: int) -> None:
        """``aggr`` as the basis / scatter paths (mean, sum, max) or an aggregation module
        (``self.aggr_module``, PyG's name, so that PyG's checkpoints load)."""
        if aggr_kwargs is not None and not isinstance(aggr_kwargs, dict):
            raise TypeError(f"SAGEConv: aggr_kwargs must be a dict or None, got "
                            f"{type(aggr_kwargs).__name__}")
        #: mean / sum / max without options: the basis (or the max scatter), no module
        self._fast = isinstance(aggr, str) and aggr in _AGGRS and not aggr_kwargs
        if self._fast:
            self.aggr = "sum" if aggr == "add" else aggr
            return
        if not isinstance(aggr, (str, list, tuple, nn.Module)):
            raise TypeError(f"SAGEConv: aggr must be a name, a list of names or an aggregation "
                            f"module, got {type(aggr).__name__}")
        self.aggr_module = make_readout(aggr, aggr_kwargs, P_src, "SAGEConv")
        self.aggr = list(aggr) if isinstance(aggr, (list, tuple)) else \
            (aggr if isinstance(aggr, str) else type(aggr).__name__)

    def _width(self, P: int) -> int:
        """Width of the aggregated features for sources of width P (W_l's fan-in)."""
        if self._fast:
            return P
        m = self.aggr_module
        if isinstance(m, (Readout, MultiReadout)):
            return m.width(P)
        get = getattr(m, "get_out_channels", None)  # a PyG MultiAggregation
        return get(P) if callable(get) else P

    def _source_width(self, W: int) -> int:
        """The source width P whose aggregation is W wide (a checkpoint sizing a lazy layer)."""
        m = None if self._fast else self.aggr_module
        if isinstance(m, Readout) and m.kind == "lstm":
            return m.in_channels
        if isinstance(m, MultiReadout):
            if m.in_channels is not None:
                return m.in_channels[0]
            return W // len(m.aggrs) if m.mode == "cat" else W
        return W

    def reset_parameters(self) -> None:
        """PyG's initialisation: torch.nn.Linear's uniform bounds for every weight and bias
        (a lazy weight once it is sized)."""
        if self.project:
            self.lin.reset_parameters()
        if not self._fast and hasattr(self.aggr_module, "reset_parameters"):
            self.aggr_module.reset_parameters()
        if self._W is not None:
            _uniform_(self.param.weight, self._W)
            if self.bias is not None:
                _uniform_(self.bias, self._W)
        if self.root is not None and self._P_dst is not None:
            _uniform_(self.root, self._P_dst)

    def _materialize(self, x_src: Tensor, x_dst: Tensor | None) -> None:
        """Size the lazy weights for the widths of the first call, drawn as at construction."""
        if self._P_src is None:
            self._P_src = x_src.shape[1]
            W = self._W = self._width(self._P_src)
            self.param.weight.materialize((1, W, self.out_channels))
            self.param.P = W
            _uniform_(self.param.weight, W)
            if self.bias is not None:
                _uniform_(self.bias, W)
        if self._P_dst is None and x_dst is not None and self.root is not None:
            self._P_dst = x_dst.shape[1]
            self.root.materialize((self._P_dst, self.out_channels))
            _uniform_(self.root, self._P_dst)

    # PyG's names: lin_l (W_l^T (Q, P_src), b), lin_r (W_r^T (Q, P_dst)), lin (the projection)
    def _pyg_keys(self) -> dict[str, str]:
        keys = {"lin_l.weight": "param.weight"}
        if self.bias is not None:
            keys["lin_l.bias"] = "bias"
        if self.root is not None:
            keys["lin_r.weight"] = "root"
        return keys

    def _from_pyg_tensor(self, ours: str, t: Tensor) -> Tensor:
        if ours == "param.weight":
            return t.t().unsqueeze(0)
        return t.t() if ours == "root" else t

    def _to_pyg_tensors(self, sd: dict, prefix: str) -> None:
        for pyg, ours in self._pyg_keys().items():
            t = sd.pop(prefix + ours)
            t = t[0].t() if ours == "param.weight" else (t.t() if ours == "root" else t)
            sd[prefix + pyg] = t.contiguous()

    def _sized_from(self, name: str, t: Tensor) -> None:
        if name == "param.weight":
            self.param.P = self._W = t.shape[1]
            self._P_src = self._source_width(self._W)
        elif name == "root":
            self._P_dst = t.shape[0]

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, aggr={self.aggr}"

    def _inputs(self, x):
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else tuple(x)
        if self._P_src is None or (self._P_dst is None and x_dst is not None):
            self._check_features(x_src, x_dst, None, None)
            self._materialize(x_src, x_dst)
        self._check_features(x_src, x_dst, self._P_src, self._P_dst)
        return x_src, x_dst

    @staticmethod
    def _check_features(x_src, x_dst, P_src, P_dst) -> None:
        for t, what, P in ((x_src, "x_src", P_src), (x_dst, "x_dst", P_dst)):
            if t is None and what == "x_dst":
                continue
            if isinstance(t, Tensor) and t.dim() == 2 and not t.is_floating_point():
                raise TypeError(f"SAGEConv: {what} must be floating node features, got dtype "
                                f"{t.dtype}")
            if not isinstance(t, Tensor) or t.dim() != 2 or \
                    (P is not None and t.shape[1] != P):
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"SAGEConv: {what} must be floating (N, {P or 'F'}), got {got}")

    def _edges(self, edge_index, size):
        """(edge_index (2, E), size) of any graph input (``as_edge_index``): a sparse
        adjacency's shape is the size (its values are not used, as PyG's SAGEConv)."""
        if type(edge_index) is Tensor and edge_index.layout == torch.strided:  # common path
            if edge_index.dtype == torch.bool or edge_index.is_floating_point():
                raise TypeError(f"SAGEConv: edge_index must be an integer (2, E) tensor, got "
                                f"dtype {edge_index.dtype}")
            return edge_index, size
        e = as_edge_index(edge_index, "SAGEConv: edge_index")
        return e.index, size if size is not None or e.size is None else e.size

    def forward(self, x, edge_index: Tensor, size=None) -> Tensor:
        """x (N, P) or (x_src (M, P_src), x_dst (N, P_dst)) -> (N, Q); ``edge_index`` a (2, E)
        tensor, an ``EdgeIndex`` or a sparse ``adj_t`` (N, M)."""
        x_src, x_dst = self._inputs(x)
        edge_index, size = self._edges(edge_index, size)
        M = x_src.shape[0] if size is None or size[0] is None else int(size[0])
        N = x_dst.shape[0] if x_dst is not None else M
        if size is not None and size[1] is not None:
            N = int(size[1])
        if x_dst is not None and x_dst.shape[0] != N:
            raise ValueError(f"SAGEConv: x_dst has {x_dst.shape[0]} rows but the graph has {N} "
                             f"targets")
        if self.project:
            x_src = F.relu(self.lin(x_src))
        out = self._propagate(x_src, edge_index, M, N)
        if self.root is not None and x_dst is not None:
            out = out + x_dst @ self.root.to(x_dst.dtype)
        return F.normalize(out, p=2.0, dim=-1) if self.normalize else out

    def _propagate(self, x_src: Tensor, edge_index: Tensor, M: int, N: int) -> Tensor:
        """W_l agg(x_src) + b: (M, P) sources -> (N, Q) targets."""
        bias = None if self.bias is None else self.bias.to(x_src.dtype)
        mask = self._explain_mask() if self.__dict__.get("_explain") else None
        if not self._fast:
            return self._read_messages(x_src, edge_index, M, N, mask, bias)
        if self.aggr == "max" or M == 0 or N == 0 or mask is not None:
            check_edges(edge_index, max(M, 1), max(N, 1))
            if mask is not None:
                check_mask(mask, edge_index.shape[1], "SAGEConv")
            h = sage_aggregate(x_src, edge_index, N, self.aggr, mask)
            y = h @ self.param.weight[0].to(h.dtype)
            return y if bias is None else y + bias
        basis = sage_basis(edge_index, M, N, self.aggr, x_src.dtype, self.cached)
        return convolve(x_src, basis, self.param, route=self.route, bias=bias)

    def _read_messages(self, x_src, edge_index, M, N, mask, bias) -> Tensor:
        """W_l aggr_module(x_src[source], target) + b: the aggregations beyond the basis."""
        check_edges(edge_index, max(M, 1), max(N, 1))
        msg = x_src.index_select(0, edge_index[0].long())
        if mask is not None:
            check_mask(mask, edge_index.shape[1], "SAGEConv")
            msg = msg * mask.to(msg.dtype).unsqueeze(1)
        m, dst = self.aggr_module, edge_index[1].long()
        h = m(msg, dst, N) if isinstance(m, (Readout, MultiReadout)) else m(msg, dst, dim_size=N)
        y = h @ self.param.weight[0].to(h.dtype)
        return y if bias is None else y + bias


@register_pyg("SAGEConv")
def _from_sage(m):
    if getattr(m, "flow", "source_to_target") != "source_to_target":
        raise ValueError("SAGEConv with flow='target_to_source' has no structconv equivalent")
    p = m.lin_l.weight
    if isinstance(p, nn.parameter.UninitializedParameter):
        raise ValueError("SAGEConv has lazy (uninitialised) weights: run it once or give "
                         "in_channels before converting")
    aggr, kw = _aggregation_of(m)
    W = m.lin_l.weight.shape[1]
    P_src, P_dst = _pair_channels(m.in_channels)
    if P_src == -1:  # a lazy PyG layer, sized by its first call: its width from W_l's
        multi = type(m.aggr_module).__name__ == "MultiAggregation" and m.aggr_module.mode == "cat"
        P_src = W // len(m.aggr_module.aggrs) if multi else W
    if m.root_weight:
        P_dst = m.lin_r.weight.shape[1]
    out = SAGEConv((P_src, P_dst), m.out_channels, aggr=aggr, normalize=m.normalize,
                   root_weight=m.root_weight, project=m.project,
                   bias=m.lin_l.bias is not None, aggr_kwargs=kw)
    if m.in_channels == P_src and P_src == P_dst:
        out.in_channels = P_src  # as PyG's was given (an int), so that repr and copies agree
    out = out.to(device=p.device, dtype=p.dtype).train(m.training)
    with torch.no_grad():
        out.param.weight.copy_(m.lin_l.weight.detach().t().unsqueeze(0))
        if out.bias is not None:
            out.bias.copy_(m.lin_l.bias.detach())
        if out.root is not None:
            out.root.copy_(m.lin_r.weight.detach().t())
        if m.project:
            out.lin.weight.copy_(m.lin.weight.detach())
            out.lin.bias.copy_(m.lin.bias.detach())
    if not out._fast:  # PyG's names (construction reset a copied module: its state again)
        out.aggr_module.load_state_dict(m.aggr_module.state_dict())
    return out


def _aggregation_of(m) -> tuple:
    """(aggr, aggr_kwargs) of a PyG SAGEConv: its mean/sum/max, an aggregation built here
    with PyG's options, or (a copy of) PyG's own module, called on the gathered messages."""
    kind = type(m.aggr_module).__name__
    if isinstance(m.aggr, str) and m.aggr in _AGGRS and kind in (
            "MeanAggregation", "SumAggregation", "MaxAggregation"):
        return m.aggr, None
    spec = readout_of_pyg(m.aggr_module)
    if spec is None:
        return copy.deepcopy(m.aggr_module), None
    return spec

"""GraphSAGE (Hamilton et al., 2017) with PyG's signature: ``sc.nn.SAGEConv``.

y_n = W_l · agg_{m -> n} x_m + W_r · x_n + b. The mean and sum aggregations are a convolution
with a rectangular basis (1, M_src, N_dst) (the planner projects before propagating when the
output is narrower than the input, as the other graph layers); ``max`` is a reduction over each
target's incoming edges (not linear, so no basis). ``x`` is (N, F) or a bipartite pair
``(x_src, x_dst)`` (``x_dst`` None: no root term, as PyG).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..basis import graph as G
from ..basis.cache import cached
from ..basis.edges import check_edges, relation_values
from ..engine import convolve
from ..params import Full
from .convert import register_pyg

__all__ = ["SAGEConv", "sage_aggregate", "sage_basis"]

_AGGRS = ("mean", "sum", "add", "max")


def _pair_channels(in_channels) -> tuple[int, int]:
    pair = tuple(in_channels) if isinstance(in_channels, (tuple, list)) else (in_channels,) * 2
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                             for v in pair):
        raise ValueError(f"SAGEConv: in_channels must be a positive int or a pair of them, got "
                         f"{in_channels!r}")
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


def sage_aggregate(x_src: Tensor, edge_index: Tensor, N: int, aggr: str) -> Tensor:
    """agg_{m -> n} x_src[m] (N, P) for ``aggr`` "mean", "sum" or "max" (a target without
    incoming edges gets zeros, as PyG's scatter)."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    msg = x_src.index_select(0, src)
    idx = dst.unsqueeze(1).expand_as(msg)
    out = x_src.new_zeros(N, x_src.shape[1])
    if aggr == "max":
        return out.scatter_reduce(0, idx, msg, "amax", include_self=False)
    out = out.scatter_add(0, idx, msg)
    if aggr == "mean":
        cnt = x_src.new_zeros(N).index_add(0, dst, x_src.new_ones(dst.shape[0]))
        out = out / cnt.clamp_min(1).unsqueeze(1)
    return out


class SAGEConv(nn.Module):
    """PyG's SAGEConv: y = W_l agg(x_src) + W_r x_dst + b, x (N, P) or (x_src, x_dst) -> (N, Q).

    ``aggr`` is "mean", "sum"/"add" or "max"; ``project`` first maps the sources by
    relu(x_src W_p + b_p); ``normalize`` L2-normalises the output rows.
    """

    def __init__(self, in_channels, out_channels: int, aggr: str = "mean",
                 normalize: bool = False, root_weight: bool = True, project: bool = False,
                 bias: bool = True, *, cached: bool = True, route: str = "auto"):
        super().__init__()
        P_src, P_dst = _pair_channels(in_channels)
        if isinstance(out_channels, bool) or not isinstance(out_channels, int) or \
                out_channels < 1:
            raise ValueError(f"SAGEConv: out_channels must be a positive int, got "
                             f"{out_channels!r}")
        if not isinstance(aggr, str) or aggr not in _AGGRS:
            raise ValueError(f"SAGEConv supports aggr in {list(_AGGRS)}, got {aggr!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.aggr = "sum" if aggr == "add" else aggr
        self.normalize, self.root_weight, self.project = bool(normalize), bool(root_weight), \
            bool(project)
        self.cached, self.route = bool(cached), route
        if self.project:
            self.lin = nn.Linear(P_src, P_src, bias=True)
        self.param = Full(1, P_src, out_channels)  # W_l as theta (1, P_src, Q)
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.root = nn.Parameter(torch.empty(P_dst, out_channels)) if root_weight else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyG's initialisation: torch.nn.Linear's uniform bounds for every weight and bias."""
        P_src, P_dst = _pair_channels(self.in_channels)
        if self.project:
            self.lin.reset_parameters()
        _uniform_(self.param.weight, P_src)
        if self.bias is not None:
            _uniform_(self.bias, P_src)
        if self.root is not None:
            _uniform_(self.root, P_dst)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, aggr={self.aggr!r}"

    def _inputs(self, x):
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else tuple(x)
        P_src, P_dst = _pair_channels(self.in_channels)
        for t, what, P in ((x_src, "x_src", P_src), (x_dst, "x_dst", P_dst)):
            if t is None and what == "x_dst":
                continue
            if not isinstance(t, Tensor) or t.dim() != 2 or not t.is_floating_point() or \
                    t.shape[1] != P:
                got = (tuple(t.shape), t.dtype) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"SAGEConv: {what} must be floating (N, {P}), got {got}")
        return x_src, x_dst

    def forward(self, x, edge_index: Tensor, size=None) -> Tensor:
        """x (N, P) or (x_src (M, P_src), x_dst (N, P_dst)) -> (N, Q)."""
        x_src, x_dst = self._inputs(x)
        if self.project:
            x_src = F.relu(self.lin(x_src))
        M = x_src.shape[0] if size is None else int(size[0])
        N = (x_dst.shape[0] if x_dst is not None else M) if size is None else int(size[1])
        out = self.propagate(x_src, edge_index, M, N)
        if self.root is not None and x_dst is not None:
            out = out + x_dst @ self.root.to(x_dst.dtype)
        return F.normalize(out, p=2.0, dim=-1) if self.normalize else out

    def propagate(self, x_src: Tensor, edge_index: Tensor, M: int, N: int) -> Tensor:
        """W_l agg(x_src) + b: (M, P) sources -> (N, Q) targets."""
        bias = None if self.bias is None else self.bias.to(x_src.dtype)
        if self.aggr == "max" or M == 0 or N == 0:
            check_edges(edge_index, max(M, 1), max(N, 1))
            h = sage_aggregate(x_src, edge_index, N, self.aggr)
            y = h @ self.param.weight[0].to(h.dtype)
            return y if bias is None else y + bias
        basis = sage_basis(edge_index, M, N, self.aggr, x_src.dtype, self.cached)
        return convolve(x_src, basis, self.param, route=self.route, bias=bias)


@register_pyg("SAGEConv")
def _from_sage(m):
    aggr = m.aggr
    if not isinstance(aggr, str) or aggr not in _AGGRS:
        raise ValueError(f"SAGEConv with aggr {aggr!r} has no structconv equivalent (mean, "
                         "sum/add or max)")
    if getattr(m, "flow", "source_to_target") != "source_to_target":
        raise ValueError("SAGEConv with flow='target_to_source' has no structconv equivalent")
    p = m.lin_l.weight
    if isinstance(p, nn.parameter.UninitializedParameter):
        raise ValueError("SAGEConv has lazy (uninitialised) weights: run it once or give "
                         "in_channels before converting")
    P_src = m.lin_l.weight.shape[1]
    P_dst = m.lin_r.weight.shape[1] if m.root_weight else _pair_channels(m.in_channels)[1]
    out = SAGEConv((P_src, P_dst), m.out_channels, aggr=aggr, normalize=m.normalize,
                   root_weight=m.root_weight, project=m.project,
                   bias=m.lin_l.bias is not None)
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
    return out

"""Graph layers with PyG's call signatures, built on ``sc.convolve`` and the graph bases.

``GCNConv``, ``ChebConv``, ``TAGConv``, ``SGConv`` and ``RGCNConv`` take the constructor and call
arguments of their PyG namesakes and give the same outputs; ``from_pyg`` converts PyG modules
(weights copied). Each layer builds its sparse basis from ``edge_index`` and lets the planner
decide whether Θ is applied before or after propagation. With ``cached=True`` (the default here,
unlike PyG, because the key is safe) the normalised structure is built once per graph and shared
by every layer and epoch; see ``sc.basis.graph`` for how graphs are keyed.
"""

from __future__ import annotations

import dataclasses
import math
import weakref

import torch
from torch import Tensor, nn

from ..basis import graph as G
from ..basis.base import Basis
from ..basis.cache import cached
from ..basis.edges import as_edge_index, check_edges, check_K, check_norm, gcn_norm, laplacian
from ..engine import convolve, plan
from ..params import ControlledSeparable, Full, Grouped, Parameterization, glorot_
from .convert import register_pyg
from .pyg import PyGCompatible, check_mask, is_lazy, lazy_parameter

__all__ = ["GCNConv", "ChebConv", "TAGConv", "SGConv", "RGCNConv", "GraphConvolution"]

_FLOWS = ("source_to_target", "target_to_source")

#: plans a graph layer keeps (one per graph and call shape it meets; cleared when full)
_PLANS = 16


def _bias_like(bias: Tensor | None, x: Tensor) -> Tensor | None:
    return bias if bias is None or bias.dtype == x.dtype else bias.to(x.dtype)


def _linear_layout_(w: nn.Parameter) -> None:
    """Keep theta (K, P, Q) in (K, Q, P) memory, torch.nn.Linear's layout (values unchanged;
    the same Parameter object, so an optimizer built before a lazy layer's first call holds it).

    The weight gradient x^T·g is then computed as (g^T·x)^T, the faster GEMM shape when x is
    tall (many nodes): about 1.5x on the backward of a PubMed-sized layer.
    """
    w.data = w.detach().transpose(1, 2).contiguous().transpose(1, 2)


def _check_flow(flow: str) -> str:
    if flow not in _FLOWS:
        raise ValueError(f"unknown flow {flow!r}: use one of {list(_FLOWS)}")
    return flow


def _check_aggr(aggr, allowed: tuple[str, ...], layer: str) -> str:
    if not isinstance(aggr, str) or aggr not in allowed:
        raise ValueError(f"{layer} supports aggr in {list(allowed)} (linear aggregations), "
                         f"got {aggr!r}")
    return "add" if aggr == "sum" else aggr


def _node_features(x, layer: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{layer} expects node features x as a tensor (N, F) or (B, N, F), got "
                        f"{type(x).__name__}")
    if x.dim() not in (2, 3):
        raise ValueError(f"{layer} expects x of shape (N, F) or (B, N, F), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{layer} expects floating node features, got dtype {x.dtype}")
    return x


def _check_channels(name: str, v, lazy: bool = True) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not (v >= 1 or (lazy and v == -1)):
        raise ValueError(f"{name} must be a positive int{' or -1 (lazy)' if lazy else ''}, "
                         f"got {v!r}")


def _edges(edge_index, edge_weight, layer: str, n: int):
    """(edge_index (2, E), edge_weight or None) of any graph input (``as_edge_index``); a
    sparse adjacency's values are the edge weights, its size must be (n, n)."""
    if type(edge_index) is Tensor and edge_index.layout == torch.strided:  # the common path
        if edge_index.dtype == torch.bool or edge_index.is_floating_point():
            raise TypeError(f"{layer}: edge_index must be an integer (2, E) tensor, got dtype "
                            f"{edge_index.dtype}")
        return edge_index, edge_weight
    e = as_edge_index(edge_index, f"{layer}: edge_index")
    if e.size is not None and any(s is not None and s != n for s in e.size):
        raise ValueError(f"{layer}: the adjacency is {e.size[1]} x {e.size[0]} (num_dst x "
                         f"num_src) but x has {n} nodes")
    if e.value is not None and edge_weight is None and e.value.dim() == 1 and \
            e.value.is_floating_point():
        edge_weight = e.value
    return e.index, edge_weight


def _transposed(basis_fn):
    """Wrap a basis builder so that its operator is transposed (flow='target_to_source')."""
    def build():
        b = basis_fn()
        op = b.op
        t = G.SparseOperator(op.dst, op.src, op.value, op.N, op.M)
        if isinstance(b, G.ChebyshevBasis):
            return G.ChebyshevBasis(t, b.K)
        return G.PowerBasis(t, b.powers)
    return build


def _masked_basis(form, mask: Tensor, make) -> Basis:
    """The basis ``make(op)`` of an edge form whose input edges' entries are scaled by an
    explain mask (PyG's ``explain_message``: the entries the operator adds keep theirs)."""
    check_mask(mask, form.src.shape[0], "explain")
    form = dataclasses.replace(form, value=form.value * mask.to(form.value.dtype))
    return make(G.operator_of(form))


class GraphConvolution(PyGCompatible):
    """Common part of the graph layers: ``param`` (theta (K, P, Q)), ``bias`` (Q,), planner.

    Subclasses implement ``basis(x, edge_index, ...)``; ``forward`` is
    ``convolve(x, basis, param) + bias`` with x (N, P) or (B, N, P) -> (N, Q) or (B, N, Q).
    ``in_channels=-1`` sizes theta on the first call (or from a loaded checkpoint).
    """

    def __init__(self, in_channels: int, out_channels: int, K: int, bias: bool = True,
                 cached: bool = True, route: str = "auto"):
        super().__init__()
        _check_channels("in_channels", in_channels)
        _check_channels("out_channels", out_channels, lazy=False)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.cached, self.route = bool(cached), route
        self._plans: dict = {}  # (basis id, x shape, ...) -> (basis, Plan): see plan_for
        self.param: Parameterization = Full(K, max(in_channels, 1), out_channels)
        #: the input width theta is sized for (None until a lazy layer's first call); a plain
        #: attribute, read on every call
        self._P = None if in_channels == -1 else in_channels
        if in_channels == -1:
            self.param.weight = lazy_parameter()
        else:
            _linear_layout_(self.param.weight)
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the weights afresh, as PyG's layer of the same name initialises them (a lazy
        layer's theta once it is sized)."""
        self._init_weights()
        if hasattr(self, "reset_cache"):
            self.reset_cache()

    def _init_weights(self) -> None:
        # glorot theta, zero bias (PyG's GCNConv / ChebConv)
        w = self.param.weight
        if not is_lazy(w):
            with torch.no_grad():
                w.copy_(glorot_(torch.empty(w.shape, dtype=w.dtype, device=w.device)))
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _linear_init(self, bias: bool = False) -> None:
        """torch.nn.Linear's default init (PyG's TAGConv / SGConv weights): U(±1/sqrt(P))."""
        w = self.param.weight
        if is_lazy(w):
            return
        b = 1.0 / math.sqrt(w.shape[1])
        with torch.no_grad():
            w.copy_(torch.empty(w.shape, dtype=w.dtype, device=w.device).uniform_(-b, b))
            if self.bias is not None:
                if bias:
                    self.bias.uniform_(-b, b)
                else:
                    self.bias.zero_()

    def _sized_from(self, name: str, t: Tensor) -> None:
        if name == "param.weight":
            self.param.P = self._P = t.shape[1]
            _linear_layout_(self.param.weight)

    def _materialize(self, P: int) -> None:
        """Size a lazy theta for P input features (the first call), drawn as at construction."""
        w = self.param.weight
        w.materialize((self.param.K, P, self.out_channels))
        self.param.P = self._P = P
        _linear_layout_(w)
        b = None if self.bias is None else self.bias.detach().clone()
        self._init_weights()
        if b is not None:  # only theta is new
            with torch.no_grad():
                self.bias.copy_(b)

    def _pyg_weights(self) -> list[str]:
        """PyG's names of the K slices theta_k^T (Q, P) of this layer."""
        return [f"lins.{k}.weight" for k in range(self.param.K)]

    def _pyg_keys(self) -> dict[str, str]:
        return {"bias": "bias"}

    def _load_from_state_dict(self, state_dict, prefix, *args):
        names = self._pyg_weights()
        if prefix + "param.weight" not in state_dict and all(
                prefix + n in state_dict for n in names):
            state_dict[prefix + "param.weight"] = torch.stack(
                [state_dict.pop(prefix + n).t() for n in names])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _to_pyg_tensors(self, sd: dict, prefix: str) -> None:
        w = sd.pop(prefix + "param.weight")
        for k, n in enumerate(self._pyg_weights()):
            sd[prefix + n] = w[k].t().contiguous()

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, K={self.param.K}, "
                f"bias={self.bias is not None}")

    def basis(self, x: Tensor, edge_index: Tensor, *args, **kwargs) -> Basis:
        """The layer's basis for this call (built from ``edge_index``, cached per graph)."""
        raise NotImplementedError

    def basis_spec(self) -> dict:
        """The layer's basis as ``{"kind": ..., **options}``: what a sampler restricts."""
        raise NotImplementedError(f"{type(self).__name__} does not describe its basis")

    def check_x(self, x) -> Tensor:
        """x as node features of this layer's in_channels (else a clear error); sizes a lazy
        layer on its first call."""
        x = _node_features(x, type(self).__name__)
        if x.layout != torch.strided:  # sparse features (PyG accepts them): as dense rows
            x = x.to_dense()
        if self._P is None:
            self._materialize(x.shape[-1])
        if x.shape[-1] != self._P:
            raise ValueError(f"{type(self).__name__} has in_channels={self._P} but x "
                             f"has {x.shape[-1]} features (shape {tuple(x.shape)})")
        return x

    def forward(self, x: Tensor, edge_index: Tensor | Basis, *args, **kwargs) -> Tensor:
        """x (N, P) or (B, N, P) -> (N, Q) or (B, N, Q). ``edge_index`` is a (2, E) tensor, an
        ``EdgeIndex``, a sparse ``adj_t`` or a built basis of this layer's K (e.g. its
        restriction to a sampled block, whose N targets are the first of its M inputs), used
        as it is."""
        x = self.check_x(x)
        if x.shape[-2] == 0 or x.is_meta:
            return self._no_propagation(x)
        if isinstance(edge_index, Basis):
            b = self._given(edge_index)
        else:
            b = self.basis(x, edge_index, *args, **kwargs)
        if torch.compiler.is_compiling():
            return convolve(x, b, self.param, route=self.route, bias=self.bias)
        xb = x if x.dim() == 3 else x.unsqueeze(0)
        y = self.plan_for(b, xb).run(xb, self.param, _bias_like(self.bias, xb))
        return y if x.dim() == 3 else y.squeeze(0)

    def _no_propagation(self, x: Tensor) -> Tensor:
        """The output when nothing propagates: no nodes (PyG's empty (0, Q)), or shapes only
        (the meta device)."""
        shape = (*x.shape[:-1], self.out_channels)
        if x.device.type == "meta":
            return x.new_empty(shape)
        y = x @ self.param().sum(0).to(x.dtype)  # (…, 0, Q), tied to theta for autograd
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def __getstate__(self):
        # kept plans hold the planner's route closures (and a graph's CSR tensors), which
        # neither pickle nor deep-copy: a copy plans again on its first call
        state = self.__dict__.copy()
        state["_plans"] = {}
        return state

    def plan_for(self, basis: Basis, x: Tensor):
        """The ``sc.Plan`` of this layer on ``basis`` for node features x (B, M, P), kept per
        basis and call shape so that a call runs it without planning again (the engine's
        checks and plan lookup cost as much as a Cora-size propagation's tail)."""
        key = (id(basis), tuple(x.shape), x.stride(), x.dtype, x.device)
        hit = self._plans.get(key)
        if hit is not None and hit[0] is basis:  # the basis is held: its id is not reused
            return hit[1]
        if len(self._plans) >= _PLANS:
            self._plans.clear()
        p = plan(x, basis, self.param, route=self.route)
        self._plans[key] = (basis, p)
        return p

    def _given(self, basis: Basis) -> Basis:
        if basis.K != self.param.K:
            raise ValueError(f"{type(self).__name__} has K={self.param.K} weights but the "
                             f"given basis has K={basis.K} matrices")
        return basis

    def _structure(self, key: tuple, opts: tuple, build, form, make) -> Basis:
        """The cached basis of this call, or, under PyG's ``Explainer``, the basis of the
        edge form ``form()`` with its entries scaled by the edge mask (never cached)."""
        mask = self._explain_mask() if self.__dict__.get("_explain") else None
        if mask is None:
            return cached(self.cached or self._always_cache, key, opts, build)
        return _masked_basis(form(), mask, make)

    #: build the structure through the cache whatever ``cached`` says (SGConv's ``cached`` is
    #: PyG's feature cache)
    _always_cache = False

    @property
    def _cached_edge_index(self):
        """The structure of the last call while ``cached`` (the name PyG's GCNConv uses), or
        None."""
        if not self.cached or not self._plans:
            return None
        return next(reversed(self._plans.values()))[0]

    def plan(self, x: Tensor, edge_index: Tensor, *args, **kwargs):
        """The planner's decision for this call (see ``sc.plan``)."""
        x = self.check_x(x)
        return plan(x, self.basis(x, edge_index, *args, **kwargs), self.param)


class GCNConv(GraphConvolution):
    """PyG's GCNConv: y = D̂^-1/2 Â D̂^-1/2 x Θ + b; called ``(x, edge_index, edge_weight=None)``."""

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False,
                 cached: bool = True, add_self_loops: bool | None = None,
                 normalize: bool = True, bias: bool = True, flow: str = "source_to_target",
                 aggr: str = "add"):
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise ValueError("GCNConv cannot add self loops without normalize=True "
                             "(as PyG's GCNConv, which 'does not support adding self-loops' "
                             "unnormalised)")
        super().__init__(in_channels, out_channels, 1, bias, cached)
        self.improved, self.add_self_loops, self.normalize = improved, add_self_loops, normalize
        self.flow = _check_flow(flow)
        self.aggr = _check_aggr(aggr, ("add", "sum"), "GCNConv")

    def _pyg_weights(self) -> list[str]:
        return ["lin.weight"]

    def basis_spec(self) -> dict:
        """This layer's basis as a kind and its options (``sc.sampling.GraphRestriction``)."""
        return {"kind": "gcn", "add_self_loops": self.add_self_loops,
                "normalize": self.normalize, "improved": self.improved}

    def basis(self, x, edge_index, edge_weight=None):
        n = x.shape[-2]
        edge_index, edge_weight = _edges(edge_index, edge_weight, "GCNConv", n)
        t2s = self.flow == "target_to_source"
        opts = ("GCNConv", n, self.improved, self.add_self_loops, self.normalize, t2s, x.dtype)
        ei = (lambda: edge_index.flip(0)) if t2s else (lambda: edge_index)

        def build():
            return G.gcn(ei(), n, edge_weight, self.add_self_loops, self.normalize,
                         improved=self.improved, dtype=x.dtype)

        def form():
            check_edges(ei(), n, edge_weight=edge_weight)
            return gcn_norm(ei(), n, edge_weight, add_self_loops=self.add_self_loops,
                            normalize=self.normalize, improved=self.improved, dtype=x.dtype)
        return self._structure((edge_index, edge_weight), opts, build, form,
                               lambda op: G.PowerBasis(op, (1,)))


class ChebConv(GraphConvolution):
    """PyG's ChebConv: y = Σ_k T_k(L̂) x Θ_k + b; called ``(x, edge_index, edge_weight=None,
    batch=None, lambda_max=None)``."""

    def __init__(self, in_channels: int, out_channels: int, K: int,
                 normalization: str | None = "sym", bias: bool = True, *, cached: bool = True,
                 flow: str = "source_to_target", aggr: str = "add"):
        check_K(K)
        check_norm(normalization, (None, "sym", "rw"), "ChebConv")
        super().__init__(in_channels, out_channels, K, bias, cached)
        self.normalization = normalization
        self.flow = _check_flow(flow)
        self.aggr = _check_aggr(aggr, ("add", "sum"), "ChebConv")

    def basis_spec(self) -> dict:
        """This layer's basis as a kind and its options (``sc.sampling.GraphRestriction``)."""
        return {"kind": "chebyshev", "K": self.param.K, "normalization": self.normalization}

    def basis(self, x, edge_index, edge_weight=None, batch=None, lambda_max=None):
        n = x.shape[-2]
        edge_index, edge_weight = _edges(edge_index, edge_weight, "ChebConv", n)
        lam_t = lambda_max if isinstance(lambda_max, Tensor) else None
        lam_v = None if isinstance(lambda_max, Tensor) else lambda_max
        opts = ("ChebConv", n, self.param.K, self.normalization, lam_v, self.flow, x.dtype)
        t2s = self.flow == "target_to_source"

        def build():
            return G.chebyshev(edge_index, n, self.param.K, edge_weight, self.normalization,
                               lambda_max, batch=batch, dtype=x.dtype)
        if t2s:
            # PyG keeps the Laplacian of the given edges and sends messages backwards
            build = _transposed(build)

        def form():
            check_edges(edge_index, n, edge_weight=edge_weight)
            return laplacian(edge_index, n, edge_weight, normalization=self.normalization,
                             lambda_max=lambda_max, batch=batch, dtype=x.dtype)

        def make(op):
            if t2s:
                op = G.SparseOperator(op.dst, op.src, op.value, op.N, op.M)
            return G.ChebyshevBasis(op, self.param.K)
        return self._structure((edge_index, edge_weight, batch, lam_t), opts, build, form, make)


class TAGConv(GraphConvolution):
    """PyG's TAGConv: y = Σ_{k=0..K} S^k x Θ_k + b, S = D^-1/2 A D^-1/2 (no added loops)."""

    def __init__(self, in_channels: int, out_channels: int, K: int = 3, bias: bool = True,
                 normalize: bool = True, *, cached: bool = True, flow: str = "source_to_target",
                 aggr: str = "add"):
        check_K(K, low=0)
        self.K = K
        super().__init__(in_channels, out_channels, K + 1, bias, cached)
        self.normalize = normalize
        self.flow = _check_flow(flow)
        self.aggr = _check_aggr(aggr, ("add", "sum"), "TAGConv")

    def _init_weights(self) -> None:
        # PyG's TAGConv: torch.nn.Linear's default init of the weights, zero bias
        self._linear_init(bias=False)

    def basis_spec(self) -> dict:
        """This layer's basis as a kind and its options (``sc.sampling.GraphRestriction``)."""
        return {"kind": "diffusion", "K": self.K,
                "normalization": "sym" if self.normalize else None}

    def basis(self, x, edge_index, edge_weight=None):
        n = x.shape[-2]
        edge_index, edge_weight = _edges(edge_index, edge_weight, "TAGConv", n)
        t2s = self.flow == "target_to_source"
        opts = ("TAGConv", n, self.K, self.normalize, t2s, x.dtype)
        norm = "sym" if self.normalize else None
        ei = (lambda: edge_index.flip(0)) if t2s else (lambda: edge_index)

        def build():
            return G.diffusion(ei(), n, self.K, edge_weight, norm, dtype=x.dtype)

        def form():
            check_edges(ei(), n, edge_weight=edge_weight)
            return G.diffusion_form(ei(), n, edge_weight, norm, dtype=x.dtype)
        return self._structure((edge_index, edge_weight), opts, build, form,
                               lambda op: G.PowerBasis(op, tuple(range(self.K + 1))))


class SGConv(GraphConvolution):
    """PyG's SGConv: y = S^K x Θ + b with S the GCN-normalised adjacency.

    With ``cached=True`` (asked for explicitly, PyG's semantics: the propagated features are
    kept for the graph and features seen first, which PyG never recomputes) the features S^K x
    are kept, keyed on the identity and version counter of ``x``, ``edge_index`` and
    ``edge_weight``: a new tensor or an in-place edit through the tensor recomputes them, but an
    edit that bypasses the version counter (``.numpy()``, ``.data``) is not seen, as in PyG;
    ``reset_cache()`` drops them. The structure cache that every graph layer uses by default is
    checked against the content and never goes stale.
    """

    def __init__(self, in_channels: int, out_channels: int, K: int = 1, cached: bool = False,
                 add_self_loops: bool = True, bias: bool = True, *,
                 flow: str = "source_to_target", aggr: str = "add"):
        check_K(K)
        self._feat = None
        super().__init__(in_channels, out_channels, 1, bias, cached=cached)
        self.K, self.add_self_loops = K, add_self_loops
        self.flow = _check_flow(flow)
        self.aggr = _check_aggr(aggr, ("add", "sum"), "SGConv")

    def _init_weights(self) -> None:
        # PyG's SGConv is a torch.nn.Linear with bias: its default init
        self._linear_init(bias=True)

    _always_cache = True  # ``cached`` is PyG's feature cache here; the structure cache is safe

    @property
    def cache_features(self) -> bool:
        """Whether S^K x is kept (PyG's ``cached``; settable as ``cached``)."""
        return self.cached

    @property
    def _cached_x(self):
        """The kept features S^K x (the name PyG's SGConv uses), or None."""
        return None if self._feat is None else self._feat[2]

    def _pyg_weights(self) -> list[str]:
        return ["lin.weight"]

    def _pyg_keys(self) -> dict[str, str]:
        return {"lin.bias": "bias"}

    def _to_pyg_tensors(self, sd: dict, prefix: str) -> None:
        super()._to_pyg_tensors(sd, prefix)
        if prefix + "bias" in sd:
            sd[prefix + "lin.bias"] = sd.pop(prefix + "bias")

    def basis_spec(self) -> dict:
        """This layer's basis as a kind and its options (``sc.sampling.GraphRestriction``)."""
        return {"kind": "sgc", "K": self.K, "add_self_loops": self.add_self_loops}

    def basis(self, x, edge_index, edge_weight=None):
        n = x.shape[-2]
        edge_index, edge_weight = _edges(edge_index, edge_weight, "SGConv", n)
        t2s = self.flow == "target_to_source"
        opts = ("SGConv", n, self.K, self.add_self_loops, t2s, x.dtype)
        ei = (lambda: edge_index.flip(0)) if t2s else (lambda: edge_index)

        def build():
            return G.sgc(ei(), n, self.K, edge_weight, self.add_self_loops, dtype=x.dtype)

        def form():
            check_edges(ei(), n, edge_weight=edge_weight)
            return gcn_norm(ei(), n, edge_weight, add_self_loops=self.add_self_loops,
                            dtype=x.dtype)
        return self._structure((edge_index, edge_weight), opts, build, form,
                               lambda op: G.PowerBasis(op, (self.K,)))

    def reset_cache(self) -> None:
        """Drop the kept features (``cached=True``)."""
        self._feat = None

    def forward(self, x, edge_index, edge_weight=None):
        if not self.cache_features or isinstance(edge_index, Basis) or \
                self._explain_mask() is not None:
            return super().forward(x, edge_index, edge_weight)
        x = self.check_x(x)
        if x.shape[-2] == 0 or x.device.type == "meta":
            return self._no_propagation(x)
        keys = (x, edge_index, edge_weight)
        sig = tuple(None if t is None else (t._version, tuple(t.shape), t.dtype) for t in keys)
        hit = self._feat
        if hit is not None and hit[1] == sig and all(
                (r is None and t is None) or (r is not None and r() is t)
                for r, t in zip(hit[0], keys)):
            h = hit[2]
        else:
            b = self.basis(x, edge_index, edge_weight)
            h = b.propagate(x if x.dim() == 3 else x.unsqueeze(0))[:, :, 0]
            h = h if x.dim() == 3 else h[0]
            refs = tuple(None if t is None else weakref.ref(t) for t in keys)
            self._feat = (refs, sig, h.detach())
        y = h @ self.param.weight[0].to(h.dtype)
        return y if self.bias is None else y + self.bias


class RGCNConv(PyGCompatible):
    """PyG's RGCNConv: y_n = Σ_r mean_{m -r-> n} x_m W_r + x_n W_root + b.

    Called ``(x, edge_index, edge_type)``; x is (N, P) floats, None or an index tensor
    (featureless nodes: one-hot rows, applied by gathering rows of theta), or a pair
    ``(x_source, x_target)``. ``num_bases`` is the paper's controlled separability
    (``sc.params.ControlledSeparable``), ``num_blocks`` block-diagonal ``sc.params.Grouped``.
    ``sorts`` (structconv's extension): one weight per random-walk sort instead of one per
    relation, e.g. ``[(0,), (1,), (0, 1)]`` or, with ``relations`` (names of the
    ``num_relations`` edge types), ``["author", "author.publishes"]``; each step of a sort is
    normalised as its relation alone.
    """

    def __init__(self, in_channels, out_channels: int, num_relations: int,
                 num_bases: int | None = None, num_blocks: int | None = None,
                 aggr: str = "mean", root_weight: bool = True, is_sorted: bool = False,
                 bias: bool = True, *, cached: bool = True, flow: str = "source_to_target",
                 route: str = "auto", sorts=None, relations=None):
        super().__init__()
        if num_bases is not None and num_blocks is not None:
            raise ValueError("RGCNConv cannot use both num_bases and num_blocks")
        check_K(num_relations, "num_relations")
        self.relations = None if relations is None else [str(r) for r in relations]
        self.sorts = None if sorts is None else G.parse_sorts(sorts, self.relations,
                                                              num_relations)
        if self.sorts is not None and not self.sorts:
            raise ValueError("RGCNConv sorts must hold at least one sort")
        pair = in_channels if isinstance(in_channels, (tuple, list)) else (in_channels,) * 2
        if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                 for v in pair):
            raise ValueError(f"in_channels must be a positive int or a pair, got {in_channels!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_relations, self.num_bases, self.num_blocks = num_relations, num_bases, num_blocks
        self.aggr = _check_aggr(aggr, ("mean", "add", "sum"), "RGCNConv")
        self.flow = _check_flow(flow)
        self.is_sorted, self.cached, self.route = is_sorted, bool(cached), route
        # one weight per sort (per relation without sorts)
        P, Q, R = pair[0], out_channels, num_relations if sorts is None else len(self.sorts)
        if any(len(s) > 1 for s in self.sorts or ()) and len(set(pair)) > 1:
            raise ValueError(f"RGCNConv sorts longer than one relation need one node set, got "
                             f"in_channels {in_channels!r}")
        if num_bases is not None:
            self.param = ControlledSeparable(R, P, Q, num_bases)
        elif num_blocks is not None:
            self.param = Grouped(R, P, Q, num_blocks)
        else:
            self.param = Full(R, P, Q)
        if root_weight:
            self.root = nn.Parameter(torch.empty(pair[1], Q))
        else:
            self.register_parameter("root", None)
        if bias:
            self.bias = nn.Parameter(torch.zeros(Q))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the weights afresh as PyG's RGCNConv does: glorot weights (and comp, whose
        bound is the same for structconv's (H, R) basis_coef), glorot root, zero bias."""
        for p in self.param.parameters():
            glorot_(p)
        if self.root is not None:
            glorot_(self.root)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _pyg_keys(self) -> dict[str, str]:
        if self.num_bases is not None:
            return {"weight": "param.channel", "comp": "param.basis_coef"}
        return {"weight": "param.weight"}

    def _from_pyg_tensor(self, ours: str, t: Tensor) -> Tensor:
        return t.t() if ours == "param.basis_coef" else t

    def _to_pyg_tensors(self, sd: dict, prefix: str) -> None:
        for pyg, ours in self._pyg_keys().items():
            t = sd.pop(prefix + ours)
            sd[prefix + pyg] = self._from_pyg_tensor(ours, t).contiguous()

    def extra_repr(self) -> str:
        sorts = "" if self.sorts is None else (
            f", sorts=[{', '.join(G.sort_name(s, self.relations) for s in self.sorts)}]")
        return (f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}, "
                f"num_bases={self.num_bases}, num_blocks={self.num_blocks}, aggr={self.aggr!r}"
                + sorts)

    def _split(self, x):
        x_l, x_r = (x if isinstance(x, tuple) else (x, x))
        P = self.param.P
        if x_l is None:
            x_l = torch.arange(P, device=self.param.weight.device
                               if hasattr(self.param, "weight") else self.param.channel.device)
        if x_r is None:
            x_r = x_l
        for t, what in ((x_l, "x (source)"), (x_r, "x (target)")):
            if not isinstance(t, Tensor):
                raise TypeError(f"RGCNConv expects {what} as a tensor or None, got "
                                f"{type(t).__name__}")
        if x_l.is_floating_point():
            if x_l.dim() != 2 or x_l.shape[1] != P:
                raise ValueError(f"RGCNConv expects x (source) features (N, {P}), got "
                                 f"{tuple(x_l.shape)}")
        elif x_l.dim() != 1 or (x_l.numel() and (x_l.min() < 0 or x_l.max() >= P)):
            raise ValueError(f"RGCNConv featureless x must be a 1-d index tensor with values in "
                             f"[0, {P - 1}], got shape {tuple(x_l.shape)}")
        if self.num_blocks is not None and not x_l.is_floating_point():
            raise ValueError("RGCNConv block-diagonal decomposition needs float features")
        return x_l, x_r

    def basis_spec(self) -> dict:
        """This layer's basis as a kind and its options (``sc.sampling.GraphRestriction``;
        relations carry no edge weight)."""
        return {"kind": "relational", "sorts": self.sorts,
                "normalization": "mean" if self.aggr == "mean" else None,
                "num_relations": self.num_relations}

    def basis(self, x, edge_index: Tensor, edge_type: Tensor | None = None) -> Basis:
        """The relational basis (R, M, N) of this call (x as in ``forward``)."""
        x_l, x_r = self._split(x)
        return self._basis(x_l.shape[0], x_r.shape[0], edge_index, edge_type,
                           x_l.dtype if x_l.is_floating_point() else self._dtype())

    def _dtype(self):
        return next(self.param.parameters()).dtype

    def _basis(self, M, N, edge_index, edge_type, dtype):
        edge_index, edge_type = self._edges(edge_index, edge_type, M, N)
        if edge_type is None:
            raise ValueError("RGCNConv needs edge_type (E,) with edge_index (2, E)")
        t2s = self.flow == "target_to_source"
        norm = "mean" if self.aggr == "mean" else None
        sorts = None if self.sorts is None else tuple(self.sorts)
        opts = ("RGCNConv", M, N, self.num_relations, norm, t2s, dtype, sorts)

        def build():
            ei = edge_index.flip(0) if t2s else edge_index
            return G.relational(ei, edge_type, (M, N) if M != N else M, sorts,
                                normalization=norm, num_relations=self.num_relations,
                                dtype=dtype)
        return cached(self.cached, (edge_index, edge_type), opts, build)

    def forward(self, x, edge_index: Tensor | Basis,
                edge_type: Tensor | None = None) -> Tensor:
        """(N, Q) outputs. ``edge_index`` may also be a built relational basis of this layer's
        sorts (e.g. restricted to a sampled block): its N targets are the first N inputs, so
        the root term reads the first N rows of a single ``x``."""
        x_l, x_r = self._split(x)
        if isinstance(edge_index, Basis):
            b = edge_index
            if b.K != self.param.K:
                raise ValueError(f"RGCNConv has {self.param.K} weights but the given basis "
                                 f"has K={b.K} matrices")
            if not isinstance(x, tuple):
                x_r = x_r[:b.N]
        else:
            M, N = x_l.shape[0], x_r.shape[0]
            if M == 0 or N == 0 or x_l.device.type == "meta":
                return self._no_propagation(x_l, x_r)
            dtype = x_l.dtype if x_l.is_floating_point() else self._dtype()
            b = self._basis(M, N, edge_index, edge_type, dtype)
        if x_l.is_floating_point():
            y = convolve(x_l, b, self.param, route=self.route)
        else:
            # one-hot inputs: X Θ_k is a row gather of Θ_k, then Σ_r A_rᵀ (X Θ_r)
            z = self.param()[:, x_l].permute(1, 0, 2).unsqueeze(0)  # (1, M, R, Q)
            y = b.propagate_sum(z.contiguous())[0]
        if self.root is not None:
            y = y + (x_r @ self.root if x_r.is_floating_point() else self.root[x_r])
        return y if self.bias is None else y + self.bias

    def _edges(self, edge_index, edge_type, M: int, N: int):
        """(edge_index (2, E), edge_type) of any graph input: a ``SparseTensor``'s values and
        an integer torch sparse adjacency's are the edge types (PyG's convention)."""
        if type(edge_index) is Tensor and edge_index.layout == torch.strided:
            return edge_index, edge_type
        e = as_edge_index(edge_index, "RGCNConv: edge_index")
        if e.size is not None and tuple(e.size) != (M, N):
            raise ValueError(f"RGCNConv: the adjacency is {e.size[1]} x {e.size[0]} (num_dst x "
                             f"num_src) but x gives {N} targets and {M} sources")
        if edge_type is None and e.value is not None and not e.value.is_floating_point():
            edge_type = e.value
        return e.index, edge_type

    def _no_propagation(self, x_l: Tensor, x_r: Tensor) -> Tensor:
        """No source or no target nodes: the root term and the bias (PyG's output), or shapes
        only (the meta device)."""
        N, Q = x_r.shape[0], self.out_channels
        if x_l.device.type == "meta" or x_r.device.type == "meta":
            return torch.empty(N, Q, device="meta", dtype=self._dtype())
        theta = self.param()
        if x_l.is_floating_point():
            y = (x_l @ theta.sum(0).to(x_l.dtype)).sum(0).expand(N, Q)  # zeros, tied to theta
        else:
            y = theta[:, x_l].sum((0, 1)).expand(N, Q)
        if self.root is not None:
            y = y + (x_r @ self.root if x_r.is_floating_point() else self.root[x_r])
        return y if self.bias is None else y + self.bias

    def plan(self, x, edge_index, edge_type=None):
        """The planner's decision for the relation part of this call (float features)."""
        x_l, _ = self._split(x)
        return plan(x_l, self.basis(x, edge_index, edge_type), self.param)


# ------------------------------------------------------------------------------------------------
# converters from PyG (registered by class name; PyG itself is never imported here)
def _like(layer: nn.Module, module: nn.Module) -> nn.Module:
    p = next(module.parameters(), None)
    if p is not None:
        if isinstance(p, nn.parameter.UninitializedParameter):
            raise ValueError(f"{type(module).__name__} has lazy (uninitialised) weights: run it "
                             "once or give in_channels before converting")
        layer = layer.to(device=p.device, dtype=p.dtype)
    return layer.train(module.training)


def _pyg_common(module, layer_name):
    flow = getattr(module, "flow", "source_to_target")
    aggr = getattr(module, "aggr", "add")
    if not isinstance(aggr, str):
        raise ValueError(f"{layer_name} with aggregation module {type(aggr).__name__} is not "
                         "linear and has no structconv equivalent")
    return flow, aggr


def _copy_bias(layer, bias):
    if bias is not None:
        layer.bias.data.copy_(bias.detach())


@register_pyg("GCNConv")
def _from_gcn(m):
    flow, aggr = _pyg_common(m, "GCNConv")
    out = GCNConv(m.in_channels, m.out_channels, improved=m.improved, cached=True,
                  add_self_loops=m.add_self_loops, normalize=m.normalize,
                  bias=m.bias is not None, flow=flow, aggr=aggr)
    out = _like(out, m)
    with torch.no_grad():
        out.param.weight.copy_(m.lin.weight.detach().t().unsqueeze(0))
        _copy_bias(out, m.bias)
    return out


@register_pyg("ChebConv")
def _from_cheb(m):
    flow, aggr = _pyg_common(m, "ChebConv")
    out = ChebConv(m.in_channels, m.out_channels, len(m.lins), m.normalization,
                   bias=m.bias is not None, flow=flow, aggr=aggr)
    out = _like(out, m)
    with torch.no_grad():
        out.param.weight.copy_(torch.stack([lin.weight.detach().t() for lin in m.lins]))
        _copy_bias(out, m.bias)
    return out


@register_pyg("TAGConv")
def _from_tag(m):
    flow, aggr = _pyg_common(m, "TAGConv")
    out = TAGConv(m.in_channels, m.out_channels, m.K, bias=m.bias is not None,
                  normalize=m.normalize, flow=flow, aggr=aggr)
    out = _like(out, m)
    with torch.no_grad():
        out.param.weight.copy_(torch.stack([lin.weight.detach().t() for lin in m.lins]))
        _copy_bias(out, m.bias)
    return out


@register_pyg("SGConv")
def _from_sgc(m):
    flow, aggr = _pyg_common(m, "SGConv")
    out = SGConv(m.in_channels, m.out_channels, m.K, cached=m.cached,
                 add_self_loops=m.add_self_loops, bias=m.lin.bias is not None, flow=flow,
                 aggr=aggr)
    out = _like(out, m)
    with torch.no_grad():
        out.param.weight.copy_(m.lin.weight.detach().t().unsqueeze(0))
        _copy_bias(out, m.lin.bias)
    return out


@register_pyg("RGCNConv", "FastRGCNConv")
def _from_rgcn(m):
    flow, aggr = _pyg_common(m, type(m).__name__)
    out = RGCNConv(m.in_channels, m.out_channels, m.num_relations, num_bases=m.num_bases,
                   num_blocks=m.num_blocks, aggr=aggr, root_weight=m.root is not None,
                   is_sorted=m.is_sorted, bias=m.bias is not None, flow=flow)
    out = _like(out, m)
    with torch.no_grad():
        if m.num_bases is not None:
            out.param.channel.copy_(m.weight.detach())
            out.param.basis_coef.copy_(m.comp.detach().t())
        else:
            out.param.weight.copy_(m.weight.detach())
        if m.root is not None:
            out.root.copy_(m.root.detach())
        _copy_bias(out, m.bias)
    return out

"""Typed convolution over relations between node types, and ``to_hetero``.

``TypedGraphConv`` computes, for each node type d,

    y_d = Σ_{r = (s, rel, d)} A_rᵀ x_s θ_r  +  x_d W_root,d  +  b_d

with A_r relation r's rectangular basis (n_s, n_d) (mean-normalised per relation by default,
as SAGE / R-GCN), and θ (R, P, Q) any ``sc.params`` form across the R relations: ``"full"`` (one
matrix per relation: PyG's ``to_hetero`` of a mean SAGE), ``ControlledSeparable`` (shared
channel matrices with per-relation coefficients: PyG's ``to_hetero_with_bases``), ``Grouped``
(block-diagonal). Node types may have their own input widths (narrower inputs are zero-padded
to the widest; the padded rows of θ see only zeros). The relations are stacked into one sparse
basis over the concatenated node sets (``sc.basis.typed.TypedBasis``), and the whole layer is
one sparse product and one segment product (``typed_convolve``), whatever the number of types.

``to_hetero(model, metadata)`` turns a homogeneous model of structconv graph layers into a typed
one (see its docstring for how it differs from PyG's).
"""

from __future__ import annotations

import copy
import inspect
import operator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..basis.cache import cached
from ..basis.graph import PowerBasis
from ..basis.typed import relation_operator, segment_matmul, typed_basis, typed_convolve
from ..engine import convolve
from ..params import Parameterization, build, glorot_, make_param, reset_children
from .hetero import HeteroConv, edge_key

__all__ = ["TypedGraphConv", "to_hetero", "TypedModel", "check_metadata", "known_relations"]

_ABSENT = object()
_NORMS = {"mean": "mean", "sum": None, "add": None, "sym": "sym"}


def check_metadata(metadata):
    if not isinstance(metadata, (tuple, list)) or len(metadata) != 2:
        raise ValueError("metadata must be (node_types, edge_types), as HeteroGraph.metadata() "
                         f"or PyG's HeteroData.metadata(), got {metadata!r}")
    nts = [str(t) for t in metadata[0]]
    ets = [tuple(e) for e in metadata[1]]
    for e in ets:
        if len(e) != 3 or e[0] not in nts or e[2] not in nts:
            raise ValueError(f"metadata: edge type {e} must be (src, relation, dst) with node "
                             f"types among {nts}")
    return nts, ets


def known_relations(who: str, edge_index_dict: dict, edge_types: list, present):
    """(relation id, edge type, edges) of each relation given whose source and target types
    are in ``present``, in ``edge_index_dict``'s order; an edge type outside ``edge_types``
    (the layer's metadata) is refused by name."""
    for et, ei in edge_index_dict.items():
        et = tuple(et)
        if et not in edge_types:
            raise ValueError(f"{who}: edge type {et} is not in its metadata")
        if et[0] in present and et[2] in present:
            yield edge_types.index(et), et, ei


def _param(param, K: int, P: int, Q: int) -> Parameterization:
    if isinstance(param, dict):
        return build(param, K, P, Q)
    return make_param(param, K, P, Q)


def relation_basis(edge_index: Tensor, M: int, N: int, normalization, dtype,
                   cache: bool = True) -> PowerBasis:
    """One relation's rectangular (1, M, N) basis, cached per graph."""
    return cached(cache, (edge_index,), ("relation", M, N, normalization, dtype),
                  lambda: PowerBasis(relation_operator(edge_index, M, N, normalization,
                                                       dtype=dtype), (1,)))


class TypedGraphConv(nn.Module):
    """Relations between node types with per-type widths (module doc): x_dict {type: (n_t,
    P_t)} -> {type: (n_t, Q)} for every node type of ``metadata`` (a type no relation reaches
    gets its root term and bias: a value, never None)."""

    def __init__(self, in_channels, out_channels: int, metadata, param="full",
                 aggr: str = "mean", root_weight: bool = True, bias: bool = True, *,
                 cached: bool = True):
        super().__init__()
        self.node_types, self.edge_types = check_metadata(metadata)
        if isinstance(in_channels, dict):
            missing = [t for t in self.node_types if t not in in_channels]
            if missing:
                raise ValueError(f"TypedGraphConv: in_channels has no width for {missing}")
            widths = {t: int(in_channels[t]) for t in self.node_types}
        else:
            widths = {t: int(in_channels) for t in self.node_types}
        if any(w < 1 for w in widths.values()) or isinstance(out_channels, bool) or \
                not isinstance(out_channels, int) or out_channels < 1:
            raise ValueError(f"TypedGraphConv: widths must be positive ints, got in_channels "
                             f"{in_channels!r}, out_channels {out_channels!r}")
        if aggr not in _NORMS:
            raise ValueError(f"TypedGraphConv: aggr must be one of {list(_NORMS)} (per "
                             f"relation), got {aggr!r}")
        self.in_channels, self.out_channels, self.widths = in_channels, out_channels, widths
        self.aggr, self.cached = aggr, bool(cached)
        P, T = max(widths.values()), len(self.node_types)
        self.param = _param(param, max(len(self.edge_types), 1), P, out_channels)
        self.root = nn.Parameter(torch.empty(T, P, out_channels)) if root_weight else None
        self.bias = nn.Parameter(torch.zeros(T, out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot weights (per relation and per type, on each type's own width), zero bias."""
        with torch.no_grad():
            for p in self.param.parameters():
                glorot_(p) if p.dim() >= 2 else p.uniform_(-1, 1)
            if self.root is not None:
                self.root.zero_()
                for i, t in enumerate(self.node_types):
                    glorot_(self.root[i, :self.widths[t]])
            if self.bias is not None:
                self.bias.zero_()

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, types={len(self.node_types)}, "
                f"relations={len(self.edge_types)}, aggr={self.aggr!r}")

    def _checked(self, x_dict) -> dict[str, Tensor]:
        """Every node type's features (n_t, P_t); a type absent from ``x_dict`` (one that an
        earlier layer's relations did not reach) gets no rows."""
        if not isinstance(x_dict, dict) or not any(t in x_dict for t in self.node_types):
            raise ValueError(f"TypedGraphConv: x_dict must map node types {self.node_types} "
                             f"to features, got {type(x_dict).__name__}")
        like = next(x_dict[t] for t in self.node_types if t in x_dict)
        out = {}
        for t in self.node_types:
            x = x_dict.get(t, _ABSENT)
            if x is _ABSENT:
                x = like.new_zeros(0, self.widths[t]) if isinstance(like, Tensor) else None
            if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != self.widths[t] or \
                    not x.is_floating_point():
                got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"TypedGraphConv: x_dict[{t!r}] must be floating "
                                 f"(n, {self.widths[t]}), got {got}")
            out[t] = x
        return out

    def _features(self, x_dict) -> tuple[Tensor, list[int]]:
        """The features of every node type concatenated (padded to the widest: used where
        the widths agree), and the counts."""
        P = self.param.P
        xs = [x if x.shape[1] == P else F.pad(x, (0, P - x.shape[1]))
              for x in self._checked(x_dict).values()]
        return (torch.cat(xs) if len(xs) > 1 else xs[0]), [x.shape[0] for x in xs]

    def basis(self, counts: list[int], edge_index_dict, dtype):
        """The ``TypedBasis`` of this call's graph (cached per graph and dtype)."""
        num = dict(zip(self.node_types, counts))
        # a relation touching a type without rows (absent from x_dict) has no edges
        eis = tuple(edge_index_dict.get(e) if num[e[0]] and num[e[2]] else None
                    for e in self.edge_types)
        opts = ("typed", tuple(counts), tuple(self.edge_types), self.aggr, dtype)

        def make():
            return typed_basis(num, {e: t for e, t in zip(self.edge_types, eis)
                                     if t is not None}, self.edge_types, _NORMS[self.aggr],
                               dtype)
        return cached(self.cached, eis, opts, make)

    def forward(self, x_dict: dict, edge_index_dict: dict) -> dict[str, Tensor]:
        """{type: (n_t, P_t)}, {(s, rel, d): (2, E)} -> {type: (n_t, Q)} (an edge type
        absent from ``edge_index_dict`` has no edges)."""
        if not isinstance(edge_index_dict, dict):
            raise TypeError(f"TypedGraphConv: edge_index_dict must be a dict, got "
                            f"{type(edge_index_dict).__name__}")
        unknown = [e for e in edge_index_dict if tuple(e) not in self.edge_types]
        if unknown:
            raise ValueError(f"TypedGraphConv: edge types {unknown} are not in its metadata "
                             f"{self.edge_types}")
        present = {self.widths[t] for t in self.node_types if t in x_dict}
        if len(present) > 1:
            return self._per_relation(x_dict, edge_index_dict)
        x, counts = self._features(x_dict)
        b = self.basis(counts, edge_index_dict, x.dtype)
        theta = self.param().to(x.dtype)
        y = typed_convolve(x, b, theta[:len(self.edge_types)])
        if self.root is not None:
            y = y + segment_matmul(x, counts, self.root)
        if self.bias is not None:
            reps = torch.tensor(counts, device=x.device)
            y = y + self.bias.to(x.dtype).repeat_interleave(reps, 0, output_size=x.shape[0])
        return {t: v for t, v in zip(self.node_types, y.split(counts)) if t in x_dict}

    def _per_relation(self, x_dict: dict, edge_index_dict: dict) -> dict[str, Tensor]:
        """Types of different widths (an input layer): each relation's rectangular convolution
        in its cheaper order (the planner's), each type's root once. The shapes differ per
        relation, so this is a product per relation; one width runs as one segment product."""
        given = self._checked(x_dict)
        x_dict = {t: given[t] for t in self.node_types if t in x_dict}
        theta = self.param()
        out = {t: None for t in x_dict}
        for r, e in enumerate(self.edge_types):
            s, _, d = e
            if s not in x_dict or d not in x_dict or e not in edge_index_dict:
                continue
            xs = x_dict[s]
            M, N = xs.shape[0], x_dict[d].shape[0]
            if not M or not N:
                continue
            b = relation_basis(edge_index_dict[e], M, N, _NORMS[self.aggr], xs.dtype,
                               self.cached)
            y = convolve(xs, b, theta[r:r + 1, :xs.shape[1]].to(xs.dtype))
            out[d] = y if out[d] is None else out[d] + y
        for i, t in enumerate(self.node_types):
            if t not in x_dict:
                continue
            x = x_dict[t]
            y = out[t] if out[t] is not None else x.new_zeros(x.shape[0], self.out_channels)
            if self.root is not None:
                y = y + x @ self.root[i, :x.shape[1]].to(x.dtype)
            out[t] = y if self.bias is None else y + self.bias[i].to(x.dtype)
        return out

    @torch.no_grad()
    def load_relation_layers(self, layers: dict) -> TypedGraphConv:
        """Copy the weights of one SAGE layer per relation (PyG's or structconv's, mean or sum,
        as PyG's ``to_hetero`` makes them) into this layer (a ``"full"`` param): θ_r their
        neighbour weights, each type's root and bias the sums over the relations ending there
        (what to_hetero's sum of the relations' outputs computes)."""
        if not hasattr(self.param, "weight") or self.param.weight.dim() != 3:
            raise ValueError("load_relation_layers needs a 'full' param")
        if self.root is not None:
            self.root.zero_()
        if self.bias is not None:
            self.bias.zero_()
        for r, et in enumerate(self.edge_types):
            m = layers[et] if et in layers else layers[edge_key(et)]
            w_l, b_l, w_r = _sage_weights(m)
            d = self.node_types.index(et[2])
            self.param.weight[r].zero_()
            self.param.weight[r, :w_l.shape[0]].copy_(w_l)
            if self.root is not None and w_r is not None:
                self.root[d, :w_r.shape[0]] += w_r
            if self.bias is not None and b_l is not None:
                self.bias[d] += b_l
        return self


def _sage_weights(m):
    """(W_l (P_src, Q), b (Q,) or None, W_root (P_dst, Q) or None) of a SAGE layer."""
    if hasattr(m, "lin_l"):  # PyG
        return (m.lin_l.weight.t(), m.lin_l.bias,
                m.lin_r.weight.t() if getattr(m, "root_weight", False) else None)
    return m.param.weight[0], m.bias, m.root


# ------------------------------------------------------------------------------------------------
# to_hetero
def _graph_layer(m: nn.Module) -> bool:
    """A structconv graph layer: a module of ``structconv`` whose forward takes ``edge_index``
    (every homogeneous graph layer, present and future), or a typed layer already."""
    if isinstance(m, (TypedGraphConv, HeteroConv)):
        return True
    if not type(m).__module__.startswith("structconv."):
        return False
    try:
        return "edge_index" in inspect.signature(type(m).forward).parameters
    except (TypeError, ValueError):
        return False


def _typed_layer(m: nn.Module, metadata, aggr, param):
    """The typed replacement of one graph layer: a linear SAGE -> one ``TypedGraphConv``;
    any other layer -> a ``HeteroConv`` of re-initialised copies, one per edge type."""
    from .sage import SAGEConv
    nts, ets = metadata
    if isinstance(m, SAGEConv) and m.aggr in ("mean", "sum") and not m.project and \
            not m.normalize and aggr == "sum":
        widths = m.in_channels if isinstance(m.in_channels, int) else m.in_channels[0]
        out = TypedGraphConv(widths, m.out_channels, metadata, param=param, aggr=m.aggr,
                             root_weight=m.root is not None, bias=m.bias is not None)
        p = next(m.parameters())
        return out.to(device=p.device, dtype=p.dtype)
    convs = {}
    for et in ets:
        c = copy.deepcopy(m)
        if hasattr(c, "reset_parameters"):
            c.reset_parameters()
        convs[et] = c
    return HeteroConv(convs, aggr=aggr)


class _Tracer(torch.fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return _graph_layer(m) or super().is_leaf_module(m, qualname)


def _per_key(fn, args, kwargs):
    """fn applied per node type where an argument is a dict (every dict argument indexed by
    the same key); as it is otherwise."""
    dicts = [a for a in list(args) + list(kwargs.values()) if isinstance(a, dict)]
    if not dicts:
        return fn(*args, **kwargs)
    keys = [k for k in dicts[0] if all(k in d for d in dicts)]

    def at(a, k):
        return a[k] if isinstance(a, dict) else a
    return {k: fn(*[at(a, k) for a in args], **{n: at(v, k) for n, v in kwargs.items()})
            for k in keys}


class TypedModel(nn.Module):
    """A homogeneous model run on typed inputs (``to_hetero``'s result): its traced graph,
    with each graph layer replaced by a typed one and each other module with parameters
    copied per node type; every other operation is applied per node type."""

    def __init__(self, model: nn.Module, metadata, aggr: str = "sum", param="full"):
        super().__init__()
        meta = check_metadata(metadata)
        self.metadata = meta
        self.graph = _Tracer().trace(model)
        self.layers = nn.ModuleDict()
        self.typed_modules: dict[str, str] = {}  # qualified name -> key in self.layers
        mods = dict(model.named_modules())
        for node in self.graph.nodes:
            if node.op != "call_module" or node.target in self.typed_modules:
                continue
            m, key = mods[node.target], node.target.replace(".", "_")
            if _graph_layer(m):
                self.layers[key] = _typed_layer(m, meta, aggr, param)
            elif any(True for _ in m.parameters()):
                self.layers[key] = nn.ModuleDict({t: _reset(copy.deepcopy(m))
                                                  for t in meta[0]})
            else:
                self.layers[key] = m
            self.typed_modules[node.target] = key
        # the source model is read for get_attr nodes only: not a submodule (its homogeneous
        # parameters are not this model's)
        self.__dict__["_source"] = model
        # the graph as plain steps (node references as step numbers): torch.compile traces a
        # loop over them, where it refuses to walk an fx graph's nodes
        number = {node: i for i, node in enumerate(self.graph.nodes)}
        self._steps = [(node.op, node.target, _refs(node.args, number), _refs(node.kwargs, number))
                       for node in self.graph.nodes]

    def reset_parameters(self) -> None:
        """Re-draw the typed layers' weights and each node type's copies (their own inits)."""
        reset_children(self.layers)

    def _module(self, target, args, kwargs):
        m = self.layers[self.typed_modules[target]]
        if _graph_layer(m):
            return m(*args, **kwargs)
        if isinstance(m, nn.ModuleDict):
            return _per_key(lambda t, *a, **k: m[t](*a, **k), *_with_key(args, kwargs))
        return _per_key(m, args, kwargs)

    def forward(self, *inputs, **named):
        env: list = []
        pos = iter(inputs)
        for op, target, args, kwargs in self._steps:
            if op == "output":
                return _load(args[0], env)
            args, kwargs = _load(args, env), _load(kwargs, env)
            if op == "placeholder":
                env.append(named[target] if target in named else next(pos, None))
            elif op == "get_attr":
                env.append(operator.attrgetter(target)(self._source))
            elif op == "call_module":
                env.append(self._module(target, args, kwargs))
            elif op == "call_function":
                env.append(_per_key(target, args, kwargs))
            else:  # call_method
                env.append(_per_key(_method(target), args, kwargs))


class _Ref:
    """A reference to the value of an earlier step of a ``TypedModel``'s graph."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


def _refs(a, number: dict):
    """``a`` (an fx node's args) with every node replaced by a ``_Ref`` to its step."""
    if isinstance(a, torch.fx.Node):
        return _Ref(number[a])
    if isinstance(a, (tuple, list)):
        return type(a)(_refs(v, number) for v in a)
    if isinstance(a, dict):
        return {k: _refs(v, number) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_refs(a.start, number), _refs(a.stop, number), _refs(a.step, number))
    return a


def _load(a, env: list):
    """``a`` with every ``_Ref`` replaced by the value its step computed."""
    if isinstance(a, _Ref):
        return env[a.i]
    if isinstance(a, (tuple, list)):
        return type(a)(_load(v, env) for v in a)
    if isinstance(a, dict):
        return {k: _load(v, env) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_load(a.start, env), _load(a.stop, env), _load(a.step, env))
    return a


def _method(name: str):
    return lambda s, *a, **k: getattr(s, name)(*a, **k)


def _with_key(args, kwargs):
    """(args with a leading dict {t: t} so that _per_key passes each node type, kwargs)."""
    d = next(a for a in list(args) + list(kwargs.values()) if isinstance(a, dict))
    return ({t: t for t in d}, *args), kwargs


def _reset(m: nn.Module) -> nn.Module:
    if hasattr(m, "reset_parameters"):
        m.reset_parameters()
    return m


def to_hetero(model: nn.Module, metadata, aggr: str = "sum", param="full") -> TypedModel:
    """A typed version of a homogeneous ``model`` whose forward takes ``(x, edge_index)``:
    called ``(x_dict, edge_index_dict)`` it returns {node type: output}.

    Like PyG's ``to_hetero`` the model is traced with ``torch.fx`` and its other modules with
    parameters are copied per node type. Unlike it: (1) a linear SAGE layer (mean / sum, no
    project or normalize) becomes ONE ``TypedGraphConv`` over all relations (one sparse and
    one segment product, ``param`` any ``sc.params`` form across relations, e.g.
    ``ControlledSeparable`` for ``to_hetero_with_bases``), not a copy per relation summed;
    other graph layers become a ``HeteroConv`` of copies; (2) the traced graph is interpreted
    per node type at call time (no generated code), so every node type present in a layer's
    output flows on, and a node type no relation reaches keeps its root term (TypedGraphConv)
    or drops out (HeteroConv), never an error; (3) ``aggr`` other than "sum" uses HeteroConv.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"to_hetero needs a torch.nn.Module, got {type(model).__name__}")
    return TypedModel(model, metadata, aggr, param)

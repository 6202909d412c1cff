"""The shipped basis kinds of model configs, registered through ``sc.basis.register``.

Each builder takes the layer's basis table ``spec`` (a dict) and the data's ``Structure`` and
returns a ``Basis``, exactly as a user's own kind does. Content-based kinds (``attention``,
``graph_attention``) are computed by their layer from the data at each call: they are registered
with ``content=True`` and a builder that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._checks import int_in, number_in
from ..registry import KindError, Registry, Structure
from .base import Basis, Sparse, Stack
from .edges import FILL_REDUCTIONS, graph_hops
from .graph import chebyshev, diffusion, gcn, relational, sgc
from .grid import Grid
from .mining import single_and_mined_sorts

__all__ = ["BASES", "register", "build", "Structure", "KindError", "as_spec", "with_defaults",
           "Sampled", "sampled", "identity", "GRAPH_ATTENTION", "check"]

BASES = Registry("basis", group="structconv.bases")
"""The basis kinds usable as ``basis = { kind = "..." }`` in a model config: the shipped ones,
those registered from Python, and installed packages' entry points of ``structconv.bases``."""


@dataclass(frozen=True)
class Sampled:
    """How layers of a graph kind run on sampled mini-batches (a trait of the kind, read by the
    config schema, the sampler and the memory estimate alike): ``hops(spec)`` the sample hops
    one layer consumes (its receptive field), ``restriction(spec, basis)`` the
    ``sc.sampling.GraphRestriction`` kind and options of its built basis, as a dict with
    ``"kind"`` (``"block"``: only the edge set is restricted, for content-based kinds)."""

    hops: Callable[[dict], int]
    restriction: Callable[[dict, Basis | None], dict]


def register(kind: str, build=None, **traits):
    """Make ``kind`` usable as ``basis = { kind = "KIND", ... }`` in a model config.

    ``build(spec, structure) -> Basis``: ``spec`` is the layer's basis table (a dict, with the
    kind's ``defaults`` trait filled in), ``structure`` a ``Structure`` (``grid``,
    ``edge_index``, ``num_nodes``, ``edge_type``, ``num_relations``; ``None`` where the data has
    none). Traits: ``defaults`` (a dict of the table's defaults), ``content=True`` (computed from
    content by its layer), ``sampled`` (a ``Sampled``: the kind can be trained on sampled
    mini-batches), ``check`` (``check(spec, where)`` raising ``KindError`` on a bad table, run
    when a config is validated). Usable as a decorator.

    A kind registered from Python exists in that process only: a package that installs an
    entry point ``KIND = "module:build"`` in group ``structconv.bases`` makes it a kind of every
    process, the command line included (registering itself in ``module`` keeps its traits).
    """
    return BASES.register(kind, build, **traits)


def as_spec(spec) -> dict:
    """A layer's basis table as a dict: a bare kind name is ``{"kind": name}``."""
    return {"kind": spec} if isinstance(spec, str) else dict(spec)


def with_defaults(spec) -> dict:
    """The basis table with its kind's defaults filled in (the table's own values win)."""
    spec = as_spec(spec)
    kind = spec.get("kind")
    defaults = BASES.trait(kind, "defaults", {}) if isinstance(kind, str) else {}
    return {**defaults, **spec}


def sampled(spec) -> Sampled | None:
    """The ``Sampled`` trait of a basis table's kind (None: it cannot be sampled)."""
    kind = as_spec(spec).get("kind")
    return BASES.trait(kind, "sampled") if isinstance(kind, str) else None


def check(spec, where: str = "basis") -> None:
    """Check a basis table's options by its kind's ``check`` trait, if it has one: raises
    ``KindError`` naming ``where``, the key and the bad value (the config schema calls it).
    An installed kind not yet loaded is not imported for this: a config is validated by names,
    and its code runs when the model is built."""
    spec = as_spec(spec)
    kind = spec.get("kind")
    fn = BASES.trait(kind, "check", load=False) if isinstance(kind, str) else None
    if fn is not None:
        fn(spec, where)


def build(spec, structure: Structure, where: str = "basis") -> Basis:
    """The ``Basis`` a config's basis table (or kind name) describes, for this data."""
    spec = with_defaults(spec)
    kind = spec.get("kind")
    try:
        out = BASES.get(kind)(spec, structure)
    except (KindError, ValueError, TypeError) as e:
        raise type(e)(f"{where}: {e}") from None
    if not isinstance(out, Basis):
        raise KindError(f"{where}: the builder of basis kind {kind!r} returned "
                        f"{type(out).__name__}, not a sc.basis.Basis")
    return out


def identity(n: int, dtype=None, device=None) -> Sparse:
    """The (1, n, n) identity basis: every entry acts on itself alone (a 1x1 convolution)."""
    i = torch.arange(n, device=device)
    return Sparse(torch.stack([torch.zeros_like(i), i, i]),
                  torch.ones(n, dtype=dtype or torch.get_default_dtype(), device=device),
                  (1, n, n))


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise KindError(msg)


def _graph(structure: Structure, kind: str):
    _need(structure.edge_index is not None, f"a {kind} basis needs a graph dataset")
    return structure.edge_index, structure.num_nodes


#: polynomial orders a config may ask for: each is one sparse product per step, and past a
#: few dozen the powers of a normalised adjacency have long converged (over-smoothing)
MAX_ORDER = 1000


def _order(spec: dict, key: str, low: int = 1) -> int:
    v = spec[key]
    _need(isinstance(v, int) and not isinstance(v, bool) and low <= v <= MAX_ORDER,
          f"{key} must be an int in [{low}, {MAX_ORDER}], got {v!r}")
    return v


@register("grid", defaults={"kernel_size": 3, "stride": 1, "padding": 0, "dilation": 1,
                            "causal": False})
def _grid(spec, s: Structure) -> Basis:
    _need(s.grid is not None, "a grid basis needs grid-shaped input (images or sequences)")
    k, d, p = spec["kernel_size"], spec["dilation"], spec["padding"]
    if spec["causal"]:
        # causal 1-d shifts: output n sees inputs n-(k-1)*d .. n
        _need(len(s.grid) == 1, "causal shifts need a 1-d grid")
        p = [((int(k) - 1) * int(d), 0)]
    return Grid(tuple(s.grid), k, stride=spec["stride"], padding=p, dilation=d)


@register("identity")
def _identity(spec, s: Structure) -> Basis:
    n = s.entries
    _need(n is not None, "an identity basis needs grid or graph data")
    return identity(n)


def _restricted_as(kind: str, *keys: str) -> Callable[[dict, Basis | None], dict]:
    """A restriction of the sampler's ``kind`` whose options are the spec's ``keys``."""
    return lambda spec, basis: {"kind": kind, **{k: spec[k] for k in keys}}


@register("gcn", defaults={"add_self_loops": True, "normalize": True},
          sampled=Sampled(lambda spec: graph_hops("gcn"),
                          _restricted_as("gcn", "add_self_loops", "normalize")))
def _gcn(spec, s: Structure) -> Basis:
    ei, n = _graph(s, "gcn")
    return gcn(ei, n, add_self_loops=spec["add_self_loops"], normalize=spec["normalize"])


@register("sgc", defaults={"hops": 2},
          sampled=Sampled(lambda spec: graph_hops("sgc", spec["hops"]),
                          lambda spec, basis: {"kind": "sgc", "K": spec["hops"]}))
def _sgc(spec, s: Structure) -> Basis:
    # SGC: the single matrix S^hops of the GCN-normalised adjacency, K = 1
    ei, n = _graph(s, "sgc")
    return sgc(ei, n, _order(spec, "hops"))


@register("chebyshev", defaults={"K": 3, "normalization": "sym"},
          sampled=Sampled(lambda spec: graph_hops("chebyshev", spec["K"]),
                          _restricted_as("chebyshev", "K", "normalization")))
def _chebyshev(spec, s: Structure) -> Basis:
    ei, n = _graph(s, "chebyshev")
    return chebyshev(ei, n, _order(spec, "K"), normalization=spec["normalization"])


@register("diffusion", defaults={"K": 2, "normalization": "sym"},
          sampled=Sampled(lambda spec: graph_hops("diffusion", spec["K"]),
                          _restricted_as("diffusion", "K", "normalization")))
def _diffusion(spec, s: Structure) -> Basis:
    ei, n = _graph(s, "diffusion")
    return diffusion(ei, n, _order(spec, "K", low=0), normalization=spec["normalization"])


def _sort_length(sort) -> int:
    """Relations in a sort as a config writes it: an id, a list, or a dotted name."""
    if isinstance(sort, list):
        return len(sort)
    return sort.count(".") + 1 if isinstance(sort, str) else 1


def _relational_hops(spec: dict) -> int:
    sorts = spec["sorts"]
    if sorts == "mined":
        return spec["max_length"]
    if isinstance(sorts, list):
        return max(map(_sort_length, sorts), default=0)
    return 1


def _relational_restriction(spec: dict, basis) -> dict:
    # the built basis's sorts (a "mined" set is only known once mined)
    return {"kind": "relational", "sorts": basis.sorts, "identity": basis.identity,
            "normalization": spec["normalization"], "num_relations": basis.num_relations}


@register("relational", defaults={"sorts": "single", "normalization": "mean", "identity": True,
                                  "max_length": 2, "top": 10, "backtrack": True},
          sampled=Sampled(_relational_hops, _relational_restriction))
def _relational(spec, s: Structure) -> Basis:
    ei, n = _graph(s, "relational")
    _need(s.edge_type is not None, "a relational basis needs edge types")
    R = s.num_relations or 1
    sorts = spec["sorts"]
    # "single": one basis matrix per relation (R-GCN); "mined": those plus the `top` best
    # supported paths of length 2..max_length of the data's graph; else a list of sorts (ids,
    # name tuples or dotted strings)
    if sorts == "single":
        sorts = None
    elif sorts == "mined":
        sorts, _ = single_and_mined_sorts(
            ei, s.edge_type, n, R, relations=s.relations,
            max_length=_order(spec, "max_length", low=2), top=_order(spec, "top"),
            backtrack=bool(spec["backtrack"]))
    elif isinstance(sorts, list):
        sorts = [tuple(x) if isinstance(x, list) else x for x in sorts]
    else:
        raise KindError(f"sorts must be 'single', 'mined' or a list of sorts, got {sorts!r}")
    return relational(ei, s.edge_type, n, sorts, normalization=spec["normalization"],
                      identity=bool(spec["identity"]), num_relations=R,
                      relations=list(s.relations) if s.relations else None)


@register("stack")
def _stack(spec, s: Structure) -> Basis:
    parts = spec.get("parts")
    _need(isinstance(parts, list) and parts, "a stack needs parts = [...]")
    return Stack([build(p, s, f"parts.{i}") for i, p in enumerate(parts)])


def _content(spec, s: Structure) -> Basis:
    raise KindError(f"{spec.get('kind')} is computed from content by its layer, not a fixed "
                    "basis")


register("attention", _content, content=True,
         defaults={"heads": 1, "causal": False, "dim": None, "dropout": 0.0})
#: ``graph_attention``: GAT's mechanism (default), GATv2's (``v2``) or TransformerConv's
#: (``transformer``, with ``root_weight`` and its ``beta`` gate), over the graph's edges with
#: self loops (``add_self_loops``; None: yes, except for transformer); ``edge_dim`` (an int, or
#: "auto": the data's width) turns on edge features: the data's edge_attr, or its relation types
#: as ``relations`` = "onehot" (edge_dim = R) or "embedding" (edge_dim learned reals per
#: relation); the self loops' features come from ``fill_value`` (PyG's add_self_loops)
GRAPH_ATTENTION = {"heads": 1, "dropout": 0.0, "add_self_loops": None, "negative_slope": 0.2,
                   "edge_dim": None, "relations": "onehot", "fill_value": "mean", "v2": False,
                   "share_weights": False, "transformer": False, "root_weight": True,
                   "beta": False}
#: keys of a graph_attention table that only one mechanism reads: (key, the mechanism's flag)
_MECHANISM_KEYS = (("share_weights", "v2"), ("root_weight", "transformer"),
                   ("beta", "transformer"))


def _check_graph_attention(spec: dict, where: str) -> None:
    """A ``graph_attention`` table: known keys, their types and ranges, and the combinations
    that mean nothing (v2 with transformer, a key of a mechanism not chosen, edge-feature keys
    without edge_dim). Whether the data has edge features is checked when the model is built."""
    for k in spec:
        _need(k == "kind" or k in GRAPH_ATTENTION, f"{where}: unknown key {k!r} in a "
                                                   f"graph_attention table (known: "
                                                   f"{', '.join(GRAPH_ATTENTION)})")
    a = {**GRAPH_ATTENTION, **spec}
    _need(int_in(a["heads"], 1, 1_000_000),
          f"{where}.heads must be an int >= 1, got {a['heads']!r}")
    _need(number_in(a["dropout"], 0, 1, open_hi=True),
          f"{where}.dropout must be in [0, 1), got {a['dropout']!r}")
    _need(number_in(a["negative_slope"], -1e30, 1e30),
          f"{where}.negative_slope must be a number, got {a['negative_slope']!r}")
    for k in ("v2", "share_weights", "transformer", "root_weight", "beta"):
        _need(isinstance(a[k], bool), f"{where}.{k} must be true or false, got {a[k]!r}")
    _need(a["add_self_loops"] is None or isinstance(a["add_self_loops"], bool),
          f"{where}.add_self_loops must be true or false, got {a['add_self_loops']!r}")
    _need(not (a["v2"] and a["transformer"]),
          f"{where}: v2 and transformer are two mechanisms: choose one")
    for k, flag in _MECHANISM_KEYS:
        _need(k not in spec or a[flag], f"{where}.{k} applies to {flag} = true only")
    _need(not a["beta"] or a["root_weight"],
          f"{where}.beta gates the root term: it needs root_weight = true")
    _need("negative_slope" not in spec or not a["transformer"],
          f"{where}.negative_slope is GAT's LeakyReLU: transformer = true has none")
    dim, rel = a["edge_dim"], a["relations"]
    _need(dim is None or dim == "auto" or int_in(dim, 1, 1_000_000),
          f"{where}.edge_dim must be an int >= 1 or \"auto\" (the data's width), got {dim!r}")
    _need(rel in ("onehot", "embedding"),
          f"{where}.relations must be onehot or embedding, got {rel!r}")
    fill = a["fill_value"]
    _need(fill in FILL_REDUCTIONS or number_in(fill, -1e30, 1e30),
          f"{where}.fill_value must be a number or one of {', '.join(FILL_REDUCTIONS)}, got "
          f"{fill!r}")
    for k in ("relations", "fill_value"):
        _need(k not in spec or dim is not None,
              f"{where}.{k} describes edge features: it needs edge_dim")
    _need(not (rel == "embedding" and dim == "auto"),
          f"{where}: relations = \"embedding\" learns edge_dim reals per relation: give "
          "edge_dim as an int")
    loops = a["add_self_loops"] if a["add_self_loops"] is not None else not a["transformer"]
    _need("fill_value" not in spec or loops,
          f"{where}.fill_value gives the self loops' edge features, but the layer adds none "
          "(add_self_loops = false, or transformer without add_self_loops = true)")


register("graph_attention", _content, content=True, defaults=GRAPH_ATTENTION,
         sampled=Sampled(lambda spec: 1, lambda spec, basis: {"kind": "block"}),
         check=_check_graph_attention)

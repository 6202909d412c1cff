"""The shipped basis kinds of model configs, registered through ``sc.basis.register``.

Each builder takes the layer's basis table ``spec`` (a dict) and the data's ``Structure`` and
returns a ``Basis``, exactly as a user's own kind does. Content-based kinds (``attention``,
``graph_attention``) are computed by their layer from the data at each call: they are registered
with ``content=True`` and a builder that says so.
"""

from __future__ import annotations

import torch

from ..registry import KindError, Registry, Structure
from .base import Basis, Sparse, Stack
from .graph import chebyshev, diffusion, gcn, relational, sgc
from .grid import Grid
from .mining import mine_sorts

__all__ = ["BASES", "register", "build", "Structure", "KindError"]

#: the basis kinds usable as ``basis = { kind = "..." }`` in a model config
BASES = Registry("basis")


def register(kind: str, build=None, **traits):
    """Make ``kind`` usable as ``basis = { kind = "KIND", ... }`` in a model config.

    ``build(spec, structure) -> Basis``: ``spec`` is the layer's basis table (a dict),
    ``structure`` a ``Structure`` (``grid``, ``edge_index``, ``num_nodes``, ``edge_type``,
    ``num_relations``; ``None`` where the data has none). Usable as a decorator.
    """
    return BASES.register(kind, build, **traits)


def build(spec, structure: Structure, where: str = "basis") -> Basis:
    """The ``Basis`` a config's basis table (or kind name) describes, for this data."""
    spec = {"kind": spec} if isinstance(spec, str) else dict(spec)
    kind = spec.get("kind")
    try:
        out = BASES.get(kind)(spec, structure)
    except (KindError, ValueError, TypeError) as e:
        raise type(e)(f"{where}: {e}") from None
    if not isinstance(out, Basis):
        raise KindError(f"{where}: the builder of basis kind {kind!r} returned "
                        f"{type(out).__name__}, not a sc.basis.Basis")
    return out


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise KindError(msg)


def _graph(structure: Structure, kind: str):
    _need(structure.edge_index is not None, f"a {kind} basis needs a graph dataset")
    return structure.edge_index, structure.num_nodes


#: polynomial orders a config may ask for: each is one sparse product per step, and past a
#: few dozen the powers of a normalised adjacency have long converged (over-smoothing)
MAX_ORDER = 1000


def _order(spec: dict, key: str, default: int, low: int = 1) -> int:
    v = spec.get(key, default)
    _need(isinstance(v, int) and not isinstance(v, bool) and low <= v <= MAX_ORDER,
          f"{key} must be an int in [{low}, {MAX_ORDER}], got {v!r}")
    return v


@register("grid")
def _grid(spec, s: Structure) -> Basis:
    _need(s.grid is not None, "a grid basis needs grid-shaped input (images or sequences)")
    k, d = spec.get("kernel_size", 3), spec.get("dilation", 1)
    p = spec.get("padding", 0)
    if spec.get("causal"):
        # causal 1-d shifts: output n sees inputs n-(k-1)*d .. n
        _need(len(s.grid) == 1, "causal shifts need a 1-d grid")
        p = [((int(k) - 1) * int(d), 0)]
    return Grid(tuple(s.grid), k, stride=spec.get("stride", 1), padding=p, dilation=d)


@register("identity")
def _identity(spec, s: Structure) -> Basis:
    n = s.entries
    _need(n is not None, "an identity basis needs grid or graph data")
    idx = torch.arange(n)
    return Sparse(torch.stack([torch.zeros_like(idx), idx, idx]), torch.ones(n), (1, n, n))


@register("gcn")
def _gcn(spec, s: Structure) -> Basis:
    ei, n = _graph(s, "gcn")
    return gcn(ei, n, add_self_loops=spec.get("add_self_loops", True),
               normalize=spec.get("normalize", True))


@register("sgc")
def _sgc(spec, s: Structure) -> Basis:
    # SGC: the single matrix S^hops of the GCN-normalised adjacency, K = 1
    ei, n = _graph(s, "sgc")
    return sgc(ei, n, _order(spec, "hops", 2))


@register("chebyshev")
def _chebyshev(spec, s: Structure) -> Basis:
    ei, n = _graph(s, "chebyshev")
    return chebyshev(ei, n, _order(spec, "K", 3), normalization=spec.get("normalization", "sym"))


@register("diffusion")
def _diffusion(spec, s: Structure) -> Basis:
    ei, n = _graph(s, "diffusion")
    return diffusion(ei, n, _order(spec, "K", 2, low=0),
                     normalization=spec.get("normalization", "sym"))


@register("relational")
def _relational(spec, s: Structure) -> Basis:
    ei, n = _graph(s, "relational")
    _need(s.edge_type is not None, "a relational basis needs edge types")
    R = s.num_relations or 1
    sorts = spec.get("sorts", "single")
    # "single": one basis matrix per relation (R-GCN); "mined": those plus the `top` best
    # supported paths of length 2..max_length of the data's graph; else a list of sorts (ids,
    # name tuples or dotted strings)
    if sorts == "single":
        sorts = None
    elif sorts == "mined":
        mined = mine_sorts(ei, s.edge_type, n, num_relations=R, relations=s.relations,
                           max_length=_order(spec, "max_length", 2, low=2),
                           top=_order(spec, "top", 10, low=1), confidence=False,
                           backtrack=bool(spec.get("backtrack", True)))
        sorts = [(r,) for r in range(R)] + [m.sort for m in mined]
    elif isinstance(sorts, list):
        sorts = [tuple(x) if isinstance(x, list) else x for x in sorts]
    else:
        raise KindError(f"sorts must be 'single', 'mined' or a list of sorts, got {sorts!r}")
    return relational(ei, s.edge_type, n, sorts, normalization=spec.get("normalization", "mean"),
                      identity=bool(spec.get("identity", True)), num_relations=R,
                      relations=list(s.relations) if s.relations else None)


@register("stack")
def _stack(spec, s: Structure) -> Basis:
    parts = spec.get("parts")
    _need(isinstance(parts, list) and parts, "a stack needs parts = [...]")
    return Stack([build(p, s, f"parts.{i}") for i, p in enumerate(parts)])


def _content(spec, s: Structure) -> Basis:
    raise KindError(f"{spec.get('kind')} is computed from content by its layer, not a fixed "
                    "basis")


register("attention", _content, content=True)
register("graph_attention", _content, content=True)

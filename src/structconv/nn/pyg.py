"""PyG-facing side of the graph layers: ``MessagePassing`` instances, explain masks, checkpoints.

PyG's tooling recognises a graph layer only by ``isinstance(m, MessagePassing)``: ``to_hetero``
replicates such a module per edge type (any other per node type) and ``Explainer`` sets its edge
masks on them. So, when PyG is loaded (``torch_geometric`` in ``sys.modules`` when the layer is
built), each structconv graph layer is built as an instance of a subclass of its own class and
of PyG's ``MessagePassing`` (``structconv.nn.pyg.GCNConv`` etc.): ``isinstance`` holds for both,
the structconv engine still computes every output, and PyG is never imported by structconv
itself (it stays optional; a program that does not load it pays nothing). A layer built before
PyG was loaded is converted in place by ``pyg_compatible(model)``.

``Explainer``'s edge masks are honoured as PyG's ``explain_message`` applies them: each message
(an operator entry, or an attention-weighted message) of an input edge is scaled by its mask,
the self loops a layer adds by 1. ``pyg_state_dict`` gives a model's ``state_dict`` under
PyG's parameter names; PyG's names load into structconv's layers directly.
"""

from __future__ import annotations

import sys

from torch import Tensor, nn

__all__ = ["PyGCompatible", "pyg_compatible", "pyg_state_dict", "message_passing_class",
           "is_lazy", "lazy_parameter"]

#: structconv class -> its MessagePassing subclass (built once PyG is loaded)
_CLASSES: dict[type, type] = {}


def _pyg_loaded() -> bool:
    return "torch_geometric" in sys.modules


#: structconv graph layer classes by name (to find their MessagePassing classes by name)
_LAYERS: dict[str, type] = {}


class PyGCompatible(nn.Module):
    """Base of the structconv graph layers: built as a ``MessagePassing`` when PyG is loaded
    (module doc), reads PyG's explain masks, maps PyG's parameter names when loading."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not getattr(cls, "_is_message_passing", False) and not cls.__name__.startswith("_"):
            _LAYERS.setdefault(cls.__name__, cls)

    def __new__(cls, *args, **kwargs):
        if _pyg_loaded() and not getattr(cls, "_is_message_passing", False):
            mp = message_passing_class(cls)
            if mp is not None:
                cls = mp
        return super().__new__(cls)

    def _pyg_keys(self) -> dict[str, str]:
        """{PyG name: structconv name} of this layer's parameters (relative names)."""
        return {}

    def _explain_mask(self) -> Tensor | None:
        """The explain mask set by PyG's ``Explainer`` (sigmoid applied as PyG does), or None."""
        d = self.__dict__
        if not d.get("_explain", False):
            return None
        m = self._parameters.get("_edge_mask", d.get("_edge_mask"))
        if m is None:
            return None
        return m.sigmoid() if d.get("_apply_sigmoid", True) else m

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        keys = self._pyg_keys()
        for pyg, ours in keys.items():
            if prefix + pyg in state_dict and prefix + ours not in state_dict:
                t = state_dict.pop(prefix + pyg)
                state_dict[prefix + ours] = self._from_pyg_tensor(ours, t)
        for name, p in self._materialize_targets():
            t = state_dict.get(prefix + name)
            if t is not None and is_lazy(p):
                p.materialize(t.shape)
                self._sized_from(name, t)
        for m in self.modules():  # a lazy Linear's in_features, now known
            if isinstance(m, nn.Linear) and m.in_features == -1 and not is_lazy(m.weight):
                m.in_features = m.weight.shape[1]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def _from_pyg_tensor(self, ours: str, t: Tensor) -> Tensor:
        """A PyG parameter as the structconv parameter ``ours`` (default: as it is)."""
        return t

    def _to_pyg_tensors(self, sd: dict, prefix: str) -> None:
        """Rename this layer's entries of ``sd`` to PyG's names, in place."""

    def _materialize_targets(self):
        """(name, parameter) of the lazy parameters a loaded checkpoint may size."""
        return [(n, p) for n, p in self.named_parameters(recurse=True) if is_lazy(p)]

    def _sized_from(self, name: str, t: Tensor) -> None:
        """Record the input size a checkpoint's parameter ``name`` fixed (lazy layers)."""


def is_lazy(p) -> bool:
    """Whether ``p`` is a not yet sized (lazy) parameter."""
    return isinstance(p, nn.parameter.UninitializedParameter)


def lazy_parameter() -> nn.Parameter:
    """A parameter sized on the layer's first call (torch's ``UninitializedParameter``)."""
    return nn.parameter.UninitializedParameter()


def message_passing_class(cls: type) -> type | None:
    """The subclass of ``cls`` and PyG's ``MessagePassing`` (None if PyG has none)."""
    hit = _CLASSES.get(cls)
    if hit is not None:
        return hit
    try:
        from torch_geometric.nn import MessagePassing
    except ImportError:  # pragma: no cover - a PyG without MessagePassing
        return None
    ns = {"__module__": __name__, "__qualname__": cls.__name__, "_is_message_passing": True,
          "__doc__": cls.__doc__, "__repr__": nn.Module.__repr__}
    mp = type(cls.__name__, (cls, MessagePassing), ns)
    _CLASSES[cls] = mp
    return mp


def __getattr__(name: str):
    # unpickling a layer built as a MessagePassing finds its class here (the structconv
    # classes registered themselves when ``structconv.nn``, imported first, defined them)
    cls = _LAYERS.get(name)
    mp = None if cls is None else message_passing_class(cls)
    if mp is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return mp


def pyg_compatible(model: nn.Module) -> nn.Module:
    """Make every structconv graph layer of ``model`` a PyG ``MessagePassing`` in place (for
    layers built before PyG was loaded); returns ``model``. Needs PyG."""
    from torch_geometric.nn import MessagePassing

    for m in model.modules():
        if isinstance(m, PyGCompatible) and not isinstance(m, MessagePassing):
            saved = dict(m.__dict__)
            m.__class__ = message_passing_class(type(m))
            MessagePassing.__init__(m)  # PyG's bookkeeping (hooks, inspector, explain state)
            aggr_module = m._modules["aggr_module"]
            m.__dict__.update(saved)  # the layer's own state (parameters, options) again
            m._modules.setdefault("aggr_module", aggr_module)  # a layer's own aggregation stays
    return model


def pyg_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """``model.state_dict()`` with each structconv graph layer's entries under PyG's names
    (what the PyG layer of the same name and options loads)."""
    sd = model.state_dict()
    for name, m in model.named_modules():
        if isinstance(m, PyGCompatible):
            m._to_pyg_tensors(sd, f"{name}." if name else "")
    return sd


def explain_scale(mask: Tensor | None, keep: Tensor | None) -> Tensor | None:
    """An edge mask (E,) restricted to the edges a layer keeps (its added self loops take 1)."""
    if mask is None:
        return None
    return mask if keep is None else mask[keep]


def check_mask(mask: Tensor, E: int, who: str) -> None:
    if mask.dim() != 1 or mask.shape[0] != E:
        raise ValueError(f"{who}: the explain edge mask must be ({E},), one entry per input "
                         f"edge, got {tuple(mask.shape)}")


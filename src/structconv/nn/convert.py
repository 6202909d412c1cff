"""Converters: ``from_torch`` / ``from_pyg`` / ``to_torch`` dispatch on the module's class.

Each family registers its converters (grid layers, attention, graph layers) from its own module,
so this file stays a small dispatcher.
"""

from __future__ import annotations

import importlib

from torch import nn

__all__ = ["from_torch", "from_pyg", "to_torch", "register_torch", "register_pyg"]

_TORCH: dict[type, object] = {}
_PYG: dict[str, object] = {}
_TO_TORCH: list = []
# modules whose import registers converters (loaded lazily: PyG is optional)
_PROVIDERS = ("structconv.nn.grid", "structconv.nn.attention", "structconv.nn.graph",
              "structconv.nn.gin", "structconv.nn.pool")


def _load():
    for name in _PROVIDERS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:  # a provider not written yet, or an optional extra
            if e.name != name:
                raise


def register_torch(*classes):
    """Decorator: register a converter for torch.nn classes."""
    def deco(fn):
        for c in classes:
            _TORCH[c] = fn
        return fn
    return deco


def register_pyg(*names):
    """Decorator: register a converter for PyG classes, by class name."""
    def deco(fn):
        for n in names:
            _PYG[n] = fn
        return fn
    return deco


def register_to_torch(fn):
    """Register a converter back to torch.nn: ``fn(module)`` returns a module or None."""
    _TO_TORCH.append(fn)
    return fn


#: the methods whose override in a subclass changes what a converted layer computes (PyG
#: writes a ``propagate`` into every subclass itself, so that one is not a sign)
_OWN_COMPUTATION = ("forward", "_conv_forward", "message", "aggregate", "update",
                    "message_and_aggregate", "edge_update")


def _refuse_overrides(module: nn.Module, cls: type, who: str) -> None:
    """A subclass of a convertible layer that computes in its own way is refused, never
    converted as its parent (which would silently drop the override)."""
    mro = type(module).__mro__
    for sub in mro[:mro.index(cls)]:
        own = [m for m in _OWN_COMPUTATION if m in sub.__dict__]
        if own:
            raise ValueError(f"{who}: {type(module).__name__} subclasses {cls.__name__} and "
                             f"overrides {', '.join(own)}; only {cls.__name__}'s own computation "
                             "converts")


def from_torch(module: nn.Module) -> nn.Module:
    """A structconv module with the same call signature and outputs as a torch.nn module."""
    _load()
    for cls in type(module).__mro__:
        if cls in _TORCH:
            _refuse_overrides(module, cls, "from_torch")
            return _TORCH[cls](module)
    raise TypeError(
        f"from_torch does not know {type(module).__name__}; supported: "
        f"{sorted(c.__name__ for c in _TORCH)}"
    )


def from_pyg(module: nn.Module) -> nn.Module:
    """A structconv module called like the PyG layer, with the same outputs in eval mode."""
    _load()
    for cls in type(module).__mro__:
        if cls.__name__ in _PYG and cls.__module__.startswith("torch_geometric"):
            _refuse_overrides(module, cls, "from_pyg")
            return _PYG[cls.__name__](module)
    raise TypeError(
        f"from_pyg does not know {type(module).__name__}; supported: {sorted(_PYG)}"
    )


def to_torch(module: nn.Module) -> nn.Module:
    """The torch.nn module equivalent to a structconv layer, where torch can hold its theta."""
    _load()
    for fn in _TO_TORCH:
        out = fn(module)
        if out is not None:
            return out
    raise TypeError(f"to_torch cannot express {type(module).__name__} as a torch.nn module")

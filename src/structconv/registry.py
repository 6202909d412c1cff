"""Named kinds: one registry for basis families and one for parameter forms.

``sc.basis.register(kind, build)`` makes ``basis = { kind = "KIND", ... }`` usable in a model
config; ``sc.params.register(name, build)`` does the same for ``param = "NAME"``. A kind may also
be written ``"package.module:function"``: that function is imported on first use and called as a
registered ``build`` is. The shipped kinds register themselves exactly as a user's would.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Structure", "Registry", "KindError"]


class KindError(ValueError):
    """An unknown kind, or an import-path kind that cannot be imported (one-line message)."""


@dataclass(frozen=True)
class Structure:
    """What a config's data offers a basis builder (``None`` where the data has none).

    ``grid``: the input's grid shape (e.g. ``(28, 28)`` for images, ``(L,)`` for sequences);
    ``edge_index`` (2, E), ``num_nodes``, ``edge_type`` (E,), ``num_relations``: a graph's.
    ``relations``: relation names (index = relation id) where the data names them.
    ``edge_attr`` (E, D): the graph's edge features, where it has them.
    """

    grid: tuple[int, ...] | None = None
    edge_index: Any = None
    num_nodes: int | None = None
    edge_type: Any = None
    num_relations: int | None = None
    relations: tuple[str, ...] | None = None
    edge_attr: Any = None

    @property
    def entries(self) -> int | None:
        """The number of input entries M: grid cells or graph nodes."""
        if self.grid is not None:
            n = 1
            for s in self.grid:
                n *= int(s)
            return n
        return self.num_nodes


class Registry:
    """A name -> builder table with import-path names and errors listing the closest names."""

    def __init__(self, what: str):
        self.what = what
        self._builders: dict[str, Callable] = {}
        #: per kind, free-form facts the config layer reads (e.g. ``content=True`` for kinds whose
        #: basis is computed from content by the layer, not built from the data alone)
        self.traits: dict[str, dict] = {}

    def register(self, kind: str, build: Callable | None = None, **traits):
        """Register ``build`` under ``kind`` (usable as a decorator when ``build`` is omitted)."""
        if not isinstance(kind, str) or not kind or ":" in kind:
            raise ValueError(f"{self.what} kind must be a non-empty name without ':', got {kind!r}")

        def deco(fn: Callable) -> Callable:
            if not callable(fn):
                raise TypeError(f"{self.what} builder for {kind!r} must be callable, "
                                f"got {type(fn).__name__}")
            self._builders[kind] = fn
            self.traits[kind] = dict(traits)
            return fn

        return deco if build is None else deco(build)

    def __contains__(self, kind) -> bool:
        return isinstance(kind, str) and (kind in self._builders or ":" in kind)

    def kinds(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._builders)

    def trait(self, kind: str, name: str, default=None):
        return self.traits.get(kind, {}).get(name, default)

    def get(self, kind: str) -> Callable:
        """The builder of ``kind``: a registered name or ``"package.module:function"``."""
        if not isinstance(kind, str):
            raise KindError(f"{self.what} kind must be a string, got {kind!r}")
        if kind in self._builders:
            return self._builders[kind]
        if ":" in kind:
            return self._import(kind)
        close = difflib.get_close_matches(kind, self.kinds(), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise KindError(f"unknown {self.what} kind {kind!r}{hint}; known: "
                        f"{', '.join(self.kinds())}, or 'package.module:function'")

    def _import(self, path: str) -> Callable:
        mod_name, _, attr = path.partition(":")
        try:
            mod = importlib.import_module(mod_name)
        except Exception as e:  # noqa: BLE001 - any import failure is one line for the user
            raise KindError(f"{self.what} kind {path!r}: cannot import {mod_name!r} "
                            f"({type(e).__name__}: {e})") from None
        fn = mod
        for part in attr.split("."):
            fn = getattr(fn, part, None)
            if fn is None:
                raise KindError(f"{self.what} kind {path!r}: module {mod_name!r} has no "
                                f"attribute {attr!r}")
        if not callable(fn):
            raise KindError(f"{self.what} kind {path!r}: {attr!r} is not callable")
        return fn

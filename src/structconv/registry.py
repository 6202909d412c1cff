"""Named kinds: one registry for basis families and one for parameter forms.

``sc.basis.register(kind, build)`` makes ``basis = { kind = "KIND", ... }`` usable in a model
config; ``sc.params.register(name, build)`` does the same for ``param = "NAME"``. The shipped
kinds register themselves exactly as a user's would. Installed packages add kinds through entry
points (groups ``structconv.bases`` and ``structconv.params``: entry name = the kind, value =
``module:function``, a ``build`` as ``register``'s), loaded on first use, so the command line
sees them by name. A kind may also be written ``"package.module:function"``: that function is
imported on first use and called as a registered ``build`` is.

A config is code: an import path runs the module it names. A run directory's config is data:
it is read inside ``untrusted(source)``, where import paths are refused (``ImportRefused``)
unless the user allows them (``allow_imports=True``, ``--allow-imports`` or
``STRUCTCONV_ALLOW_IMPORTS=1``); shipped, registered and installed kinds work as always.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import importlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any

__all__ = ["Structure", "Registry", "KindError", "ImportRefused", "untrusted",
           "imports_allowed", "check_import", "ALLOW_IMPORTS_ENV"]

#: the environment variable that lets a run directory's config import what it names ("1")
ALLOW_IMPORTS_ENV = "STRUCTCONV_ALLOW_IMPORTS"


class KindError(ValueError):
    """An unknown kind, or an import-path kind that cannot be imported (one-line message)."""


class ImportRefused(KindError):
    """A config read as data (a run directory's) names an import the user has not allowed."""


#: (source, allowed) of the config being read as data; None while configs are code
_DATA: contextvars.ContextVar[tuple[str, bool] | None] = contextvars.ContextVar(
    "structconv_config_as_data", default=None)


@contextlib.contextmanager
def untrusted(source, allow_imports: bool = False) -> Iterator[None]:
    """Within: the config being validated and built comes from ``source`` (a run directory)
    and is data, not code: import-path kinds are refused (``ImportRefused``) unless
    ``allow_imports``, an enclosing ``untrusted`` that allows them, or
    ``$STRUCTCONV_ALLOW_IMPORTS=1``. Shipped, registered and installed (entry-point) kinds
    are unaffected. Held per thread / task (a context variable)."""
    outer = _DATA.get()
    allowed = bool(allow_imports) or (outer is not None and outer[1])
    token = _DATA.set((str(source), allowed))
    try:
        yield
    finally:
        _DATA.reset(token)


def imports_allowed() -> bool:
    """Whether a config may import what it names here: always outside ``untrusted``."""
    state = _DATA.get()
    return state is None or state[1] or os.environ.get(ALLOW_IMPORTS_ENV, "") == "1"


def check_import(what: str) -> None:
    """Raise ``ImportRefused`` (naming ``what`` and the config's source) when a config read as
    data would import ``what``; nothing otherwise."""
    if imports_allowed():
        return
    source = _DATA.get()[0]
    raise ImportRefused(f"refused to import {what} named by {source}: a run directory is data, "
                        "not code; if you trust it, allow its imports with --allow-imports "
                        f"(Python: allow_imports=True) or {ALLOW_IMPORTS_ENV}=1")


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


def _failure(e: BaseException) -> str:
    """What went wrong while importing a plug-in, in a few words."""
    if isinstance(e, SystemExit):
        return f"SystemExit: its module called sys.exit({e.code!r}) while being imported"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _dist_name(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) or "an unnamed distribution"


class Registry:
    """A name -> builder table: registered kinds, installed entry points of ``group`` (loaded
    on first use) and import-path names, with errors listing the closest names."""

    def __init__(self, what: str, group: str | None = None):
        self.what = what
        #: the entry-point group whose entries are installed kinds (None: no plug-ins)
        self.group = group
        self._builders: dict[str, Callable] = {}
        #: per kind, free-form facts the config layer reads (e.g. ``content=True`` for kinds whose
        #: basis is computed from content by the layer, not built from the data alone)
        self.traits: dict[str, dict] = {}
        # entry points load once, whichever thread asks first
        self._lock = threading.RLock()

    def register(self, kind: str, build: Callable | None = None, **traits):
        """Register ``build`` under ``kind`` (usable as a decorator when ``build`` is omitted)."""
        if not isinstance(kind, str) or not kind or ":" in kind:
            raise ValueError(f"{self.what} kind must be a non-empty name without ':', got {kind!r}")

        def deco(fn: Callable) -> Callable:
            if not callable(fn):
                raise TypeError(f"{self.what} builder for {kind!r} must be callable, "
                                f"got {type(fn).__name__}")
            with self._lock:
                self._builders[kind] = fn
                self.traits[kind] = dict(traits)
            return fn

        return deco if build is None else deco(build)

    def unregister(self, kind: str) -> None:
        """Forget a registered kind (an installed one loads again on its next use)."""
        with self._lock:
            self._builders.pop(kind, None)
            self.traits.pop(kind, None)

    def installed(self) -> dict[str, list[metadata.EntryPoint]]:
        """The installed kinds: entry points of ``group`` by name (read afresh on each call,
        so a package installed while the process runs is seen; nothing is imported)."""
        if self.group is None:
            return {}
        out: dict[str, list[metadata.EntryPoint]] = {}
        for ep in metadata.entry_points(group=self.group):
            if ep.name and ":" not in ep.name:
                out.setdefault(ep.name, []).append(ep)
        return out

    def __contains__(self, kind) -> bool:
        """Whether ``kind`` names a builder usable here: registered, installed, or an import
        path where imports are allowed (see ``untrusted``)."""
        if not isinstance(kind, str):
            return False
        if kind in self._builders:
            return True
        if ":" in kind:
            return imports_allowed()
        return kind in self.installed()

    def kinds(self) -> list[str]:
        """The registered and installed names, sorted."""
        return sorted(set(self._builders) | set(self.installed()))

    def trait(self, kind: str, name: str, default=None, *, load: bool = True):
        """A trait of ``kind`` (an installed kind is loaded to learn its traits unless
        ``load=False``: then only a kind already registered in this process has traits)."""
        if load and isinstance(kind, str) and kind not in self._builders and ":" not in kind:
            entries = self.installed().get(kind)
            if entries:
                self._load(kind, entries)
        return self.traits.get(kind, {}).get(name, default)

    def get(self, kind: str) -> Callable:
        """The builder of ``kind``: a registered name, an installed entry point's, or
        ``"package.module:function"`` (imported where imports are allowed)."""
        if not isinstance(kind, str):
            raise KindError(f"{self.what} kind must be a string, got {kind!r}")
        if kind in self._builders:
            return self._builders[kind]
        if ":" in kind:
            check_import(f"{self.what} kind {kind!r}")
            return self._import(kind)
        entries = self.installed().get(kind)
        if entries:
            return self._load(kind, entries)
        close = difflib.get_close_matches(kind, self.kinds(), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        plug = f", a kind installed under entry-point group {self.group!r}" if self.group else ""
        raise KindError(f"unknown {self.what} kind {kind!r}{hint}; known: "
                        f"{', '.join(self.kinds())}{plug}, or 'package.module:function'")

    def _load(self, kind: str, entries: list[metadata.EntryPoint]) -> Callable:
        """Import an installed kind's entry point once and register what it names (keeping
        the traits its module gave by registering the kind itself on import)."""
        values = sorted({(ep.value, _dist_name(ep)) for ep in entries})
        if len({v for v, _ in values}) > 1:
            raise KindError(f"{self.what} kind {kind!r} is installed twice under entry-point "
                            f"group {self.group!r}: " + "; ".join(
                                f"{v} by {d}" for v, d in values) + "; uninstall one")
        ep = entries[0]
        with self._lock:
            if kind in self._builders:
                return self._builders[kind]
            where = (f"{self.what} kind {kind!r}: entry point {ep.name} = {ep.value} of "
                     f"{_dist_name(ep)} (group {self.group})")
            try:
                fn = ep.load()
            except BaseException as e:  # noqa: BLE001 - any failure is one line naming the entry
                # SystemExit and KeyboardInterrupt included: a module that calls sys.exit(0) at
                # import would otherwise end the command with success, having done nothing
                raise KindError(f"{where} failed to load ({_failure(e)})") from None
            if not callable(fn):
                raise KindError(f"{where} is {type(fn).__name__}, not a callable builder")
            self._builders[kind] = fn
            self.traits[kind] = self.traits.get(kind, {})
            return fn

    def _import(self, path: str) -> Callable:
        mod_name, _, attr = path.partition(":")
        try:
            mod = importlib.import_module(mod_name)
        except BaseException as e:  # noqa: BLE001 - any import failure is one line, as above
            raise KindError(f"{self.what} kind {path!r}: cannot import {mod_name!r} "
                            f"({_failure(e)})") from None
        fn = mod
        for part in attr.split("."):
            fn = getattr(fn, part, None)
            if fn is None:
                raise KindError(f"{self.what} kind {path!r}: module {mod_name!r} has no "
                                f"attribute {attr!r}")
        if not callable(fn):
            raise KindError(f"{self.what} kind {path!r}: {attr!r} is not callable")
        return fn

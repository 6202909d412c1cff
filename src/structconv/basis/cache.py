"""The structure cache of the graph family: a built basis kept per graph and options.

A graph layer called every epoch on the same ``edge_index`` should normalise it once. ``cached``
keeps the built basis in a small LRU keyed on the *identity* of the ``edge_index`` /
``edge_weight`` / ``edge_type`` tensors (``id`` checked against a weak reference, so a freed
tensor whose id is reused never matches), their ``_version`` counters (an in-place edit
invalidates), shapes, dtypes, devices, data pointers and every option, and checked against the
content (an edit that bypasses the version counter misses): a key tensor of up to ``COPY_LIMIT``
entries is kept as a copy and compared bit for bit, a larger one by a checksum. Keying on
identity costs O(1) per call where a content hash alone would have to be trusted.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from .base import Basis

#: dtypes whose checksum numpy computes on the tensor's memory (no torch dispatch)
_NUMPY_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
                 torch.float64, torch.float32, torch.float16)

#: integer dtypes of the same width, to compare floating entries bit for bit (NaN equals itself)
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}

#: key tensors up to this many entries are kept as a copy and compared whole: one memcmp-speed
#: read (Cora's 21k-entry edge list: ~10-40 us, where the checksum's reduction cost ~100-200 us
#: right after a layer's GEMM had pushed the list out of cache). Larger ones are checked by the
#: checksum, whose cost is then small against the propagation, and whose memory stays 65 numbers
#: (a copy of a 100M-edge list would be 1.6 GB).
COPY_LIMIT = 1 << 22

__all__ = ["GraphCache", "cached", "clear_graph_cache", "graph_cache_info", "STRUCTURES",
           "COPY_LIMIT"]


def _bits(t: Tensor) -> Tensor:
    """``t`` viewed as integers of its width when floating (bitwise equality), else itself."""
    d = _BITS.get(t.dtype)
    return t if d is None else t.view(d)


class GraphCache:
    """A small LRU of built bases keyed on tensor identity + version + options (module doc)."""

    def __init__(self, maxsize: int = 16):
        self.maxsize = maxsize
        self.entries: OrderedDict = OrderedDict()
        self._lock = threading.RLock()  # re-entrant: a weakref callback may fire under it
        self.hits = self.misses = 0

    @staticmethod
    def tensor_key(t):
        """The identity part of a key tensor's key (None stays None)."""
        if t is None:
            return None
        if not isinstance(t, Tensor):
            return ("object", id(t))  # never hits: only tensors are keyed by identity
        return (id(t), t._version, tuple(t.shape), t.dtype, str(t.device), t.data_ptr())

    @staticmethod
    def fingerprint(tensors: tuple) -> list:
        """A content checksum of the key tensors, so that an edit that bumps no version counter
        (through ``.numpy()``, ``.data`` or another tensor on the same storage) misses the
        cache: the column sums of the flattened entries laid out in 64 columns, and the sum of
        the rest. Any change of one entry, and any exchange of two entries whose distance is
        not a multiple of 64, changes it; one read of the entries (10M edges: ~4.5 ms, against
        ~0.5 s to build the basis). A CPU tensor is summed by numpy on its memory: torch's
        half-dozen small ops cost ~60 us at Cora's size (more when the thread pool sleeps after
        a GEMM), numpy's ~10 us."""
        out: list = []
        for t in tensors:
            if not isinstance(t, Tensor):
                out.append(None)
                continue
            # floating entries as the integers of their bits: bitwise, so NaN equals itself
            flat = _bits(t.detach()).reshape(-1)
            if flat.device.type == "cpu" and flat.dtype in _NUMPY_DTYPES:
                a = flat.resolve_conj().resolve_neg().numpy()
                a = a.astype(np.float64 if a.dtype.kind == "f" else np.int64, copy=False)
                n = a.size // 64 * 64
                out.append(np.concatenate([a[:n].reshape(-1, 64).sum(0),
                                           a[n:].sum(keepdims=True)]))
                continue
            flat = flat.to(torch.float64) if flat.is_floating_point() else flat.to(torch.int64)
            n = flat.numel() // 64 * 64
            out.append(torch.cat([flat[:n].view(-1, 64).sum(0), flat[n:].sum().reshape(1)]))
        return out

    @staticmethod
    def snapshot(tensors: tuple) -> list:
        """What a hit is checked against: per key tensor a copy (up to ``COPY_LIMIT`` entries,
        plain dtypes), else its ``fingerprint``; nothing for a non-tensor."""
        out: list = []
        for t in tensors:
            if not isinstance(t, Tensor):
                out.append(("none", None))
            elif t.numel() <= COPY_LIMIT and (
                    t.dtype in _BITS or not (t.is_floating_point() or t.is_complex())):
                out.append(("copy", _bits(t.detach().clone())))
            else:
                out.append(("sum", GraphCache.fingerprint((t,))[0]))
        return out

    @staticmethod
    def unchanged(snap: list, tensors: tuple) -> bool:
        """Whether ``tensors`` still hold the content their ``snapshot`` saw."""
        for (how, v), t in zip(snap, tensors):
            if how == "copy":
                # torch.equal: one pass that stops at the first difference
                if not torch.equal(_bits(t.detach()), v):
                    return False
            elif how == "sum" and not GraphCache.same([v], GraphCache.fingerprint((t,))):
                return False
        return True

    @staticmethod
    def same(a: list, b: list) -> bool:
        """Whether two fingerprints are equal."""
        return all((x is None and y is None) or (
            type(x) is type(y) and (np.array_equal(x, y) if isinstance(x, np.ndarray)
                                    else torch.equal(x, y))) for x, y in zip(a, b))

    def get(self, tensors: tuple, options: tuple, build: Callable[[], Basis]) -> Basis:
        """The basis cached for ``tensors`` and ``options``, or ``build()`` (then kept)."""
        key = (tuple(self.tensor_key(t) for t in tensors), options)
        with self._lock:
            hit = self.entries.get(key)
            if hit is not None:
                refs, basis, snap = hit
                alive = all((r is None and t is None) or (r is not None and r() is t)
                            for r, t in zip(refs, tensors))
                if alive and self.unchanged(snap, tensors):
                    self.entries.move_to_end(key)
                    self.hits += 1
                    return basis
                self.entries.pop(key, None)
        # taken before building: an edit racing the build then misses next time
        snap = self.snapshot(tensors)
        basis = build()
        refs = []
        for t in tensors:
            if isinstance(t, Tensor):
                # a dead key tensor frees its entry at once (its id may be reused)
                refs.append(weakref.ref(t, lambda _r, key=key: self._drop(key)))
            else:
                refs.append(None)
        with self._lock:
            self.misses += 1
            self.entries[key] = (refs, basis, snap)
            while len(self.entries) > self.maxsize:
                self.entries.popitem(last=False)
        return basis

    def _drop(self, key):
        with self._lock:
            self.entries.pop(key, None)

    def clear(self) -> None:
        """Forget every entry and the counters."""
        with self._lock:
            self.entries.clear()
            self.hits = self.misses = 0


#: the graph family's one structure cache
STRUCTURES = GraphCache()


def clear_graph_cache() -> None:
    """Forget every cached graph structure."""
    STRUCTURES.clear()


def graph_cache_info() -> dict:
    """``{"entries", "hits", "misses", "maxsize"}`` of the structure cache."""
    return dict(entries=len(STRUCTURES.entries), hits=STRUCTURES.hits,
                misses=STRUCTURES.misses, maxsize=STRUCTURES.maxsize)


def cached(cache: bool, tensors: tuple, options: tuple, build: Callable[[], Basis]) -> Basis:
    """``build()``, or the basis already built for the same ``tensors`` and ``options`` when
    ``cache`` is on. A weight that requires grad is re-read every call (never cached); while
    torch.compile traces, the structure is part of the graph."""
    if not cache or torch.compiler.is_compiling() or \
            any(isinstance(t, Tensor) and t.requires_grad for t in tensors):
        return build()
    return STRUCTURES.get(tensors, options, build)

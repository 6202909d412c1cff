"""The planner's cost model: one table of measured weights, keyed by device type and kernel.

A route's cost is its weighted multiply-adds plus the traffic of its largest temporary, in units
of one dense GEMM multiply-add on the device (opt_einsum's helpers play this role for its
``contract_path``). The defaults were measured on a 2-core x86 CPU; ``structconv bench routes
--calibrate`` measures the machine it runs on and writes a user cache file (``costs.json`` under
``$STRUCTCONV_COSTS`` or ``$XDG_CACHE_HOME/structconv/``) that ``weight`` reads on the first
planner call. A device type has its own entry: a CUDA machine's calibration never overwrites
the CPU's figures. The file is validated whole: a corrupt or hostile one (not JSON, another
structure, a weight that is not a finite positive number) is ignored with one warning naming
the file and the field, so it never stops a command; ``--calibrate`` replaces it.

``Route`` is the planner's unit: one way to compute a convolution, costed, with its runner.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ._paths import user_cache_dir
from .io import atomic_write_text

__all__ = ["Route", "weight", "table", "DEFAULTS", "cache_path", "save_calibration",
           "reload", "read_calibration", "parse_calibration", "MAX_WEIGHT"]

#: Weights in GEMM multiply-adds. Each row says what one unit of the named kernel costs.
DEFAULTS: dict[str, dict[str, float]] = {
    "cpu": {
        # one element of an intermediate written and read back
        "element": 4.0,
        # one element of a permuted (strided) copy of a large temporary (~1 ns vs ~0.02 ns)
        "copy": 50.0,
        # a multiply-add of a basis's default (dense einsum) kernels
        "dense": 1.0,
        # a multiply-add of a COO/CSR SpMM over a Sparse basis's entries (gathers, not GEMM)
        "sparse": 6.0,
        # the wide CSR layout gathers from a K-times larger operand: measured 10-60% slower
        "sparse_wide": 1.2,
        # a multiply-add of the graph bases' CSR SpMM (square operators, long rows)
        "graph": 16.0,
        # a multiply-add of graph attention's per-edge SpMM
        "graph_attention": 6.0,
        # a grid's propagate (im2col) element: a strided copy into a (B, N, K, C) temporary
        "grid_shift": 64.0,
        # a grid's propagate_sum element reads and rewrites the output: 1.5x propagate's traffic
        "grid_sum": 1.5,
        # F.convNd against the GEMM rate of routes that move (B, M, K, C) temporaries
        "native_conv": 0.25,
        # an element copied or multiply-added by an elementwise pass over a tap-layout chunk
        "tap_copy": 50.0,
        # a fused channelwise multiply-add pass, relative to a tap-layout chunk copy
        "tap_channelwise": 0.4,
        # GEMMs with an inner size P below this run below the full rate (per-tap rewrites)
        "tap_full_rate_p": 64.0,
        # channels-last im2col copies of short runs of P channels pay this much more per 1/P
        "tap_short_rows": 16.0,
        # average pooling's window sums
        "avgpool": 2.0,
    },
}

#: per device type, the defaults overlaid with the calibration (built on first use)
_tables: dict[str, dict[str, float]] = {}
#: the validated calibration file, read on the first planner call (never at import: a command
#: that plans nothing, ``--help`` or ``--calibrate`` itself, never reads it); None: not read yet
_calibration: dict[str, dict[str, float]] | None = None
_lock = threading.Lock()

#: a weight outside (0, MAX_WEIGHT) is no measurement (the defaults span 0.25 to 64)
MAX_WEIGHT = 1e12
#: a calibration file is a few hundred bytes; a larger one is not ours
_MAX_BYTES = 1 << 20


def cache_path() -> Path:
    """The user cache file holding calibrated weights (it may not exist):
    ``$STRUCTCONV_COSTS`` (a ``.json`` file or a folder), else
    ``$XDG_CACHE_HOME/structconv/costs.json`` (default ``~/.cache/structconv/costs.json``)."""
    root = os.environ.get("STRUCTCONV_COSTS")
    if root:
        p = Path(root)
        return p if p.suffix == ".json" else p / "costs.json"
    base = user_cache_dir()
    if base is None:
        raise OSError("no home folder to keep the planner's cost file in: set "
                      "STRUCTCONV_COSTS or XDG_CACHE_HOME")
    return base / "costs.json"


def _show(v) -> str:
    """A short JSON-like rendering of a hostile value for a message."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**15:
        # (str() of a huge int is slow, and refused past 4300 digits)
        return f"an integer of about {int(v.bit_length() * 0.30103) + 1} digits"
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad_weight(v) -> str | None:
    """Why ``v`` is no weight (None: it is one): a real, finite number in (0, MAX_WEIGHT)."""
    # bool is an int in Python, but ``true`` is no measurement; an int compares exactly
    # with floats (a 400-digit one never reaches float(), which would overflow)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"{_show(v)} is not a number"
    if not (isinstance(v, int) or math.isfinite(v)) or not 0 < v < MAX_WEIGHT:
        return f"{_show(v)} is not a finite number in (0, {MAX_WEIGHT:g})"
    return None


def _field(*keys: str) -> str:
    """``weights.cpu.graph``, with odd keys (long, control characters) shown safely."""
    return ".".join(k if len(k) <= 40 and k.isprintable() else repr(k[:40]) for k in keys)


def parse_calibration(data) -> dict[str, dict[str, float]]:
    """The weights of a decoded calibration file, validated: ``{"weights": {device type:
    {kernel: weight}}}`` with every weight a finite number in (0, ``MAX_WEIGHT``).

    ``ValueError`` names the first field that is wrong (a file is used whole or not at all).
    """
    if not isinstance(data, dict):
        raise ValueError(f"the file holds a JSON {type(data).__name__}, expected an object "
                         "with a \"weights\" field")
    if "weights" not in data:
        raise ValueError("field \"weights\" is missing")
    weights = data["weights"]
    if not isinstance(weights, dict):
        raise ValueError(f"field \"weights\" is a JSON {type(weights).__name__}, expected an "
                         "object {device type: {kernel: weight}}")
    out: dict[str, dict[str, float]] = {}
    for dev, row in weights.items():
        if not isinstance(row, dict):
            raise ValueError(f"field \"{_field('weights', dev)}\" is a JSON "
                             f"{type(row).__name__}, expected an object {{kernel: weight}}")
        for k, v in row.items():
            why = _bad_weight(v)
            if why:
                raise ValueError(f"field \"{_field('weights', dev, k)}\": {why}")
        out[dev] = {k: float(v) for k, v in row.items()}
    return out


def _decode(p: Path):
    """The JSON value of the file at ``p``; None where there is no file; ``ValueError`` (or
    ``OSError``) says what is wrong with one that is there."""
    if not p.exists():
        return None
    # a FIFO or a device would block or never end: only a small regular file is read
    if not p.is_file():
        raise ValueError("not a regular file")
    if p.stat().st_size > _MAX_BYTES:
        raise ValueError(f"{p.stat().st_size:,} bytes, more than a cost file holds")
    try:
        return json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise ValueError("not JSON (nested too deeply)") from None
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None


def read_calibration(path: Path | None = None, warn: bool = True) -> dict[str, dict[str, float]]:
    """The validated weights of the calibration file (``cache_path()`` by default).

    A missing file gives ``{}``. A file that cannot be read or holds anything but valid weights
    is ignored whole, with one warning naming the file and the field: a corrupt or hostile
    cache never stops the program, and never reaches the planner in part.
    """
    if path is None:
        try:
            path = cache_path()
        except OSError:  # no home folder: no user cache, nothing to read
            return {}
    p = Path(path)
    try:
        data = _decode(p)
        return {} if data is None else parse_calibration(data)
    except (OSError, ValueError) as e:
        if warn:
            warnings.warn(f"ignoring {p}: {e}; the planner uses its default weights "
                          "(`structconv bench routes --calibrate` rewrites the file)",
                          RuntimeWarning, stacklevel=2)
        return {}


def _calibrated() -> dict[str, dict[str, float]]:
    global _calibration
    cal = _calibration
    if cal is None:
        with _lock:  # one read, one warning, however many threads plan at once
            if _calibration is None:
                _calibration = read_calibration()
            cal = _calibration
    return cal


def table(device_type: str = "cpu") -> dict[str, float]:
    """The weights in force for a device type: the defaults overlaid with its calibration."""
    t = _tables.get(device_type)
    if t is None:
        t = dict(DEFAULTS.get(device_type, DEFAULTS["cpu"]))
        t.update(_calibrated().get(device_type, {}))
        _tables[device_type] = t
    return t


def constant_when_traced(fn: Callable) -> Callable:
    """``torch.compiler.assume_constant_result`` without importing the compiler at load time:
    that import (``torch._dynamo``, sympy) costs seconds, and only marks the function, so the
    mark is set here unless the compiler is already loaded (then its own decorator sets it)."""
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True  # what the decorator sets (tests/cli/test_first_contact.py)
    return fn


# While ``torch.compile`` traces a planner call, this runs eagerly and its value enters the
# graph as a constant: the file read on a first call never meets the tracer.
@constant_when_traced
def weight(kernel: str, device_type: str = "cpu") -> float:
    """The weight of one unit of ``kernel`` on ``device_type`` (``KeyError`` names the known)."""
    t = table(device_type)
    try:
        return t[kernel]
    except KeyError:
        raise KeyError(f"no cost weight {kernel!r}; known: {', '.join(sorted(t))}") from None


def reload() -> None:
    """Read the calibration file again (after it changed, or ``$STRUCTCONV_COSTS`` did)."""
    global _calibration
    with _lock:
        _calibration = read_calibration()
        _tables.clear()


def save_calibration(device_type: str, weights: dict[str, float], meta: dict | None = None,
                     path: Path | None = None) -> Path:
    """Write calibrated ``weights`` for one device type into the cache file, atomically.

    Other device types' entries are kept where the file is valid; a corrupt file is replaced.
    ``ValueError`` names a weight that is not a finite positive number. Returns the path.
    """
    for k, v in weights.items():
        why = _bad_weight(v)
        if why:
            raise ValueError(f"calibration of {device_type}: weight {k!r}: {why}")
    p = Path(path) if path is not None else cache_path()
    kept = read_calibration(p, warn=False)
    try:  # the other devices' measuring conditions stay beside their weights
        m = (_decode(p) or {}).get("meta") if kept else None
    except (OSError, ValueError):
        m = None
    old_meta = {d: v for d, v in m.items() if d in kept} if isinstance(m, dict) else {}
    kept[device_type] = {k: float(v) for k, v in weights.items()}
    old_meta[device_type] = meta or {}
    atomic_write_text(p, json.dumps({"weights": kept, "meta": old_meta}, indent=2,
                                    sort_keys=True))
    reload()
    return p


@dataclass(frozen=True)
class Route:
    """One way to compute a convolution: its name, weighted flops, largest temporary, runner.

    ``run(x, theta, bias)`` takes the batched input x (B, M, P), the adapted parameter form
    (``theta()`` is the (K, P, Q) tensor) and a (Q,) bias or None, and returns (B, N, Q).
    ``fuses_bias``: the runner adds the bias inside its kernel; otherwise the engine adds it
    after, and passes None. ``reads``: the layout of x it runs best on, ``"contiguous"`` (B, M,
    C) rows or ``"channels_first"`` (an image's (B, C, *grid) memory seen as (B, M, C), as
    F.convNd and the tap kernels read it): a layer holding images hands it that view. A route
    without a runner (a plan made from shapes) only explains.
    """

    name: str
    flops: float
    elements: float
    run: Callable[[Tensor, object, Tensor | None], Tensor] | None = None
    fuses_bias: bool = False
    device_type: str = "cpu"
    reads: str = "contiguous"

    @property
    def cost(self) -> float:
        return self.flops + weight("element", self.device_type) * self.elements

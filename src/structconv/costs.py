"""The planner's cost model: one table of measured weights, keyed by device type and kernel.

A route's cost is its weighted multiply-adds plus the traffic of its largest temporary, in units
of one dense GEMM multiply-add on the device (opt_einsum's helpers play this role for its
``contract_path``). The defaults were measured on a 2-core x86 CPU; ``structconv bench routes
--calibrate`` measures the machine it runs on and writes a user cache file (``costs.json`` under
``$STRUCTCONV_COSTS`` or ``~/.cache/structconv/``) that ``weight`` reads when present. A device
type has its own entry: a CUDA machine's calibration never overwrites the CPU's figures.

``Route`` is the planner's unit: one way to compute a convolution, costed, with its runner.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from .io import atomic_write_text

__all__ = ["Route", "weight", "table", "DEFAULTS", "cache_path", "save_calibration",
           "reload"]

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

#: per device type, the defaults overlaid with the calibration (built on first use, without a
#: lock or any I/O: ``torch.compile`` traces planner calls; two threads racing here build equal
#: tables). The calibration file is read at import and by ``reload``.
_tables: dict[str, dict[str, float]] = {}


def cache_path() -> Path:
    """The user cache file holding calibrated weights (it may not exist)."""
    root = os.environ.get("STRUCTCONV_COSTS")
    if root:
        p = Path(root)
        return p if p.suffix == ".json" else p / "costs.json"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "structconv" / "costs.json"


def _read_cache() -> dict[str, dict[str, float]]:
    p = cache_path()
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    out: dict[str, dict[str, float]] = {}
    if not isinstance(data, dict):
        return out
    for dev, row in data.get("weights", {}).items():
        if isinstance(row, dict):
            # a corrupt or hand-edited entry never reaches the planner: positive finite numbers
            out[str(dev)] = {k: float(v) for k, v in row.items()
                             if isinstance(v, (int, float)) and 0 < float(v) < 1e12}
    return out


def table(device_type: str = "cpu") -> dict[str, float]:
    """The weights in force for a device type: the defaults overlaid with its calibration."""
    t = _tables.get(device_type)
    if t is None:
        t = dict(DEFAULTS.get(device_type, DEFAULTS["cpu"]))
        t.update(_calibration.get(device_type, {}))
        _tables[device_type] = t
    return t


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
    _calibration = _read_cache()
    _tables.clear()


def save_calibration(device_type: str, weights: dict[str, float], meta: dict | None = None,
                     path: Path | None = None) -> Path:
    """Write calibrated ``weights`` for one device type into the cache file, atomically.

    Other device types' entries are kept. Returns the file's path.
    """
    p = path or cache_path()
    try:
        data = json.loads(p.read_text())
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data.setdefault("weights", {})[device_type] = {k: float(v) for k, v in weights.items()}
    data.setdefault("meta", {})[device_type] = meta or {}
    atomic_write_text(p, json.dumps(data, indent=2, sort_keys=True))
    reload()
    return p


_calibration: dict[str, dict[str, float]] = _read_cache()


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

"""``structconv bench routes --calibrate``: measure this machine's cost weights for the planner.

Each physical weight of ``sc.costs`` is a kernel's time per unit of work divided by the time of
one dense GEMM multiply-add, measured here as the defaults were measured on the reference
machine: a strided copy's element, a grid shift's im2col element, a CSR SpMM's entry-channel
(generic sparse and graph operators, and the wide layout's ratio), a cache-sized elementwise
pass's element (the tap kernels). The tuned weights (temporary traffic, F.convNd's advantage,
the tap GEMM's full-rate size, pooling) come from whole-route comparisons and keep their
defaults. The result is written to the user cache
file that the planner reads (one entry per device type: a GPU's calibration never replaces the
CPU's).
"""

from __future__ import annotations

import platform

import torch

from .. import costs
from ..basis import Grid, Sparse, gcn
from ._util import median_time

__all__ = ["measure", "calibrate", "MEASURED"]

#: the weights this calibration measures; the others keep ``sc.costs.DEFAULTS``
MEASURED = ("copy", "grid_shift", "sparse", "sparse_wide", "graph", "tap_copy")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn, device, repeats: int) -> float:
    def run():
        fn()
        _sync(device)

    return median_time(run, repeats=repeats, warmup=1)


def _sizes(quick: bool) -> dict:
    if quick:
        return dict(gemm=(256, 128, 128), copy=(8, 64, 16, 16), grid=(24, 24), C=8,
                    sparse=(1000, 0.01), graph=(2000, 10000))
    return dict(gemm=(2048, 512, 512), copy=(32, 128, 32, 32), grid=(64, 64), C=16,
                sparse=(4000, 0.01), graph=(50000, 500000))


def measure(device="cpu", quick: bool = False, repeats: int = 5) -> dict[str, float]:
    """The measured weights (GEMM multiply-adds per unit) on ``device``."""
    dev = torch.device(device)
    sz = _sizes(quick)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dev)

    m, k, n = sz["gemm"]
    a, b = rand(m, k), rand(k, n)
    gemm = _seconds(lambda: a @ b, dev, repeats) / (m * k * n)

    out: dict[str, float] = {}
    t = rand(*sz["copy"])
    out["copy"] = _seconds(lambda: t.permute(0, 2, 1, 3).contiguous(), dev, repeats) \
        / t.numel() / gemm

    C = sz["C"]
    grid = Grid(sz["grid"], 3, padding=1)
    xg = rand(2, grid.M, C)
    out["grid_shift"] = _seconds(lambda: grid.propagate(xg), dev, repeats) \
        / (2 * grid.N * grid.K * C) / gemm
    # the tap kernels' unit: one multiply-add pass over a cache-sized chunk (32 Ki elements)
    acc, src = rand(32 * 1024), rand(32 * 1024)
    out["tap_copy"] = _seconds(lambda: [acc.add_(src, alpha=0.5) for _ in range(16)], dev,
                               repeats) / (16 * acc.numel()) / gemm

    M, density = sz["sparse"]
    nnz = int(density * 2 * M * M)
    idx = torch.stack([torch.randint(0, s, (nnz,), generator=gen) for s in (2, M, M)])
    sp = Sparse(idx, torch.randn(nnz, generator=gen), (2, M, M)).to(device=dev)
    xs = rand(1, M, 32)
    t_prop = _seconds(lambda: sp.propagate(xs), dev, repeats)
    out["sparse"] = t_prop / (sp.nnz * 32) / gemm
    zs = rand(1, M, 2, 32)
    out["sparse_wide"] = _seconds(lambda: sp.propagate_sum(zs), dev, repeats) / t_prop

    nodes, edges = sz["graph"]
    ei = torch.randint(0, nodes, (2, edges), generator=gen)
    g = gcn(ei, nodes).to(device=dev)
    xn = rand(1, nodes, 32)
    out["graph"] = _seconds(lambda: g.propagate(xn), dev, repeats) \
        / ((edges + nodes) * 32) / gemm
    return out


def calibrate(device="cpu", quick: bool = False, repeats: int = 5, path=None) -> dict:
    """Measure this machine's weights and write them to the planner's cache file.

    Returns ``{"path", "device_type", "weights", "defaults", "gemm_ns"}``.
    """
    dev = torch.device(device)
    weights = measure(dev, quick=quick, repeats=repeats)
    meta = dict(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads(),
                torch=torch.__version__, quick=quick)
    p = costs.save_calibration(dev.type, weights, meta, path=path)
    return dict(path=str(p), device_type=dev.type, weights=weights,
                defaults={k: costs.DEFAULTS["cpu"][k] for k in weights})

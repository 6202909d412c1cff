"""``structconv bench routes``: time the paper's three contraction orders and the planner's choice.

Over a grid of shapes (B, K, M, N, P, Q) and basis densities from 0.1% to 100%, each route is
timed (forward, median over repeats) and compared with ``route="auto"``. A second part compares
a sparse basis of <= 1% density with the same basis stored dense at M = N = 20,000: time and
peak memory.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import time
from pathlib import Path

import torch

from .. import engine
from ..basis.base import Dense, Sparse
from ..io import atomic_write_json
from ._util import ALLOCATOR, interleaved_times, median_time, peak_memory, record

NAME = "routes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--big-n", type=int, default=20000,
                   help="M = N of the sparse-vs-dense comparison (default 20000)")
    p.add_argument("--big-density", type=float, default=0.01,
                   help="density of the sparse-vs-dense comparison (default 0.01)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--calibrate", action="store_true",
                   help="measure this machine's cost weights and write them to the planner's "
                        "cache file ($STRUCTCONV_COSTS or ~/.cache/structconv/costs.json)")


def random_basis(K: int, M: int, N: int, density: float, gen: torch.Generator):
    """A random basis of the given density: ``Sparse`` below 30%, ``Dense`` above."""
    nnz = max(1, int(round(density * K * M * N)))
    if density >= 0.3:
        A = torch.randn(K, M, N, generator=gen)
        if density < 1.0:
            A = A * (torch.rand(K, M, N, generator=gen) < density)
        return Dense(A)
    idx = torch.stack([torch.randint(0, s, (nnz,), generator=gen) for s in (K, M, N)])
    return Sparse(idx, torch.randn(nnz, generator=gen), (K, M, N))


def cases(quick: bool):
    """The (B, K, M, N, P, Q, density) grid."""
    if quick:
        return [(1, 2, 64, 64, 8, 4, 0.05), (2, 3, 50, 40, 4, 8, 1.0),
                (1, 1, 128, 128, 16, 2, 0.01)]
    out = []
    for (M, dens), (P, Q), K, B in itertools.product(
            [(300, 1.0), (300, 0.1), (2000, 0.01), (2000, 0.001), (5000, 0.001), (1000, 0.3)],
            [(64, 8), (8, 64), (32, 32)], [1, 4], [1, 8]):
        out.append((B, K, M, M, P, Q, dens))
    return out


def time_case(case, repeats, gen):
    B, K, M, N, P, Q, dens = case
    basis = random_basis(K, M, N, dens, gen)
    x = torch.randn(B, M, P, generator=gen)
    theta = torch.randn(K, P, Q, generator=gen)
    plan = engine.plan(x, basis, theta)
    fns = {}
    for r in plan.routes:
        if r.name == "basis_param" and M * N * P * Q > engine.PHI_LIMIT:
            continue  # Φ would not fit: the planner never picks it either
        fns[r.name] = lambda n=r.name: engine.convolve(x, basis, theta, route=n)
    fns["auto"] = lambda: engine.convolve(x, basis, theta)
    times = interleaved_times(fns, repeats=repeats, warmup=1, min_time=0.02)
    best = min((t, n) for n, t in times.items() if n != "auto")
    return dict(B=B, K=K, M=M, N=N, P=P, Q=Q, density=dens, basis=type(basis).__name__,
                chosen=plan.route, times=times, best=best[1],
                auto_over_best=times["auto"] / best[0],
                chosen_over_best=times.get(plan.route, times["auto"]) / best[0])


def sparse_vs_dense(n: int, density: float, repeats: int, quick: bool):
    """Time and peak memory of one sparse basis against the same basis stored dense."""
    K, P, Q = 1, 16, 16
    nnz = int(density * n * n)

    def inputs():
        g = torch.Generator().manual_seed(0)
        idx = torch.stack([torch.zeros(nnz, dtype=torch.long),
                           torch.randint(0, n, (nnz,), generator=g),
                           torch.randint(0, n, (nnz,), generator=g)])
        vals = torch.randn(nnz, generator=g)
        return idx, vals, torch.randn(n, P, generator=g), torch.randn(K, P, Q, generator=g)

    def make(kind):
        def build():
            idx, vals, x, th = inputs()

            def run():
                sp = Sparse(idx, vals, (K, n, n))
                basis = sp if kind == "sparse" else Dense(sp.to_dense())
                return engine.convolve(x, basis, th)
            return run
        return build

    out = {}
    idx, vals, x, th = inputs()
    sp = Sparse(idx, vals, (K, n, n))
    dn = Dense(sp.to_dense())
    for kind, basis in (("sparse", sp), ("dense", dn)):
        out[f"{kind}_time"] = median_time(lambda b=basis: engine.convolve(x, b, th),
                                          repeats=repeats, warmup=1)
        out[f"{kind}_route"] = engine.plan(x, basis, th).route
    del dn
    for kind in ("sparse", "dense"):
        out[f"{kind}_peak_bytes"] = peak_memory(make(kind))
    out.update(n=n, density=density, P=P, Q=Q,
               speedup=out["dense_time"] / out["sparse_time"],
               memory_ratio=(out["dense_peak_bytes"] or 0) / max(1, out["sparse_peak_bytes"] or 1))
    return out


def _calibrate(args) -> int:
    from .calibrate import calibrate

    out = calibrate(device=args.device, quick=args.quick, repeats=max(3, args.repeats))
    print(f"{'weight':<14} {'measured':>10} {'default':>10}")
    for k, v in out["weights"].items():
        print(f"{k:<14} {v:>10.3g} {out['defaults'][k]:>10.3g}")
    print(f"wrote {out['path']} ({out['device_type']}; the planner reads it from now on)")
    return 0


def run(args) -> int:
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    if args.calibrate:
        return _calibrate(args)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    repeats = max(3, args.repeats)
    rows = []
    t0 = time.time()
    print(f"{'B':>2} {'K':>2} {'M=N':>5} {'P':>3} {'Q':>3} {'dens':>6} {'basis':>6} "
          f"{'chosen':>12} {'best':>12} {'auto/best':>9}  times (ms)")
    for case in cases(args.quick):
        r = time_case(case, repeats, gen)
        rows.append(r)
        ts = " ".join(f"{k}={v * 1e3:.2f}" for k, v in r["times"].items())
        print(f"{r['B']:>2} {r['K']:>2} {r['M']:>5} {r['P']:>3} {r['Q']:>3} {r['density']:>6.3f} "
              f"{r['basis']:>6} {r['chosen']:>12} {r['best']:>12} {r['auto_over_best']:>8.2f}x  "
              f"{ts}", flush=True)
    within = sum(r["auto_over_best"] <= 1.10 for r in rows)
    print(f"auto within 1.10x of the fastest route: {within}/{len(rows)} "
          f"({100 * within / len(rows):.0f}%; target >= 90%)")
    # the same comparison without the planning overhead and the noise of a separate sample:
    # the chosen route's own timing against the fastest one
    chosen_ok = sum(r["chosen_over_best"] <= 1.10 for r in rows)
    print(f"planner's chosen route within 1.10x of the fastest: {chosen_ok}/{len(rows)}")
    n = 2000 if args.quick else args.big_n
    big = sparse_vs_dense(n, args.big_density, repeats, args.quick)
    print(f"sparse vs dense basis, M=N={n}, density {args.big_density:.3%}: "
          f"time {big['sparse_time'] * 1e3:.1f} ms vs {big['dense_time'] * 1e3:.1f} ms "
          f"({big['speedup']:.1f}x faster; target >= 10x), peak memory "
          f"{(big['sparse_peak_bytes'] or 0) / 2**20:.0f} MiB vs "
          f"{(big['dense_peak_bytes'] or 0) / 2**20:.0f} MiB ({big['memory_ratio']:.1f}x smaller; "
          "target >= 10x)")
    result = dict(suite=NAME, allocator=dict(ALLOCATOR), conditions=record(),
                  machine=platform.machine(), threads=torch.get_num_threads(),
                  torch=torch.__version__, seconds=time.time() - t0, cases=rows,
                  auto_within_1_10=within / len(rows),
                  chosen_within_1_10=chosen_ok / len(rows), sparse_vs_dense=big)
    out = Path(args.out) / f"{NAME}.json"
    atomic_write_json(out, result)
    print(f"wrote {out}")
    return 0

"""The contraction orders on the layer shapes of the results' models, against the planner.

``structconv reproduce routes-models --repeats 5 --out runs``. For each layer of the models in
docs/results.md (Fashion-MNIST CNN, digits CNN with each parameter form, the shift-head
Transformer layer, GCN / mixed-head layers on Cora, R-GCN on AIFB) every route that
``sc.convolve`` accepts is timed forward + backward: the paper's ``input_param``,
``basis_input``, ``basis_param`` (when Φ fits under the planner's limit), the basis's ``native``
kernel and the parameter form's factored routes, and ``auto`` (the planner: for a ``Stack``
each part on its own best path). Reports auto / fastest. Writes ``<out>/routes_models.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .. import engine
from ..basis.base import Stack
from ..bench._util import fwd_bwd, interleaved_times
from ..data.registry import data_root
from ..params import ControlledSeparable, DepthwiseSeparable, Full, LowRank
from ._common import (
    THREADS,  # argument types
    hardware,
    set_threads,
    write_result,
)

__all__ = ["cases", "time_case", "add_arguments", "run"]


def _grid(in_shape, k, pad):
    from ..basis.grid import Grid

    return Grid(in_shape, (k,) * len(in_shape), padding=pad)


def cases(quick: bool, data_dir: Path | None) -> list[tuple[str, Callable]]:
    """(name, make) pairs; ``make()`` returns (x, basis, theta module) of one layer's shapes."""
    out = []
    B = 8 if quick else 128

    def cnn(side, k, pad, P, Q, form, batch):
        def make():
            K = k * k
            th = {"full": lambda: Full(K, P, Q), "depthwise": lambda: DepthwiseSeparable(K, P, Q),
                  "H4": lambda: ControlledSeparable(K, P, Q, 4)}[form]()
            return torch.randn(batch, side * side, P), _grid((side, side), k, pad), th
        return make

    out += [("fashion conv1 28x28 1->16 3x3", cnn(28, 3, 1, 1, 16, "full", B)),
            ("fashion conv2 14x14 16->32 3x3", cnn(14, 3, 1, 16, 32, "full", B))]
    for form in ("full", "depthwise", "H4"):
        out.append((f"digits conv2 8x8 16->32 5x5 {form}", cnn(8, 5, 2, 16, 32, form,
                                                               8 if quick else 64)))

    def lm(with_attention: bool):
        def make():
            from ..attention.basis import DotProductAttention

            Bl, L, E, H, S = (2, 16, 32, 4, 4) if quick else (32, 64, 64, 4, 4)
            D = E // H
            grid = _grid((L,), S, [(S - 1, 0)])
            x = torch.randn(Bl, L, E)
            if not with_attention:
                return x, grid, LowRank(S, E, E, D)
            q, k = torch.randn(Bl, H, L, D), torch.randn(Bl, H, L, D)
            return x, Stack([DotProductAttention(q, k, causal=True), grid]), LowRank(H + S, E, E,
                                                                                    D)
        return make

    out += [("LM shift heads (causal grid, S=4)", lm(False)),
            ("LM attention + shift heads (Stack)", lm(True))]
    root = data_dir or data_root()
    if root is not None and (root / "planetoid").is_dir():
        def cora(which):
            def make():
                from ..attention.basis import GraphAttention
                from ..basis.graph import PowerBasis, gcn
                from ..data.planetoid import load_planetoid

                d = load_planetoid(root / "planetoid", "cora", normalize_features=True)
                N, F = d.x.shape
                A = gcn(d.edge_index, N)
                if which == "gcn1":
                    return d.x, A, Full(1, F, 16)
                if which == "gcn2":
                    return torch.randn(N, 16), A, Full(1, 16, d.num_classes)
                ei = d.edge_index
                i = torch.arange(N)
                ei = torch.cat([ei[:, ei[0] != ei[1]], torch.stack([i, i])], 1)
                alpha = torch.rand(ei.shape[1], 4)
                att = GraphAttention(ei, alpha, N, N)
                return d.x, Stack([att, PowerBasis(A.op, (1, 2, 3, 4))]), LowRank(8, F, 64, 8)
            return make

        out += [("GCN layer 1 Cora 1433->16", cora("gcn1")),
                ("GCN layer 2 Cora 16->7", cora("gcn2"))]
        if not quick:  # the full-size graph attention layer: most of a quick run's time
            out.append(("mixed heads layer 1 Cora (4 GAT + A^1..4)", cora("mixed")))
    if not quick and root is not None and (root / "rgcn" / "aifb").is_dir():
        def aifb(form):
            def make():
                from ..data.rgcn import load_entities
                from ..models.graph import relational_basis

                d = load_entities(root / "rgcn" / "aifb", "aifb")
                rel = relational_basis(d.edge_index, d.edge_type, d.num_nodes, d.num_relations)
                K, C = rel.K, d.num_classes
                th = Full(K, 16, C) if form == "full" else ControlledSeparable(K, 16, C, 5)
                return torch.randn(d.num_nodes, 16), rel, th
            return make

        out += [("R-GCN layer 2 AIFB 16->4 full", aifb("full")),
                ("R-GCN layer 2 AIFB 16->4 H5", aifb("H5"))]
    return out


def _route_names(x, basis, theta) -> tuple[str, list[str], list[str]]:
    """(planner's choice, routes to time, routes skipped because Φ is over the limit)."""
    p = engine.plan(x, basis, theta)
    if isinstance(basis, Stack):
        names = list(engine.ROUTES) + [r.name for r in theta.factored_routes(
            x if x.dim() == 3 else x.unsqueeze(0), basis)]
        chosen = p.route if p.route != "stack" else \
            "parts (" + ", ".join(q.route for q in p.parts) + ")"
    else:
        names = [r.name for r in p.routes]
        chosen = p.route
    B, M, P = (x if x.dim() == 3 else x.unsqueeze(0)).shape
    too_big = basis.M * basis.N * P * theta.Q > engine.PHI_LIMIT
    skipped = ["basis_param"] if too_big and "basis_param" in names else []
    return chosen, [n for n in names if n not in skipped], skipped


def time_case(name: str, make: Callable, repeats: int) -> dict:
    """Forward + backward seconds of every feasible route and of ``auto``."""
    x, basis, theta = make()
    chosen, names, skipped = _route_names(x, basis, theta)
    fns, failed = {}, {}
    for n in names + ["auto"]:
        fn = fwd_bwd(lambda n=n: engine.convolve(x, basis, theta, route=n))
        try:
            fn()
            fns[n] = fn
        except (RuntimeError, ValueError, NotImplementedError) as e:
            failed[n] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        theta.zero_grad(set_to_none=True)
    times = interleaved_times(fns, repeats=repeats, warmup=1, min_time=0.05)
    named = {n: t for n, t in times.items() if n != "auto"}
    best = min(named, key=named.get)
    return dict(layer=name, x=list(x.shape), basis=type(basis).__name__, K=basis.K, M=basis.M,
                N=basis.N, theta=type(theta).__name__, chosen=chosen, times=times, best=best,
                auto_over_best=times["auto"] / named[best], skipped=skipped, failed=failed)


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(repeats=1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, help="datasets folder (default: the data "
                        "home, see `structconv datasets`)")
    parser.add_argument("--threads", type=THREADS, default=0, help="torch threads (0: default)")


def run(args) -> int:
    """Time every case; print the table, write the JSON."""
    set_threads(args)
    torch.manual_seed(args.seed)
    repeats = args.repeats if args.quick else max(3, args.repeats)  # quick: a smoke test
    t0 = time.perf_counter()
    rows = []
    root = Path(args.data) if args.data else None
    print(f"{'layer':<44} {'chosen':<28} {'fastest':<16} {'auto/fastest':>12}  fwd+bwd ms")
    for name, make in cases(args.quick, root):
        r = time_case(name, make, repeats)
        rows.append(r)
        ts = " ".join(f"{k}={v * 1e3:.1f}" for k, v in r["times"].items())
        print(f"{name:<44} {r['chosen']:<28} {r['best']:<16} {r['auto_over_best']:>11.2f}x  {ts}",
              flush=True)
    within = sum(r["auto_over_best"] <= 1.10 for r in rows)
    print(f"auto within 1.10x of the fastest route: {within}/{len(rows)}")
    result = dict(experiment="routes_models", repeats=repeats, cases=rows,
                  auto_within_1_10=within / max(1, len(rows)),
                  wall_seconds=time.perf_counter() - t0, hardware=hardware())
    write_result(args, "routes_models", result)
    return 0

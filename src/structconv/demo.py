"""``structconv demo``: the main job, on data that ships with the dependencies (no network).

Trains four shipped configs through the same trainer as ``structconv train``: a CNN (grid basis)
on scikit-learn's digits, a GCN and a GAT (graph bases) on networkx's karate club, and a
character Transformer (causal attention heads stacked with shift heads) on text that ships with
Python; then prints one table: model, basis, parameters, test accuracy / loss, time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

__all__ = ["DEMO_JOBS", "run_demo", "describe_basis"]

#: (family, shipped config, overrides for the full run, extra overrides for --quick)
DEMO_JOBS = [
    ("grid", "cnn_digits", [], ["train.epochs=2", "data.options.limit=400"]),
    ("graph", "gcn_karate", [], ["train.epochs=10"]),
    ("graph", "gat_karate", [], ["train.epochs=5"]),
    ("attention", "transformer_python", [],
     ["train.epochs=1", "data.batches_per_epoch=3", "data.seq_len=32"]),
]


def describe_basis(cfg: dict) -> str:
    """A short name of the bases a config uses, e.g. ``grid 3x3`` or ``attention(4)+shift(3)``."""
    names = []

    def one(spec):
        spec = {"kind": spec} if isinstance(spec, str) else spec
        k = spec["kind"]
        if k == "stack":
            return "+".join(one(p) for p in spec["parts"])
        if k == "grid":
            ks = spec.get("kernel_size", 3)
            ks = "x".join(map(str, ks)) if isinstance(ks, list) else f"{ks}x{ks}"
            return f"shift({spec.get('kernel_size', 3)})" if spec.get("causal") else f"grid {ks}"
        if k in ("attention", "graph_attention"):
            return f"{k}({spec.get('heads', 1)})"
        if k in ("chebyshev", "diffusion"):
            return f"{k}(K={spec.get('K')})"
        return k

    lm = cfg["model"].get("lm")
    if lm:
        heads, pos = lm.get("heads", 4), lm.get("position", "shift")
        extra = f"+shift({lm.get('shifts', 4)})" if pos.startswith("shift") else ""
        bias = "+alibi" if pos.endswith("alibi") else \
            ("" if pos.startswith("shift") else f", {pos} positions")
        return f"attention({heads}){extra}{bias} x{lm.get('layers', 4)}"
    for layer in cfg["model"]["layers"]:
        if "basis" in layer:
            n = one(layer["basis"])
            if n not in names and n != "identity":
                names.append(n)
    return ", ".join(names)


def run_demo(args) -> int:
    """Train the demo jobs and print the table; ``args`` has quick, only, seed, device, out."""
    from .config import load_config
    from .training import resolve_device, train

    resolve_device(args.device)
    families = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = families - {"grid", "graph", "attention"}
    if unknown:
        raise ValueError(f"--only: unknown families {sorted(unknown)}; use grid, graph, "
                         "attention")
    # tiny models: one thread avoids oversubscribing shared cores (10x faster here)
    torch.set_num_threads(1)
    tmp = None
    if args.out:
        root = Path(args.out)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="structconv-demo-")
        root = Path(tmp.name)
    rows = []
    try:
        for family, name, over, quick in DEMO_JOBS:
            if family not in families:
                continue
            cfg = load_config(name, over + (quick if args.quick else []))
            if args.seed is not None:
                cfg["seed"] = args.seed
            t0 = time.perf_counter()
            out = root / name
            if (out / "checkpoint.json").exists():
                raise ValueError(f"{out} already holds a demo run; choose another --out")
            res = train(cfg, out, device=args.device, progress=args.progress)
            dt = time.perf_counter() - t0
            rows.append((name, family, describe_basis(cfg), res["dataset"], res["parameters"],
                         res["test_acc"], res["test_loss"], dt))
            print(f"trained {name} in {dt:.1f} s", file=sys.stderr, flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    head = ("model", "family", "basis", "data", "parameters", "test acc", "test loss",
            "time (s)")
    body = [(m, f, b, d, f"{p:,}", f"{a:.3f}", f"{loss:.3f}", f"{t:.1f}")
            for m, f, b, d, p, a, loss, t in rows]
    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    print(line)
    for r in body:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    if args.out:
        print(f"\nrun directories (metrics, curves.png, checkpoints) in {root}")
    return 0

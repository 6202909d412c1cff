"""``structconv bench attention``: attention convolutions against torch and PyG, in one run.

* Multi-head attention (B=16, L=512, d=256, 8 heads; B=2, L=4096): structconv's
  ``MultiheadAttention`` against ``nn.MultiheadAttention``'s default call (need_weights=True,
  training), its inference fast path (eval, no grad, need_weights=False), need_weights=False in
  training, and a hand-written in-projection -> SDPA -> out-projection; forward and
  forward+backward, plus peak memory.
* GAT (8 heads x 8 channels) on Cora- and PubMed-sized random graphs and a 200k-node/2M-edge one:
  structconv's ``GATConv`` against PyG's, forward and forward+backward, peak memory.
* Graph-attention layers with edge features (``--parts edges``): ``GATConv(edge_dim=8)``,
  ``GATv2Conv`` with and without edge features and ``TransformerConv(edge_dim=8, beta=True)``
  (8 heads x 8) against PyG's layers holding the same weights, forward and forward+backward on
  Cora- and PubMed-sized random graphs with 8 edge features, and peak memory on a
  200k-node / 600k-edge graph (never a dense N x N: 160 GB there).
* A mixed layer (attention heads + causal shift heads in one ``Stack``) against the sum of its
  two parts run alone.

Ratios are anchor time / structconv time (above 1 = structconv faster) unless named otherwise;
all measured in the same run (median over interleaved repeats).
"""

from __future__ import annotations

import argparse
import platform
import sys
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..io import atomic_write_json
from ._util import ALLOCATOR, fwd_bwd, interleaved_times, peak_memory, record

NAME = "attention"

#: the targets, as ratios anchor / structconv (>=) or structconv / anchor (<=)
TARGETS = {
    "default_vs_torch_default": (">=", 1.5),
    "inference_vs_torch_fast_path": (">=", 1.3),
    "no_weights_vs_torch_no_weights": (">=", 1.0),
    "no_weights_over_sdpa_composition": ("<=", 1.10),
    "gat_vs_pyg": (">=", 1.0),
    "gat_memory_over_pyg": ("<=", 1.0),
    "mixed_over_parts": ("<=", 1.2),
    "edge_layer_vs_pyg": (">=", 1.0),
}

#: the edge-feature layers: name -> (PyG class, constructor options, edge features used)
EDGE_LAYERS = {
    "gat_edge8": ("GATConv", {"heads": 8, "edge_dim": 8}, True),
    "gatv2": ("GATv2Conv", {"heads": 8}, False),
    "gatv2_edge8": ("GATv2Conv", {"heads": 8, "edge_dim": 8}, True),
    "transformer_edge8_beta": ("TransformerConv", {"heads": 8, "edge_dim": 8, "beta": True},
                               True),
}
EDGE_GRAPHS = {"cora-sized": (2708, 10556, 1433), "pubmed-sized": (19717, 88648, 500),
               "random-200k-600k": (200_000, 600_000, 64)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default="mha,gat,edges,mixed",
                   help="comma-separated parts to run: mha, gat, edges, mixed (default all)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    p.add_argument("--mha", default="16x512,2x4096",
                   help="multi-head attention cases as BxL (d=256, 8 heads; default "
                        "16x512,2x4096)")
    p.add_argument("--graphs", default="cora-sized,pubmed-sized,random-200k-2M",
                   help="GAT graphs to run (default all three)")
    p.add_argument("--edge-layers", default=",".join(EDGE_LAYERS),
                   help=f"edge-feature layers to run (default all: {', '.join(EDGE_LAYERS)})")
    p.add_argument("--edge-graphs", default=",".join(EDGE_GRAPHS),
                   help="graphs for the edge-feature layers (default all three; the largest "
                        "is timed with at most 3 repeats)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (default: torch's choice)")


GRAPHS = {"cora-sized": (2708, 10556, 1433), "pubmed-sized": (19717, 88648, 500),
          "random-200k-2M": (200_000, 2_000_000, 64)}


def _mha_cases(args):
    if args.quick:
        return [(2, 64, 32, 4)]
    out = []
    for c in getattr(args, "mha", "16x512,2x4096").split(","):
        try:
            B, L = (int(t) for t in c.lower().split("x"))
        except ValueError:
            raise ValueError(f"--mha case {c!r} is not BxL (e.g. 16x512)") from None
        out.append((B, L, 256, 8))
    return out


def _gat_cases(args):
    if args.quick:
        return [("tiny", 300, 1500, 16)]
    names = [g.strip() for g in getattr(args, "graphs", ",".join(GRAPHS)).split(",") if g]
    bad = [g for g in names if g not in GRAPHS]
    if bad:
        raise ValueError(f"unknown --graphs {bad}; choose from {sorted(GRAPHS)}")
    return [(g, *GRAPHS[g]) for g in names]


def _edge_cases(args):
    """[(layer name, graph name, nodes, edges, features)] from --edge-layers/--edge-graphs."""
    layers = [x.strip() for x in getattr(args, "edge_layers", ",".join(EDGE_LAYERS)).split(",")
              if x.strip()]
    graphs = [x.strip() for x in getattr(args, "edge_graphs", ",".join(EDGE_GRAPHS)).split(",")
              if x.strip()]
    bad = [x for x in layers if x not in EDGE_LAYERS] + [x for x in graphs if x not in EDGE_GRAPHS]
    if bad:
        raise ValueError(f"unknown --edge-layers/--edge-graphs {bad}; choose from "
                         f"{sorted(EDGE_LAYERS)} and {sorted(EDGE_GRAPHS)}")
    if args.quick:
        return [(name, "tiny", 300, 1500, 16) for name in layers]
    return [(name, g, *EDGE_GRAPHS[g]) for g in graphs for name in layers]


def _check(name: str, value: float) -> bool:
    op, lim = TARGETS[name]
    return value >= lim if op == ">=" else value <= lim


def _mb(x):
    return None if x is None else x / 2**20


# ------------------------------------------------------------------------------------------------
def _mha_setup(B, L, E, H, seed):
    from ..nn.attention import MultiheadAttention  # noqa: F401  (registers the converter)
    from ..nn.convert import from_torch

    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(E, H, batch_first=True)
    mine = from_torch(ref)
    x = torch.randn(B, L, E)
    return ref, mine, x


def _composition(ref, x, H):
    B, L, E = x.shape

    def run():
        qkv = F.linear(x, ref.in_proj_weight, ref.in_proj_bias)
        q, k, v = qkv.view(B, L, 3, H, E // H).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v)
        return F.linear(o.transpose(1, 2).reshape(B, L, E), ref.out_proj.weight,
                        ref.out_proj.bias)
    return run


def _mha_fns(ref, mine, x, H):
    """name -> (closure, mode) with mode 'train' (grad on) or 'infer' (eval, no grad)."""
    def call(m, **kw):
        return lambda: m(x, x, x, **kw)

    comp = _composition(ref, x, H)
    return {
        "torch_default": call(ref),
        "ours_default": call(mine),
        "torch_no_weights": call(ref, need_weights=False),
        "ours_no_weights": call(mine, need_weights=False),
        "sdpa_composition": comp,
    }, {
        "torch_fast_path": call(ref, need_weights=False),
        "torch_fast_path_weights": call(ref),
        "ours_inference": call(mine, need_weights=False),
        "ours_inference_weights": call(mine),
        "sdpa_composition": comp,
    }


def _mha_make(B, L, E, H, seed, name):
    def make():
        r, m, xx = _mha_setup(B, L, E, H, seed)
        return fwd_bwd(_mha_fns(r, m, xx, H)[0][name])
    return make


def _mha_one(B, L, E, H, args) -> dict:
    ref, mine, x = _mha_setup(B, L, E, H, args.seed)
    train, infer = _mha_fns(ref, mine, x, H)
    reps = args.repeats if L <= 1024 else max(1, min(args.repeats, 3))
    fwd = interleaved_times(train, repeats=reps)
    fb = interleaved_times({k: fwd_bwd(f) for k, f in train.items()}, repeats=reps)
    ref.eval()
    mine.eval()
    with torch.no_grad():
        inf = interleaved_times(infer, repeats=reps)
    ref.train()
    mine.train()
    mem = {}
    if not args.no_memory:
        for name in ("torch_default", "ours_default", "torch_no_weights", "ours_no_weights",
                     "sdpa_composition"):
            mem[name] = _mb(peak_memory(_mha_make(B, L, E, H, args.seed, name)))
    ratios = {
        "default_vs_torch_default": {
            "forward": fwd["torch_default"] / fwd["ours_default"],
            "forward_backward": fb["torch_default"] / fb["ours_default"]},
        "inference_vs_torch_fast_path": {
            "forward": inf["torch_fast_path"] / inf["ours_inference"],
            "forward_with_weights": inf["torch_fast_path_weights"]
            / inf["ours_inference_weights"]},
        "no_weights_vs_torch_no_weights": {
            "forward": fwd["torch_no_weights"] / fwd["ours_no_weights"],
            "forward_backward": fb["torch_no_weights"] / fb["ours_no_weights"]},
        "no_weights_over_sdpa_composition": {
            "forward": fwd["ours_no_weights"] / fwd["sdpa_composition"],
            "forward_backward": fb["ours_no_weights"] / fb["sdpa_composition"],
            "inference": inf["ours_inference"] / inf["sdpa_composition"]},
    }
    if mem.get("torch_default") and mem.get("ours_default"):
        ratios["memory_ours_over_torch"] = {
            "default": mem["ours_default"] / mem["torch_default"],
            "no_weights": (mem["ours_no_weights"] or 0) / (mem["torch_no_weights"] or 1)}
    return dict(B=B, L=L, d=E, heads=H, forward_s=fwd, forward_backward_s=fb,
                inference_s=inf, peak_memory_mb=mem, ratios=ratios)


def bench_mha(args) -> list[dict]:
    return [_mha_one(B, L, E, H, args) for B, L, E, H in _mha_cases(args)]


# ------------------------------------------------------------------------------------------------
def _random_graph(n, e, gen):
    return torch.randint(0, n, (2, e), generator=gen)


def _gat_setup(n, e, f, seed):
    from torch_geometric.nn import GATConv as PygGAT

    from ..nn.convert import from_pyg

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ei = _random_graph(n, e, gen)
    x = torch.randn(n, f, generator=gen)
    ref = PygGAT(f, 8, heads=8)
    mine = from_pyg(ref)
    return ref, mine, x, ei


def _gat_make(n, e, f, seed, who):
    def make():
        r, m, xx, ee = _gat_setup(n, e, f, seed)
        mod = r if who == "pyg" else m
        # one call on a small other graph first pages in the library code and one-time state
        # of either side (several MB of resident pages, the same whatever the graph size);
        # then the measured call is the first on this graph: ours builds its cached structure
        small = torch.Generator().manual_seed(seed + 1)
        fwd_bwd(lambda: mod(xx[:64], _random_graph(64, 256, small)))()
        return fwd_bwd(lambda: mod(xx, ee))
    return make


def _gat_one(name, n, e, f, args) -> dict:
    ref, mine, x, ei = _gat_setup(n, e, f, args.seed)
    reps = args.repeats if e <= 200_000 else max(1, min(args.repeats, 3))
    fns = {"pyg": lambda: ref(x, ei), "ours": lambda: mine(x, ei)}
    fwd = interleaved_times(fns, repeats=reps)
    fb = interleaved_times({k: fwd_bwd(v) for k, v in fns.items()}, repeats=reps)
    mem = {}
    if not args.no_memory:
        for who in ("pyg", "ours"):
            mem[who] = _mb(peak_memory(_gat_make(n, e, f, args.seed, who)))
    ratios = {"gat_vs_pyg": {"forward": fwd["pyg"] / fwd["ours"],
                             "forward_backward": fb["pyg"] / fb["ours"]}}
    if mem.get("pyg") and mem.get("ours"):
        ratios["gat_memory_over_pyg"] = {"forward_backward": mem["ours"] / mem["pyg"]}
    return dict(graph=name, nodes=n, edges=e, features=f, heads=8, channels=8,
                forward_s=fwd, forward_backward_s=fb, peak_memory_mb=mem, ratios=ratios)


def bench_gat(args) -> list[dict]:
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        print("attention bench: torch_geometric is not installed, skipping GAT")
        return []
    return [_gat_one(name, n, e, f, args) for name, n, e, f in _gat_cases(args)]


# ------------------------------------------------------------------------------------------------
def _edge_setup(layer: str, n: int, e: int, f: int, seed: int):
    """(PyG's layer, structconv's with the same weights, its call arguments)."""
    import torch_geometric.nn as pyg

    from ..nn.convert import from_pyg

    cls, kw, edges = EDGE_LAYERS[layer]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ei = _random_graph(n, e, gen)
    x = torch.randn(n, f, generator=gen)
    ea = torch.randn(e, 8, generator=gen)
    ref = getattr(pyg, cls)(f, 8, **kw)
    return ref, from_pyg(ref), ((x, ei, ea) if edges else (x, ei))


def _edge_make(layer, n, e, f, seed, who):
    def make():
        ref, mine, call = _edge_setup(layer, n, e, f, seed)
        mod = ref if who == "pyg" else mine
        # a first call on a small graph pages in either side's code and one-time state (as
        # the GAT part does); the measured call is then the first on this graph
        small = (call[0][:64], _random_graph(64, 256, torch.Generator().manual_seed(seed + 1)))
        fwd_bwd(lambda: mod(*small, *([call[2][:256]] if len(call) == 3 else [])))()
        return fwd_bwd(lambda: mod(*call))
    return make


def _edge_one(layer, graph, n, e, f, args) -> dict:
    ref, mine, call = _edge_setup(layer, n, e, f, args.seed)
    reps = args.repeats if e <= 200_000 else max(1, min(args.repeats, 3))
    fns = {"pyg": lambda: ref(*call), "ours": lambda: mine(*call)}
    fwd = interleaved_times(fns, repeats=reps)
    fb = interleaved_times({k: fwd_bwd(v) for k, v in fns.items()}, repeats=reps)
    mem = {}
    if not args.no_memory:
        for who in ("pyg", "ours"):
            mem[who] = _mb(peak_memory(_edge_make(layer, n, e, f, args.seed, who)))
    ratios = {"edge_layer_vs_pyg": {"forward": fwd["pyg"] / fwd["ours"],
                                    "forward_backward": fb["pyg"] / fb["ours"]}}
    if mem.get("pyg") and mem.get("ours"):
        ratios["memory_ours_over_pyg"] = {"forward_backward": mem["ours"] / mem["pyg"]}
        # a dense N x N float32 matrix would be n*n*4 bytes: the peak is a small fraction
        ratios["memory_over_dense_n_by_n"] = {"forward_backward": mem["ours"] * 2**20
                                              / (4.0 * n * n)}
    cls, kw, edges = EDGE_LAYERS[layer]
    return dict(layer=layer, pyg_class=cls, options=kw, edge_features=8 if edges else 0,
                graph=graph, nodes=n, edges=e, features=f, heads=8, channels=8,
                forward_s=fwd, forward_backward_s=fb, peak_memory_mb=mem, ratios=ratios)


def bench_edges(args) -> list[dict]:
    """The edge-feature layers against PyG's, on every chosen graph."""
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        print("attention bench: torch_geometric is not installed, skipping the edge layers")
        return []
    return [_edge_one(*case, args) for case in _edge_cases(args)]


# ------------------------------------------------------------------------------------------------
def bench_mixed(args) -> list[dict]:
    from .. import convolve
    from ..attention import DotProduct, Masked, Softmax, attention_basis, shift_basis
    from ..nn.attention import MixedAttention
    from ..params import LowRank

    B, L, E, H, shifts = (2, 32, 16, 2, (1, 2)) if args.quick else (16, 512, 256, 8, (1, 2, 3, 4))
    torch.manual_seed(args.seed)
    layer = MixedAttention(E, H, shifts=shifts)
    x = torch.randn(B, L, E)
    D = E // H
    att_theta = LowRank(H, E, E, D)
    shift_theta = LowRank(len(shifts), E, E, D)
    with torch.no_grad():  # the parts carry the layer's own weights
        att_theta.value.copy_(layer.theta.value[:H])
        att_theta.out.copy_(layer.theta.out[:H])
        shift_theta.value.copy_(layer.theta.value[H:])
        shift_theta.out.copy_(layer.theta.out[H:])
    qk: DotProduct = layer.qk
    sb = shift_basis(L, shifts)

    def attention_part():
        basis = attention_basis(Softmax(Masked(qk, causal=True)), x, x)
        return convolve(x, basis, att_theta, route="lowrank_heads")

    def shift_part():
        return convolve(x, sb, shift_theta, route="lowrank_heads")

    def mixed():
        return layer(x)[0]

    torch.testing.assert_close(mixed(), attention_part() + shift_part() + layer.bias)
    fns = {"mixed": mixed, "attention_part": attention_part, "shift_part": shift_part}
    fwd = interleaved_times(fns, repeats=args.repeats)
    fb = interleaved_times({k: fwd_bwd(f) for k, f in fns.items()}, repeats=args.repeats)
    ratios = {"mixed_over_parts": {
        "forward": fwd["mixed"] / (fwd["attention_part"] + fwd["shift_part"]),
        "forward_backward": fb["mixed"] / (fb["attention_part"] + fb["shift_part"])}}
    return [dict(B=B, L=L, d=E, attention_heads=H, shifts=list(shifts), forward_s=fwd,
                 forward_backward_s=fb, ratios=ratios)]


# ------------------------------------------------------------------------------------------------
def _print_rows(title: str, rows: list[dict], key) -> None:
    print(f"\n== {title}")
    for r in rows:
        print(f"-- {key(r)}")
        for t in ("forward_s", "forward_backward_s", "inference_s"):
            if t in r:
                print(f"   {t[:-2]:<17} " + "  ".join(f"{k}={v * 1e3:.1f}ms"
                                                      for k, v in r[t].items()))
        if r.get("peak_memory_mb"):
            print("   peak memory (fwd+bwd) " + "  ".join(
                f"{k}={'n/a' if v is None else f'{v:.0f}MB'}"
                for k, v in r["peak_memory_mb"].items()))
        for name, vals in r["ratios"].items():
            op, lim = TARGETS.get(name, ("", None))
            flags = "  ".join(
                f"{k}={v:.2f}x" + ("" if lim is None else (" ok" if _check(name, v) else " MISS"))
                for k, v in vals.items())
            tgt = f" (target {op} {lim})" if lim is not None else ""
            print(f"   {name}{tgt}: {flags}")


def run(args) -> int:
    from pathlib import Path

    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    if getattr(args, "device", "cpu") != "cpu":
        print("attention bench: CPU only (the targets are CPU figures); running on cpu")
    warnings.filterwarnings("ignore", message=".*[Ss]parse CSR.*")
    parts = {p.strip() for p in getattr(args, "parts", "mha,gat,edges,mixed").split(",")
             if p.strip()}
    bad = parts - {"mha", "gat", "edges", "mixed"}
    if bad:
        print(f"attention bench: unknown parts {sorted(bad)}; choose from mha, gat, edges, "
              "mixed", file=sys.stderr)
        return 2
    try:
        _mha_cases(args), _gat_cases(args), _edge_cases(args)
    except ValueError as e:
        print(f"attention bench: {e}", file=sys.stderr)
        return 2
    result = dict(suite=NAME, allocator=dict(ALLOCATOR), conditions=record(),
                  quick=bool(args.quick), repeats=args.repeats, seed=args.seed,
                  torch=torch.__version__, threads=torch.get_num_threads(),
                  machine=platform.machine(), targets={k: list(v) for k, v in TARGETS.items()})
    if "mha" in parts:
        result["mha"] = bench_mha(args)
        _print_rows("multi-head attention vs torch", result["mha"],
                    lambda r: f"B={r['B']} L={r['L']} d={r['d']} heads={r['heads']}")
    if "gat" in parts:
        result["gat"] = bench_gat(args)
        _print_rows("GAT vs PyG", result["gat"],
                    lambda r: f"{r['graph']}: {r['nodes']} nodes, {r['edges']} edges, "
                              f"{r['features']} features")
    if "edges" in parts:
        result["edges"] = bench_edges(args)
        _print_rows("graph-attention layers with edge features vs PyG", result["edges"],
                    lambda r: f"{r['layer']} on {r['graph']}: {r['nodes']} nodes, "
                              f"{r['edges']} edges, {r['features']} features")
    if "mixed" in parts:
        result["mixed"] = bench_mixed(args)
        _print_rows("mixed attention + shift heads vs its parts", result["mixed"],
                    lambda r: f"B={r['B']} L={r['L']} d={r['d']} heads={r['attention_heads']} "
                              f"shifts={r['shifts']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / f"{NAME}.json", result)
    print(f"\nwrote {out / f'{NAME}.json'}")
    return 0

"""``structconv bench graph``: graph layers against PyG and against a hand-ordered contraction.

For Cora-sized (2708 nodes, 10556 edges, 1433 -> 16), PubMed-sized (19717, 88648, 500 -> 16) and
a random 200k-node / 2M-edge graph (128 -> 16), each of GCN, Cheb K=3, TAG K=3, SGC K=2 and
R-GCN (4 relations) is timed forward (no grad) and forward+backward (weight gradients) in three
forms measured in the same run, interleaved: PyG's layer (the anchor), structconv's layer (from
``sc.nn.from_pyg``, planner on ``auto``), and a hand-written plain-torch contraction in the best
order (Θ first when Q < P, one CSR SpMM per polynomial order, structure prebuilt). Also reported:
peak extra memory (forked process) of a forward+backward, and the ratio to the floor, the larger
of (bytes of edges and features moved once / measured copy bandwidth) and (multiply-adds of the
cheapest order / measured GEMM rate). A 1M-node / 10M-edge GCN forward+backward closes the run.
"""

from __future__ import annotations

import argparse
import gc
import platform
import time
from pathlib import Path

import torch

from ..basis.base import csr_matmul, to_csr
from ..io import atomic_write_json
from ._util import ALLOCATOR, fwd_bwd, interleaved_times, peak_memory, record

NAME = "graph"
LAYERS = ("gcn", "cheb", "tag", "sgc", "rgcn")
GRAPHS = {
    "cora": (2708, 10556, 1433, 16),
    "pubmed": (19717, 88648, 500, 16),
    "random200k": (200_000, 2_000_000, 128, 16),
}
QUICK_GRAPHS = {"tiny": (300, 1500, 48, 8), "small": (2000, 10000, 96, 16)}
HUGE = (1_000_000, 10_000_000, 128, 16)
RELATIONS = 4


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graphs", default="", help=f"comma list from {list(GRAPHS)} (default all)")
    p.add_argument("--layers", default="", help=f"comma list from {list(LAYERS)} (default all)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    p.add_argument("--skip-huge", action="store_true",
                   help="skip the 1M-node / 10M-edge GCN forward+backward")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")


def _pick(spec: str, known, what: str) -> list[str]:
    if not spec:
        return list(known)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown {what} {bad}: choose from {list(known)}")
    return names


def random_graph(n: int, E: int, P: int, seed: int):
    """A random directed graph (uniform endpoints), features (n, P) and relation types."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, E), generator=g)
    x = torch.randn(n, P, generator=g)
    et = torch.randint(0, RELATIONS, (E,), generator=g)
    return x, ei, et


# ------------------------------------------------------------------------------------------------
# PyG modules and the hand-ordered contractions
def pyg_layer(name: str, P: int, Q: int):
    import torch_geometric.nn as pnn

    return {
        "gcn": lambda: pnn.GCNConv(P, Q, cached=True),
        "cheb": lambda: pnn.ChebConv(P, Q, 3),
        "tag": lambda: pnn.TAGConv(P, Q, 3),
        "sgc": lambda: pnn.SGConv(P, Q, 2),
        "rgcn": lambda: pnn.RGCNConv(P, Q, RELATIONS),
    }[name]()


def _csr_pair(src, dst, val, n_rows, n_cols):
    """(S, Sᵀ) CSR with S[dst, src] = val: S @ X aggregates at targets."""
    return to_csr(dst, src, val, (n_rows, n_cols)), to_csr(src, dst, val, (n_cols, n_rows))


def hand_contraction(name: str, m, x, ei, et):
    """A plain-torch closure computing the layer in its best order, structure prebuilt."""
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    n = x.shape[0]
    if name in ("gcn", "sgc", "tag"):
        loops = name != "tag"
        e2, w2 = gcn_norm(ei, None, n, False, loops, "source_to_target", x.dtype)
        S = _csr_pair(e2[0], e2[1], w2, n, n)
    if name == "gcn":
        W, b = m.lin.weight, m.bias
        return lambda: csr_matmul(*S, x @ W.t()) + b
    if name == "sgc":
        W, b = m.lin.weight, m.lin.bias
        return lambda: csr_matmul(*S, csr_matmul(*S, x @ W.t())) + b
    if name == "tag":
        Ws, b = m.lins, m.bias

        def tag():
            Q = Ws[0].weight.shape[0]
            z = (x @ torch.cat([lin.weight for lin in Ws]).t()).split(Q, 1)
            r = z[-1]
            for zk in reversed(z[:-1]):  # Horner: S(S(S z3 + z2) + z1) + z0
                r = csr_matmul(*S, r) + zk
            return r + b
        return tag
    if name == "cheb":
        e2, w2 = m.__norm__(ei, n, None, m.normalization, None, x.dtype)
        L = _csr_pair(e2[0], e2[1], w2, n, n)
        Ws, b = m.lins, m.bias

        def cheb():
            Q = Ws[0].weight.shape[0]
            z0, z1, z2 = (x @ torch.cat([lin.weight for lin in Ws]).t()).split(Q, 1)
            b1 = 2.0 * csr_matmul(*L, z2) + z1  # Clenshaw, K = 3: two SpMMs
            return csr_matmul(*L, b1) + z0 - z2 + b
        return cheb
    if name == "rgcn":
        src, dst = ei
        # mean per (target, relation): R-GCN's 1 / c_{n,r}
        cnt = torch.zeros(n * RELATIONS).index_add_(0, dst * RELATIONS + et,
                                                    torch.ones(src.shape[0]))
        val = 1.0 / cnt[dst * RELATIONS + et]
        wide = _csr_pair(src * RELATIONS + et, dst, val, n, n * RELATIONS)
        W, root, b = m.weight, m.root, m.bias

        def rgcn():
            P, Q = W.shape[1], W.shape[2]
            z = x @ W.permute(1, 0, 2).reshape(P, RELATIONS * Q)  # (n, R*Q) = (n*R, Q)
            return csr_matmul(*wide, z.reshape(n * RELATIONS, Q)) + x @ root + b
        return rgcn
    raise ValueError(name)


def floor_seconds(name: str, n: int, E: int, P: int, Q: int, bw: float, rate: float):
    """(bytes floor, flops floor) of one forward: data moved once, cheapest multiply-adds."""
    K_theta = {"gcn": 1, "cheb": 3, "tag": 4, "sgc": 1, "rgcn": RELATIONS + 1}[name]
    spmm = {"gcn": 1, "cheb": 2, "tag": 3, "sgc": 2, "rgcn": 1}[name]
    nnz = E + (n if name in ("gcn", "sgc", "cheb") else 0)  # added loops / Laplacian diagonal
    moved = nnz * (8 + 4) + n * P * 4 + n * Q * 4  # CSR column + value, x read, y written
    madds = n * P * K_theta * Q + spmm * nnz * Q
    return moved / bw, madds / rate


def machine_rates(quick: bool) -> tuple[float, float]:
    """(copy bandwidth in bytes/s, float32 GEMM multiply-adds/s) measured now."""
    from ._util import median_time

    a = torch.randn(2**22 if quick else 2**25)
    t = median_time(lambda: a.clone(), repeats=5, warmup=1)
    bw = 2 * a.numel() * 4 / t
    x, w = torch.randn(20000, 512), torch.randn(512, 64)
    t = median_time(lambda: x @ w, repeats=5, warmup=1)
    return bw, 20000 * 512 * 64 / t


# ------------------------------------------------------------------------------------------------
def bench_case(gname, n, E, P, Q, layer, args, rates):
    import structconv as sc

    torch.manual_seed(args.seed)
    x, ei, et = random_graph(n, E, P, args.seed)
    ref = pyg_layer(layer, P, Q).eval()
    ours = sc.nn.from_pyg(ref)
    extra = (et,) if layer == "rgcn" else ()
    run_pyg = lambda: ref(x, ei, *extra)  # noqa: E731
    run_ours = lambda: ours(x, ei, *extra)  # noqa: E731
    run_hand = hand_contraction(layer, ref, x, ei, et)
    with torch.no_grad():
        err = float((run_ours() - run_pyg()).abs().max())
        err_hand = float((run_hand() - run_pyg()).abs().max())
    route = ours.plan(x, ei, *extra).route
    repeats = max(3, args.repeats)

    def nograd(f):
        def g():
            with torch.no_grad():
                return f()
        return g

    fw = interleaved_times({"pyg": nograd(run_pyg), "ours": nograd(run_ours),
                            "hand": nograd(run_hand)}, repeats=repeats, warmup=1)
    fb = interleaved_times({"pyg": fwd_bwd(run_pyg), "ours": fwd_bwd(run_ours),
                            "hand": fwd_bwd(run_hand)}, repeats=repeats, warmup=1)
    mem = {}
    if not args.no_memory:
        for k, f in (("pyg", run_pyg), ("ours", run_ours), ("hand", run_hand)):
            # per-call peak with the structure cached, as timed (one warm-up call in the
            # measuring process takes its one-time costs)
            mem[k] = peak_memory(lambda f=f: fwd_bwd(f), warmup=1)
    fb_bytes, fb_flops = floor_seconds(layer, n, E, P, Q, *rates)
    floor = max(fb_bytes, fb_flops)
    row = dict(graph=gname, layer=layer, n=n, E=E, P=P, Q=Q, route=route,
               max_abs_err=err, max_abs_err_hand=err_hand,
               fwd=fw, fwd_bwd=fb, peak_bytes=mem,
               fwd_ratio_pyg=fw["ours"] / fw["pyg"], fwd_bwd_ratio_pyg=fb["ours"] / fb["pyg"],
               fwd_ratio_hand=fw["ours"] / fw["hand"],
               fwd_bwd_ratio_hand=fb["ours"] / fb["hand"],
               floor_fwd_s=floor, floor_bytes_s=fb_bytes, floor_flops_s=fb_flops,
               fwd_ratio_floor=fw["ours"] / floor,
               fwd_bwd_ratio_floor=fb["ours"] / (2 * floor))
    if mem.get("ours") is not None and mem.get("pyg"):
        row["mem_ratio_pyg"] = mem["ours"] / mem["pyg"]
    return row


def huge_gcn(args) -> dict:
    """The 1M-node / 10M-edge GCN forward+backward (ours; PyG too for the anchor)."""
    import structconv as sc

    n, E, P, Q = HUGE
    x, ei, _ = random_graph(n, E, P, args.seed)
    ref = pyg_layer("gcn", P, Q)
    ours = sc.nn.from_pyg(ref)
    out = {"n": n, "E": E, "P": P, "Q": Q}
    for k, m in (("ours", ours), ("pyg", ref)):
        f = fwd_bwd(lambda m=m: m(x, ei))
        t0 = time.perf_counter()
        f()  # first call: builds (and caches) the normalised structure
        out[f"{k}_first_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        f()
        out[f"{k}_fwd_bwd_s"] = time.perf_counter() - t0
        if not args.no_memory:
            out[f"{k}_peak_bytes"] = peak_memory(lambda f=f: f)
        gc.collect()
    out["fwd_bwd_ratio_pyg"] = out["ours_fwd_bwd_s"] / out["pyg_fwd_bwd_s"]
    return out


def _mib(b):
    return "   n/a" if b is None else f"{b / 2**20:6.0f}"


def run(args) -> int:
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    try:
        import torch_geometric  # noqa: F401
    except ModuleNotFoundError:
        print("bench graph needs PyG (pip install torch-geometric) for its anchor")
        return 2
    graphs = QUICK_GRAPHS if args.quick else {k: GRAPHS[k] for k in
                                              _pick(args.graphs, GRAPHS, "graphs")}
    layers = _pick(args.layers, LAYERS, "layers")
    t0 = time.time()
    rates = machine_rates(args.quick)
    print(f"machine: copy {rates[0] / 1e9:.1f} GB/s, GEMM {rates[1] / 1e9:.1f} G madd/s, "
          f"{torch.get_num_threads()} threads")
    print(f"{'graph':<11}{'layer':<6}{'route':<12}{'fwd ms':>9}{'/pyg':>7}{'/hand':>7}"
          f"{'/floor':>8}{'f+b ms':>9}{'/pyg':>7}{'/hand':>7}{'/floor':>8}"
          f"{'MiB ours':>9}{'pyg':>7}")
    rows = []
    for gname, (n, E, P, Q) in graphs.items():
        for layer in layers:
            r = bench_case(gname, n, E, P, Q, layer, args, rates)
            rows.append(r)
            print(f"{gname:<11}{layer:<6}{r['route']:<12}{r['fwd']['ours'] * 1e3:9.2f}"
                  f"{r['fwd_ratio_pyg']:7.2f}{r['fwd_ratio_hand']:7.2f}"
                  f"{r['fwd_ratio_floor']:8.1f}{r['fwd_bwd']['ours'] * 1e3:9.2f}"
                  f"{r['fwd_bwd_ratio_pyg']:7.2f}{r['fwd_bwd_ratio_hand']:7.2f}"
                  f"{r['fwd_bwd_ratio_floor']:8.1f}{_mib(r['peak_bytes'].get('ours'))[-6:]:>9}"
                  f"{_mib(r['peak_bytes'].get('pyg'))[-6:]:>7}", flush=True)
            gc.collect()
    n_ok = sum(r["fwd_ratio_pyg"] <= 1.0 and r["fwd_bwd_ratio_pyg"] <= 1.0 for r in rows)
    n_hand = sum(max(r["fwd_ratio_hand"], r["fwd_bwd_ratio_hand"]) <= 1.10 for r in rows)
    print(f"never slower than PyG (fwd and fwd+bwd): {n_ok}/{len(rows)}; within 1.10x of the "
          f"hand-ordered contraction: {n_hand}/{len(rows)}")
    result = dict(suite=NAME, allocator=dict(ALLOCATOR), conditions=record(),
                  machine=platform.machine(), threads=torch.get_num_threads(),
                  torch=torch.__version__, quick=bool(args.quick), repeats=args.repeats,
                  copy_bytes_per_s=rates[0], gemm_madds_per_s=rates[1], cases=rows)
    if not args.quick and not args.skip_huge:
        h = huge_gcn(args)
        result["huge_gcn"] = h
        print(f"1M nodes / 10M edges GCN fwd+bwd: ours {h['ours_fwd_bwd_s']:.2f} s "
              f"(first call {h['ours_first_s']:.2f} s, peak {_mib(h.get('ours_peak_bytes'))} "
              f"MiB), PyG {h['pyg_fwd_bwd_s']:.2f} s (peak {_mib(h.get('pyg_peak_bytes'))} MiB)")
    result["seconds"] = time.time() - t0
    out = Path(args.out) / f"{NAME}.json"
    atomic_write_json(out, result)
    print(f"wrote {out}")
    return 0

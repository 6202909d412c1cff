"""``structconv bench hetero``: typed graphs against PyG, with the same weights, in the same run.

* ``dblp_sage``: one full-batch training epoch (forward, cross-entropy on the training authors,
  backward, Adam step) of a 2-layer typed SAGE on DBLP (conferences get a constant feature, as
  PyG's examples): structconv's ``TypedGraphConv`` layers against PyG's
  ``to_hetero(GraphSAGE)``, weights copied from PyG's.
* ``dblp_hgt``: forward+backward of one HGT layer (per-type widths -> 64, 2 heads) on DBLP,
  ``from_pyg`` of PyG's ``HGTConv``.
* ``types``: a synthetic typed graph with 2, 4, 8, 16, 32 node types at a fixed total size
  (nodes, edges, 64 -> 64 channels; relations "next" and "prev" between neighbouring types):
  the forward time of one typed SAGE layer, structconv and PyG, and each one's growth from 2
  to 32 types.

Timings are medians over interleaved repeats; ratios are structconv / PyG of the same run.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..io import atomic_write_json
from ._util import interleaved_times, record

NAME = "hetero"
TYPES = (2, 4, 8, 16, 32)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default="dblp_sage,dblp_hgt,types",
                   help="comma list of dblp_sage, dblp_hgt, types")
    p.add_argument("--hidden", type=int, default=64, help="hidden width (default 64)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")


def _dblp():
    import structconv as sc

    g = sc.data.load_dataset("dblp")
    g.x["conference"] = torch.ones(g.num_nodes["conference"], 1)
    return g


def _pyg_sage(meta, hidden, out, layers=2, in_channels=(-1, -1)):
    from torch_geometric.nn import GraphSAGE, to_hetero

    return to_hetero(GraphSAGE(in_channels, hidden, layers, out), meta)


def _ours_sage(ref, widths, meta, hidden, out, layers=2):
    import structconv as sc

    sizes = [widths] + [hidden] * (layers - 1)
    outs = [hidden] * (layers - 1) + [out]
    convs = torch.nn.ModuleList(sc.nn.TypedGraphConv(i, o, meta) for i, o in zip(sizes, outs))
    for conv, pyg in zip(convs, ref.convs):
        conv.load_relation_layers(dict(pyg.items()))
    return convs


def _run_ours(convs, x, ei):
    for i, conv in enumerate(convs):
        x = conv(x, ei)
        if i < len(convs) - 1:
            x = {t: v.relu() for t, v in x.items()}
    return x


def _epoch(model, opt, y, mask):
    def step():
        opt.zero_grad(set_to_none=True)
        out = model()["author"]
        F.cross_entropy(out[mask], y[mask]).backward()
        opt.step()
    return step


def dblp_sage(args) -> dict:
    g = _dblp()
    meta, x, ei = g.metadata(), g.x_dict, g.edge_index_dict
    torch.manual_seed(args.seed)
    ref = _pyg_sage(meta, args.hidden, 4)
    with torch.no_grad():
        ref(x, ei)  # PyG's lazy weights take their shapes
    ours = _ours_sage(ref, {t: v.shape[1] for t, v in x.items()}, meta, args.hidden, 4)
    with torch.no_grad():
        want, got = ref(x, ei)["author"], _run_ours(ours, x, ei)["author"]
    err = float((want - got).abs().max())
    y, mask = g.y["author"], g.masks["author"]["train"]
    fns = {"pyg": _epoch(lambda: ref(x, ei), torch.optim.Adam(ref.parameters(), 1e-3), y, mask),
           "ours": _epoch(lambda: _run_ours(ours, x, ei),
                          torch.optim.Adam(ours.parameters(), 1e-3), y, mask)}
    t = interleaved_times(fns, repeats=args.repeats, warmup=1)
    return dict(max_abs_err=err, epoch_s=t, ratio=t["ours"] / t["pyg"])


def dblp_hgt(args) -> dict:
    from torch_geometric.nn import HGTConv

    import structconv as sc

    g = _dblp()
    meta, x, ei = g.metadata(), g.x_dict, g.edge_index_dict
    torch.manual_seed(args.seed)
    ref = HGTConv({t: v.shape[1] for t, v in x.items()}, args.hidden, meta, heads=2)
    ours = sc.nn.from_pyg(ref)
    with torch.no_grad():
        err = max(float((ref(x, ei)[t] - v).abs().max()) for t, v in ours(x, ei).items())

    def fb(m):
        def run():
            out = m(x, ei)
            sum(v.square().mean() for v in out.values()).backward()
        return run
    t = interleaved_times({"pyg": fb(ref), "ours": fb(ours)}, repeats=args.repeats, warmup=1)
    return dict(max_abs_err=err, fwd_bwd_s=t, ratio=t["ours"] / t["pyg"])


def synthetic(T: int, n: int, E: int, P: int, seed: int):
    """A typed graph of T node types of n // T nodes; relations (t, next, t+1) and (t+1, prev,
    t) (mod T), E // (2T) random edges each; features (n // T, P) per type."""
    gen = torch.Generator().manual_seed(seed)
    # names that do not end in a digit: PyG 2.8's to_hetero names its fx values
    # "<layer>__<type>" and deduplicates with a numeric suffix, so with types "t1" and "t11"
    # the sum for t1 ("convs_0__t1" + "1") overwrites t11's value (its outputs are then wrong)
    types = [f"t{i}x" for i in range(T)]
    per, e = n // T, E // (2 * T)
    x = {t: torch.randn(per, P, generator=gen) for t in types}
    ei = {}
    for i, t in enumerate(types):
        u = types[(i + 1) % T]
        for rel, s, d in (("next", t, u), ("prev", u, t)):
            ei[(s, rel, d)] = torch.randint(0, per, (2, e), generator=gen)
    return (types, list(ei)), x, ei


def _nograd(m, x, ei):
    def run():
        with torch.no_grad():
            return m(x, ei)
    return run


def type_scaling(args) -> list[dict]:
    import structconv as sc

    n, E, P = (4000, 40_000, 64) if args.quick else (40_000, 400_000, 64)
    rows = []
    for T in TYPES:
        meta, x, ei = synthetic(T, n, E, P, args.seed)
        ref = _pyg_sage(meta, P, P, layers=1, in_channels=P).eval()
        ours = sc.nn.TypedGraphConv(P, P, meta)
        ours.load_relation_layers(dict(ref.convs[0].items()))
        with torch.no_grad():
            err = max(float((ref(x, ei)[t] - v).abs().max()) for t, v in ours(x, ei).items())
        t = interleaved_times({"pyg": _nograd(ref, x, ei), "ours": _nograd(ours, x, ei)},
                              repeats=args.repeats, warmup=1)
        rows.append(dict(types=T, relations=len(meta[1]), n=n, E=E, P=P, max_abs_err=err,
                         fwd_s=t, ratio=t["ours"] / t["pyg"]))
        print(f"types {T:3d} ({len(meta[1]):3d} relations): ours {t['ours'] * 1e3:8.2f} ms, "
              f"PyG {t['pyg'] * 1e3:8.2f} ms, ratio {t['ours'] / t['pyg']:.2f}, "
              f"err {err:.1e}", flush=True)
    return rows


def run(args) -> int:
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    try:
        import torch_geometric  # noqa: F401
    except ModuleNotFoundError:
        print("bench hetero needs PyG (pip install torch-geometric) for its anchor")
        return 2
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in ("dblp_sage", "dblp_hgt", "types")]
    if bad:
        raise ValueError(f"unknown parts {bad}: choose from dblp_sage, dblp_hgt, types")
    t0 = time.time()
    result = dict(suite=NAME, conditions=record(), machine=platform.machine(),
                  threads=torch.get_num_threads(), torch=torch.__version__,
                  quick=bool(args.quick), repeats=args.repeats)
    if "dblp_sage" in parts:
        r = result["dblp_sage"] = dblp_sage(args)
        print(f"DBLP 2-layer typed SAGE epoch: ours {r['epoch_s']['ours'] * 1e3:.1f} ms, PyG "
              f"to_hetero {r['epoch_s']['pyg'] * 1e3:.1f} ms, ratio {r['ratio']:.2f} "
              f"(err {r['max_abs_err']:.1e})", flush=True)
    if "dblp_hgt" in parts:
        r = result["dblp_hgt"] = dblp_hgt(args)
        print(f"DBLP HGT layer fwd+bwd: ours {r['fwd_bwd_s']['ours'] * 1e3:.1f} ms, PyG "
              f"{r['fwd_bwd_s']['pyg'] * 1e3:.1f} ms, ratio {r['ratio']:.2f} "
              f"(err {r['max_abs_err']:.1e})", flush=True)
    if "types" in parts:
        rows = result["types"] = type_scaling(args)
        for k in ("ours", "pyg"):
            result[f"growth_{k}"] = rows[-1]["fwd_s"][k] / rows[0]["fwd_s"][k]
        print(f"forward growth from {TYPES[0]} to {TYPES[-1]} types: ours "
              f"{result['growth_ours']:.2f}x, PyG {result['growth_pyg']:.2f}x")
    result["seconds"] = time.time() - t0
    out = Path(args.out) / f"{NAME}.json"
    atomic_write_json(out, result)
    print(f"wrote {out}")
    return 0

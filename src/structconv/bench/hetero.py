"""``structconv bench hetero``: typed graphs against PyG, with the same weights, in the same run.

* ``dblp_sage``: one full-batch training epoch (forward, cross-entropy on the training authors,
  backward, Adam step) of a 2-layer typed SAGE on DBLP (conferences get a constant feature, as
  PyG's examples): structconv's ``TypedGraphConv`` layers against PyG's
  ``to_hetero(GraphSAGE)``, weights copied from PyG's.
* ``dblp_hgt``: a full-batch training epoch (as ``dblp_sage``; Adam with the example's lr
  and weight decay) of PyG's ``hgt_dblp`` model: a linear map per node type to 64 with ReLU,
  one HGT layer (2 heads), a linear head; structconv's model holds ``from_pyg`` of PyG's
  ``HGTConv`` and copies of its linear maps (``epoch_s``, ``epoch_ratio``). Also the
  forward+backward of one HGT layer alone (per-type widths -> 64; ``fwd_bwd_s``, ``ratio``).
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
    p.add_argument("--plot", default=None,
                   help="also draw the types part's figure (forward time against the number "
                        "of node types, both libraries) as this PNG")
    p.add_argument("--from-json", default=None,
                   help="with --plot: draw it from a saved hetero.json (its types part) "
                        "instead of timing anything")


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


def hgt_forward(net: torch.nn.ModuleDict, x: dict, ei: dict, target: str = "author"):
    """PyG's ``hgt_dblp`` example model, ``net`` holding its parts: a linear map per node type
    to the hidden width with ReLU (``lins``), one HGT layer (``conv``: PyG's or structconv's),
    a linear head (``head``) on ``target``'s nodes: (n_target, classes)."""
    h = {t: net["lins"][t](v).relu() for t, v in x.items()}
    return net["head"](net["conv"](h, ei)[target])


def hgt_pair(meta, widths: dict, hidden: int, classes: int,
             heads: int = 2) -> tuple[torch.nn.ModuleDict, torch.nn.ModuleDict]:
    """(PyG's model, structconv's with the same weights: its HGT layer ``from_pyg`` of PyG's,
    copies of the linear maps), each the parts ``hgt_forward`` runs."""
    import copy

    from torch_geometric.nn import HGTConv

    import structconv as sc

    lins = torch.nn.ModuleDict({t: torch.nn.Linear(w, hidden) for t, w in widths.items()})
    conv = HGTConv(hidden, hidden, meta, heads=heads)
    ref = torch.nn.ModuleDict(dict(lins=lins, conv=conv, head=torch.nn.Linear(hidden, classes)))
    ours = torch.nn.ModuleDict(dict(lins=copy.deepcopy(lins), conv=sc.nn.from_pyg(conv),
                                    head=copy.deepcopy(ref["head"])))
    return ref, ours


def _hgt_epoch(args, g, meta, x, ei) -> dict:
    """One full-batch training epoch of PyG's hgt_dblp model (Adam as its example), each
    library's HGT layer in it, the same weights."""
    torch.manual_seed(args.seed)
    y, mask = g.y["author"], g.masks["author"]["train"]
    ref, ours = hgt_pair(meta, {t: v.shape[1] for t, v in x.items()}, args.hidden,
                         int(y.max()) + 1)
    with torch.no_grad():
        err = float((hgt_forward(ref, x, ei) - hgt_forward(ours, x, ei)).abs().max())
    fns = {m: _epoch(lambda net=net: {"author": hgt_forward(net, x, ei)},
                     torch.optim.Adam(net.parameters(), lr=0.005, weight_decay=0.001), y, mask)
           for m, net in (("pyg", ref), ("ours", ours))}
    t = interleaved_times(fns, repeats=args.repeats, warmup=1)
    return dict(epoch_max_abs_err=err, epoch_s=t, epoch_ratio=t["ours"] / t["pyg"])


def dblp_hgt(args) -> dict:
    """One HGT layer's forward+backward (per-type widths -> hidden) and a training epoch of
    the hgt_dblp model, structconv against PyG with the same weights."""
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
    out = dict(max_abs_err=err, fwd_bwd_s=t, ratio=t["ours"] / t["pyg"])
    out.update(_hgt_epoch(args, g, meta, x, ei))
    return out


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


def plot_types(result: dict, path) -> Path:
    """Write a PNG of the ``types`` part of a result (``run``'s JSON): forward time against
    the number of node types, structconv and PyG, the conditions in the title; returns the
    path."""
    import io

    from ..io import atomic_write_bytes
    from ..plots import pyplot

    rows = result.get("types") if isinstance(result, dict) else None
    if not rows:
        raise ValueError("plot_types needs a result with a 'types' part (bench hetero --parts "
                         "types)")
    plt = pyplot()
    T = [r["types"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for key, label, mark in (("ours", "structconv TypedGraphConv", "o-"),
                             ("pyg", "PyG to_hetero(SAGEConv)", "s--")):
        ax.plot(T, [r["fwd_s"][key] * 1e3 for r in rows], mark, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(T, [str(t) for t in T])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("node types (relations: twice as many)")
    ax.set_ylabel("forward time (ms, median)")
    r0, c = rows[0], result.get("conditions", {})
    load = c.get("load_average_1min")
    ax.set_title(f"one typed SAGE layer, {r0['n']:,} nodes, {r0['E']:,} edges, "
                 f"{r0['P']} channels\n{result.get('threads', '?')} thread(s), 1-min load "
                 f"{'?' if load is None else f'{load:.2f}'}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _replot(args) -> int:
    """``--from-json FILE --plot PNG``: the figure of a saved result, nothing timed."""
    import json

    try:
        result = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"--from-json: cannot read {args.from_json}: {e}")
        return 2
    print(f"wrote {plot_types(result, args.plot)}")
    return 0


def run(args) -> int:
    if getattr(args, "from_json", None):
        if not getattr(args, "plot", None):
            print("--from-json draws a figure: give --plot PATH too")
            return 2
        return _replot(args)
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
        print(f"DBLP HGT model epoch: ours {r['epoch_s']['ours'] * 1e3:.1f} ms, PyG "
              f"{r['epoch_s']['pyg'] * 1e3:.1f} ms, ratio {r['epoch_ratio']:.2f} "
              f"(err {r['epoch_max_abs_err']:.1e})", flush=True)
    if "types" in parts:
        rows = result["types"] = type_scaling(args)
        for k in ("ours", "pyg"):
            result[f"growth_{k}"] = rows[-1]["fwd_s"][k] / rows[0]["fwd_s"][k]
        print(f"forward growth from {TYPES[0]} to {TYPES[-1]} types: ours "
              f"{result['growth_ours']:.2f}x, PyG {result['growth_pyg']:.2f}x")
    result["seconds"] = time.time() - t0
    result["conditions"] = record()  # the load at the end too, not only at the start
    out = Path(args.out) / f"{NAME}.json"
    atomic_write_json(out, result)
    print(f"wrote {out}")
    if getattr(args, "plot", None) and "types" in parts:
        print(f"wrote {plot_types(result, args.plot)}")
    return 0

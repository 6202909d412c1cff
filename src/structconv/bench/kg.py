"""``structconv bench kg``: knowledge-graph speed and memory, same-run ratios.

* ``eval``: the full filtered evaluation of the FB15k-237 test set (20,466 triples, both
  directions, 14,541 candidates each) of a 200-dimensional DistMult model (target < 30 s);
* ``sorts``: an R-GCN layer (32 -> 32 channels, forward + backward) over the training graph's
  474 edge types (inverses included) with the 10 best supported mined 2-sorts (no backtracking)
  added, against the single relations alone, and the memory a 2-sort would take if
  materialised (its distinct pairs) against the walk's (its two factors' edges);
* ``rgcn``: an R-GCN link-prediction training step on WN18RR's training graph: entity table ->
  2 block-diagonal layers (blocks 5x5, root weights) -> DistMult scores of a batch of 30,000
  training triples and 30,000 corrupted ones -> binary cross-entropy -> backward, with the
  layers from structconv's ``RGCNConv`` against PyG's ``RGCNConv`` and ``FastRGCNConv`` holding
  the same weights (PyG optional; the decoder, the same module in all three, is in the timing);
  the encoder's forward + backward alone is timed too.

Medians over interleaved repeats; ``--quick`` runs a small synthetic graph.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..basis.mining import mine_sorts, walk_pairs
from ..data.kg import KGData, load_kg
from ..data.registry import data_root
from ..io import atomic_write_json
from ..kg import DistMult, evaluate
from ..kg.model import corrupt_triples, score_triples
from ..nn.convert import from_pyg
from ..nn.graph import RGCNConv
from ._util import interleaved_times, record

NAME = "kg"
TARGETS = {"eval_seconds": ("<", 30.0)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default="eval,sorts,rgcn", help="comma list of eval, sorts, rgcn")
    p.add_argument("--dim", type=int, default=100, help="R-GCN width (multiple of 5)")


def _synthetic(E=2000, R=6, T=20000, seed=0) -> KGData:
    g = torch.Generator().manual_seed(seed)
    t = torch.stack([torch.randint(0, E, (T,), generator=g), torch.randint(0, R, (T,), generator=g),
                     torch.randint(0, E, (T,), generator=g)], 1)
    n = T // 10
    return KGData("synthetic", [str(i) for i in range(E)], [f"r{i}" for i in range(R)],
                  t[2 * n:], t[:n], t[n:2 * n])


def _data(name: str, quick: bool) -> KGData:
    root = data_root()
    if quick or root is None or not (root / "kg" / name).is_dir():
        return _synthetic()
    return load_kg(root / "kg", name)


def bench_eval(args) -> dict:
    d = _data("FB15k-237", args.quick)
    torch.manual_seed(args.seed)
    ent = torch.randn(d.num_entities, 200)
    dec = DistMult(d.num_relations, 200).eval()
    known = torch.cat([d.train, d.valid, d.test])
    t0 = time.perf_counter()
    with torch.no_grad():
        evaluate(lambda h, r: dec.score_all(ent[h], r, ent), d.test, known, d.num_entities,
                 d.num_relations, batch_size=512)
    s = time.perf_counter() - t0
    print(f"eval: {d.name} test, {2 * len(d.test)} rankings over {d.num_entities} candidates: "
          f"{s:.2f} s (target < 30 s)")
    return dict(dataset=d.name, rankings=2 * len(d.test), candidates=d.num_entities,
                eval_seconds=s)


def bench_sorts(args) -> dict:
    d = _data("FB15k-237", args.quick)
    ei, et = d.graph("train")
    n, names = d.num_entities, d.relation_names
    mined = mine_sorts(ei, et, n, relations=names, top=10, confidence=False, backtrack=False)
    single = [(r,) for r in range(len(names))]
    torch.manual_seed(args.seed)
    x = torch.randn(n, 32)
    convs = {"single": RGCNConv(32, 32, len(names), sorts=single),
             "single+2sorts": RGCNConv(32, 32, len(names), sorts=single + [m.sort
                                                                          for m in mined])}

    def step(conv):
        def run():
            for p in conv.parameters():
                p.grad = None
            conv(x, ei, et).square().mean().backward()
        return run
    times = interleaved_times({k: step(c) for k, c in convs.items()}, repeats=args.repeats,
                              warmup=1)
    walk = [sum(int((et == r).sum()) for r in m.sort) for m in mined]
    pairs = [walk_pairs(ei, et, n, m.sort, 10**9).numel() for m in mined]
    r = dict(dataset=d.name, sorts=[m.name for m in mined], support=[m.support for m in mined],
             ms={k: v * 1e3 for k, v in times.items()},
             ratio_2sorts_over_single=times["single+2sorts"] / times["single"],
             walk_nnz=walk, materialised_nnz=pairs,
             single_nnz=int(ei.shape[1]))
    print(f"sorts: {len(single)} single relations {r['ms']['single']:.1f} ms, + "
          f"{len(mined)} mined 2-sorts {r['ms']['single+2sorts']:.1f} ms "
          f"({r['ratio_2sorts_over_single']:.2f}x); 2-sort non-zeros walked "
          f"{sum(walk):,} vs materialised {sum(pairs):,} ({sum(pairs) / max(sum(walk), 1):.1f}x)")
    return r


def _link_batch(train, n: int, seed: int, size: int = 30000):
    """(2 size, 3) triples and their labels: ``size`` training triples and as many head-or-tail
    corruptions, as ``train_link`` draws a negative-sampling batch."""
    g = torch.Generator().manual_seed(seed)
    pos = train[torch.randperm(len(train), generator=g)[:size]]
    neg = corrupt_triples(pos, n, 1, g)
    return torch.cat([pos, neg]), torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))])


def _encoders(D: int, R2: int) -> dict:
    """Two-layer block-diagonal R-GCN encoders by implementation, all with the same weights
    (structconv's converted from PyG's where PyG is installed)."""
    try:
        from torch_geometric.nn import FastRGCNConv
        from torch_geometric.nn import RGCNConv as PygRGCNConv
    except ImportError:
        return {"structconv": [RGCNConv(D, D, R2, num_blocks=D // 5) for _ in range(2)]}
    pyg = [PygRGCNConv(D, D, R2, num_blocks=D // 5) for _ in range(2)]
    fast = [FastRGCNConv(D, D, R2, num_blocks=D // 5) for _ in range(2)]
    for a, b in zip(fast, pyg):
        a.load_state_dict(b.state_dict())
    return {"structconv": [from_pyg(m) for m in pyg], "pyg_rgcn": pyg, "pyg_fast_rgcn": fast}


def bench_rgcn(args) -> dict:
    d = _data("WN18RR", args.quick)
    ei, et = d.graph("train")
    n, R2, D = d.num_entities, 2 * d.num_relations, args.dim
    torch.manual_seed(args.seed)
    entity = (torch.randn(n, D) * 0.1).requires_grad_()
    decoder = DistMult(d.num_relations, D, reciprocal=True, init_std=0.1)
    batch, y = _link_batch(d.train, n, args.seed)
    models = _encoders(D, R2)
    ours = models["structconv"]

    def zero(layers):
        for p in [entity, *decoder.parameters()] + [p for m in layers for p in m.parameters()]:
            p.grad = None

    def link_step(layers):
        def run():
            zero(layers)
            h = step_out(layers, entity, ei, et)
            s = score_triples(decoder, h, batch)
            torch.nn.functional.binary_cross_entropy_with_logits(s, y).backward()
        return run

    def encoder_step(layers):
        def run():
            zero(layers)
            step_out(layers, entity, ei, et).square().mean().backward()
        return run
    with torch.no_grad():
        ref = step_out(ours, entity, ei, et)
        diffs = {k: float((step_out(v, entity, ei, et) - ref).abs().max())
                 for k, v in models.items()}
    fns = {k: link_step(v) for k, v in models.items()}
    fns.update({f"{k}_encoder": encoder_step(v) for k, v in models.items()})
    times = interleaved_times(fns, repeats=args.repeats, warmup=1)
    r = dict(dataset=d.name, nodes=n, edges=int(ei.shape[1]), relations=R2, dim=D,
             batch=len(batch), ms={k: v * 1e3 for k, v in times.items()},
             max_abs_difference=diffs,
             ratios={f"{k}_over_structconv": times[k] / times["structconv"] for k in models
                     if k != "structconv"},
             encoder_ratios={f"{k}_over_structconv": times[f"{k}_encoder"]
                             / times["structconv_encoder"] for k in models if k != "structconv"})
    print(f"rgcn: {d.name}, {n} nodes, {ei.shape[1]} edges, {R2} edge types, width {D}, "
          f"batch {len(batch)}: link step "
          + ", ".join(f"{k} {times[k] * 1e3:.0f} ms" for k in models) + " ("
          + ", ".join(f"{k} {v:.2f}x" for k, v in r["ratios"].items()) + "); encoder alone "
          + ", ".join(f"{k} {times[k + '_encoder'] * 1e3:.0f} ms" for k in models) + " ("
          + ", ".join(f"{k} {v:.2f}x" for k, v in r["encoder_ratios"].items())
          + f"); max |difference| {max(diffs.values()):.2e}")
    return r


def step_out(layers, x, ei, et):
    h = x
    for i, layer in enumerate(layers):
        h = layer(h, ei, et)
        h = torch.relu(h) if i == 0 else h
    return h


def run(args) -> int:
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    fns = {"eval": bench_eval, "sorts": bench_sorts, "rgcn": bench_rgcn}
    bad = [p for p in parts if p not in fns]
    if bad:
        raise ValueError(f"kg bench: unknown parts {bad}: choose from {', '.join(fns)}")
    if args.dim < 5 or args.dim % 5:
        raise ValueError(f"kg bench: --dim must be a positive multiple of 5, got {args.dim}")
    result = dict(suite=NAME, quick=bool(args.quick), repeats=args.repeats,
                  torch=torch.__version__, threads=torch.get_num_threads())
    for p in parts:
        result[p] = fns[p](args)
    result["conditions"] = record()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "kg.json", result)
    print(f"wrote {out / 'kg.json'}")
    return 0

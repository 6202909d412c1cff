"""``structconv bench scale``: mini-batch training on a large synthetic graph, 1 and 2 processes.

On the synthetic stochastic block model (``data/synthetic.py``; default 10M nodes / 100M edges,
64 features, 8 classes), a 2-layer GCN (``sc.nn.GCNConv``) and a GraphSAGE-style mean aggregator
(``sc.nn.RGCNConv`` with one relation: y = x W_root + mean_{m -> n} x_m W + b) are trained with
fanouts (15, 10) and 1,024 seeds a batch for a fixed number of batches: seeds per second, the
share of the time spent sampling (and restricting the bases), resident memory after setup and
the peak (the graph is the largest resident object). The same models train full batch at a
smaller size (default 1M / 10M) for comparison, and the sampled runs are repeated with 2
processes (gloo, DDP; forked after setup, so the graph is shared) for the throughput gain.
Sampling alone (sampling and restricting, no model) is timed for the compiled path
(``kernels/sampler.cpp``) and the torch-op path, each with the fraction of a training step it
takes (its time over its time plus the model step's); the training runs use the compiled path
(``--paths``: python adds a 1-process run on the torch ops; ``--prefetch`` overlaps sampling
with the step in a background thread). ``--quick`` runs tiny sizes.
Typed sampling alone (``TypedNeighborLoader``: a fanout per relation, the features gathered) is
timed on a small synthetic typed graph (default 1M nodes / 10M edges over 4 node types and 8
relations, ``--typed-*``; ``--typed-types 0`` skips it), compiled against torch ops.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ..data.hetero import HeteroGraph
from ..data.synthetic import synthetic_bytes, synthetic_graph
from ..io import atomic_write_json
from ..models.graph import TwoLayerGraphNet
from ..sampling import GraphRestriction, NeighborLoader, TypedNeighborLoader
from ..training import distributed as D
from ._util import ALLOCATOR, peak_memory, record, status_kb
from .hetero import synthetic as synthetic_typed

__all__ = ["run", "add_arguments", "NAME"]

NAME = "scale"
MODELS = ("gcn", "sage")
QUICK = dict(nodes=3000, edges=30000, full_nodes=3000, full_edges=30000, batches=6,
             batch_size=64, typed_nodes=4000, typed_edges=40000)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=10_000_000, help="nodes of the sampled graph")
    p.add_argument("--edges", type=int, default=100_000_000, help="directed edges of it")
    p.add_argument("--full-nodes", type=int, default=1_000_000,
                   help="nodes of the full-batch comparison graph")
    p.add_argument("--full-edges", type=int, default=10_000_000, help="its edges")
    p.add_argument("--features", type=int, default=64, help="input features")
    p.add_argument("--hidden", type=int, default=64, help="hidden channels")
    p.add_argument("--fanouts", default="15,10",
                   help="fanouts, PyG's order: the first for the seeds (the last layer)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch and process")
    p.add_argument("--batches", type=int, default=50, help="timed batches per process")
    p.add_argument("--procs", default="1,2", help="process counts to run, comma list")
    p.add_argument("--models", default="gcn,sage", help=f"comma list from {list(MODELS)}")
    p.add_argument("--no-full", action="store_true", help="skip the full-batch comparison")
    p.add_argument("--paths", default="native,python",
                   help="sampler paths timed alone: native (compiled) and/or python (torch "
                        "ops); python also trains one process on the torch ops")
    p.add_argument("--prefetch", type=int, default=0,
                   help="batches sampled ahead in a background thread during training")
    p.add_argument("--typed-nodes", type=int, default=1_000_000,
                   help="nodes of the synthetic typed graph (typed sampling alone)")
    p.add_argument("--typed-edges", type=int, default=10_000_000, help="its edges")
    p.add_argument("--typed-types", type=int, default=4,
                   help="its node types (2 relations each; 0 skips typed sampling)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads of the 1-process runs (default: torch's); an N-process "
                        "run gives each process cores / N")


def _mib(kb) -> float | None:
    return None if kb is None else kb / 1024


def _restriction(kind: str, data, edge_type):
    # one restriction serves both layers (the same graph and options): its per-edge values
    # are held once
    if kind == "gcn":
        return GraphRestriction("gcn", data.edge_index, data.num_nodes)
    return GraphRestriction("relational", data.edge_index, data.num_nodes, edge_type=edge_type,
                            sorts=[(0,)], normalization="mean", num_relations=1)


def _train(net: nn.Module, loader, batches: int) -> dict:
    """Train ``batches`` batches after one warm-up batch; times of sampling and of the step."""
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    it = iter(loader)
    t_sample = t_step = 0.0
    seeds = 0
    for i in range(batches + 1):
        t0 = time.perf_counter()
        b = next(it, None)
        if b is None:  # a short epoch: go on with the next
            it = iter(loader)
            b = next(it)
        t1 = time.perf_counter()
        loss = F.cross_entropy(net(b), b.y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t2 = time.perf_counter()
        if i:  # the first batch warms the allocator and the kernels up
            t_sample, t_step, seeds = t_sample + t1 - t0, t_step + t2 - t1, seeds + b.batch_size
    total = t_sample + t_step
    return dict(seeds=seeds, seconds=total, seeds_per_s=seeds / total,
                sampler_share=t_sample / total, sample_s=t_sample, step_s=t_step,
                loss=float(loss.detach()))


def _sampling_alone(loader, batches: int) -> dict:
    """Sampling and restricting only: ``batches`` batches after one warm-up, seeds per second."""
    it = iter(loader)
    seeds, t = 0, 0.0
    for i in range(batches + 1):
        t0 = time.perf_counter()
        b = next(it, None)
        if b is None:
            it = iter(loader)
            b = next(it)
        if i:
            t, seeds = t + time.perf_counter() - t0, seeds + b.batch_size
    return dict(seeds=seeds, seconds=t, seeds_per_s=seeds / t, batch_s=t / batches)


def _paths(kind, loader, args, steps: dict) -> dict:
    """Sampling alone per path, and the fraction of a step (its sampling + the model step
    measured on that path, ``steps[path]`` seconds a batch) it takes."""
    out = {}
    for path in [p.strip() for p in args.paths.split(",") if p.strip()]:
        loader.use_native(path == "native")
        loader.set_epoch(0)
        r = _sampling_alone(loader, args.batches)
        step_s = steps.get(path)
        if step_s is not None:
            r["step_fraction"] = r["batch_s"] / (r["batch_s"] + step_s)
        out[path] = r
        print(f"  {kind:<5} sampling alone, {path:<6}: {r['seeds_per_s']:10.0f} seeds/s"
              + (f", {100 * r['step_fraction']:4.1f} % of a step" if step_s else ""), flush=True)
    loader.use_native(None)
    if "native" in out and "python" in out:
        out["speedup"] = out["native"]["seeds_per_s"] / out["python"]["seeds_per_s"]
    return out


def _worker(kind, loader, dims, batches, out_dir):
    """One process of a multi-process run: its share of the batches, gradients by DDP."""
    w = D.init("cpu")
    # a size-1 dim's stride is arbitrary (the trainer filters the same harmless copy warning)
    warnings.filterwarnings("ignore", message=".*Grad strides do not match bucket view")
    loader.rank, loader.world_size = w.rank, w.size
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(TwoLayerGraphNet(kind, *dims))
    r = _train(net, loader, batches)
    r["peak_rss_mib"] = _mib(status_kb("VmHWM"))
    Path(out_dir, f"rank{w.rank}.json").write_text(json.dumps(r))


def _sampled(kind: str, data, edge_type, args, dims, procs) -> dict:
    fan = [int(f) for f in args.fanouts.split(",")]
    r = _restriction(kind, data, edge_type)
    loader = NeighborLoader(data.edge_index, data.num_nodes, fan, layers=[r, r], x=data.x,
                            y=data.y, input_nodes=data.masks["train"],
                            batch_size=args.batch_size, shuffle=True, seed=args.seed,
                            prefetch=args.prefetch)
    out = dict(setup_rss_mib=_mib(status_kb("VmRSS")), prefetch=args.prefetch)
    for n in procs:
        if n == 1:
            torch.manual_seed(0)
            res = _train(TwoLayerGraphNet(kind, *dims), loader, args.batches)
            res["peak_rss_mib"] = _mib(status_kb("VmHWM"))
        else:
            with tempfile.TemporaryDirectory() as tmp:
                D.spawn(n, _worker, kind, loader, dims, args.batches, tmp)
                ranks = [json.loads(Path(tmp, f"rank{i}.json").read_text()) for i in range(n)]
            wall = max(x["seconds"] for x in ranks)
            seeds = sum(x["seeds"] for x in ranks)
            res = dict(seeds=seeds, seconds=wall, seeds_per_s=seeds / wall,
                       sampler_share=sum(x["sampler_share"] for x in ranks) / n,
                       peak_rss_mib_per_rank=[x["peak_rss_mib"] for x in ranks])
        out[f"procs{n}"] = res
        print(f"  {kind:<5} sampled, {n} process(es): {res['seeds_per_s']:10.0f} seeds/s, "
              f"sampler {100 * res['sampler_share']:4.1f} %", flush=True)
    if 1 in procs and len(procs) > 1:
        out["speedup"] = {f"procs{n}": out[f"procs{n}"]["seeds_per_s"] /
                          out["procs1"]["seeds_per_s"] for n in procs if n > 1}
    if 1 in procs and "python" in args.paths:  # the same training on the torch-op path
        loader.use_native(False)
        loader.set_epoch(0)
        torch.manual_seed(0)
        res = _train(TwoLayerGraphNet(kind, *dims), loader, args.batches)
        loader.use_native(None)
        out["procs1_python"] = res
        print(f"  {kind:<5} sampled, 1 process, torch ops: {res['seeds_per_s']:10.0f} seeds/s, "
              f"sampler {100 * res['sampler_share']:4.1f} %", flush=True)
    steps = {} if args.prefetch else {
        path: out[k]["step_s"] / args.batches
        for path, k in (("native", "procs1"), ("python", "procs1_python")) if k in out}
    out["sampling_alone"] = _paths(kind, loader, args, steps)
    return out


def _typed(args, n: int, E: int) -> dict:
    """Typed sampling alone on a synthetic typed graph (``bench hetero``'s: relations "next"
    and "prev" between neighbouring types), seeds of the first type, the same fanouts for
    every relation: seeds per second per path and the compiled path's speedup."""
    T = args.typed_types
    meta, x, ei = synthetic_typed(T, n, E, args.features, args.seed)
    per = n // T
    graph = HeteroGraph({t: per for t in meta[0]}, ei, x)
    fan = [int(f) for f in args.fanouts.split(",")]
    loader = TypedNeighborLoader(graph, fan, input_nodes=meta[0][0],
                                 batch_size=args.batch_size, shuffle=True, seed=args.seed)
    out = dict(nodes=per * T, edges=sum(v.shape[1] for v in ei.values()), types=T,
               relations=len(ei))
    for path in [p.strip() for p in args.paths.split(",") if p.strip()]:
        loader.use_native(path == "native")
        loader.set_epoch(0)
        out[path] = _sampling_alone(loader, args.batches)
        print(f"  typed sampling alone, {path:<6}: {out[path]['seeds_per_s']:10.0f} seeds/s "
              f"({T} types, {len(ei)} relations)", flush=True)
    if "native" in out and "python" in out:
        out["speedup"] = out["native"]["seeds_per_s"] / out["python"]["seeds_per_s"]
    return out


def _full(kind: str, args, dims, n: int, E: int) -> dict:
    """Full-batch training steps of the same model on an n-node graph: step time, the train
    nodes per second and the step's peak extra memory (forked process)."""
    data = synthetic_graph(nodes=n, edges=E, features=args.features, seed=args.seed)
    et = torch.zeros(data.edge_index.shape[1], dtype=torch.long)
    torch.manual_seed(0)
    net = TwoLayerGraphNet(kind, *dims)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    mask = data.masks["train"]

    def step():
        loss = F.cross_entropy(net.full(data.x, data.edge_index, et)[mask], data.y[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()  # builds (and caches) the normalised structure
    reps = 2 if args.quick else 3
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    dt = (time.perf_counter() - t0) / reps
    seeds = int(mask.sum())
    out = dict(nodes=n, edges=E, step_s=dt, train_nodes=seeds, seeds_per_s=seeds / dt,
               peak_extra_mib=None)
    peak = peak_memory(lambda: step)
    out["peak_extra_mib"] = None if peak is None else peak / 2**20
    print(f"  {kind:<5} full batch {n:,} nodes: {dt:.3f} s a step, {seeds / dt:10.0f} seeds/s",
          flush=True)
    return out


def _sizes(args):
    if args.quick:
        return dict(QUICK)
    return dict(nodes=args.nodes, edges=args.edges, full_nodes=args.full_nodes,
                full_edges=args.full_edges, batches=args.batches, batch_size=args.batch_size,
                typed_nodes=args.typed_nodes, typed_edges=args.typed_edges)


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    s = _sizes(args)
    args.batches, args.batch_size = s["batches"], s["batch_size"]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise ValueError(f"unknown models {bad}: choose from {list(MODELS)}")
    procs = sorted({int(p) for p in args.procs.split(",") if p.strip()})
    if not procs or procs[0] < 1:
        raise ValueError(f"--procs must list process counts >= 1, got {args.procs!r}")
    if args.typed_types < 0 or args.typed_types > s["typed_nodes"]:
        raise ValueError(f"--typed-types must lie in [0, {s['typed_nodes']}] (the typed "
                         f"graph's nodes), got {args.typed_types}")
    t0 = time.time()
    print(f"synthetic graph: {s['nodes']:,} nodes, {s['edges']:,} edges, {args.features} "
          f"features (about {synthetic_bytes(s['nodes'], s['edges'], args.features) / 2**30:.2f}"
          f" GiB)", flush=True)
    data = synthetic_graph(nodes=s["nodes"], edges=s["edges"], features=args.features,
                           seed=args.seed)
    et = torch.zeros(data.edge_index.shape[1], dtype=torch.long) if "sage" in models else None
    graph_mib = (data.edge_index.numel() * 8 + data.x.numel() * 4 + data.y.numel() * 8) / 2**20
    print(f"generated in {time.time() - t0:.1f} s; resident {_mib(status_kb('VmRSS')):.0f} MiB "
          f"(graph {graph_mib:.0f} MiB)", flush=True)
    dims = (args.features, args.hidden, data.num_classes)
    result = dict(suite=NAME, allocator=dict(ALLOCATOR), conditions=record(),
                  quick=bool(args.quick), sizes=s, threads=torch.get_num_threads(),
                  features=args.features, hidden=args.hidden, fanouts=args.fanouts,
                  graph_mib=graph_mib, models={})
    for kind in models:
        result["models"][kind] = {"sampled": _sampled(kind, data, et, args, dims, procs)}
        gc.collect()
    del data, et
    gc.collect()
    if not args.no_full:
        for kind in models:
            result["models"][kind]["full_batch"] = _full(kind, args, dims, s["full_nodes"],
                                                         s["full_edges"])
            gc.collect()
    if args.typed_types > 0:
        result["typed_sampling"] = _typed(args, s["typed_nodes"], s["typed_edges"])
        gc.collect()
    result["peak_rss_mib"] = _mib(status_kb("VmHWM"))
    result["conditions"] = record()
    result["seconds"] = time.time() - t0
    out = Path(args.out) / f"{NAME}.json"
    atomic_write_json(out, result)
    print(f"peak resident {result['peak_rss_mib']:.0f} MiB; wrote {out}")
    return 0


"""Recipe: R-GCN entity classification on AIFB / MUTAG, mean ± std test accuracy over seeds.

``structconv reproduce rgcn --dataset aifb --seeds 10 --data DIR --out DIR``. Settings of
Schlichtkrull et al. (2018): 2 layers, 16 hidden, featureless nodes, mean-normalised relations
plus a self-connection, Adam lr 0.01, 50 full-batch epochs; AIFB without basis decomposition and
without L2, MUTAG with 30 bases (``ControlledSeparable``, H=30) and L2 5e-4 on the first layer.
As in the paper, the model after the last epoch is evaluated (the standard split has no
validation set). Writes ``<out>/rgcn-<dataset>.json``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.planetoid import shared_dir
from ..data.registry import data_root
from ..data.rgcn import load_entities
from ._common import (  # argument types
    COUNT,
    NATURAL,
    add_recipe_arguments,
    device,
    publish,
    set_threads,
)

__all__ = ["RECIPES", "PUBLISHED", "add_arguments", "run", "train_seed", "settings"]

PUBLISHED = {"aifb": 95.83, "mutag": 73.23}
RECIPES = {
    "aifb": dict(hidden=16, num_bases=None, lr=0.01, weight_decay=0.0, epochs=50),
    "mutag": dict(hidden=16, num_bases=30, lr=0.01, weight_decay=5e-4, epochs=50),
}


def settings(dataset: str, **overrides) -> dict:
    """The recipe for ``dataset`` with non-None ``overrides`` applied."""
    if dataset not in RECIPES:
        raise ValueError(f"unknown dataset {dataset!r}: choose one of {sorted(RECIPES)}")
    s = dict(RECIPES[dataset])
    s.update({k: v for k, v in overrides.items() if v is not None})
    return s


def train_seed(data, s: dict, seed: int) -> dict:
    """Train one seed for ``s['epochs']`` epochs; returns final train/test accuracy and losses."""
    from ..models.graph import RGCN

    torch.manual_seed(seed)
    net = RGCN(data.edge_index, data.edge_type, data.num_nodes, data.num_relations,
               s["hidden"], data.num_classes, num_bases=s["num_bases"],
               sorts=s.get("sort_list")).to(data.edge_index.device)
    with torch.no_grad():
        theta0 = net.conv2.conv.param().clone()
    first = {id(p) for p in net.first_layer_parameters()}
    opt = torch.optim.Adam([
        dict(params=[p for p in net.parameters() if id(p) in first],
             weight_decay=s["weight_decay"]),
        dict(params=[p for p in net.parameters() if id(p) not in first], weight_decay=0.0),
    ], lr=s["lr"])
    losses = []
    t0 = time.perf_counter()
    for _ in range(s["epochs"]):
        net.train()
        opt.zero_grad()
        loss = F.cross_entropy(net()[data.train_idx], data.train_y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    net.eval()
    with torch.no_grad():
        pred = net().argmax(1)
    # how much the model used each sort: how far training moved its (hidden, classes) map in
    # layer 2 (a sort it never needs keeps its initial weights, whatever their size)
    with torch.no_grad():
        norms = (net.conv2.conv.param() - theta0).flatten(1).norm(dim=1).tolist()
    train_acc = float((pred[data.train_idx] == data.train_y).float().mean())
    test_acc = float((pred[data.test_idx] == data.test_y).float().mean())
    return dict(seed=seed, train_acc=100 * train_acc, test_acc=100 * test_acc,
                seconds=time.perf_counter() - t0, train_loss=losses, sort_norms=norms)


def _most_weighted(runs: list[dict], data, s: dict, top: int = 8) -> list[tuple[str, float]]:
    """The sorts whose layer-2 maps training moved most (mean over seeds), by name."""
    from ..basis.sorts import sort_name

    sorts = s.get("sort_list") or [(r,) for r in range(data.num_relations)]
    mean = torch.tensor([r["sort_norms"] for r in runs]).mean(0)
    order = torch.argsort(mean, descending=True)[:top].tolist()
    out = [(sort_name(sorts[k], data.relation_names), float(mean[k])) for k in order]
    print("  most used sorts (layer-2 change by training, mean over seeds): "
          + ", ".join(f"{n} {v:.2f}" for n, v in out))
    return out


#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(seeds=2, epochs=5)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", choices=sorted(RECIPES), default="aifb")
    add_recipe_arguments(parser, "folder with <name>_stripped.nt.gz and the TSV splits (default: "
                                 "rgcn/<name>/ in the data home, see `structconv datasets`)",
                         "2 seeds, 5 epochs (smoke test)")
    parser.add_argument("--bases", type=COUNT, default=None,
                        help="override the number of bases H (ControlledSeparable)")
    parser.add_argument("--cache", default=None, help="parse cache folder")
    parser.add_argument("--sorts", choices=["single", "mined"], default="single",
                        help="one basis matrix per relation (R-GCN), or those plus the --top "
                             "best supported mined paths of length 2 (the paper's sorts)")
    parser.add_argument("--top", type=NATURAL, default=10, help="mined 2-sorts to add")
    parser.add_argument("--no-backtrack", action="store_true",
                        help="mine no path that steps back along an inverse (r . r^-1)")


def run(args) -> int:
    """Run the recipe over seeds, print a table and write the JSON; returns an exit code."""
    set_threads(args)
    root = args.data or shared_dir(f"rgcn/{args.dataset}")
    if root is None:
        raise FileNotFoundError(f"no R-GCN data folder in the data home ({data_root()}): pass "
                                "--data DIR or set STRUCTCONV_DATA (see `structconv datasets`)")
    data = load_entities(root, args.dataset, cache_dir=getattr(args, "cache", None))
    data = data.to(device(args))
    s = settings(args.dataset, epochs=args.epochs or None,
                 num_bases=getattr(args, "bases", None))
    mined = []
    if getattr(args, "sorts", "single") == "mined":
        from ..basis.mining import mine_sorts

        names = data.relation_names
        mined = mine_sorts(data.edge_index, data.edge_type, data.num_nodes,
                           num_relations=data.num_relations, relations=names, top=args.top,
                           confidence=False, backtrack=not args.no_backtrack)
        s["sort_list"] = [(r,) for r in range(data.num_relations)] + [m.sort for m in mined]
        s["mined"] = [(m.name, m.support) for m in mined]
        print(f"  mined 2-sorts: {', '.join(f'{n} ({c})' for n, c in s['mined'])}")
    n_seeds = args.seeds
    seed0 = getattr(args, "seed", 0) or 0
    t0 = time.perf_counter()
    runs = []
    for i in range(n_seeds):
        r = train_seed(data, s, seed0 + i)
        runs.append(r)
        print(f"  seed {r['seed']:>3}: test {r['test_acc']:.2f}  train {r['train_acc']:.1f}  "
              f"{r['seconds']:.1f}s", flush=True)
    wall = time.perf_counter() - t0
    weighted = _most_weighted(runs, data, s)
    accs = [r["test_acc"] for r in runs]
    mean = statistics.fmean(accs)
    std = statistics.stdev(accs) if len(accs) > 1 else 0.0
    pub = PUBLISHED[args.dataset]
    result = dict(
        recipe="rgcn", dataset=args.dataset, settings=s, seeds=n_seeds,
        test_acc_mean=mean, test_acc_std=std, published=pub,
        within_one_std=abs(mean - pub) <= std, wall_seconds=wall,
        graph=dict(nodes=data.num_nodes, edges=data.num_edges, relations=data.num_relations,
                   train=len(data.train_idx), test=len(data.test_idx)),
        hardware=dict(machine=platform.machine(), processor=platform.processor(),
                      threads=torch.get_num_threads(), device=str(data.edge_index.device)),
        torch=torch.__version__, runs=runs, most_weighted_sorts=weighted,
    )
    print(f"{'dataset':<7} {'bases':>5} {'sorts':>6} {'test acc (%)':>16} {'published':>9} "
          f"{'wall':>8}")
    print(f"{args.dataset:<7} {str(s['num_bases']):>5} {data.num_relations + len(mined):>6} "
          f"{mean:>9.2f} ± {std:<4.2f} {pub:>9.2f} {wall:>7.1f}s")
    tag = "" if not mined else f"-mined{len(mined)}" + ("-nobt" if args.no_backtrack else "")
    tag += "" if s["num_bases"] is None else f"-H{s['num_bases']}"
    publish(Path(args.out) / f"rgcn-{args.dataset}{tag}.json", result)
    return 0

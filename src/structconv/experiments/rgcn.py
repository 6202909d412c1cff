"""Recipe: R-GCN entity classification on AIFB / MUTAG, mean ± std test accuracy over seeds.

``structconv reproduce rgcn --dataset aifb --seeds 10 --data DIR --out DIR``. Settings of
Schlichtkrull et al. (2018), the shipped config ``rgcn_entities``: 2 layers, 16 hidden,
featureless nodes, mean-normalised relations plus a self-connection, Adam lr 0.01, 50
full-batch epochs on every training entity; AIFB without basis decomposition and without L2,
MUTAG with 30 bases (``ControlledSeparable``, H=30) and L2 5e-4 on the first layer
(``PER_DATASET``). As in the paper, the model after the last epoch is evaluated
(``train.select = "last"``: the standard split has no validation set). Every seed is a run of
the training engine in ``<out>/rgcn-<dataset><tag>-<hash>/seed-<s>``, read back where
finished and resumed where interrupted. The engine draws the random numbers the loop this
recipe had before drew, but sums the loss over the training entities in node order (the
loop took them in the split file's order): the last digits of a loss differ, and a quick
run's accuracies may differ by a node. Writes ``<out>/rgcn-<dataset><tag>.json``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch

from ..config import graph_spec, load_config
from ..data.planetoid import shared_dir
from ..data.registry import data_root, load_dataset
from ..models.build import build_model, graph_sorts
from ..training import load_run
from ..training.tasks import task_for
from ._common import Bounded, add_recipe_arguments, publish, set_threads
from .sweep import Run, history, quoted, settings_tag, sweep

__all__ = ["CONFIG", "PER_DATASET", "PUBLISHED", "QUICK", "add_arguments", "run", "overrides",
           "settings"]

PUBLISHED = {"aifb": 95.83, "mutag": 73.23}
CONFIG = "rgcn_entities"
#: the paper's settings where a dataset's differ from AIFB's (the config's)
PER_DATASET = {"aifb": [], "mutag": ["model.graph.bases=30", "train.weight_decay=5e-4"]}
#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(seeds=2, epochs=5)



def overrides(args) -> list[str]:
    """The overrides of ``rgcn_entities`` that the arguments ask for (all but the seed)."""
    if args.dataset not in PER_DATASET:
        raise ValueError(f"unknown dataset {args.dataset!r}: choose one of {sorted(PUBLISHED)}")
    over = [f'data.name="{args.dataset}"', *PER_DATASET[args.dataset]]
    for key, value in (("data.root", args.data),
                       ("data.options.cache", getattr(args, "cache", None))):
        if value is not None:
            over.append(f"{key}={quoted(value)}")
    if args.epochs:
        over.append(f"train.epochs={args.epochs}")
    if getattr(args, "bases", None):
        over.append(f"model.graph.bases={args.bases}")
    if getattr(args, "sorts", "single") == "mined":
        over += ['model.graph.sorts="mined"', f"model.graph.top={args.top}",
                 f"model.graph.backtrack={str(not args.no_backtrack).lower()}"]
    return over


def settings(cfg: dict) -> dict:
    """The recipe's settings as the JSON reports them (``num_bases`` None: full weights)."""
    g, t = graph_spec(cfg), cfg["train"]
    return dict(hidden=g["hidden"], num_bases=g["bases"] or None, lr=t["lr"],
                weight_decay=t["weight_decay"], epochs=t["epochs"])


def _seed_row(folder: Path, run: Run, r: dict, data) -> dict:
    """A seed's accuracies (of the last epoch's model), loss curve and how far training moved
    each sort's layer-2 map (a sort it never needs keeps its initial weights)."""
    cfg, _, model = load_run(folder / run.name, "best")
    torch.manual_seed(cfg["seed"])  # the engine's: the seed, then the model
    theta0 = build_model(cfg, data).conv2.conv.param().detach()
    task = task_for(cfg, data)
    with torch.no_grad():
        norms = (model.conv2.conv.param() - theta0).flatten(1).norm(dim=1).tolist()
    return dict(seed=cfg["seed"], train_acc=100 * task.evaluate(model, "train")["acc"],
                test_acc=100 * r["test_acc"], seconds=r["train_time_s"],
                train_loss=[h["train_loss"] for h in history(folder, run)], sort_norms=norms)


def _most_weighted(runs: list[dict], sorts, names, top: int = 8) -> list[tuple[str, float]]:
    """The sorts whose layer-2 maps training moved most (mean over seeds), by name."""
    from ..basis.sorts import sort_name

    mean = torch.tensor([r["sort_norms"] for r in runs]).mean(0)
    order = torch.argsort(mean, descending=True)[:top].tolist()
    out = [(sort_name(sorts[k], names), float(mean[k])) for k in order]
    print("  most used sorts (layer-2 change by training, mean over seeds): "
          + ", ".join(f"{n} {v:.2f}" for n, v in out))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", choices=sorted(PUBLISHED), default="aifb")
    add_recipe_arguments(parser, "folder with <name>_stripped.nt.gz and the TSV splits (default: "
                                 "rgcn/<name>/ in the data home, see `structconv datasets`)",
                         "2 seeds, 5 epochs (smoke test)")
    parser.add_argument("--bases", type=Bounded(int, 1, 4096), default=None,
                        help="override the number of bases H (ControlledSeparable)")
    parser.add_argument("--cache", default=None, help="parse cache folder")
    parser.add_argument("--sorts", choices=["single", "mined"], default="single",
                        help="one basis matrix per relation (R-GCN), or those plus the --top "
                             "best supported mined paths of length 2 (the paper's sorts)")
    parser.add_argument("--top", type=Bounded(int, 1, 10_000), default=10,
                        help="mined 2-sorts to add")
    parser.add_argument("--no-backtrack", action="store_true",
                        help="mine no path that steps back along an inverse (r . r^-1)")


def run(args) -> int:
    """Run the recipe over seeds, print a table and write the JSON; returns an exit code."""
    set_threads(args)
    if args.data is None and shared_dir(f"rgcn/{args.dataset}") is None:
        raise FileNotFoundError(f"no R-GCN data folder in the data home ({data_root()}): pass "
                                "--data DIR or set STRUCTCONV_DATA (see `structconv datasets`)")
    over = overrides(args)
    cfg = load_config(CONFIG, over)
    d = cfg["data"]
    data = load_dataset(d["name"], d["root"], **d["options"])
    s = settings(cfg)
    sorts, mined = graph_sorts(graph_spec(cfg), data)
    if mined:
        s["sort_list"], s["mined"] = sorts, [(m.name, m.support) for m in mined]
        print(f"  mined 2-sorts: {', '.join(f'{n} ({c})' for n, c in s['mined'])}")
    tag = "" if not mined else f"-mined{len(mined)}" + ("-nobt" if args.no_backtrack else "")
    tag += "" if s["num_bases"] is None else f"-H{s['num_bases']}"
    folder = Path(args.out) / f"rgcn-{args.dataset}{tag}-{settings_tag(CONFIG, over)}"
    seed0 = getattr(args, "seed", 0) or 0
    runs = [Run(f"seed-{i}", CONFIG, (*over, f"seed={i}"))
            for i in range(seed0, seed0 + args.seeds)]
    dev = getattr(args, "device", None) or "cpu"
    t0 = time.perf_counter()
    rows = []

    def report(run: Run, r: dict) -> None:
        rows.append(_seed_row(folder, run, r, data))
        x = rows[-1]
        print(f"  seed {x['seed']:>3}: test {x['test_acc']:.2f}  train {x['train_acc']:.1f}  "
              f"{x['seconds']:.1f}s", flush=True)

    sweep(folder, runs, "rgcn", dev, report)
    wall = time.perf_counter() - t0
    names = data.relations
    weighted = _most_weighted(rows, sorts or [(r,) for r in range(data.num_relations)], names)
    accs = [r["test_acc"] for r in rows]
    mean = statistics.fmean(accs)
    std = statistics.stdev(accs) if len(accs) > 1 else 0.0
    pub = PUBLISHED[args.dataset]
    result = dict(
        recipe="rgcn", dataset=args.dataset, settings=s, config=CONFIG, overrides=over,
        seeds=len(rows), test_acc_mean=mean, test_acc_std=std, published=pub,
        within_one_std=abs(mean - pub) <= std, wall_seconds=wall,
        graph=dict(nodes=data.num_nodes, edges=int(data.edge_index.shape[1]),
                   relations=data.num_relations, train=int(data.masks["train"].sum()),
                   test=int(data.masks["test"].sum())),
        hardware=dict(machine=platform.machine(), processor=platform.processor(),
                      threads=torch.get_num_threads(), device=dev),
        torch=torch.__version__, runs=rows, most_weighted_sorts=weighted,
    )
    print(f"{'dataset':<7} {'bases':>5} {'sorts':>6} {'test acc (%)':>16} {'published':>9} "
          f"{'wall':>8}")
    print(f"{args.dataset:<7} {str(s['num_bases']):>5} {data.num_relations + len(mined):>6} "
          f"{mean:>9.2f} ± {std:<4.2f} {pub:>9.2f} {wall:>7.1f}s")
    publish(Path(args.out) / f"rgcn-{args.dataset}{tag}.json", result)
    return 0

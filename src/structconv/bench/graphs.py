"""``structconv bench graphs``: graph classification against PyG, both holding the same weights.

On PROTEINS and NCI1 (the TU files; ``--quick``: MUTAG and the first 400 graphs of PROTEINS),
a 5-layer GIN (hidden 64, two-layer MLPs with batch norm, sum readout, linear head; Adam) is
timed over one training epoch (batch 128, shuffled, collate included) and over inference alone
(every batch, no gradients, collate included), in two forms measured in the same run,
interleaved: PyG 2.8's ``DataLoader`` + ``GINConv`` + ``global_add_pool`` (the anchor), and
structconv's ``GraphLoader`` (collate by index arithmetic) + ``sc.nn.GINConv`` (a CSR SpMM per
layer) + ``sc.nn.global_add_pool`` (the readout basis). The collate alone is timed too (where
the time goes), the outputs of the two models are compared on one batch, and the peak extra
memory of a training epoch is measured in a forked process. The benchmark holds its own short
training loop: it measures, it does not train.
"""

from __future__ import annotations

import argparse
import copy
import gc
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data import GraphLoader, load_dataset
from ..data.registry import missing_files
from ..io import atomic_write_json
from ..models.gin import GIN
from ._util import ALLOCATOR, interleaved_times, peak_memory, record

NAME = "graphs"
DATASETS = ("tu-proteins", "tu-nci1")
QUICK = (("tu-mutag", None), ("tu-proteins", 400))
HIDDEN, LAYERS, BATCH = 64, 5, 128


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datasets", default="", help=f"comma list from {list(DATASETS)}")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")


def pyg_twin(model: GIN):
    """PyG's GINConv layers holding copies of the model's MLPs (same weights), its head."""
    import torch_geometric.nn as pnn

    convs = torch.nn.ModuleList()
    for conv in model.convs:
        twin = pnn.GINConv(copy.deepcopy(conv.nn))
        twin.nn.load_state_dict(conv.nn.state_dict())  # (PyG's constructor resets its nn)
        convs.append(twin)
    return torch.nn.ModuleList([convs, copy.deepcopy(model.head)])


def pyg_forward(twin, b):
    """The PyG model: GINConv layers, global_add_pool, the linear head."""
    import torch_geometric.nn as pnn

    convs, head = twin
    x = b.x
    for conv in convs:
        x = conv(x, b.edge_index)
    return head(pnn.global_add_pool(x, b.batch, b.num_graphs))


def _sc_forward(model, b):
    return model(b.x, b.edge_index, b.batch, b.num_graphs)


def _epoch(module, opt, loader, forward):
    """One training epoch over ``loader``."""
    module.train()
    for b in loader:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(forward(b), b.y).backward()
        opt.step()


def _infer(module, loader, forward):
    module.eval()
    with torch.no_grad():
        for b in loader:
            forward(b)


def _case(key: str, limit, args) -> dict:
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader

    ds = load_dataset(key)
    if limit is not None:
        ds = ds.subset(range(min(limit, len(ds))))
    torch.manual_seed(args.seed)
    model = GIN(ds.num_features, HIDDEN, ds.num_classes, LAYERS)
    twin = pyg_twin(model)
    pyg_list = [Data(x=g["x"], edge_index=g["edge_index"], y=g["y"])
                for g in (ds[i] for i in range(len(ds)))]
    sc_train = GraphLoader(ds, BATCH, shuffle=True, seed=args.seed)
    sc_eval = GraphLoader(ds, BATCH)
    pyg_train = DataLoader(pyg_list, batch_size=BATCH, shuffle=True)
    pyg_eval = DataLoader(pyg_list, batch_size=BATCH)
    model.eval()
    twin.eval()
    with torch.no_grad():
        b = ds.batch(range(min(BATCH, len(ds))))
        err = float((_sc_forward(model, b) - pyg_forward(twin, b)).abs().max())
    opt_sc = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt_pyg = torch.optim.Adam(twin.parameters(), lr=1e-3)
    fns = {
        "pyg_train": lambda: _epoch(twin, opt_pyg, pyg_train, lambda b: pyg_forward(twin, b)),
        "sc_train": lambda: _epoch(model, opt_sc, sc_train, lambda b: _sc_forward(model, b)),
        "pyg_infer": lambda: _infer(twin, pyg_eval, lambda b: pyg_forward(twin, b)),
        "sc_infer": lambda: _infer(model, sc_eval, lambda b: _sc_forward(model, b)),
        "pyg_collate": lambda: [None for _ in pyg_eval],
        "sc_collate": lambda: [None for _ in sc_eval],
    }
    t = interleaved_times(fns, repeats=max(3, args.repeats), warmup=1)
    mem = {}
    if not args.no_memory:
        for k in ("pyg_train", "sc_train"):
            mem[k] = peak_memory(lambda k=k: fns[k], warmup=1)
    row = dict(dataset=key, graphs=len(ds), nodes=int(ds.x.shape[0]),
               edges=int(ds.edge_index.shape[1]), max_abs_err=err, seconds=t, peak_bytes=mem,
               train_ratio=t["sc_train"] / t["pyg_train"],
               infer_ratio=t["sc_infer"] / t["pyg_infer"],
               collate_ratio=t["sc_collate"] / t["pyg_collate"])
    if mem.get("sc_train") is not None and mem.get("pyg_train"):
        row["mem_ratio"] = mem["sc_train"] / mem["pyg_train"]
    return row


def _mib(b):
    return "n/a" if b is None else f"{b / 2**20:.0f}"


def run(args) -> int:
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    try:
        import torch_geometric  # noqa: F401
    except ModuleNotFoundError:
        print("bench graphs needs PyG (pip install torch-geometric) for its anchor")
        return 2
    if args.quick:
        cases = list(QUICK)
    else:
        names = [s.strip() for s in args.datasets.split(",") if s.strip()] or list(DATASETS)
        bad = [n for n in names if n not in DATASETS]
        if bad:
            raise ValueError(f"unknown datasets {bad}: choose from {list(DATASETS)}")
        cases = [(n, None) for n in names]
    absent = [k for k, _ in cases if missing_files(k)]
    if absent:
        print(f"bench graphs needs the TU files of {absent} (see `structconv datasets`)")
        return 2
    t0 = time.time()
    print(f"GIN {LAYERS} layers, hidden {HIDDEN}, batch {BATCH}; {torch.get_num_threads()} "
          f"threads. Times in ms per epoch; ratios structconv / PyG")
    print(f"{'dataset':<13}{'graphs':>7}{'train':>9}{'ratio':>7}{'infer':>9}{'ratio':>7}"
          f"{'collate':>9}{'ratio':>7}{'MiB sc':>8}{'pyg':>6}{'err':>10}")
    rows = []
    for key, limit in cases:
        r = _case(key, limit, args)
        rows.append(r)
        s = r["seconds"]
        print(f"{key:<13}{r['graphs']:>7}{s['sc_train'] * 1e3:9.1f}{r['train_ratio']:7.2f}"
              f"{s['sc_infer'] * 1e3:9.1f}{r['infer_ratio']:7.2f}{s['sc_collate'] * 1e3:9.1f}"
              f"{r['collate_ratio']:7.2f}{_mib(r['peak_bytes'].get('sc_train')):>8}"
              f"{_mib(r['peak_bytes'].get('pyg_train')):>6}{r['max_abs_err']:10.1e}", flush=True)
        gc.collect()
    result = dict(suite=NAME, allocator=dict(ALLOCATOR), conditions=record(),
                  machine=platform.machine(), threads=torch.get_num_threads(),
                  torch=torch.__version__, quick=bool(args.quick), repeats=args.repeats,
                  cases=rows, seconds=time.time() - t0)
    out = Path(args.out) / f"{NAME}.json"
    atomic_write_json(out, result)
    print(f"wrote {out}")
    return 0

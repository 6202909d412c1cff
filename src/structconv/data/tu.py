"""TU graph-classification benchmarks (MUTAG, PROTEINS, NCI1) from the original TU text files.

The graphs are built as PyG's ``TUDataset`` builds them (so the two agree tensor for tensor):
1-based ids shifted to 0, node labels one-hot per column after subtracting the column minimum
(node attributes, where asked for, before them), edge labels one-hot as ``edge_attr``, self
loops removed, edges sorted by (source, target) with duplicates merged, graph labels mapped to
``0..C-1`` in sorted order. Each dataset carries 10 folds (``folds[i]``: ``train``, ``val``,
``test`` graph ids): Errica et al.'s (ICLR 2020) for PROTEINS and NCI1 (``tu/splits/``: outer
test fold, inner holdout), and for MUTAG, which their study does not cover, a stratified
10-fold split drawn from seed 0 with a stratified 10% inner holdout. The registered loaders
take ``fold`` (0-9, default 0): ``splits`` is then that fold's, what a graph task trains on.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .batch import GraphDataset
from .registry import DatasetError, check_int, register_dataset

__all__ = ["load_tu", "stratified_folds", "with_fold", "TU_DATASETS"]

TU_DATASETS = {"MUTAG": ("MUTAG", None),
               "PROTEINS": ("PROTEINS", "PROTEINS_full_splits.json"),
               "NCI1": ("NCI1", "NCI1_splits.json")}
"""Name -> (folder / file prefix, Errica et al.'s split file or None)."""


def _read(path: Path, dtype) -> np.ndarray:
    """A TU text file of comma-separated numbers as a (lines, columns) array."""
    if not path.is_file():
        raise DatasetError(f"TU file {path} is missing")
    lines = path.read_text().strip().splitlines()
    try:
        arr = np.array(" ".join(lines).replace(",", " ").split(), dtype=dtype)
    except ValueError as e:
        raise DatasetError(f"TU file {path} is not comma-separated numbers: {e}") from None
    if arr.size % max(len(lines), 1):
        raise DatasetError(f"TU file {path} has rows of different lengths")
    return arr.reshape(len(lines), -1)


def _one_hot_columns(labels: np.ndarray) -> torch.Tensor:
    """PyG's one-hot of categorical columns: each column minus its minimum, one-hot to its
    maximum + 1, the columns side by side."""
    lab = torch.from_numpy(labels).long()
    lab = lab - lab.min(0).values
    return torch.cat([torch.nn.functional.one_hot(c, int(c.max()) + 1).float()
                      for c in lab.unbind(-1)], -1)


def _edges(ei: torch.Tensor, attr: torch.Tensor | None, n: int):
    """Self loops removed, sorted by (source, target), duplicates merged (attributes summed)."""
    keep = ei[0] != ei[1]
    ei = ei[:, keep]
    attr = None if attr is None else attr[keep]
    key = ei[0] * n + ei[1]
    uniq, inv = torch.unique(key, sorted=True, return_inverse=True)
    if attr is not None:
        attr = attr.new_zeros(uniq.shape[0], attr.shape[1]).index_add_(0, inv, attr)
    return torch.stack([uniq // n, uniq % n]), attr


def _flat(batch: torch.Tensor, ei: torch.Tensor, G: int):
    """(node_ptr, edge_ptr, edge_index in local ids): nodes and edges grouped by graph."""
    if bool((batch[1:] < batch[:-1]).any()):
        raise DatasetError("TU graph_indicator must list each graph's nodes together, in order")
    zero = torch.zeros(1, dtype=torch.long)
    node_ptr = torch.cat([zero, torch.bincount(batch, minlength=G).cumsum(0)])
    eg = batch[ei[0]]
    edge_ptr = torch.cat([zero, torch.bincount(eg, minlength=G).cumsum(0)])
    return node_ptr, edge_ptr, ei - node_ptr[eg]


def load_tu(root, name: str, node_attributes: bool = False, splits: Path | None = None
            ) -> GraphDataset:
    """TU dataset ``name`` from ``root/<name>/`` (``<name>_A.txt``, ...) as a
    ``GraphDataset``; ``node_attributes`` puts the float node attributes (PROTEINS') before
    the one-hot labels (PyG's ``use_node_attr``). ``splits`` is Errica et al.'s JSON file."""
    d = Path(root) / name
    ei = torch.from_numpy(_read(d / f"{name}_A.txt", np.int64)).t().contiguous() - 1
    batch = torch.from_numpy(_read(d / f"{name}_graph_indicator.txt", np.int64)[:, 0]) - 1
    n = batch.shape[0]
    parts = []
    if node_attributes and (d / f"{name}_node_attributes.txt").is_file():
        parts.append(torch.from_numpy(_read(d / f"{name}_node_attributes.txt", np.float64))
                     .float())
    if (d / f"{name}_node_labels.txt").is_file():
        parts.append(_one_hot_columns(_read(d / f"{name}_node_labels.txt", np.int64)))
    x = torch.cat(parts, -1) if parts else torch.ones(n, 1)
    attr = None
    if (d / f"{name}_edge_labels.txt").is_file():
        attr = _one_hot_columns(_read(d / f"{name}_edge_labels.txt", np.int64))
    if int(ei.min()) < 0 or int(ei.max()) >= n or (attr is not None and
                                                    attr.shape[0] != ei.shape[1]):
        raise DatasetError(f"TU dataset {name}: {name}_A.txt does not match the {n} nodes of "
                           f"{name}_graph_indicator.txt (or its edge labels)")
    ei, attr = _edges(ei, attr, n)
    raw_y = torch.from_numpy(_read(d / f"{name}_graph_labels.txt", np.int64)[:, 0])
    classes, y = torch.unique(raw_y, sorted=True, return_inverse=True)
    node_ptr, edge_ptr, local = _flat(batch, ei, y.shape[0])
    ds = GraphDataset(x, local, node_ptr, edge_ptr, y, attr, name=name,
                      num_classes=int(classes.numel()))
    ds.folds = _errica_folds(splits, len(ds)) if splits is not None else \
        stratified_folds(y, 10, seed=0)
    return ds


def _errica_folds(path: Path, G: int) -> list[dict]:
    if not path.is_file():
        raise DatasetError(f"split file {path} is missing")
    try:
        raw = json.loads(path.read_text())
        folds = [{"train": torch.tensor(f["model_selection"][0]["train"]),
                  "val": torch.tensor(f["model_selection"][0]["validation"]),
                  "test": torch.tensor(f["test"])} for f in raw]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise DatasetError(f"split file {path} is not Errica et al.'s fold format: {e}") from None
    for f in folds:
        if max(int(t.max()) for t in f.values()) >= G:
            raise DatasetError(f"split file {path} names graphs beyond the {G} of the dataset")
    return folds


def stratified_folds(y: torch.Tensor, k: int = 10, seed: int = 0,
                     holdout: float = 0.1) -> list[dict]:
    """``k`` stratified folds of graph labels ``y``: fold i tests one k-th of each class (a
    seeded permutation dealt round-robin) and holds out a stratified ``holdout`` of the rest
    for validation."""
    g = torch.Generator().manual_seed(seed)
    fold_of = torch.empty(y.shape[0], dtype=torch.long)
    for c in torch.unique(y):
        ids = (y == c).nonzero().flatten()
        ids = ids[torch.randperm(ids.numel(), generator=g)]
        fold_of[ids] = torch.arange(ids.numel()) % k
    out = []
    for i in range(k):
        test = (fold_of == i).nonzero().flatten()
        rest = (fold_of != i).nonzero().flatten()
        val_mask = torch.zeros(rest.numel(), dtype=torch.bool)
        for c in torch.unique(y[rest]):
            pos = (y[rest] == c).nonzero().flatten()
            pos = pos[torch.randperm(pos.numel(), generator=g)]
            val_mask[pos[:round(holdout * pos.numel())]] = True
        out.append({"train": rest[~val_mask], "val": rest[val_mask], "test": test})
    return out


def with_fold(ds: GraphDataset, fold: int) -> GraphDataset:
    """``ds`` training on outer fold ``fold``: ``splits`` is that fold's ``train`` / ``val``
    (the inner holdout) / ``test`` graph ids."""
    ds.splits = dict(ds.folds[fold])
    return ds


def _register(key: str, name: str, split_file: str | None):
    files = [f"{name}/{name}_A.txt", f"{name}/{name}_graph_indicator.txt",
             f"{name}/{name}_graph_labels.txt", f"{name}/{name}_node_labels.txt"]
    if split_file:
        files.append(f"splits/{split_file}")
    where = "Errica et al.'s 10 folds" if split_file else "10 stratified folds (seed 0)"

    @register_dataset(key, "tu", f"TU {name} graph classification (original TU files), {where}",
                      files=files)
    def load(root, node_attributes: bool = False, fold: int = 0):
        ds = load_tu(root, name, node_attributes,
                     Path(root) / "splits" / split_file if split_file else None)
        return with_fold(ds, check_int(key, "fold", fold, 0, len(ds.folds) - 1))

    return load


for _name, (_folder, _split) in TU_DATASETS.items():
    _register(f"tu-{_name.lower()}", _folder, _split)

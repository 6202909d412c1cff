"""Typed graphs: ``HeteroGraph`` (node types, edge types ``(src, relation, dst)``) and the DBLP
and IMDB loaders.

A ``HeteroGraph`` holds, per node type, a count and optional features / labels / masks, and per
edge type an ``edge_index`` (2, E) from ``src``'s rows to ``dst``'s rows with optional edge
features. ``metadata()``, ``x_dict`` and ``edge_index_dict`` are what PyG's ``HeteroData`` gives,
so typed layers (``sc.nn.HeteroConv``, ``sc.nn.TypedGraphConv``, ``sc.nn.HGTConv``) and PyG's
take the same inputs; ``from_pyg`` / ``to_pyg`` convert (PyG optional).

DBLP and IMDB are read from PyG's own raw files (MAGNN's preprocessing; ``adjM.npz`` over all
nodes grouped by type, features per type, ``labels.npy``, ``train_val_test_idx.npz``) exactly as
PyG's ``DBLP`` / ``IMDB`` dataset classes read them: the same node order, edge order (edge type
``(src, "to", dst)`` for each block of the adjacency with entries) and split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from .registry import DatasetError, register_dataset

__all__ = ["HeteroGraph", "load_dblp", "load_imdb", "DBLP_FILES", "IMDB_FILES"]

EdgeType = tuple[str, str, str]


def _edge_type(et) -> EdgeType:
    if isinstance(et, str):
        parts = tuple(et.split("__"))
    else:
        parts = tuple(et) if isinstance(et, (tuple, list)) else ()
    if len(parts) == 2:
        parts = (parts[0], "to", parts[1])
    if len(parts) != 3 or not all(isinstance(p, str) and p for p in parts):
        raise ValueError(f"an edge type must be (src, relation, dst) strings, got {et!r}")
    return parts


@dataclass
class HeteroGraph:
    """A typed graph: ``num_nodes[t]``, optional ``x[t]`` (n_t, F_t), ``y[t]``, ``masks[t]``
    (split name -> (n_t,) bool) per node type t; ``edge_index[(s, r, d)]`` (2, E) from s's rows
    to d's rows and optional ``edge_attr[(s, r, d)]`` (E, D) per edge type."""

    num_nodes: dict[str, int]
    edge_index: dict[EdgeType, Tensor]
    x: dict[str, Tensor] = field(default_factory=dict)
    edge_attr: dict[EdgeType, Tensor] = field(default_factory=dict)
    y: dict[str, Tensor] = field(default_factory=dict)
    masks: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    name: str = "hetero"
    task: str = "hetero"

    def __post_init__(self):
        self.num_nodes = {str(k): int(v) for k, v in self.num_nodes.items()}
        self.edge_index = {_edge_type(k): v for k, v in self.edge_index.items()}
        self.edge_attr = {_edge_type(k): v for k, v in self.edge_attr.items()}
        self.validate()

    # -- checks ------------------------------------------------------------------------------
    def validate(self) -> HeteroGraph:
        """Raise ValueError/TypeError naming the type and what is wrong; returns self."""
        for t, n in self.num_nodes.items():
            if n < 0:
                raise ValueError(f"HeteroGraph: node type {t!r} has num_nodes {n} < 0")
        for what, d in (("x", self.x), ("y", self.y), ("masks", self.masks)):
            for t in d:
                if t not in self.num_nodes:
                    raise ValueError(f"HeteroGraph: {what} names node type {t!r}, not among "
                                     f"{sorted(self.num_nodes)}")
        for t, v in self.x.items():
            self._rows(v, t, "x", floating=True)
        for t, v in self.y.items():
            self._rows(v, t, "y")
        for t, ms in self.masks.items():
            for k, m in ms.items():
                self._rows(m, t, f"masks[{k!r}]")
        for et, ei in self.edge_index.items():
            self._edges(et, ei)
        for et, a in self.edge_attr.items():
            if et not in self.edge_index:
                raise ValueError(f"HeteroGraph: edge_attr for {et}, which has no edge_index")
            E = self.edge_index[et].shape[1]
            if not isinstance(a, Tensor) or a.dim() < 1 or a.shape[0] != E:
                got = tuple(a.shape) if isinstance(a, Tensor) else type(a).__name__
                raise ValueError(f"HeteroGraph: edge_attr[{et}] must have {E} rows (one per "
                                 f"edge), got {got}")
        return self

    def _rows(self, v, t: str, what: str, floating: bool = False) -> None:
        n = self.num_nodes[t]
        if not isinstance(v, Tensor) or v.dim() < 1 or v.shape[0] != n:
            got = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
            raise ValueError(f"HeteroGraph: {what}[{t!r}] must have {n} rows (num_nodes), got "
                             f"{got}")
        if floating and not v.is_floating_point():
            raise TypeError(f"HeteroGraph: x[{t!r}] must be floating, got {v.dtype}")

    def _edges(self, et: EdgeType, ei) -> None:
        s, _, d = et
        for t in (s, d):
            if t not in self.num_nodes:
                raise ValueError(f"HeteroGraph: edge type {et} names node type {t!r}, not "
                                 f"among {sorted(self.num_nodes)}")
        if not isinstance(ei, Tensor) or ei.dim() != 2 or ei.shape[0] != 2 or \
                ei.is_floating_point():
            got = tuple(ei.shape) if isinstance(ei, Tensor) else type(ei).__name__
            raise ValueError(f"HeteroGraph: edge_index[{et}] must be an integer (2, E) tensor, "
                             f"got {got}")
        if ei.numel():
            for row, t in ((0, s), (1, d)):
                lo, hi = int(ei[row].min()), int(ei[row].max())
                if lo < 0 or hi >= self.num_nodes[t]:
                    raise ValueError(f"HeteroGraph: edge_index[{et}] row {row} ({t!r} ids) "
                                     f"must lie in [0, {self.num_nodes[t] - 1}], got "
                                     f"[{lo}, {hi}]")

    # -- views -------------------------------------------------------------------------------
    @property
    def node_types(self) -> list[str]:
        return list(self.num_nodes)

    @property
    def edge_types(self) -> list[EdgeType]:
        return list(self.edge_index)

    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """``(node_types, edge_types)``, as PyG's ``HeteroData.metadata()``."""
        return self.node_types, self.edge_types

    @property
    def x_dict(self) -> dict[str, Tensor]:
        return dict(self.x)

    @property
    def edge_index_dict(self) -> dict[EdgeType, Tensor]:
        return dict(self.edge_index)

    @property
    def edge_attr_dict(self) -> dict[EdgeType, Tensor]:
        return dict(self.edge_attr)

    def relation(self, name) -> EdgeType:
        """The edge type named by a triple, ``"src__rel__dst"``, ``"src__dst"`` or its relation
        name alone (when unique)."""
        if isinstance(name, str) and "__" not in name:
            hits = [et for et in self.edge_index if et[1] == name]
            if len(hits) != 1:
                raise ValueError(f"relation {name!r} names {len(hits)} edge types of "
                                 f"{self.edge_types}: give (src, relation, dst)")
            return hits[0]
        et = _edge_type(name)
        if et not in self.edge_index:
            raise ValueError(f"no edge type {et}; the graph has {self.edge_types}")
        return et

    def num_edges(self) -> int:
        return sum(int(v.shape[1]) for v in self.edge_index.values())

    def describe(self) -> str:
        nodes = ", ".join(f"{t} {n}" for t, n in self.num_nodes.items())
        return (f"{self.name}: {len(self.num_nodes)} node types ({nodes}), "
                f"{len(self.edge_index)} edge types, {self.num_edges()} edges")

    def to(self, device=None, dtype=None) -> HeteroGraph:
        """A copy on ``device``; ``dtype`` converts the floating features only."""
        def mv(t: Tensor) -> Tensor:
            return t.to(device=device, dtype=dtype if t.is_floating_point() else None)
        return HeteroGraph(dict(self.num_nodes), {k: mv(v) for k, v in self.edge_index.items()},
                           {k: mv(v) for k, v in self.x.items()},
                           {k: mv(v) for k, v in self.edge_attr.items()},
                           {k: mv(v) for k, v in self.y.items()},
                           {t: {k: mv(m) for k, m in ms.items()} for t, ms in self.masks.items()},
                           self.name, self.task)

    # -- PyG ---------------------------------------------------------------------------------
    @classmethod
    def from_pyg(cls, data, name: str = "hetero") -> HeteroGraph:
        """A ``HeteroGraph`` of a PyG ``HeteroData`` (counts, x, y, *_mask, edge_index,
        edge_attr)."""
        num, x, y, masks = {}, {}, {}, {}
        for t in data.node_types:
            store = data[t]
            num[t] = int(store.num_nodes)
            for k, v in store.items():
                if k == "x":
                    x[t] = v
                elif k == "y":
                    y[t] = v
                elif k.endswith("_mask"):
                    masks.setdefault(t, {})[k[:-5]] = v
        ei = {et: data[et].edge_index for et in data.edge_types if "edge_index" in data[et]}
        ea = {et: data[et].edge_attr for et in data.edge_types if "edge_attr" in data[et]}
        return cls(num, ei, x, ea, y, masks, name)

    def to_pyg(self):
        """The same graph as a PyG ``HeteroData`` (needs torch_geometric)."""
        from .._extras import require

        require("torch_geometric", "pyg", "HeteroGraph.to_pyg")
        from torch_geometric.data import HeteroData

        data = HeteroData()
        for t, n in self.num_nodes.items():
            data[t].num_nodes = n
            if t in self.x:
                data[t].x = self.x[t]
            if t in self.y:
                data[t].y = self.y[t]
            for k, m in self.masks.get(t, {}).items():
                data[t][f"{k}_mask"] = m
        for et, ei in self.edge_index.items():
            data[et].edge_index = ei
            if et in self.edge_attr:
                data[et].edge_attr = self.edge_attr[et]
        return data


# ------------------------------------------------------------------------------------------------
# DBLP and IMDB (MAGNN's preprocessing, PyG's raw files)
DBLP_TYPES = ("author", "paper", "term", "conference")
IMDB_TYPES = ("movie", "director", "actor")
_COMMON = ("adjM.npz", "labels.npy", "node_types.npy", "train_val_test_idx.npz")
DBLP_FILES = tuple(f"raw/{f}" for f in (*_COMMON, "features_0.npz", "features_1.npz",
                                        "features_2.npy"))
IMDB_FILES = tuple(f"raw/{f}" for f in (*_COMMON, "features_0.npz", "features_1.npz",
                                        "features_2.npz"))


def _raw(root, name: str) -> Path:
    root = Path(root)
    raw = root / "raw" if (root / "raw").is_dir() else root
    if not (raw / "adjM.npz").is_file():
        raise DatasetError(f"{name}: {raw / 'adjM.npz'} is missing (PyG's raw {name} files)")
    return raw


def _load(path: Path, what: str):
    import numpy as np
    import scipy.sparse as sp

    try:
        if path.suffix == ".npz" and path.name.startswith(("features", "adjM")):
            return sp.load_npz(path)
        if path.suffix == ".npz":
            with np.load(path) as f:
                return {k: f[k] for k in f.files}
        return np.load(path)
    except FileNotFoundError:
        raise DatasetError(f"{what}: {path} is missing") from None
    except (OSError, ValueError, KeyError) as e:
        raise DatasetError(f"{what}: {path} is not a readable numpy/scipy file ({e})") from None


def _dense(a) -> Tensor:
    import numpy as np

    arr = a.toarray() if hasattr(a, "toarray") else np.asarray(a)
    return torch.from_numpy(np.ascontiguousarray(arr)).to(torch.float)


def _typed(raw: Path, name: str, types, features: Mapping[str, str], target: str) -> HeteroGraph:
    """A MAGNN-format graph: node ids grouped by type (``node_types.npy``), one adjacency."""
    tvec = torch.from_numpy(_load(raw / "node_types.npy", name)).long()
    counts = {t: int((tvec == i).sum()) for i, t in enumerate(types)}
    x = {t: _dense(_load(raw / f, name)) for t, f in features.items()}
    for t, v in x.items():
        if v.shape[0] != counts[t]:
            raise DatasetError(f"{name}: {features[t]} has {v.shape[0]} rows but node_types.npy "
                               f"counts {counts[t]} {t} nodes")
    y = torch.from_numpy(_load(raw / "labels.npy", name)).long()
    split = _load(raw / "train_val_test_idx.npz", name)
    masks = {}
    for s in ("train", "val", "test"):
        m = torch.zeros(counts[target], dtype=torch.bool)
        m[torch.from_numpy(split[f"{s}_idx"]).long()] = True
        masks[s] = m
    A = _load(raw / "adjM.npz", name).tocsr()
    if A.shape[0] != sum(counts.values()):
        raise DatasetError(f"{name}: adjM.npz is {A.shape} but there are "
                           f"{sum(counts.values())} nodes")
    starts, acc = {}, 0
    for t in types:
        starts[t], acc = acc, acc + counts[t]
    edges = {}
    for s in types:  # PyG's order: itertools.product(types, types)
        for d in types:
            sub = A[starts[s]:starts[s] + counts[s], starts[d]:starts[d] + counts[d]].tocoo()
            if sub.nnz > 0:
                edges[(s, "to", d)] = torch.stack([torch.from_numpy(sub.row).long(),
                                                   torch.from_numpy(sub.col).long()])
    return HeteroGraph(counts, edges, x, y={target: y}, masks={target: masks}, name=name)


def load_dblp(root) -> HeteroGraph:
    """DBLP (author / paper / term / conference; authors labelled in 4 areas), as PyG's
    ``DBLP``: conferences have no features (PyG's examples give them a constant one)."""
    raw = _raw(root, "dblp")
    return _typed(raw, "dblp", DBLP_TYPES, {"author": "features_0.npz",
                                            "paper": "features_1.npz",
                                            "term": "features_2.npy"}, "author")


def load_imdb(root) -> HeteroGraph:
    """IMDB (movie / director / actor; movies labelled in 3 genres), as PyG's ``IMDB``."""
    raw = _raw(root, "imdb")
    return _typed(raw, "imdb", IMDB_TYPES, {"movie": "features_0.npz",
                                            "director": "features_1.npz",
                                            "actor": "features_2.npz"}, "movie")


register_dataset("dblp", "hetero/DBLP", "DBLP typed graph (author/paper/term/conference; "
                 "PyG's raw files)", DBLP_FILES)(load_dblp)
register_dataset("imdb", "hetero/IMDB", "IMDB typed graph (movie/director/actor; PyG's raw "
                 "files)", IMDB_FILES)(load_imdb)

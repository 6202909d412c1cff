"""Batches of small graphs: one block-diagonal graph per batch, collated by index arithmetic.

``GraphBatch`` holds the tensors of PyG's ``Batch.from_data_list`` (x, edge_index, edge_attr, y,
batch, ptr, num_graphs). ``GraphDataset`` stores many graphs as flat arrays with offsets (node
rows ``node_ptr``, edge columns ``edge_ptr``, each graph's edges in local node ids), so that a
batch of any graphs is a few gathers: the rows of the chosen graphs are concatenated ranges
(``repeat_interleave`` of the offsets), and each edge is shifted by its graph's new node offset.
No Python runs per graph at batch time. ``GraphLoader`` iterates batches with shuffling from a
seed, ``drop_last``, worker processes, and a resumable position (epoch, batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

__all__ = ["GraphBatch", "GraphDataset", "GraphLoader", "ranges"]


def _get(g, name: str):
    """A graph's field: a mapping's key or an object's attribute (None where absent)."""
    return g.get(name) if isinstance(g, Mapping) else getattr(g, name, None)


def _fields(g) -> dict:
    return {k: _get(g, k) for k in ("x", "edge_index", "edge_attr")}


def _move(t: Tensor | None, device, dtype) -> Tensor | None:
    if t is None:
        return None
    return t.to(device=device, dtype=dtype if t.is_floating_point() and dtype else None)


def ranges(starts: Tensor, counts: Tensor, total: int | None = None) -> Tensor:
    """The concatenated ranges ``[s_i, s_i + c_i)``, ``(Σ c_i,)`` long, by index arithmetic."""
    if total is None:
        total = int(counts.sum())
    ends = torch.cumsum(counts, 0)
    shift = torch.repeat_interleave(starts - (ends - counts), counts, output_size=total)
    return torch.arange(total, device=starts.device) + shift


@dataclass
class GraphBatch:
    """A batch of N graphs as one graph of M nodes: x (M, P), edge_index (2, E) (each graph's
    ids offset by the nodes before it), edge_attr (E, D) or None, y (concatenated) or None,
    batch (M,) the graph of each node, ptr (N+1,) node offsets, num_graphs N."""

    x: Tensor
    edge_index: Tensor
    edge_attr: Tensor | None
    y: Tensor | None
    batch: Tensor
    ptr: Tensor
    num_graphs: int

    @classmethod
    def from_graphs(cls, graphs: Sequence) -> GraphBatch:
        """The batch of ``graphs`` (objects or dicts with ``x``, ``edge_index`` and optional
        ``edge_attr``, ``y``): the same tensors as PyG's ``Batch.from_data_list``."""
        graphs = list(graphs)
        ys = _stack_y([_get(g, "y") for g in graphs])  # graph- or node-level: concatenated
        out = GraphDataset.from_graphs([{**_fields(g), "y": None} for g in graphs]).batch()
        out.y = ys
        return out

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    def to(self, device=None, dtype=None) -> GraphBatch:
        """This batch on ``device``; floating tensors take ``dtype`` (indices keep theirs)."""
        return GraphBatch(*(_move(getattr(self, f.name), device, dtype) if f.name != "num_graphs"
                            else self.num_graphs for f in fields(self)))

    def __repr__(self) -> str:
        ea = "" if self.edge_attr is None else f", edge_attr={list(self.edge_attr.shape)}"
        y = "" if self.y is None else f", y={list(self.y.shape)}"
        return (f"GraphBatch(num_graphs={self.num_graphs}, x={list(self.x.shape)}, "
                f"edge_index={list(self.edge_index.shape)}{ea}{y})")


def _stack_y(ys: list) -> Tensor | None:
    if all(y is None for y in ys):
        return None
    if any(y is None for y in ys):
        raise ValueError("from_graphs: some graphs have y and others not")
    ts = [torch.as_tensor(y) for y in ys]
    return torch.cat([t.reshape(1) if t.dim() == 0 else t for t in ts])


@dataclass
class GraphDataset:
    """Many graphs as flat arrays: x (ΣM, P), edge_index (2, ΣE) in each graph's local ids,
    edge_attr (ΣE, D) or None, y (G, ...) or None, node_ptr / edge_ptr (G+1,) offsets.

    ``batch(idx)`` collates any graphs by index arithmetic; ``subset(idx)`` is a dataset of
    those graphs; ``splits`` (name -> graph ids) and ``folds`` (a list of such dicts) carry a
    benchmark's splits where it has them.
    """

    x: Tensor
    edge_index: Tensor
    node_ptr: Tensor
    edge_ptr: Tensor
    y: Tensor | None = None
    edge_attr: Tensor | None = None
    name: str = "graphs"
    num_classes: int = 0
    task: str = "graph"
    splits: dict | None = None
    folds: list | None = None

    def __post_init__(self):
        G = self.node_ptr.shape[0] - 1
        if self.edge_ptr.shape[0] != G + 1:
            raise ValueError(f"GraphDataset: node_ptr has {G + 1} entries but edge_ptr "
                             f"{self.edge_ptr.shape[0]} (both must be (G+1,))")
        if int(self.node_ptr[-1]) != self.x.shape[0] or \
                int(self.edge_ptr[-1]) != self.edge_index.shape[1]:
            raise ValueError("GraphDataset: node_ptr / edge_ptr must end at the number of "
                             "rows of x / columns of edge_index")
        if self.y is not None and self.y.shape[0] != G:
            raise ValueError(f"GraphDataset: y has {self.y.shape[0]} rows for {G} graphs")

    @classmethod
    def from_graphs(cls, graphs: Sequence, **meta) -> GraphDataset:
        """A flat dataset of ``graphs`` (objects or dicts with x (n_i, P), edge_index
        (2, e_i), optional edge_attr (e_i, D) and y)."""
        graphs = list(graphs)
        if not graphs:
            raise ValueError("from_graphs needs at least one graph")
        xs = [_get(g, "x") for g in graphs]
        eis = [_get(g, "edge_index") for g in graphs]
        for i, (x, ei) in enumerate(zip(xs, eis)):
            if not isinstance(x, Tensor) or x.dim() < 1:
                raise ValueError(f"from_graphs: graph {i} needs x as a (n_i, P) tensor")
            if not isinstance(ei, Tensor) or ei.dim() != 2 or ei.shape[0] != 2:
                raise ValueError(f"from_graphs: graph {i} needs edge_index as a (2, e_i) tensor")
        eas = [_get(g, "edge_attr") for g in graphs]
        if any(e is None for e in eas) and not all(e is None for e in eas):
            raise ValueError("from_graphs: some graphs have edge_attr and others not")
        n = torch.tensor([x.shape[0] for x in xs])
        e = torch.tensor([ei.shape[1] for ei in eis])
        zero = torch.zeros(1, dtype=torch.long)
        return cls(torch.cat(xs), torch.cat([ei.long() for ei in eis], 1),
                   torch.cat([zero, n.cumsum(0)]), torch.cat([zero, e.cumsum(0)]),
                   _stack_y([_get(g, "y") for g in graphs]),
                   None if eas[0] is None else torch.cat(eas), **meta)

    def __len__(self) -> int:
        return self.node_ptr.shape[0] - 1

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1]) if self.x.dim() > 1 else 1

    @property
    def num_edge_features(self) -> int:
        return 0 if self.edge_attr is None else int(self.edge_attr.shape[1])

    def describe(self) -> str:
        ea = f", {self.num_edge_features} edge features" if self.edge_attr is not None else ""
        return (f"{self.name}: {len(self)} graphs, {self.x.shape[0]} nodes, "
                f"{self.edge_index.shape[1]} edges, {self.num_features} node features{ea}, "
                f"{self.num_classes} classes")

    def __getitem__(self, i: int) -> dict:
        """Graph ``i`` as a dict of x, edge_index (local ids), edge_attr, y."""
        a, b = int(self.node_ptr[i]), int(self.node_ptr[i + 1])
        c, d = int(self.edge_ptr[i]), int(self.edge_ptr[i + 1])
        return {"x": self.x[a:b], "edge_index": self.edge_index[:, c:d],
                "edge_attr": None if self.edge_attr is None else self.edge_attr[c:d],
                "y": None if self.y is None else self.y[i:i + 1]}

    def _index(self, idx) -> Tensor:
        if idx is None:
            return torch.arange(len(self), device=self.node_ptr.device)
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.node_ptr.device).reshape(-1)
        if idx.numel() and (int(idx.min()) < -len(self) or int(idx.max()) >= len(self)):
            raise IndexError(f"graph ids must lie in [0, {len(self) - 1}] for {len(self)} "
                             f"graphs, got [{int(idx.min())}, {int(idx.max())}]")
        return idx % max(len(self), 1)

    def _gather(self, idx: Tensor):
        """(node counts, edge counts, node rows, edge columns) of graphs ``idx``."""
        n = self.node_ptr[idx + 1] - self.node_ptr[idx]
        e = self.edge_ptr[idx + 1] - self.edge_ptr[idx]
        return n, e, ranges(self.node_ptr[idx], n), ranges(self.edge_ptr[idx], e)

    def batch(self, idx=None) -> GraphBatch:
        """The ``GraphBatch`` of graphs ``idx`` (default all), in that order."""
        idx = self._index(idx)
        n, e, rows, cols = self._gather(idx)
        ptr = torch.zeros(idx.shape[0] + 1, dtype=torch.long, device=idx.device)
        torch.cumsum(n, 0, out=ptr[1:])
        ei = self.edge_index.index_select(1, cols)
        ei = ei + torch.repeat_interleave(ptr[:-1], e, output_size=cols.shape[0])
        batch = torch.repeat_interleave(torch.arange(idx.shape[0], device=idx.device), n,
                                        output_size=rows.shape[0])
        return GraphBatch(self.x.index_select(0, rows), ei,
                          None if self.edge_attr is None else self.edge_attr.index_select(0, cols),
                          None if self.y is None else self.y.index_select(0, idx),
                          batch, ptr, int(idx.shape[0]))

    def subset(self, idx) -> GraphDataset:
        """The dataset of graphs ``idx`` (in that order; splits and folds dropped)."""
        idx = self._index(idx)
        n, e, rows, cols = self._gather(idx)
        zero = torch.zeros(1, dtype=torch.long, device=idx.device)
        return replace(self, x=self.x.index_select(0, rows),
                       edge_index=self.edge_index.index_select(1, cols),
                       node_ptr=torch.cat([zero, n.cumsum(0)]),
                       edge_ptr=torch.cat([zero, e.cumsum(0)]),
                       y=None if self.y is None else self.y.index_select(0, idx),
                       edge_attr=None if self.edge_attr is None else
                       self.edge_attr.index_select(0, cols), splits=None, folds=None)

    def to(self, device=None, dtype=None) -> GraphDataset:
        """The dataset on ``device`` (floating tensors in ``dtype``): batches are then
        collated there."""
        return replace(self, x=_move(self.x, device, dtype),
                       edge_index=_move(self.edge_index, device, None),
                       node_ptr=_move(self.node_ptr, device, None),
                       edge_ptr=_move(self.edge_ptr, device, None),
                       y=_move(self.y, device, dtype),
                       edge_attr=_move(self.edge_attr, device, dtype))


class _Batches(torch.utils.data.Dataset):
    """Batch number -> GraphBatch, for worker processes (each collates whole batches)."""

    def __init__(self, dataset: GraphDataset, order: list[Tensor]):
        self.dataset, self.order = dataset, order

    def __len__(self):
        return len(self.order)

    def __getitem__(self, i):
        return self.dataset.batch(self.order[i])


class GraphLoader:
    """Batches of a ``GraphDataset``: ``batch_size`` graphs each, shuffled per epoch from
    ``seed`` (the permutation of epoch e depends only on (seed, e)), ``drop_last``,
    ``num_workers`` processes collating whole batches (rarely worth it: one batch costs a
    few gathers). The position (``epoch``, ``batch``) is ``state_dict()``; a loader given it
    by ``load_state_dict`` yields the same remaining batches. Iterating to the end moves to
    the next epoch. ``device`` / ``dtype`` move each batch."""

    def __init__(self, dataset: GraphDataset, batch_size: int = 32, shuffle: bool = False, *,
                 seed: int = 0, drop_last: bool = False, num_workers: int = 0,
                 device=None, dtype: torch.dtype | None = None):
        if not isinstance(dataset, GraphDataset):
            raise TypeError(f"GraphLoader needs a GraphDataset, got {type(dataset).__name__}")
        for name, v, low in (("batch_size", batch_size, 1), ("num_workers", num_workers, 0),
                             ("seed", seed, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"GraphLoader {name} must be an int >= {low}, got {v!r}")
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, bool(shuffle)
        self.seed, self.drop_last, self.num_workers = seed, bool(drop_last), num_workers
        self.device, self.dtype = device, dtype
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        G = len(self.dataset)
        return G // self.batch_size if self.drop_last else -(-G // self.batch_size)

    def order(self, epoch: int | None = None) -> list[Tensor]:
        """The graph ids of every batch of ``epoch`` (default the current one)."""
        epoch = self.epoch if epoch is None else epoch
        G = len(self.dataset)
        if self.shuffle:
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % (2**63))
            perm = torch.randperm(G, generator=g)
        else:
            perm = torch.arange(G)
        return list(perm.split(self.batch_size))[:len(self)]

    def state_dict(self) -> dict:
        """The position: ``{"epoch": e, "batch": b}``, b the next batch of epoch e."""
        if self.position >= len(self):  # the epoch's last batch was taken
            return {"epoch": self.epoch + 1, "batch": 0}
        return {"epoch": self.epoch, "batch": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["batch"])

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = int(epoch), 0

    def __iter__(self):
        if self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        order = self.order()[self.position:]
        if self.num_workers:
            it = iter(torch.utils.data.DataLoader(_Batches(self.dataset, order), batch_size=None,
                                                  num_workers=self.num_workers))
        else:
            it = (self.dataset.batch(idx) for idx in order)
        for b in it:
            self.position += 1
            yield b if self.device is None and self.dtype is None else \
                b.to(self.device, self.dtype)
        self.epoch, self.position = self.epoch + 1, 0

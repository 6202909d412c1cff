"""Mini-batches of sampled neighbourhoods for graph layers, and layer-wise full inference.

``NeighborLoader`` iterates over seed nodes in batches and yields ``MiniBatch``es: the seeds, the
input node ids (seeds first), the gathered features and labels, and one restricted basis per
layer (``restrict``; a ``Block`` for graph attention). A model applies its layers with
``apply_layers(layers, batch.x, batch.bases)``; the output rows are the seeds'. Background
workers follow ``torch.utils.data``: the epoch's plan (shuffled seed batches, one random seed
per batch) is drawn in the main process, so a batch is the same whichever process samples it.
``prefetch`` instead builds the next batches in a background thread of the same process while
the model steps (the compiled sampler releases the GIL), from the same plan: the same batches.

``inference`` evaluates a stack of layers on every node, one layer at a time over batches of
target nodes with their whole neighbourhood (as PyG's ``inference`` over a subgraph loader): exact
as full batch, holding one layer's activations for all nodes rather than every layer's.
"""

from __future__ import annotations

import numbers
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..basis.base import Basis
from ..basis.edges import check_num_nodes
from ..nn.attention import GATConv
from ..nn.graph import GraphConvolution, RGCNConv
from .restrict import BlockRestriction, GraphRestriction
from .sampler import Block, NeighborSampler, Sample, check_fanout, check_seeds

__all__ = ["NeighborLoader", "MiniBatch", "inference", "restriction_for", "apply_layer",
           "apply_layers"]

_MASK64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    """SplitMix64: a well-mixed 64-bit integer from x (seeds per epoch and batch)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _check_int(v, what: str, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
        raise ValueError(f"{what} must be an int >= {low}, got {v!r}")
    return int(v)


def _check_edge_attr(edge_attr, edge_index) -> None:
    """Raise unless ``edge_attr`` is None or a tensor with one row per edge of ``edge_index``."""
    if edge_attr is None:
        return
    E = edge_index.shape[1] if isinstance(edge_index, Tensor) and edge_index.dim() == 2 else None
    if not isinstance(edge_attr, Tensor) or edge_attr.dim() < 1 or edge_attr.shape[0] != E:
        got = tuple(edge_attr.shape) if isinstance(edge_attr, Tensor) else \
            type(edge_attr).__name__
        raise ValueError(f"edge_attr must have one row per edge ({E}), got {got}")


# ------------------------------------------------------------------------------------------------
# layers on restricted bases
def restriction_for(layer, edge_index: Tensor, num_nodes: int, *,
                    edge_weight: Tensor | None = None, edge_type: Tensor | None = None,
                    degrees: str = "full", dtype: torch.dtype | None = None):
    """The restriction matching a graph layer (its ``basis_spec``: kind and options), over the
    full graph: GCNConv -> gcn, SGConv -> sgc (K hops), ChebConv -> chebyshev (K-1 hops),
    TAGConv -> diffusion (K hops), RGCNConv -> relational (its sorts), GATConv -> its edge
    ``Block``. A ``GraphRestriction`` / ``BlockRestriction`` is returned as it is.
    """
    if isinstance(layer, (GraphRestriction, BlockRestriction)):
        return layer
    if isinstance(layer, GATConv):
        return BlockRestriction()
    if not isinstance(layer, (GraphConvolution, RGCNConv)):
        raise TypeError(f"no restriction for {type(layer).__name__}: give a GraphRestriction or "
                        "a GCNConv, SGConv, ChebConv, TAGConv, RGCNConv or GATConv")
    flow = getattr(layer, "flow", "source_to_target")
    if flow != "source_to_target":
        raise ValueError(f"{type(layer).__name__} with flow={flow!r}: sampling draws incoming "
                         "edges, so only flow='source_to_target' layers can be restricted")
    spec = dict(layer.basis_spec())
    kind = spec.pop("kind")
    if kind == "relational":  # RGCNConv's relations carry no edge weight
        edge_weight = None
    return GraphRestriction(kind, edge_index, num_nodes, edge_weight=edge_weight,
                            edge_type=edge_type, degrees=degrees, dtype=dtype, **spec)


def apply_layer(layer, x, item):
    """One graph layer on a mini-batch: x (M, P) on the layer's input nodes -> (N, Q) on its
    targets (the first N input nodes); ``item`` the layer's restricted basis or ``Block`` (its
    edges' features, if it carries them, go to the layer as ``edge_attr``)."""
    if isinstance(item, Block):
        if not isinstance(x, Tensor) or x.shape[0] != item.num_src:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{type(layer).__name__} on a block of {item.num_src} source "
                             f"nodes needs x with {item.num_src} rows, got {got}")
        return layer((x, x[:item.num_dst]), item.edge_index, item.edge_attr,
                     size=(item.num_src, item.num_dst))
    if not isinstance(item, Basis):
        raise TypeError(f"a layer's mini-batch item must be a Basis or a Block, got "
                        f"{type(item).__name__}")
    if not isinstance(layer, (GraphConvolution, RGCNConv)):
        raise TypeError(f"apply_layer does not know {type(layer).__name__}")
    # the layers take a built basis in place of edge_index (as PyG's take an adj_t)
    return layer(x, item)


def apply_layers(layers: Sequence, x, items: Sequence, act: Callable | None = None):
    """The layers in order on a mini-batch (``act`` between layers, not after the last)."""
    if len(layers) != len(items):
        raise ValueError(f"{len(layers)} layers but {len(items)} mini-batch items")
    for i, (layer, item) in enumerate(zip(layers, items)):
        x = apply_layer(layer, x, item)
        if act is not None and i < len(layers) - 1:
            x = act(x)
    return x


# ------------------------------------------------------------------------------------------------
@dataclass
class MiniBatch:
    """One sampled mini-batch: ``seeds`` (S,) global ids, ``node_ids`` (M,) the first layer's
    input nodes (seeds first), ``x`` (M, F) features x[node_ids], ``y`` labels y[seeds],
    ``bases`` one item per layer (input layer first), ``sample`` the nested neighbourhood."""

    seeds: Tensor
    node_ids: Tensor
    x: Tensor | None
    y: Tensor | None
    bases: list
    sample: Sample

    @property
    def batch_size(self) -> int:
        return int(self.seeds.shape[0])

    def _map(self, fn) -> MiniBatch:
        def item(b):
            # a Basis maps its held tensors by the _apply protocol nn.Module uses for its own
            return b._apply(fn) if isinstance(b, Basis) else Block(
                fn(b.edge_index), b.num_src, b.num_dst, fn(b.edge_ids),
                None if b.edge_attr is None else fn(b.edge_attr))
        s = self.sample
        return MiniBatch(fn(self.seeds), fn(self.node_ids),
                         None if self.x is None else fn(self.x),
                         None if self.y is None else fn(self.y),
                         [item(b) for b in self.bases],
                         Sample(fn(s.node_ids), fn(s.edge_index), fn(s.edge_ids),
                                s.node_counts, s.edge_counts, check=False))

    def to(self, device, non_blocking: bool = False) -> MiniBatch:
        """This batch on ``device`` (bases and blocks included)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> MiniBatch:
        # called by torch.utils.data's pin-memory thread
        return self._map(lambda t: t.pin_memory())


def _identity(item):
    return item


class _BatchMaker(torch.utils.data.Dataset):
    """What a worker needs to build a mini-batch (map-style: an index is a (seed ids, random
    seed) pair); kept apart from the loader so that workers never copy its iteration state."""

    def __init__(self, sampler: NeighborSampler, restrictions, hop_fanouts: list[int],
                 weighted: bool, x: Tensor | None, y: Tensor | None,
                 edge_attr: Tensor | None = None, replace: bool = False):
        self.sampler, self.restrictions, self.hop_fanouts = sampler, restrictions, hop_fanouts
        self.weighted, self.x, self.y, self.edge_attr = weighted, x, y, edge_attr
        self.replace = replace

    def __getitem__(self, item) -> MiniBatch:
        ids, rng_seed = item
        g = torch.Generator(device=self.sampler.rowptr.device).manual_seed(rng_seed)
        s = self.sampler.sample(ids, self.hop_fanouts, weighted=self.weighted,
                                replace=self.replace, generator=g)
        if self.restrictions is None:
            items = [s.block(h) for h in range(s.num_hops, 0, -1)]
        else:
            items, hop = [], 0
            for r in reversed(self.restrictions):  # the last layer ends at the seeds
                items.append(r.restrict(s, hop))
                hop += r.hops
            items.reverse()
        # a graph-attention block carries its edges' features, gathered by their ids
        items = [b.with_features(self.edge_attr) if isinstance(b, Block) else b for b in items]
        x = None if self.x is None else self._rows(self.x, s.node_ids)
        y = None if self.y is None else self.y[s.seeds.to(self.y.device)]
        return MiniBatch(s.seeds, s.node_ids, x, y, items, s)

    def _rows(self, x: Tensor, ids: Tensor) -> Tensor:
        """x[ids]: by the compiled gather (rows prefetched) where the sampler is compiled."""
        ext = self.sampler.compiled()
        if ext is not None and x.device.type == "cpu" and x.is_contiguous() and \
                not (x.requires_grad and torch.is_grad_enabled()):
            return ext.gather_rows(x, ids)
        return x[ids.to(x.device)]


_END = object()


def _produce(make, items, pin: bool, q: queue.Queue, stop: threading.Event) -> None:
    """The prefetch thread: ``make(item)`` of each item into ``q`` until ``stop``; then the end
    marker (or the error). It holds no reference to its ``_Prefetch``, so a consumer that drops
    the iterator early lets it be collected, which stops this thread."""
    def put(x) -> bool:
        while not stop.is_set():
            try:
                q.put(x, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    try:
        for item in items:
            b = make(item)
            if not put(b.pin_memory() if pin else b):
                return
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
        put(e)
        return
    put(_END)


class _Prefetch:
    """Iterates over ``make(item)`` of ``items`` in order, a background thread building up to
    ``depth`` batches ahead (pinned when ``pin``); an error there is raised here."""

    def __init__(self, make, items, depth: int, pin: bool):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=_produce, daemon=True,
                                        args=(make, list(items), pin, self._q, self._stop),
                                        name="structconv-prefetch")
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._stop.is_set():
            raise StopIteration
        x = self._q.get()
        if x is _END:
            self.close()
            raise StopIteration
        if isinstance(x, BaseException):
            self.close()
            raise x
        return x

    def close(self) -> None:
        """Stop the thread (an epoch left early) and wait for it."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __del__(self):
        self.close()


class _Plan(torch.utils.data.Sampler):
    """Yields the current epoch's plan, drawn in the main process when iteration starts."""

    def __init__(self):
        self.items: list = []

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


class NeighborLoader:
    """Mini-batches of seed nodes with nested sampled neighbourhoods and restricted bases.

    ``edge_index`` (2, E) [source; target] over ``num_nodes`` nodes; ``fanouts`` one per layer
    of ``layers`` in PyG's order (``fanouts[0]`` for the seeds, i.e. the last layer), each a
    positive int, -1 or "all", or a tuple of per-hop fanouts for a multi-hop layer (a K-hop
    polynomial consumes K hops; the tuple's first entry nearest the seeds too). The bases are
    built on the graph's device: ``batch.to(device)`` moves a batch. ``layers``: graph layers
    or ``GraphRestriction`` /
    ``BlockRestriction``s, input layer first; None yields the hop blocks (one hop per fanout).
    ``x`` (num_nodes, ...) features and ``y`` (num_nodes, ...) labels are gathered per batch,
    ``edge_attr`` (E, ...) edge features per block (a graph-attention layer's ``edge_attr``);
    ``input_nodes`` the seeds (ids or a bool mask; all nodes by default). ``weighted`` draws
    neighbours with probability proportional to ``edge_weight``; ``degrees`` "full" or "sample"
    (see ``restrict``). Every epoch is reproducible from ``seed`` (the epoch number advances on
    each iteration; ``set_epoch`` sets it). ``rank`` / ``world_size`` deal the epoch's batches
    round robin (padded by wrapping, as ``DistributedSampler``), every rank drawing the same
    plan. ``prefetch`` > 0 (with ``num_workers`` 0) builds that many batches ahead in a
    background thread while the caller steps, pinned when ``pin_memory`` and CUDA is there; the
    batches and their order are the same as without it. ``replace`` draws neighbours with
    replacement; ``native`` picks the compiled sampler (None: where it can be built) or not.
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, fanouts: Sequence, *,
                 layers: Sequence | None = None, x: Tensor | None = None,
                 y: Tensor | None = None, input_nodes: Tensor | None = None,
                 batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 seed: int = 0, weighted: bool = False, edge_weight: Tensor | None = None,
                 edge_type: Tensor | None = None, edge_attr: Tensor | None = None,
                 degrees: str = "full", dtype: torch.dtype | None = None, num_workers: int = 0,
                 persistent_workers: bool = False, pin_memory: bool = False, rank: int = 0,
                 world_size: int = 1, prefetch: int = 0, replace: bool = False,
                 native: bool | None = None):
        n = check_num_nodes(num_nodes)
        self.batch_size = _check_int(batch_size, "batch_size", 1)
        self.prefetch = _check_int(prefetch, "prefetch", 0)
        if self.prefetch and num_workers:
            raise ValueError(f"prefetch={prefetch} builds batches in a thread of this process: "
                             f"use it with num_workers=0, got num_workers={num_workers}")
        if replace and weighted:
            raise ValueError("weighted sampling draws without replacement: replace must be "
                             "False with weighted=True")
        self.num_workers = _check_int(num_workers, "num_workers", 0)
        self.world_size = _check_int(world_size, "world_size", 1)
        self.rank = _check_int(rank, "rank", 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must lie in [0, {self.world_size - 1}], got {rank}")
        self.seed = _check_int(seed, "seed", 0)
        if isinstance(fanouts, (str, Tensor)) or not isinstance(fanouts, Sequence):
            raise ValueError(f"fanouts must be a list (one per layer), got {fanouts!r}")
        for name, t in (("x", x), ("y", y)):
            if t is not None and (not isinstance(t, Tensor) or t.dim() < 1 or t.shape[0] != n):
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name} must have one row per node ({n}), got {got}")
        _check_edge_attr(edge_attr, edge_index)
        if dtype is None and x is not None and x.is_floating_point():
            dtype = x.dtype
        self.num_nodes, self.x, self.y = n, x, y
        self.shuffle, self.drop_last, self.weighted = bool(shuffle), bool(drop_last), weighted
        self.pin_memory, self.persistent_workers = bool(pin_memory), bool(persistent_workers)
        self.sampler = NeighborSampler(edge_index, n, edge_weight if weighted else None)
        self.replace = bool(replace)
        if layers is None:
            self.restrictions = None
            self.hop_fanouts = [check_fanout(f, f"fanouts[{i}]") for i, f in enumerate(fanouts)]
        else:
            layers = list(layers)
            if len(fanouts) != len(layers):
                raise ValueError(f"fanouts has {len(fanouts)} entries {list(fanouts)} but there "
                                 f"are {len(layers)} graph layers: give one fanout per layer")
            self.restrictions = [restriction_for(m, edge_index, n, edge_weight=edge_weight,
                                                 edge_type=edge_type, degrees=degrees,
                                                 dtype=dtype) for m in layers]
            self.hop_fanouts = []
            # fanouts[0] belongs to the last layer, whose hops are nearest the seeds
            for i, f in enumerate(fanouts):
                r = self.restrictions[len(layers) - 1 - i]
                if isinstance(f, (tuple, list)):
                    if len(f) != r.hops:
                        raise ValueError(f"fanouts[{i}] {tuple(f)} has {len(f)} hops but its "
                                         f"layer ({r}) consumes {r.hops}")
                    self.hop_fanouts += [check_fanout(v, f"fanouts[{i}]") for v in f]
                else:
                    self.hop_fanouts += [check_fanout(f, f"fanouts[{i}]")] * r.hops
        if input_nodes is None:
            self.input_nodes = torch.arange(n)
        elif isinstance(input_nodes, Tensor) and input_nodes.dtype == torch.bool:
            if input_nodes.shape != (n,):
                raise ValueError(f"input_nodes as a mask must be ({n},), got "
                                 f"{tuple(input_nodes.shape)}")
            self.input_nodes = input_nodes.nonzero().squeeze(1)
        else:
            self.input_nodes = check_seeds(input_nodes, n, "input_nodes")
        self._maker = _BatchMaker(self.sampler, self.restrictions, self.hop_fanouts,
                                  self.weighted, x, y, edge_attr, self.replace)
        if native is not None:
            self.use_native(native)
        self._epoch, self._start = 0, 0
        self._plan = _Plan()
        self._loader = None

    def use_native(self, flag: bool | None) -> None:
        """Sample and restrict with the compiled kernel (True / None: where it can be built)
        or with torch ops (False); the batches are the same."""
        self.sampler.native = flag
        for r in self.restrictions or ():
            if isinstance(r, GraphRestriction):
                r.native = flag

    # -- the epoch's plan ------------------------------------------------------------------------
    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Make the next iteration epoch ``epoch`` (its shuffle and random seeds), beginning at
        this rank's batch ``start`` (a run resumed inside an epoch)."""
        self._epoch = _check_int(epoch, "epoch", 0)
        self._start = _check_int(start, "start", 0)

    def num_global_batches(self) -> int:
        """Batches of seeds in one epoch over every process together."""
        S, b = self.input_nodes.shape[0], self.batch_size
        return S // b if self.drop_last else -(-S // b)

    def __len__(self) -> int:
        return -(-self.num_global_batches() // self.world_size)

    def global_plan(self, epoch: int) -> list[tuple[Tensor, int]]:
        """Every rank's (seed ids, random seed) pairs of epoch ``epoch``: the global batches
        in order, the same on every rank."""
        g = torch.Generator().manual_seed(_splitmix(_splitmix(self.seed) ^ epoch) >> 1)
        S = self.input_nodes.shape[0]
        perm = torch.randperm(S, generator=g) if self.shuffle else torch.arange(S)
        nb = self.num_global_batches()
        batches = list(perm[:nb * self.batch_size if self.drop_last else S].split(
            self.batch_size))
        seeds = torch.randint(0, 2 ** 62, (nb,), generator=g).tolist()
        return [(self.input_nodes[b], s) for b, s in zip(batches, seeds)]

    def plan(self, epoch: int) -> list[tuple[Tensor, int]]:
        """This rank's (seed ids, random seed) pairs of epoch ``epoch``, in order."""
        full = self.global_plan(epoch)
        nb, W = len(full), self.world_size
        return [full[(self.rank + W * j) % nb] for j in range(len(self))] if nb else []

    def __iter__(self):
        self._plan.items = self.plan(self._epoch)[self._start:]
        self._epoch, self._start = self._epoch + 1, 0
        if self.num_workers == 0 and self.prefetch:
            pin = self.pin_memory and torch.cuda.is_available()
            return _Prefetch(self._maker.__getitem__, self._plan.items, self.prefetch, pin)
        if self.num_workers == 0:
            return (self._maker[item] for item in self._plan.items)
        if self._loader is None or not self.persistent_workers:
            self._loader = torch.utils.data.DataLoader(
                self._maker, sampler=self._plan, batch_size=None, collate_fn=_identity,
                num_workers=self.num_workers, persistent_workers=self.persistent_workers,
                pin_memory=self.pin_memory)
        return iter(self._loader)


# ------------------------------------------------------------------------------------------------
@torch.no_grad()
def inference(layers: Sequence, x: Tensor, edge_index: Tensor, num_nodes: int, *,
              edge_weight: Tensor | None = None, edge_type: Tensor | None = None,
              edge_attr: Tensor | None = None, batch_size: int = 1024,
              act: Callable | None = torch.relu, dtype: torch.dtype | None = None) -> Tensor:
    """Every node's output of ``layers`` (``act`` between them), layer by layer over batches of
    ``batch_size`` targets with their whole neighbourhoods: (num_nodes, ...) as the full-batch
    forward, without holding more than one layer's activations for all nodes. ``x``
    (num_nodes, F) features (or node ids for featureless first layers); ``edge_attr`` (E, ...)
    the edges' features, given to the graph-attention layers' blocks."""
    n = check_num_nodes(num_nodes)
    bs = _check_int(batch_size, "batch_size", 1)
    if not isinstance(x, Tensor) or x.shape[0] != n:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must have one row per node ({n}), got {got}")
    if dtype is None and x.is_floating_point():
        dtype = x.dtype
    _check_edge_attr(edge_attr, edge_index)
    sampler = NeighborSampler(edge_index, n)
    for i, layer in enumerate(layers):
        r = restriction_for(layer, edge_index, n, edge_weight=edge_weight, edge_type=edge_type,
                            dtype=dtype)
        out = None
        for ids in torch.arange(n).split(bs):
            s = sampler.sample(ids, [-1] * r.hops)
            item = r.restrict(s, 0)
            if isinstance(item, Block):
                item = item.with_features(edge_attr)
            item = item.to(x.device) if isinstance(item, (Basis, Block)) else item
            h = apply_layer(layer, x[s.node_ids.to(x.device)], item)
            if out is None:
                out = h.new_empty((n,) + tuple(h.shape[1:]))
            out[ids.to(h.device)] = h
        x = act(out) if act is not None and i < len(layers) - 1 else out
    return x

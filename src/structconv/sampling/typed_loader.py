"""Mini-batches of typed seeds with their sampled typed neighbourhoods: ``TypedNeighborLoader``.

The typed counterpart of ``NeighborLoader``: the epoch's plan (the seeds of every input node type
in one list, shuffled from ``seed`` and the epoch, cut into batches, one random seed per batch)
is drawn in the main process, so a batch is the same whichever thread builds it; ``prefetch``
builds batches ahead in a background thread (the compiled sampler releases the GIL) from the same
plan; ``state_dict`` / ``load_state_dict`` carry the position (epoch, batches taken) for an exact
resume. A ``TypedMiniBatch`` holds the features and the whole sample as a typed graph
(``x_dict``, ``edge_index_dict``: a typed model runs on it unchanged, the seeds' rows first) and
the per-hop ``blocks`` for layer-by-layer use (``apply_typed_layers``).

A task calls it as::

    loader = TypedNeighborLoader(graph, [10, 10], input_nodes=("author", graph.masks["author"]
                                 ["train"]), batch_size=512, shuffle=True, seed=0, prefetch=2)
    for batch in loader:
        out = model(batch.x_dict, batch.edge_index_dict)["author"][:batch.num_seeds["author"]]
        loss = F.cross_entropy(out, batch.y_dict["author"])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .loader import _check_int, _Prefetch, _splitmix
from .typed import EdgeType, TypedBlock, TypedNeighborSampler, TypedSample, typed_fanouts

__all__ = ["TypedNeighborLoader", "TypedMiniBatch"]


@dataclass
class TypedMiniBatch:
    """One typed mini-batch. ``seeds`` {t: (S_t,)} global ids of the seeds per input type (in
    batch order); ``node_ids`` {t: (n_t,)} every sampled node of type t, its seeds first;
    ``x_dict`` {t: (n_t, F_t)} their features (types with features); ``y_dict`` {t: (S_t, ...)}
    the seeds' labels (input types with labels); ``edge_index_dict`` {(s, rel, d): (2, E)} the
    whole sample in local ids (``blocks[0]``'s edges); ``edge_attr_dict`` their features;
    ``blocks`` one ``TypedBlock`` per hop, input layer first (hop H ... hop 1); ``sample`` the
    ``TypedSample``; ``rng_seed`` the batch's random seed (for dropout masks, as the
    homogeneous trainer's ``dropout_seed``)."""

    seeds: dict[str, Tensor]
    node_ids: dict[str, Tensor]
    x_dict: dict[str, Tensor]
    y_dict: dict[str, Tensor]
    edge_index_dict: dict[EdgeType, Tensor]
    blocks: list[TypedBlock]
    sample: TypedSample
    edge_attr_dict: dict[EdgeType, Tensor] = field(default_factory=dict)
    rng_seed: int = 0

    @property
    def num_seeds(self) -> dict[str, int]:
        """{t: S_t}: the first S_t rows of type t's outputs are its seeds'."""
        return {t: int(v.shape[0]) for t, v in self.seeds.items()}

    @property
    def batch_size(self) -> int:
        return sum(self.num_seeds.values())

    def _map(self, fn) -> TypedMiniBatch:
        def md(d):
            return {k: fn(v) for k, v in d.items()}
        s = self.sample
        return TypedMiniBatch(md(self.seeds), md(self.node_ids), md(self.x_dict), md(self.y_dict),
                              md(self.edge_index_dict), [b._map(fn) for b in self.blocks],
                              TypedSample(md(s.node_ids), s.node_counts, md(s.edge_index),
                                          md(s.edge_ids), s.edge_counts, check=False),
                              md(self.edge_attr_dict), self.rng_seed)

    def to(self, device, non_blocking: bool = False) -> TypedMiniBatch:
        """This batch on ``device`` (blocks and sample included)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> TypedMiniBatch:
        return self._map(lambda t: t.pin_memory())


def _input_nodes(input_nodes, num_nodes: dict[str, int]) -> list[tuple[str, Tensor]]:
    """[(type, ids)] of ``input_nodes``: a node type (all its nodes), a pair (type, ids or bool
    mask) or a dict {type: ids, mask or None (all)}."""
    if isinstance(input_nodes, str):
        input_nodes = {input_nodes: None}
    elif isinstance(input_nodes, tuple) and len(input_nodes) == 2 and \
            isinstance(input_nodes[0], str):
        input_nodes = {input_nodes[0]: input_nodes[1]}
    if not isinstance(input_nodes, Mapping) or not input_nodes:
        raise ValueError("input_nodes must be a node type, a pair (type, ids or mask) or a dict "
                         f"{{type: ids or mask}}, got {input_nodes!r}")
    out = []
    for t, v in input_nodes.items():
        if t not in num_nodes:
            raise ValueError(f"input_nodes names node type {t!r}, not among {list(num_nodes)}")
        n = num_nodes[t]
        if v is None:
            v = torch.arange(n)
        elif isinstance(v, Tensor) and v.dtype == torch.bool:
            if v.shape != (n,):
                raise ValueError(f"input_nodes[{t!r}] as a mask must be ({n},), got "
                                 f"{tuple(v.shape)}")
            v = v.nonzero().squeeze(1)
        else:
            from .sampler import check_seeds

            v = check_seeds(v, max(n, 1), f"input_nodes[{t!r}]")
        out.append((t, v.cpu()))
    return out


class TypedNeighborLoader:
    """Mini-batches of typed seeds with nested typed samples (module doc).

    ``graph`` a ``HeteroGraph`` (its ``x`` / ``y`` / ``edge_attr`` dicts are gathered per batch);
    ``fanouts`` one list for every relation or a dict {edge type: list} (``typed_fanouts``; one
    entry per hop, the first for the seeds, i.e. the last layer; 0 skips a relation at a hop);
    ``input_nodes`` the seeds: a node type, (type, ids or mask) or {type: ids or mask}.
    ``batch_size`` seeds a batch over all input types together; ``shuffle`` reorders them every
    epoch from ``seed``; ``rank`` / ``world_size`` deal the global batches round robin (padded by
    wrapping). ``prefetch`` > 0 builds that many batches ahead in a background thread (pinned
    when ``pin_memory`` and CUDA is there): the same batches in the same order. ``replace`` draws
    with replacement; ``native`` picks the compiled sampler (None: where it can be built).
    """

    def __init__(self, graph, fanouts, *, input_nodes, batch_size: int = 1,
                 shuffle: bool = False, drop_last: bool = False, seed: int = 0,
                 replace: bool = False, prefetch: int = 0, pin_memory: bool = False,
                 rank: int = 0, world_size: int = 1, native: bool | None = None):
        self.sampler = TypedNeighborSampler(graph, native=native)
        typed_fanouts(fanouts, self.sampler.edge_types)  # checked here, used per batch
        self.fanouts = fanouts
        self.input_nodes = _input_nodes(input_nodes, self.sampler.num_nodes)
        self.batch_size = _check_int(batch_size, "batch_size", 1)
        self.prefetch = _check_int(prefetch, "prefetch", 0)
        self.seed = _check_int(seed, "seed", 0)
        self.world_size = _check_int(world_size, "world_size", 1)
        self.rank = _check_int(rank, "rank", 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must lie in [0, {self.world_size - 1}], got {rank}")
        self.shuffle, self.drop_last, self.replace = bool(shuffle), bool(drop_last), bool(replace)
        self.pin_memory = bool(pin_memory)
        self.x = dict(getattr(graph, "x", {}) or {})
        self.y = dict(getattr(graph, "y", {}) or {})
        self.edge_attr = dict(getattr(graph, "edge_attr", {}) or {})
        self._types = [t for t, _ in self.input_nodes]
        self._all_types = torch.cat([torch.full((v.shape[0],), i, dtype=torch.long)
                                     for i, (_, v) in enumerate(self.input_nodes)])
        self._all_ids = torch.cat([v for _, v in self.input_nodes])
        self._epoch, self._start = 0, 0
        self._cur: list | None = None  # [epoch, batches taken] of the epoch being iterated

    def use_native(self, flag: bool | None) -> None:
        """Sample with the compiled kernel (True / None: where it can be built) or with torch
        ops (False); the batches are the same."""
        self.sampler.native = flag

    # -- the plan ---------------------------------------------------------------------------
    def num_global_batches(self) -> int:
        S, b = self._all_ids.shape[0], self.batch_size
        return S // b if self.drop_last else -(-S // b)

    def __len__(self) -> int:
        return -(-self.num_global_batches() // self.world_size)

    def global_plan(self, epoch: int) -> list[tuple[dict[str, Tensor], int]]:
        """Every rank's ({type: seed ids}, random seed) batches of epoch ``epoch``, in order."""
        g = torch.Generator().manual_seed(_splitmix(_splitmix(self.seed) ^ epoch) >> 1)
        S = self._all_ids.shape[0]
        perm = torch.randperm(S, generator=g) if self.shuffle else torch.arange(S)
        nb = self.num_global_batches()
        rng = torch.randint(0, 2 ** 62, (nb,), generator=g).tolist()
        out = []
        for j, b in enumerate(perm[:nb * self.batch_size if self.drop_last else S].split(
                self.batch_size)):
            ty, ids = self._all_types[b], self._all_ids[b]
            out.append(({t: ids[ty == i] for i, t in enumerate(self._types)}, rng[j]))
        return out

    def plan(self, epoch: int) -> list[tuple[dict[str, Tensor], int]]:
        """This rank's batches of epoch ``epoch``, in order."""
        full = self.global_plan(epoch)
        nb, W = len(full), self.world_size
        return [full[(self.rank + W * j) % nb] for j in range(len(self))] if nb else []

    # -- position ---------------------------------------------------------------------------
    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Make the next iteration epoch ``epoch``, beginning at this rank's batch ``start``."""
        self._epoch = _check_int(epoch, "epoch", 0)
        self._start = _check_int(start, "start", 0)
        self._cur = None

    def state_dict(self) -> dict:
        """The position for an exact resume: {"epoch", "batch" (batches of it taken), "seed"}
        (the epoch being iterated, or the next one between epochs)."""
        if self._cur is not None:
            return {"epoch": self._cur[0], "batch": self._cur[1], "seed": self.seed}
        return {"epoch": self._epoch, "batch": self._start, "seed": self.seed}

    def load_state_dict(self, state: Mapping) -> None:
        """Resume at a ``state_dict``'s position: the next batch is the one that would have
        followed it (same seed required)."""
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError(f"the state was saved by a loader with seed {state['seed']}, this "
                             f"one has seed {self.seed}")
        self.set_epoch(int(state["epoch"]), int(state["batch"]))

    # -- batches ----------------------------------------------------------------------------
    def make(self, item: tuple[dict[str, Tensor], int]) -> TypedMiniBatch:
        """The mini-batch of one plan item ({type: seed ids}, random seed)."""
        seeds, rng_seed = item
        g = torch.Generator().manual_seed(rng_seed)
        s = self.sampler.sample(seeds, self.fanouts, replace=self.replace, generator=g)
        blocks = [s.block(h).with_features(self.edge_attr) for h in range(s.num_hops, 0, -1)]
        x = {t: self._rows(v, s.node_ids[t]) for t, v in self.x.items()}
        y = {t: v[seeds[t].to(v.device)] for t, v in self.y.items() if t in seeds}
        if blocks:
            ei, ea = blocks[0].edge_index, blocks[0].edge_attr
        else:
            ei = {e: torch.zeros(2, 0, dtype=torch.long) for e in s.edge_types}
            ea = {e: a[:0] for e, a in self.edge_attr.items()}
        return TypedMiniBatch({t: s.seeds[t] for t in seeds}, s.node_ids, x, y, ei, blocks, s,
                              ea, rng_seed)

    def _rows(self, x: Tensor, ids: Tensor) -> Tensor:
        """x[ids], by the compiled gather where the sampler is compiled."""
        ext = self.sampler.compiled()
        if ext is not None and x.device.type == "cpu" and x.is_contiguous() and x.dim() >= 1 \
                and x.shape[0] and not (x.requires_grad and torch.is_grad_enabled()):
            return ext.gather_rows(x, ids)
        return x[ids.to(x.device)]

    def __iter__(self):
        epoch, start = self._epoch, self._start
        items = self.plan(epoch)[start:]
        self._epoch, self._start = epoch + 1, 0
        self._cur = [epoch, start]
        if self.prefetch:
            pin = self.pin_memory and torch.cuda.is_available()
            return self._count(_Prefetch(self.make, items, self.prefetch, pin))
        return self._count(self.make(item) for item in items)

    def _count(self, batches):
        """Yield the batches, counting those taken (the resumable position)."""
        cur = self._cur
        for b in batches:
            cur[1] += 1
            yield b
        if self._cur is cur:
            self._cur = None

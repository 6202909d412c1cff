"""Typed node classification on sampled mini-batches (``[train.sampler]`` with ``[model.hetero]``).

Each step is one ``TypedMiniBatch`` per process (``TypedNeighborLoader``: ``batch_size`` seeds of
the target type's training nodes, a fanout per relation and hop), the model run unchanged on the
whole sample as a typed graph, its first ``num_seeds`` target rows scored. At fanout "all" the
seeds' logits are the full-batch ones (every edge into a node the last layers read is kept).
Evaluation is the full-batch task's. A mid-epoch checkpoint keeps the loader's position; the
batches and their dropout masks come from (seed, epoch, batch), so a resumed run is the
uninterrupted one.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ...config import ConfigError, typed_sampler_spec
from ...models.hetero import typed_metadata
from ...sampling.typed_loader import TypedNeighborLoader
from .. import distributed as D
from ..minibatch import dropout_seed
from .base import batch_sums
from .typed import TypedNodeTask

__all__ = ["SampledTypedNodeTask", "resolve_fanouts"]


def _key(et) -> str:
    return ".".join(et)


def resolve_fanouts(fanouts, edge_types: list) -> list | dict:
    """A config's ``fanouts`` for ``TypedNeighborLoader``: a list as it is; a table keyed by
    ``"src.rel.dst"`` or a relation name as {edge type: list} over every edge type (the edge
    type's own key before its relation's). ConfigError naming an unknown or a missing key."""
    if not isinstance(fanouts, dict):
        return list(fanouts)
    names = {_key(e) for e in edge_types} | {e[1] for e in edge_types}
    unknown = [k for k in fanouts if k not in names]
    if unknown:
        raise ConfigError(f"train.sampler.fanouts names {unknown}, neither an edge type nor a "
                          f"relation of the graph (edge types: "
                          f"{', '.join(_key(e) for e in edge_types)})")
    out = {}
    for e in edge_types:
        fs = fanouts.get(_key(e), fanouts.get(e[1]))
        if fs is not None:
            out[tuple(e)] = list(fs)
    missing = [_key(e) for e in edge_types if tuple(e) not in out]
    if missing:
        raise ConfigError(f"train.sampler.fanouts gives no fanouts for edge types {missing}: "
                          "name each (\"src.rel.dst\" or its relation), 0 to skip one")
    return out


class SampledTypedNodeTask(TypedNodeTask):
    """The typed task on sampled mini-batches (module doc); one batch per process and step."""

    def __init__(self, cfg: dict, data):
        super().__init__(cfg, data)
        self.sampler = typed_sampler_spec(cfg)
        # refused here, before a run folder is made, where the graph does not fit them
        self.fanouts = resolve_fanouts(self.sampler["fanouts"],
                                       list(typed_metadata(self.spec, data)[1]))
        self.loader: TypedNeighborLoader | None = None

    def setup(self, model, dev, world) -> None:
        super().setup(model, dev, world)
        self.loader = self.make_loader(world.rank, world.size)

    def make_loader(self, rank: int = 0, world_size: int = 1) -> TypedNeighborLoader:
        """The training loader: the target type's training nodes as seeds, shuffled per epoch
        from the config's seed, each rank its share of the global batches."""
        s, data = self.sampler, self.data
        try:
            seeds = (self.target, self.masks["train"])
            return TypedNeighborLoader(data, self.fanouts, input_nodes=seeds,
                                       batch_size=s["batch_size"], shuffle=True,
                                       seed=self.cfg["seed"] % 2**62, replace=s["replace"],
                                       prefetch=s["prefetch"], rank=rank, world_size=world_size)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"train.sampler: {e}") from None

    def epoch_steps(self, epoch: int, done: int, extra: dict | None):
        L = self.loader
        if extra is not None and "typed_loader" in extra:
            e, b, seed = (int(v) for v in extra["typed_loader"].tolist())
            if (e, b) != (epoch, done):
                raise ConfigError(f"the checkpoint's sampler position (epoch {e}, batch {b}) "
                                  f"is not its step (epoch {epoch}, step {done})")
            L.load_state_dict({"epoch": e, "batch": b, "seed": seed})
        else:
            L.set_epoch(epoch, done)
        return len(L), ([batch] for batch in L)

    def position(self) -> dict | None:
        st = self.loader.state_dict() if self.loader is not None else None
        return None if st is None else {"typed_loader": torch.tensor(
            [st["epoch"], st["batch"], st["seed"]], dtype=torch.long)}

    def group_items(self, group: list) -> float:
        n = float(sum(b.num_seeds.get(self.target, 0) for b in group))
        return D.all_reduce_sum(torch.tensor(n, dtype=torch.float64, device=self.dev)).item()

    def batch_inputs(self, batch) -> tuple[dict, dict]:
        """(x_dict, edge_index_dict) of a batch on the device: the model's node types, a
        featureless type reading ones (as ``typed_inputs``)."""
        types, ets = typed_metadata(self.spec, self.data)
        x = {t: batch.x_dict[t].to(self.dev, self.dtype) if t in batch.x_dict else
             torch.ones(batch.node_ids[t].shape[0], 1, device=self.dev, dtype=self.dtype)
             for t in types}
        return x, {e: batch.edge_index_dict[e].to(self.dev) for e in ets}

    def batch_loss(self, net, batch, share: float):
        # dropout from the batch's own seed: the same masks in any process and after a resume
        torch.manual_seed(dropout_seed(batch.rng_seed))
        S = batch.num_seeds[self.target]
        logits = net(*self.batch_inputs(batch))[:S]
        y = batch.y_dict[self.target].to(self.dev)
        loss = F.cross_entropy(logits, y, reduction="none",
                               label_smoothing=self.cfg["train"].get("label_smoothing", 0.0))
        ok = logits.argmax(-1) == y
        # DDP's mean of the scaled gradients is the gradient of the mean over the step's seeds
        return loss.sum() * share, batch_sums(loss, ok, ok.numel())

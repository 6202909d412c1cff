"""Declared models on sampled mini-batches (``[train.sampler]``): batching and evaluation modes.

A node-classification ``StructNet`` runs on a ``sampling.MiniBatch`` by giving each graph layer
its restriction in place of the full graph's structure (``StructNet.forward(x, structures,
node_ids)``). What a layer's restriction is comes from its basis kind's ``Sampled`` trait
(``restrictions``). ``SampledEval`` evaluates the model exactly: full batch, or layer by layer
over whole neighbourhoods when the full-batch activations would not fit. ``StepLoader`` deals the
epoch's global batches so that an optimizer step covers the same ``world_size x accumulate``
batches whatever the number of processes.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from .. import basis as B
from .._checks import available_memory
from ..config import ConfigError, sampler_spec
from ..models.build import memory_estimate
from ..nn.layers import Convolution
from ..sampling import (
    BlockRestriction,
    GraphRestriction,
    MiniBatch,
    NeighborLoader,
    NeighborSampler,
)

__all__ = ["restrictions", "batch_inputs", "StepLoader", "make_loader", "dropout_seed",
           "SampledEval"]


def _restriction(layer: dict, block: nn.Module, data, degrees: str):
    """The restriction of one declared block, or None for a pointwise (row-wise) one."""
    if block.pointwise:
        return None
    trait = B.sampled(layer["basis"])
    if trait is None:
        raise ConfigError(f"a {B.as_spec(layer['basis']).get('kind')} basis cannot be sampled")
    basis = block.conv.basis if isinstance(block.conv, Convolution) else None
    opts = trait.restriction(B.with_defaults(layer["basis"]), basis)
    kind = opts.pop("kind")
    if kind == "block":  # content-based: only the edge set is restricted
        return BlockRestriction()
    return GraphRestriction(kind, data.edge_index, data.num_nodes, edge_type=data.edge_type,
                            degrees=degrees, **opts)


def restrictions(model: nn.Module, cfg: dict, data, degrees: str = "full") -> list:
    """One restriction per block of ``model`` (None for pointwise blocks), input block first."""
    layers = cfg["model"]["layers"]
    try:
        return [_restriction(lay, blk, data, degrees) for lay, blk in zip(layers, model.blocks)]
    except (ValueError, TypeError) as e:
        raise ConfigError(f"train.sampler: {e}") from None


def batch_inputs(batch: MiniBatch, dtype: torch.dtype) -> tuple:
    """``StructNet``'s arguments for a mini-batch: (x (M, F) on the input nodes, or (M, 0) for
    featureless nodes; the layers' restrictions; the input nodes' ids)."""
    x = batch.x
    if x is None:
        x = torch.zeros(batch.node_ids.shape[0], 0, device=batch.node_ids.device, dtype=dtype)
    return x, batch.bases, batch.node_ids


class StepLoader(NeighborLoader):
    """A ``NeighborLoader`` whose rank takes ``accumulate`` batches per optimizer step: step s
    covers global batches s·W·A .. s·W·A + W·A - 1 (wrapping past the last, as
    ``DistributedSampler`` pads), micro-batch a of rank r being batch s·W·A + a·W + r. A
    1-process run with accumulate = W·A therefore steps on the same batches as W processes."""

    def __init__(self, *args, accumulate: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.accumulate = int(accumulate)

    def steps(self) -> int:
        return -(-self.num_global_batches() // (self.world_size * self.accumulate))

    def __len__(self) -> int:
        return self.steps() * self.accumulate

    def plan(self, epoch: int) -> list[tuple[Tensor, int]]:
        full = self.global_plan(epoch)
        nb, W, A = len(full), self.world_size, self.accumulate
        if not nb:
            return []
        return [full[(s * W * A + a * W + self.rank) % nb]
                for s in range(self.steps()) for a in range(A)]


def make_loader(cfg: dict, data, restr: list, dtype: torch.dtype, rank: int = 0,
                world_size: int = 1) -> StepLoader:
    """The training loader of a ``[train.sampler]`` config: the train-mask nodes as seeds,
    shuffled per epoch from the config's seed, features in ``dtype``."""
    s = sampler_spec(cfg)
    cores = os.cpu_count() or 1
    if s["workers"] > cores:  # each worker is a process that samples on a core of its own
        raise ConfigError(f"train.sampler.workers={s['workers']} exceeds the {cores} CPU cores of "
                          f"this machine: use at most {cores}")
    fan = [tuple(f) if isinstance(f, list) else f for f in s["fanouts"]]
    x = None if data.x is None else data.x.to(dtype)
    try:
        return StepLoader(data.edge_index, data.num_nodes, fan,
                          layers=[r for r in restr if r is not None], x=x, y=data.y,
                          input_nodes=data.masks["train"], batch_size=s["batch_size"],
                          shuffle=True, seed=cfg["seed"] % 2**62, num_workers=s["workers"],
                          persistent_workers=s["workers"] > 0, prefetch=s["prefetch"], rank=rank,
                          world_size=world_size, accumulate=s["accumulate"])
    except (ValueError, TypeError) as e:
        raise ConfigError(f"train.sampler: {e}") from None


def dropout_seed(rng_seed: int) -> int:
    """The global RNG seed for a batch's dropout, from the batch's sampling seed: a batch
    draws the same masks whichever process runs it, and after a resume."""
    return (rng_seed * 6364136223846793005 + 1442695040888963407) % 2**63


class SampledEval:
    """Exact evaluation of a sampled-trained node model: ``mode`` is ``[train.sampler]``'s
    ``eval`` (``auto``: full batch when the full-batch forward's activations fit in half the
    free memory, decided once); ``logits`` runs it."""

    def __init__(self, model: nn.Module, cfg: dict, data):
        self.model, self.cfg, self.data = model, cfg, data
        self._mode = sampler_spec(cfg)["eval"]
        self._layerwise = None  # (restrictions over whole neighbourhoods, sampler), built once

    def mode(self, device) -> str:
        """``full`` or ``layerwise``."""
        if self._mode == "auto":
            full = {**self.cfg, "train": {**self.cfg["train"], "sampler": {}}}
            est = memory_estimate(full, self.data, self.model)
            free = available_memory(device)
            fits = free is None or est["activations"] / 2 < free / 2
            self._mode = "full" if fits else "layerwise"
        return self._mode

    @torch.no_grad()
    def logits(self, device) -> Tensor:
        """Every node's logits (N, classes): the full-batch forward, or one block at a time
        over batches of ``data.eval_batch_size`` targets with their whole neighbourhoods (equal
        to it, holding one layer's activations for all nodes)."""
        if self.mode(device) == "full":
            return self.model(self._x(device))
        return self.layerwise(device)

    def _x(self, device) -> Tensor:
        data, dtype = self.data, next(self.model.parameters()).dtype
        x = torch.zeros(data.num_nodes, 0) if data.x is None else data.x
        return x.to(device=device, dtype=dtype)

    @torch.no_grad()
    def layerwise(self, device) -> Tensor:
        """Every node's logits (N, classes), layer by layer over whole neighbourhoods."""
        model, data, n = self.model, self.data, self.data.num_nodes
        x = self._x(device)
        if self._layerwise is None:
            self._layerwise = (restrictions(model, self.cfg, data, "full"),
                               NeighborSampler(data.edge_index, n))
        restr, sampler = self._layerwise
        h = x.unsqueeze(0)
        for blk, r in zip(model.blocks, restr):
            if r is None:
                h = blk(h)
                continue
            out = None
            for ids in torch.arange(n).split(self.cfg["data"]["eval_batch_size"]):
                s = sampler.sample(ids, [-1] * r.hops)
                item = r.restrict(s, 0).to(device)
                y = blk(h[:, s.node_ids.to(device)], item, s.node_ids.to(device))
                if out is None:
                    out = y.new_empty((1, n, y.shape[2]))
                out[:, ids.to(device)] = y
            h = out
        if model.classifier is not None:
            h = model.classifier(h)
        return h[0]

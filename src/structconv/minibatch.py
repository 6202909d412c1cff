"""Declared models (``config.StructNet``) on sampled mini-batches: ``[train.sampler]``.

A node-classification ``StructNet`` runs on a ``sampling.MiniBatch`` by giving each graph layer
its restricted basis (``sampling.GraphRestriction`` built from the layer's basis table, or the
hop's edge ``Block`` for graph attention) in place of the full graph's basis; pointwise layers
(``linear``, ``mlp``) act on the rows they get. ``layerwise_logits`` evaluates the model on every
node one layer at a time with whole neighbourhoods, exactly as the full-batch forward.
``StepLoader`` deals the epoch's global batches so that an optimizer step covers the same
``world_size x accumulate`` batches whatever the number of processes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .config import (
    AttentionConv,
    Block,
    ConfigError,
    FixedConv,
    _basis_spec,
    _dropout,
    available_memory,
    memory_estimate,
    sampler_spec,
)
from .engine import convolve
from .sampling import (
    BlockRestriction,
    GraphRestriction,
    MiniBatch,
    NeighborLoader,
    NeighborSampler,
)

__all__ = ["restrictions", "SampledNet", "StepLoader", "make_loader", "layerwise_logits",
           "eval_mode"]


class _AttentionBlocks(BlockRestriction):
    """The hop's edge block for a graph-attention layer; ``self_loops`` as the layer adds."""

    def __init__(self, self_loops: bool):
        self.self_loops = bool(self_loops)


def _restriction(layer: dict, block: Block, data, degrees: str):
    """The restriction of one declared layer, or None for a pointwise (0-hop, row-wise) one."""
    if layer.get("type", "conv") != "conv":
        return None
    spec = _basis_spec(layer["basis"])
    kind, conv = spec["kind"], block.conv
    if kind == "graph_attention":
        return _AttentionBlocks(spec.get("add_self_loops", True))
    ei, n = data.edge_index, data.num_nodes
    # the options (and defaults) of the full basis built by sc.basis.kinds; values in the
    # full basis's own dtype, so a restricted layer rounds as the full one does
    if kind == "gcn":
        return GraphRestriction("gcn", ei, n, add_self_loops=spec.get("add_self_loops", True),
                                normalize=spec.get("normalize", True), degrees=degrees)
    if kind == "sgc":
        return GraphRestriction("sgc", ei, n, K=spec.get("hops", 2), degrees=degrees)
    if kind in ("chebyshev", "diffusion"):
        return GraphRestriction(kind, ei, n, K=spec.get("K", 3 if kind == "chebyshev" else 2),
                                normalization=spec.get("normalization", "sym"), degrees=degrees)
    if kind == "relational":
        b = conv.basis
        return GraphRestriction("relational", ei, n, edge_type=data.edge_type, sorts=b.sorts,
                                identity=b.identity, num_relations=data.num_relations,
                                normalization=spec.get("normalization", "mean"),
                                degrees=degrees)
    raise ConfigError(f"a {kind} basis cannot be sampled")


def restrictions(model: nn.Module, cfg: dict, data, degrees: str = "full") -> list:
    """One restriction per block of ``model`` (None for pointwise blocks), input block first."""
    layers = cfg["model"]["layers"]
    try:
        return [_restriction(lay, blk, data, degrees) for lay, blk in zip(layers, model.blocks)]
    except (ValueError, TypeError) as e:
        raise ConfigError(f"train.sampler: {e}") from None


def _conv(blk: Block, h: Tensor, item, r, node_ids: Tensor | None) -> Tensor:
    """The block's convolution on a restricted basis / block: h (1, M, P) -> (1, N, Q)."""
    conv = blk.conv
    if isinstance(conv, FixedConv):
        if conv.identity_input:
            # featureless input x = I: x·Θ_k is Θ_k's rows of the batch's input nodes
            t = conv.param()[:, node_ids[:item.M].to(h.device)]
            y = item.propagate_sum(t.permute(1, 0, 2).unsqueeze(0))
        else:
            y = convolve(h, item, conv.param, route=conv.route)
        return y if conv.bias is None else y + conv.bias
    from . import attention as att

    if not isinstance(conv, AttentionConv):
        raise TypeError(f"{type(conv).__name__} cannot run on a sampled mini-batch")
    theta, H = conv.param(), conv.heads
    ei, N = item.edge_index.to(h.device), item.num_dst
    if r.self_loops:  # as the full layer: the graph's own loops replaced by one per node
        loops = torch.arange(N, device=h.device).repeat(2, 1)
        ei = torch.cat([ei[:, ei[0] != ei[1]], loops], 1)
    hk = torch.einsum("bmp,kpq->bmkq", h, theta[:H])
    s = F.leaky_relu(conv.scores.edge_scores(hk, hk, ei), conv.slope)
    basis = att.GraphAttention.from_scores(ei, s, item.num_src, N)
    if conv.training and conv.dropout:
        basis = att.GraphAttention(ei, F.dropout(basis.alpha, conv.dropout), item.num_src, N,
                                   structure=basis.structure)
    y = convolve(h, basis, theta[:H])
    return y if conv.bias is None else y + conv.bias


def block_forward(blk: Block, x: Tensor, item, r, node_ids: Tensor | None = None) -> Tensor:
    """``Block.forward`` on a mini-batch: x (1, M, P) on the layer's input nodes -> (1, N, Q)
    on its targets (the first N); ``item`` the layer's restricted basis or edge block, made by
    restriction ``r``; ``node_ids`` the input nodes' ids (featureless input)."""
    h = blk.norm(x) if blk.norm is not None else x
    h = _dropout(h, blk.dropout, blk.training)
    h = _conv(blk, h, item, r, node_ids)
    if blk.act is not None:
        h = blk.act(h)
    return h + x[:, :h.shape[1]] if blk.residual else h


class SampledNet(nn.Module):
    """A node-classification ``StructNet`` applied to ``MiniBatch``es: logits (S, classes) of
    the batch's seeds. Holds the model (its parameters, not copies): wrap this in DDP."""

    def __init__(self, model: nn.Module, restr: list):
        super().__init__()
        self.model, self.restr = model, restr

    def forward(self, batch: MiniBatch) -> Tensor:
        m = self.model
        x = batch.x
        if x is None:  # featureless: the first layer reads Θ's rows of the batch's nodes
            x = torch.zeros(batch.node_ids.shape[0], 0, device=batch.node_ids.device,
                            dtype=next(m.parameters()).dtype)
        h, items = x.unsqueeze(0), iter(batch.bases)
        for blk, r in zip(m.blocks, self.restr):
            h = blk(h) if r is None else block_forward(blk, h, next(items), r, batch.node_ids)
        if m.classifier is not None:
            h = m.classifier(h)
        return h[0]


class StepLoader(NeighborLoader):
    """A ``NeighborLoader`` whose rank takes ``accumulate`` batches per optimizer step: step s
    covers global batches s·W·A .. s·W·A + W·A - 1 (wrapping past the last, as
    ``DistributedSampler`` pads), micro-batch a of rank r being batch s·W·A + a·W + r. A
    1-process run with accumulate = W·A therefore steps on the same batches as W processes."""

    def __init__(self, *args, accumulate: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.accumulate = int(accumulate)

    def steps(self) -> int:
        return -(-self._num_global() // (self.world_size * self.accumulate))

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
    fan = [tuple(f) if isinstance(f, list) else f for f in s["fanouts"]]
    x = None if data.x is None else data.x.to(dtype)
    try:
        return StepLoader(data.edge_index, data.num_nodes, fan,
                          layers=[r for r in restr if r is not None], x=x, y=data.y,
                          input_nodes=data.masks["train"], batch_size=s["batch_size"],
                          shuffle=True, seed=cfg["seed"] % 2**62, num_workers=s["workers"],
                          persistent_workers=s["workers"] > 0, rank=rank,
                          world_size=world_size, accumulate=s["accumulate"])
    except (ValueError, TypeError) as e:
        raise ConfigError(f"train.sampler: {e}") from None


def dropout_seed(rng_seed: int) -> int:
    """The global RNG seed for a batch's dropout, from the batch's sampling seed: a batch
    draws the same masks whichever process runs it, and after a resume."""
    return (rng_seed * 6364136223846793005 + 1442695040888963407) % 2**63


def eval_mode(model: nn.Module, cfg: dict, data, device) -> str:
    """``full`` or ``layerwise``: the ``eval`` of ``[train.sampler]``; ``auto`` is full batch
    when the full-batch forward's activations fit in half the free memory (cached)."""
    mode = sampler_spec(cfg)["eval"]
    if mode != "auto":
        return mode
    if getattr(model, "_sc_eval_mode", None) is None:
        full = {**cfg, "train": {**cfg["train"], "sampler": {}}}
        est, free = memory_estimate(full, data), available_memory(device)
        fits = est is not None and (free is None or est["activations"] / 2 < free / 2)
        model._sc_eval_mode = "full" if fits else "layerwise"
    return model._sc_eval_mode


@torch.no_grad()
def layerwise_logits(model: nn.Module, cfg: dict, data, device, batch_size: int) -> Tensor:
    """Every node's logits (N, classes), one block at a time over batches of ``batch_size``
    targets with their whole neighbourhoods: equal to the full-batch forward, holding one
    layer's activations for all nodes. Restrictions (full degrees) are cached on the model."""
    if getattr(model, "_sc_layerwise", None) is None:
        model._sc_layerwise = (restrictions(model, cfg, data, "full"),
                               NeighborSampler(data.edge_index, data.num_nodes))
    restr, sampler = model._sc_layerwise
    dtype = next(model.parameters()).dtype
    n = data.num_nodes
    x = (torch.zeros(n, 0) if data.x is None else data.x).to(device=device, dtype=dtype)
    h = x.unsqueeze(0)
    for blk, r in zip(model.blocks, restr):
        if r is None:
            h = blk(h)
            continue
        out = None
        for ids in torch.arange(n).split(batch_size):
            s = sampler.sample(ids, [-1] * r.hops)
            item = r.restrict(s, 0).to(device)
            y = block_forward(blk, h[:, s.node_ids.to(device)], item, r, s.node_ids)
            if out is None:
                out = y.new_empty((1, n, y.shape[2]))
            out[:, ids.to(device)] = y
        h = out
    if model.classifier is not None:
        h = model.classifier(h)
    return h[0]

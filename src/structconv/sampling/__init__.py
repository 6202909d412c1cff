"""Graphs beyond full batch: neighbour sampling, restricted bases, mini-batch loaders.

A sampled mini-batch is a *restriction* of a graph basis: its rows limited to the sampled input
nodes, its columns to the targets, one bipartite basis per layer. ``sampler`` draws nested
neighbourhoods over a CSR index (uniform or weighted, without replacement, reproducible);
``restrict`` builds the restricted bases (full-graph normalisation, multi-hop polynomials,
relational sorts; edge blocks for graph attention); ``loader`` yields mini-batches (with
``torch.utils.data`` workers) and runs exact layer-wise inference. ``typed`` and
``typed_loader`` do the same on typed graphs: a fanout per relation and hop, one block of
per-relation edges per hop, mini-batches that typed layers consume unchanged.
"""

from .loader import (
    MiniBatch,
    NeighborLoader,
    apply_layer,
    apply_layers,
    inference,
    restriction_for,
)
from .restrict import (
    KINDS,
    BlockRestriction,
    GraphRestriction,
    RestrictedChebyshev,
    RestrictedPower,
    RestrictedRelational,
)
from .sampler import Block, NeighborSampler, Sample, check_fanout, check_seeds
from .typed import (
    TypedBlock,
    TypedNeighborSampler,
    TypedSample,
    apply_typed_layers,
    typed_fanouts,
)
from .typed_loader import TypedMiniBatch, TypedNeighborLoader

__all__ = ["NeighborSampler", "Sample", "Block", "check_fanout", "check_seeds",
           "GraphRestriction", "BlockRestriction", "RestrictedPower", "RestrictedChebyshev",
           "RestrictedRelational", "KINDS", "NeighborLoader", "MiniBatch", "inference",
           "restriction_for", "apply_layer", "apply_layers", "TypedNeighborSampler",
           "TypedSample", "TypedBlock", "typed_fanouts", "apply_typed_layers",
           "TypedNeighborLoader", "TypedMiniBatch"]

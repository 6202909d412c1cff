"""Attention as content-based convolution: mechanisms, masks, and attention bases.

An attention convolution's basis is computed from auxiliary inputs, A_k = a(x', y'; Ξ_k)
(paper section "Attention as content-based convolution"); the bases here plug into
``sc.convolve`` like any other, and dispatch to SDPA or to per-edge sparse kernels.
"""

from . import positions
from .basis import (
    AttentionBasis,
    CausalShift,
    DotProductAttention,
    GraphAttention,
    GraphStructure,
    shift_basis,
)
from .biaffine import biaffine
from .masks import (
    causal_mask,
    dead_columns,
    edge_softmax,
    from_torch_mask,
    graph_mask,
    log_mask,
    masked_softmax,
    padding_mask,
    softmax_inputs,
    softmax_outputs,
)
from .mechanisms import (
    Biaffine,
    DotProduct,
    GATScores,
    GraphMasked,
    LeakyReLU,
    Masked,
    Mechanism,
    Softmax,
    attention_basis,
)

__all__ = [
    "biaffine", "Mechanism", "Biaffine", "DotProduct", "GATScores", "Masked", "GraphMasked",
    "LeakyReLU", "Softmax", "attention_basis", "AttentionBasis", "DotProductAttention",
    "GraphAttention", "GraphStructure", "shift_basis", "log_mask", "causal_mask", "padding_mask",
    "graph_mask", "from_torch_mask", "masked_softmax", "softmax_inputs", "softmax_outputs",
    "edge_softmax", "dead_columns", "CausalShift", "positions",
]

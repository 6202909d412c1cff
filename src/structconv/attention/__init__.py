"""Attention as content-based convolution: mechanisms, their algebra, masks, attention bases.

An attention convolution's basis is computed from auxiliary inputs, A_k = a(x', y'; Ξ_k)
(paper section "Attention as content-based convolution"). Mechanisms add term-wise
(``DotProduct(...) + RelativeBias(K)``, ``GATScores(K, C) + EdgeTerm(K, D)``), densely (K, M, N)
and on a graph's edges (E, K); masks, LeakyReLU and softmax are transforms over any sum.
``attention_basis`` turns a mechanism into a basis that plugs into ``sc.convolve`` like any
other, dispatched to SDPA or to per-edge sparse kernels.
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
from .build import attention_basis
from .clip import TanhClip, tanh_clip
from .edges import EdgeDot, EdgeTerm, GATv2Scores, add_self_loops, self_loop_attr
from .index import ALiBi, IndexTerm, PeriodicBias, RelativeBias, index_bias
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
    HeadDot,
    LeakyReLU,
    Masked,
    Mechanism,
    PerHead,
    Softmax,
    Sum,
)

__all__ = [
    "biaffine", "Mechanism", "Sum", "Biaffine", "DotProduct", "PerHead", "GATScores", "HeadDot",
    "GATv2Scores", "EdgeTerm", "EdgeDot", "IndexTerm", "RelativeBias", "PeriodicBias", "ALiBi",
    "index_bias", "Masked", "GraphMasked", "LeakyReLU", "Softmax", "attention_basis",
    "add_self_loops", "self_loop_attr", "AttentionBasis", "DotProductAttention",
    "GraphAttention", "GraphStructure", "shift_basis", "log_mask", "causal_mask",
    "padding_mask", "graph_mask", "from_torch_mask", "masked_softmax", "softmax_inputs",
    "softmax_outputs", "edge_softmax", "dead_columns", "CausalShift", "positions",
    "TanhClip", "tanh_clip",
]

"""``attention_basis``: a mechanism and its inputs -> the basis A_k = a(x1, x2; Ξ_k) on its
fastest path (per edge, SDPA, or dense).

Every attention convolution goes through it: the graph-attention layers (GAT, GATv2,
TransformerConv, the declared configs), the Transformer layers and any hand-written mechanism.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from .basis import AttentionBasis, DotProductAttention, GraphAttention, GraphStructure
from .index import IndexTerm, index_bias
from .masks import edge_softmax
from .mechanisms import DotProduct, GraphMasked, Masked, Mechanism, Softmax, Sum, chain

__all__ = ["attention_basis"]


def _dropout(p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"attention_basis: dropout must be a probability in [0, 1), got {p!r}")
    return float(p)


def _graph_basis(mech: Softmax, edge_index: Tensor, x1, x2, edge_attr, p: float,
                 structure: GraphStructure | None) -> GraphAttention:
    """Edge scores -> the chain's transforms -> edge softmax -> dropout, on the graph's edges."""
    M, N = mech.entries(x1), mech.entries(x2)
    if structure is None:
        # built (and its node ids checked) before any score is gathered by them
        structure = GraphStructure(edge_index, M, N, mech.K)
    s = mech.inner.edge_scores(x1, x2, edge_index, edge_attr)  # (E, K) or (B, E, K)
    if mech.over == "inputs":
        probs = edge_softmax(s, edge_index[1].long(), N)
    else:
        probs = edge_softmax(s, edge_index[0].long(), M)
    alpha = F.dropout(probs, p) if p > 0 else probs
    return GraphAttention(edge_index, alpha, M, N, structure=structure, probabilities=probs)


def _sdpa_parts(ch: list[Mechanism]):
    """(DotProduct, index terms, Masked transforms) when the chain is a softmax over inputs of
    masked (DotProduct + index terms), else None."""
    if not isinstance(ch[0], Softmax) or ch[0].over != "inputs" or \
            not all(isinstance(t, Masked) for t in ch[1:-1]):
        return None
    base = ch[-1]
    terms = list(base.parts) if isinstance(base, Sum) else [base]
    dots = [t for t in terms if isinstance(t, DotProduct)]
    index = [t for t in terms if isinstance(t, IndexTerm)]
    if len(dots) != 1 or len(dots) + len(index) != len(terms):
        return None
    return dots[0], index, ch[1:-1]


def _sdpa_basis(dot: DotProduct, index: list[IndexTerm], masked: list[Masked], x1, x2,
                p: float) -> DotProductAttention:
    q, k = dot.project(x1, x2)  # (B, K, N, D), (B, K, M, D)
    M, N = k.shape[2], q.shape[2]
    causal = any(t.causal for t in masked)
    mask = None
    if index:
        # the position scores as SDPA's additive mask (1, K, N, M), in q's dtype; the causal
        # mask folds into their table (-inf at negative offsets), so no pass of its own
        mask = index_bias(index, M, N, dtype=q.dtype, device=q.device, causal=causal)[None]
        causal = False
    user = [t.mask for t in masked if t.mask is not None]
    for m in user:
        mt = m.to(q.dtype).transpose(-1, -2)  # paper (.., M, N) -> SDPA (.., N, M)
        mask = mt if mask is None else mask + mt
    # finite position scores, causal or not, leave every output an input: only a user mask
    # can empty a column
    return DotProductAttention(q, k, sdpa_mask=mask, causal=causal, scale=dot.scale,
                               dropout_p=p, check_dead=bool(user))


def attention_basis(mechanism: Mechanism, x1, x2, *, edge_attr: Tensor | None = None,
                    dropout: float = 0.0, structure: GraphStructure | None = None):
    """The basis A_k = mechanism(x1, x2; Ξ_k) on its fastest path.

    * a softmax over a graph-masked mechanism (one ``GraphMasked`` in its chain) ->
      ``GraphAttention``: the mechanism's edge scores (with ``edge_attr`` (E, D), the features
      of the graph's edges), its transforms, the softmax over each node's edges and
      ``dropout`` on the weights, all in O(E); ``structure`` (a ``GraphStructure`` of that
      graph and K, built once) saves rebuilding the sparse layout on every call;
    * a softmax over inputs of (masked, causal) ``DotProduct`` + index terms ->
      ``DotProductAttention`` (SDPA's fused kernel, ``dropout`` as its dropout_p), the index
      terms' scores (and the causal mask) as its additive float mask (1, K, N, M), built in
      the compute dtype;
    * anything else -> a dense ``AttentionBasis`` of ``mechanism(x1, x2, edge_attr)`` (a dense
      (M, N, D) ``edge_attr``), ``dropout`` applied to the weights.

    ``dropout`` is applied as given (pass 0 in eval mode). For self-attention pass x as both
    inputs; per-head mechanisms (GAT's) take the projected h = xΘ_k (M, K, C).
    """
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"attention_basis needs a Mechanism, got {type(mechanism).__name__}")
    p = _dropout(dropout)
    if structure is not None and not isinstance(structure, GraphStructure):
        raise TypeError(f"attention_basis: structure must be a GraphStructure (or None), got "
                        f"{type(structure).__name__}")
    ch = chain(mechanism)
    graphs = [t for t in ch if isinstance(t, GraphMasked)]
    if isinstance(mechanism, Softmax) and len(graphs) == 1:
        return _graph_basis(mechanism, graphs[0].edge_index, x1, x2, edge_attr, p, structure)
    parts = _sdpa_parts(ch)
    if parts is not None and edge_attr is None:
        return _sdpa_basis(*parts, x1, x2, p)
    A = mechanism(x1, x2, edge_attr)
    return AttentionBasis(F.dropout(A, p) if p > 0 else A)

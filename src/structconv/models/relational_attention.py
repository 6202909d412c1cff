"""Relation-aware graph attention: RGAT (Busbridge et al. 2019) as an attention convolution.

RGAT has one basis matrix per relation, y = Σ_r A_rᵀ x Θ_r (paper eq. "attention"): A_r holds
the weights of relation r's edges, computed by GAT's mechanism on that relation's projections
h_r = x Θ_r, a_r(m, n) = LeakyReLU(μ·h_r[m] + ν·h_r[n]), softmaxed over each target's incoming
edges of relation r (``attention="within"``: WIRGAT) or of every relation (``"across"``: ARGAT).
Θ is either full or the paper's controlled separability over the relations' bases
(``sc.params.ControlledSeparable``: Θ_r = Σ_b c_rb V_b, R-GCN's basis decomposition).

The R basis matrices stacked vertically are one sparse matrix over *relation-expanded* inputs,
the (relation, node) pairs (r, m) with content h_r[m]: an edge m -> n of relation r is the edge
(r, m) -> n. Only the pairs some edge touches are kept (a few times E, not R·M). Both variants
are then ``sc.attention`` bases through the one ``attention_basis`` path:

* WIRGAT is plain GAT (``GATScores``) on the graph of pairs (r, m) -> (r, n), whose targets are
  the groups its softmax normalises over; its weights are applied on (r, m) -> n, which sums
  the relations in the same sparse product;
* ARGAT scores the edges (r, m) -> n with ``RelationGATScores``, GAT's mechanism whose target
  side is given per edge (the target's projection under the edge's relation, h_r[n]), and
  softmaxes over all of n's edges.

``RGATConv`` equals PyG's ``RGATConv`` (additive attention, ``dim=1``, ``mod=None``, no edge
features) when PyG's query and key kernels are per head (block-diagonal): PyG's ``q``/``k`` are
ν/μ here. ``RGAT`` is the two-layer entity classifier of the study (featureless first layer, a
self relation for each node's own state, as the authors' RDF setup).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import attention as att
from .._checks import check_index_tensor
from ..attention.mechanisms import edges, heads
from ..basis.edges import check_edge_type
from ..nn.graph_attention import gat_mechanism
from ..params import ControlledSeparable, Full, glorot_

__all__ = ["RelationGATScores", "RelationalGraph", "RGATConv", "RGAT", "ATTENTIONS"]

ATTENTIONS = ("within", "across")
"""How an RGAT layer normalises its weights: within each relation (WIRGAT) or across them."""


class RelationGATScores(att.PerHead):
    """GAT's scores with the target side given per edge: score_k(e) = μ_k·h1[m, k] +
    ν_k·t[e, k] for an edge e = m -> n, t the targets' per-head projections as edge features.

    In RGAT t[e] is the target's projection under the edge's relation, h_r[n], so that edges
    of several relations into one node can share one softmax (ARGAT). Inputs h1 (M, K, C) (a
    leading batch dim allowed), x2 the number N of targets; ``edge_attr`` t (E, K, C) on edges,
    (M, N, K, C) densely (either with a leading batch dim). ``mu`` / ``nu`` (K, C) may be given
    (then used as they are).
    """

    def __init__(self, K: int, C: int, *, mu: Tensor | None = None, nu: Tensor | None = None):
        super().__init__()
        self.K, self.C = K, C
        # given weights belong to the caller (a layer resets its own)
        self._own = [n for n, w in (("mu", mu), ("nu", nu)) if w is None]
        self.mu = nn.Parameter(torch.empty(K, C)) if mu is None else mu
        self.nu = nn.Parameter(torch.empty(K, C)) if nu is None else nu
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """μ, ν (those not given) ~ Glorot over (K, C)."""
        for n in self._own:
            glorot_(getattr(self, n))

    def extra_repr(self):
        return f"K={self.K}, C={self.C}"

    def _dot(self, h: Tensor, w: Tensor) -> Tensor:
        return torch.linalg.vecdot(h, w.reshape(self.K, self.C).to(h.dtype))

    def _targets(self, t, lead: tuple[int, ...]) -> Tensor:
        if not isinstance(t, Tensor) or t.dim() not in (len(lead) + 2, len(lead) + 3) or \
                tuple(t.shape[-2 - len(lead):]) != (*lead, self.K, self.C):
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"RelationGATScores reads the targets' projections as edge_attr "
                             f"{(*lead, self.K, self.C)} (or with a leading batch dim), "
                             f"got {got}")
        return t

    def forward(self, h1, h2, edge_attr=None):
        heads(h1, self.K, self.C, "h1", "RelationGATScores")
        M, N = h1.shape[-3], self.entries(h2)
        t = self._targets(edge_attr, (M, N))
        s1 = self._dot(h1, self.mu).transpose(-1, -2).unsqueeze(-1)  # (.., K, M, 1)
        return s1 + self._dot(t, self.nu).movedim(-1, -3)  # + (.., K, M, N)

    def edge_scores(self, h1, h2, edge_index, edge_attr=None):
        heads(h1, self.K, self.C, "h1", "RelationGATScores")
        src, _ = edges(edge_index)
        t = self._targets(edge_attr, (src.shape[0],))
        return self._dot(h1, self.mu).index_select(-2, src) + self._dot(t, self.nu)


class RelationalGraph:
    """A relational graph's edges between relation-expanded entries, built once per graph.

    The pairs (r, m) that some edge m -> n of relation r touches (as (r, m) or (r, n)), U of
    them: ``relation``, ``node`` (U,) each pair's; ``within`` (2, E) the edges as pair -> pair,
    ``across`` (2, E) as pair -> target node, ``target_pairs`` (E,) each edge's (r, n);
    ``structure`` the sparse layout of ``across`` (U inputs, N targets, K heads).
    """

    def __init__(self, edge_index: Tensor, edge_type: Tensor, M: int, N: int, K: int):
        src, dst, r = edge_index[0].long(), edge_index[1].long(), edge_type.long()
        E = src.shape[0]
        pairs, inv = torch.unique(torch.cat([r * M + src, r * M + dst]), return_inverse=True)
        self.relation = torch.div(pairs, M, rounding_mode="floor")
        self.node = pairs - self.relation * M
        self.num_pairs = int(pairs.shape[0])
        self.target_pairs = inv[E:]
        self.within = torch.stack([inv[:E], inv[E:]])
        self.across = torch.stack([inv[:E], dst])
        self.structure = att.GraphStructure(self.across, self.num_pairs, N, K)


class RGATConv(nn.Module):
    """Relational graph attention as an attention convolution with one basis per relation.

    ``forward(x, edge_index, edge_type, num_targets=None)``: x (M, P) node features, or None
    for featureless nodes (one-hot inputs: x·Θ_r is Θ_r, M = ``in_channels``); edge_index
    (2, E) [source; target] with edge_type (E,) in [0, R); the first ``num_targets`` (default
    M) nodes are the targets. Returns (N, heads·C) (``concat``) or the heads' mean (N, C), plus
    ``bias``. ``num_bases`` gives Θ (R, P, heads·C) controlled separability over the R relation
    bases (Θ_r = Σ_b c_rb V_b), else a full Θ. Attention dropout ``dropout`` in training; a node
    without incoming edges gets the bias alone (PyG's convention).
    """

    def __init__(self, in_channels: int, out_channels: int, num_relations: int, *,
                 heads: int = 1, concat: bool = True, num_bases: int | None = None,
                 attention: str = "within", negative_slope: float = 0.2, dropout: float = 0.0,
                 bias: bool = True):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"RGATConv: attention must be one of {ATTENTIONS}, got "
                             f"{attention!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"RGATConv: dropout must be in [0, 1), got {dropout!r}")
        R, H, C = num_relations, heads, out_channels
        self.in_channels, self.out_channels, self.num_relations = in_channels, C, R
        self.heads, self.concat, self.attention = H, bool(concat), attention
        self.negative_slope, self.dropout = float(negative_slope), float(dropout)
        self.num_bases = num_bases
        self.param = Full(R, in_channels, H * C) if num_bases is None else \
            ControlledSeparable(R, in_channels, H * C, num_bases)
        # μ (source side, PyG's k) and ν (target side, PyG's q), per head
        self.att_src = nn.Parameter(torch.empty(H, C))
        self.att_dst = nn.Parameter(torch.empty(H, C))
        self.bias = nn.Parameter(torch.empty(H * C if concat else C)) if bias else None
        self._cache = None
        self._init()

    def _init(self) -> None:
        """PyG's: Glorot weights (both factors of a basis decomposition), Glorot attention
        vectors with PyG's fans, a zero bias (after the form's own draw)."""
        H, C = self.heads, self.out_channels
        for w in ([self.param.weight] if self.num_bases is None else
                  [self.param.channel, self.param.basis_coef]):
            glorot_(w)
        glorot_(self.att_src, H * C, H)
        glorot_(self.att_dst, H * C, H)
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does: the form's own draw, then PyG's
        Glorot weights and attention vectors and a zero bias."""
        self.param.reset_parameters()
        self._init()

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}, "
                f"heads={self.heads}, num_bases={self.num_bases}, attention={self.attention!r}")

    def mechanism(self, edge_index: Tensor) -> att.Softmax:
        """The layer's mechanism on a graph of relation-expanded entries (the paper's view):
        GAT's scores on pairs -> pairs (WIRGAT) or ``RelationGATScores`` on pairs -> nodes
        (ARGAT), LeakyReLU, the softmax over each target's edges."""
        H, C = self.heads, self.out_channels
        scores = att.GATScores(H, C, mu=self.att_src, nu=self.att_dst) \
            if self.attention == "within" else \
            RelationGATScores(H, C, mu=self.att_src, nu=self.att_dst)
        return gat_mechanism(scores, edge_index, self.negative_slope)

    def _graph(self, edge_index: Tensor, edge_type: Tensor, M: int, N: int) -> RelationalGraph:
        check_index_tensor(edge_index, 2, "RGATConv edge_index")
        E, R = edge_index.shape[1], self.num_relations
        check_edge_type(edge_type, E)
        if E and (int(edge_type.max()) >= R or int(edge_index.min()) < 0 or
                  int(edge_index[0].max()) >= M or int(edge_index[1].max()) >= N):
            raise ValueError(f"RGATConv: edge types must lie in [0, {R}) and edges in "
                             f"[0, {M}) -> [0, {N}), got types up to {int(edge_type.max())} "
                             f"and edges {int(edge_index[0].min())}..{int(edge_index[0].max())}"
                             f" -> {int(edge_index[1].min())}..{int(edge_index[1].max())}")
        key = (edge_index.shape, edge_index.device, M, N)
        c = self._cache
        # checked against the content: one O(E) comparison against the build
        if c is not None and c[0] == key and torch.equal(c[1], edge_index) and \
                torch.equal(c[2], edge_type):
            return c[3]
        g = RelationalGraph(edge_index, edge_type, M, N, self.heads)
        self._cache = (key, edge_index.clone(), edge_type.clone(), g)
        return g

    def _pairs(self, x: Tensor | None, g: RelationalGraph) -> Tensor:
        """The relation-expanded inputs h_r[m] of the graph's pairs, (U, heads, C)."""
        theta = self.param()  # (R, P, H·C)
        if x is None:  # one-hot inputs: x·Θ_r is Θ_r, read at the pairs' rows
            z = theta[g.relation, g.node]
        else:
            if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != self.in_channels:
                got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"RGATConv expects x (M, {self.in_channels}) or None "
                                 f"(featureless), got {got}")
            R, P, Q = theta.shape
            # every relation's projection in one GEMM, then the pairs' rows
            z = (x @ theta.to(x.dtype).permute(1, 0, 2).reshape(P, R * Q)).view(-1, R, Q)
            z = z[g.node, g.relation]
        return z.view(-1, self.heads, self.out_channels)

    def forward(self, x: Tensor | None, edge_index: Tensor, edge_type: Tensor,
                num_targets: int | None = None) -> Tensor:
        H, C = self.heads, self.out_channels
        M = self.in_channels if x is None else x.shape[0]
        N = M if num_targets is None else int(num_targets)
        g = self._graph(edge_index, edge_type, M, N)
        if g.num_pairs == 0:  # no edges: every node gets the bias alone
            like = self.att_src if x is None else x
            out = like.new_zeros(N, H * C if self.concat else C)
            return out if self.bias is None else out + self.bias
        h = self._pairs(x, g)
        p = self.dropout if self.training else 0.0
        if self.attention == "within":
            scored = att.attention_basis(self.mechanism(g.within), h, h, dropout=p)
        else:
            scored = att.attention_basis(self.mechanism(g.across), h, N, dropout=p,
                                         edge_attr=h.index_select(0, g.target_pairs))
        # the same weights on the edges (r, m) -> n: the product sums the relations
        basis = att.GraphAttention(g.across, scored.alpha, g.num_pairs, N, structure=g.structure,
                                   probabilities=scored.probabilities)
        out = basis.propagate_heads(h.unsqueeze(0))[0]  # (N, H, C)
        out = out.reshape(N, H * C) if self.concat else out.mean(1)
        return out if self.bias is None else out + self.bias


class RGAT(nn.Module):
    """Two RGAT layers for entity classification on a fixed relational graph: (N, classes).

    Featureless nodes (the first layer's x·Θ_r is Θ_r, as R-GCN's); with ``self_relation`` a
    relation R of self loops is added (the authors' RDF setup: a node attends to its own state
    as one more relation). ``heads`` in the first layer (concatenated), one in the second;
    ReLU between; ``num_bases`` bases in both layers (None: full Θ).
    """

    def __init__(self, edge_index: Tensor, edge_type: Tensor, num_nodes: int,
                 num_relations: int, hidden: int, out_channels: int, *, heads: int = 1,
                 num_bases: int | None = None, attention: str = "within",
                 self_relation: bool = True, dropout: float = 0.0):
        super().__init__()
        check_index_tensor(edge_index, 2, "edge_index")
        ei, et, R = edge_index.long(), edge_type.long(), num_relations
        if self_relation:
            loop = torch.arange(num_nodes, device=ei.device)
            ei = torch.cat([ei, torch.stack([loop, loop])], 1)
            et = torch.cat([et, torch.full_like(loop, R)])
            R += 1
        self.register_buffer("edge_index", ei, persistent=False)
        self.register_buffer("edge_type", et, persistent=False)
        self.num_nodes = num_nodes
        kw = dict(num_bases=num_bases, attention=attention, dropout=dropout)
        self.conv1 = RGATConv(num_nodes, hidden, R, heads=heads, **kw)
        self.conv2 = RGATConv(heads * hidden, out_channels, R, **kw)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        self.conv1.reset_parameters()
        self.conv2.reset_parameters()

    def forward(self, x: Tensor | None = None) -> Tensor:
        """Logits (N, classes); ``x`` is ignored (the nodes are featureless: a featureless
        dataset's (N, 0) input may be given)."""
        h = F.relu(self.conv1(None, self.edge_index, self.edge_type))
        return self.conv2(h, self.edge_index, self.edge_type)

    def first_layer_parameters(self):
        return list(self.conv1.parameters())

"""HAN (Wang et al., WWW 2019) with PyG's signature: attention over metapath bases.

Each edge type of ``metadata`` is usually a metapath's relation (``sc.basis.metapath_edges``
gives its edges: the pattern of the product of the relations' rectangular bases). Per node type
the features are projected (x W_t + b_t, H heads of D channels); per edge type, GAT's mechanism
(``GATScores`` with the edge type's own attention vectors, LeakyReLU, a softmax over each
target's edges, ``GraphAttention``) gives one convolution, then ReLU: a content-weighted basis
per metapath. The metapaths ending at a type are then mixed by *semantic* attention, a
content-based weighting of the sort bases: β_Φ = softmax_Φ(mean_n q · tanh(W z_n^Φ + b)),
y = Σ_Φ β_Φ z^Φ. As PyG's ``HANConv``, except that a node type no edge type reaches is absent
from the output (PyG gives None).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.basis import GraphAttention
from ..attention.masks import edge_softmax
from ..attention.mechanisms import GATScores
from .convert import register_pyg
from .typed import check_metadata, known_relations

__all__ = ["HANConv", "semantic_attention"]


def semantic_attention(zs: list[Tensor], q: Tensor, lin: nn.Linear) -> tuple[Tensor, Tensor]:
    """(Σ_Φ β_Φ z^Φ (N, Q), β (Φ, H...)) of the metapath outputs zs [(N, Q)], β =
    softmax over Φ of mean_n q · tanh(lin(z_n^Φ))."""
    out = torch.stack(zs)
    if out.numel() == 0:
        return out.view(0, out.size(-1)), None
    score = (q * torch.tanh(lin(out)).mean(1)).sum(-1)
    beta = F.softmax(score, dim=0)
    return torch.sum(beta.view(len(zs), 1, -1) * out, dim=0), beta


class HANConv(nn.Module):
    """PyG's HANConv: x_dict {type: (n_t, P_t)}, edge_index_dict {(s, Φ, d): (2, E)} ->
    {d: (n_d, Q)} for every type some edge type reaches."""

    def __init__(self, in_channels, out_channels: int, metadata, heads: int = 1,
                 negative_slope: float = 0.2, dropout: float = 0.0):
        super().__init__()
        self.node_types, self.edge_types = check_metadata(metadata)
        if isinstance(out_channels, bool) or not isinstance(out_channels, int) or \
                out_channels < 1 or not isinstance(heads, int) or heads < 1 or \
                out_channels % heads:
            raise ValueError(f"HANConv: out_channels ({out_channels!r}) must be a positive int "
                             f"divisible by heads ({heads!r})")
        if not isinstance(in_channels, dict):
            in_channels = {t: in_channels for t in self.node_types}
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.negative_slope, self.dropout = float(negative_slope), float(dropout)
        D = out_channels // heads
        self.proj = nn.ModuleDict({t: nn.Linear(in_channels[t], out_channels)
                                   for t in self.node_types})
        self.att_src = nn.Parameter(torch.empty(len(self.edge_types), heads, D))
        self.att_dst = nn.Parameter(torch.empty(len(self.edge_types), heads, D))
        self.k_lin = nn.Linear(out_channels, out_channels)
        self.q = nn.Parameter(torch.empty(1, out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.Linear's defaults for the maps, Glorot for the attention vectors."""
        for lin in [*self.proj.values(), self.k_lin]:
            lin.reset_parameters()
        with torch.no_grad():
            for p, (a, b) in ((self.att_src, self.att_src.shape[1:]),
                              (self.att_dst, self.att_dst.shape[1:]), (self.q, self.q.shape)):
                s = math.sqrt(6.0 / (a + b))  # PyG's glorot on the last two dims
                p.uniform_(-s, s)

    def extra_repr(self) -> str:
        return f"{self.out_channels}, heads={self.heads}, relations={len(self.edge_types)}"

    def _relation(self, r: int, h_src: Tensor, h_dst: Tensor, ei: Tensor) -> Tensor:
        """One metapath's GAT convolution (N_dst, Q), through the attention algebra."""
        H, D = self.heads, self.out_channels // self.heads
        mech = GATScores(H, D, mu=self.att_src[r], nu=self.att_dst[r])
        s = F.leaky_relu(mech.edge_scores(h_src, h_dst, ei), self.negative_slope)
        alpha = edge_softmax(s, ei[1].long(), h_dst.shape[0])
        alpha = F.dropout(alpha, self.dropout, self.training)
        if ei.shape[1] == 0 or h_src.shape[0] == 0:
            return h_dst.new_zeros(h_dst.shape[0], H * D)
        out = GraphAttention(ei, alpha, h_src.shape[0], h_dst.shape[0]).propagate_heads(
            h_src.unsqueeze(0))[0]
        return F.relu(out.reshape(-1, H * D))

    def forward(self, x_dict: dict, edge_index_dict: dict,
                return_semantic_attention_weights: bool = False):
        """{type: (n_t, P_t)}, {(s, Φ, d): (2, E)} -> {d: (n_d, Q)} (and {d: β} if asked)."""
        H, D = self.heads, self.out_channels // self.heads
        h = {t: self.proj[t](x).view(-1, H, D) for t, x in x_dict.items() if t in self.proj}
        outs: dict[str, list[Tensor]] = {}
        for r, (s, _, d), ei in known_relations("HANConv", edge_index_dict, self.edge_types, h):
            outs.setdefault(d, []).append(self._relation(r, h[s], h[d], ei.long()))
        res, betas = {}, {}
        for t, zs in outs.items():
            res[t], betas[t] = semantic_attention(zs, self.q, self.k_lin)
        return (res, betas) if return_semantic_attention_weights else res


@register_pyg("HANConv")
def _from_han(m):
    meta = (list(m.metadata[0]), [tuple(e) for e in m.metadata[1]])
    if any(isinstance(m.proj[t].weight, nn.parameter.UninitializedParameter) for t in meta[0]):
        raise ValueError("HANConv has lazy (uninitialised) weights: run it once or give "
                         "in_channels before converting")
    widths = {t: int(m.proj[t].weight.shape[1]) for t in meta[0]}  # lazy -1 resolved
    out = HANConv(widths, m.out_channels, meta, heads=m.heads,
                  negative_slope=m.negative_slope, dropout=m.dropout)
    out = out.to(device=m.q.device, dtype=m.q.dtype).train(m.training)
    with torch.no_grad():
        for t in out.node_types:
            out.proj[t].weight.copy_(m.proj[t].weight)
            out.proj[t].bias.copy_(m.proj[t].bias)
        for r, et in enumerate(out.edge_types):
            out.att_src[r].copy_(m.lin_src["__".join(et)][0])
            out.att_dst[r].copy_(m.lin_dst["__".join(et)][0])
        out.k_lin.load_state_dict(m.k_lin.state_dict())
        out.q.copy_(m.q)
    return out

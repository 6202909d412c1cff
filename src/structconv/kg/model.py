"""Link-prediction models and their training: entity vectors, a decoder, and two losses.

``LinkPredictor`` scores (head, relation, tail) as ``decoder(e_h, r, e_t)`` from entity vectors
``e`` (an embedding table, optionally refined by R-GCN layers over the training graph). Training
follows either the modern 1-vs-all setting (every entity is a candidate tail of each training
query, cross-entropy with label smoothing; Ruffinelli et al. 2020) or R-GCN's negative sampling
(binary cross-entropy on each positive and ``negatives`` corrupted triples).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import nn as scnn
from .decoders import DECODERS
from .evaluate import evaluate

__all__ = ["LinkPredictor", "link_metrics", "inverse_graph", "score_triples",
           "corrupt_triples"]


def inverse_graph(train: Tensor, num_relations: int) -> tuple[Tensor, Tensor]:
    """The training graph with inverse edges: ``edge_index`` (2, 2T) and ``edge_type`` (2T,),
    relation ``r + R`` for the reversed edge of ``r`` (the encoder's view; valid and test
    triples never enter it)."""
    # the unique triples, in their first order (edge dropout draws a mask per edge in this
    # order): a duplicated line must not double an edge's weight
    _, inverse = torch.unique(train, dim=0, return_inverse=True)
    n = int(inverse.max()) + 1 if inverse.numel() else 0
    if n < train.shape[0]:
        first = torch.full((n,), train.shape[0], dtype=torch.long).scatter_reduce(
            0, inverse, torch.arange(train.shape[0]), "amin")
        train = train[first.sort().values]
    h, r, t = train[:, 0], train[:, 1], train[:, 2]
    return (torch.stack([torch.cat([h, t]), torch.cat([t, h])]),
            torch.cat([r, r + num_relations]))


class LinkPredictor(nn.Module):
    """Entity vectors (E, dim) + a decoder (``"distmult"`` or ``"complex"``).

    ``encoder_layers`` > 0 refines the embedding table by that many ``sc.nn.RGCNConv`` layers
    over ``graph`` (the training triples with inverses, see ``inverse_graph``), with
    block-diagonal weights of ``block`` x ``block`` (R-GCN's link-prediction setting) and
    optional ``sorts`` over the 2R edge types; ``edge_dropout`` drops that fraction of edges at
    each training step (and ``self_dropout`` of the self-connections), as in the R-GCN paper.
    """

    def __init__(self, num_entities: int, num_relations: int, dim: int = 200,
                 decoder: str = "distmult", *, reciprocal: bool = True, init_std: float = 1e-3,
                 encoder_layers: int = 0, graph: tuple[Tensor, Tensor] | None = None,
                 block: int = 5, sorts=None, relations=None, edge_dropout: float = 0.4,
                 self_dropout: float = 0.2, dropout: float = 0.0):
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}: choose one of {sorted(DECODERS)}")
        for name, v in (("num_entities", num_entities), ("num_relations", num_relations)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"LinkPredictor: {name} must be an int >= 1, got {v!r}")
        self.num_entities, self.num_relations, self.dim = num_entities, num_relations, dim
        self.entity = nn.Parameter(torch.randn(num_entities, dim) * init_std)
        self.decoder = DECODERS[decoder](num_relations, dim, reciprocal, init_std)
        self.edge_dropout, self.self_dropout = edge_dropout, self_dropout
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList()
        if encoder_layers:
            if graph is None:
                raise ValueError("LinkPredictor: an R-GCN encoder needs graph=(edge_index, "
                                 "edge_type) of the training triples (see inverse_graph)")
            if dim % block:
                raise ValueError(f"LinkPredictor: block={block} must divide dim={dim}")
            self.register_buffer("edge_index", graph[0], persistent=False)
            self.register_buffer("edge_type", graph[1], persistent=False)
            for _ in range(encoder_layers):
                self.layers.append(scnn.RGCNConv(dim, dim, 2 * num_relations,
                                                 num_blocks=dim // block, root_weight=False,
                                                 cached=False, sorts=sorts,
                                                 relations=relations))
            self.roots = nn.ParameterList(
                nn.Parameter(torch.randn(dim, dim) / math.sqrt(dim)) for _ in self.layers)

    def entities(self) -> Tensor:
        """(E, dim) entity vectors: the table, through the encoder where there is one."""
        x = self.entity
        if not self.layers:
            return self.dropout(x)
        ei, et = self.edge_index, self.edge_type
        if self.training and self.edge_dropout:
            keep = torch.rand(et.numel(), device=et.device) >= self.edge_dropout
            ei, et = ei[:, keep], et[keep]
        for i in range(len(self.layers)):
            x = self._layer(i, x, ei, et)
        return self.dropout(x)

    def _layer(self, i: int, x: Tensor, ei: Tensor, et: Tensor) -> Tensor:
        """Encoder layer ``i`` on (E, dim) ``x``: relation part + self part (dropped out in
        training), ReLU between layers."""
        self_part = x @ self.roots[i]
        if self.training and self.self_dropout:
            self_part = F.dropout(self_part, self.self_dropout)
        x = self.layers[i](x, ei, et) + self_part
        return torch.relu(x) if i < len(self.layers) - 1 else x

    @torch.no_grad()
    def sort_contributions(self, chunk: int = 32) -> Tensor:
        """(layers, K) Frobenius norm of each sort's term ``A_kᵀ x Θ_k`` in each encoder layer's
        output, on the whole training graph in eval mode (how much the model relies on each
        sort; unlike the size of ``Θ_k`` it accounts for how many nodes the sort reaches and
        for the features it carries). Sorts are taken ``chunk`` at a time: the per-sort
        outputs are (E, chunk, dim), never (E, K, dim)."""
        from ..basis.graph import relational

        if not self.layers:
            raise ValueError("LinkPredictor.sort_contributions needs an R-GCN encoder "
                             "(encoder_layers > 0)")
        was_training = self.training
        self.eval()
        R2, ei, et, x = 2 * self.num_relations, self.edge_index, self.edge_type, self.entity
        # every layer has the same sorts (see __init__): one basis per chunk serves them all
        sorts = self.layers[0].sorts or [(r,) for r in range(R2)]
        chunks = [(s, relational(ei, et, self.num_entities, sorts[s:s + chunk],
                                 normalization="mean", num_relations=R2, dtype=x.dtype))
                  for s in range(0, len(sorts), chunk)]
        out = []
        for i, layer in enumerate(self.layers):
            theta = layer.param()  # (K, P, Q)
            norms = []
            for s, b in chunks:
                z = torch.einsum("mp,kpq->mkq", x, theta[s:s + b.K]).unsqueeze(0)
                norms.append(b.propagate_heads(z)[0].norm(dim=(0, 2)))
            out.append(torch.cat(norms))
            x = self._layer(i, x, ei, et)
        self.train(was_training)
        return torch.stack(out)

    def score_tails(self, head: Tensor, rel: Tensor, entities: Tensor | None = None) -> Tensor:
        """(B, E) scores of every entity as the tail of (head, rel); ``rel + R`` = inverse."""
        e = self.entities() if entities is None else entities
        return self.decoder.score_all(e[head], rel, e)

    def forward(self, triples: Tensor, entities: Tensor | None = None) -> Tensor:
        """(T,) scores of (T, 3) triples."""
        e = self.entities() if entities is None else entities
        return score_triples(self.decoder, e, triples)


def score_triples(decoder: nn.Module, entities: Tensor, triples: Tensor) -> Tensor:
    """(T,) ``decoder`` scores of (T, 3) triples over (E, dim) entity vectors."""
    # heads and tails in one gather: its backward is one index_add (the two advanced-index
    # gathers it replaces cost 1.5x as much on 60,000 triples, backward included)
    ht = entities.index_select(0, torch.cat([triples[:, 0], triples[:, 2]]))
    head, tail = ht.chunk(2)
    return decoder(head, triples[:, 1], tail)


def corrupt_triples(triples: Tensor, num_entities: int, negatives: int,
                    gen: torch.Generator) -> Tensor:
    """(negatives T, 3) corruptions of (T, 3) triples: each copy's head or tail (a fair coin)
    replaced by a uniform entity (R-GCN's negative sampling)."""
    neg = triples.repeat(negatives, 1)
    # drawn on the CPU generator, whatever the device: the same negatives everywhere
    corrupt = torch.randint(0, num_entities, (neg.shape[0],), generator=gen).to(neg.device)
    side = (torch.rand(neg.shape[0], generator=gen) < 0.5).to(neg.device)
    neg[:, 0] = torch.where(side, corrupt, neg[:, 0])
    neg[:, 2] = torch.where(side, neg[:, 2], corrupt)
    return neg


def link_metrics(model: LinkPredictor, triples: Tensor, known: Tensor,
                 batch_size: int = 512) -> dict:
    """``sc.kg.evaluate`` of ``model`` (entity vectors computed once, eval mode)."""
    model.eval()
    with torch.no_grad():
        ent = model.entities()
        return evaluate(lambda h, r: model.score_tails(h, r, ent), triples, known,
                        model.num_entities, model.num_relations, batch_size=batch_size)

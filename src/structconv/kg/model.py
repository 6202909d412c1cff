"""Link-prediction models and their training: entity vectors, a decoder, and two losses.

``LinkPredictor`` scores (head, relation, tail) as ``decoder(e_h, r, e_t)`` from entity vectors
``e`` (an embedding table, optionally refined by R-GCN layers over the training graph). Training
follows either the modern 1-vs-all setting (every entity is a candidate tail of each training
query, cross-entropy with label smoothing; Ruffinelli et al. 2020) or R-GCN's negative sampling
(binary cross-entropy on each positive and ``negatives`` corrupted triples).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import nn as scnn
from ..checkpoint import CHECKPOINT_JSON, load_checkpoint, save_checkpoint, set_rng_state
from .decoders import DECODERS
from .evaluate import check_triples, evaluate

__all__ = ["LinkPredictor", "train_link", "link_metrics", "inverse_graph", "regularizer",
           "score_triples", "corrupt_triples"]


def inverse_graph(train: Tensor, num_relations: int) -> tuple[Tensor, Tensor]:
    """The training graph with inverse edges: ``edge_index`` (2, 2T) and ``edge_type`` (2T,),
    relation ``r + R`` for the reversed edge of ``r`` (the encoder's view; valid and test
    triples never enter it)."""
    # the unique triples: a duplicated line must not double an edge's weight
    train = torch.unique(train, dim=0)
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


def regularizer(kind: str | None, vectors: list[Tensor]) -> Tensor | float:
    """N3 (Σ|v|³, Lacroix et al. 2018) or L2 (Σ v²) of the vectors a batch used, per query."""
    if kind is None or kind == "none":
        return 0.0
    if kind == "n3":
        return sum(v.abs().pow(3).sum() for v in vectors) / vectors[0].shape[0]
    if kind == "l2":
        return sum(v.pow(2).sum() for v in vectors) / vectors[0].shape[0]
    raise ValueError(f"unknown regularizer {kind!r}: use 'n3', 'l2' or None")


def _batches(n: int, size: int, gen: torch.Generator):
    perm = torch.randperm(n, generator=gen)
    for i in range(0, n, size):
        yield perm[i:i + size]


def _batch_loss(model: LinkPredictor, q: Tensor, mode: str, label_smoothing: float,
                negatives: int, reg, reg_weight: float, gen: torch.Generator) -> Tensor:
    """The loss of one batch of (B, 3) training queries (see ``train_link``)."""
    ent = model.entities()
    r = q[:, 1]
    if mode == "1vsall":
        scores = model.decoder.score_all(ent[q[:, 0]], r, ent)
        loss = F.cross_entropy(scores, q[:, 2], label_smoothing=label_smoothing)
    else:
        n = q.shape[0]
        neg = corrupt_triples(q, model.num_entities, negatives, gen)
        s = score_triples(model.decoder, ent, torch.cat([q, neg]))
        y = torch.cat([torch.ones(n, dtype=s.dtype, device=s.device),
                       torch.zeros(neg.shape[0], dtype=s.dtype, device=s.device)])
        if label_smoothing:
            y = y * (1 - label_smoothing) + label_smoothing / 2
        loss = F.binary_cross_entropy_with_logits(s, y)
    if reg_weight and reg not in (None, "none"):
        h, t = ent[q[:, 0]], ent[q[:, 2]]
        loss = loss + reg_weight * regularizer(reg, [h, model.decoder.relation_vectors(r), t])
    return loss


def _optimizer(name: str, model: nn.Module, lr: float):
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    if name == "adagrad":
        return torch.optim.Adagrad(model.parameters(), lr=lr)
    raise ValueError(f"train_link: optimizer must be 'adam' or 'adagrad', got {name!r}")


def _resume(checkpoint_dir, model: nn.Module, opt) -> tuple[list[dict], int]:
    """(history, first epoch) of a run: restored from ``checkpoint_dir`` where it has one."""
    if checkpoint_dir is None or not (Path(checkpoint_dir) / CHECKPOINT_JSON).is_file():
        return [], 1
    ck = load_checkpoint(checkpoint_dir)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    set_rng_state(*ck["rng"])
    return list(ck["trainer"]["history"]), ck["epoch"] + 1


def train_link(model: LinkPredictor, train: Tensor, *, mode: str = "1vsall", epochs: int = 10,
               batch_size: int = 1000, lr: float = 1e-3, optimizer: str = "adam",
               label_smoothing: float = 0.0, reg: str | None = None, reg_weight: float = 0.0,
               negatives: int = 1, seed: int = 0, time_limit: float | None = None,
               valid: Callable[[int], dict] | None = None, eval_every: int = 1,
               log: Callable[[str], None] | None = None,
               checkpoint_dir=None) -> list[dict]:
    """Train ``model`` on ``train`` (T, 3) triples; returns the per-epoch log (loss, time,
    validation metrics when ``valid(epoch)`` is given, every ``eval_every`` epochs).

    ``mode="1vsall"``: each triple gives two queries, (h, r) -> t and (t, r + R) -> h, scored
    against all entities with cross-entropy. ``mode="negative"``: each triple (and its reverse
    ``(t, r + R, h)`` where the decoder is reciprocal) and ``negatives`` corruptions of its head
    or tail (uniform), binary cross-entropy (R-GCN's setting).
    Stops after ``time_limit`` seconds at an epoch's end. With ``checkpoint_dir`` every epoch
    ends with a checkpoint (safetensors, atomic) and a later call continues from the last one:
    batches are drawn from a per-epoch seed, so a resumed run equals an uninterrupted one.
    """
    if mode not in ("1vsall", "negative"):
        raise ValueError(f"train_link: mode must be '1vsall' or 'negative', got {mode!r}")
    train = check_triples(train, model.num_entities, model.num_relations, "train")
    opt = _optimizer(optimizer, model, lr)
    torch.manual_seed(seed)
    R = model.num_relations
    history, first = _resume(checkpoint_dir, model, opt)
    if mode == "1vsall" or model.decoder.reciprocal:
        # reciprocal relations are trained on the reversed triples (the inverse queries)
        queries = torch.cat([train, torch.stack([train[:, 2], train[:, 1] + R, train[:, 0]], 1)])
    else:  # one vector per relation serves both directions: the triples themselves suffice
        queries = train
    start = time.perf_counter()
    for epoch in range(first, epochs + 1):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        model.train()
        total, count, t0 = 0.0, 0, time.perf_counter()
        for idx in _batches(queries.shape[0], batch_size, gen):
            loss = _batch_loss(model, queries[idx], mode, label_smoothing, negatives, reg,
                               reg_weight, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * idx.numel()
            count += idx.numel()
        row = {"epoch": epoch, "loss": total / count, "seconds": time.perf_counter() - t0}
        if valid is not None and (epoch % eval_every == 0 or epoch == epochs):
            model.eval()
            row.update({f"valid_{k}": v for k, v in valid(epoch).items()})
        history.append(row)
        if checkpoint_dir is not None:
            save_checkpoint(checkpoint_dir, epoch, model.state_dict(), opt.state_dict(),
                            {"history": history})
        if log is not None:
            log("  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in row.items()))
        if time_limit is not None and time.perf_counter() - start > time_limit:
            break
    return history


def link_metrics(model: LinkPredictor, triples: Tensor, known: Tensor,
                 batch_size: int = 512) -> dict:
    """``sc.kg.evaluate`` of ``model`` (entity vectors computed once, eval mode)."""
    model.eval()
    with torch.no_grad():
        ent = model.entities()
        return evaluate(lambda h, r: model.score_tails(h, r, ent), triples, known,
                        model.num_entities, model.num_relations, batch_size=batch_size)

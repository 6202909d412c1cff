"""Triple scorers (decoders) of link prediction: DistMult and ComplEx.

A decoder holds one vector per relation and scores (head, relation, tail) from entity vectors.
Relations ``0..R-1`` are the graph's; ``r + R`` is the inverse of ``r`` (the query "which heads
have tail t"). With ``reciprocal=True`` inverses get their own vectors (the modern 1-vs-all
setting, Lacroix et al. 2018); otherwise they are derived exactly: score(t, r + R, h) =
score(h, r, t).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["DistMult", "ComplEx", "DECODERS"]


class _Decoder(nn.Module):
    def __init__(self, num_relations: int, dim: int, reciprocal: bool, init_std: float):
        super().__init__()
        for name, v in (("num_relations", num_relations), ("dim", dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be an int >= 1, got {v!r}")
        self.num_relations, self.dim, self.reciprocal = num_relations, dim, bool(reciprocal)
        rows = 2 * num_relations if reciprocal else num_relations
        self.relation = nn.Parameter(torch.randn(rows, dim) * init_std)

    def extra_repr(self) -> str:
        return f"num_relations={self.num_relations}, dim={self.dim}, reciprocal={self.reciprocal}"

    def _check(self, rel: Tensor) -> None:
        if rel.numel() and (int(rel.min()) < 0 or int(rel.max()) >= 2 * self.num_relations):
            raise ValueError(f"{type(self).__name__}: relation ids must be in "
                             f"[0, {2 * self.num_relations - 1}] (r + {self.num_relations} = "
                             f"inverse of r), got [{int(rel.min())}, {int(rel.max())}]")

    def relation_vectors(self, rel: Tensor) -> Tensor:
        """(B, dim) vectors of relations ``rel`` (B,), inverses included."""
        self._check(rel)
        if self.reciprocal:
            return self.relation[rel]
        R = self.num_relations
        w = self.relation[rel % R]
        return torch.where((rel >= R)[:, None], self._invert(w), w)

    def _invert(self, w: Tensor) -> Tensor:
        return w

    def forward(self, head: Tensor, rel: Tensor, tail: Tensor) -> Tensor:
        """Scores (B,) of triples from head and tail vectors (B, dim) and relation ids (B,)."""
        return (self._query(head, rel) * tail).sum(-1)

    def score_all(self, head: Tensor, rel: Tensor, entities: Tensor) -> Tensor:
        """Scores (B, E) of every entity of ``entities`` (E, dim) as the tail of (head, rel)."""
        return self._query(head, rel) @ entities.t()


class DistMult(_Decoder):
    """score(h, r, t) = Σ_d h_d w_{r,d} t_d (Yang et al. 2015): a diagonal bilinear form."""

    def __init__(self, num_relations: int, dim: int, reciprocal: bool = True,
                 init_std: float = 1e-3):
        super().__init__(num_relations, dim, reciprocal, init_std)

    def _query(self, head: Tensor, rel: Tensor) -> Tensor:
        return head * self.relation_vectors(rel)


class ComplEx(_Decoder):
    """score(h, r, t) = Re(Σ_d h_d w_{r,d} conj(t_d)) (Trouillon et al. 2016); a vector of
    ``dim`` reals holds ``dim / 2`` complex numbers, real parts first."""

    def __init__(self, num_relations: int, dim: int, reciprocal: bool = True,
                 init_std: float = 1e-3):
        if isinstance(dim, int) and dim % 2:
            raise ValueError(f"ComplEx: dim must be even (real and imaginary halves), got {dim}")
        super().__init__(num_relations, dim, reciprocal, init_std)

    def _invert(self, w: Tensor) -> Tensor:
        # score(t, r, h) = Re(<t, w, conj(h)>) = Re(<h, conj(w), conj(t)>)
        half = self.dim // 2
        return torch.cat([w[:, :half], -w[:, half:]], 1)

    def _query(self, head: Tensor, rel: Tensor) -> Tensor:
        # Re(Σ h w conj(t)) = Σ (hr wr - hi wi) tr + (hr wi + hi wr) ti
        half = self.dim // 2
        w = self.relation_vectors(rel)
        hr, hi, wr, wi = head[:, :half], head[:, half:], w[:, :half], w[:, half:]
        return torch.cat([hr * wr - hi * wi, hr * wi + hi * wr], 1)


DECODERS = {"distmult": DistMult, "complex": ComplEx}
"""The link-prediction decoders by name (``LinkPredictor``'s ``decoder``, ``[model.link]``'s)."""

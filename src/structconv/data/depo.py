"""A generated k-hop reasoning task in the spirit of Allen-Zhu's "Depo" (Physics of Language
Models, Part 4.1, arXiv 2512.17351): follow k directed pairs without writing the steps down.

One sequence holds one instance. ``n`` distinct node tokens, drawn from ``nodes``, form one
directed cycle; the context lists its n pairs ``a b ;`` (a's successor is b) in a random order.
Then come ``queries`` questions ``? q k a``: a query marker, a start node q, a hop token for k
(1..``max_hops``) and the answer a, the k-th successor of q along the cycle. A causal language
model is scored on the answer alone, predicted at the hop token: it must chain k pairs of the
context in its forward pass (no chain of thought). The starts of one sequence are distinct.

Token ids: nodes ``0..nodes-1``, then ``sep``, ``query`` and the hop tokens ``hop(1)`` ..
``hop(max_hops)``. Everything is drawn from a ``torch.Generator``, so a seed fixes a data set.

What is reduced against the paper's Depo: every node name is one token (Depo1-like, not the
multi-token names of Depo2), n is fixed per task rather than drawn per sequence, and the pairs
form a single cycle (so every k-th successor exists). Not a registered dataset: the task is
generated on the fly by ``generate``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["DepoTask", "DepoBatch", "generate", "solve"]


def _int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ValueError(f"DepoTask: {name} must be an int >= {lo}, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class DepoTask:
    """The task's sizes: ``nodes`` node tokens, ``n`` of them per instance, hops 1..
    ``max_hops`` (< n, so that no answer is its own start), ``queries`` questions (<= n)."""

    nodes: int = 64
    n: int = 16
    max_hops: int = 8
    queries: int = 4

    def __post_init__(self):
        nodes, n = _int("nodes", self.nodes, 2), _int("n", self.n, 2)
        hops, q = _int("max_hops", self.max_hops, 1), _int("queries", self.queries, 1)
        if n > nodes:
            raise ValueError(f"DepoTask: n={n} nodes per instance need at least as many node "
                             f"tokens, got nodes={nodes}")
        if hops >= n:
            raise ValueError(f"DepoTask: max_hops={hops} must be below n={n} (the {n}-th "
                             "successor on an n-cycle is the start itself)")
        if q > n:
            raise ValueError(f"DepoTask: queries={q} distinct starts need queries <= n={n}")

    @property
    def sep(self) -> int:
        """The token closing each pair."""
        return self.nodes

    @property
    def query(self) -> int:
        """The token opening each question."""
        return self.nodes + 1

    def hop(self, k) -> int | Tensor:
        """The token saying "k hops" (k in 1..max_hops; a tensor of k gives a tensor)."""
        return self.nodes + 1 + k

    @property
    def vocab_size(self) -> int:
        return self.nodes + 2 + self.max_hops

    @property
    def length(self) -> int:
        """Tokens per sequence: 3 per pair, 4 per question."""
        return 3 * self.n + 4 * self.queries

    @property
    def positions(self) -> Tensor:
        """(queries,) the positions whose next-token prediction is an answer (the hop tokens)."""
        return 3 * self.n + 4 * torch.arange(self.queries) + 2


@dataclass
class DepoBatch:
    """Generated sequences: ``ids`` (B, T) long; per question (B, Q): ``starts`` (node tokens),
    ``hops`` (k) and ``answers`` (node tokens); ``cycle`` (B, n) the instance's nodes in cycle
    order (cycle[i] -> cycle[i + 1 mod n])."""

    ids: Tensor
    starts: Tensor
    hops: Tensor
    answers: Tensor
    cycle: Tensor


def generate(task: DepoTask, batch: int, generator: torch.Generator,
             hops: int | Tensor | None = None) -> DepoBatch:
    """``batch`` sequences of ``task``. ``hops``: None draws every question's k uniformly from
    1..max_hops; an int asks every question with that k; a (batch, queries) tensor gives them."""
    B, n, Q, K = _int("batch", batch, 1), task.n, task.queries, task.max_hops
    g = generator
    cycle = torch.rand(B, task.nodes, generator=g).argsort(1)[:, :n]  # distinct, random order
    order = torch.rand(B, n, generator=g).argsort(1)  # the pairs' order in the context
    src = cycle.gather(1, order)
    dst = cycle.gather(1, (order + 1) % n)
    pairs = torch.stack([src, dst, torch.full_like(src, task.sep)], 2).reshape(B, 3 * n)
    k = _hops(hops, B, Q, K, g)
    at = torch.rand(B, n, generator=g).argsort(1)[:, :Q]  # distinct start positions on the cycle
    starts = cycle.gather(1, at)
    answers = cycle.gather(1, (at + k) % n)
    qs = torch.stack([torch.full_like(starts, task.query), starts, task.hop(k), answers], 2)
    ids = torch.cat([pairs, qs.reshape(B, 4 * Q)], 1)
    return DepoBatch(ids=ids, starts=starts, hops=k, answers=answers, cycle=cycle)


def _hops(hops, B: int, Q: int, K: int, g: torch.Generator) -> Tensor:
    if hops is None:
        return torch.randint(1, K + 1, (B, Q), generator=g)
    if isinstance(hops, Tensor):
        if hops.shape != (B, Q) or hops.dtype.is_floating_point or \
                bool(((hops < 1) | (hops > K)).any()):
            raise ValueError(f"hops must be ({B}, {Q}) integers in 1..{K}, got "
                             f"{tuple(hops.shape)} {hops.dtype}")
        return hops.long()
    k = _int("hops", hops, 1)
    if k > K:
        raise ValueError(f"hops={k} exceeds the task's max_hops={K}")
    return torch.full((B, Q), k, dtype=torch.long)


def solve(task: DepoTask, ids: Tensor) -> Tensor:
    """The answers (B, Q) of sequences ``ids`` (B, T) read off their tokens alone: the pairs of
    the context give each node's successor; each question follows it k times (a reference
    solver, independent of how ``generate`` drew the instance)."""
    B, n, Q = ids.shape[0], task.n, task.queries
    pairs = ids[:, :3 * n].reshape(B, n, 3)
    if bool((pairs[:, :, 2] != task.sep).any()):
        raise ValueError("solve: the context is not n pairs 'a b ;'")
    succ = torch.full((B, task.nodes), -1, dtype=torch.long)
    succ.scatter_(1, pairs[:, :, 0], pairs[:, :, 1])
    qs = ids[:, 3 * n:3 * n + 4 * Q].reshape(B, Q, 4)
    node, k = qs[:, :, 1].clone(), qs[:, :, 2] - task.hop(0)
    for step in range(1, task.max_hops + 1):
        move = k >= step
        node = torch.where(move, succ.gather(1, node), node)
    return node

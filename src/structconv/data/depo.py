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
form a single cycle (so every k-th successor exists). Registered as the dataset ``depo``
(``load_dataset("depo", nodes=..., n=..., max_hops=..., queries=..., eval_per_k=...)``): it
stores nothing, its training sequences are drawn by the training task
(``structconv.training.tasks.hops``), its evaluation sets by ``eval_sets`` from fixed seeds.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from .registry import DatasetError, check_int, register_dataset

__all__ = ["DepoTask", "DepoBatch", "DepoData", "generate", "solve", "eval_sets", "load_depo",
           "EVAL_SEEDS"]

#: the seeds of the fixed evaluation sets: k's set of a split is drawn from its seed + k
EVAL_SEEDS = {"val": 12345, "test": 54321}


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


def eval_sets(task: DepoTask, per_k: int, seed: int = EVAL_SEEDS["val"]) -> dict[int, tuple]:
    """{k: (ids (per_k, 3n + 4), answers (per_k,))} for k = 1..max_hops: ``per_k`` sequences
    with one question each, all of k hops (so no earlier answer can shorten the chain), k's
    drawn from ``seed + k``."""
    one = dataclasses.replace(task, queries=1)
    out = {}
    for k in range(1, task.max_hops + 1):
        b = generate(one, per_k, torch.Generator().manual_seed(seed + k), hops=k)
        out[k] = (b.ids, b.answers[:, 0])
    return out


@dataclass
class DepoData:
    """The k-hop task as a dataset: its sizes (``spec``) and ``eval_per_k`` evaluation
    sequences per k; nothing is stored (``eval_sets`` draws a split's sets, the training task
    its batches)."""

    name: str
    spec: DepoTask
    eval_per_k: int
    task: str = "depo"

    @property
    def vocab(self) -> tuple[str, ...]:
        """Token names by id: the nodes ``"0"`` ..., then ``";"``, ``"?"``, ``"k1"`` ..."""
        s = self.spec
        return (*map(str, range(s.nodes)), ";", "?",
                *(f"k{k}" for k in range(1, s.max_hops + 1)))

    @property
    def num_classes(self) -> int:
        return self.spec.vocab_size

    @property
    def length(self) -> int:
        """Tokens per training sequence (a learned position table's length)."""
        return self.spec.length

    def eval_sets(self, split: str) -> dict[int, tuple]:
        """The fixed evaluation sets of ``split`` (val or test): see ``eval_sets``."""
        if split not in EVAL_SEEDS:
            raise ValueError(f"depo: the training sequences are drawn, not kept: evaluate "
                             f"{' or '.join(EVAL_SEEDS)}, not {split!r}")
        return eval_sets(self.spec, self.eval_per_k, EVAL_SEEDS[split])

    def describe(self) -> str:
        s = self.spec
        return (f"{self.name}: k-hop task, {s.n} of {s.nodes} node tokens per cycle, k in "
                f"1..{s.max_hops}, {s.queries} questions per training sequence ({s.length} "
                f"tokens); {self.eval_per_k} evaluation sequences per k")


#: the largest size an option takes (far past any run; a typo's extra zeros are refused)
MAX_OPTION = 1_000_000


@register_dataset("depo", None, "Depo-style k-hop task, generated (options nodes, n, max_hops, "
                                "queries, eval_per_k)")
def load_depo(root=None, nodes: int = 32, n: int = 12, max_hops: int = 8, queries: int = 8,
              eval_per_k: int = 512) -> DepoData:
    """The k-hop task of these sizes (``DepoTask``) with ``eval_per_k`` evaluation sequences
    per k; ``DatasetError`` naming the option that does not make one."""
    sizes = {k: check_int("depo", k, v, 1, MAX_OPTION) for k, v in
             (("nodes", nodes), ("n", n), ("max_hops", max_hops), ("queries", queries))}
    per_k = check_int("depo", "eval_per_k", eval_per_k, 1, MAX_OPTION)
    try:
        spec = DepoTask(**sizes)
    except ValueError as e:
        raise DatasetError(str(e).replace("DepoTask:", "depo:", 1)) from None
    return DepoData("depo", spec, per_k)

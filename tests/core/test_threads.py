"""Threads sharing a basis: its caches (held tensors, casts, plans, arranged copies) are safe.

Before the fix, 8 threads on a fresh ``Stack([gcn, chebyshev, Grid])`` in two dtypes raised
"dictionary changed size during iteration" in ``Basis._held`` (and in the planner's plan cache)
in about a quarter of the races. A tiny switch interval makes the interpreter change threads
every few bytecodes, so each race below has many chances to interleave.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch

import structconv as sc
from structconv.basis import Dense, Grid, Sparse, Stack, chebyshev, gcn

THREADS = 8


@pytest.fixture
def busy_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _graph_stack():
    ei = torch.randint(0, 16, (2, 40), generator=torch.Generator().manual_seed(0))
    return Stack([gcn(ei, 16, cache=False), chebyshev(ei, 16, 3, cache=False),
                  Grid((4, 4), 3, padding=1)])


def _dense_stack():
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randint(0, s, (30,), generator=g) for s in (2, 16, 16)])
    return Stack([Dense(torch.randn(3, 16, 16, generator=g, dtype=torch.float64)),
                  Sparse(idx, torch.randn(30, generator=g), (2, 16, 16))])


def _inputs(K: int, i: int):
    dt = torch.float64 if i % 2 else torch.float32
    g = torch.Generator().manual_seed(i)
    return (torch.randn(2, 16, 3, generator=g, dtype=dt),
            torch.randn(K, 3, 2, generator=g, dtype=dt))


def _one_race(basis, refs: list, problems: list) -> None:
    barrier = threading.Barrier(THREADS)

    def work(i):
        x, theta = _inputs(basis.K, i)
        barrier.wait()
        try:
            y = sc.convolve(x, basis, theta)
            basis.to_dense()
            if not torch.equal(y, refs[i]):
                problems.append(f"thread {i}: a result differs from the one-thread run")
        except Exception as e:  # every failure is the finding
            problems.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _race(make, trials: int) -> list[str]:
    """Run ``trials`` races of THREADS threads on a fresh basis each; the errors raised and
    the results that differ from a one-thread run on another fresh basis."""
    ref_basis = make()
    refs = []
    for i in range(THREADS):
        x, theta = _inputs(ref_basis.K, i)
        refs.append(sc.convolve(x, ref_basis, theta))
    problems: list[str] = []
    for _ in range(trials):
        _one_race(make(), refs, problems)
    return problems


def test_threads_on_a_fresh_graph_and_grid_stack(busy_switching):
    problems = _race(_graph_stack, 80)
    assert not problems, f"{len(problems)} failures, e.g. {problems[:3]}"


def test_threads_on_a_fresh_dense_and_sparse_stack(busy_switching):
    problems = _race(_dense_stack, 60)
    assert not problems, f"{len(problems)} failures, e.g. {problems[:3]}"

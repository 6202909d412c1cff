"""``build_csr``: entries in any order, with duplicates, give the coalesced CSR of their sum;
entries already in row-major order without duplicates take the path without a sort and give the
same."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structconv.sparse import build_csr


def _dense(rows, cols, vals, shape):
    out = torch.zeros(shape, dtype=vals.dtype)
    return out.index_put_((rows, cols), vals, accumulate=True)


def _parts(S):
    return S.crow_indices(), S.col_indices(), S.values()


@settings(max_examples=40, deadline=None)
@given(R=st.integers(0, 7), C=st.integers(1, 7), E=st.integers(0, 30), seed=st.integers(0, 99))
def test_any_order_gives_the_coalesced_sum_and_sorted_input_the_same_csr(R, C, E, seed):
    g = torch.Generator().manual_seed(seed)
    if R == 0:
        E = 0
    rows = torch.randint(0, max(R, 1), (E,), generator=g)
    cols = torch.randint(0, C, (E,), generator=g)
    vals = torch.randn(E, generator=g, dtype=torch.float64)
    S = build_csr(rows, cols, vals, (R, C))
    torch.testing.assert_close(S.to_dense(), _dense(rows, cols, vals, (R, C)))
    crow, col, v = _parts(S)
    assert crow.dtype == col.dtype == torch.long and v.dtype == torch.float64
    # the coalesced entries, given in order: the sort-free path, the same CSR
    r = torch.repeat_interleave(torch.arange(R), crow.diff())
    fast = build_csr(r, col, v, (R, C))
    for a, b in zip(_parts(fast), (crow, col, v)):
        assert torch.equal(a, b)


def test_the_sort_free_path_copies_the_values_and_keeps_int32_indices_apart():
    rows, cols = torch.tensor([0, 0, 2]), torch.tensor([1, 3, 0])
    vals = torch.tensor([1.0, 2.0, 3.0])
    S = build_csr(rows, cols, vals, (3, 4))
    vals[0] = 9.0  # the CSR holds its own values
    assert S.values().tolist() == [1.0, 2.0, 3.0]
    assert S.crow_indices().tolist() == [0, 2, 2, 3] and S.col_indices().tolist() == [1, 3, 0]
    # a duplicate or a step back takes the sorting path: summed, ordered
    S = build_csr(torch.tensor([0, 0, 0]), torch.tensor([1, 1, 0]), torch.ones(3), (1, 2))
    assert S.col_indices().tolist() == [0, 1] and S.values().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("shape", [(0, 0), (0, 3), (3, 0)])
def test_empty_matrices(shape):
    e = torch.zeros(0, dtype=torch.long)
    S = build_csr(e, e, torch.zeros(0), shape)
    assert S.shape == shape and S.crow_indices().tolist() == [0] * (shape[0] + 1)

"""``sc.basis.Shift``: the one shift basis (causal or signed offsets, a cache before the
outputs), and the names that use it (``shift_basis``, ``CausalShift``, ``SignedShift``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv import attention as at
from structconv.nn.seq2seq import SignedShift

F64 = torch.float64


@settings(max_examples=60, deadline=None)
@given(L=st.integers(1, 8), shifts=st.lists(st.integers(-6, 6), min_size=1, max_size=4),
       causal=st.booleans(), extra=st.integers(0, 2), C=st.integers(1, 3))
def test_shift_heads_are_their_shift_matrices_forward_and_backward(L, shifts, causal, extra,
                                                                   C):
    if causal:
        shifts = [abs(s) for s in shifts]
    R = max(shifts) + extra if causal and max(shifts) + extra else 0
    basis = sc.basis.Shift(L, shifts, causal=causal, past=R)
    A = basis.to(dtype=F64).to_dense()  # (S, R + L, L)
    assert A.shape == (len(shifts), R + L, L) and A.dtype == F64
    n = torch.arange(L)
    for k, s in enumerate(shifts):  # A_s[m, n] = 1 iff m = n + R - s, inside the sequence
        m = n + R - s
        ok = (m >= 0) & (m < R + L)
        assert A[k].sum() == ok.sum() and bool((A[k, m[ok], n[ok]] == 1).all())
    z = torch.randn(2, R + L, len(shifts), C, dtype=F64, requires_grad=True)
    got = basis.propagate_heads(z)
    want = torch.einsum("kmn,bmkc->bnkc", A, z)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    g = torch.randn_like(got)
    (gz,) = torch.autograd.grad(got, z, g)
    torch.testing.assert_close(gz, torch.einsum("kmn,bnkc->bmkc", A, g), rtol=0, atol=0)
    # as any basis: through the convolution's routes
    x = torch.randn(2, R + L, 3, dtype=F64)
    theta = torch.randn(len(shifts), 3, 2, dtype=F64)
    ref = torch.einsum("kmn,bmp,kpq->bnq", A, x, theta)
    for route in sc.ROUTES:
        torch.testing.assert_close(sc.convolve(x, basis, theta, route=route), ref)


def test_the_named_shift_bases_are_the_one_shift_basis():
    assert isinstance(at.CausalShift(5, [0, 2]), sc.basis.Shift)
    assert isinstance(SignedShift(5, [-1, 2]), sc.basis.Shift)
    assert isinstance(at.shift_basis(5, (1, -2)), sc.basis.Shift)
    assert at.CausalShift(5, [0, 2], past=2).causal and not SignedShift(5, [1]).causal
    torch.testing.assert_close(SignedShift(6, [-2, 1]).to_dense(),
                               at.shift_basis(6, (-2, 1)).to_dense())
    assert at.shift_basis(4, (1,), dtype=F64).to_dense().dtype == F64


def test_bad_shift_bases_are_refused_by_name():
    with pytest.raises(ValueError, match="Shift needs at least one shift, all >= 0"):
        sc.basis.Shift(4, [-1])
    with pytest.raises(ValueError, match="CausalShift needs at least one shift, all >= 0"):
        at.CausalShift(4, [])
    with pytest.raises(ValueError, match="SignedShift needs at least one offset"):
        SignedShift(4, [])
    with pytest.raises(ValueError, match="past=1 cached entries cannot feed a shift of 3"):
        sc.basis.Shift(4, [3], past=1)
    with pytest.raises(ValueError, match="signed shifts take no cached entries"):
        sc.basis.Shift(4, [-1, 1], causal=False, past=2)
    with pytest.raises(ValueError, match=r"expects z \(B, M=4, K=2, C\)"):
        sc.basis.Shift(4, [0, 1]).propagate_heads(torch.zeros(1, 3, 2, 1))

"""The basis protocol: a family written only against CONTRACT.md works everywhere, unchanged.

The family is ``examples/cyclic_shift.py`` (outside the package): a subclass of ``Basis`` with
``__init__`` and ``propagate_heads`` only, plus a cost hint.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv.basis import Dense, Grid, Product, Sparse, Stack
from tests.conftest import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "examples"))
from cyclic_shift import CyclicShift, build  # noqa: E402

D = torch.float64


def dense_cyclic(L, shifts, w):
    """The definition: A_k[m, n] = w_k where m = (n - s_k) mod L."""
    A = torch.zeros(len(shifts), L, L, dtype=w.dtype)
    for k, s in enumerate(shifts):
        for n in range(L):
            A[k, (n - s) % L, n] = w[k]
    return A


def reference(A, x, theta):
    return torch.einsum("kmn,bmp,kpq->bnq", A, x, theta)


@settings(max_examples=20, deadline=None)
@given(L=st.integers(1, 7), shifts=st.lists(st.integers(-9, 9), min_size=1, max_size=4),
       B=st.integers(1, 3), P=st.integers(1, 4), Q=st.integers(1, 4), seed=st.integers(0, 999))
def test_every_route_equals_the_definition(L, shifts, B, P, Q, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(len(shifts), generator=g, dtype=D)
    basis = CyclicShift(L, shifts, w)
    A = dense_cyclic(L, shifts, w)
    torch.testing.assert_close(basis.to_dense(), A)
    x = torch.randn(B, L, P, generator=g, dtype=D)
    theta = torch.randn(len(shifts), P, Q, generator=g, dtype=D)
    ref = reference(A, x, theta)
    names = [r.name for r in sc.plan(x, basis, theta).routes]
    assert set(sc.ROUTES) <= set(names)
    for route in ["auto", *names]:
        torch.testing.assert_close(sc.convolve(x, basis, theta, route=route), ref,
                                   msg=f"route {route}")
    # the parameter forms' factored routes run on it too
    for form in (sc.params.DepthwiseSeparable(len(shifts), P, Q),
                 sc.params.LowRank(len(shifts), P, Q, 2),
                 sc.params.ControlledSeparable(len(shifts), P, Q, 2)):
        form = form.to(D)
        want = reference(A, x, form())
        for r in sc.plan(x, basis, form).routes:
            torch.testing.assert_close(sc.convolve(x, basis, form, route=r.name), want,
                                       msg=f"{type(form).__name__} {r.name}")


def test_algebra_stack_product_and_layer():
    torch.manual_seed(0)
    w = torch.randn(3, dtype=D)
    basis = CyclicShift(6, [0, 1, -2], w)
    A = dense_cyclic(6, [0, 1, -2], w)
    theta = torch.randn(3, 2, 4, dtype=D)
    torch.testing.assert_close(sc.materialize(basis, theta), sc.materialize(A, theta))
    phi = sc.materialize(basis, theta)
    torch.testing.assert_close(sc.materialize(basis, sc.invert(basis, phi)), phi)
    b2, t2 = sc.compose((basis, theta), (Dense(torch.randn(2, 6, 5, dtype=D)),
                                         torch.randn(2, 4, 3, dtype=D)))
    x = torch.randn(2, 6, 2, dtype=D)
    torch.testing.assert_close(sc.convolve(x, b2, t2), reference(b2.to_dense(), x, t2))
    stack = Stack([basis, Grid((6,), 3, padding=1)])
    th = torch.randn(6, 2, 4, dtype=D)
    torch.testing.assert_close(sc.convolve(x, stack, th), reference(stack.to_dense(), x, th))
    layer = sc.nn.Convolution(basis, 2, 4).to(D)
    y = layer(x)
    y.sum().backward()
    torch.testing.assert_close(y, reference(A, x, layer.param()) + layer.bias)
    assert layer.param.weight.grad is not None


def test_to_float64_moves_held_tensors_and_keeps_integers():
    basis = CyclicShift(5, [0, 2], torch.tensor([0.1, 0.7]))
    assert basis.dtype == torch.float32
    b64 = basis.to(dtype=D)
    assert b64.dtype == D and b64.w.dtype == D and basis.w.dtype == torch.float32
    assert torch.equal(b64.to_dense(), dense_cyclic(5, [0, 2], b64.w))
    # float64 weights: to_dense keeps them (the defect: it rounded to float32, ~5e-8 relative)
    w = torch.tensor([0.1, 0.7], dtype=D)
    assert torch.equal(CyclicShift(5, [0, 2], w).to_dense(), dense_cyclic(5, [0, 2], w))
    s = Sparse(torch.tensor([[0, 0], [1, 2], [2, 0]]), torch.tensor([0.3, 0.9]), (1, 3, 3))
    s64 = s.to(dtype=D)
    assert s64.values.dtype == D and s64.indices.dtype == torch.long
    # a float32 basis applied to float64 input casts once, and the cast is cached
    x = torch.randn(5, 2, dtype=D)
    assert basis.cast_like(x) is basis.cast_like(x)
    assert basis.cast_like(x).dtype == D


def test_product_of_mixed_dtypes():
    # the defect: Product(Grid, Dense float64).to_dense() raised "expected scalar type Double"
    p = Product(Grid((6,), (3,), padding=1), Dense(torch.randn(2, 6, 6, dtype=D)))
    A = p.to_dense()
    assert A.dtype == D
    theta = torch.randn(p.K, 2, 3, dtype=D)
    x = torch.randn(4, 6, 2, dtype=D)
    ref = reference(A, x, theta)
    torch.testing.assert_close(sc.materialize(p, theta), sc.materialize(A, theta))
    for route in ("basis_param", "auto", *sc.ROUTES):
        torch.testing.assert_close(sc.convolve(x, p, theta, route=route), ref)
    b, t = sc.compose((Grid((6,), (3,), padding=1), torch.randn(3, 2, 2, dtype=D)),
                      (Dense(torch.randn(2, 6, 6, dtype=D)), torch.randn(2, 2, 3, dtype=D)))
    torch.testing.assert_close(sc.convolve(x, b, t), reference(b.to_dense(), x, t))


def test_held_tensor_with_grad_is_differentiable_and_not_cached():
    w = torch.tensor([0.5, -1.0], dtype=torch.float32, requires_grad=True)
    basis = CyclicShift(4, [0, 1], w)
    x = torch.randn(4, 3, dtype=D)
    assert basis.cast_like(x) is not basis.cast_like(x)  # casts of graph tensors stay live
    y = sc.convolve(x, basis, torch.randn(2, 3, 2, dtype=D))
    y.sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


def test_plan_is_cached_and_runs_itself(monkeypatch):
    from structconv import engine

    basis = CyclicShift(8, [0, 1, 3])
    x, theta = torch.randn(2, 8, 4), torch.randn(3, 4, 5)
    calls = []
    real = engine._make_plan
    monkeypatch.setattr(engine, "_make_plan", lambda *a: calls.append(1) or real(*a))
    y1 = sc.convolve(x, basis, theta)
    y2 = sc.convolve(x, basis, theta)
    assert len(calls) == 1 and torch.equal(y1, y2)
    p = sc.plan(x, basis, theta)
    assert len(calls) == 1  # the same call shape: the cached plan
    torch.testing.assert_close(p(x, theta), y1)
    with pytest.raises(ValueError, match="made for x of shape"):
        p(torch.randn(3, 8, 4), theta)
    sc.convolve(torch.randn(3, 8, 4), basis, theta)
    assert len(calls) == 2  # a new shape plans again
    basis.shifts = [0, 1, 2]  # changed in place: clear_cache drops the derived state
    basis.clear_cache()
    sc.convolve(x, basis, theta)
    assert len(calls) == 3


def test_registry_user_kind_and_import_path():
    s = sc.basis.Structure(grid=(4, 3))
    sc.basis.register("cyclic_test", build)
    try:
        b = sc.basis.build({"kind": "cyclic_test", "shifts": [0, 5]}, s)
        assert isinstance(b, CyclicShift) and b.shape == (2, 12, 12)
    finally:
        sc.basis.BASES._builders.pop("cyclic_test")
    b = sc.basis.build({"kind": "cyclic_shift:build", "shifts": [1]}, s)
    assert b.shape == (1, 12, 12)
    with pytest.raises(sc.basis.KindError, match="cannot import 'no_such_module_xyz'"):
        sc.basis.build({"kind": "no_such_module_xyz:f"}, s)
    with pytest.raises(sc.basis.KindError, match="did you mean grid"):
        sc.basis.build({"kind": "gird"}, s)


def test_toml_config_with_the_user_kind_trains(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "structconv.cli", "train", "--config",
                        str(ROOT / "examples" / "cyclic_digits.toml"), "train.epochs=1",
                        "--out", str(tmp_path / "run")], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["test_acc"] > 0.6, result["test_acc"]  # learns (a mean readout stayed ~0.25)


def test_cached_cast_follows_in_place_edits_and_weight_attributes_are_free():
    w = torch.tensor([0.5, 2.0])
    basis = CyclicShift(4, [0, 1], w)
    x = torch.randn(4, 3, dtype=D)
    first = basis.cast_like(x)
    assert basis.cast_like(x) is first  # cached while nothing changes
    w.mul_(3.0)  # an in-place edit of a held tensor renews the cast
    assert torch.equal(basis.cast_like(x).w, w.to(D))
    # a subclass may hold an attribute named "weight": the cost hooks do not use that name
    basis.weight = torch.ones(2)
    assert basis.channelwise_flops(3) > 0
    # a Product of casting factors is rebuilt once per cast, so its plans are kept
    p = Product(Dense(torch.randn(1, 4, 4)), basis)
    assert p.cast_like(x) is p.cast_like(x)

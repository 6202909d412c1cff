"""Parameter forms (sc.params): counts, what each form is, factored routes, the registry."""

import math

import pytest
import torch

import structconv as sc
from structconv import params
from structconv.basis import Dense

D = torch.float64


@pytest.mark.parametrize("K,P,Q", [(1, 1, 1), (9, 6, 4), (3, 12, 8)])
def test_parameter_counts(K, P, Q):
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(params.Full(K, P, Q)) == K * P * Q
    g = math.gcd(P, Q)
    assert count(params.Grouped(K, P, Q, g)) == K * P * Q // g
    assert count(params.DepthwiseSeparable(K, P, Q)) == K * P + P * Q
    assert count(params.ControlledSeparable(K, P, Q, 2)) == 2 * (K + P * Q)
    assert count(params.LowRank(K, P, Q, 3)) == K * 3 * (P + Q)
    for m in (params.Full(K, P, Q), params.Grouped(K, P, Q, g), params.DepthwiseSeparable(K, P, Q),
              params.ControlledSeparable(K, P, Q, 2), params.LowRank(K, P, Q, 3)):
        assert m().shape == (K, P, Q)


def test_parameter_forms_are_what_they_claim():
    torch.manual_seed(0)
    g = params.Grouped(2, 6, 4, 2)
    th = g()
    assert torch.all(th[:, :3, 2:] == 0) and torch.all(th[:, 3:, :2] == 0)
    d = params.DepthwiseSeparable(3, 4, 5)
    torch.testing.assert_close(d(), torch.einsum("kp,pq->kpq", d.depth, d.point))
    c = params.ControlledSeparable(5, 3, 2, 2)
    torch.testing.assert_close(c(), sc.mixed_product(c.basis_coef, c.channel))
    r = params.LowRank(3, 4, 5, 2)
    torch.testing.assert_close(r(), torch.bmm(r.value, r.out))
    with pytest.raises(ValueError, match="groups=4 must divide"):
        params.Grouped(1, 6, 4, 4)


def test_init_scale_matches_a_full_theta():
    """Every form starts with theta entries of about the variance torch's conv init gives."""
    torch.manual_seed(0)
    K, P, Q = 9, 64, 64
    target = 1.0 / (3 * K * P)
    for m in (params.Full(K, P, Q), params.ControlledSeparable(K, P, Q, 4),
              params.LowRank(K, P, Q, 16)):
        assert 0.5 * target < m().detach().var().item() < 2.0 * target, type(m).__name__


@pytest.mark.parametrize("form", ["depthwise", "separable", "lowrank", "grouped"])
def test_factored_routes_equal_full_theta(form):
    gen = torch.Generator().manual_seed(0)
    K, M, N, P, Q = 4, 6, 5, 4, 6
    m = {"depthwise": params.DepthwiseSeparable(K, P, Q),
         "separable": params.ControlledSeparable(K, P, Q, 2),
         "lowrank": params.LowRank(K, P, Q, 3),
         "grouped": params.Grouped(K, P, Q, 2)}[form].double()
    A = torch.randn(K, M, N, generator=gen, dtype=D)
    x = torch.randn(3, M, P, generator=gen, dtype=D)
    ref = torch.einsum("kmn,bmp,kpq->bnq", A, x, m().detach())
    routes = [r.name for r in sc.plan(x, Dense(A), m).routes]
    for r in routes:
        torch.testing.assert_close(sc.convolve(x, A, m, route=r), ref, msg=r)


def test_registry_builds_every_shipped_form():
    spec = {"groups": 2, "H": 3, "rank": 2}
    for name, cls in [("full", params.Full), ("grouped", params.Grouped),
                      ("depthwise", params.DepthwiseSeparable),
                      ("separable", params.ControlledSeparable), ("lowrank", params.LowRank)]:
        m = params.build({**spec, "param": name}, 4, 6, 8)
        assert type(m) is cls and m().shape == (4, 6, 8)
    assert params.build("full", 1, 2, 3)().shape == (1, 2, 3)
    with pytest.raises(ValueError, match="unknown param kind 'diagonal'.*full"):
        params.build("diagonal", 1, 2, 3)


def test_user_registered_form():
    class Tied(params.Parameterization):
        """theta_k = w for every k: P*Q parameters."""

        def __init__(self, K, P, Q):
            super().__init__(K, P, Q)
            self.w = torch.nn.Parameter(torch.randn(P, Q))

        def forward(self):
            return self.w.expand(self.K, -1, -1)

    params.register("tied_test", lambda spec, K, P, Q: Tied(K, P, Q))
    try:
        m = params.build("tied_test", 3, 2, 2)
        assert sum(p.numel() for p in m.parameters()) == 4
        x = torch.randn(5, 2)
        A = torch.randn(3, 5, 4)
        torch.testing.assert_close(sc.convolve(x, A, m),
                                   torch.einsum("kmn,mp,kpq->nq", A, x, m()))
        # a builder that returns the wrong sizes is refused with both shapes
        params.register("bad_test", lambda spec, K, P, Q: Tied(K, P, Q + 1))
        with pytest.raises(ValueError, match=r"\(K, P, Q\)=\(3, 2, 2\)"):
            params.build("bad_test", 3, 2, 2)
    finally:
        params.PARAMS._builders.pop("tied_test", None)
        params.PARAMS._builders.pop("bad_test", None)


def test_make_param_names_the_extra_size():
    assert isinstance(params.make_param("depthwise", 2, 3, 4), params.DepthwiseSeparable)
    with pytest.raises(ValueError, match="needs its extra size"):
        params.make_param("lowrank", 2, 3, 4)


def test_fixed_theta_adapter():
    t = torch.randn(2, 3, 4)
    f = params.as_theta(t)
    assert isinstance(f, params.Fixed) and f() is t and (f.K, f.P, f.Q) == (2, 3, 4)
    assert params.as_theta(f) is f and f.factored_routes(None, None) == []
    m = params.Full(2, 3, 4)
    assert params.as_theta(m) is m
    with pytest.raises(ValueError, match=r"\(K, P, Q\) tensor.*\(3, 4\)"):
        params.as_theta(torch.randn(3, 4))


def test_plan_key_tells_forms_apart():
    assert params.Grouped(2, 4, 4, 2).plan_key() != params.Grouped(2, 4, 4, 4).plan_key()
    assert params.Full(2, 4, 4).plan_key() == params.Full(2, 4, 4).plan_key()
    assert params.Grouped(2, 4, 4, 2).blocks().shape == (2, 2, 2, 2)
    d, p = params.DepthwiseSeparable(2, 3, 4).separable_factors()
    assert d.shape == (2, 3) and p.shape == (3, 4)
    assert params.Full(1, 1, 1).blocks() is None

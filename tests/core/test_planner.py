"""The planner (sc.plan / sc.explain / Plan) and the cost table (sc.costs)."""

import json

import pytest
import torch

import structconv as sc
from structconv import costs, engine, params
from structconv.basis import Dense, Grid, Sparse, Stack

D = torch.float64


def test_planner_applies_theta_first_when_q_small():
    """On a sparse graph-like basis with Q << P the cheapest order applies Θ before A."""
    gen = torch.Generator().manual_seed(0)
    n = 2000
    idx = torch.stack([torch.zeros(8 * n, dtype=torch.long),
                       torch.randint(0, n, (8 * n,), generator=gen),
                       torch.randint(0, n, (8 * n,), generator=gen)])
    sp = Sparse(idx, None, (1, n, n))
    p = sc.plan((1, n, 500), sp, (1, 500, 16))
    assert p.route == "input_param"
    p = sc.plan((1, n, 16), sp, (1, 16, 500))
    assert p.route == "basis_input"
    text = sc.explain((1, n, 16), sp, (1, 16, 500))
    assert "basis_input" in text and "input_param" in text and "basis_param" in text


def test_stack_plan_has_one_plan_per_part():
    p = sc.plan((2, 5, 3), Stack([torch.randn(2, 5, 5), torch.randn(1, 5, 5)]), (3, 3, 4))
    assert p.route == "stack" and len(p.parts) == 2


def test_phi_limit_keeps_basis_param_out_of_auto():
    # basis_param would materialise M*N*P*Q > PHI_LIMIT elements: listed, never chosen
    n = 2048
    p = sc.plan((1, n, 8), Dense(torch.zeros(1, n, n, device="meta")), (1, 8, 8))
    assert n * n * 64 > engine.PHI_LIMIT
    assert "basis_param" in [r.name for r in p.routes] and p.route != "basis_param"


def test_forced_and_unknown_routes():
    A, x, th = torch.randn(2, 4, 3, dtype=D), torch.randn(4, 2, dtype=D), torch.randn(2, 2, 5,
                                                                                     dtype=D)
    ref = torch.einsum("kmn,mp,kpq->nq", A, x, th)
    for r in sc.ROUTES:
        torch.testing.assert_close(sc.plan(x, A, th, route=r)(x, th), ref)
    with pytest.raises(ValueError, match=r"unknown route 'fast'.*basis_input"):
        sc.convolve(x, A, th, route="fast")


def test_table_is_sorted_and_explain_lists_parts():
    st = Stack([Grid((6,), 3, padding=1), torch.randn(2, 6, 6)])
    p = sc.plan((2, 6, 3), st, (5, 3, 4))
    costs_ = [r["cost"] for r in p.table()]
    assert costs_ == sorted(costs_) and sum(r["chosen"] for r in p.table()) == 1
    text = sc.explain((2, 6, 3), st, (5, 3, 4))
    assert "part 0" in text and "part 1" in text and "route: stack" in text


def test_plan_from_shapes_runs_on_tensors_of_the_basis_dtype():
    s = Sparse(torch.tensor([[0, 1], [0, 2], [1, 1]]), torch.tensor([2.0, -1.0], dtype=D),
               (2, 3, 3))
    p = sc.plan((2, 3, 4), s, (2, 4, 1))
    x, th = torch.randn(2, 3, 4, dtype=D), torch.randn(2, 4, 1, dtype=D)
    torch.testing.assert_close(p(x, th), torch.einsum("kmn,bmp,kpq->bnq", s.to_dense(), x, th))


def test_bias_is_fused_or_added():
    g = Grid((5, 5), 3, padding=1)
    x, th, b = torch.randn(2, 25, 3, dtype=D), torch.randn(9, 3, 4, dtype=D), torch.randn(4,
                                                                                         dtype=D)
    ref = torch.einsum("kmn,bmp,kpq->bnq", g.to_dense().to(D), x, th) + b
    plan = sc.plan(x, g, th)
    fused = {r.name for r in plan.routes if r.fuses_bias}
    assert {"native", "tap_gemm", "tap_im2col"} <= fused
    for r in plan.routes:
        torch.testing.assert_close(sc.convolve(x, g, th, route=r.name, bias=b), ref, msg=r.name)
    with pytest.raises(ValueError, match=r"bias must be a \(4,\) tensor"):
        sc.convolve(x, g, th, bias=torch.zeros(3))


def test_lowrank_on_a_stack_takes_the_whole_factored_route():
    st = Stack([torch.randn(2, 50, 50), torch.randn(2, 50, 50)])
    lr = params.LowRank(4, 64, 64, 4)
    assert sc.plan((8, 50, 64), st, lr).route == "lowrank_heads"


def test_plans_are_keyed_by_form_and_layout():
    g = Grid((8, 8), 3, padding=1)
    x = torch.randn(2, 64, 4)
    a = sc.plan(x, g, params.Grouped(9, 4, 4, 2))
    b = sc.plan(x, g, params.Grouped(9, 4, 4, 4))
    assert a is not b and a is sc.plan(x, g, params.Grouped(9, 4, 4, 2))
    cf = torch.randn(2, 4, 8, 8).flatten(2).transpose(1, 2)  # channels-first strides
    assert sc.plan(cf, g, (9, 4, 4)) is not sc.plan(x, g, (9, 4, 4))


def test_cost_table_defaults_and_errors():
    assert costs.weight("graph") == costs.DEFAULTS["cpu"]["graph"]
    # a device type without an entry of its own uses the CPU's defaults
    assert costs.weight("sparse", "cuda") == costs.DEFAULTS["cpu"]["sparse"]
    with pytest.raises(KeyError, match="no cost weight 'nope'.*graph"):
        costs.weight("nope")


def test_calibration_file_is_read_per_device_type(tmp_path, monkeypatch):
    monkeypatch.setenv("STRUCTCONV_COSTS", str(tmp_path))
    costs.reload()
    try:
        n = 500
        idx = torch.stack([torch.zeros(4 * n, dtype=torch.long), torch.randint(0, n, (4 * n,)),
                           torch.randint(0, n, (4 * n,))])
        sp = Sparse(idx, None, (1, n, n))
        before = sc.plan((1, n, 64), sp, (1, 64, 64)).table()
        costs.save_calibration("cpu", {"sparse": 600.0}, {"why": "test"})
        assert costs.weight("sparse") == 600.0
        # no CUDA entry yet: CUDA uses the defaults, never the CPU's calibration
        assert costs.weight("sparse", "cuda") == costs.DEFAULTS["cpu"]["sparse"]
        costs.save_calibration("cuda", {"sparse": 2.0})
        data = json.loads((tmp_path / "costs.json").read_text())
        assert data["weights"]["cpu"] == {"sparse": 600.0} and data["weights"]["cuda"] == {
            "sparse": 2.0}
        assert costs.weight("sparse") == 600.0 and costs.weight("sparse", "cuda") == 2.0
        # a fresh basis plans with the new weight
        sp2 = Sparse(idx, None, (1, n, n))
        after = {r["route"]: r["cost"] for r in sc.plan((1, n, 64), sp2, (1, 64, 64)).table()}
        b = {r["route"]: r["cost"] for r in before}
        assert after["basis_input"] > b["basis_input"]
        # a corrupt file is ignored, never a crash
        (tmp_path / "costs.json").write_text("{not json")
        costs.reload()
        assert costs.weight("sparse") == costs.DEFAULTS["cpu"]["sparse"]
    finally:
        monkeypatch.delenv("STRUCTCONV_COSTS")
        costs.reload()


def test_calibrate_writes_measured_weights(tmp_path, monkeypatch):
    from structconv.bench.calibrate import MEASURED, calibrate

    monkeypatch.setenv("STRUCTCONV_COSTS", str(tmp_path))
    try:
        out = calibrate(quick=True, repeats=1)
        assert set(out["weights"]) == set(MEASURED)
        assert all(v > 0 for v in out["weights"].values())
        assert costs.weight("graph") == pytest.approx(out["weights"]["graph"])
    finally:
        monkeypatch.delenv("STRUCTCONV_COSTS")
        costs.reload()

"""Smoke and exactness tests of the results' experiment modules (tiny sizes, float64)."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from structconv.experiments import fashion, mixed_heads, routes_models, separability, shift_heads


@pytest.fixture
def f64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# -- fashion: the grid network is the torch network ------------------------------------------
@pytest.mark.parametrize("native", [True, False])
def test_grid_cnn_matches_torch(f64, native):
    torch.manual_seed(0)
    ref = fashion.torch_cnn(channels=(3, 5), side=12, classes=4)
    net = fashion.structconv_cnn(ref, native=native)
    x = torch.randn(3, 1, 12, 12)
    torch.testing.assert_close(net(x), ref(x))
    assert sum(p.numel() for p in net.parameters()) == sum(p.numel() for p in ref.parameters())


# -- shift heads ------------------------------------------------------------------------------
def test_shift_heads_are_causal_shifts(f64):
    """Shift-only heads: y[n] = sum_s x[n - s] V_s O_s (shifts 0..S-1, zero before the start)."""
    torch.manual_seed(1)
    E, H, S, L = 8, 2, 3, 7
    layer = shift_heads.HeadAttention(E, H, S)
    x = torch.randn(2, L, E)
    grid = layer.grid(L)
    th = layer.theta()  # (H + S, E, E); the grid's tap k reads position n - (S - 1) + k
    y = shift_heads.convolve(x, grid, th[H:])
    ref = torch.zeros_like(y)
    for k in range(S):
        s = S - 1 - k
        ref[:, s:] += x[:, : L - s] @ th[H + k]
    torch.testing.assert_close(y, ref)


@pytest.mark.parametrize("variant", shift_heads.VARIANTS)
def test_lm_is_causal(f64, variant):
    torch.manual_seed(2)
    a = argparse.Namespace(context=10, width=8, layers=2, heads=2, shift_kernel=3)
    m = shift_heads.build(variant, 11, a).eval()
    ids = torch.randint(0, 11, (1, 10))
    ids2 = ids.clone()
    ids2[0, 6] = (ids[0, 6] + 1) % 11
    y, y2 = m(ids), m(ids2)
    torch.testing.assert_close(y[:, :6], y2[:, :6])  # the future never leaks
    assert not torch.allclose(y[:, 6:], y2[:, 6:])


def test_rotary_is_relative(f64):
    q, k = torch.randn(1, 1, 1, 6).expand(1, 1, 9, 6), torch.randn(1, 1, 1, 6).expand(1, 1, 9, 6)
    s = shift_heads.rotary(q) @ shift_heads.rotary(k).transpose(-1, -2)  # (1, 1, 9, 9)
    # the score of the same vectors depends only on the offset i - j
    torch.testing.assert_close(torch.diagonal(s[0, 0], 2), torch.diagonal(s[0, 0], 2)[:1].expand(7))
    torch.testing.assert_close(shift_heads.rotary(q).norm(dim=-1), q.norm(dim=-1))


def test_parameter_budgets_equalised():
    a = argparse.Namespace(context=16, width=16, layers=2, heads=2, shift_kernel=4)
    budget = max(sum(p.numel() for p in shift_heads.build(v, 20, a).parameters())
                 for v in shift_heads.VARIANTS)
    for v in shift_heads.VARIANTS:
        ffn = shift_heads.equalised_ffn(v, 20, a, budget)
        n = sum(p.numel() for p in shift_heads.build(v, 20, a, ffn).parameters())
        assert abs(n - budget) <= a.layers * (2 * a.width + 1)  # within one ffn unit per layer


# -- mixed heads: attention heads are GAT, index heads are GCN --------------------------------
def test_attention_heads_match_pyg_gat(f64):
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(3)
    N, F, A, r = 9, 5, 3, 4
    ei = torch.randint(0, N, (2, 30))
    ref = pyg.GATConv(F, r, heads=A, concat=True).double().eval()
    src, dst = ei
    keep = src != dst
    i = torch.arange(N)
    s2, d2 = torch.cat([src[keep], i]), torch.cat([dst[keep], i])
    layer = mixed_heads.HeadsLayer(s2, d2, N, F, r, A, None, True, 0.0).eval()
    with torch.no_grad():
        W = ref.lin.weight.T.reshape(F, A, r)  # PyG: out channel (head, c) from lin's rows
        layer.theta.value.copy_(W.permute(1, 0, 2))
        layer.att_src.copy_(ref.att_src[0])
        layer.att_dst.copy_(ref.att_dst[0])
        layer.bias.copy_(ref.bias)
    x = torch.randn(N, F)
    torch.testing.assert_close(layer(x), ref(x, ei))


def test_index_head_is_gcn(f64):
    from structconv.basis.graph import PowerBasis, gcn

    torch.manual_seed(4)
    N, F, Q = 8, 4, 3
    ei = torch.randint(0, N, (2, 20))
    op = gcn(ei, N).op
    layer = mixed_heads.HeadsLayer(ei[0], ei[1], N, F, Q, 0, PowerBasis(op, (1, 2)), True, 0.0)
    x = torch.randn(N, F)
    S = gcn(ei, N).to_dense()[0]  # (M, N)
    V = layer.theta.value.detach()
    ref = torch.cat([S.T @ x @ V[0], S.T @ S.T @ x @ V[1]], 1) + layer.bias
    torch.testing.assert_close(layer(x), ref)


# -- separability ------------------------------------------------------------------------------
def test_forms_and_counts():
    assert sum(p.numel() for p in separability.make_form("H3", 25, 16, 32).parameters()) == \
        3 * (25 + 16 * 32)
    assert sum(p.numel() for p in separability.make_form("depthwise", 25, 16, 32).parameters()) \
        == 25 * 16 + 16 * 32
    with pytest.raises(ValueError, match="unknown form"):
        separability.make_form("H0", 2, 2, 2)
    net = separability.DigitsCNN("H2")
    assert net(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    assert net.form_parameters() == 2 * (25 + 16 * 32)


def test_separability_quick_run(tmp_path):
    args = argparse.Namespace(model="cnn", dataset=None, data=None, forms="H1,full", seeds=2,
                              epochs=None, lr=None, batch=64, hidden=16, train_size=100,
                              threads=0, plot=None, quick=True, seed=0, out=str(tmp_path))
    assert separability.run(args) == 0
    res = json.loads((tmp_path / "separability-cnn.json").read_text())
    assert set(res["forms"]) == {"H1", "full"}
    assert res["forms"]["H1"]["form_params"] == 25 + 16 * 32
    assert all(0 <= r["test_acc_mean"] <= 100 for r in res["forms"].values())
    assert (tmp_path / "separability-cnn.png").stat().st_size > 1000


# -- routes -------------------------------------------------------------------------------------
def test_routes_time_case_covers_all_routes():
    from structconv.basis.grid import Grid
    from structconv.params import ControlledSeparable

    def make():
        return torch.randn(2, 36, 3), Grid((6, 6), (3, 3), padding=1), ControlledSeparable(
            9, 3, 4, 2)

    r = routes_models.time_case("tiny", make, repeats=1)
    assert {"input_param", "basis_input", "basis_param", "native", "separable_input",
            "separable_basis", "auto"} <= set(r["times"])
    assert r["best"] in r["times"] and r["best"] != "auto"
    assert math.isfinite(r["auto_over_best"]) and r["auto_over_best"] > 0


def test_sparse_input_path_equals_dense(f64):
    torch.manual_seed(5)
    N, F, C = 10, 7, 3
    ei = torch.randint(0, N, (2, 30))
    x = torch.randn(N, F) * (torch.rand(N, F) < 0.3)
    torch.manual_seed(6)
    dense = mixed_heads.HeadsNet(ei, N, F, C, att=2, hops=2, r=4)
    torch.manual_seed(6)
    sparse = mixed_heads.HeadsNet(ei, N, F, C, att=2, hops=2, r=4, sparse=True)
    torch.testing.assert_close(sparse.eval()(x), dense.eval()(x))
    dense.train()
    sparse.train()
    torch.manual_seed(7)
    y1 = dense.conv1(dense.input_dropout(x))
    torch.manual_seed(7)
    y2 = sparse.conv1(sparse.sparse_input(x))  # the same dropout draws, in the same order
    torch.testing.assert_close(y2, y1)

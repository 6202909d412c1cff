"""Smoke and exactness tests of the results' experiment modules (tiny sizes, float64)."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from structconv.experiments import fashion, mixed_heads, routes_models, separability, shift_heads
from structconv.nn.lm import TransformerLM
from tests.conftest import need, stop_at, tiny_idx_images


# -- fashion: the grid network is the torch network ------------------------------------------
@pytest.mark.parametrize("native", [True, False])
def test_grid_cnn_matches_torch(float64, native):
    torch.manual_seed(0)
    ref = fashion.torch_cnn(channels=(3, 5), side=12, classes=4)
    net = fashion.structconv_cnn(ref, native=native)
    x = torch.randn(3, 1, 12, 12)
    torch.testing.assert_close(net(x), ref(x))
    assert sum(p.numel() for p in net.parameters()) == sum(p.numel() for p in ref.parameters())


def _fashion_args(tmp_path, **kw) -> argparse.Namespace:
    a = dict(data=str(tiny_idx_images(tmp_path / "fmnist", 40, 12)), train_size=35, test_size=10,
             epochs=2, batch=16, lr=None, seeds=1, variants="torch,structconv,structconv-shift",
             threads=0, plot=None, quick=False, seed=0, out=str(tmp_path / "out"))
    return argparse.Namespace(**{**a, **kw})


def test_fashion_networks_are_config_arms_that_train_alike(tmp_path, capsys):
    args = _fashion_args(tmp_path)
    assert fashion.run(args) == 0
    res = json.loads((tmp_path / "out" / "fashion.json").read_text())
    rows = res["variants"]
    assert list(rows) == list(fashion.VARIANTS) and res["config"] == "fashion_cnn"
    assert res["train_size"] == 35 and res["test_size"] == 10 and res["epochs"] == 2
    assert res["initial_output_gap"] < 1e-5  # the twins start from the torch draw
    # one locked, resumable engine run per (network, seed), in the sweep's folder
    runs = sorted(p.parent.name for p in (tmp_path / "out").glob("fashion-*/*/result.json"))
    assert runs == sorted(f"{v}-seed-0" for v in fashion.VARIANTS)
    # separate runs of one seed see the same batches: their logged epochs agree
    for v in ("structconv", "structconv-shift"):
        gap = rows[v]["agreement"][0]
        assert gap["train_loss_rel"] < 1e-5 and gap["test_acc_points"] == 0, v
        assert rows[v]["params"] == rows["torch"]["params"] == 20490
    assert [h["epoch"] for h in rows["torch"]["history"]] == [1, 2]
    assert rows["torch"]["history"][0]["train_loss"] != rows["torch"]["history"][1]["train_loss"]
    # another seed draws other weights and another sample: its runs differ from seed 0's
    other = fashion.run(_fashion_args(tmp_path, seed=1, variants="torch"))
    assert other == 0
    one = json.loads((tmp_path / "out" / "fashion.json").read_text())["variants"]["torch"]
    assert one["history"][0]["train_loss"] != rows["torch"]["history"][0]["train_loss"]


def test_fashion_sweep_resumes_an_interrupted_run_and_reads_back(tmp_path, monkeypatch):
    from structconv.training import TrainingInterrupted

    ref = _fashion_args(tmp_path, variants="torch,structconv", out=str(tmp_path / "ref"))
    assert fashion.run(ref) == 0
    want = json.loads((tmp_path / "ref" / "fashion.json").read_text())["variants"]
    args = _fashion_args(tmp_path, variants="torch,structconv")
    with monkeypatch.context() as m:
        stop_at(m, 8)  # the second network, epoch 1, step 2 (3 steps an epoch, 2 epochs)
        with pytest.raises(TrainingInterrupted):
            fashion.run(args)
    assert len(list((tmp_path / "out").glob("fashion-*/*/result.json"))) == 1
    assert fashion.run(args) == 0
    got = json.loads((tmp_path / "out" / "fashion.json").read_text())["variants"]
    for v in want:
        assert got[v]["history"] == [dict(h, seconds=g["seconds"])
                                     for h, g in zip(want[v]["history"], got[v]["history"])]
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("fashion-*/*/result.json")}
    assert fashion.run(args) == 0  # everything finished: read back, nothing trained
    assert {p: p.stat().st_mtime_ns for p in stamp} == stamp


def test_fashion_config_builds_each_network_from_one_draw(float64):
    from structconv.config import ConfigError, load_config
    from structconv.data.registry import ImageData
    from structconv.models.build import build_model

    x = torch.randn(6, 1, 12, 12)
    data = ImageData("toy", {"train": (x, torch.zeros(6, dtype=torch.long))}, 4)
    nets = {}
    for v in fashion.VARIANTS:
        cfg = load_config(fashion.CONFIG, [f'model.twin.network="{v}"',
                                           "model.twin.channels=[3, 5]", 'model.dtype="float64"'])
        torch.manual_seed(0)
        nets[v] = build_model(cfg, data)
    assert type(nets["torch"][0]) is torch.nn.Conv2d and type(nets["structconv"][0]) is not \
        torch.nn.Conv2d
    for v in ("structconv", "structconv-shift"):
        torch.testing.assert_close(nets[v](x), nets["torch"](x))
    assert nets["structconv"][0].native and not nets["structconv-shift"][0].native
    for bad, msg in (('model.twin.network="jax"', "network must be one of"),
                     ("model.twin.channels=[3]", "channels must be two ints"),
                     ("model.twin.size=3", "unknown key 'size'")):
        with pytest.raises(ConfigError, match=msg):
            load_config(fashion.CONFIG, [bad])


# -- shift heads ------------------------------------------------------------------------------
def test_window_losses_score_the_right_positions(float64):
    torch.manual_seed(1)
    m = TransformerLM(11, 8, 1, 2, "alibi").double().eval()
    ids = torch.randint(0, 11, (41,))
    L = 8
    # non-overlapping: every position of each whole window once
    want = torch.cat([torch.nn.functional.cross_entropy(m(ids[s:s + L][None])[0],
                                                        ids[s + 1:s + L + 1], reduction="none")
                      for s in range(0, 40 - L + 1, L)]).mean().detach()
    assert math.isclose(shift_heads.window_loss(m, ids, L), float(want), rel_tol=1e-12)
    # sliding: windows advanced by 4, only their last 4 positions scored
    want = torch.cat([torch.nn.functional.cross_entropy(m(ids[s:s + L][None])[0, -4:],
                                                        ids[s + L - 3:s + L + 1],
                                                        reduction="none")
                      for s in range(0, 40 - L + 1, 4)]).mean().detach()
    assert math.isclose(shift_heads.window_loss(m, ids, L, 4), float(want), rel_tol=1e-12)


def test_shift_likeness_of_uniform_attention(float64):
    # zero queries and keys: every head attends uniformly to the past, so each offset gets
    # the mean of 1/(n+1) over the measured queries
    m = TransformerLM(11, 8, 2, 2, "none").double()
    with torch.no_grad():
        for b in m.blocks:
            b.attn.in_proj.weight[:16].zero_()
            b.attn.in_proj.bias[:16].zero_()
    a = argparse.Namespace(context=24)
    got = shift_heads.shift_likeness(m, torch.randint(0, 11, (500,)), a, windows=3)
    want = float(torch.tensor([1 / (n + 1) for n in range(16, 24)]).mean())
    assert len(got) == 2 and all(len(layer) == 2 for layer in got)
    for layer in got:
        for h in layer:
            assert math.isclose(h["mass"], want, rel_tol=1e-9) and 0 <= h["offset"] <= 16


def test_shift_heads_recipe_runs_and_resumes(tmp_path):
    import subprocess
    import sys

    need("tinyshakespeare")  # the subprocess finds it the same way, from the same environment
    cmd = [sys.executable, "-m", "structconv.cli", "reproduce", "shift-heads", "--quick",
           "--kinds", "none,learned,shift", "--long-kinds", "shift", "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "shift_heads.json").read_text())
    assert set(res["kinds"]) == {"none", "learned", "shift"} and len(res["long_runs"]) == 1
    assert res["kinds"]["learned"]["extrapolation"]["nonoverlap"].keys() == {"1"}
    assert len(res["kinds"]["shift"]["extrapolation"]["sliding"]) == 5
    runs = tmp_path / "shift_heads_runs"
    # every arm a run directory of the shipped config with its overrides, trained by the engine
    for name in ("shift-s0-6", "shift-s0-8", "learned-s0-6"):
        assert (runs / name / "result.json").is_file() and (runs / name / "analysis.json").is_file()
    cfg = json.loads((runs / "learned-s0-6" / "config.json").read_text())
    assert cfg["name"] == "transformer_shakespeare" and cfg["model"]["lm"]["position"] == "learned"
    assert cfg["train"]["max_steps"] == 6 and cfg["train"]["schedule"] == "cosine"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # resumes: no training
    assert r.returncode == 0 and "seed 0 (6 steps)" not in r.stdout
    again = json.loads((tmp_path / "shift_heads.json").read_text())
    assert again["kinds"]["shift"]["val_loss"] == res["kinds"]["shift"]["val_loss"]
    # a run directory made with other options is refused, not read back
    r = subprocess.run(cmd + ["--width", "24"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "another config" in r.stderr and "model.lm.width" in r.stderr


def test_an_interrupted_shift_heads_sweep_resumes_to_the_same_numbers(monkeypatch, tmp_path):
    from structconv.cli import main

    need("tinyshakespeare")
    argv = ["reproduce", "shift-heads", "--quick", "--kinds", "none,shift", "--threads", "1"]
    assert main([*argv, "--out", str(tmp_path / "ref")]) == 0
    with monkeypatch.context() as m:
        stop_at(m, 6 + 2)  # none's 6 steps, then shift's epoch 1, step 2 of 3
        assert main([*argv, "--out", str(tmp_path / "run")]) == 130
    cut = tmp_path / "run" / "shift_heads_runs" / "shift-s0-6"
    assert (cut / "checkpoint.json").is_file() and not (cut / "result.json").exists()
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    ref, got = (json.loads((tmp_path / d / "shift_heads.json").read_text())
                for d in ("ref", "run"))
    for r, g in zip(ref["runs"], got["runs"]):
        assert g["curve"] == r["curve"] and g["extrapolation"] == r["extrapolation"]
        assert g["shift_likeness"] == r["shift_likeness"]


# -- mixed heads: attention heads are GAT, index heads are GCN --------------------------------
def test_attention_heads_match_pyg_gat(float64):
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


def test_index_head_is_gcn(float64):
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
def test_forms_are_config_overrides_with_their_counts():
    from structconv.config import load_config
    from structconv.models.build import build_model
    from structconv.training.tasks import load_data

    counts = {"H3": 3 * (25 + 16 * 32), "depthwise": 25 * 16 + 16 * 32, "full": 25 * 16 * 32}
    data = None
    for form, count in counts.items():
        cfg = load_config(separability.CONFIGS["cnn"],
                          separability.form_overrides("cnn", form))
        data = data or load_data(cfg)
        net = build_model(cfg, data)
        assert separability.form_parameters("cnn", net) == count, form
        assert net(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    assert separability.form_overrides("rgcn", "H5") == ['model.graph.param="separable"',
                                                         "model.graph.bases=5"]
    for bad in ("H0", "H", "dense"):
        with pytest.raises(ValueError, match="unknown form"):
            separability.form_overrides("cnn", bad)


def _separability_args(tmp_path, **kw) -> argparse.Namespace:
    a = dict(model="cnn", dataset=None, data=None, forms="H1,full", seeds=1, epochs=1, lr=None,
             batch=256, hidden=16, train_size=100, threads=0, plot=None, quick=True, seed=0,
             out=str(tmp_path))
    return argparse.Namespace(**{**a, **kw})


def test_separability_quick_run_trains_through_the_engine_and_reads_back(tmp_path, capsys):
    assert separability.run(_separability_args(tmp_path)) == 0
    res = json.loads((tmp_path / "separability-cnn.json").read_text())
    assert set(res["forms"]) == {"H1", "full"}
    assert res["forms"]["H1"]["form_params"] == 25 + 16 * 32
    assert res["forms"]["full"]["params"] == 18378  # DigitsCNN's count: the same network
    assert res["config"] == "separability_cnn" and res["epochs"] == 1
    assert all(0 <= r["test_acc_mean"] <= 100 for r in res["forms"].values())
    assert (tmp_path / "separability-cnn.png").stat().st_size > 1000
    # one engine run directory per (form, seed); a second call reads them back
    runs = sorted(p.parent.name for p in tmp_path.glob("separability-cnn-digits-*/*/result.json"))
    assert runs == ["H1-seed-0", "full-seed-0"]
    stamp = {p: p.stat().st_mtime_ns for p in tmp_path.glob("separability-cnn-*/*/result.json")}
    assert separability.run(_separability_args(tmp_path)) == 0
    assert {p: p.stat().st_mtime_ns for p in stamp} == stamp
    again = json.loads((tmp_path / "separability-cnn.json").read_text())
    assert again["forms"]["H1"]["runs"] == res["forms"]["H1"]["runs"]


def test_separability_rgcn_arm_is_the_rgcn_config_with_the_form(tmp_path):
    args = _separability_args(tmp_path, model="rgcn", data=str(need("aifb")),
                              forms="H2,depthwise")
    assert separability.run(args) == 0
    res = json.loads((tmp_path / "separability-rgcn.json").read_text())
    assert res["config"] == "rgcn_entities" and res["dataset"] == "aifb"
    # the two relational convolutions' counts of the recipe's former network (docs/results.md)
    assert {f: r["form_params"] for f, r in res["forms"].items()} == \
        {"H2": 265_608, "depthwise": 879_714}
    assert all(0 <= r["runs"][0]["train_acc"] <= 100 for r in res["forms"].values())


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


def test_sparse_input_path_equals_dense(float64):
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

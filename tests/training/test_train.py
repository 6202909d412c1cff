"""Declarative configs, the trainer, resume after a kill, and DDP equivalence (2 processes)."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from structconv import params as P
from structconv.config import (
    ConfigError,
    apply_overrides,
    load_config,
    parse_config,
    shipped_configs,
)
from structconv.models import build_model
from structconv.training import TrainingError, load_data, task_for, train
from tests.conftest import CLI, ENV, absent, metric_rows, run_cli


def _absent(cfg) -> str | None:
    return absent(cfg["data"]["name"].split(":")[0])


TINY = """
name = "tiny"
[data]
name = "karate"
[[model.layers]]
basis = "gcn"
channels = 8
activation = "relu"
[[model.layers]]
basis = { kind = "chebyshev", K = 2 }
param = "separable"
H = 2
channels = "classes"
[train]
epochs = 4
"""


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_every_shipped_config_builds_and_runs_forward(name):
    cfg = load_config(name)
    if _absent(cfg):
        pytest.skip(_absent(cfg))
    if cfg["data"]["name"] in ("mnist", "fashion-mnist", "tinyshakespeare"):
        cfg["data"]["options"]["limit"] = 20000
    if cfg["data"]["name"] == "hiv":
        cfg["data"]["options"]["limit"] = 300
    if cfg["data"]["name"] == "depo":
        cfg["data"]["options"]["eval_per_k"] = 4
    data = load_data(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, data).eval()
    if data.task == "link":  # a link predictor scores every entity as the tail of a query
        with torch.no_grad():
            s = model.score_tails(data.valid[:4, 0], data.valid[:4, 1])
        assert s.shape == (4, data.num_entities) and torch.isfinite(s).all()
        return
    cfg["data"]["eval_batch_size"] = 4
    task = task_for(cfg, data)
    if data.task == "routing":  # greedy tours of two random instances
        with torch.no_grad():
            tours, ll = model(torch.rand(2, data.n, 2), "greedy")
        assert (tours.sort(1).values == torch.arange(data.n)).all() and torch.isfinite(ll).all()
        return
    if data.task == "series":  # scored by MASE and sMAPE over the validation origins
        val = task.validate(model, 1, True)
        assert val and all(math.isfinite(v) for v in val.values())
        return
    if data.task == "depo":  # greedy answers of the fixed sequences, per number of hops
        res = task.evaluate(model, "val")
        assert res["n"] == 4 * data.spec.max_hops and 0 <= res["mean_acc"] <= 1
        return
    if data.task == "graph":  # whole graphs of the validation split, scored per graph
        res = task.evaluate(model, "val")
        assert res["n"] > 0 and math.isfinite(res["loss"])
        return
    # a config that keeps its last epoch may have no validation split (R-GCN's): its test one
    split = "test" if data.task == "node" and not bool(data.masks["val"].any()) else "val"
    inputs, targets = next(task.eval_batches(split))
    with torch.no_grad():
        loss, ok = task.losses(model, inputs, targets, "cpu", torch.float32)
    assert torch.isfinite(loss).all() and loss.numel() == ok.numel() > 0


def test_param_forms_from_config_have_contract_counts():
    cfg = parse_config(TINY)
    data = load_data(cfg)
    model = build_model(cfg, data)
    conv = model.blocks[1].conv
    assert isinstance(conv.param, P.ControlledSeparable)
    # chebyshev K=2, H=2, P=8, Q=2 classes: H*(K + P*Q)
    assert sum(p.numel() for p in conv.param.parameters()) == 2 * (2 + 8 * 2)
    for form, extra, count in (("grouped", {"groups": 2}, 1 * 34 * 8 // 2),
                               ("depthwise", {}, 34 + 34 * 8), ("lowrank", {"rank": 3},
                                                                 3 * (34 + 8)),
                               ("full", {}, 34 * 8)):
        c = parse_config(TINY)
        c["model"]["layers"][0].update({"param": form, **extra})
        layer = build_model(c, data).blocks[0].conv
        assert sum(p.numel() for p in layer.param.parameters()) == count


def test_overrides():
    cfg = parse_config(TINY)
    out = apply_overrides(cfg, ["train.epochs=7", "train.lr=1", "model.layers.0.channels=5",
                                "data.options.seed=3", 'model.layers.1.basis.kind="gcn"'])
    assert out["train"]["epochs"] == 7 and out["train"]["lr"] == 1.0
    assert isinstance(out["train"]["lr"], float)
    assert out["model"]["layers"][0]["channels"] == 5 and out["data"]["options"]["seed"] == 3
    assert out["model"]["layers"][1]["basis"]["kind"] == "gcn"
    assert cfg["train"]["epochs"] == 4  # the input is not modified
    for bad, msg in (("train.epochs", "expected key=value"), ("nope.x=1", "unknown section"),
                     ("train.epoch=3", "unknown key 'train.epoch'"),
                     ("train.lr=fast", "expects a number"),
                     ("model.layers.9.channels=3", "not an index below 2"),
                     ("data.x.y=1", "no table data.x")):
        with pytest.raises(ConfigError, match=msg):
            apply_overrides(cfg, [bad])


@settings(max_examples=25, deadline=None)
@given(st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False,
                                                       width=32)))
def test_override_values_roundtrip(v):
    cfg = parse_config(TINY)
    out = apply_overrides(cfg, [f"train.weight_decay={v!r}"])
    assert out["train"]["weight_decay"] == float(v)


def test_bad_configs_name_the_key():
    cases = [("x = 1", "unknown top-level key 'x'"),
             ("[train]\nepochs = 0", "train.epochs must be >= 1"),
             ("[model]\nlayers = []", "model.layers must be a non-empty list"),
             ('[[model.layers]]\nbasis = "hexagon"', "unknown basis kind 'hexagon'"),
             ('[[model.layers]]\nbasis = "gcn"\nparam = "diagonal"', "unknown param 'diagonal'"),
             ('[[model.layers]]\nbasis = "gcn"\nactivation = "swish"', "unknown activation"),
             ("[[model.layers]]\nchannels = 3", "a conv layer needs a basis"),
             ("[train\n", "invalid TOML")]
    for text, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            parse_config(text)
    # a grid basis on a graph dataset fails when the model is built, naming the layer
    cfg = parse_config('[[model.layers]]\nbasis = "grid"\n[data]\nname = "karate"')
    with pytest.raises(ConfigError, match="model.layers.0.basis: a grid basis needs"):
        build_model(cfg, load_data(cfg))


def test_train_writes_run_directory_and_early_stops(tmp_path):
    cfg = apply_overrides(parse_config(TINY), ["train.epochs=40", "train.patience=2",
                                               "train.lr=0.05", "train.monitor=\"val_loss\""])
    res = train(cfg, tmp_path / "run")
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert res["early_stopped"] and len(rows) < 40 and res["epochs"] == len(rows)
    assert len((run / "metrics.csv").read_text().splitlines()) == len(rows) + 1
    # early stopping on validation loss: best epoch is where val loss was lowest
    best = min(rows, key=lambda r: r["val_loss"])["epoch"]
    assert res["best_epoch"] == best and rows[-1]["epoch"] == best + 2
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((run / "result.json").read_text())["best_epoch"] == best
    assert set(load_file(run / "best.safetensors"))
    with pytest.raises(TrainingError, match="already holds a run"):
        train(cfg, run)


def test_nan_loss_stops_without_half_written_checkpoint(tmp_path):
    cfg = apply_overrides(parse_config(TINY), ['train.optimizer="sgd"', "train.lr=1e30",
                                               "train.momentum=0.0", "train.epochs=30"])
    with pytest.raises(TrainingError, match=r"loss is (nan|inf) at epoch \d+"):
        train(cfg, tmp_path / "run")
    run = tmp_path / "run"
    if (run / "checkpoint.json").exists():
        # whatever was committed is complete and loadable
        from structconv.training.checkpoint import load_checkpoint

        load_checkpoint(run)
    assert not list(run.glob("*.tmp")) and not list(run.glob(".*.tmp"))


def _final(run: Path):
    return metric_rows(run), load_file(run / "best.safetensors")


def test_resume_after_kill_matches_uninterrupted_run(tmp_path):
    # dropout makes the run depend on the restored RNG state, Adam on the optimizer state
    over = ["train.epochs=25", "model.layers.0.dropout=0.5", "train.checkpoint_every=1"]
    cfg_file = tmp_path / "tiny.toml"
    cfg_file.write_text(TINY)
    run = tmp_path / "run"
    proc = subprocess.Popen(CLI + ["train", "--config", str(cfg_file), *over, "--out", str(run)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_at = None
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            try:
                epoch = json.loads((run / "checkpoint.json").read_text())["epoch"]
            except (OSError, ValueError, KeyError):
                epoch = 0
            if epoch >= 2:
                proc.send_signal(signal.SIGKILL)
                killed_at = epoch
                break
            time.sleep(0.005)
    finally:
        proc.wait()
    assert killed_at is not None and killed_at < 25, "the run ended before it could be killed"
    assert not (run / "result.json").exists()
    r = run_cli("train", "--resume", run)
    assert r.returncode == 0, r.stderr
    # the uninterrupted reference, in this process on one thread as the subprocesses
    cfg = apply_overrides(parse_config(TINY), over)
    cfg["name"] = "tiny"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(cfg, tmp_path / "ref")
    finally:
        torch.set_num_threads(threads)
    rows, best = _final(run)
    ref_rows, ref_best = _final(tmp_path / "ref")
    assert rows == ref_rows
    assert best.keys() == ref_best.keys()
    assert all(torch.equal(best[k], ref_best[k]) for k in best)
    assert json.loads((run / "result.json").read_text())["test_acc"] == \
        json.loads((tmp_path / "ref" / "result.json").read_text())["test_acc"]


def test_ddp_two_processes_match_single_process(tmp_path):
    over = ["train.epochs=2", "data.options.limit=300", "model.dtype=\"float64\"",
            "data.batch_size=50", "model.layers.1.pool.kind=\"max\""]
    r = run_cli("train", "--config", "cnn_digits", *over, "--out", tmp_path / "ddp", "--nproc", "2")
    assert r.returncode == 0, r.stderr
    cfg = apply_overrides(load_config("cnn_digits"), over)
    cfg["name"] = "cnn_digits"
    single = train(cfg, tmp_path / "one")
    ddp = json.loads((tmp_path / "ddp" / "result.json").read_text())
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    assert not (tmp_path / "ddp" / ".lock").exists()  # a finished run holds no lock
    a = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    for x, y in zip(a, b, strict=True):
        for k in ("train_loss", "val_loss", "train_acc", "val_acc"):
            assert x[k] == pytest.approx(y[k], rel=1e-10, abs=1e-12), (k, x, y)
    wa, wb = load_file(tmp_path / "ddp" / "best.safetensors"), \
        load_file(tmp_path / "one" / "best.safetensors")
    assert all(torch.allclose(wa[k], wb[k], rtol=1e-9, atol=1e-12) for k in wa)


def test_sparse_input_dropout_matches_dropout_semantics():
    from structconv.nn import sparse_dropout as _dropout

    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 200, generator=g, dtype=torch.float64)
    x = (x * (torch.rand(300, 200, generator=g) < 0.05)).requires_grad_(True)
    torch.manual_seed(1)
    y = _dropout(x, 0.3, True)
    nz, kept = x != 0, y != 0
    assert not (kept & ~nz).any()  # zeros stay zero
    assert torch.allclose(y[kept], x[kept] / 0.7)  # survivors scaled by 1 / (1 - p)
    assert abs(kept.sum().item() / nz.sum().item() - 0.7) < 0.05
    y.sum().backward()
    assert torch.allclose(x.grad, kept.double() / 0.7)
    assert _dropout(x, 0.3, False) is x
    dense = torch.randn(200, 200, generator=g)
    assert abs((_dropout(dense, 0.3, True) == 0).double().mean().item() - 0.3) < 0.02

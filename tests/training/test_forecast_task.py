"""Forecasting on the training loop: a shipped forecast config trains and reports MASE / sMAPE,
the loop's steps are the recipe's hand-written loop's (same windows, schedule, clipping), a run
stopped inside an epoch resumes exactly, and configs that cannot train are refused by name."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import structconv as sc
from structconv.cli import main
from structconv.config import ConfigError, load_config
from structconv.data import load_dataset
from structconv.data.series import windows
from structconv.models.forecast import Forecaster, forecast_at
from structconv.training.checkpoint import load_weights
from structconv.training.tasks.forecast import Split, mase, mase_scale
from tests.conftest import metric_rows, stop_and_resume

pytest.importorskip("statsmodels")

TINY = ["train.max_steps=10", "train.epochs=3", "data.batches_per_epoch=4", "data.batch_size=8",
        "model.forecast.width=8", "model.forecast.heads=2", "train.checkpoint_seconds=1e9"]


def _cfg(*over: str) -> dict:
    cfg = load_config("forecast_sunspots", [*TINY, *over])
    cfg["name"] = "forecast_sunspots"
    return cfg


def test_a_forecast_config_trains_and_reports_its_metrics(tmp_path):
    res = sc.train(_cfg(), tmp_path / "run")
    assert res["epochs"] == 3 and res["dataset"] == "sunspots"
    assert len(res["test_mase_by_h"]) == len(res["test_smape_by_h"]) == 11
    assert res["test_mase"] == pytest.approx(np.mean(res["test_mase_by_h"]))
    assert res["test_origins"] == 52 and res["val_mase"] > 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # epochs of 4 steps under a budget of 10: the last epoch is cut at step 10
    assert [r["step"] for r in rows] == [4, 8, 10]
    assert res["val_mase"] == min(r["val_mase"] for r in rows)
    assert res["best_epoch"] == 1 + min(range(3), key=lambda i: rows[i]["val_mase"])


def test_the_command_line_trains_and_evaluates_a_shipped_forecast_config(tmp_path, capsys):
    rc = main(["train", "--config", "forecast_elec_equip", *TINY, "--out", str(tmp_path / "r"),
               "--no-progress"])
    assert rc in (0, None)
    out = capsys.readouterr().out
    assert "test mase" in out and "val smape" in out
    assert main(["eval", str(tmp_path / "r"), "--split", "test"]) == 0
    assert "mase" in capsys.readouterr().out
    res = json.loads((tmp_path / "r" / "result.json").read_text())
    ev = json.loads((tmp_path / "r" / "eval-test.json").read_text())
    assert ev["mase"] == res["test_mase"] and ev["n"] == res["test_origins"]


def _hand_written(cfg: dict) -> tuple[float, dict]:
    """The recipe's loop before it ran on the engine: Adam, cosine decay to a tenth, clipping
    at 1, windows from a generator seeded 10,000 + seed, the best validation MASE kept."""
    f, t, d = cfg["model"]["forecast"], cfg["train"], cfg["data"]
    data = load_dataset("sunspots")
    sp = Split(data.length, f["context"], f["horizon"], 0.1, 0.2)
    scale = mase_scale(data.values[:sp.val_start], data.period)
    torch.manual_seed(cfg["seed"])
    model = Forecaster(f["context"], f["horizon"], f["form"], width=f["width"], heads=f["heads"],
                       periods=[data.period])
    opt = torch.optim.Adam(model.parameters(), lr=t["lr"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, t["max_steps"],
                                                       eta_min=t["lr"] * t["min_lr_ratio"])
    gen = torch.Generator().manual_seed(10_000 + cfg["seed"])
    train = torch.tensor(sp.train)
    best, best_state = math.inf, None
    for step in range(t["max_steps"]):
        pick = train[torch.randint(len(train), (d["batch_size"],), generator=gen)]
        past, target = windows(data.values, pick, sp.context, sp.horizon)
        out, loc, s = model.scaled(past)
        loss = F.l1_loss(out, ((target - loc) / s).to(out.dtype))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % d["batches_per_epoch"] == 0 or step + 1 == t["max_steps"]:
            fc = forecast_at(model, data.values, sp.val)
            _, actual = windows(data.values, sp.val, sp.context, sp.horizon)
            v = float(np.mean(mase(fc, actual, scale).tolist()))
            if v < best:
                best, best_state = v, {k: x.clone() for k, x in model.state_dict().items()}
    return best, best_state


@pytest.mark.parametrize("form", ["content", "period"])
def test_the_loop_trains_as_the_recipes_hand_written_loop(tmp_path, form):
    cfg = _cfg(f"model.forecast.form={form}", "seed=3")
    res = sc.train(cfg, tmp_path / "run")
    best, state = _hand_written(cfg)
    # the same windows, steps and selection; the schedule's factors are computed in closed form
    # (torch's scheduler multiplies its way there), so weights agree to float32 rounding
    assert res["val_mase"] == pytest.approx(best, rel=1e-5)
    got = load_weights(tmp_path / "run" / "best.safetensors")
    for k, v in state.items():
        torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("k,where", [(3, "epoch 1, step 3/4"), (6, "epoch 2, step 2/4")])
def test_a_forecast_run_stopped_mid_epoch_resumes_exactly(monkeypatch, tmp_path, k, where):
    cfg = _cfg("model.forecast.form=position")
    # the resume is as a new process's: the window draws are replayed
    ref, run, message = stop_and_resume(monkeypatch, cfg, tmp_path, k)
    assert where in message
    assert metric_rows(run) == metric_rows(ref)
    a = load_weights(run / "best.safetensors")
    b = load_weights(ref / "best.safetensors")
    assert all(torch.equal(a[n], b[n]) for n in a)
    ra, rb = (json.loads((p / "result.json").read_text()) for p in (run, ref))
    assert ra["test_mase_by_h"] == rb["test_mase_by_h"]


@pytest.mark.parametrize("over,named", [
    (["model.forecast.context=0"], "model.forecast.context"),
    (["model.forecast.form=fourier"], "model.forecast.form must be content"),
    (["model.forecast.heads=3"], "divisible by heads=3"),
    (["train.monitor=val_acc"], "monitored by val_mase or val_smape"),
    (["train.min_lr_ratio=1.5"], "train.min_lr_ratio"),
    (["model.forecast.size=3"], "unknown key 'size'"),
])
def test_bad_forecast_configs_are_named(over, named):
    with pytest.raises(ConfigError, match=named):
        load_config("forecast_sunspots", over)


def test_data_and_models_that_do_not_fit_are_refused_by_name(tmp_path):
    for over, named in ((["data.name=digits"], "forecasts a series"),
                        (["model.forecast.context=300"], "no training window"),
                        (["data.options.val=0.6", "data.options.test=0.5"],
                         r"val \+ test below 1")):
        with pytest.raises(ValueError, match=named):
            sc.train(_cfg(*over), tmp_path / "x")
    with pytest.raises(ConfigError, match=r"describe the model with a \[model.forecast\]"):
        sc.train("gcn_karate", tmp_path / "y", overrides=["data.name=sunspots"])

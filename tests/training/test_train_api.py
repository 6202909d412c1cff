"""``sc.train(config, out=...)``: the public entry point to train from a config (issue 29)."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest

import structconv as sc
from structconv.config import ConfigError
from structconv.training import TrainingError, default_run_dir

KARATE = {"name": "karate_gcn",
          "data": {"name": "karate"},
          "model": {"layers": [{"basis": "gcn", "channels": 8, "activation": "relu"},
                               {"basis": "gcn", "channels": "classes"}]},
          "train": {"lr": 0.01, "epochs": 3}}


def test_sc_train_is_the_trainer_whatever_was_imported_first():
    mod = importlib.import_module("structconv.training")  # everything that trains
    importlib.import_module("structconv.training.run")
    assert sc.train is mod.train and inspect.isfunction(sc.train)  # a plain function
    assert "train" in sc.__all__
    params = inspect.signature(sc.train).parameters
    assert list(params)[:2] == ["config", "out"] and "overrides" in params


def test_dict_config_with_seed_returns_result_and_run(tmp_path):
    out = tmp_path / "run"
    res = sc.train(KARATE, out=out, seed=3)
    assert res["run"] == str(out) and res["epochs"] == 3 and res["dataset"] == "karate"
    saved = json.loads((out / "config.json").read_text())
    assert saved["seed"] == 3 and saved["train"]["epochs"] == 3
    assert saved["train"]["optimizer"] == "adam"        # merged over the defaults
    assert json.loads((out / "result.json").read_text())["test_acc"] == res["test_acc"]
    assert KARATE["train"]["epochs"] == 3 and "seed" not in KARATE  # the input is not changed


def test_shipped_name_with_overrides_and_resume(tmp_path):
    out = tmp_path / "run"
    part = sc.train("gcn_karate", out=out, overrides=["train.epochs=2"], stop_after=1)
    assert part == {"interrupted": True, "epoch": 1, "run": str(out)}
    whole = sc.train(out=out, resume=True)
    again = sc.train("gcn_karate", out=tmp_path / "again", overrides=["train.epochs=2"])
    assert whole["epochs"] == again["epochs"] == 2
    assert whole["test_acc"] == again["test_acc"]       # resumed = uninterrupted
    assert whole["val_loss"] == pytest.approx(again["val_loss"], abs=0, rel=1e-12)


def test_bad_calls_are_named(tmp_path):
    with pytest.raises(TrainingError, match="needs a config"):
        sc.train(out=tmp_path / "a")
    with pytest.raises(TrainingError, match="give no config"):
        sc.train(KARATE, out=tmp_path / "b", resume=True)
    with pytest.raises(TrainingError, match="needs out="):
        sc.train(resume=True)
    with pytest.raises(ConfigError, match="unknown key train.epoch"):
        sc.train({**KARATE, "train": {"epoch": 3}}, out=tmp_path / "c")
    with pytest.raises(ConfigError, match="got int"):
        sc.train(42, out=tmp_path / "d")
    with pytest.raises(ConfigError, match="unknown config 'no_such_config'"):
        sc.train("no_such_config", out=tmp_path / "e")
    assert not any(tmp_path.iterdir())                  # nothing written for a refused call


def test_default_run_dir_is_one_safe_name():
    p = default_run_dir("../../etc/x y")
    assert p.parent.name == "runs" and "/" not in p.name and not p.name.startswith(".")
    assert p.name.startswith("_.._etc_x_y-")

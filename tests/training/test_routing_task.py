"""Routing on the training loop: a shipped TSP config trains and reports its gaps, the loop's
steps are the recipe's hand-written REINFORCE loop's, a run stopped inside an epoch (under the
exponential baseline and under the rollout baseline) resumes exactly, and configs that cannot
train are refused by name."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import structconv as sc
from structconv.cli import main
from structconv.config import ConfigError, load_config
from structconv.data.tsp import tour_length, uniform_instances
from structconv.models.routing import AttentionModel
from structconv.seeds import epoch_generator
from structconv.training.checkpoint import load_weights
from structconv.training.tasks.routing import baseline_update, greedy_lengths
from tests.conftest import metric_rows, stop_and_resume

pytest.importorskip("elkai")
pytest.importorskip("scipy")

TINY = ["train.epochs=2", "data.batches_per_epoch=3", "data.batch_size=8",
        "model.routing.width=8", "model.routing.heads=2", "model.routing.layers=1",
        "model.routing.ffn=16", "train.routing.bl_eval=16", "train.routing.alpha=0.5",
        "data.options.n=6", "data.options.val_size=5", "data.options.test_size=6",
        "data.options.lkh_runs=1", "train.checkpoint_seconds=1e9"]


def _cfg(tmp_path, *over: str) -> dict:
    cfg = load_config("tsp_20", [*TINY, f'data.options.cache="{tmp_path / "lkh"}"', *over])
    cfg["name"] = "tsp_20"
    return cfg


def test_a_tsp_config_trains_and_reports_its_gaps(tmp_path):
    res = sc.train(_cfg(tmp_path), tmp_path / "run")
    assert res["epochs"] == 2 and res["best_epoch"] == 0  # monitor "none": the last weights
    assert res["test_instances"] == 6 and len(res["test_tours"]) == 4
    assert res["test_gap"] == pytest.approx(100 * (res["test_length"] / res["test_lkh"] - 1))
    assert res["test_gap"] > 0  # LKH's tours of 6 cities are optimal
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [set(r) >= {"val_gap", "bl_p", "bl_replaced", "train_loss"} for r in rows] == [True] * 2
    assert rows[-1]["val_gap"] == pytest.approx(res["val_gap"])
    assert sorted(p.name for p in (tmp_path / "lkh").iterdir()) == [
        "tsp6-test-1234-6.safetensors", "tsp6-val-4321-5.safetensors"]
    assert main(["eval", str(tmp_path / "run"), "--split", "test"]) == 0
    ev = json.loads((tmp_path / "run" / "eval-test.json").read_text())
    assert ev["gap"] == res["test_gap"] and ev["n"] == 6
    assert main(["eval", str(tmp_path / "run"), "--split", "train"]) == 2


def _hand_written(cfg: dict) -> tuple[AttentionModel, list[float]]:
    """The recipe's loop before it ran on the engine: epoch e's instances from the generator
    of (seed, e - 1), an exponential baseline in the first epoch, then the greedy rollout of
    a frozen copy, replaced after a one-sided paired t-test; clipping at 1."""
    m, t, d, rt = (cfg["model"]["routing"], cfg["train"], cfg["data"],
                   cfg["train"]["routing"])
    n = d["options"]["n"]
    torch.manual_seed(cfg["seed"])
    model = AttentionModel(m["width"], m["heads"], m["layers"], m["ffn"], m["clip"])
    baseline = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=t["lr"])
    ema, bl_seed, bl_costs, losses = None, 0, None, []
    for epoch in range(t["epochs"]):
        gen = epoch_generator(cfg["seed"], epoch)
        for _ in range(d["batches_per_epoch"]):
            coords = torch.rand(d["batch_size"], n, 2, generator=gen)
            tours, ll = model(coords, "sample")
            cost = tour_length(coords, tours)
            if epoch < rt["warmup_epochs"]:
                ema = float(cost.mean()) if ema is None else 0.8 * ema + 0.2 * float(cost.mean())
                bl = torch.full_like(cost, ema)
            else:
                bl = greedy_lengths(baseline, coords).to(cost.dtype)
            loss = ((cost - bl) * ll).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
        bl_coords = uniform_instances(rt["bl_eval"], n, 100_000 + bl_seed)
        bl_costs = greedy_lengths(baseline, bl_coords) if bl_costs is None else bl_costs
        if baseline_update(greedy_lengths(model, bl_coords), bl_costs, rt["alpha"])[0]:
            baseline.load_state_dict(model.state_dict())
            bl_seed, bl_costs = epoch + 1, None
    return model, losses


def test_the_loop_trains_as_the_recipes_hand_written_loop(tmp_path):
    cfg = _cfg(tmp_path, "seed=2", "train.epochs=3")
    sc.train(cfg, tmp_path / "run")
    model, losses = _hand_written(cfg)
    got = load_weights(tmp_path / "run" / "best.safetensors")
    assert all(torch.equal(got[k], v) for k, v in model.state_dict().items())
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for e, r in enumerate(rows):
        assert r["train_loss"] == pytest.approx(sum(losses[3 * e:3 * e + 3]) / 3, rel=1e-6)


@pytest.mark.parametrize("k,where", [(2, "epoch 1, step 2/3"), (3, "the end of epoch 1"),
                                     (5, "epoch 2, step 2/3")])
def test_a_tsp_run_stopped_anywhere_resumes_exactly(monkeypatch, tmp_path, k, where):
    cfg = _cfg(tmp_path, "train.epochs=3")
    ref, run, message = stop_and_resume(monkeypatch, cfg, tmp_path, k)
    assert where in message
    assert metric_rows(run) == metric_rows(ref)
    a, b = load_weights(run / "best.safetensors"), load_weights(ref / "best.safetensors")
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("over,named", [
    (["train.monitor=val_acc"], "monitored by none or val_gap or val_length"),
    (["model.routing.heads=3"], "divisible by heads=3"),
    (["train.routing.alpha=1.5"], "train.routing.alpha"),
    (["train.routing.warm=1"], "unknown key 'warm'"),
    (["train.lr_decay=2.0"], "train.lr_decay"),
    (["model.routing.clip=0"], "model.routing.clip"),
])
def test_bad_routing_configs_are_named(over, named):
    with pytest.raises(ConfigError, match=named):
        load_config("tsp_20", over)


def test_data_and_models_that_do_not_fit_are_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="builds tours: it needs a TSP dataset"):
        sc.train(_cfg(tmp_path, "data.name=digits", "data.options={}"), tmp_path / "x")
    with pytest.raises(ConfigError, match="set data.batches_per_epoch"):
        sc.train(_cfg(tmp_path, "data.batches_per_epoch=0"), tmp_path / "y")
    with pytest.raises(ValueError, match="tsp: n must be an int"):
        sc.train(_cfg(tmp_path, "data.options.n=2"), tmp_path / "z")
    with pytest.raises(ConfigError, match=r"describe the model with a \[model.routing\]"):
        sc.train("gcn_karate", tmp_path / "w", overrides=["data.name=tsp"])

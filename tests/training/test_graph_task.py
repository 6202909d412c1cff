"""Graph-level training on the loop: a GIN on MUTAG trains and reports, a run stopped inside an
epoch resumes exactly, the fold option picks Errica-style outer folds, bad options are named,
ROC-AUC and regression metrics are what they say."""

from __future__ import annotations

import itertools

import pytest
import torch

import structconv as sc
from structconv.cli import main
from structconv.config import ConfigError, apply_overrides, load_config
from structconv.data import GraphDataset, load_dataset
from structconv.data.registry import DatasetError
from structconv.models.build import build_gin
from structconv.training.checkpoint import load_checkpoint
from structconv.training.distributed import World
from structconv.training.tasks import GraphTask, load_data
from structconv.training.tasks.graph import roc_auc
from tests.conftest import need
from tests.training.test_interrupts import _interrupted_then_resumed

TINY = ["train.epochs=2", "model.gin.hidden=8", "model.gin.layers=2",
        "train.checkpoint_seconds=1e9"]


@pytest.fixture(autouse=True)
def _mutag():
    need("tu-mutag")


def _cfg(*over: str) -> dict:
    cfg = apply_overrides(load_config("gin_mutag"), [*TINY, *over])
    cfg["name"] = "gin_mutag"
    return cfg


def test_gin_on_mutag_trains_and_reports(tmp_path):
    res = sc.train(_cfg(), tmp_path / "run")
    assert res["epochs"] == 2 and res["dataset"] == "MUTAG"
    for k in ("val_acc", "val_auc", "test_acc", "test_auc"):
        assert 0.0 <= res[k] <= 1.0, k
    assert res["val_loss"] > 0 and res["test_loss"] > 0
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 and '"train_acc"' in rows[0] and '"val_auc"' in rows[0]


def test_the_command_line_trains_a_shipped_gin_config(tmp_path, capsys):
    rc = main(["train", "--config", "gin_mutag", "train.epochs=1", "model.gin.hidden=8",
               "--out", str(tmp_path / "run")])
    assert rc in (0, None)
    assert "val acc" in capsys.readouterr().out
    assert (tmp_path / "run" / "result.json").is_file()


@pytest.mark.parametrize("k,where", [(3, "epoch 1, step 3/5"), (7, "epoch 2, step 2/5")])
def test_a_gin_run_stopped_mid_epoch_resumes_exactly(monkeypatch, tmp_path, k, where):
    cfg = _cfg("model.gin.dropout=0.5")  # dropout: the resumed RNG must be the interrupted one
    msg = _interrupted_then_resumed(monkeypatch, cfg, tmp_path, k, str(k))
    assert where in msg, msg


def test_the_checkpoint_keeps_the_loaders_position(monkeypatch, tmp_path):
    from structconv.training.interrupt import TrainingInterrupted
    from tests.conftest import stop_at as _stop_at

    _stop_at(monkeypatch, 2)
    with pytest.raises(TrainingInterrupted):
        sc.train(_cfg(), tmp_path / "run")
    ck = load_checkpoint(tmp_path / "run")
    assert ck["extra"]["graph_position"].tolist() == [1, 2]  # epoch 1, two batches taken


def test_the_fold_option_selects_an_outer_fold_and_its_holdout():
    ds = load_dataset("tu-mutag", fold=3)
    f = ds.folds[3]
    assert all(torch.equal(ds.splits[k], f[k]) for k in ("train", "val", "test"))
    assert not torch.equal(load_dataset("tu-mutag", fold=4).splits["test"], f["test"])
    # the inner holdout is a tenth of the fold's training part, disjoint from its test part
    assert round(0.1 * (f["train"].numel() + f["val"].numel())) == f["val"].numel()
    assert not set(f["test"].tolist()) & set(torch.cat([f["train"], f["val"]]).tolist())
    task = GraphTask(_cfg("data.options.fold=3"), load_data(_cfg("data.options.fold=3")))
    assert torch.equal(task.ids["test"], f["test"]) and len(task.train_set) == f["train"].numel()


@pytest.mark.parametrize("over,named", [
    (["data.options.fold=10"], "fold"),
    (["data.options.fold=-1"], "fold"),
    (["data.options.folds=1"], "folds"),
])
def test_bad_data_options_are_named(tmp_path, over, named):
    with pytest.raises((ConfigError, DatasetError)) as e:
        sc.train(_cfg(*over), tmp_path / "run")
    assert named in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("over,named", [
    ({"readout": "median"}, "model.gin.readout"),
    ({"hiden": 8}, "hiden"),
    ({"layers": 0}, "model.gin.layers"),
    ({"dropout": 1.0}, "model.gin.dropout"),
    ({"edge_features": "yes"}, "model.gin.edge_features"),
])
def test_bad_gin_keys_are_named(over, named):
    cfg = {"data": {"name": "tu-mutag"}, "model": {"gin": over}}
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        sc.train(cfg, "unused")


def test_models_and_data_that_do_not_fit_are_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"\[model.gin\]"):
        sc.train({"data": {"name": "tu-mutag"},
                  "model": {"layers": [{"type": "linear", "channels": "classes"}]}},
                 tmp_path / "a")
    with pytest.raises(ConfigError, match="model.gin reads batches of graphs"):
        sc.train({"data": {"name": "karate"}, "model": {"gin": {}}}, tmp_path / "b")
    with pytest.raises(ConfigError, match="val_mrr"):
        sc.train(_cfg("train.monitor=val_mrr"), tmp_path / "c")


def test_roc_auc_is_the_share_of_ordered_pairs():
    g = torch.Generator().manual_seed(0)
    for n in (2, 7, 50):
        y = torch.randint(0, 2, (n,), generator=g)
        y[0], y[1] = 0, 1
        s = torch.randint(0, 5, (n,), generator=g).float()  # many ties
        pairs = [(a, b) for a, b in itertools.product(range(n), repeat=2)
                 if y[a] == 1 and y[b] == 0]
        want = sum(1.0 if s[a] > s[b] else 0.5 if s[a] == s[b] else 0.0
                   for a, b in pairs) / len(pairs)
        assert roc_auc(s, y) == pytest.approx(want, abs=1e-12)
    assert roc_auc(torch.rand(4), torch.zeros(4, dtype=torch.long)) is None


def test_float_labels_train_a_regression_with_mse_and_mae():
    g = torch.Generator().manual_seed(1)
    graphs = [{"x": torch.randn(n, 3, generator=g),
               "edge_index": torch.randint(0, n, (2, 2 * n), generator=g),
               "y": torch.randn(1, generator=g)} for n in (3, 5, 4, 6, 2, 7)]
    ds = GraphDataset.from_graphs(graphs, name="toy")
    ds.splits = {"train": torch.arange(4), "val": torch.tensor([4, 5])}
    cfg = _cfg("train.monitor=val_loss", "data.batch_size=2")
    torch.manual_seed(0)
    model = build_gin(cfg, ds)
    task = GraphTask(cfg, ds)
    task.setup(model, torch.device("cpu"), World())
    n, steps = task.epoch_steps(1, 0, None)
    assert n == 2
    obj, sums = task.batch_loss(model, next(steps)[0], 1 / 2)
    assert sums[2].item() == 2 and sums[1].item() == 0  # no accuracy for regression
    res = task.evaluate(model, "val")
    model.eval()
    out = model(*task.inputs(ds.batch([4, 5]))).detach().double().flatten()
    y = ds.y[4:6].double()
    assert res["loss"] == pytest.approx(((out - y) ** 2).mean().item(), rel=1e-6)
    assert res["mae"] == pytest.approx((out - y).abs().mean().item(), rel=1e-6)
    assert "acc" not in res
    with pytest.raises(ConfigError, match="train.monitor"):
        GraphTask(_cfg(), ds)  # val_acc: no accuracy for float labels


def test_a_cross_validation_sweep_interrupted_and_resumed_ends_with_the_same_numbers(
        monkeypatch, tmp_path):
    import json

    from tests.conftest import stop_at as _stop_at

    argv = ["reproduce", "tu-gin", "--quick", "--folds", "2"]
    assert main([*argv, "--out", str(tmp_path / "ref")]) == 0
    with monkeypatch.context() as m:
        _stop_at(m, 18)  # fold 0 takes 15 steps (3 epochs of 5): fold 1, epoch 1, step 3
        assert main([*argv, "--out", str(tmp_path / "run")]) == 130
    fold1 = tmp_path / "run" / "tu-gin-mutag" / "fold-1"
    assert (fold1 / "checkpoint.json").is_file() and not (fold1 / "result.json").exists()
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    ref, run = (json.loads((tmp_path / d / "tu-gin-mutag.json").read_text())
                for d in ("ref", "run"))
    assert [r["test_acc"] for r in run["runs"]] == [r["test_acc"] for r in ref["runs"]]
    assert run["test_acc_mean"] == ref["test_acc_mean"] and len(run["runs"]) == 2


def test_accumulated_half_batches_are_the_whole_batch(tmp_path):
    # no batch norm: a micro-batch's statistics would differ from the whole batch's
    base = ["model.gin.batch_norm=false", "model.gin.dropout=0.0", "train.epochs=1"]
    whole = sc.train(_cfg(*base, "data.batch_size=32"), tmp_path / "a")
    halves = sc.train(_cfg(*base, "data.batch_size=16", "train.accumulate=2"), tmp_path / "b")
    assert halves["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-5)
    assert halves["test_loss"] == pytest.approx(whole["test_loss"], rel=1e-5)


def test_the_readout_option_trains_that_readout_under_its_own_name(tmp_path, capsys):
    import json

    argv = ["reproduce", "tu-gin", "--quick", "--folds", "1", "--epochs", "1",
            "--out", str(tmp_path)]
    assert main([*argv, "--readout", "attention"]) == 0
    out = json.loads((tmp_path / "tu-gin-mutag-attention.json").read_text())
    assert out["readout"] == "attention" and "model.gin.readout=attention" in out["overrides"]
    fold = tmp_path / "tu-gin-mutag-attention" / "fold-0"
    saved = json.loads((fold / "config.json").read_text())
    assert saved["model"]["gin"]["readout"] == "attention"
    assert not (tmp_path / "tu-gin-mutag").exists()  # the sum sweep is a different one
    capsys.readouterr()
    assert main([*argv, "--readout", "median"]) == 2
    assert "invalid choice: 'median'" in capsys.readouterr().err


def _ddp_rows(run) -> list[dict]:
    import json

    keys = ("train_loss", "val_loss", "train_acc", "val_acc")
    return [{k: json.loads(x)[k] for k in keys}
            for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_gin_under_ddp_equals_one_process_only_without_batch_norm(tmp_path):
    from structconv.training import train
    from tests.conftest import run_cli

    note = "batch norm layer(s): under DDP each of the 2 processes"
    over = ["model.dtype=\"float64\"", "model.gin.dropout=0.0", "train.epochs=2"]
    rows = {}
    for bn in ("true", "false"):
        o = [*over, f"model.gin.batch_norm={bn}"]
        r = run_cli("train", "--config", "gin_mutag", *TINY, *o, "--out", tmp_path / f"ddp-{bn}",
                    "--nproc", "2")
        assert r.returncode == 0, r.stderr
        # said once (the main process) where the model has batch norms, never otherwise
        assert r.stdout.count(note) == (1 if bn == "true" else 0), r.stdout
        train(_cfg(*o), tmp_path / f"one-{bn}")
        rows[bn] = [_ddp_rows(tmp_path / f"{w}-{bn}") for w in ("ddp", "one")]
    ddp, one = rows["false"]
    for x, y in zip(ddp, one, strict=True):
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-9, abs=1e-12), (k, x, y)
    ddp, one = rows["true"]  # per-process batch statistics: another run
    assert ddp[0]["train_loss"] != pytest.approx(one[0]["train_loss"], rel=1e-9)


def test_the_batch_norm_note_counts_the_norms_and_needs_two_processes():
    from structconv.training.run import batch_norm_note

    net = build_gin(_cfg(), load_data(_cfg()))
    assert batch_norm_note(net, 1) is None
    assert "has 4 batch norm layer(s)" in batch_norm_note(net, 3)  # 2 layers, 2 norms each
    plain = build_gin(_cfg("model.gin.batch_norm=false"), load_data(_cfg()))
    assert batch_norm_note(plain, 3) is None

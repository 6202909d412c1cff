"""`structconv train` / `eval` on link-prediction configs ([model.link], [train.link]): a tiny
knowledge graph written here, end to end, resume, eval output and refused configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import structconv as sc
from structconv.cli import main
from structconv.config import load_config, shipped_configs
from structconv.models import build_model, memory_estimate
from structconv.training import count_parameters, load_data, train


def _config(kg: Path, tmp_path: Path, model: str = "", train_link: str = "",
            extra: str = "") -> Path:
    text = f"""name = "tiny_link"
[data]
name = "wn18rr"
root = "{kg}"
batch_size = 64
[model.link]
dim = 16
init_std = 0.1
{model}
[train]
optimizer = "adam"
lr = 0.05
epochs = 6
monitor = "val_mrr"
{extra}
[train.link]
reg = "n3"
reg_weight = 0.001
{train_link}
"""
    path = tmp_path / "tiny_link.toml"
    path.write_text(text)
    return path


#: an R-GCN encoder (one layer, 4 x 4 blocks, mined 2-sorts) trained by negative sampling with
#: edge dropout: every random draw of the trainer matters
ENCODER = ('decoder = "complex"\nreciprocal = false\nencoder_layers = 1\nblock = 4\n'
           'sorts = "mined"\ntop = 3\nedge_dropout = 0.3\nself_dropout = 0.2')
NEGATIVE = 'mode = "negative"\nnegatives = 4\nlabel_smoothing = 0.1\neval_every = 2'


def _random_mrr(kg: Path) -> float:
    data = load_data(load_config(str(_config(kg, kg.parent))))
    known = torch.cat([data.train, data.valid, data.test])
    torch.manual_seed(1)
    return sc.kg.evaluate(lambda h, r: torch.randn(h.numel(), data.num_entities), data.test,
                          known, data.num_entities, data.num_relations)["mrr"]


def test_train_then_eval_a_link_config(kg, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config", str(_config(kg, tmp_path)), "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "test MRR" in out and "test raw Hits@10" in out
    res = json.loads((run / "result.json").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, 7)) and res["epochs"] == 6
    assert set(rows[0]) >= {"loss", "val_mrr", "val_hits@1", "val_hits@3", "val_hits@10",
                            "seconds"}
    assert rows[-1]["loss"] < rows[0]["loss"]
    # the filtered test MRR of the full test set, far above a random scorer's
    rnd = _random_mrr(kg)
    assert rnd < 0.25 and res["test_mrr"] > max(0.8, 3 * rnd), (res, rnd)
    assert res["test"]["raw_mrr"] <= res["test_mrr"] and res["test"]["n"] == 2 * 60
    assert res["best_epoch"] == max(rows, key=lambda r: r["val_mrr"])["epoch"]
    assert set(load_file(run / "best.safetensors")) == {"entity", "decoder.relation"}
    assert (run / "curves.png").is_file() and (run / "metrics.csv").is_file()
    # eval: the same weights, the same full filtered ranking, printed and written
    assert main(["eval", str(run), "--split", "test"]) == 0
    out = capsys.readouterr().out
    ev = json.loads((run / "eval-test.json").read_text())
    assert ev["mrr"] == res["test_mrr"] and ev["raw_mrr"] == res["test"]["raw_mrr"]
    for name in ("MRR", "Hits@1", "Hits@3", "Hits@10", "raw MRR", "raw Hits@10",
                 "120 rankings"):
        assert name in out, out
    assert f"{res['test_mrr']:.4f}" in out
    assert main(["eval", str(run), "--split", "val"]) == 0
    assert json.loads((run / "eval-val.json").read_text())["mrr"] == res["val_mrr"]


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("seconds")
    return rows


def test_resumed_link_run_equals_an_uninterrupted_one(kg, tmp_path):
    cfg = load_config(str(_config(kg, tmp_path, ENCODER, NEGATIVE + "\nval_limit = 4",
                                  "checkpoint_every = 1")))
    ref = train(cfg, tmp_path / "ref")
    assert train(cfg, tmp_path / "run", stop_after=3) == {"interrupted": True, "epoch": 3,
                                                          "run": str(tmp_path / "run")}
    again = train(None, tmp_path / "run", resume=True)
    rows = _rows(tmp_path / "run")
    assert rows == _rows(tmp_path / "ref")
    # validation every 2 epochs and at the last, on the first 4 valid triples (8 rankings)
    assert [r["val_mrr"] is not None for r in rows] == [False, True, False, True, False, True]
    assert again["test"] == ref["test"] and again["best_epoch"] == ref["best_epoch"]
    a, b = load_file(tmp_path / "run" / "best.safetensors"), \
        load_file(tmp_path / "ref" / "best.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the encoder trains: the filtered test MRR is well above a random scorer's
    assert ref["test_mrr"] > 2 * _random_mrr(kg), ref


def test_memory_estimate_counts_the_link_model(kg, tmp_path):
    cfg = load_config(str(_config(kg, tmp_path, ENCODER.replace('"mined"', '"single"'),
                                  NEGATIVE)))
    data = load_data(cfg)
    est = memory_estimate(cfg, data)
    assert est["n_params"] == count_parameters(build_model(cfg, data))
    assert est["copies"] == 4 and est["params"] == est["n_params"] * 4 * 4
    # 1-vs-all: a batch's (batch, entities) scores, with their softmax and gradient
    one = load_config(str(_config(kg, tmp_path)), ["data.batch_size=1000"])
    assert memory_estimate(one, data)["activations"] >= 3 * 1000 * 40 * 4


@pytest.mark.parametrize("over,expect", [
    (["model.link.bogus=1"], "model.link: unknown key 'bogus'"),
    (["train.link.bogus=1"], "train.link: unknown key 'bogus'"),
    (['model.link.decoder="transe"'], "model.link.decoder must be one of distmult, complex"),
    (['model.link.decoder="complex"', "model.link.dim=7"], "dim must be even for complex"),
    (["model.link.encoder_layers=1", "model.link.block=5"], "block=5 must divide dim=16"),
    (["model.link.dim=-4"], "model.link.dim must be an int in 1..1000000"),
    (["model.link.edge_dropout=1.0"], "model.link.edge_dropout must be in [0, 1)"),
    (['model.link.sorts="mined"'], "needs an R-GCN encoder: set encoder_layers >= 1"),
    (["model.link.sorts=[]"], "sorts must be \"single\", \"mined\" or a non-empty list"),
    (["model.link.encoder_layers=1", "model.link.block=4", 'model.link.sorts=["p.nope"]'],
     "cannot build the model"),
    (['train.link.mode="pairwise"'], "train.link.mode must be 1vsall or negative"),
    (['train.link.reg="l1"'], "train.link.reg must be n3, l2 or none"),
    (["train.link.negatives=-1"], "train.link.negatives must be an int in [1,"),
    (["train.link.label_smoothing=-0.1"], "train.link.label_smoothing must be in [0, 1)"),
    (["train.link.reg_weight=-1.0"], "train.link.reg_weight must be a number in [0"),
    (["train.link.val_limit=-1"], "train.link.val_limit must be an int in [0,"),
    (["train.link.eval_every=0"], "train.link.eval_every must be an int in [1,"),
    (['train.monitor="val_acc"'], "is monitored by val_mrr"),
    (['train.optimizer="rmsprop"'], "train.optimizer must be adam, adamw, sgd or adagrad"),
    (['model.layers=[{basis = "gcn"}]'], "takes no [[model.layers]]"),
    (['data.name="karate"'], "model.link predicts links: it needs a knowledge-graph dataset"),
    (["data.batch_size=100000000"], "reduce model.link.dim or data.batch_size"),
    (["--nproc", "2"], "--nproc 2 (DDP) is not supported"),
    (['train.select="gat"'], "train.select for a [model.link] model is monitor"),
    (["train.time_limit=-1"], "train.time_limit must be a number of seconds in [0, 1e9]"),
])
def test_bad_link_configs_exit_2_with_one_line(kg, tmp_path, capsys, over, expect):
    run = tmp_path / "r"
    assert main(["train", "--config", str(_config(kg, tmp_path)), *over, "--out",
                 str(run)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("structconv: error: "), err
    assert expect in err[0], err[0]
    assert not run.exists()  # refused before anything is written


@pytest.mark.parametrize("over,expect", [
    (['data.name="wn18rr"', "data.root=ROOT"], "is a link-prediction task: describe the model "
                                                "with a [model.link] table"),
    (['train.link.mode="negative"'], "[train.link] trains a link predictor: it needs a "
                                     "[model.link] table"),
    (['train.monitor="val_mrr"'], "monitors are for [model.link] models"),
])
def test_link_options_on_other_models_exit_2(kg, tmp_path, capsys, over, expect):
    over = [o.replace("ROOT", f'"{kg}"') for o in over]
    assert main(["train", "--config", "gcn_karate", *over, "--out", str(tmp_path / "r")]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and expect in err[0], err


def test_shipped_link_configs_validate():
    cfgs = {n: load_config(n) for n in ("distmult_fb15k237", "complex_wn18rr",
                                        "rgcn_distmult_fb15k237")}
    assert set(cfgs) <= set(shipped_configs())
    d = cfgs["distmult_fb15k237"]
    assert (d["model"]["link"]["dim"], d["train"]["optimizer"], d["train"]["lr"],
            d["train"]["link"]["reg"], d["train"]["link"]["reg_weight"],
            d["data"]["batch_size"]) == (200, "adagrad", 0.1, "n3", 0.05, 500)
    assert cfgs["complex_wn18rr"]["model"]["link"]["decoder"] == "complex"
    r = cfgs["rgcn_distmult_fb15k237"]
    assert (r["model"]["link"]["encoder_layers"], r["model"]["link"]["block"],
            r["model"]["link"]["edge_dropout"], r["train"]["link"]["mode"]) == \
        (2, 5, 0.4, "negative")


def test_a_time_limit_ends_a_run_that_resuming_continues(kg, tmp_path):
    # no epoch starts after train.time_limit seconds of a call: here, one epoch a call
    cfg = load_config(str(_config(kg, tmp_path, ENCODER, NEGATIVE)))
    ref = train(cfg, tmp_path / "ref")
    run = tmp_path / "run"
    part = train(cfg, run, overrides=["train.time_limit=1e-9"])
    assert part["epochs"] == 1 and part["time_limited"] and not ref["time_limited"]
    assert json.loads((run / "result.json").read_text())["time_limited"]
    assert train(None, run, resume=True)["epochs"] == 2  # the saved limit again
    done = train(None, run, resume=True, overrides=["train.time_limit=0"])
    assert done["epochs"] == 6 and not done["time_limited"]
    assert json.loads((run / "config.json").read_text())["train"]["time_limit"] == 0
    assert _rows(run) == _rows(tmp_path / "ref")
    assert done["test"] == ref["test"] and done["best_epoch"] == ref["best_epoch"]


def test_more_epochs_continue_a_finished_run_as_one_longer_run(kg, tmp_path):
    from structconv.config import ConfigError
    from structconv.training import TrainingError

    cfg = load_config(str(_config(kg, tmp_path, ENCODER)))  # edge dropout: every draw counts
    ref = train(cfg, tmp_path / "ref")
    run = tmp_path / "run"
    assert train(cfg, run, overrides=["train.epochs=3"])["epochs"] == 3
    longer = train(None, run, resume=True, overrides=["train.epochs=6"])
    assert _rows(run) == _rows(tmp_path / "ref")
    assert longer["test"] == ref["test"] and longer["best_epoch"] == ref["best_epoch"]
    assert json.loads((run / "config.json").read_text())["train"]["epochs"] == 6
    with pytest.raises(ConfigError, match="train.epochs may only grow when a run is resumed: "
                                          "the run has 6, got 2"):
        train(None, run, resume=True, overrides=["train.epochs=2"])
    with pytest.raises(TrainingError, match="may only train it longer .*got 'train.lr=1.0'"):
        train(None, run, resume=True, overrides=["train.lr=1.0"])
    assert json.loads((run / "config.json").read_text())["train"]["epochs"] == 6


def test_select_last_keeps_a_link_runs_last_weights(kg, tmp_path):
    from structconv.training.checkpoint import load_checkpoint

    run = tmp_path / "run"
    res = train(load_config(str(_config(kg, tmp_path, extra='select = "last"'))), run)
    best, last = load_file(run / "best.safetensors"), load_checkpoint(run)["model"]
    assert best.keys() == last.keys() and all(torch.equal(best[k], last[k]) for k in best)
    # the monitor's pick differs from the last epoch here, so the test is not vacuous
    by_monitor = train(load_config(str(_config(kg, tmp_path))), tmp_path / "m")
    assert by_monitor["best_epoch"] < 6 and res["test"] != by_monitor["test"]


def test_a_sweep_run_goes_on_after_its_time_limit_and_with_more_epochs(kg, tmp_path):
    from structconv.experiments.sweep import Run, config_run

    path, folder = str(_config(kg, tmp_path)), tmp_path / "sweep"

    def sweep_run(*over):
        return config_run(folder, Run("r", path, over), "test")

    limited = ("train.epochs=2", "train.time_limit=1e-9")
    first = sweep_run(*limited)
    assert first["epochs"] == 1 and first["time_limited"]
    again = sweep_run(*limited)  # ended by its limit: goes on
    assert again["epochs"] == 2 and not again["time_limited"]
    read = sweep_run("train.epochs=2")  # finished: read back (the limit alone trains nothing)
    assert read["epochs"] == 2 and read["test"] == again["test"]
    more = sweep_run("train.epochs=4")
    ref = train(path, tmp_path / "ref", overrides=["train.epochs=4"])
    assert more["epochs"] == 4 and more["test"] == ref["test"]
    assert _rows(folder / "r") == _rows(tmp_path / "ref")
    with pytest.raises(ValueError, match=r"another config \(train.epochs: 4 there, 3 now\)"):
        sweep_run("train.epochs=3")


def test_a_link_config_draws_as_train_link_does(kg, tmp_path):
    # an encoder's edge dropout draws from the seed after the model is built, in both paths
    from structconv.config import link_train_spec
    from structconv.training import train_link

    cfg = load_config(str(_config(kg, tmp_path, ENCODER, NEGATIVE)))
    train(cfg, tmp_path / "run")
    data = load_data(cfg)
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg, data)
    s = link_train_spec(cfg)
    rows = train_link(model, data.train, mode=s["mode"], epochs=6, batch_size=64, lr=0.05,
                      optimizer="adam", label_smoothing=s["label_smoothing"], reg=s["reg"],
                      reg_weight=s["reg_weight"], negatives=s["negatives"], seed=cfg["seed"])
    assert [r["loss"] for r in rows] == [r["loss"] for r in _rows(tmp_path / "run")]

"""Typed node classification on sampled mini-batches (``[train.sampler]`` with
``[model.hetero]``): sage, rgcn and hgt train from a config; at fanout "all" with every training
node in one batch the first step's loss and gradients are the full-batch task's (float64); a run
stopped mid-epoch and resumed ends exactly as an uninterrupted one; bad sampler keys are named."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import structconv as sc
from structconv.cli import main
from structconv.config import ConfigError, apply_overrides, load_config, validate
from structconv.models import build_model
from structconv.training.distributed import World
from structconv.training.interrupt import TrainingInterrupted
from structconv.training.tasks import SampledTypedNodeTask, TypedNodeTask, load_data, task_for
from structconv.training.tasks.typed_sampled import resolve_fanouts
from tests.conftest import stop_at as _stop_at
from tests.conftest import tiny_imdb

FAST = ["train.epochs=3", "model.hetero.hidden=8", "train.checkpoint_seconds=1e9"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tiny_imdb(tmp_path_factory.mktemp("imdb"))


def _cfg(root, kind: str, *over: str, sampler: dict | None = None) -> dict:
    cfg = apply_overrides(load_config(f"hetero_{kind}_imdb"),
                          [*FAST, f"data.root='{root}'", "model.hetero.layers=2", *over])
    cfg["train"]["sampler"] = sampler if sampler is not None else {"fanouts": [3, 2],
                                                                  "batch_size": 4}
    cfg["name"] = f"hetero_{kind}_imdb_sampled"
    return validate(cfg, "test")


@pytest.mark.parametrize("kind", ["sage", "rgcn", "hgt"])
def test_sampled_typed_models_train_from_a_config(tmp_path, root, kind):
    res = sc.train(_cfg(root, kind), tmp_path / "run")
    assert res["epochs"] == 3
    for k in ("val_macro_f1", "val_micro_f1", "test_macro_f1", "test_micro_f1"):
        assert 0.0 <= res[k] <= 1.0, k
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["train_loss"] > 0 for r in rows)


def _first_step(task, model):
    task.setup(model, torch.device("cpu"), World())
    _, groups = task.epoch_steps(1, 0, None)
    group = next(iter(groups))
    model.zero_grad(set_to_none=True)
    objective, sums = task.batch_loss(model, group[0], 1.0 / task.group_items(group))
    objective.backward()
    return objective.detach(), sums, {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["sage", "rgcn", "hgt"])
def test_fanout_all_with_every_train_node_is_the_full_batch_step(root, kind):
    cfg = _cfg(root, kind, "model.dtype='float64'", "model.hetero.dropout=0.0",
               sampler={"fanouts": ["all", -1], "batch_size": 10})
    data = load_data(cfg)
    assert isinstance(task_for(cfg, data), SampledTypedNodeTask)
    full_cfg = {**cfg, "train": {**cfg["train"], "sampler": {}}}
    torch.manual_seed(0)
    model = build_model(cfg, data).double()
    out = [_first_step(task, model) for task in (TypedNodeTask(full_cfg, data),
                                                 SampledTypedNodeTask(cfg, data))]
    (lf, sf, gf), (ls, ss, gs) = out
    assert sf[2] == ss[2] == 10  # one batch: every training movie
    torch.testing.assert_close(ls, lf, rtol=1e-12, atol=1e-12)
    assert torch.equal(sf[1], ss[1])
    for k in gf:
        torch.testing.assert_close(gs[k], gf[k], rtol=1e-10, atol=1e-12, msg=k)
    assert any(g.abs().sum() > 0 for g in gf.values())


def test_a_sampled_fanout_is_not_the_full_batch_step(root):
    # the equality above can fail: a small fanout changes the neighbourhoods
    cfg = _cfg(root, "sage", "model.dtype='float64'",
               sampler={"fanouts": [1, 1], "batch_size": 10})
    data = load_data(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, data).double()
    full_cfg = {**cfg, "train": {**cfg["train"], "sampler": {}}}
    lf = _first_step(TypedNodeTask(full_cfg, data), model)[0]
    ls = _first_step(SampledTypedNodeTask(cfg, data), model)[0]
    assert not torch.allclose(lf, ls, rtol=1e-9, atol=0)


@pytest.mark.parametrize("kind,prefetch", [("sage", 0), ("hgt", 2)])
def test_a_sampled_typed_run_stopped_mid_epoch_resumes_exactly(monkeypatch, tmp_path, root,
                                                               kind, prefetch):
    # 10 training movies in batches of 4: 3 steps an epoch; dropout from each batch's seed
    cfg = _cfg(root, kind, "train.epochs=2", "model.hetero.dropout=0.5",
               sampler={"fanouts": [3, 2], "batch_size": 4, "prefetch": prefetch})
    ref = sc.train(cfg, tmp_path / "ref")
    with monkeypatch.context() as m:
        _stop_at(m, 5)  # epoch 2, step 2 of 3
        with pytest.raises(TrainingInterrupted, match=r"epoch 2, step 2/3"):
            sc.train(cfg, tmp_path / "run")
    res = sc.train(None, tmp_path / "run", resume=True)
    for k in ("test_macro_f1", "test_micro_f1", "val_loss", "best_epoch"):
        assert res[k] == ref[k], k
    a, b = (load_file(tmp_path / d / "best.safetensors") for d in ("run", "ref"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [[json.loads(x)["train_loss"] for x in (tmp_path / d / "metrics.jsonl").read_text()
             .splitlines()] for d in ("run", "ref")]
    assert rows[0] == rows[1]


def test_fanouts_by_edge_type_or_relation_name():
    ets = [("movie", "to", "director"), ("movie", "to", "actor"), ("director", "to", "movie")]
    got = resolve_fanouts({"to": [2, 2], "movie.to.actor": [0, 5]}, ets)
    assert got == {ets[0]: [2, 2], ets[1]: [0, 5], ets[2]: [2, 2]}
    assert resolve_fanouts([3, "all"], ets) == [3, "all"]
    with pytest.raises(ConfigError, match="movie.to.writer"):
        resolve_fanouts({"to": [1], "movie.to.writer": [1]}, ets)
    with pytest.raises(ConfigError, match=r"director\.to\.movie"):
        resolve_fanouts({"movie.to.director": [1], "movie.to.actor": [1]}, ets)


def test_fanouts_as_a_table_train(tmp_path, root):
    cfg = _cfg(root, "rgcn", "train.epochs=1", sampler={
        "fanouts": {"to": [2, 2], "actor.to.movie": [0, "all"]}, "batch_size": 5})
    assert sc.train(cfg, tmp_path / "run")["epochs"] == 1


@pytest.mark.parametrize("sampler,named", [
    ({"fanouts": [3, 3], "accumulate": 2}, "unknown key 'accumulate'"),
    ({"fanouts": [3, 3], "eval": "full"}, "unknown key 'eval'"),
    ({"fanouts": [3]}, r"train\.sampler\.fanouts must be a list of 2"),
    ({"fanouts": [3, -2]}, r"train\.sampler\.fanouts"),
    ({"fanouts": {"to": [3]}}, r"train\.sampler\.fanouts\['to'\]"),
    ({"fanouts": {"movie.to.writer": [3, 3], "to": [1, 1]}}, "movie.to.writer"),
    ({"fanouts": {"movie.to.actor": [3, 3]}}, r"no fanouts for edge types"),
    ({"fanouts": [3, 3], "batch_size": 0}, r"train\.sampler\.batch_size"),
    ({"fanouts": [3, 3], "prefetch": -1}, r"train\.sampler\.prefetch"),
    ({"fanouts": [3, 3], "replace": "yes"}, r"train\.sampler\.replace"),
])
def test_bad_typed_sampler_keys_are_named(tmp_path, root, sampler, named):
    cfg = {"data": {"name": "imdb", "root": str(root)}, "model": {"hetero": {}},
           "train": {"sampler": sampler}}
    with pytest.raises(ConfigError, match=named):
        sc.train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_han_is_refused_sampled_by_name(tmp_path, root):
    cfg = {"data": {"name": "imdb", "root": str(root)},
           "model": {"hetero": {"kind": "han", "metapaths": ["movie.to.actor.to.movie"]}},
           "train": {"sampler": {"fanouts": [3, 3]}}}
    with pytest.raises(ConfigError, match="'han' cannot be sampled"):
        sc.train(cfg, tmp_path / "run")


def test_the_command_line_trains_sampled_and_refuses_in_one_line(tmp_path, root, capsys):
    rc = main(["train", "--config", "hetero_sage_imdb", "train.epochs=1", f"data.root='{root}'",
               "train.sampler.fanouts=[4, 4]", "train.sampler.batch_size=8",
               "--out", str(tmp_path / "run")])
    assert rc in (0, None) and (tmp_path / "run" / "result.json").is_file()
    assert main(["eval", str(tmp_path / "run"), "--split", "test"]) == 0  # full batch
    capsys.readouterr()
    rc = main(["train", "--config", "hetero_sage_imdb", f"data.root='{root}'",
               "train.sampler.fanouts=[4]", "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "train.sampler.fanouts" in err and len(err.splitlines()) == 1

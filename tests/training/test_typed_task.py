"""Typed node classification on the loop: every [model.hetero] kind trains from a config on a
tiny IMDB-format graph and reports Macro/Micro-F1, a run stopped and resumed ends exactly as an
uninterrupted one, F1 is scikit-learn's, and configs that cannot train are refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import structconv as sc
from structconv.cli import main
from structconv.config import ConfigError, apply_overrides, load_config
from structconv.training.interrupt import TrainingInterrupted
from structconv.training.tasks.typed import f1_scores
from tests.conftest import stop_at as _stop_at
from tests.conftest import tiny_imdb

FAST = ["train.epochs=3", "model.hetero.hidden=8", "train.checkpoint_seconds=1e9"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tiny_imdb(tmp_path_factory.mktemp("imdb"))


def _cfg(root, kind: str, *over: str) -> dict:
    cfg = apply_overrides(load_config(f"hetero_{kind}_imdb"),
                          [*FAST, f"data.root='{root}'", *over])
    cfg["name"] = f"hetero_{kind}_imdb"
    return cfg


@pytest.mark.parametrize("kind", ["sage", "rgcn", "hgt", "han", "gat"])
def test_every_typed_model_trains_from_its_config_and_reports_f1(tmp_path, root, kind):
    res = sc.train(_cfg(root, kind), tmp_path / "run")
    assert res["epochs"] == 3
    for k in ("val_macro_f1", "val_micro_f1", "test_macro_f1", "test_micro_f1", "test_acc"):
        assert 0.0 <= res[k] <= 1.0, k
    assert res["test_micro_f1"] == res["test_acc"]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all("val_macro_f1" in r for r in rows)


def test_a_typed_model_learns_the_tiny_genres(tmp_path, root):
    res = sc.train(_cfg(root, "sage", "train.epochs=40", "model.hetero.hidden=16"),
                   tmp_path / "run")
    assert res["val_micro_f1"] >= 0.8  # movies of a genre share directors and actors


@pytest.mark.parametrize("kind", ["sage", "han"])
def test_a_typed_run_stopped_and_resumed_ends_exactly_as_an_uninterrupted_one(
        monkeypatch, tmp_path, root, kind):
    # dropout (han's attention dropout 0.6): the resumed RNG must be the interrupted one's
    cfg = _cfg(root, kind, "train.epochs=4", "model.hetero.dropout=0.5")
    ref = sc.train(cfg, tmp_path / "ref")
    with monkeypatch.context() as m:
        _stop_at(m, 2)
        with pytest.raises(TrainingInterrupted):
            sc.train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "result.json").exists()
    res = sc.train(None, tmp_path / "run", resume=True)
    for k in ("test_macro_f1", "test_micro_f1", "val_loss", "best_epoch"):
        assert res[k] == ref[k], k
    a, b = (load_file(tmp_path / d / "best.safetensors") for d in ("run", "ref"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_f1_scores_are_scikit_learns():
    metrics = pytest.importorskip("sklearn.metrics")
    g = torch.Generator().manual_seed(0)
    for n, c in ((1, 2), (7, 3), (50, 5)):
        y, pred = (torch.randint(0, c, (n,), generator=g) for _ in range(2))
        macro, micro = f1_scores(pred, y)
        assert macro == pytest.approx(metrics.f1_score(y, pred, average="macro"), abs=1e-12)
        assert micro == pytest.approx(metrics.f1_score(y, pred, average="micro"), abs=1e-12)
    # a class predicted but absent from the labels counts (F1 0), as in scikit-learn
    assert f1_scores(torch.tensor([0, 2]), torch.tensor([0, 1]))[0] == pytest.approx(1 / 3)


def test_the_command_line_trains_a_shipped_typed_config(tmp_path, root, capsys):
    rc = main(["train", "--config", "hetero_hgt_imdb", "train.epochs=1", f"data.root='{root}'",
               "--out", str(tmp_path / "run")])
    assert rc in (0, None) and (tmp_path / "run" / "result.json").is_file()


@pytest.mark.parametrize("over,named", [
    ({"kind": "gcn"}, "model.hetero.kind"),
    ({"hiden": 8}, "hiden"),
    ({"kind": "hgt", "hidden": 10, "heads": 4}, "heads"),
    ({"kind": "sage", "metapaths": ["movie.to.actor.to.movie"]}, "metapaths"),
    ({"kind": "han"}, "metapaths"),
    ({"dropout": 1.0}, "model.hetero.dropout"),
    ({"param": "nope"}, "model.hetero.param"),
    ({"layers": 0}, "model.hetero.layers"),
])
def test_bad_hetero_keys_are_named(over, named):
    cfg = {"data": {"name": "imdb"}, "model": {"hetero": over}}
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        sc.train(cfg, "unused")


def test_models_and_graphs_that_do_not_fit_are_refused_by_name(tmp_path, root):
    data = {"name": "imdb", "root": str(root)}
    with pytest.raises(ConfigError, match=r"\[model.hetero\]"):
        sc.train({"data": data, "model": {"layers": [{"type": "linear", "channels": "classes"}]}},
                 tmp_path / "a")
    with pytest.raises(ConfigError, match="typed graph"):
        sc.train({"data": {"name": "karate"}, "model": {"hetero": {}}}, tmp_path / "b")
    with pytest.raises(ConfigError, match="metapath"):
        sc.train({"data": data, "model": {"hetero": {"kind": "han", "metapaths": [
            "movie.to.writer.to.movie"]}}}, tmp_path / "c")
    with pytest.raises(ConfigError, match="target"):
        sc.train({"data": data, "model": {"hetero": {"target": "actor"}}}, tmp_path / "d")
    with pytest.raises(ConfigError, match=r"train\.sampler\.fanouts"):
        sc.train({"data": data, "model": {"hetero": {}},
                  "train": {"sampler": {"fanouts": [5]}}}, tmp_path / "e")
    assert not any((tmp_path / d).exists() for d in "abcde")

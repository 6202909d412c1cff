"""``structconv reproduce hiv``: one run per (model, seed) of the gin_hiv config, GIN without and
GINE with bond features, test ROC-AUC summarised; finished runs are read back, not retrained."""

from __future__ import annotations

import json

import pytest

from structconv.cli import main
from tests.conftest import need


def test_the_hiv_recipe_trains_each_model_once_and_reads_it_back(tmp_path, capsys):
    pytest.importorskip("rdkit.Chem", reason="the mol extra (rdkit) is not installed")
    need("hiv")
    argv = ["reproduce", "hiv", "--quick", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = json.loads((tmp_path / "hiv.json").read_text())
    assert [(r["model"], r["seed"]) for r in out["runs"]] == [("gin", 0), ("gine", 0)]
    assert "model.gin.edge_features=false" in out["overrides"]["gin-seed0"]
    assert "model.gin.edge_features=true" in out["overrides"]["gine-seed0"]
    for r in out["runs"]:
        assert 0.0 <= r["test_auc"] <= 1.0
        assert out["summary"][r["model"]]["test_auc_mean"] == r["test_auc"]
    saved = json.loads((tmp_path / "hiv" / "gine-seed0" / "config.json").read_text())
    assert saved["model"]["gin"]["edge_features"] is True and saved["model"]["gin"]["hidden"] == 16
    stamp = (tmp_path / "hiv" / "gin-seed0" / "result.json").stat().st_mtime_ns
    assert main([*argv, "--models", "gin"]) == 0  # read back, not trained again
    assert (tmp_path / "hiv" / "gin-seed0" / "result.json").stat().st_mtime_ns == stamp
    again = json.loads((tmp_path / "hiv.json").read_text())
    assert again["runs"] == out["runs"][:1]
    capsys.readouterr()
    assert main([*argv, "--models", "gin,gcn"]) == 2
    assert "--models" in capsys.readouterr().err

"""``structconv reproduce hetero``: the quick path trains every model over seeds on a typed graph
and publishes mean ± std Macro/Micro-F1; a sweep run again reads its finished runs; options
that do not fit are refused in one line before any work."""

from __future__ import annotations

import json
import statistics

import pytest

from structconv import cli
from tests.conftest import tiny_imdb


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tiny_imdb(tmp_path_factory.mktemp("imdb"))


def test_the_quick_path_trains_every_model_and_publishes_the_table(tmp_path, root, capsys):
    argv = ["reproduce", "hetero", "--quick", "--data", str(root), "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    res = json.loads((tmp_path / "hetero.json").read_text())
    assert res["quick"] and res["datasets"] == ["imdb"] and res["seeds"] == 2
    assert [(e["model"], e["seeds"]) for e in res["summary"]] == \
        [(m, 2) for m in ("sage", "rgcn", "hgt", "han", "gat")]
    for e in res["summary"]:
        runs = [r for r in res["runs"] if r["model"] == e["model"]]
        assert [r["seed"] for r in runs] == [0, 1] and all(r["epochs"] == 2 for r in runs)
        f1 = [r["test_macro_f1"] for r in runs]
        assert e["test_macro_f1_mean"] == pytest.approx(statistics.fmean(f1))
        assert e["test_macro_f1_std"] == pytest.approx(statistics.stdev(f1))
        assert all(0 <= r["test_micro_f1"] <= 100 for r in runs)
    # run again: every run is read back, the same numbers
    assert cli.main(argv) == 0
    again = json.loads((tmp_path / "hetero.json").read_text())
    assert again["runs"] == res["runs"]
    assert "sage-imdb-seed1" in capsys.readouterr().out


@pytest.mark.parametrize("argv,named", [
    (["--data", "x", "--datasets", "dblp,imdb"], "--data"),
    (["--models", "gcn"], "--models"),
    (["--seeds", "0"], "--seeds"),
    (["--seeds", "101"], "--seeds"),
    (["--epochs", "0"], "--epochs"),
])
def test_options_that_do_not_fit_exit_2_in_one_line_before_any_work(tmp_path, capsys, argv,
                                                                    named):
    rc = cli.main(["reproduce", "hetero", *argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and named in err, err
    assert not any(tmp_path.iterdir())


def test_quick_keeps_given_values():
    _, ns = cli.parse_suite("experiments", "hetero", ["--quick", "--seeds", "5",
                                                      "--datasets", "dblp"])
    assert (ns.seeds, ns.datasets, ns.epochs) == (5, "dblp", 2)

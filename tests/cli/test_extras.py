"""Dependencies by need: the library imports without its extras; a missing one is named."""

import subprocess
import sys

import pytest

from structconv import _extras
from structconv.cli import main

HEAVY = ("scipy", "networkx", "rdflib", "sklearn", "matplotlib", "torch_geometric")


def test_the_library_imports_no_extra():
    code = ("import sys, structconv as sc\n"
            "sc.nn, sc.basis, sc.attention, sc.params, sc.data, sc.costs\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported at library import: {r.stdout.strip()}"


def test_require_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "networkx", None)  # as if it were not installed
    with pytest.raises(_extras.MissingExtra, match=r"the karate club needs the 'graph' extra "
                                                   r"\(networkx is not installed\): "
                                                   r"pip install 'structconv\[graph\]'"):
        _extras.require("networkx", "graph", "the karate club")


def test_a_missing_extra_exits_2_with_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "networkx", None)
    rc = main(["train", "--config", "gcn_karate", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "needs the 'graph' extra" in err[0] and "structconv[graph]" in err[0]


def test_training_without_the_plots_extra_skips_only_the_picture(monkeypatch, tmp_path):
    from structconv.training import plot_curves

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.warns(UserWarning, match="curves.png skipped"):
        plot_curves(tmp_path, [{"epoch": 1, "train_loss": 1.0, "val_loss": 1.0,
                                "train_acc": 0.5, "val_acc": 0.5}])
    assert not (tmp_path / "curves.png").exists()

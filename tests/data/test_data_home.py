"""The data home: ``$STRUCTCONV_DATA``, else a per-user folder; no machine path in the library;
``structconv datasets`` says what is present, what is missing and where each dataset goes."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from structconv._extras import MissingExtra
from structconv.cli import main
from structconv.data import load_dataset
from structconv.data.planetoid import PLANETOID_FILES, _unpickle, load_planetoid
from structconv.data.registry import (
    DatasetError,
    data_root,
    dataset_dir,
    dataset_files,
    missing_files,
)
from tests.conftest import SRC  # noqa: E402


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh user: no $STRUCTCONV_DATA, $HOME in tmp_path, no $XDG_CACHE_HOME."""
    monkeypatch.delenv("STRUCTCONV_DATA", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return tmp_path / "user"


def test_no_machine_path_in_the_library():
    bad = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py")
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if "/work/" in line or "/shared/datasets" in line]
    assert not bad, bad


def test_the_data_home_and_its_defaults(home, monkeypatch, tmp_path):
    assert data_root() == home / ".cache" / "structconv" / "datasets"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root() == tmp_path / "xdg" / "structconv" / "datasets"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: ignored
    assert data_root() == home / ".cache" / "structconv" / "datasets"
    monkeypatch.setenv("STRUCTCONV_DATA", str(tmp_path / "mine"))
    assert data_root() == tmp_path / "mine"
    assert dataset_dir("cora") == tmp_path / "mine" / "planetoid"
    assert dataset_dir("wn18rr") == tmp_path / "mine" / "kg" / "WN18RR"
    assert dataset_dir("karate") is None


def test_missing_files_name_each_absent_file(home):
    assert missing_files("wn18rr") == ["train.txt", "valid.txt", "test.txt"]
    d = dataset_dir("wn18rr")
    d.mkdir(parents=True)
    (d / "train.txt").write_text("a\tr\tb\n")
    assert missing_files("wn18rr") == ["valid.txt", "test.txt"]
    for f in ("valid.txt", "test.txt"):
        (d / f).write_text("a\tr\tb\n")
    assert missing_files("wn18rr") == [] and missing_files("karate") == []
    assert dataset_files("cora") == tuple(f"ind.cora.{s}" for s in PLANETOID_FILES)
    assert load_dataset("wn18rr").num_entities == 2  # found in the per-user data home
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        missing_files("nope")


def test_a_missing_folder_names_the_data_home(home):
    with pytest.raises(DatasetError, match=r"dataset 'mnist': folder .*/\.cache/structconv/"
                                           r"datasets/mnist does not exist \(the data home is "
                                           r".*, the per-user default; set STRUCTCONV_DATA"):
        load_dataset("mnist")


def test_datasets_command_says_present_missing_and_where(home, capsys):
    d = dataset_dir("tinyshakespeare")
    d.mkdir(parents=True)
    (d / "input.txt").write_text("x" * 200)
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"data home: {data_root()} (the per-user default; set STRUCTCONV_DATA to "
                      "use another folder)")
    rows = {line.split()[0]: (line, nxt) for line, nxt in zip(out[1:], out[2:])
            if not line.startswith(" ")}
    line, where = rows["tinyshakespeare"]
    assert line.split()[1] == "present" and where.strip() == f"{d}/"
    line, where = rows["cora"]
    assert line.split()[1] == "missing"
    assert where.strip() == (f"{dataset_dir('cora')}/  needs ind.cora.x, ind.cora.y, "
                             "ind.cora.tx (+5 more)")
    line, where = rows["karate"]
    assert line.split()[1] == "ships" and "with its Python dependencies" in where


def test_planetoid_without_the_graph_extra_names_the_extra(tmp_path, monkeypatch, capsys):
    d = tmp_path / "planetoid"
    d.mkdir()
    blob = pickle.dumps(sp.csr_matrix(np.eye(3, dtype=np.float32)), protocol=2)
    for s in PLANETOID_FILES:
        (d / f"ind.cora.{s}").write_bytes(blob)
    monkeypatch.setitem(sys.modules, "scipy.sparse", None)  # as if scipy were not installed
    with pytest.raises(MissingExtra, match=r"loading Planetoid files needs the 'graph' extra "
                                           r"\(scipy is not installed\): pip install "
                                           r"'structconv\[graph\]'"):
        load_planetoid(d, "cora")
    # the restricted unpickler meets the scipy class inside a file: the same, not "corrupt"
    with pytest.raises(MissingExtra, match=r"needs the 'graph' extra"):
        _unpickle(d / "ind.cora.x", "x")
    monkeypatch.setenv("STRUCTCONV_DATA", str(tmp_path))
    rc = main(["train", "--config", "gcn_cora", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "pip install 'structconv[graph]'" in err[0], err
    assert "corrupt" not in err[0]

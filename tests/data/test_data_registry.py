"""Dataset registry and loaders: real parsing, splits, and clear errors for bad files."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from structconv.data import dataset_names, load_dataset
from structconv.data.images import read_idx
from structconv.data.registry import DatasetError
from structconv.data.text import load_text_file, python_text
from tests.conftest import need


def _write_idx(path: Path, arr: np.ndarray, magic_type: int = 0x08, gz: bool = True,
               cut: int = 0) -> Path:
    head = bytes([0, 0, magic_type, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    data = head + arr.astype(np.uint8).tobytes()
    data = data[:len(data) - cut]
    (gzip.open if gz else open)(path, "wb").write(data)
    return path


def test_registry_lists_every_family():
    names = set(dataset_names())
    assert {"digits", "karate", "python-text", "mnist", "fashion-mnist", "tinyshakespeare",
            "cora", "citeseer", "pubmed", "aifb", "mutag", "fb15k-237", "wn18rr"} <= names


def test_unknown_dataset_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown dataset 'nope'.*digits"):
        load_dataset("nope")


def test_digits_splits_are_disjoint_and_cover():
    d = load_dataset("digits", seed=3)
    assert d.shape == (1, 8, 8) and d.num_classes == 10
    sizes = {k: v[0].shape[0] for k, v in d.splits.items()}
    assert sum(sizes.values()) == 1797 and sizes["val"] == sizes["test"] == 270
    assert 0.0 <= float(d.splits["train"][0].min()) and float(d.splits["train"][0].max()) <= 1.0
    # disjoint: no image appears in two splits (digits has a few exact duplicates; compare rows)
    tr = {tuple(r.flatten().tolist()) for r in d.splits["train"][0]}
    te = [tuple(r.flatten().tolist()) for r in d.splits["test"][0]]
    assert sum(t in tr for t in te) < 10
    # the seed decides the split
    assert not torch.equal(load_dataset("digits", seed=4).splits["test"][1], d.splits["test"][1])


def test_karate_graph():
    d = load_dataset("karate")
    assert d.num_nodes == 34 and d.edge_index.shape == (2, 156) and d.num_classes == 2
    # undirected: every edge has its reverse
    e = {tuple(x) for x in d.edge_index.T.tolist()}
    assert all((b, a) in e for a, b in e)
    m = d.masks
    assert not (m["train"] & m["val"]).any() and not (m["train"] & m["test"]).any()
    assert (m["train"] | m["val"] | m["test"]).all()
    assert torch.bincount(d.y[m["train"]]).tolist() == [4, 4]


def test_python_text_ships_with_python():
    text = python_text()
    assert "Beautiful is better than ugly." in text and "def wrap(" in text
    d = load_dataset("python-text")
    ids = torch.cat([d.splits[k] for k in ("train", "val", "test")])
    assert "".join(d.vocab[i] for i in ids[:40].tolist()) == text[:40]


def test_idx_roundtrip_and_errors(tmp_path):
    arr = np.arange(2 * 3 * 4).reshape(2, 3, 4) % 256
    p = _write_idx(tmp_path / "ok-images-idx3-ubyte.gz", arr)
    np.testing.assert_array_equal(read_idx(p, ndim=3), arr)
    with pytest.raises(DatasetError, match="IDX rank 3, expected 1"):
        read_idx(p, ndim=1)
    bad = _write_idx(tmp_path / "bad.gz", arr, magic_type=0x42)
    with pytest.raises(DatasetError, match=r"bad\.gz: bad IDX magic 00004203"):
        read_idx(bad)
    cut = _write_idx(tmp_path / "cut.gz", arr, cut=5)
    with pytest.raises(DatasetError, match=r"cut\.gz: .*19 data bytes.*truncated"):
        read_idx(cut)
    notgz = tmp_path / "plain.gz"
    notgz.write_bytes(b"definitely not gzip")
    with pytest.raises(DatasetError, match=r"plain\.gz: not a readable gzip stream"):
        read_idx(notgz)
    with pytest.raises(DatasetError, match=r"missing\.gz: file not found"):
        read_idx(tmp_path / "missing.gz")


def test_mnist_style_folder_from_tmp(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 30), ("t10k", 10)):
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 5, 5)))
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", rng.integers(0, 10, (n,)))
    d = load_dataset("mnist", root=tmp_path, val=6)
    assert d.shape == (1, 5, 5)
    assert [d.splits[k][0].shape[0] for k in ("train", "val", "test")] == [24, 6, 10]
    # labels that do not match the images
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", rng.integers(0, 10, (9,)))
    with pytest.raises(DatasetError, match="t10k-images has 10 images but t10k-labels has 9"):
        load_dataset("mnist", root=tmp_path, val=6)
    os.remove(tmp_path / "train-images-idx3-ubyte.gz")
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte.gz: file not found"):
        load_dataset("fashion-mnist", root=tmp_path)
    with pytest.raises(DatasetError, match="folder .*nowhere does not exist"):
        load_dataset("mnist", root=tmp_path / "nowhere")


def test_text_file_errors(tmp_path):
    p = tmp_path / "latin.txt"
    p.write_bytes(b"caf\xe9 " * 50)
    with pytest.raises(DatasetError, match=r"latin\.txt: not UTF-8"):
        load_text_file(p)
    with pytest.raises(DatasetError, match=r"absent\.txt: file not found"):
        load_text_file(tmp_path / "absent.txt")
    (tmp_path / "short.txt").write_text("tiny")
    with pytest.raises(DatasetError, match="4 characters, expected at least 100"):
        load_text_file(tmp_path / "short.txt")


def test_missing_data_root_is_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("STRUCTCONV_DATA", str(tmp_path))
    with pytest.raises(DatasetError, match="dataset 'tinyshakespeare': folder .* does not exist"):
        load_dataset("tinyshakespeare")


def test_real_mnist_and_fashion():
    need("mnist")
    d = load_dataset("mnist", val=10000)
    assert [d.splits[k][0].shape[0] for k in ("train", "val", "test")] == [50000, 10000, 10000]
    assert torch.bincount(d.splits["test"][1]).tolist()[:3] == [980, 1135, 1032]
    need("fashion-mnist")
    f = load_dataset("fashion-mnist", limit=100)
    assert f.splits["train"][0].shape == (100, 1, 28, 28)


def test_real_tinyshakespeare():
    need("tinyshakespeare")
    d = load_dataset("tinyshakespeare")
    assert len(d.vocab) == 65 and sum(v.numel() for v in d.splits.values()) == 1115394
    assert "".join(d.vocab[i] for i in d.splits["train"][:14].tolist()) == "First Citizen:"


def test_real_cora_through_registry():
    need("cora")
    d = load_dataset("cora")
    assert (d.num_nodes, d.num_features, d.num_classes) == (2708, 1433, 7)
    assert [int(d.masks[k].sum()) for k in ("train", "val", "test")] == [140, 500, 1000]


def test_idx_sample_test_limit_and_validation_on_test(tmp_path):
    from tests.conftest import tiny_idx_images

    tiny_idx_images(tmp_path, train=30, test=10, side=5)
    full = load_dataset("fashion-mnist", root=tmp_path, val=0)
    d = load_dataset("fashion-mnist", root=tmp_path, val="test", sample=7, test_limit=4, seed=3)
    # the sample: the first 7 of a permutation drawn from the seed, as the study drew it
    idx = torch.randperm(30, generator=torch.Generator().manual_seed(3))[:7]
    torch.testing.assert_close(d.splits["train"][0], full.splits["train"][0][idx])
    assert torch.equal(d.splits["train"][1], full.splits["train"][1][idx])
    assert torch.equal(d.splits["test"][0], full.splits["test"][0][:4])
    assert d.splits["val"][0] is d.splits["test"][0]
    other = load_dataset("fashion-mnist", root=tmp_path, val=0, sample=7, seed=4)
    assert not torch.equal(other.splits["train"][0], d.splits["train"][0])
    for kw, msg in ((dict(sample=0), "sample must be an int >= 1"),
                    (dict(test_limit=1.5), "test_limit must be an int"),
                    (dict(val="train"), "val must be an int >= 0 .* or \"test\"")):
        with pytest.raises(DatasetError, match=msg):
            load_dataset("mnist", root=tmp_path, **kw)

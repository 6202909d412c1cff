"""Hostile dataset specs (``synthetic:...``, ``python-text:...``): a clear error naming the
option, or the dataset asked for.

Found by a probe: ``synthetic:noise=inf`` was accepted, ``seed=1e23`` (written out as an
integer) overflowed inside torch without naming the seed, a repeated key kept its last value;
python-text took ``limit=-5`` (dropping the last five characters) and ``val=1.5``.
"""

from __future__ import annotations

import pytest
import torch

from structconv.cli import main
from structconv.data import load_dataset
from structconv.data.registry import DatasetError, split_options
from structconv.data.text import encode_text

BIG_SEED = "1" + "0" * 23  # 1e23 written as an integer


@pytest.mark.parametrize("spec,error,match", [
    ("synthetic:noise=inf", DatasetError, r"noise must be a finite number >= 0, got inf"),
    ("synthetic:noise=nan", DatasetError, r"noise must be a finite number >= 0, got nan"),
    ("synthetic:noise=-1", DatasetError, r"noise must be a finite number >= 0, got -1"),
    ("synthetic:noise=true", DatasetError, r"noise must be a finite number >= 0, got True"),
    ("synthetic:seed=1e23", DatasetError, r"seed must be an int >= 0 \(and at most 2\^64 - 1\), "
                                          r"got 1e\+23"),
    (f"synthetic:seed={BIG_SEED}", DatasetError, rf"seed must be an int >= 0 .*, got {BIG_SEED}"),
    ("synthetic:seed=-1", DatasetError, r"seed must be an int >= 0 \(and at most 2\^64 - 1\)"),
    ("synthetic:nodes=1e30", DatasetError, r"nodes must be an int >= 2 \(and at most 2\^62\)"),
    (f"synthetic:edges={BIG_SEED}0000000000000000000", DatasetError,
     r"edges must be an int >= 2 \(and at most 2\^62\)"),
    ("synthetic:nodes=100,nodes=200", ValueError, r"option 'nodes' is given twice"),
    ("synthetic:nodes=100, nodes =100", ValueError, r"option 'nodes' is given twice"),
    ("synthetic:bogus=1", TypeError, r"unknown option\(s\) 'bogus' \(known: nodes, edges, "),
    ("synthetic:train=0.9,val=0.2", DatasetError, r"train \+ val must be at most 1"),
    ("python-text:limit=-5", DatasetError, r"python-text: limit must be an int >= 1, got -5"),
    ("python-text:limit=0", DatasetError, r"limit must be an int >= 1, got 0"),
    ("python-text:limit=2.5", DatasetError, r"limit must be an int >= 1, got 2\.5"),
    ("karate:val=2.0", DatasetError, r"karate: val must be a fraction in \[0, 1\), got 2\.0"),
    ("karate:train_per_class=-1", DatasetError, r"train_per_class must be an int >= 1, got -1"),
    ("karate:seed=-3", DatasetError, r"karate: seed must be an int in \[0, "),
    ("digits:test=-1", DatasetError, r"digits: test must be a fraction in \[0, 1\), got -1"),
    ("digits:val=0.9", ValueError, r"val=0\.9 \+ test=0\.15 leave no training images"),
    ("python-text:val=1.5", DatasetError, r"val must be a fraction in \[0, 1\), got 1\.5"),
    ("python-text:test=-0.1", DatasetError, r"test must be a fraction in \[0, 1\), got -0\.1"),
    ("python-text:val=nan", DatasetError, r"val must be a fraction in \[0, 1\), got nan"),
    ("python-text:val=0.6,test=0.5", DatasetError, r"val \+ test must be below 1"),
    ("python-text:val=0.1,val=0.2", ValueError, r"option 'val' is given twice"),
    ("python-text:limit=50", DatasetError, r"text has 50 characters, expected at least 100"),
])
def test_hostile_specs_are_named(spec, error, match):
    with pytest.raises(error, match=match):
        load_dataset(spec)


def test_good_specs_give_what_they_ask_for():
    g = load_dataset("synthetic:nodes=300,edges=1000,noise=0,seed=18446744073709551615")
    assert g.num_nodes == 300 and g.edge_index.shape == (2, 1000)
    # noise 0: every node's features are its block's centroid exactly
    for c in range(g.num_classes):
        rows = g.x[g.y == c]
        assert torch.equal(rows, rows[:1].expand_as(rows))
    t = load_dataset("python-text:limit=1000,val=0.1,test=0.2")
    assert [t.splits[k].numel() for k in ("train", "val", "test")] == [700, 100, 200]
    assert split_options("synthetic:nodes=10,edges=20") == ("synthetic", {"nodes": 10,
                                                                          "edges": 20})


def test_the_same_checks_hold_when_called_directly():
    text = "abcdefghij" * 20
    with pytest.raises(DatasetError, match=r"limit must be an int >= 1"):
        encode_text("t", text, limit=-5)
    with pytest.raises(DatasetError, match=r"val must be a fraction in \[0, 1\), got True"):
        encode_text("t", text, val=True)
    d = encode_text("t", text, val=0.0, test=0.0, limit=150)
    assert d.splits["train"].numel() == 150 and d.splits["val"].numel() == 0


@pytest.mark.parametrize("config,spec,match", [
    ("gcn_karate_sampled", "synthetic:noise=inf", r"noise must be a finite number >= 0"),
    ("gcn_karate_sampled", f"synthetic:nodes=100,seed={BIG_SEED}", r"seed must be an int >= 0"),
    ("gcn_karate_sampled", "synthetic:nodes=100,nodes=100", r"option 'nodes' is given twice"),
    ("transformer_python", "python-text:limit=-5", r"limit must be an int >= 1"),
    ("transformer_python", "python-text:val=1.5", r"val must be a fraction in \[0, 1\)"),
])
def test_the_command_line_says_it_in_one_line(tmp_path, capsys, config, spec, match):
    import re

    rc = main(["train", "--config", config, f'data.name="{spec}"', "train.epochs=1",
               "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and re.search(match, err[0]), (rc, err)


@pytest.mark.parametrize("kw,match", [
    (dict(val=-5), r"mnist: val \(training images held out\) must be an int >= 0, got -5"),
    (dict(val=2.5), r"val \(training images held out\) must be an int >= 0, got 2\.5"),
    (dict(seed=-1), r"mnist: seed must be an int in \[0, "),
    (dict(limit=-1), r"limit must be an int >= 1"),
])
def test_image_options_are_checked_before_any_file_is_read(tmp_path, kw, match):
    from structconv.data.images import load_idx_images

    # (the folder is empty: a check made after reading would fail on the missing files)
    with pytest.raises(DatasetError, match=match):
        load_idx_images(tmp_path, "mnist", **kw)

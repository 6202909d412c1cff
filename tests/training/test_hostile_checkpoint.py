"""Hand-edited ``checkpoint.json`` scalars: refused by ``load_checkpoint``, naming the field.

Before, ``"epoch": -5`` resumed and labelled the epochs -4..4; a string epoch, a float, a NaN
learning rate or a path in ``file`` were taken as they came.
"""

from __future__ import annotations

import json

import pytest
import torch

from structconv.cli import main
from structconv.training.checkpoint import (
    CHECKPOINT_JSON,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    save_checkpoint(tmp_path, 3, model.state_dict(), opt.state_dict(), {"best": 0.5})
    return tmp_path


def _edit(run, fn):
    p = run / CHECKPOINT_JSON
    meta = json.loads(p.read_text())
    fn(meta)
    p.write_text(json.dumps(meta))


def _set(*path_and_value):
    *path, value = path_and_value

    def fn(meta):
        d = meta
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return fn


EDITS = [
    (_set("epoch", -5), r"epoch must be an int >= 0, got -5"),
    (_set("epoch", 2.5), r"epoch must be an int >= 0, got 2.5"),
    (_set("epoch", "3"), r"epoch must be an int >= 0, got '3'"),
    (_set("epoch", True), r"epoch must be an int >= 0, got True"),
    (_set("epoch", None), r"epoch must be an int >= 0, got None"),
    (lambda m: m.pop("epoch"), r"field 'epoch' is missing"),
    (_set("file", "../../elsewhere/ckpt-000003.safetensors"), r"file must be the name of a"),
    (_set("file", "checkpoint.json"), r"file must be the name of a \.safetensors file"),
    (_set("file", ""), r"file must be the name"),
    (_set("sha256", "xyz"), r"sha256 must be 64 lowercase hex digits"),
    (_set("sha256", 7), r"sha256 must be 64 lowercase hex digits, got 7"),
    (_set("has_best", "yes"), r"has_best must be true or false"),
    (lambda m: m["rng"]["python"].__setitem__(1, [1] * 10), r"rng\.python must be Python's"),
    (lambda m: m["rng"]["python"][1].__setitem__(0, 2**40), r"rng\.python must be Python's"),
    (lambda m: m["rng"]["python"].__setitem__(2, "x"), r"rng\.python's gauss must be null"),
    (lambda m: m["rng"]["numpy"].__setitem__(1, 9999), r"rng\.numpy must be NumPy's state"),
    (lambda m: m["rng"]["numpy"].__setitem__(0, "PCG64"), r"rng\.numpy must be NumPy's state"),
]


@pytest.mark.parametrize("edit,match", EDITS)
def test_edited_scalars_are_refused_by_name(saved, edit, match):
    assert load_checkpoint(saved)["epoch"] == 3  # the untouched checkpoint loads
    _edit(saved, edit)
    with pytest.raises(CheckpointError, match=rf"checkpoint\.json: corrupt checkpoint metadata "
                                              rf"\(.*{match}"):
        load_checkpoint(saved)


# the kinds of the hyper-parameters are checked by the trainer against its fresh optimizer
# (tests/core/test_hostile.py); their ranges, as torch's constructors check them, here
@pytest.mark.parametrize("key,value,match", [
    ("lr", -0.1, r"param_groups\[0\]\.lr must be >= 0, got -0\.1"),
    ("eps", -1e-8, r"param_groups\[0\]\.eps must be >= 0"),
    ("weight_decay", -1, r"param_groups\[0\]\.weight_decay must be >= 0, got -1"),
    ("betas", [0.9, 1.5], r"param_groups\[0\]\.betas must lie in \[0, 1\), got \[0\.9, 1\.5\]"),
    ("betas", [-0.1, 0.9], r"param_groups\[0\]\.betas must lie in \[0, 1\)"),
])
def test_hyper_parameters_out_of_range_are_refused(saved, key, value, match):
    _edit(saved, lambda m: m["optimizer"]["param_groups"][0].__setitem__(key, value))
    with pytest.raises(CheckpointError, match=rf"corrupt optimizer metadata \({match}"):
        load_checkpoint(saved)


def test_metadata_that_is_not_an_object(saved):
    (saved / CHECKPOINT_JSON).write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"a JSON list, expected an object"):
        load_checkpoint(saved)
    (saved / CHECKPOINT_JSON).write_text("[" * 100_000)
    with pytest.raises(CheckpointError, match=r"corrupt checkpoint metadata"):
        load_checkpoint(saved)


def test_a_negative_epoch_does_not_resume(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config", "gcn_karate", "train.epochs=4", "train.checkpoint_every=1",
                 "--stop-after", "2", "--out", str(run)]) == 0
    capsys.readouterr()
    _edit(run, _set("epoch", -5))
    rc = main(["train", "--resume", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "epoch must be an int >= 0, got -5" in err[0]


# -- the trainer state: every field checked on resume ------------------------------------------
@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A gcn_karate run stopped after 2 of its 4 epochs (checkpoint each epoch)."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    assert main(["train", "--config", "gcn_karate", "train.epochs=4", "train.checkpoint_every=1",
                 "--stop-after", "2", "--out", str(run)]) == 0
    return run


TRAINER_EDITS = [
    (_set("trainer", "stopped", "no"), r"trainer\.stopped \(must be true or false, got 'no'\)"),
    (_set("trainer", "history", 5), r"trainer\.history \(must be a list of 2 rows"),
    (_set("trainer", "history", [{}, {}, {}]), r"trainer\.history \(must be a list of 2 rows"),
    (_set("trainer", "best", "high"), r"trainer\.best \(must be null or a finite number"),
    (_set("trainer", "best_epoch", 7), r"trainer\.best_epoch \(must be an int in \[0, 2\]"),
    (_set("trainer", "bad_epochs", -1), r"trainer\.bad_epochs \(must be an int in \[0, 2\]"),
    (_set("trainer", "steps", "many"), r"trainer\.steps \(must be an int >= 0"),
    (lambda m: m["trainer"].pop("best"), r"trainer\.best \(missing\)"),
    (_set("trainer", "oops", 1), r"trainer\.oops \(not a field the trainer writes\)"),
    (_set("trainer", "partial", {"epoch": 3}), r"trainer\.partial \(must have the keys"),
]


@pytest.mark.parametrize("edit,match", TRAINER_EDITS)
def test_edited_trainer_state_is_refused_by_field(stopped_run, tmp_path, capsys, edit, match):
    import re
    import shutil

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    (run / ".lock").unlink(missing_ok=True)
    _edit(run, edit)
    capsys.readouterr()
    rc = main(["train", "--resume", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert re.search(match, err[0]) and "corrupt trainer." in err[0], err[0]

"""``structconv reproduce kg-link``: hostile arguments and run folders continued with other
settings.

Before, the arguments were unchecked (``--dim -4``, ``--batch 0``, ``--eval-every 0``,
``--label-smoothing 2``, ``--negatives 0``, ``--edge-dropout 1.5``, ``--epochs -3`` ran, crashed
or trained nothing) and the run folder, keyed by 5 of the options, resumed silently with changed
settings: ``--lr 5.0 --reg none`` after ``--lr 0.1`` reported the new settings with the old
losses, ``--optimizer adam`` after adagrad raised an internal KeyError, ``--top 5`` after
``--top 3`` an internal state_dict error. Each case now: exit 2 and one line naming the option
(and, for a folder, each differing setting with both values), or a correct result.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from structconv.cli import main
from structconv.experiments.kg_link import KEYED, SETTINGS_JSON


def _write_kg(folder, seed=0, groups=8, size=5, R=3):
    """Relation r links every entity of group g to every entity of group g XOR (r + 1): a graph
    DistMult can learn; train / valid / test files of ``head<TAB>relation<TAB>tail``."""
    ent = torch.arange(groups * size)
    g = ent // size
    rows = [(a, r, b) for r in range(R) for a in ent.tolist()
            for b in ent[g == (g[a] ^ (r + 1))].tolist()]
    trip = torch.tensor(rows)
    trip = trip[torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))]
    n = int(0.8 * len(rows))
    folder.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", trip[:n]), ("valid", trip[n:n + 20]), ("test", trip[n + 20:])):
        (folder / f"{split}.txt").write_text(
            "".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in part.tolist()))
    return folder


@pytest.fixture
def kg(tmp_path):
    return _write_kg(tmp_path / "kg" / "WN18RR")


def _recipe(kg, out, *args) -> list[str]:
    return ["reproduce", "kg-link", "--dataset", "wn18rr", "--data", str(kg), "--out", str(out),
            "--dim", "10", "--batch", "64", "--mode", "1vsall", "--epochs", "2", *map(str, args)]


def _refused(capsys, rc: int) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    # a value out of an option's range is refused by the option's type, the rest by the schema
    assert err.startswith(("structconv: error: reproduce kg-link: ",
                           "structconv: error: argument --")), err
    return err


def _result(out, tag="wn18rr-distmult-1vsall-d10-enc0") -> dict:
    return json.loads((out / "kg_link" / tag / "result.json").read_text())


# -- arguments: checked as a [model.link] / [train.link] config's keys, before anything is read --
BAD = [
    (["--dim", "-4"], r"--dim must be an int in 1..1000000, got -4"),
    (["--dim", "0"], r"--dim must be an int in 1..1000000, got 0"),
    (["--dim", "7", "--decoder", "complex"], r"--dim must be even for complex"),
    (["--batch", "0"], r"--batch must be an int >= 1, got 0"),
    (["--batch", "-1"], r"--batch must be an int >= 1, got -1"),
    (["--eval-every", "0"], r"--eval-every must be an int in \[1, 1,000,000\], got 0"),
    (["--eval-batch", "0"], r"--eval-batch must be an int >= 1, got 0"),
    (["--label-smoothing", "2"], r"--label-smoothing must be in \[0, 1\), got 2\.0"),
    (["--label-smoothing", "nan"], r"--label-smoothing must be in \[0, 1\), got nan"),
    (["--negatives", "0"], r"--negatives must be an int in \[1, 10,000\], got 0"),
    (["--edge-dropout", "1.5"], r"--edge-dropout must be in \[0, 1\), got 1\.5"),
    (["--edge-dropout", "-0.1"], r"--edge-dropout must be in \[0, 1\), got -0\.1"),
    (["--epochs", "-3"], r"--epochs must be an int >= 0, got -3"),
    (["--epochs", "0"], r"--epochs must be >= 1, got 0"),
    (["--lr", "-1"], r"--lr must be a number >= 0, got -1\.0"),
    (["--lr", "inf"], r"--lr must be a number >= 0, got inf"),
    (["--lr", "1e31"], r"--lr must be at most 1e\+30"),
    (["--init-std", "0"], r"--init-std must be a number in \(0, 1000\], got 0\.0"),
    (["--reg-weight", "-1"], r"--reg-weight must be a number in \[0, 1e30\], got -1\.0"),
    (["--encoder-layers", "-1"], r"--encoder-layers must be an int in 0..100, got -1"),
    (["--top", "0"], r"--top must be an int in 1..10000, got 0"),
    (["--block", "0"], r"--block must be an int >= 1, got 0"),
    (["--encoder-layers", "1", "--block", "3"], r"--block=3 must divide --dim=10"),
    (["--sorts", "mined"], r"--sorts='mined' needs an R-GCN encoder: set --encoder-layers >= 1"),
    (["--time-limit", "-5"], r"--time-limit must be a number of seconds > 0, got -5\.0"),
    (["--time-limit", "nan"], r"--time-limit must be a number of seconds > 0, got nan"),
    (["--threads", "-2"], r"--threads must be in \[0, \d+\] .*got -2"),
    (["--threads", str((os.cpu_count() or 1) + 1)], r"--threads must be in \[0, \d+\]"),
    (["--seed", "-1"], r"--seed: must be an integer in \[0, 4294967295\], got -1"),
    (["--seed", str(2**70)], r"--seed: must be an integer in \[0, 4294967295\]"),
    (["--tag", "../escape"], r"--tag must be a plain folder name \(no path\), got '\.\./escape'"),
    (["--tag", ""], r"--tag must be a plain folder name"),
    (["--tag", ".."], r"--tag must be a plain folder name"),
]


@pytest.mark.parametrize("args,match", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, match):
    import re

    missing = tmp_path / "no_data"  # refused before any file is read
    rc = main(_recipe(missing, tmp_path / "runs", *args))
    err = _refused(capsys, rc)
    assert re.search(match, err), err
    assert not (tmp_path / "runs").exists()


def test_argparse_refusals_are_one_line_too(tmp_path, capsys):
    for args in (["--dim", "four"], ["--mode", "both"], ["--optimizer", "lbfgs"]):
        rc = main(_recipe(tmp_path, tmp_path / "runs", *args))
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err


def test_missing_data_is_one_line(tmp_path, capsys):
    rc = main(_recipe(tmp_path / "nowhere", tmp_path / "runs", "--quick"))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "nowhere" in err, err


# -- run folders: keyed by every setting that changes the result ----------------------------------
def test_a_folder_records_its_settings_and_refuses_others(kg, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(_recipe(kg, out, "--quick", "--lr", "0.1")) == 0
    folder = out / "kg_link" / "wn18rr-distmult-1vsall-d10-enc0"
    saved = json.loads((folder / SETTINGS_JSON).read_text())
    assert set(saved) == {*KEYED, "data"} and saved["lr"] == 0.1
    assert saved["negatives"] is None and saved["top"] is None  # no effect in 1-vs-all
    before = (folder / "result.json").read_text()
    capsys.readouterr()
    err = _refused(capsys, main(_recipe(kg, out, "--quick", "--lr", "5.0", "--reg", "none")))
    assert "--lr 0.1 in the run, 5.0 now" in err and "--reg n3 in the run, none now" in err
    assert "--reg-weight 0.05 in the run, (no effect) now" in err
    assert f"start fresh with another --tag (or --out), or delete {folder}" in err
    err = _refused(capsys, main(_recipe(kg, out, "--quick", "--optimizer", "adam")))
    assert "--optimizer adagrad in the run, adam now" in err
    err = _refused(capsys, main(_recipe(kg, out, "--quick", "--seed", "3")))
    assert "--seed 0 in the run, 3 now" in err
    assert (folder / "result.json").read_text() == before  # nothing was trained or written
    # what the run computes is unchanged by these: it continues
    assert main(_recipe(kg, out, "--quick", "--negatives", "4", "--eval-every", "5",
                        "--eval-batch", "7", "--threads", "1")) == 0


def test_mined_sorts_are_keyed_by_top(kg, tmp_path, capsys):
    out = tmp_path / "runs"
    base = ["--quick", "--mode", "negative", "--encoder-layers", "1", "--sorts", "mined",
            "--tag", "m"]
    assert main(_recipe(kg, out, *base, "--top", "2")) == 0
    capsys.readouterr()
    err = _refused(capsys, main(_recipe(kg, out, *base, "--top", "3")))
    assert "--top 2 in the run, 3 now" in err
    err = _refused(capsys, main(_recipe(kg, out, *base, "--top", "2", "--edge-dropout", "0.1")))
    assert "--edge-dropout 0.4 in the run, 0.1 now" in err


def test_other_data_under_the_same_name_is_refused(kg, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(_recipe(kg, out, "--quick")) == 0
    other = _write_kg(tmp_path / "other" / "WN18RR", seed=1)  # the same triples, other splits
    capsys.readouterr()
    err = _refused(capsys, main(_recipe(other, out, "--quick")))
    assert "the data (its content) " in err and " in the run, " in err
    # the same content in another folder is the same run
    copy = tmp_path / "copy" / "WN18RR"
    copy.mkdir(parents=True)
    for f in kg.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    assert main(_recipe(copy, out, "--quick")) == 0


def test_continuing_with_more_epochs_equals_one_longer_run(kg, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(_recipe(kg, a, "--quick")) == 0
    assert main(_recipe(kg, a, "--epochs", "3")) == 0
    assert main(_recipe(kg, b, "--epochs", "3")) == 0
    ra, rb = _result(a), _result(b)
    assert ra["epochs_done"] == rb["epochs_done"] == 3
    assert [h["loss"] for h in ra["history"]] == [h["loss"] for h in rb["history"]]
    assert ra["test"] == rb["test"]


def test_a_folder_without_recorded_settings_is_not_continued(kg, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(_recipe(kg, out, "--quick")) == 0
    folder = out / "kg_link" / "wn18rr-distmult-1vsall-d10-enc0"
    (folder / SETTINGS_JSON).unlink()  # a run written before settings were recorded
    capsys.readouterr()
    err = _refused(capsys, main(_recipe(kg, out, "--quick")))
    assert f"settings were not recorded (no {SETTINGS_JSON})" in err
    (folder / SETTINGS_JSON).write_text("{not json")
    err = _refused(capsys, main(_recipe(kg, out, "--quick")))
    assert "settings.json: unreadable" in err


def test_a_folder_that_never_trained_takes_the_new_settings(kg, tmp_path):
    out = tmp_path / "runs"
    folder = out / "kg_link" / "wn18rr-distmult-1vsall-d10-enc0"
    folder.mkdir(parents=True)
    (folder / SETTINGS_JSON).write_text(json.dumps({"lr": 99.0}))  # started, nothing saved
    assert main(_recipe(kg, out, "--quick")) == 0
    assert json.loads((folder / SETTINGS_JSON).read_text())["lr"] == 0.1


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(data, runs folder) of one --quick run, to copy."""
    root = tmp_path_factory.mktemp("link")
    kg = _write_kg(root / "kg" / "WN18RR")
    assert main(_recipe(kg, root / "runs", "--quick")) == 0
    return kg, root / "runs"


@pytest.mark.parametrize("text,match", [
    ("[]", r"settings\.json: unreadable \(a JSON object of settings expected, got list\)"),
    ("[" * 100_000 + "]" * 100_000, r"settings\.json: unreadable \("),
    ('{"lr": ' + "9" * 5000 + "}", r"settings\.json: unreadable \(Exceeds"),
    ('{"data": 5}', r"the data \(its content\) 5\.\.\. in the run, [0-9a-f]{12}\.\.\. now"),
    ('{"lr": "a\\nb\\u2028c"}', r"--lr a b c in the run, 0\.1 now"),
    ('{"x\\ny": 1}', r"setting 'x\\ny' 1 in the run, \(no effect\) now"),
    (json.dumps({f"k{i}": i for i in range(100)}), r"; and \d+ more; continue it"),
], ids=["list", "deep", "digits", "data-number", "newlines", "odd-key", "many"])
def test_a_hand_edited_settings_file_is_one_line(trained, tmp_path, capsys, text, match):
    import re
    import shutil

    kg, out = trained[0], tmp_path / "runs"
    shutil.copytree(trained[1], out)
    folder = out / "kg_link" / "wn18rr-distmult-1vsall-d10-enc0"
    (folder / SETTINGS_JSON).write_text(text, encoding="utf-8")
    capsys.readouterr()
    err = _refused(capsys, main(_recipe(kg, out, "--quick")))
    assert re.search(match, err), err
    assert err.endswith(f"or delete {folder}") or "unreadable" in err, err


def test_a_run_trains_its_shipped_config_with_the_options_as_overrides(trained):
    import argparse

    from structconv.config import load_config
    from structconv.experiments.kg_link import base_config, overrides

    folder = trained[1] / "kg_link" / "wn18rr-distmult-1vsall-d10-enc0"
    saved = json.loads((folder / "config.json").read_text())
    result = _result(trained[1])
    args = argparse.Namespace(**result["settings"])
    assert base_config(args) == result["config"] == "complex_wn18rr"
    cfg = load_config(result["config"], overrides(args, result["settings"]["epochs"]))
    assert {**cfg, "name": saved["name"]} == saved
    assert saved["model"]["link"]["decoder"] == "distmult" and saved["model"]["link"]["dim"] == 10
    assert saved["train"]["grad_clip"] == 0.0 and saved["train"]["link"]["val_limit"] == 0

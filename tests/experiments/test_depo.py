"""The Depo-style k-hop task (structconv.data.depo) and its recipe (reproduce canon): the
generator against a reference solver that reads only the tokens, seeding, the oracle's
accuracy, and the quick recipe end to end (configs plus a sweep of engine runs: resumed,
read back, refused with other options). The task on the training loop:
tests/training/test_hop_task.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

import structconv as sc
from structconv.cli import main
from structconv.data.depo import DepoTask, eval_sets, generate, solve
from structconv.experiments import canon
from structconv.experiments.shift_heads import parse_kinds
from structconv.nn.lm import split_kind
from structconv.training.tasks.hops import accuracy_per_k, depth
from tests.conftest import stop_at

TASK = DepoTask(nodes=20, n=9, max_hops=5, queries=4)


def _gen(seed, batch=64, task=TASK, **kw):
    return generate(task, batch, torch.Generator().manual_seed(seed), **kw)


def test_layout_and_tokens():
    b = _gen(0)
    T = 3 * TASK.n + 4 * TASK.queries
    assert b.ids.shape == (64, T) == (64, TASK.length) and b.ids.dtype == torch.long
    assert int(b.ids.min()) >= 0 and int(b.ids.max()) < TASK.vocab_size
    pairs = b.ids[:, :3 * TASK.n].reshape(64, TASK.n, 3)
    assert (pairs[:, :, 2] == TASK.sep).all() and (pairs[:, :, :2] < TASK.nodes).all()
    qs = b.ids[:, 3 * TASK.n:].reshape(64, TASK.queries, 4)
    assert (qs[:, :, 0] == TASK.query).all()
    assert torch.equal(qs[:, :, 1], b.starts) and torch.equal(qs[:, :, 3], b.answers)
    assert torch.equal(qs[:, :, 2], TASK.hop(b.hops))
    # the hop token sits where the answer is predicted
    assert torch.equal(b.ids[:, TASK.positions], TASK.hop(b.hops))
    assert torch.equal(b.ids[:, TASK.positions + 1], b.answers)


def test_pairs_form_one_cycle_and_answers_are_kth_successors():
    b = _gen(1)
    n = TASK.n
    for i in range(64):
        pairs = b.ids[i, :3 * n].reshape(n, 3)[:, :2].tolist()
        succ = dict(pairs)
        assert len(succ) == n and sorted(succ) == sorted(succ.values())  # a permutation
        node, seen = pairs[0][0], set()
        while node not in seen:  # one cycle through all n nodes
            seen.add(node)
            node = succ[node]
        assert len(seen) == n
        starts = b.starts[i].tolist()
        assert len(set(starts)) == TASK.queries  # distinct starts
        for q, k, a in zip(starts, b.hops[i].tolist(), b.answers[i].tolist()):
            x = q
            for _ in range(k):
                x = succ[x]
            assert x == a and a != q
    assert torch.equal(solve(TASK, b.ids), b.answers)


def test_hops_are_uniform_and_can_be_fixed():
    b = _gen(2, batch=2000)
    counts = torch.bincount(b.hops.flatten(), minlength=TASK.max_hops + 1)[1:]
    assert counts.min() > 0.8 * counts.float().mean()  # 1..max_hops, none missing
    assert int(b.hops.min()) == 1 and int(b.hops.max()) == TASK.max_hops
    b3 = _gen(3, hops=3)
    assert (b3.hops == 3).all() and torch.equal(solve(TASK, b3.ids), b3.answers)
    given = torch.randint(1, TASK.max_hops + 1, (64, TASK.queries))
    assert torch.equal(_gen(3, hops=given).hops, given)


def test_seeded_and_seeds_differ():
    assert torch.equal(_gen(5).ids, _gen(5).ids)
    assert not torch.equal(_gen(5).ids, _gen(6).ids)


def test_bad_sizes_name_the_value():
    for kw, msg in ((dict(n=8, nodes=5), "n=8 nodes per instance"),
                    (dict(n=6, max_hops=6), "max_hops=6 must be below n=6"),
                    (dict(n=4, queries=5, max_hops=3), "queries=5 distinct starts"),
                    (dict(n=1), "n must be an int >= 2"), (dict(queries=0), "queries must be")):
        with pytest.raises(ValueError, match=msg):
            DepoTask(**kw)
    with pytest.raises(ValueError, match="hops=9 exceeds"):
        _gen(0, hops=9)
    with pytest.raises(ValueError, match="hops must be"):
        _gen(0, hops=torch.zeros(64, TASK.queries, dtype=torch.long))


class _Oracle(torch.nn.Module):
    """Logits that put all mass on the reference solver's answer at every hop token."""

    def __init__(self, task, wrong=False):
        super().__init__()
        self.task, self.wrong = task, wrong

    def forward(self, ids):
        B, T = ids.shape
        out = torch.zeros(B, T, self.task.vocab_size)
        # ids end at a hop token: q questions, the last one's answer not yet written
        t = dataclasses.replace(self.task, queries=(T - 3 * self.task.n + 1) // 4)
        ans = solve(t, torch.cat([ids, ids.new_zeros(B, 1)], 1))
        if self.wrong:
            ans = (ans + 1) % self.task.nodes
        out[torch.arange(B)[:, None], t.positions[None], ans] = 1.0
        return out


def test_accuracy_scores_the_answers_of_fixed_sets():
    sets = eval_sets(TASK, 40)
    assert set(sets) == set(range(1, TASK.max_hops + 1))
    for k, (ids, ans) in sets.items():
        assert ids.shape == (40, 3 * TASK.n + 4) and ans.shape == (40,)
        assert (ids[:, 3 * TASK.n + 2] == TASK.hop(k)).all()
        assert torch.equal(ids, eval_sets(TASK, 40)[k][0])  # fixed: seeded per k
    assert accuracy_per_k(_Oracle(TASK), sets, TASK) == {k: 1.0 for k in sets}
    assert accuracy_per_k(_Oracle(TASK, wrong=True), sets, TASK) == {k: 0.0 for k in sets}
    assert not torch.equal(eval_sets(TASK, 40, seed=1)[1][0], sets[1][0])
    assert depth({1: 1.0, 2: 0.95, 3: 0.5, 4: 0.99}, 0.9) == 2
    assert depth({1: 0.2, 2: 1.0}, 0.9) == 0


def test_study_kinds_are_the_issues_arms_and_all_build():
    kinds = parse_kinds(",".join(canon.STUDY_KINDS))
    assert len(kinds) == 12 and "relative" in kinds and "alibi" in kinds
    assert {split_kind(k)[1] for k in kinds} == {"", "ABCD", "A", "B", "C", "D"}
    with pytest.raises(ValueError, match="unknown position kind"):
        parse_kinds("none,nonsense")
    with pytest.raises(ValueError, match="unknown Canon place"):
        parse_kinds("none+Canon-Z")


def test_a_model_learns_one_hop_and_the_harness_sees_it(tmp_path):
    # a real (small) training through the shipped config: 1-hop answers are learned far
    # above chance, evaluated after each epoch of 300 steps (one thread: a model this small
    # gains nothing from more, and contends on a shared CPU)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = _one_hop(tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert res["val_acc@1"] > 0.6 > 1 / 5
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [300, 600]


def _one_hop(tmp_path) -> dict:
    return sc.train("transformer_depo", tmp_path / "run", overrides=[
        "data.options={nodes=8, n=5, max_hops=2, queries=3, eval_per_k=64}",
        "data.batch_size=32", "data.batches_per_epoch=300", "model.lm.width=32",
        "model.lm.layers=2", "model.lm.heads=2", "model.lm.ffn=64", "train.lr=0.003",
        "train.max_steps=600", "train.epochs=2", "train.warmup_steps=60",
        "train.depo.curriculum=0.0"])


def test_quick_recipe_runs_resumes_and_writes_every_kind(tmp_path, capsys):
    cmd = [sys.executable, "-m", "structconv.cli", "reproduce", "canon", "--quick",
           "--threads", "1", "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "canon.json").read_text())
    run_kinds = list(canon.STUDY_KINDS)
    assert list(res["kinds"]) == run_kinds
    unit = 2 * 16 + 1 + 4  # one unit of feed-forward width of the quick model (1 layer)
    assert all(abs(v["params"] - res["budget"]) <= unit // 2 + 1 for v in res["kinds"].values())
    for v in res["kinds"].values():
        assert set(v["accuracy"]) == {"1", "2", "3"}
    assert (tmp_path / "canon.png").is_file()
    runs = tmp_path / "canon_runs"
    # every arm a run directory of the shipped config with its overrides, trained by the engine
    assert len(list(runs.glob("*/best.safetensors"))) == len(run_kinds)
    cfg = json.loads((runs / "shift+Canon-ABCD-s0-12" / "config.json").read_text())
    assert cfg["name"] == "transformer_depo" and cfg["model"]["lm"]["position"] == "shift"
    assert cfg["train"]["max_steps"] == 12 and cfg["data"]["options"]["max_hops"] == 3
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # resumes
    assert r.returncode == 0 and "seed 0 (12 steps)" not in r.stdout
    again = json.loads((tmp_path / "canon.json").read_text())
    assert again["kinds"] == res["kinds"]
    bad = subprocess.run([*cmd[:-2], "--kinds", "none+Canon-Q", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "unknown Canon place" in bad.stderr
    # a run directory made with other options is refused, not read back
    assert main([*cmd[3:], "--kinds", "none", "--width", "24"]) == 2
    err = capsys.readouterr().err
    assert "another config" in err and "model.lm.width" in err, err


def test_an_interrupted_canon_sweep_resumes_to_the_same_numbers(monkeypatch, tmp_path):
    argv = ["reproduce", "canon", "--quick", "--kinds", "none,shift+Canon-AD", "--threads", "1"]
    assert main([*argv, "--out", str(tmp_path / "ref")]) == 0
    with monkeypatch.context() as m:
        stop_at(m, 12 + 8)  # none's 12 steps, then shift+Canon-AD's epoch 2, step 2 of 6
        assert main([*argv, "--out", str(tmp_path / "run")]) == 130
    cut = tmp_path / "run" / "canon_runs" / "shift+Canon-AD-s0-12"
    assert (cut / "checkpoint.json").is_file() and not (cut / "result.json").exists()
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    ref, got = (json.loads((tmp_path / d / "canon.json").read_text()) for d in ("ref", "run"))
    for r, g in zip(ref["runs"], got["runs"]):
        assert g["curve"] == r["curve"] and g["accuracy"] == r["accuracy"]
        assert g["train_loss"] == r["train_loss"] and g["params"] == r["params"]

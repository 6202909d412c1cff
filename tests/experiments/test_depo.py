"""The Depo-style k-hop task (structconv.data.depo) and its recipe (reproduce canon): the
generator against a reference solver that reads only the tokens, seeding, the harness's loss
and accuracy, and the quick recipe end to end."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from structconv.data.depo import DepoTask, generate, solve
from structconv.experiments import canon
from structconv.experiments.shift_heads import parse_kinds
from structconv.nn.lm import TransformerLM, split_kind

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


def test_accuracy_and_loss_score_the_answers():
    sets = canon.eval_sets(TASK, 40)
    assert set(sets) == set(range(1, TASK.max_hops + 1))
    for k, (ids, ans) in sets.items():
        assert ids.shape == (40, 3 * TASK.n + 4) and ans.shape == (40,)
        assert (ids[:, 3 * TASK.n + 2] == TASK.hop(k)).all()
    assert canon.accuracy_per_k(_Oracle(TASK), sets, TASK) == {k: 1.0 for k in sets}
    assert canon.accuracy_per_k(_Oracle(TASK, wrong=True), sets, TASK) == {k: 0.0 for k in sets}
    b = _gen(7)
    good = canon.answer_loss(_Oracle(TASK), b.ids, b.answers, TASK)
    bad = canon.answer_loss(_Oracle(TASK, wrong=True), b.ids, b.answers, TASK)
    assert float(good) < float(bad)
    assert canon.depth({1: 1.0, 2: 0.95, 3: 0.5, 4: 0.99}, 0.9) == 2
    assert canon.depth({1: 0.2, 2: 1.0}, 0.9) == 0


def test_answer_loss_never_feeds_the_answers():
    # the model sees ids up to the last hop token: changing answers leaves the logits unchanged
    torch.manual_seed(0)
    m = TransformerLM(TASK.vocab_size, 16, 1, 2, "none", canon="ABCD").double()
    b = _gen(8)
    ids2 = b.ids.clone()
    ids2[:, TASK.positions[-1] + 1] = (ids2[:, TASK.positions[-1] + 1] + 1) % TASK.nodes
    assert torch.equal(canon.answer_loss(m, b.ids, b.answers, TASK),
                       canon.answer_loss(m, ids2, b.answers, TASK))


def test_curriculum_grows_the_hops_from_one_to_the_maximum():
    a = argparse.Namespace(curriculum=0.5, steps=1000)
    reach = [canon.reach_at(s, a, 8) for s in range(1000)]
    assert reach[0] == 1 and reach[499] == 8 and reach[-1] == 8
    assert all(x <= y for x, y in zip(reach, reach[1:])) and set(reach) == set(range(1, 9))
    assert reach.index(2) == 63  # each new k after 1/8 of the half: step 500/8 = 62.5
    assert canon.reach_at(0, argparse.Namespace(curriculum=0.0, steps=1000), 8) == 8


def test_study_kinds_are_the_issues_arms_and_all_build():
    kinds = parse_kinds(",".join(canon.STUDY_KINDS))
    assert len(kinds) == 12 and "relative" in kinds and "alibi" in kinds
    assert {split_kind(k)[1] for k in kinds} == {"", "ABCD", "A", "B", "C", "D"}
    with pytest.raises(ValueError, match="unknown position kind"):
        parse_kinds("none,nonsense")
    with pytest.raises(ValueError, match="unknown Canon place"):
        parse_kinds("none+Canon-Z")


def test_a_model_learns_one_hop_and_the_harness_sees_it():
    # a real (small) training: 1-hop answers are learned far above chance, and the curve,
    # depth and equal-parameter bookkeeping come out of train_one
    task = DepoTask(nodes=8, n=5, max_hops=2, queries=3)
    a = argparse.Namespace(width=32, layers=2, heads=2, shifts=2, canon_kernel=4, lr=3e-3,
                           steps=600, batch=32, eval_per_k=64, eval_every=300, depth_at=0.9,
                           curriculum=0.0)
    res, model = canon.train_one("none+Canon-ABCD", 0, task, a, 64)
    assert res["accuracy"][1] > 0.6 > 1 / task.n
    assert [c["step"] for c in res["curve"]] == [300, 600]
    assert res["params"] == sum(p.numel() for p in model.parameters())


def test_quick_recipe_runs_resumes_and_writes_every_kind(tmp_path):
    cmd = [sys.executable, "-m", "structconv.cli", "reproduce", "canon", "--quick",
           "--out", str(tmp_path)]
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
    assert len(list((tmp_path / "canon_runs").glob("*.safetensors"))) == len(run_kinds)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # resumes
    assert r.returncode == 0 and "seed 0 (12 steps)" not in r.stdout
    bad = subprocess.run([*cmd[:-2], "--kinds", "none+Canon-Q", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "unknown Canon place" in bad.stderr


def test_a_killed_run_resumes_from_its_checkpoint_and_ends_as_the_uninterrupted_one(
        tmp_path, monkeypatch):
    task = DepoTask(nodes=8, n=5, max_hops=2, queries=2)
    a = argparse.Namespace(width=16, layers=1, heads=2, shifts=2, canon_kernel=4, lr=3e-3,
                           steps=8, batch=4, eval_per_k=8, eval_every=2, depth_at=0.9,
                           curriculum=0.5, checkpoint_every=3)
    want, wmodel = canon.train_one("shift+Canon-AD", 0, task, a, 40)

    calls = {"n": 0}
    real = canon.generate

    def dies_at_the_seventh_batch(task_, batch, gen, hops=None):
        if isinstance(hops, torch.Tensor):  # a training batch (evaluation asks one k)
            calls["n"] += 1
            if calls["n"] == 7:
                raise KeyboardInterrupt("killed")
        return real(task_, batch, gen, hops)

    monkeypatch.setattr(canon, "generate", dies_at_the_seventh_batch)
    run_dir = tmp_path / "run.ckpt"
    run_dir.mkdir()
    with pytest.raises(KeyboardInterrupt):
        canon.train_one("shift+Canon-AD", 0, task, a, 40, run_dir)
    assert (run_dir / "checkpoint.json").is_file()  # committed after step 6
    monkeypatch.setattr(canon, "generate", real)
    got, model = canon.train_one("shift+Canon-AD", 0, task, a, 40, run_dir)
    assert [c["step"] for c in got["curve"]] == [2, 4, 6, 8]
    # the same batches and arithmetic: the same curve and weights, bit for bit
    assert json.dumps(got["curve"]) == json.dumps(json.loads(json.dumps(want["curve"])))
    for (k, v), w in zip(model.state_dict().items(), wmodel.state_dict().values()):
        assert torch.equal(v, w), k


def test_a_run_made_with_other_settings_is_refused(tmp_path):
    from structconv.experiments.canon import checkpoint_dir, resumed

    settings = {"width": 64, "steps": 100}
    path = tmp_path / "r.json"
    assert resumed(path, settings) is None
    path.write_text(json.dumps({"settings": {"width": 32, "steps": 100}, "val_loss": 1.0}))
    with pytest.raises(ValueError, match="width: 32 there, 64 now"):
        resumed(path, settings)
    path.write_text(json.dumps({"val_loss": 1.0}))  # written before runs kept settings
    assert resumed(path, settings) == {"val_loss": 1.0}
    d = checkpoint_dir(tmp_path, "run", settings)
    assert checkpoint_dir(tmp_path, "run", settings) == d
    with pytest.raises(ValueError, match="steps: 100 there, 200 now"):
        checkpoint_dir(tmp_path, "run", {"width": 64, "steps": 200})

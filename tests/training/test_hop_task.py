"""The k-hop task on the training loop: the shipped depo config trains and reports accuracy per
k, the loop's steps are the canon recipe's former hand-written loop's, every model of a seed
sees the same sequences, a run stopped inside an epoch resumes exactly, and configs that
cannot train are refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn import functional as F

import structconv as sc
from structconv.cli import main
from structconv.config import ConfigError, load_config
from structconv.data import load_dataset
from structconv.data.depo import DepoTask, eval_sets, generate
from structconv.data.registry import DatasetError
from structconv.nn.lm import TransformerLM
from structconv.training.checkpoint import load_weights
from structconv.training.tasks.hops import DATA_SEED, accuracy_per_k, answer_logits, hop_limit
from tests.conftest import metric_rows, nanogpt_lr, stop_and_resume

TINY = ["data.options={nodes=8, n=5, max_hops=3, queries=2, eval_per_k=8}", "data.batch_size=4",
        "data.batches_per_epoch=3", "model.lm.width=16", "model.lm.layers=1", "model.lm.heads=2",
        "model.lm.shifts=2", "model.lm.ffn=24", "train.max_steps=8", "train.epochs=3",
        "train.warmup_steps=1", "train.lr=0.003", "train.checkpoint_seconds=1e9"]


def _cfg(*over: str) -> dict:
    cfg = load_config("transformer_depo", [*TINY, *over])
    cfg["name"] = "transformer_depo"
    return cfg


def test_the_depo_config_trains_and_reports_accuracy_per_k(tmp_path):
    res = sc.train(_cfg(), tmp_path / "run")
    acc = [res[f"val_acc@{k}"] for k in (1, 2, 3)]
    assert res["epochs"] == 3 and res["val_mean_acc"] == pytest.approx(sum(acc) / 3)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 6, 8]  # the step budget ends the third epoch
    assert all({"val_acc@1", "val_acc@3", "step_loss", "train_acc"} <= set(r) for r in rows)
    # the run keeps its last weights, and the result scores them on the last evaluation's sets
    assert [rows[-1][f"val_acc@{k}"] for k in (1, 2, 3)] == acc
    assert main(["eval", str(tmp_path / "run"), "--split", "val"]) == 0
    ev = json.loads((tmp_path / "run" / "eval-val.json").read_text())
    assert ev["acc@2"] == acc[1] and ev["n"] == 3 * 8
    assert main(["eval", str(tmp_path / "run"), "--split", "test"]) == 0
    assert main(["eval", str(tmp_path / "run"), "--split", "train"]) == 2


def test_structconv_train_prints_the_accuracy_per_k(tmp_path, capsys):
    argv = ["train", "--config", "transformer_depo", "--out", str(tmp_path / "run"),
            "--progress", *TINY, "train.max_steps=3", "train.epochs=1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "step 3  loss" in out and "accuracy by k" in out  # the epoch's line
    assert "val acc@3" in out and "val mean acc" in out  # the result's table




def _hand_written(cfg: dict, steps: int) -> tuple[TransformerLM, list[float]]:
    """The canon recipe's loop before it ran on the engine: one generator of 20,000 + seed over
    the whole run, the hop limit growing over the first half, AdamW with decay on matrices,
    nanoGPT's schedule, clipping at 1, the mean cross-entropy of the answers."""
    d, m, t = cfg["data"]["options"], cfg["model"]["lm"], cfg["train"]
    task = DepoTask(nodes=d["nodes"], n=d["n"], max_hops=d["max_hops"], queries=d["queries"])
    torch.manual_seed(cfg["seed"])
    model = TransformerLM(task.vocab_size, m["width"], m["layers"], m["heads"], m["position"],
                          m["shifts"], m["ffn"], context=task.length, canon=m["canon"])
    opt = torch.optim.AdamW(
        [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
         {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
        lr=t["lr"], betas=(0.9, 0.99))
    gen, B, losses = torch.Generator().manual_seed(DATA_SEED + cfg["seed"]), \
        cfg["data"]["batch_size"], []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = nanogpt_lr(step, steps, t["lr"])
        top = min(task.max_hops, 1 + int(step * task.max_hops / (0.5 * steps)))
        b = generate(task, B, gen, hops=torch.randint(1, top + 1, (B, task.queries),
                                                        generator=gen))
        pos = task.positions
        loss = F.cross_entropy(model(b.ids[:, :int(pos[-1]) + 1])[:, pos].flatten(0, 1),
                               b.answers.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    return model, losses


@pytest.mark.parametrize("kind", [("shift", '""'), ("none", '"ABCD"'), ("relative", '"B"')])
def test_the_loop_trains_as_the_recipes_former_loop(tmp_path, kind):
    cfg = _cfg(f"model.lm.position={kind[0]}", f"model.lm.canon={kind[1]}", "seed=3")
    sc.train(cfg, tmp_path / "run")
    model, losses = _hand_written(cfg, 8)
    got = load_weights(tmp_path / "run" / "best.safetensors")
    for k, v in model.state_dict().items():
        assert torch.equal(got[k], v), k  # the same arithmetic, bit for bit
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step_loss"] for r in rows] == [losses[2], losses[5], losses[7]]
    assert rows[0]["train_loss"] == pytest.approx(sum(losses[:3]) / 3, rel=1e-6)


def test_every_model_of_a_seed_sees_the_same_sequences(monkeypatch, tmp_path):
    from structconv.training.tasks import hops

    seen = {}
    real = hops.generate

    def record(task, batch, gen, hops=None):
        b = real(task, batch, gen, hops)
        seen.setdefault(key, []).append(b.ids)
        return b

    monkeypatch.setattr(hops, "generate", record)
    for key, over in (("a", ["model.lm.position=rotary"]), ("b", ['model.lm.canon=""']),
                      ("c", ["seed=1"])):
        sc.train(_cfg(*over), tmp_path / key)
    assert len(seen["a"]) == 8 and all(torch.equal(x, y) for x, y in zip(seen["a"], seen["b"]))
    assert not torch.equal(seen["a"][0], seen["c"][0])
    # the hop limit: 1 at first, max_hops from half the budget on
    assert [hop_limit(s, 0.5, 8, 3) for s in range(8)] == [1, 1, 2, 3, 3, 3, 3, 3]
    assert hop_limit(0, 0.0, 8, 3) == 3


@pytest.mark.parametrize("k,where", [(2, "epoch 1, step 2/3"), (3, "the end of epoch 1"),
                                     (7, "epoch 3, step 1/3")])
def test_a_depo_run_stopped_anywhere_resumes_exactly(monkeypatch, tmp_path, k, where):
    ref, run, message = stop_and_resume(monkeypatch, _cfg(), tmp_path, k)
    assert where in message
    assert metric_rows(run) == metric_rows(ref)
    a, b = load_weights(run / "best.safetensors"), load_weights(ref / "best.safetensors")
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_accuracy_and_logits_read_the_hop_tokens():
    task = DepoTask(nodes=8, n=5, max_hops=2, queries=3)
    torch.manual_seed(0)
    m = TransformerLM(task.vocab_size, 16, 1, 2, "none", canon="ABCD").double().eval()
    b = generate(task, 6, torch.Generator().manual_seed(1))
    ids2 = b.ids.clone()
    ids2[:, task.positions[-1] + 1] = (ids2[:, task.positions[-1] + 1] + 1) % task.nodes
    got = answer_logits(m, b.ids, task, 3)
    assert got.shape == (6, 3, task.vocab_size)
    assert torch.equal(got, answer_logits(m, ids2, task, 3))  # the answers are never read
    assert torch.allclose(got[:, 1], m(b.ids)[:, int(task.positions[1])])
    sets = eval_sets(task, 10)
    acc = accuracy_per_k(m, sets, task, chunk=3)
    assert acc == accuracy_per_k(m, sets, task) and set(acc) == {1, 2}
    want = {k: float((m(ids)[:, 3 * task.n + 2].argmax(-1) == a).double().mean())
            for k, (ids, a) in sets.items()}
    assert acc == pytest.approx(want)


@pytest.mark.parametrize("over,named", [
    (["train.depo.curriculum=1.5"], "train.depo.curriculum must be a number in"),
    (["train.depo.warm=1"], "train.depo: unknown key 'warm'"),
    (["train.depo=3"], "train.depo must be a table"),
])
def test_bad_depo_configs_are_named(over, named):
    with pytest.raises(ConfigError, match=named):
        load_config("transformer_depo", over)


def test_data_and_models_that_do_not_fit_are_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"k-hop task: describe the model with a \[model.lm\]"):
        sc.train("gcn_karate", tmp_path / "a", overrides=["data.name=depo"])
    with pytest.raises(ConfigError, match=r"\[train.depo\] sets the hop curriculum"):
        sc.train("transformer_python", tmp_path / "b", overrides=["train.depo.curriculum=0.2"])
    with pytest.raises(ConfigError, match="set data.batches_per_epoch"):
        sc.train(_cfg("data.batches_per_epoch=0"), tmp_path / "c")
    with pytest.raises(DatasetError, match="depo: max_hops=5 must be below n=5"):
        sc.train(_cfg("data.options.max_hops=5"), tmp_path / "d")
    with pytest.raises(ConfigError, match="unknown option"):
        sc.train(_cfg("data.options.hops=5"), tmp_path / "e")
    for bad in ({"eval_per_k": 0}, {"nodes": 1.5}, {"queries": 10 ** 7}):
        with pytest.raises(DatasetError, match=f"depo: {next(iter(bad))} must be an int"):
            load_dataset("depo", **bad)
    assert not any((tmp_path / d).exists() for d in "abcde")
    d = load_dataset("depo", nodes=8, n=5, max_hops=3, queries=2, eval_per_k=4)
    assert len(d.vocab) == d.spec.vocab_size == 8 + 2 + 3 and d.length == 3 * 5 + 4 * 2
    with pytest.raises(ValueError, match="evaluate val or test"):
        d.eval_sets("train")


def test_more_epochs_are_refused_where_the_curriculum_spans_the_epochs(tmp_path):
    # without a step budget the hop curriculum spans train.epochs: more would not continue
    # the run as one longer run did
    from structconv.training import TrainingError

    cfg = _cfg("train.max_steps=0", "train.epochs=1", "train.warmup_steps=0",
               'train.schedule="constant"', "train.depo.curriculum=0.5")
    sc.train(cfg, tmp_path / "run")
    with pytest.raises(TrainingError, match=r"schedule spans its train.epochs \(1\)"):
        sc.train(out=tmp_path / "run", resume=True, overrides=["train.epochs=2"])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["epochs"] == 1
    # with a step budget it goes on (the budget ends it)
    sc.train(_cfg(), tmp_path / "budget")
    assert sc.train(out=tmp_path / "budget", resume=True,
                    overrides=["train.epochs=4"])["epochs"] == 3

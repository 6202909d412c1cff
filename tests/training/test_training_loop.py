"""The one training loop: accumulation, step budget, schedule, decay groups, AMP, and a task it
has never seen (the loop knows no task)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import structconv as sc
from structconv.training import Loop, Task, make_optimizer, param_groups
from structconv.training.optim import lr_factor

IMAGE = ["train.epochs=1", "data.options.limit=300", "model.dtype=\"float64\"",
         "train.optimizer=\"sgd\"", "train.momentum=0.0", "train.lr=0.1",
         "train.checkpoint_seconds=1e9", "train.patience=0"]


def _weights(run) -> dict:
    return sc.training.checkpoint.load_checkpoint(run)["model"]


def test_accumulated_half_batches_are_the_whole_batch(tmp_path):
    sc.train("cnn_digits", out=tmp_path / "whole", overrides=IMAGE + ["data.batch_size=50"])
    sc.train("cnn_digits", out=tmp_path / "acc", overrides=IMAGE + ["data.batch_size=25",
                                                                     "train.accumulate=2"])
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "acc")
    for k in a:  # the same steps on the same items: equal but for the order of the sums
        torch.testing.assert_close(a[k], b[k], rtol=1e-10, atol=1e-12)
    rows = [json.loads(x) for x in (tmp_path / "acc" / "metrics.jsonl").read_text().split("\n")
            if x]
    ref = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().split("\n")
           if x]
    assert rows[0]["train_loss"] == pytest.approx(ref[0]["train_loss"], rel=1e-12)


def test_a_step_budget_ends_the_run_inside_an_epoch(tmp_path):
    res = sc.train("cnn_digits", out=tmp_path / "run",
                   overrides=IMAGE + ["train.epochs=5", "data.batch_size=50", "train.max_steps=7"])
    ck = json.loads((tmp_path / "run" / "checkpoint.json").read_text())
    assert ck["trainer"]["steps"] == 7 and res["epochs"] == 2  # 5 steps an epoch: 5 + 2
    again = sc.train(out=tmp_path / "run", resume=True)  # a spent budget trains no more
    assert again["epochs"] == 2 and again["test_acc"] == res["test_acc"]


def test_schedule_with_warmup_sets_each_steps_rate_and_resumes_exactly(tmp_path):
    over = ["train.epochs=4", "train.max_steps=4", "train.warmup_steps=2",
            "train.schedule=\"cosine\"", "train.checkpoint_every=1"]
    sc.train("gcn_karate", out=tmp_path / "ref", overrides=over)
    rows = [json.loads(x) for x in (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()]
    base = 0.01  # gcn_karate's lr; one step an epoch: a row's rate is its step's
    assert [r["lr"] for r in rows] == pytest.approx([base * 0.5, base, base, base * 0.5])
    assert sc.train("gcn_karate", out=tmp_path / "run", overrides=over,
                    stop_after=2)["interrupted"]
    sc.train(out=tmp_path / "run", resume=True)
    again = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    drop = ("time_s", "items_per_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in again] == \
        [{k: v for k, v in r.items() if k not in drop} for r in rows]


def test_lr_factor_shapes():
    assert [lr_factor("constant", s, 2) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_factor("linear", 5, 0, 10) == 0.5 and lr_factor("linear", 10, 0, 10) == 0.0
    assert lr_factor("cosine", 5, 0, 10) == pytest.approx(0.5)
    assert lr_factor("cosine", 0, 0, 10) == 1.0
    with pytest.raises(ValueError, match="step budget"):
        lr_factor("cosine", 0, 4, 4)


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.lin, self.norm = nn.Embedding(5, 4), nn.Linear(4, 4), nn.LayerNorm(4)


def test_decay_groups_exempt_what_they_name():
    m = _Tiny()
    groups = param_groups(m, 0.1, ("bias", "norm", "embedding"))
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert [p is m.lin.weight for p in groups[0]["params"]] == [True]
    assert {id(p) for p in groups[1]["params"]} == {id(m.lin.bias), id(m.norm.weight),
                                                    id(m.norm.bias), id(m.emb.weight)}
    only = param_groups(m, 0.1, ("bias",))
    assert {id(p) for p in only[1]["params"]} == {id(m.lin.bias), id(m.norm.bias)}
    with pytest.raises(ValueError, match="no_decay names"):
        param_groups(m, 0.1, ("weights",))
    cfg = {"train": {"optimizer": "adamw", "lr": 0.1, "weight_decay": 0.1, "momentum": 0.0,
                     "no_decay": ["embedding"]}}
    opt = make_optimizer(cfg, m)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert opt.param_groups[1]["params"] == [m.emb.weight]


def test_amp_is_off_on_cpu(tmp_path):
    a = sc.train("gcn_karate", out=tmp_path / "a", overrides=["train.epochs=2"])
    b = sc.train("gcn_karate", out=tmp_path / "b", overrides=["train.epochs=2", "train.amp=true"])
    assert a["val_loss"] == b["val_loss"] and a["test_acc"] == b["test_acc"]


class _Regression(Task):
    """A task the loop has never seen: least squares on fixed points, two batches an epoch."""

    def __init__(self, x, y):
        super().__init__({}, None)
        self.x, self.y = x, y

    def epoch_steps(self, epoch, done, extra):
        batches = [[(self.x[:8], self.y[:8])], [(self.x[8:], self.y[8:])]]
        return 2, iter(batches[done:])

    def group_items(self, group):
        return sum(y.numel() for _, y in group)

    def batch_loss(self, net, batch, share):
        x, y = batch
        loss = (net(x).squeeze(-1) - y) ** 2
        return loss.sum() * share, torch.stack([loss.detach().double().sum(),
                                                torch.zeros((), dtype=torch.float64),
                                                torch.tensor(float(y.numel()),
                                                             dtype=torch.float64)])

    def validate(self, model, epoch, last):
        with torch.no_grad():
            return {"val_loss": float(((model(self.x).squeeze(-1) - self.y) ** 2).mean())}

    def row(self, epoch, totals, dt, val, lr):
        return {"epoch": epoch, "train_loss": totals[0] / totals[2], **val, "time_s": dt}

    def line(self, row):
        return str(row)


def test_the_loop_trains_a_task_it_has_never_seen(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(16, 3, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    model = nn.Linear(3, 1).double()
    task = _Regression(x, y)
    task.setup(model, torch.device("cpu"), task.world)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = Loop(task, model, opt, {"epochs": 60, "monitor": "val_loss", "patience": 5},
                seed=0, run=tmp_path, files=False)
    loop.fit()
    h = loop.state["history"]
    assert h[-1]["val_loss"] < 1e-3 * h[0]["val_loss"] and math.isfinite(h[-1]["val_loss"])
    assert loop.state["best_epoch"] == len(h) or loop.state["stopped"]
    assert (tmp_path / "checkpoint.json").is_file()  # the last epoch's checkpoint


def test_stepping_an_epoch_is_running_it():
    from structconv.config import load_config
    from structconv.models.build import build_model
    from structconv.training.tasks import load_data, task_for

    cfg = load_config("cnn_digits", IMAGE + ["data.batch_size=100"])
    data = load_data(cfg)

    def loop() -> Loop:
        torch.manual_seed(0)
        model = build_model(cfg, data)
        task = task_for(cfg, data)
        task.setup(model, torch.device("cpu"), task.world)
        return Loop(task, model, make_optimizer(cfg, model), cfg["train"], seed=0, run=None,
                    files=False)

    whole, stepped = loop(), loop()
    assert whole.epoch(1) is True  # one epoch: the last
    steps, seen = stepped.steps(1), []
    while True:  # one optimizer step per next(), then the epoch's record
        try:
            seen.append(next(steps))
            assert stepped.state["steps"] == len(seen) and not stepped.state["history"]
        except StopIteration as end:
            assert end.value is True
            break
    assert [int(s[2]) for s in seen] == [100, 100, 10]  # 210 training images
    drop = ("time_s", "items_per_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in stepped.state["history"]] \
        == [{k: v for k, v in r.items() if k not in drop} for r in whole.state["history"]]
    for a, b in zip(whole.model.parameters(), stepped.model.parameters()):
        assert torch.equal(a, b)

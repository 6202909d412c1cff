"""The k-hop task (``structconv.data.depo``): fresh sequences every step, a hop curriculum, the
loss on the answer tokens alone, and greedy accuracy per number of hops.

A step's micro-batch is ``data.batch_size`` new sequences drawn from one generator seeded by
``DATA_SEED + seed`` and drawn batch after batch over the whole run, on the CPU: the same
sequences for every model of a seed, on any device. The generator's state travels in every
checkpoint (``state``), so a resumed run ends exactly as an uninterrupted one. Each training
question's number of hops is drawn uniformly from 1 up to the step's limit, which grows
linearly from 1 to max_hops over the first ``train.depo.curriculum`` fraction of the step
budget (max_hops throughout when 0). The loss is the mean cross-entropy of the answers,
predicted at the hop tokens from the sequence up to the last hop token (no answer the model
is asked for is ever read). An epoch is ``data.batches_per_epoch`` batches (the evaluation
interval); validation is greedy (argmax over the whole vocabulary) accuracy per k on the
dataset's fixed sequences with one question each (``DepoData.eval_sets``), ``val_acc@k``, and
``val_acc`` their mean (the result's ``val_mean_acc``); a row's ``time_s`` counts the
validation too.
"""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor
from torch.nn import functional as F

from ...config import ConfigError, depo_train_spec
from ...data.depo import DepoTask, generate
from ..distributed import all_reduce_sum
from .base import Task, batch_sums, rank_rows

__all__ = ["HopTask", "answer_logits", "accuracy_per_k", "hop_limit", "depth", "DATA_SEED"]

#: the training sequences of seed s are drawn from a generator seeded by DATA_SEED + s
DATA_SEED = 20_000


def answer_logits(model, ids: Tensor, spec: DepoTask, questions: int) -> Tensor:
    """(B, questions, vocab) logits at the hop tokens of the first ``questions`` questions of
    sequences ``ids`` (B, T), read up to the last of those hop tokens (never its answer)."""
    pos = spec.positions[:questions]
    return model(ids[:, :int(pos[-1]) + 1])[:, pos.to(ids.device)]


@torch.no_grad()
def accuracy_per_k(model, sets: dict[int, tuple], spec: DepoTask,
                   chunk: int = 256) -> dict[int, float]:
    """{k: greedy accuracy} of the answers of each k's set ((ids (n, T), answers (n,)) with one
    question per sequence), ``chunk`` sequences at a time."""
    was = model.training
    model.eval()
    pos = int(spec.positions[0])
    acc = {}
    for k, (ids, answers) in sets.items():
        hits = sum(int((model(ids[i:i + chunk, :pos + 1])[:, pos].argmax(-1)
                        == answers[i:i + chunk]).sum()) for i in range(0, len(ids), chunk))
        acc[k] = hits / len(ids)
    model.train(was)
    return acc


def hop_limit(step: int, curriculum: float, steps: int, max_hops: int) -> int:
    """The largest number of hops trained at optimizer step ``step`` (0-based) of ``steps``: 1
    at the start, growing linearly to ``max_hops`` at ``curriculum`` x ``steps`` (max_hops
    throughout when 0); a function of the step alone, so every model of a seed trains on the
    same sequences."""
    span = curriculum * steps
    return max_hops if span <= 0 else min(max_hops, 1 + int(step * max_hops / span))


def depth(acc: dict, at: float) -> int:
    """The largest k such that every number of hops up to k has accuracy >= ``at`` (0: none)."""
    d = 0
    for k in sorted(acc, key=int):
        if acc[k] < at:
            break
        d = int(k)
    return d


class HopTask(Task):
    """A ``[model.lm]`` run on the ``depo`` dataset (see the module doc)."""

    def __init__(self, cfg: dict, data):
        super().__init__(cfg, data)
        d, t = cfg["data"], cfg["train"]
        if not d["batches_per_epoch"]:
            raise ConfigError("a k-hop (depo) run draws its sequences: set "
                              "data.batches_per_epoch (batches of data.batch_size sequences "
                              "per epoch, the evaluation interval)")
        self.spec, self.batch, self.per_epoch = data.spec, d["batch_size"], d["batches_per_epoch"]
        self.acc = t.get("accumulate", 1)
        self.steps_per_epoch = math.ceil(self.per_epoch / self.acc)
        self.total = t.get("max_steps", 0) or t["epochs"] * self.steps_per_epoch
        self.curriculum = depo_train_spec(cfg)["curriculum"]
        self.gen = torch.Generator().manual_seed(DATA_SEED + cfg["seed"])
        #: the validation sets on the device; the last step's (loss sum, answers) and its
        #: answers in all; the last validation's seconds
        self.sets, self.step_sums, self.items, self.eval_s = None, [0.0, 0], 1.0, 0.0
        limits = tuple((f"val_acc@{k}", f"k = {k}") for k in range(1, self.spec.max_hops + 1))
        self.panels = (("loss", "answer cross-entropy", (("train_loss", "train (mean)"),
                                                          ("step_loss", "train (last step)"))),
                       ("accuracy", "greedy answer accuracy (validation)", limits))

    @staticmethod
    def schedules_by_epochs(cfg: dict) -> bool:
        # the hop curriculum spans max_steps, or (0) the whole run of train.epochs
        return not cfg["train"].get("max_steps", 0)

    @staticmethod
    def train_size(data) -> int:
        return 1  # sequences are drawn, never run out

    def setup(self, model, dev, world) -> None:
        super().setup(model, dev, world)
        self.sets = self._sets("val", dev)

    def _sets(self, split: str, dev) -> dict:
        return {k: (ids.to(dev), ans.to(dev))
                for k, (ids, ans) in self.data.eval_sets(split).items()}

    # -- what travels in a checkpoint -------------------------------------------------------------
    def state(self) -> dict:
        return {"generator": self.gen.get_state()}

    def load_state(self, extra: dict) -> None:
        if "generator" in extra:
            self.gen.set_state(extra["generator"])

    # -- batches ----------------------------------------------------------------------------------
    def epoch_steps(self, epoch: int, done: int, extra: dict | None):
        # (a mid-epoch resume finds the generator where the checkpoint left it: ``load_state``)
        return self.steps_per_epoch, self._groups(epoch, done)

    def _groups(self, epoch: int, done: int):
        for i in range(done, self.steps_per_epoch):
            step = (epoch - 1) * self.steps_per_epoch + i
            yield [self._draw(step) for _ in range(min(self.acc, self.per_epoch - i * self.acc))]

    def _draw(self, step: int) -> tuple[Tensor, Tensor]:
        """One micro-batch of training sequences: (ids (B, T), answers (B, queries))."""
        s = self.spec
        top = hop_limit(step, self.curriculum, self.total, s.max_hops)
        hops = torch.randint(1, top + 1, (self.batch, s.queries), generator=self.gen)
        b = generate(s, self.batch, self.gen, hops=hops)
        return b.ids, b.answers

    def group_items(self, group: list) -> float:
        self.step_sums, self.items = [0.0, 0], float(sum(a.numel() for _, a in group))
        return self.items

    def batch_loss(self, net, batch, share: float):
        ids, answers = batch
        if self.world.size > 1:  # this rank's contiguous share of the batch
            rows = rank_rows(ids.shape[0], self.world, "sequences")
            ids, answers = ids[rows], answers[rows]
        ids, answers = ids.to(self.dev), answers.to(self.dev)
        logits = answer_logits(net, ids, self.spec, answers.shape[1])
        loss = F.cross_entropy(logits.flatten(0, 1), answers.flatten())
        n = answers.numel()
        self.step_sums = [self.step_sums[0] + float(loss.detach()) * n, self.step_sums[1] + n]
        ok = logits.detach().argmax(-1) == answers
        # the batch's mean times its share of the step's items (1 for one batch on one
        # process): its gradient is the step's mean loss's, as DDP averages it
        return loss * (n * self.world.size / self.items), batch_sums(loss.detach() * n, ok, n)

    # -- metrics ----------------------------------------------------------------------------------
    def validate(self, model, epoch: int, last: bool) -> dict:
        t0 = time.perf_counter()
        acc = accuracy_per_k(model, self.sets, self.spec, self.cfg["data"]["eval_batch_size"])
        self.eval_s = time.perf_counter() - t0  # part of the epoch's seconds
        return {"val_acc": sum(acc.values()) / len(acc),
                **{f"val_acc@{k}": v for k, v in acc.items()}}

    def evaluate(self, model, split: str, device=None) -> dict:
        """Greedy accuracy per k (``acc@k``) and their mean on the fixed sets of ``split`` (val
        or test; ``structconv eval``), ``n`` sequences in all."""
        try:
            sets = self._sets(split, device or next(model.parameters()).device)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        acc = accuracy_per_k(model, sets, self.spec, self.cfg["data"]["eval_batch_size"])
        return {"mean_acc": sum(acc.values()) / len(acc),
                **{f"acc@{k}": v for k, v in acc.items()},
                "n": sum(len(a) for _, a in sets.values())}

    def row(self, epoch: int, totals: list, dt: float, val: dict | None, lr: float) -> dict:
        loss, ok, n = totals
        last, count = self.step_sums
        if self.world.size > 1:  # every process's share of the last step (row: on every rank)
            last, count = all_reduce_sum(torch.tensor([last, count], dtype=torch.float64,
                                                      device=self.dev)).tolist()
        return {"epoch": epoch, "step": min(epoch * self.steps_per_epoch, self.total),
                "train_loss": loss / n, "train_acc": ok / n,
                "step_loss": last / count if count else None, **(val or {}),
                "time_s": round(dt + self.eval_s, 4), "items_per_s": round(n / max(dt, 1e-9), 1),
                "lr": lr}

    def line(self, row: dict) -> str:
        accs = " ".join(f"{row[f'val_acc@{k}']:.2f}" for k in range(1, self.spec.max_hops + 1))
        return (f"epoch {row['epoch']:3d}  step {row['step']}  loss {row['step_loss']:.4f}  "
                f"accuracy by k {accs}")

    def result(self, model, main: bool) -> dict:
        """The validation accuracy per k (``val_acc@k``) of the run's weights, and their mean
        (``val_mean_acc``)."""
        acc = accuracy_per_k(model, self.sets, self.spec, self.cfg["data"]["eval_batch_size"])
        return {"val_mean_acc": sum(acc.values()) / len(acc),
                **{f"val_acc@{k}": v for k, v in acc.items()}}

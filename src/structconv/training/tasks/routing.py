"""Routing (TSP): REINFORCE with an exponential, then a greedy-rollout baseline (Kool et al. 2019).

A step's micro-batch is ``data.batch_size`` random instances (cities uniform in the unit square,
drawn on the CPU from the epoch's generator: the same on any device); the policy samples a tour
of each, and the objective is mean((length − baseline) · log-likelihood). The baseline is,
for the first ``warmup_epochs`` epochs, an exponential moving average of the batches' mean
length (factor ``beta``), then the greedy tour length of a frozen copy of the policy. At each
epoch's end (``validate``) policy and baseline decode the same ``bl_eval`` instances greedily,
the baseline becomes a copy of the policy when a one-sided paired t-test at level ``alpha``
says the policy is shorter (and then draws fresh instances), and the policy's greedy tours of
the validation instances are compared with their LKH-3 references (``val_gap``, percent). The
baseline and the running mean travel in every checkpoint (``state``): a resumed run ends
exactly as an uninterrupted one. The result: the greedy gap on the test instances.
"""

from __future__ import annotations

import copy
import math
import time

import torch
from torch import Tensor

from ..._extras import require
from ...config import ConfigError, routing_train_spec
from ...data.tsp import tour_length, uniform_instances
from ..optim import epoch_generator
from .base import Task, batch_sums

__all__ = ["RoutingTask", "greedy_lengths", "baseline_update", "ROUTING_PANELS"]

ROUTING_PANELS = (("loss", "REINFORCE loss", (("train_loss", "train"),)),
                  ("gap", "greedy gap to LKH-3, validation (%)", (("val_gap", "val"),)))


@torch.no_grad()
def greedy_lengths(model, coords: Tensor, batch: int = 1000, tours: bool = False):
    """Greedy tour lengths (B,) float64 of each instance (and the tours with ``tours``)."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    lens, all_tours = [], []
    for i in range(0, len(coords), batch):
        c = coords[i:i + batch].to(dev)
        t, _ = model(c, "greedy")
        lens.append(tour_length(c.to(torch.float64), t).cpu())
        all_tours.append(t.cpu())
    model.train(was)
    out = torch.cat(lens)
    return (out, torch.cat(all_tours)) if tours else out


def baseline_update(candidate: Tensor, baseline: Tensor, alpha: float) -> tuple[bool, float, float]:
    """(replace, t, p): replace the baseline by the candidate policy when the candidate's mean
    length on the same instances is lower and a one-sided paired t-test rejects "not
    shorter" at level ``alpha`` (Kool et al.'s rule; p = the two-sided p-value / 2)."""
    stats = require("scipy.stats", "routing", "the rollout baseline's t-test")
    if candidate.shape != baseline.shape or candidate.dim() != 1 or len(candidate) < 2:
        raise ValueError(f"baseline_update needs two (B >= 2,) length vectors of the same "
                         f"instances, got {tuple(candidate.shape)} and {tuple(baseline.shape)}")
    diff_mean = float((candidate - baseline).mean())
    if diff_mean >= 0:
        return False, float("nan"), 1.0
    t, p = stats.ttest_rel(candidate.numpy(), baseline.numpy())
    p_one = float(p) / 2
    return bool(p_one < alpha), float(t), p_one


def gaps(lengths: Tensor, ref: Tensor) -> dict:
    """Tour lengths against reference lengths: means, the gap of the means and the mean
    per-instance gap (percent)."""
    return {"mean_length": float(lengths.mean()), "lkh_mean": float(ref.mean()),
            "gap_of_means": 100 * (float(lengths.mean()) / float(ref.mean()) - 1),
            "mean_gap": 100 * float((lengths / ref - 1).mean())}


class RoutingTask(Task):
    """A ``[model.routing]`` run on a TSP dataset (see the module doc)."""

    panels = ROUTING_PANELS

    def __init__(self, cfg: dict, data):
        super().__init__(cfg, data)
        self.spec = routing_train_spec(cfg)
        d = cfg["data"]
        if not d["batches_per_epoch"]:
            raise ConfigError("a routing run draws its instances: set data.batches_per_epoch "
                              "(batches of data.batch_size instances per epoch)")
        self.batch, self.per_epoch = d["batch_size"], d["batches_per_epoch"]
        self.baseline, self.ema, self.bl_seed, self.bl_costs = None, None, 0, None
        self.warm, self.bl_seconds = True, 0.0

    @staticmethod
    def train_size(data) -> int:
        return 1  # instances are drawn, never run out

    def setup(self, model, dev, world) -> None:
        super().setup(model, dev, world)
        if world.size > 1:
            raise ConfigError(f"routing ([model.routing]) training runs in one process (its "
                              f"baselines read whole batches); --nproc {world.size} is not "
                              "supported: use --nproc 1")
        self.baseline = copy.deepcopy(model)

    # -- what travels in a checkpoint -------------------------------------------------------------
    def state(self) -> dict:
        ema = math.nan if self.ema is None else self.ema
        return {**{f"baseline.{k}": v for k, v in self.baseline.state_dict().items()},
                "ema": torch.tensor(ema, dtype=torch.float64),
                "bl_seed": torch.tensor(self.bl_seed)}

    def load_state(self, extra: dict) -> None:
        self.baseline.load_state_dict({k[9:]: v for k, v in extra.items()
                                       if k.startswith("baseline.")})
        ema = float(extra["ema"])
        self.ema, self.bl_seed = None if math.isnan(ema) else ema, int(extra["bl_seed"])
        self.bl_costs = None  # the baseline's lengths are decoded again (the same)

    # -- batches ----------------------------------------------------------------------------------
    def epoch_steps(self, epoch: int, done: int, extra: dict | None):
        acc = self.cfg["train"].get("accumulate", 1)
        self.warm = epoch - 1 < self.spec["warmup_epochs"]
        # epoch e draws from the generator of e - 1 (the recipe's numbering, kept)
        gen = epoch_generator(self.cfg["seed"], epoch - 1)
        for _ in range(done * acc):  # the draws of the steps already taken
            torch.rand(self.batch, self.data.n, 2, generator=gen)
        return math.ceil(self.per_epoch / acc), self._groups(gen, done * acc, acc)

    def _groups(self, gen: torch.Generator, first: int, acc: int):
        group = []
        for i in range(first, self.per_epoch):
            group.append(torch.rand(self.batch, self.data.n, 2, generator=gen))
            if len(group) == acc or i == self.per_epoch - 1:
                yield group
                group = []

    def group_items(self, group: list) -> float:
        return float(sum(c.shape[0] for c in group))

    def batch_loss(self, net, coords, share: float):
        coords = coords.to(self.dev)
        tours, ll = net(coords, "sample")
        cost = tour_length(coords, tours)
        if self.warm:
            m = float(cost.mean())
            b = self.spec["beta"]
            self.ema = m if self.ema is None else b * self.ema + (1 - b) * m
            bl = torch.full_like(cost, self.ema)
        else:
            bl = greedy_lengths(self.baseline, coords).to(device=cost.device, dtype=cost.dtype)
        loss = (cost - bl) * ll
        return loss.sum() * share, batch_sums(loss, None, loss.numel())

    # -- the epoch's end: the baseline's test, validation -----------------------------------------
    def baseline_test(self, model, epoch: int) -> dict:
        """The paired t-test of policy against baseline on the baseline's instances, and the
        replacement it decides."""
        s = self.spec
        coords = uniform_instances(s["bl_eval"], self.data.n, 100_000 + self.bl_seed)
        if self.bl_costs is None:
            self.bl_costs = greedy_lengths(self.baseline, coords)
        cand = greedy_lengths(model, coords)
        replace, t, p = baseline_update(cand, self.bl_costs, s["alpha"])
        # no t statistic when the candidate is not shorter (null, not NaN, in the record)
        info = {"bl_candidate": float(cand.mean()), "bl_baseline": float(self.bl_costs.mean()),
                "bl_t": t if math.isfinite(t) else None, "bl_p": p, "bl_replaced": replace}
        if replace:
            self.baseline.load_state_dict(model.state_dict())
            self.bl_seed, self.bl_costs = epoch, None  # fresh instances for the next test
        return info

    def validate(self, model, epoch: int, last: bool) -> dict:
        t0 = time.perf_counter()
        info = self.baseline_test(model, epoch)
        self.bl_seconds = time.perf_counter() - t0  # part of the epoch's training time
        ref = self.data.reference("val")
        v = float(greedy_lengths(model, ref["coords"]).mean())
        return {"val_length": v, "val_gap": 100 * (v / float(ref["lengths"].mean()) - 1), **info}

    def evaluate(self, model, split: str, device=None) -> dict:
        """The greedy tours of a split's instances against LKH-3 (``structconv eval``):
        ``{length, lkh, gap, mean_gap, n}`` (gaps in percent)."""
        if split not in ("val", "test"):
            raise ConfigError(f"a routing run's training instances are drawn, not kept: "
                              f"evaluate val or test, not {split}")
        ref = self.data.reference(split)
        g = gaps(greedy_lengths(model, ref["coords"]), ref["lengths"])
        return {"length": g["mean_length"], "lkh": g["lkh_mean"], "gap": g["gap_of_means"],
                "mean_gap": g["mean_gap"], "n": int(ref["lengths"].numel())}

    def row(self, epoch: int, totals: list, dt: float, val: dict | None, lr: float) -> dict:
        loss, _, n = totals
        return {"epoch": epoch, "train_loss": loss / n, **(val or {}),
                "time_s": round(dt + self.bl_seconds, 4), "items_per_s": round(n / max(dt, 1e-9),
                                                                                1), "lr": lr}

    def line(self, row: dict) -> str:
        kept = "replaced" if row["bl_replaced"] else "kept"
        return (f"epoch {row['epoch']:3d}  loss {row['train_loss']:.3f}  val greedy "
                f"{row['val_length']:.4f} (gap {row['val_gap']:.2f}%)  baseline {kept} (p "
                f"{row['bl_p']:.3g})")

    def result(self, model, main: bool) -> dict:
        """The greedy tours of every test instance against their LKH-3 references."""
        ref = self.data.reference("test")
        t0 = time.perf_counter()
        lengths, tours = greedy_lengths(model, ref["coords"], tours=True)
        seconds = time.perf_counter() - t0
        g = gaps(lengths, ref["lengths"])
        val = self.data.reference("val")
        v = float(greedy_lengths(model, val["coords"]).mean())
        return {"val_length": v, "val_gap": 100 * (v / float(val["lengths"].mean()) - 1),
                "test_length": g["mean_length"], "test_lkh": g["lkh_mean"],
                "test_gap": g["gap_of_means"], "test_mean_gap": g["mean_gap"],
                "test_instances": len(lengths), "greedy_seconds": seconds,
                "test_tours": tours[:4].tolist()}

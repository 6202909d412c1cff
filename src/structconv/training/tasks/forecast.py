"""Forecasting a univariate series: random training windows, validation and test MASE / sMAPE.

The series (``structconv.data.series``) is cut in time into train / validation / test
(``Split``: the dataset's ``val`` and ``test`` fractions, test last). A micro-batch is
``data.batch_size`` training windows at origins drawn uniformly (targets inside the training
part), the loss the mean absolute error of the forecaster's window-scaled outputs against the
window-scaled targets. The origins come from one generator seeded by ``10_000 + seed`` and
drawn batch after batch over the whole run (the stream the published forecasts were trained
on); a resumed run replays its draws, so it ends exactly as an uninterrupted one. An epoch is
``data.batches_per_epoch`` batches (the validation interval); validation scores every
validation origin (rolling origin, step 1). Metrics per horizon h: MASE (mean absolute error
over the origins / the in-sample MAE of the one-season naive forecast on the training part)
and sMAPE (200·|y − ŷ| / (|y| + |ŷ|), percent).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from ...config import ConfigError, forecast_spec
from ...data.series import rolling_origins, windows
from ...models.forecast import forecast_at
from .base import Task, batch_sums, rank_rows

__all__ = ["ForecastTask", "Split", "mase", "mase_scale", "smape", "FORECAST_PANELS"]

FORECAST_PANELS = (("loss", "L1, window-scaled", (("train_loss", "train"),)),
                   ("error", "mean over the horizon", (("val_mase", "val MASE"),)))


def mase_scale(train: Tensor, period: int) -> float:
    """The in-sample mean absolute error of the one-season naive forecast y[i − period] on
    ``train`` (Hyndman & Koehler 2006): MASE's denominator."""
    if train.numel() <= period:
        raise ValueError(f"mase_scale: {train.numel()} training steps cannot scale period "
                         f"{period}")
    s = float((train[period:] - train[:-period]).abs().mean())
    if not s > 0:
        raise ValueError("mase_scale: the training part repeats itself exactly (scale 0)")
    return s


def _same(forecast, actual, who):
    if forecast.shape != actual.shape or forecast.dim() != 2:
        raise ValueError(f"{who}: forecasts and actual values must both be (n, H), got "
                         f"{tuple(forecast.shape)} and {tuple(actual.shape)}")


def mase(forecast: Tensor, actual: Tensor, scale: float) -> Tensor:
    """MASE per horizon (H,): mean over origins of |actual − forecast| / scale, from
    (n, H) forecasts and actual values."""
    _same(forecast, actual, "mase")
    return (actual - forecast).abs().mean(0) / scale


def smape(forecast: Tensor, actual: Tensor) -> Tensor:
    """sMAPE per horizon (H,) in percent: mean of 200·|y − ŷ| / (|y| + |ŷ|) (a term where
    both are zero counts 0)."""
    _same(forecast, actual, "smape")
    den = actual.abs() + forecast.abs()
    term = torch.where(den > 0, 200 * (actual - forecast).abs() / den.clamp_min(1e-300),
                       torch.zeros_like(den))
    return term.mean(0)


class Split:
    """A series cut in time: train [0, val_start), validation [val_start, test_start), test
    [test_start, T); origins whose targets stay inside each part."""

    def __init__(self, length: int, context: int, horizon: int, val: float, test: float):
        self.length, self.context, self.horizon = length, context, horizon
        self.test_start = length - int(round(test * length))
        self.val_start = self.test_start - int(round(val * length))
        if self.val_start - horizon < context + 1:
            raise ValueError(f"a series of {length} steps leaves no training window for "
                             f"context {context} and horizon {horizon}")
        self.train = rolling_origins(self.val_start, 0, horizon, 1, context)
        self.val = rolling_origins(self.test_start, self.val_start, horizon, 1, context)
        self.test = rolling_origins(length, self.test_start, horizon, 1, context)


class ForecastTask(Task):
    """A ``[model.forecast]`` run on a series dataset (see the module doc)."""

    panels = FORECAST_PANELS

    def __init__(self, cfg: dict, data):
        super().__init__(cfg, data)
        s = forecast_spec(cfg)
        try:
            self.split = Split(data.length, s["context"], s["horizon"], data.val, data.test)
        except ValueError as e:
            raise ConfigError(f"model.forecast on {data.name}: {e} (val {data.val:g}, test "
                              f"{data.test:g}): lower context or horizon") from None
        self.scale = mase_scale(data.values[:self.split.val_start], data.period)
        self.origins = torch.tensor(self.split.train)
        d = cfg["data"]
        self.batch = d["batch_size"]
        self.per_epoch = d["batches_per_epoch"] or math.ceil(len(self.origins) / self.batch)
        self.gen, self.drawn = None, 0

    @staticmethod
    def train_size(data) -> int:
        return int(data.length)

    # -- batches ----------------------------------------------------------------------------------
    def _skip_to(self, draw: int) -> torch.Generator:
        """The run's window generator after ``draw`` batches (replayed from the seed where
        this process has not drawn them: a resumed run)."""
        if self.gen is None or self.drawn > draw:
            self.gen, self.drawn = torch.Generator().manual_seed(10_000 + self.cfg["seed"]), 0
        while self.drawn < draw:
            torch.randint(len(self.origins), (self.batch,), generator=self.gen)
            self.drawn += 1
        return self.gen

    def epoch_steps(self, epoch: int, done: int, extra: dict | None):
        acc = self.cfg["train"].get("accumulate", 1)
        first, end = (epoch - 1) * self.per_epoch + done * acc, epoch * self.per_epoch
        return math.ceil(self.per_epoch / acc), self._groups(first, end, acc)

    def _groups(self, first: int, end: int, acc: int):
        gen, s, group = self._skip_to(first), self.split, []
        for i in range(first, end):
            pick = self.origins[torch.randint(len(self.origins), (self.batch,), generator=gen)]
            self.drawn += 1
            group.append(windows(self.data.values, pick, s.context, s.horizon))
            if len(group) == acc or i == end - 1:
                yield group
                group = []

    def group_items(self, group: list) -> float:
        return float(sum(target.numel() for _, target in group))

    def batch_loss(self, net, batch, share: float):
        past, target = batch
        rows = rank_rows(past.shape[0], self.world, "windows")
        out, loc, scale = net(past[rows].to(self.dev), scaled=True)
        want = ((target[rows].to(self.dev) - loc) / scale).to(out.dtype)
        loss = F.l1_loss(out, want, reduction="none")
        return loss.sum() * share, batch_sums(loss, None, loss.numel())

    # -- metrics ----------------------------------------------------------------------------------
    def scores(self, model, split: str) -> dict:
        """``{mase, smape}`` per horizon (lists) of the model's forecasts at every origin of
        ``split`` (val or test)."""
        origins = getattr(self.split, split)
        fc = forecast_at(model, self.data.values, origins)
        _, actual = windows(self.data.values, origins, self.split.context, self.split.horizon)
        return {"mase": mase(fc, actual, self.scale).tolist(), "smape": smape(fc, actual).tolist()}

    def evaluate(self, model, split: str, device=None) -> dict:
        """``{mase, smape, n}`` (means over the horizon, ``n`` origins) and the values per
        horizon (``mase_by_h``, ``smape_by_h``) of a split (``structconv eval``)."""
        s = self.scores(model, split)
        return {"mase": float(np.mean(s["mase"])), "smape": float(np.mean(s["smape"])),
                "mase_by_h": s["mase"], "smape_by_h": s["smape"],
                "n": len(getattr(self.split, split))}

    def validate(self, model, epoch: int, last: bool) -> dict:
        v = self.scores(model, "val")
        return {"val_mase": float(np.mean(v["mase"])), "val_smape": float(np.mean(v["smape"]))}

    def row(self, epoch: int, totals: list, dt: float, val: dict | None, lr: float) -> dict:
        loss, _, n = totals
        steps = epoch * math.ceil(self.per_epoch / self.cfg["train"].get("accumulate", 1))
        budget = self.cfg["train"].get("max_steps", 0)
        return {"epoch": epoch, "step": min(steps, budget) if budget else steps,
                "train_loss": loss / n, **(val or {}), "time_s": round(dt, 4),
                "items_per_s": round(n / max(dt, 1e-9), 1), "lr": lr}

    def line(self, row: dict) -> str:
        return (f"epoch {row['epoch']:3d}  step {row['step']}  train_loss "
                f"{row['train_loss']:.4f}  val_mase {row['val_mase']:.4f}  val_smape "
                f"{row['val_smape']:.2f}")

    def result(self, model, main: bool) -> dict:
        val, test = self.scores(model, "val"), self.scores(model, "test")
        return {"val_mase": float(np.mean(val["mase"])), "val_smape": float(np.mean(val["smape"])),
                "test_mase": float(np.mean(test["mase"])),
                "test_smape": float(np.mean(test["smape"])), "test_mase_by_h": test["mase"],
                "test_smape_by_h": test["smape"], "mase_scale": self.scale,
                "test_origins": len(self.split.test)}

"""Univariate time series that ship with statsmodels, and the windows a forecaster reads.

Four registered datasets (the ``series`` extra: ``pip install 'structconv[series]'``):

* ``co2``         weekly atmospheric CO2 at Mauna Loa, 1958-2001, 2,284 weeks (59 missing
  weeks filled by linear interpolation), period 52;
* ``elnino``      monthly sea surface temperatures (El Niño region), 1950-2010, 732 months,
  period 12;
* ``sunspots``    yearly sunspot activity, 1700-2008, 309 years, a cycle of about 11 years;
* ``elec_equip``  monthly turnover index of electrical-equipment manufacturing (euro area),
  1995-2016, 257 months, period 12.

``SeriesData.values`` is a float64 tensor (T,). A forecast made at origin t (the first
unseen step) reads ``values[t - context:t]`` and predicts ``values[t:t + horizon]``;
``rolling_origins`` lists the origins of a rolling-origin evaluation and ``windows`` cuts the
(context, target) pairs. The registered loaders take the split's ``val`` and ``test`` fractions
(defaults 0.1 and 0.2: test last), which the forecasting task cuts by (nothing here scales).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .._extras import require
from .registry import DatasetError, check_fraction, register_dataset

__all__ = ["SeriesData", "SERIES", "load_series", "rolling_origins", "windows"]


@dataclass
class SeriesData:
    """One univariate series: ``values`` (T,) float64, its seasonal ``period`` (steps),
    ``frequency`` ("weekly", "monthly", "yearly") and the date of the first step."""

    name: str
    values: Tensor
    period: int
    frequency: str
    start: str
    #: steps that were missing in the source and filled (linear interpolation)
    filled: int = 0
    task: str = "series"
    meta: dict = field(default_factory=dict)
    #: the fractions of the series in the validation and test parts (test last)
    val: float = 0.1
    test: float = 0.2

    @property
    def length(self) -> int:
        return int(self.values.shape[0])

    def describe(self) -> str:
        fill = f", {self.filled} filled" if self.filled else ""
        return (f"{self.name}: {self.length} {self.frequency} steps from {self.start}, period "
                f"{self.period}{fill}")


SERIES = {
    "co2": ("statsmodels.datasets.co2", 52, "weekly",
            "weekly CO2 at Mauna Loa 1958-2001 (statsmodels), period 52"),
    "elnino": ("statsmodels.datasets.elnino", 12, "monthly",
               "monthly El Nino sea surface temperatures 1950-2010 (statsmodels), period 12"),
    "sunspots": ("statsmodels.datasets.sunspots", 11, "yearly",
                 "yearly sunspot activity 1700-2008 (statsmodels), cycle ~11"),
    "elec_equip": ("statsmodels.datasets.elec_equip", 12, "monthly",
                   "monthly euro-area electrical equipment turnover 1995-2016 (statsmodels), "
                   "period 12"),
}
"""The registered series: name -> (statsmodels module, period, frequency, description)."""


def _frame(name: str):
    require("statsmodels", "series", f"the {name} series")
    module, *_ = SERIES[name]
    # elec_equip is a submodule that statsmodels.datasets does not import itself
    return importlib.import_module(module).load().data


def _column(name: str, df) -> tuple[list[float], str]:
    """(values, ISO date of the first step) of one statsmodels frame, rows in time order."""
    if name == "elnino":  # one row per year, one column per month
        months = [c for c in df.columns if c != "YEAR"]
        if len(months) != 12:
            raise DatasetError(f"elnino: expected YEAR and 12 month columns, got "
                               f"{list(df.columns)}")
        vals = df[months].to_numpy(dtype=float).reshape(-1)
        return vals.tolist(), f"{int(df['YEAR'].iloc[0])}-01"
    if name == "sunspots":
        return df["SUNACTIVITY"].astype(float).tolist(), str(int(df["YEAR"].iloc[0]))
    if df.shape[1] != 1:
        raise DatasetError(f"{name}: expected one column, got {list(df.columns)}")
    col = df.iloc[:, 0].astype(float)
    filled = col.interpolate(method="linear", limit_direction="both")
    return filled.tolist(), str(df.index[0].date())


def load_series(name: str) -> SeriesData:
    """The registered series ``name`` (one of ``SERIES``) as ``SeriesData``."""
    if name not in SERIES:
        raise ValueError(f"unknown series {name!r}; known: {', '.join(SERIES)}")
    df = _frame(name)
    missing = int(df.isna().to_numpy().sum())
    values, start = _column(name, df)
    t = torch.tensor(values, dtype=torch.float64)
    if t.numel() < 3 or not bool(torch.isfinite(t).all()):
        raise DatasetError(f"{name}: the series has {t.numel()} steps or non-finite values "
                           "after filling")
    _, period, freq, desc = SERIES[name]
    return SeriesData(name, t, period, freq, start, filled=missing, meta={"source": desc})


def _register(name: str) -> None:
    def loader(root=None, val: float = 0.1, test: float = 0.2) -> SeriesData:
        val, test = check_fraction(name, "val", val), check_fraction(name, "test", test)
        if val <= 0 or test <= 0 or val + test >= 1:
            raise DatasetError(f"{name}: val and test must be above 0 with val + test below 1 "
                               f"(a training part is left), got {val:g} and {test:g}")
        data = load_series(name)
        data.val, data.test = val, test
        return data

    loader.__doc__ = SERIES[name][3]
    register_dataset(name, None, SERIES[name][3])(loader)


for _name in SERIES:
    _register(_name)


def rolling_origins(length: int, first: int, horizon: int, step: int = 1,
                    context: int = 1) -> list[int]:
    """Origins t = first, first + step, ... with a whole target ``[t, t + horizon)`` inside
    ``length`` steps and ``context`` steps of history before t (a rolling-origin evaluation:
    each forecast sees only the steps before its origin)."""
    for what, v, lo in (("length", length, 1), ("first", first, 0), ("horizon", horizon, 1),
                        ("step", step, 1), ("context", context, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"rolling_origins: {what} must be an int >= {lo}, got {v!r}")
    start = max(first, context)
    out = list(range(start, length - horizon + 1, step))
    if not out:
        raise ValueError(f"rolling_origins: no origin in [{start}, {length - horizon}] "
                         f"(length {length}, first {first}, horizon {horizon}, context "
                         f"{context})")
    return out


def windows(values: Tensor, origins, context: int, horizon: int) -> tuple[Tensor, Tensor]:
    """(contexts (n, context), targets (n, horizon)): ``values[t - context:t]`` and
    ``values[t:t + horizon]`` for each origin t of ``origins`` (n,)."""
    if not isinstance(values, Tensor) or values.dim() != 1:
        raise ValueError(f"windows: values must be a 1-d tensor, got "
                         f"{tuple(getattr(values, 'shape', ())) or type(values).__name__}")
    t = torch.as_tensor(origins, dtype=torch.long).reshape(-1)
    T = values.shape[0]
    if t.numel() and (int(t.min()) < context or int(t.max()) + horizon > T):
        raise ValueError(f"windows: origins must lie in [{context}, {T - horizon}] for context "
                         f"{context}, horizon {horizon} and {T} steps, got "
                         f"[{int(t.min())}, {int(t.max())}]")
    past = t.unsqueeze(1) + torch.arange(-context, 0)
    ahead = t.unsqueeze(1) + torch.arange(horizon)
    return values[past], values[ahead]

"""Position- and period-aware attention for forecasting: four statsmodels series.

``structconv reproduce forecast --out runs`` trains ``structconv.models.forecast.Forecaster``
(the shipped config ``forecast_<series>``, one run of the training engine per series, form and
seed: ``structconv train --config forecast_co2 model.forecast.form=period`` is one of them)
with each attention form (``content``: dot-product attention alone; ``position``: plus a
learned bias per relative offset; ``period``: plus learned biases per phase and per multiple
of the series' period) on co2 (weekly, period 52), elnino (monthly, 12), sunspots (yearly,
~11) and elec_equip (monthly, 12), for ``--seeds`` seeds, against two baselines: seasonal
naive and SARIMAX with orders chosen on the training part only (d by KPSS tests, D by the
strength of the STL seasonal component, then p, q, P, Q (co2: Fourier harmonics of the
52-week year in place of seasonal terms) by AIC).

Protocol: each series is cut in time into train / validation / test (``--val``, ``--test``
fractions, test last). A forecast at origin t reads the ``context`` steps before t and
predicts the next ``horizon`` steps. The networks train on random training windows (targets
inside the training part), keep the weights of the best validation MASE, and are evaluated
at every test origin (rolling origin, step 1, fixed weights). SARIMAX's parameters are fitted
once on the training part and applied, unchanged, to the whole series: its forecast at origin
t is the dynamic prediction from the state filtered on the steps before t. Metrics per
horizon h: MASE (mean absolute error over the test origins divided by the in-sample MAE of
the one-season naive forecast on the training part) and sMAPE (200·|y − ŷ| / (|y| + |ŷ|)).

Every network run is a run directory ``<out>/forecast_runs/<series>-<form>-s<seed>-<steps>``
(trained at most once under its lock; an interrupted one resumes exactly) and every SARIMAX fit
a JSON there: a rerun skips what is done. Writes
``<out>/forecast.json``, ``forecast_<series>.png`` (forecasts at test origins) and
``forecast_terms.png`` (the learned position and period terms).
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from .._extras import require
from ..config import forecast_spec, load_config
from ..data.series import SERIES, load_series, windows
from ..io import atomic_write_json
from ..models.forecast import FORMS, forecast_at
from ..training import load_run
from ..training.tasks.forecast import Split, mase, mase_scale, smape
from ._common import (
    FRACTION,
    POSITIVE,
    THREADS,
    Bounded,
    Listed,
    hardware,
    heads_divide,
    mean_std,
    pyplot,
    save_figure,
    write_result,
)
from .sweep import Run, sweep

__all__ = ["add_arguments", "run", "SETTINGS", "mase", "smape", "seasonal_naive",
           "mase_scale", "Split", "split_of", "net_run", "select_sarimax",
           "sarimax_forecasts", "harmonics", "fit_sarimax", "sarimax_candidates"]

#: per series: (context L, horizon H) in steps, as its shipped config ``forecast_<series>`` says
SETTINGS = {name: tuple(forecast_spec(load_config(f"forecast_{name}"))[k]
                        for k in ("context", "horizon")) for name in SERIES}


def add_arguments(parser) -> None:
    parser.add_argument("--series", default=",".join(SETTINGS), type=Listed.of(SETTINGS),
                        help=f"comma list of series (of {', '.join(SETTINGS)})")
    parser.add_argument("--forms", default=",".join(FORMS), type=Listed.of(FORMS),
                        help=f"comma list of attention forms (of {', '.join(FORMS)})")
    # sizes bounded as the config schema bounds them (validation every <= 1,000,000 steps)
    parser.add_argument("--seeds", type=Bounded(int, 1, 1000), default=3)
    parser.add_argument("--steps", type=Bounded(int, 1, 10**9), default=600,
                        help="training steps per run")
    parser.add_argument("--batch", type=Bounded(int, 1, 10**6), default=64)
    parser.add_argument("--lr", type=POSITIVE, default=2e-3)
    parser.add_argument("--width", type=Bounded(int, 1, 10**6), default=32)
    parser.add_argument("--heads", type=Bounded(int, 1, 10**6), default=4)
    parser.add_argument("--eval-every", type=Bounded(int, 1, 10**6), default=50)
    parser.add_argument("--val", type=FRACTION, default=0.1, help="validation fraction")
    parser.add_argument("--test", type=FRACTION, default=0.2, help="test fraction (the last)")
    parser.add_argument("--no-sarimax", action="store_true", help="skip the SARIMAX baseline")
    parser.add_argument("--sarimax-orders", default="2,1",
                        help="SARIMAX's search grid: the largest p = q, then P = Q (p,P)")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (0: default)")


# -- metrics -------------------------------------------------------------------------------------
def seasonal_naive(values: torch.Tensor, origins, horizon: int, period: int) -> torch.Tensor:
    """(n, horizon): ŷ[t + h] = y[t + h − period·ceil((h + 1) / period)] (h = 0..H-1), the
    last observed value of the same season before each origin t."""
    t = torch.as_tensor(origins, dtype=torch.long).unsqueeze(1)
    h = torch.arange(horizon)
    back = period * torch.div(h + period, period, rounding_mode="floor")  # period·ceil((h+1)/p)
    idx = t + h - back
    if int(idx.min()) < 0:
        raise ValueError(f"seasonal_naive: an origin lies within the first period ({period})")
    return values[idx]


# -- the split -----------------------------------------------------------------------------------
def split_of(data, a) -> Split:
    L, H = SETTINGS[data.name]
    return Split(data.length, L, H, a.val, a.test)


# -- the networks --------------------------------------------------------------------------------
def _overrides(form: str, seed: int, a) -> list[str]:
    """The config overrides of one network: the recipe's options as config keys (an epoch
    is ``--eval-every`` steps: the loop validates after each)."""
    return [f"model.forecast.form={form}", f"seed={seed}", f"train.max_steps={a.steps}",
            f"train.epochs={math.ceil(a.steps / a.eval_every)}",
            f"data.batches_per_epoch={a.eval_every}", f"data.batch_size={a.batch}",
            f"train.lr={a.lr!r}", "train.min_lr_ratio=0.1", f"model.forecast.width={a.width}",
            f"model.forecast.heads={a.heads}", f"data.options.val={a.val!r}",
            f"data.options.test={a.test!r}"]


def net_run(name: str, form: str, seed: int, a) -> Run:
    """The sweep's run of one network: the shipped config of the series with the overrides."""
    return Run(f"{name}-{form}-s{seed}-{a.steps}", f"forecast_{name}",
               tuple(_overrides(form, seed, a)))


def _record(run: Run, r: dict, folder: Path) -> dict:
    """One network's entry of the study (as the recipe has always written it) from its run
    directory: the result, the curve (one point per validation) and the learned terms."""
    where = folder / run.name
    rows = [json.loads(x) for x in (where / "metrics.jsonl").read_text().splitlines()]
    _, _, model = load_run(where)
    cfg = json.loads((where / "config.json").read_text())
    return {"series": r["dataset"], "form": cfg["model"]["forecast"]["form"], "seed": cfg["seed"],
            "val_mase": r["val_mase"],
            "curve": [{"step": x["step"], "train_loss": x["train_loss"], "val_mase": x["val_mase"]}
                      for x in rows],
            "test": {"mase": r["test_mase_by_h"], "smape": r["test_smape_by_h"]},
            "params": r["parameters"], "seconds": r["train_time_s"], "terms": _terms(model)}


def _networks(name: str, forms, a, folder: Path) -> list[dict]:
    """Every form x seed of one series, each trained (or read, or resumed) by the sweep."""
    runs = {net_run(name, f, a.seed + i, a): (f, a.seed + i) for f in forms
            for i in range(a.seeds)}

    def report(run: Run, r: dict) -> None:
        form, seed = runs[run]
        print(f"  {name:<10} {form:<8} seed {seed}: test MASE {r['test_mase']:.3f}  sMAPE "
              f"{r['test_smape']:.2f}  val {r['val_mase']:.3f}  {r['train_time_s']:.0f}s",
              flush=True)

    results = sweep(folder, runs, "forecast", a.device, report)
    return [_record(run, r, folder) for run, r in zip(runs, results)]


def _terms(model) -> dict:
    """The learned index terms as lists: ``offsets`` d = 1..L+H-1, ``at_offsets`` {term:
    (n, K) values at those offsets} and ``phase_tables`` {period: (period, K), row r the bias
    of d mod period = r}."""
    d = torch.arange(1, model.context + model.horizon)
    at = {k: v.tolist() for k, v in model.attention.offset_terms(d).items()}
    tables = {str(t.period): t.weight.detach().tolist() for t in model.attention.terms
              if getattr(t, "mode", None) == "phase"}
    return {"offsets": d.tolist(), "at_offsets": at, "phase_tables": tables}


# -- SARIMAX -------------------------------------------------------------------------------------
#: the longest period modelled with seasonal ARIMA terms; longer ones (co2's 52 weeks) get
#: Fourier harmonics as regressors (a seasonal state of 52 lags is slow and poorly fitted)
MAX_SEASONAL = 24


def harmonics(length: int, period: int, k: int) -> np.ndarray | None:
    """(length, 2k) sin/cos of the first k harmonics of ``period`` at steps 0..length-1."""
    if k == 0:
        return None
    t = np.arange(length)[:, None] * (2 * np.pi / period) * np.arange(1, k + 1)[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], 1)


def _differences(train: np.ndarray, period: int) -> tuple[int, int]:
    """(d, D): D = 1 where the STL seasonal component is strong (Wang, Smith & Hyndman's
    F_s > 0.64, as forecast::nsdiffs), then d from KPSS tests at 5% (at most 2)."""
    tsa = require("statsmodels.tsa.api", "series", "the SARIMAX baseline")
    stattools = require("statsmodels.tsa.stattools", "series", "the SARIMAX baseline")
    D = 0
    y = train
    if period <= MAX_SEASONAL and len(train) >= 3 * period:
        stl = tsa.STL(train, period=period, robust=True).fit()
        s, r = np.asarray(stl.seasonal), np.asarray(stl.resid)
        if 1 - np.var(r) / np.var(s + r) > 0.64:
            D, y = 1, train[period:] - train[:-period]
    d = 0
    while d < 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # KPSS warns when p lies outside its table
            p = stattools.kpss(y, regression="c", nlags="auto")[1]
        if p >= 0.05:
            break
        d, y = d + 1, np.diff(y)
    return d, D


def sarimax_candidates(period: int, d: int, D: int, orders: tuple[int, int] = (2, 1)) -> list[dict]:
    """The grid: p, q <= orders[0] and P, Q <= orders[1] (or 1-3 harmonics)."""
    trend = "c" if d + D == 0 else ("t" if d + D == 1 else "n")
    out = []
    top, stop = orders[0] + 1, orders[1] + 1
    for p in range(top):
        for q in range(top):
            if period <= MAX_SEASONAL:
                for P in range(stop):
                    for Q in range(stop):
                        out.append({"order": (p, d, q), "seasonal_order": (P, D, Q, period),
                                    "trend": trend, "harmonics": 0})
            else:
                for k in (1, 2, 3):
                    out.append({"order": (p, d, q), "seasonal_order": (0, 0, 0, 0),
                                "trend": trend, "harmonics": k})
    return out


def fit_sarimax(train: np.ndarray, spec: dict, period: int):
    sm = require("statsmodels.tsa.statespace.sarimax", "series", "the SARIMAX baseline")
    X = harmonics(len(train), period, spec["harmonics"])
    model = sm.SARIMAX(train, exog=X, order=spec["order"],
                       seasonal_order=spec["seasonal_order"], trend=spec["trend"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence and start-parameter warnings
        return model.fit(disp=False, maxiter=200)


def select_sarimax(train: np.ndarray, period: int,
                   orders: tuple[int, int] = (2, 1)) -> tuple[dict, object, list[dict]]:
    """Orders chosen on ``train`` alone: (d, D) by tests, then the candidate of least AIC
    among p, q <= orders[0], P, Q <= orders[1]; (the chosen spec, its fitted results, every
    candidate with its AIC)."""
    d, D = _differences(train, period)
    tried, best, best_res = [], None, None
    for spec in sarimax_candidates(period, d, D, orders):
        try:
            res = fit_sarimax(train, spec, period)
            aic = float(res.aic)
        except (ValueError, np.linalg.LinAlgError) as e:  # a candidate that cannot be fitted
            tried.append({**spec, "aic": None, "error": str(e)[:120]})
            continue
        tried.append({**spec, "aic": aic})
        if math.isfinite(aic) and (best is None or aic < best["aic"]):
            best, best_res = {**spec, "aic": aic}, res
    if best is None:
        raise RuntimeError("SARIMAX: no candidate order could be fitted")
    return best, best_res, tried


def sarimax_forecasts(res, values: np.ndarray, spec: dict, period: int, origins,
                      horizon: int) -> np.ndarray:
    """(n, horizon) forecasts at each origin t from the fitted parameters (unchanged) and the
    steps before t: the dynamic prediction over [t, t + horizon) of the model applied to the
    whole series (its state at t is filtered on y[:t] alone)."""
    X = harmonics(len(values), period, spec["harmonics"])
    full = res.apply(values, exog=X)
    out = np.empty((len(origins), horizon))
    for i, t in enumerate(origins):
        out[i] = full.get_prediction(start=t, end=t + horizon - 1, dynamic=True).predicted_mean
    return out


def _orders(a) -> tuple[int, int]:
    try:
        top, seasonal = (int(v) for v in a.sarimax_orders.split(","))
    except ValueError:
        raise ValueError(f"--sarimax-orders takes two integers p,P, got "
                         f"{a.sarimax_orders!r}") from None
    if not (0 <= top <= 5 and 0 <= seasonal <= 2):
        raise ValueError(f"--sarimax-orders {a.sarimax_orders}: p in 0..5 and P in 0..2")
    return top, seasonal


def _sarimax_file(data, a, folder: Path) -> Path:
    top, seasonal = _orders(a)
    grid = "" if (top, seasonal) == (2, 1) else f"-o{top}{seasonal}"
    return folder / f"{data.name}-sarimax{grid}.json"


def _run_sarimax(data, a, folder: Path) -> dict:
    done = _sarimax_file(data, a, folder)
    if done.is_file():
        return json.loads(done.read_text())
    sp = split_of(data, a)
    y = data.values.numpy()
    t0 = time.perf_counter()
    # fitted on everything before the test part (it needs no validation data)
    spec, res, tried = select_sarimax(y[:sp.test_start], data.period, _orders(a))
    fc = torch.from_numpy(sarimax_forecasts(res, y, spec, data.period, sp.test, sp.horizon))
    _, actual = windows(data.values, sp.test, sp.context, sp.horizon)
    scale = mase_scale(data.values[:sp.val_start], data.period)
    out = {"series": data.name, "spec": spec, "candidates": tried,
           "test": {"mase": mase(fc, actual, scale).tolist(),
                    "smape": smape(fc, actual).tolist()},
           "forecasts": fc.tolist(), "seconds": time.perf_counter() - t0}
    atomic_write_json(done, out)
    print(f"  {data.name:<10} SARIMAX {spec['order']}x{spec['seasonal_order']} trend "
          f"{spec['trend']} harmonics {spec['harmonics']}: test MASE "
          f"{np.mean(out['test']['mase']):.3f}  ({out['seconds']:.0f}s)", flush=True)
    return out


# -- the study -----------------------------------------------------------------------------------
#: the defaults of ``--quick`` (a value given on the command line is kept)
QUICK = dict(steps=8, seeds=1, eval_every=4, batch=8, width=8, heads=2, series="sunspots",
             sarimax_orders="1,0")


def check_arguments(a) -> None:
    """The checks that join options (each option's range is its argparse type)."""
    heads_divide(a)
    if a.val + a.test >= 1:
        raise ValueError(f"--val + --test must be below 1 (a training part is left), got "
                         f"{a.val:g} + {a.test:g}")
    _orders(a)


def _names(text: str, known, what: str) -> list[str]:
    out = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in out if s not in known]
    if bad or not out:
        raise ValueError(f"unknown {what} {', '.join(bad) or '(none given)'}: choose from "
                         f"{', '.join(known)}")
    return out


def run(args) -> int:
    """Every series x form x seed, the baselines, the tables, JSON and plots."""
    check_arguments(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = _names(args.series, list(SETTINGS), "series")
    forms = _names(args.forms, FORMS, "attention form")
    folder = Path(args.out) / "forecast_runs"
    folder.mkdir(parents=True, exist_ok=True)
    t_all, per = time.perf_counter(), {}
    for name in names:
        data = load_series(name)
        sp = split_of(data, args)
        runs = _networks(name, forms, args, folder)
        sar = None if args.no_sarimax else _run_sarimax(data, args, folder)
        per[name] = _summarise(data, sp, runs, sar, forms)
    result = {"experiment": "forecast", "settings": {k: v for k, v in vars(args).items()
                                                      if isinstance(v, (int, float, str))},
              "series": per, "wall_seconds": time.perf_counter() - t_all,
              "hardware": hardware()}
    _print_tables(per)
    write_result(args, "forecast", result)
    for name in names:
        _plot_forecasts(load_series(name), per[name], args, folder)
    _plot_terms(per, args)
    return 0


def _summarise(data, sp: Split, runs: list[dict], sar: dict | None, forms) -> dict:
    naive = seasonal_naive(data.values, sp.test, sp.horizon, data.period)
    _, actual = windows(data.values, sp.test, sp.context, sp.horizon)
    scale = mase_scale(data.values[:sp.val_start], data.period)
    models = {"seasonal naive": {"mase": (mase(naive, actual, scale).tolist(), None),
                                 "smape": (smape(naive, actual).tolist(), None)}}
    if sar is not None:
        models["SARIMAX"] = {k: (sar["test"][k], None) for k in ("mase", "smape")}
    for f in forms:
        rs = [r for r in runs if r["form"] == f]
        models[f] = {k: (np.mean([r["test"][k] for r in rs], 0).tolist(),
                         np.std([r["test"][k] for r in rs], 0, ddof=1).tolist()
                         if len(rs) > 1 else None) for k in ("mase", "smape")}
        models[f]["mean_over_h"] = {k: mean_std([np.mean(r["test"][k]) for r in rs])
                                    for k in ("mase", "smape")}
        models[f]["params"] = rs[0]["params"]
        models[f]["seconds"] = mean_std([r["seconds"] for r in rs])[0]
    return {"context": sp.context, "horizon": sp.horizon, "period": data.period,
            "split": {"train": [0, sp.val_start], "val": [sp.val_start, sp.test_start],
                      "test": [sp.test_start, data.length], "test_origins": len(sp.test)},
            "mase_scale": scale, "models": models,
            "sarimax": None if sar is None else {k: sar[k] for k in ("spec", "seconds")},
            "runs": runs}


def _print_tables(per: dict) -> None:
    for name, s in per.items():
        H = s["horizon"]
        hs = sorted({1, max(1, H // 4), max(1, H // 2), H})
        print(f"\n{name}: context {s['context']}, horizon {H}, period {s['period']}, "
              f"{s['split']['test_origins']} test origins (MASE / sMAPE %, mean over seeds)")
        print(f"{'model':<15} " + " ".join(f"{f'h={h}':>15}" for h in hs) + f" {'mean':>15}")
        for m, r in s["models"].items():
            cells = [f"{r['mase'][0][h - 1]:.3f} / {r['smape'][0][h - 1]:5.2f}" for h in hs]
            mean = f"{np.mean(r['mase'][0]):.3f} / {np.mean(r['smape'][0]):5.2f}"
            print(f"{m:<15} " + " ".join(f"{c:>15}" for c in cells) + f" {mean:>15}")


def _plot_forecasts(data, s: dict, a, folder: Path) -> None:
    plt = pyplot()
    H = s["horizon"]
    t0, t1 = s["split"]["test"]
    origins = [t0, t0 + (t1 - t0 - H) // 2]  # the first and a middle test origin
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    y = data.values
    for ax, t in zip(axes, origins):
        lo = max(0, t - 2 * H)
        ax.plot(range(lo, min(len(y), t + H)), y[lo:t + H].numpy(), color="black", lw=1.2,
                label="series")
        ax.plot(range(t, t + H), seasonal_naive(y, [t], H, data.period)[0].numpy(), ":",
                label="seasonal naive")
        sar = _sarimax_file(data, a, folder)
        if sar.is_file():
            fc = json.loads(sar.read_text())["forecasts"][t - t0]
            ax.plot(range(t, t + H), fc, "--", label="SARIMAX")
        for r in s["runs"]:
            if r["seed"] != min(q["seed"] for q in s["runs"]):
                continue
            _, _, m = load_run(folder / net_run(data.name, r["form"], r["seed"], a).name)
            ax.plot(range(t, t + H), forecast_at(m, y, [t])[0].numpy(), label=r["form"])
        ax.axvline(t - 0.5, color="grey", lw=0.8)
        ax.set_title(f"{data.name}: forecast at step {t}")
    axes[0].legend(fontsize=7)
    save_figure(fig, a, f"forecast_{data.name}")


def _plot_terms(per: dict, a) -> None:
    """The learned index terms of seed 0's models: the position model's bias per offset and
    the period model's summed phase + multiple biases per offset, every head, with the
    multiples of the period marked."""
    plt = pyplot()
    names = list(per)
    fig, axes = plt.subplots(2, len(names), figsize=(4 * len(names), 6), squeeze=False)
    for j, name in enumerate(names):
        s = per[name]
        first = min(r["seed"] for r in s["runs"])
        for i, form in enumerate(("position", "period")):
            ax = axes[i][j]
            r = next((r for r in s["runs"] if r["form"] == form and r["seed"] == first), None)
            if r is None:
                ax.set_visible(False)
                continue
            d = np.array(r["terms"]["offsets"])
            vals = sum(np.array(v) for v in r["terms"]["at_offsets"].values())
            ax.plot(d, vals, lw=0.9)
            for m in range(s["period"], int(d.max()) + 1, s["period"]):
                ax.axvline(m, color="grey", lw=0.6, ls=":")
            ax.set_title(f"{name}: {form} terms (period {s['period']})", fontsize=9)
            ax.set_xlabel("offset d = n − m")
    save_figure(fig, a, "forecast_terms")

"""Every option of every ``structconv reproduce`` recipe is checked before any work: a value out
of its range exits 2 with one line naming the option and the range; ``--quick`` changes
defaults only; a published result file with a non-finite metric is refused, not written."""

from __future__ import annotations

import argparse
import json
import math
import re

import pytest

from structconv import cli
from structconv.experiments import _common
from structconv.experiments._common import Bounded, Listed

RECIPES = cli._known("experiments")
#: options that name a file, folder, device or run tag (checked where they are opened)
FREE = {"--data", "--out", "--plot", "--cache", "--tag", "--device", "--help"}
#: options checked by other means than their type, with values each must refuse
OTHER = {
    ("forecast", "--sarimax-orders"): ["9,9", "x", "1"],
    # kg-link's options are the keys of a link config: its schema checks them
    # (their types bound the sizes above: the values past the top come from Bounded.bad)
    ("kg-link", "--dim"): ["0", "-4", "4097"], ("kg-link", "--init-std"): ["0", "-1", "nan"],
    ("kg-link", "--epochs"): ["0", "100001"], ("kg-link", "--batch"): ["0", "1000001"],
    ("kg-link", "--lr"): ["-1", "nan"],
    ("kg-link", "--reg-weight"): ["-1"], ("kg-link", "--label-smoothing"): ["2", "-0.5"],
    ("kg-link", "--negatives"): ["0", "1001"], ("kg-link", "--encoder-layers"): ["-1", "17"],
    ("kg-link", "--top"): ["-1", "10001"], ("kg-link", "--block"): ["0", "4097"],
    ("kg-link", "--edge-dropout"): ["1.5", "-0.1"], ("kg-link", "--time-limit"): ["0", "inf"],
    ("kg-link", "--eval-every"): ["0", "100001"], ("kg-link", "--eval-batch"): ["0", "1000001"],
    ("kg-link", "--threads"): ["-1", "4097"],
}
#: recipes whose every integer option (a size or a count) has an upper bound
SIZED = tuple(RECIPES)


def _parser(name):
    module = cli._import_suite("experiments", name, RECIPES)
    return module, cli._suite_parser(f"structconv reproduce {name}", module, "runs")


def _bad_values(name, action) -> list[str]:
    flag = action.option_strings[-1]
    if (name, flag) in OTHER:
        return OTHER[(name, flag)]
    if isinstance(action.type, Bounded):
        return action.type.bad()
    if isinstance(action.type, Listed):
        return ["no-such-item"] + ([] if action.type.empty else [","])
    if action.choices is not None:
        return ["no-such-choice"]
    raise AssertionError(f"reproduce {name} {flag}: no checked type (give it one from "
                         "experiments._common, or list it in OTHER with the values it refuses)")


def _cases():
    for name in RECIPES:
        _, p = _parser(name)
        for action in p._actions:
            flag = action.option_strings[-1] if action.option_strings else None
            if flag is None or flag in FREE or action.nargs == 0:
                continue
            for value in _bad_values(name, action):
                yield pytest.param(name, flag, value, id=f"{name} {flag} {value}")


@pytest.mark.parametrize("name,flag,value", list(_cases()))
def test_every_recipe_option_refuses_a_bad_value_by_name(name, flag, value):
    with pytest.raises(cli.UsageError) as e:
        cli.parse_suite("experiments", name, [flag, value])
    msg = str(e.value)
    assert flag in msg and "\n" not in msg, msg


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("quick", [False, True])
def test_the_defaults_pass_the_checks(name, quick):
    cli.parse_suite("experiments", name, ["--quick"] if quick else [])


def _quick_cases():
    for name in RECIPES:
        module, _ = _parser(name)
        for key, value in getattr(module, "QUICK", {}).items():
            yield pytest.param(name, key, value, id=f"{name} {key}")


@pytest.mark.parametrize("name,key,value", list(_quick_cases()))
def test_quick_changes_defaults_never_a_given_value(name, key, value):
    module, p = _parser(name)
    dests = {a.dest: a for a in p._actions}
    assert key in dests, f"{name}.QUICK names {key!r}, which is no option"
    _, ns = cli.parse_suite("experiments", name, ["--quick"])
    assert getattr(ns, key) == value
    default = p.get_default(key)
    if default is None or default == value or isinstance(default, bool):
        return
    flag = dests[key].option_strings[-1]
    # (a value may clash with the other quick defaults: check_arguments would refuse that)
    _, ns = cli.parse_suite("experiments", name, ["--quick", flag, str(default)], check=False)
    assert getattr(ns, key) == default  # the user's value stays


def test_a_bad_value_exits_2_with_one_line_before_any_work(capsys, tmp_path):
    for argv in (["canon", "--seeds", "0"], ["shift-heads", "--steps", "-5"],
                 ["forecast", "--batch", "0"], ["canon", "--jobs", "0"],
                 ["shift-heads", "--context", "0"], ["g2p", "--steps", "0", "--quick"],
                 ["canon", "--width", "10", "--heads", "4"]):
        rc = cli.main(["reproduce", *argv, "--out", str(tmp_path)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert argv[1] in err or "--heads" in err, err
    assert not any(tmp_path.iterdir())  # nothing was written


def test_options_given_before_the_name_are_checked_too():
    with pytest.raises(cli.UsageError, match="--seed"):
        cli.parse_suite("experiments", "canon", [], argparse.Namespace(seed=-3, device="cpu",
                                                                        out=None))


def test_bounded_describes_its_range():
    assert _common.COUNT.describe() == "an integer >= 1"
    assert _common.FRACTION.describe() == "a number in (0, 1)"
    assert _common.SEED.describe() == "an integer in [0, 4294967295]"
    for bad in _common.POSITIVE.bad():
        with pytest.raises(argparse.ArgumentTypeError):
            _common.POSITIVE(bad)
    assert _common.POSITIVE("1e-3") == 1e-3 and _common.NATURAL("0") == 0


def test_a_published_result_with_a_non_finite_metric_is_not_written(tmp_path):
    args = argparse.Namespace(out=str(tmp_path))
    for bad in (math.nan, math.inf):
        result = {"experiment": "x", "series": {"sunspots": {"content": {"mase": [1.0, bad]}}}}
        with pytest.raises(ValueError, match=r"series\.sunspots\.content\.mase\.1"):
            _common.write_result(args, "x", result)
        assert not (tmp_path / "x.json").exists()
    _common.write_result(args, "x", {"mase": 0.5, "note": None})
    assert json.loads((tmp_path / "x.json").read_text())["mase"] == 0.5


def test_a_non_finite_result_exits_2_naming_the_metric(capsys, tmp_path, monkeypatch):
    from structconv.experiments import routes_models

    monkeypatch.setattr(routes_models, "cases", lambda quick, root: [])
    monkeypatch.setattr(routes_models, "hardware", lambda: {"load": math.nan})
    rc = cli.main(["reproduce", "routes-models", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "hardware.load" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "routes_models.json").exists()


@pytest.mark.parametrize("name,argv,named", [
    ("canon", ["--width", "10", "--heads", "4"], "--heads must divide --width"),
    ("canon", ["--n", "4"], "--max-hops 8 must be below --n 4"),
    ("shift-heads", ["--stride", "100"], "--stride must be at most --context"),
    ("forecast", ["--val", "0.5", "--test", "0.5"], "--val + --test must be below 1"),
    ("forecast", ["--sarimax-orders", "9,9"], "--sarimax-orders"),
    ("tsp", ["--sample-instances", "50", "--test-size", "40"], "--sample-instances 50 exceeds"),
    ("g2p", ["--limit", "2"], "--limit must be 0"),
    ("separability", ["--model", "cnn", "--dataset", "aifb"], "--dataset for --model cnn"),
])
def test_options_that_must_agree_are_refused_by_name(name, argv, named):
    with pytest.raises(cli.UsageError, match=re.escape(named)):
        cli.parse_suite("experiments", name, argv)


def test_the_tsp_record_holds_no_nan_t_statistic(monkeypatch):
    import types

    import torch

    from structconv.training.tasks import routing

    base = torch.linspace(1, 2, 16)
    monkeypatch.setattr(routing, "uniform_instances", lambda count, n, seed: None)
    monkeypatch.setattr(routing, "greedy_lengths", lambda model, coords: base + 0.1)  # longer
    task = types.SimpleNamespace(spec={"bl_eval": 16, "alpha": 0.05}, bl_costs=base, bl_seed=0,
                                 data=types.SimpleNamespace(n=5), baseline=None)
    info = routing.RoutingTask.baseline_test(task, None, 1)
    assert info["bl_t"] is None and not info["bl_replaced"]  # was NaN: the file refused it
    _common.check_finite(info)


@pytest.mark.parametrize("name", SIZED)
def test_every_size_and_count_option_has_an_upper_bound(name):
    _, p = _parser(name)
    ints = [a for a in p._actions if isinstance(a.type, Bounded) and a.type.kind is int]
    unbounded = [a.option_strings[-1] for a in ints if a.type.hi is None]
    assert not unbounded, f"reproduce {name}: no upper bound on {unbounded}"
    typed = [a.option_strings[-1] for a in p._actions if a.type is int]
    assert not typed, f"reproduce {name}: plain int options {typed} (give them a Bounded)"


@pytest.mark.parametrize("argv", [
    ["canon", "--layers", "100000"], ["canon", "--width", "10000000"],
    ["canon", "--steps", "100000000"], ["canon", "--heads", "1000"],
    ["kg-link", "--dim", "1000000"], ["kg-link", "--epochs", "10000000"],
    ["kg-link", "--negatives", "100000"], ["sampled-cora", "--epochs", "10000000"],
    ["sampled-cora", "--seeds", "100000"], ["tu-gin", "--epochs", "10000000"],
])
def test_a_size_past_its_bound_exits_2_naming_it(argv, capsys, tmp_path):
    rc = cli.main(["reproduce", *argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and argv[1] in err, err
    assert "must be an integer" in err and ("<=" in err or "in [" in err), err
    assert not any(tmp_path.iterdir())

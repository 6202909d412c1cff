"""The ``structconv`` command line: each command end to end, and bad input -> exit 2, one line."""

from __future__ import annotations

import json
import os

import pytest
import torch

from structconv.cli import build_parser, main
from structconv.config import shipped_configs
from tests.conftest import run_cli

TINY = """
name = "tiny"
[data]
name = "karate"
[[model.layers]]
basis = "gcn"
channels = 4
activation = "relu"
[[model.layers]]
basis = "gcn"
channels = "classes"
[train]
epochs = 3
"""


run = run_cli


def _one_error_line(err: str):
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("structconv: error: ")
    return lines[0]


@pytest.fixture
def tiny(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    return p


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("demo", "train", "eval", "bench", "reproduce", "plot-basis", "verify"):
        assert cmd in out
    for opt in ("--seed", "--device", "--out"):
        assert opt in out


def test_every_command_has_help(capsys):
    sub = [a for a in build_parser()._actions if a.dest == "command"][0]
    for name in sub.choices:
        assert main([name, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: structconv " + name)
        assert "--seed" in out and "--device" in out and "--out" in out


# -- end to end, through a subprocess ------------------------------------------------------------
def test_demo_quick_prints_one_table(tmp_path):
    r = run("demo", "--quick", "--only", "graph", "--out", str(tmp_path / "demo"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("model"))
    assert all(c in lines[head] for c in ("basis", "parameters", "test acc", "time"))
    rows = lines[head + 2:head + 4]
    assert rows[0].startswith("gcn_karate") and rows[1].startswith("gat_karate")
    assert (tmp_path / "demo" / "gcn_karate" / "result.json").is_file()


def test_train_then_eval(tmp_path, tiny):
    out = tmp_path / "run"
    r = run("train", "--config", str(tiny), "--out", str(out), "--seed", "3",
            "train.epochs=4", "model.layers.0.channels=6")
    assert r.returncode == 0, r.stderr
    assert "test acc" in r.stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["seed"] == 3 and cfg["train"]["epochs"] == 4
    assert cfg["model"]["layers"][0]["channels"] == 6
    res = json.loads((out / "result.json").read_text())
    r = run("eval", str(out), "--split", "test")
    assert r.returncode == 0, r.stderr
    ev = json.loads((out / "eval-test.json").read_text())
    assert ev["acc"] == pytest.approx(res["test_acc"]) and ev["n"] == 18
    assert "accuracy" in r.stdout


def test_verify_passes(tmp_path):
    r = run("verify", "--quick", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((tmp_path / "verify.json").read_text())
    names = {x["name"] for x in rows}
    assert {"Proposition 1 (invert)", "Proposition 2 (compose)", "Conv2d", "GCNConv"} <= names
    assert all(x["status"] == "pass" for x in rows), rows
    assert "FAIL" not in r.stdout


def test_bench_and_plot_basis(tmp_path):
    r = run("bench", "routes", "--quick", "--repeats", "1", "--big-n", "200", "--out",
            str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "b" / "routes.json").read_text())
    # every result records the conditions it was measured under
    c = res["conditions"]
    assert {"cpu", "cores", "torch_threads", "load_average_1min", "load_average_1min_end"} <= set(c)
    assert isinstance(c["torch_threads"], int) and c["cpu"]
    assert "conditions:" in r.stdout
    env = dict(os.environ, STRUCTCONV_COSTS=str(tmp_path / "costs"))
    r = run_cli("bench", "routes", "--calibrate", "--quick", "--repeats", "1", "--out",
                tmp_path / "b", env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "grid_shift" in r.stdout and (tmp_path / "costs" / "costs.json").is_file()
    assert main(["plot-basis", "grid", "--in-shape", "3", "4", "--kernel", "2", "--out",
                 str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_input_in_a_subprocess_exits_2_with_one_line(tmp_path):
    r = run("train", "--config", "no_such_model")
    assert r.returncode == 2
    assert "unknown config 'no_such_model'" in _one_error_line(r.stderr)
    assert r.stdout == ""


# -- bad input, in process (same main(), no interpreter start-up) --------------------------------
def _bad(capsys, argv, expect):
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert expect in line, line
    return line


def test_bad_inputs_exit_2(capsys, tmp_path, tiny):
    _bad(capsys, ["nosuchcommand"], "invalid choice")
    _bad(capsys, ["train"], "train needs --config")
    _bad(capsys, ["train", "--config", str(tmp_path / "missing.toml")], "missing.toml not found")
    _bad(capsys, ["train", "--config", str(tiny), "train.epochs"], "expected key=value")
    _bad(capsys, ["train", "--config", str(tiny), "train.lr=fast"], "expects a number")
    _bad(capsys, ["train", "--config", str(tiny), "data.name=\"imagenet\""],
         "unknown dataset 'imagenet'")
    _bad(capsys, ["train", "--config", str(tiny), "--nproc", "0"], "--nproc must be >= 1")
    _bad(capsys, ["train", "--config", str(tiny), "--seed", "x"], "invalid int value")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[train\nepochs = 2")
    _bad(capsys, ["train", "--config", str(bad_toml)], "invalid TOML")
    shape = tmp_path / "shape.toml"
    shape.write_text(TINY.replace('basis = "gcn"\nchannels = 4',
                                  'basis = { kind = "grid", kernel_size = 3 }\nchannels = 4'))
    _bad(capsys, ["train", "--config", str(shape), "--out", str(tmp_path / "s")],
         "a grid basis needs grid-shaped input")
    _bad(capsys, ["bench", "nosuch"], "unknown benchmark suite 'nosuch'")
    _bad(capsys, ["reproduce", "nosuch"], "unknown experiment 'nosuch'")
    _bad(capsys, ["reproduce", "sweep"], "'sweep' is a shared module, not a recipe")
    _bad(capsys, ["eval", str(tmp_path / "norun")], "not found")
    _bad(capsys, ["demo", "--only", "sound"], "unknown families")
    if not torch.cuda.is_available():
        _bad(capsys, ["train", "--config", str(tiny), "--device", "cuda"],
             "CUDA is not available")
    _bad(capsys, ["train", "--config", str(tiny), "--device", "tpu"], "device")


def test_nan_loss_exits_2_and_leaves_no_partial_checkpoint(capsys, tmp_path, tiny):
    out = tmp_path / "nan"
    _bad(capsys, ["train", "--config", str(tiny), "--out", str(out), 'train.optimizer="sgd"',
                  "train.lr=1e30", "train.momentum=0.0", "train.epochs=20",
                  "train.checkpoint_every=1"], "loss is")
    leftovers = [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    if (out / "checkpoint.json").exists():
        assert main(["eval", str(out), "--weights", "last"]) in (0, 2)
        capsys.readouterr()


def test_resume_errors(capsys, tmp_path, tiny):
    out = tmp_path / "run"
    assert main(["train", "--config", str(tiny), "--out", str(out),
                 "train.checkpoint_every=1"]) == 0
    capsys.readouterr()
    _bad(capsys, ["train", "--config", str(tiny), "--out", str(out)], "already holds a run")
    _bad(capsys, ["train", "--resume", str(out), "--config", str(tiny)], "do not pass --config")
    _bad(capsys, ["train", "--resume", str(tmp_path / "nowhere")], "run directory not found")
    ck = json.loads((out / "checkpoint.json").read_text())
    tensor_file = out / ck["file"]
    data = bytearray(tensor_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tensor_file.write_bytes(bytes(data))
    _bad(capsys, ["train", "--resume", str(out)], "corrupt checkpoint")
    (out / "checkpoint.json").write_text("{")
    _bad(capsys, ["train", "--resume", str(out)], "corrupt checkpoint metadata")
    (out / "best.safetensors").write_bytes(b"garbage")
    _bad(capsys, ["eval", str(out)], "corrupt safetensors")


def test_resume_of_a_finished_run_is_a_no_op(capsys, tmp_path, tiny):
    out = tmp_path / "run"
    assert main(["train", "--config", str(tiny), "--out", str(out)]) == 0
    first = json.loads((out / "result.json").read_text())
    capsys.readouterr()
    assert main(["train", "--resume", str(out)]) == 0
    assert json.loads((out / "result.json").read_text()) == first


def test_configs_and_datasets_commands(capsys):
    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in shipped_configs())
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert "digits" in out and "karate" in out and "tinyshakespeare" in out

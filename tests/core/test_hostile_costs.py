"""Hostile cost files: a corrupt or hand-made ``costs.json`` never stops the program.

The planner's calibration (``sc.costs``) is read on the first planner call, validated whole
(weights finite, positive, real numbers; ``true`` is no number), ignored with one warning that
names the file and the field, and replaced by ``structconv bench routes --calibrate``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch

import structconv as sc
from structconv import costs
from tests.conftest import CLI

BIG = "1" + "0" * 400  # a 401-digit integer: float() of it overflows

HOSTILE = [
    ('{"weights": []}', r'field "weights" is a JSON list'),
    ('"a string"', r"holds a JSON str, expected an object"),
    ("[1, 2]", r"holds a JSON list, expected an object"),
    ("{}", r'field "weights" is missing'),
    ('{"weights": {"cpu": [1]}}', r'field "weights.cpu" is a JSON list'),
    ('{"weights": {"cpu": {"graph": ' + BIG + "}}}",
     r'"weights.cpu.graph": an integer of about 401 digits is not a finite number'),
    ('{"weights": {"cpu": {"graph": NaN}}}', r'"weights.cpu.graph": NaN is not a finite'),
    ('{"weights": {"cpu": {"graph": Infinity}}}', r'"weights.cpu.graph": Infinity is not'),
    ('{"weights": {"cpu": {"graph": -3}}}', r'"weights.cpu.graph": -3 is not a finite number'),
    ('{"weights": {"cpu": {"graph": 0}}}', r'"weights.cpu.graph": 0 is not a finite number'),
    ('{"weights": {"cpu": {"graph": 1e300}}}', r'"weights.cpu.graph": 1e\+300 is not a finite'),
    ('{"weights": {"cpu": {"graph": "16"}}}', r'"weights.cpu.graph": "16" is not a number'),
    ('{"weights": {"cpu": {"graph": true}}}', r'"weights.cpu.graph": true is not a number'),
    ('{"weights": {"cpu": {"graph": null}}}', r'"weights.cpu.graph": null is not a number'),
    ('{"weights": {"cpu": {"graph": [16]}}}', r'"weights.cpu.graph": \[16\] is not a number'),
    ("{not json", r"not JSON"),
    ("[" * 100_000, r"not JSON"),
    ("", r"not JSON"),
]


@pytest.fixture
def cost_file(tmp_path, monkeypatch):
    """``$STRUCTCONV_COSTS`` pointing at a file in tmp_path; the planner's state restored."""
    p = tmp_path / "costs.json"
    monkeypatch.setenv("STRUCTCONV_COSTS", str(p))
    costs.reload()
    yield p
    monkeypatch.delenv("STRUCTCONV_COSTS")
    costs.reload()


def _one_warning(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    mine = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    return out, str(mine[0].message)


@pytest.mark.parametrize("text,field", HOSTILE)
def test_a_hostile_file_is_ignored_whole_with_one_warning(cost_file, text, field):
    import re

    cost_file.write_text(text)
    out, msg = _one_warning(lambda: costs.read_calibration())
    assert out == {}
    assert msg.startswith(f"ignoring {cost_file}: ") and re.search(field, msg), msg
    assert "--calibrate" in msg
    # the planner keeps its defaults and answers
    _one_warning(costs.reload)
    assert costs.weight("graph") == costs.DEFAULTS["cpu"]["graph"]


def test_one_bad_weight_discards_the_good_ones_too(cost_file):
    cost_file.write_text('{"weights": {"cpu": {"sparse": 600, "graph": -1}}}')
    _one_warning(costs.reload)
    assert costs.weight("sparse") == costs.DEFAULTS["cpu"]["sparse"]


def test_valid_weights_are_read_as_floats(cost_file):
    cost_file.write_text('{"weights": {"cpu": {"sparse": 600, "graph": 2.5}, "cuda": {}}}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        costs.reload()
    assert costs.weight("sparse") == 600.0 and isinstance(costs.weight("sparse"), float)
    assert costs.weight("graph") == 2.5 and costs.weight("graph", "cuda") == 16.0


def test_binary_a_folder_a_fifo_and_a_huge_file_are_not_read(cost_file, tmp_path):
    cost_file.write_bytes(b"\xff\xfe{}")
    assert "not UTF-8" in _one_warning(costs.read_calibration)[1]
    cost_file.unlink()
    cost_file.mkdir()
    assert "not a regular file" in _one_warning(costs.read_calibration)[1]
    cost_file.rmdir()
    os.mkfifo(cost_file)  # reading a FIFO would block for ever
    assert "not a regular file" in _one_warning(costs.read_calibration)[1]
    cost_file.unlink()
    cost_file.write_text('{"weights": {}, "pad": "' + "x" * (2 << 20) + '"}')
    assert "more than a cost file holds" in _one_warning(costs.read_calibration)[1]


def test_a_missing_file_is_no_warning(cost_file):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert costs.read_calibration() == {}


def test_threads_planning_at_once_read_the_file_once(cost_file):
    cost_file.write_text('{"weights": []}')
    costs._calibration, costs._tables = None, {}  # as in a fresh process
    barrier = threading.Barrier(8)
    got = []

    def plan():
        barrier.wait()
        got.append(costs.weight("graph"))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=plan) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert got == [costs.DEFAULTS["cpu"]["graph"]] * 8
    assert sum(issubclass(w.category, RuntimeWarning) for w in caught) == 1


def test_calibration_replaces_a_corrupt_file_and_keeps_a_valid_ones_devices(cost_file):
    cost_file.write_text('{"weights": []}')
    costs.save_calibration("cpu", {"sparse": 7.0}, {"why": "test"})
    data = json.loads(cost_file.read_text())
    assert data == {"weights": {"cpu": {"sparse": 7.0}}, "meta": {"cpu": {"why": "test"}}}
    costs.save_calibration("cuda", {"graph": 3})
    data = json.loads(cost_file.read_text())
    assert data["weights"] == {"cpu": {"sparse": 7.0}, "cuda": {"graph": 3.0}}
    assert data["meta"]["cpu"] == {"why": "test"}
    assert costs.weight("sparse") == 7.0 and costs.weight("graph", "cuda") == 3.0
    # no temp file is left beside it (atomic write: a rename)
    assert sorted(p.name for p in cost_file.parent.iterdir()) == ["costs.json"]


@pytest.mark.parametrize("bad", [float("nan"), -1.0, 0.0, float("inf"), True, "2", 10**400])
def test_calibration_refuses_to_write_a_bad_weight(cost_file, bad):
    with pytest.raises(ValueError, match=r"calibration of cpu: weight 'graph': .* not a"):
        costs.save_calibration("cpu", {"graph": bad})
    assert not cost_file.exists()


def test_the_tracer_never_meets_the_file_read(cost_file):
    # torch.compile traces planner calls: a first call under tracing reads the file eagerly
    cost_file.write_text('{"weights": {"cpu": {"graph": 3.0}}}')
    code = ("import torch, structconv as sc\n"
            "from structconv import costs\n"
            "assert costs._calibration is None\n"
            "ei = torch.randint(0, 10, (2, 30))\n"
            "layer = sc.nn.GCNConv(4, 3)\n"
            "x = torch.randn(10, 4)\n"
            "torch.testing.assert_close(torch.compile(layer, fullgraph=True)(x, ei), "
            "layer(x, ei))\n"
            "assert costs._calibration == {'cpu': {'graph': 3.0}}\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_command_line_starts_and_recalibrates_over_a_corrupt_file(cost_file):
    cost_file.write_text('{"weights": {"cpu": {"graph": ' + BIG + "}}}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error::RuntimeWarning"}
    # importing and --help plan nothing, so they never even read the file
    r = subprocess.run([sys.executable, "-c", "import structconv as sc; sc.nn, sc.costs"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(CLI + ["--help"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "COMMAND" in r.stdout, r.stderr
    env["PYTHONWARNINGS"] = "default"
    r = subprocess.run(CLI + ["bench", "routes", "--calibrate", "--quick", "--repeats", "1"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(cost_file.read_text())
    assert set(data["weights"]["cpu"]) >= {"graph", "sparse", "copy"}
    assert costs.parse_calibration(data)["cpu"]["graph"] > 0
    # a planner call with the file corrupt again: one warning line, the right answer
    cost_file.write_text('{"weights": {"cpu": {"graph": true}}}')
    code = ("import torch, structconv as sc\n"
            "g = sc.basis.gcn(torch.tensor([[0, 1], [1, 2]]), 3)\n"
            "print(repr(float(sc.convolve(torch.ones(1, 3, 2), g, torch.ones(1, 2, 2)).sum())))\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("RuntimeWarning: ignoring") == 1 and '"weights.cpu.graph"' in r.stderr
    g = sc.basis.gcn(torch.tensor([[0, 1], [1, 2]]), 3)
    assert float(r.stdout) == float(sc.convolve(torch.ones(1, 3, 2), g, torch.ones(1, 2, 2)).sum())

"""Small things a new user meets: ``python -m structconv``, the shipped ``py.typed``, and
``structconv bench all --help``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile

import pytest

from structconv.bench import SUITES
from structconv.cli import main
from tests.conftest import (
    ENV,
    ROOT,  # noqa: E402
)


def test_python_dash_m_runs_the_command_line():
    r = subprocess.run([sys.executable, "-m", "structconv", "--help"], env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage: structconv "), r.stderr
    r = subprocess.run([sys.executable, "-m", "structconv", "train", "--config", "nope"],
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("structconv: error: unknown config 'nope'")


def test_the_wheel_ships_py_typed_and_main(tmp_path):
    assert (ROOT / "src" / "structconv" / "py.typed").is_file()
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed: the wheel cannot be built offline here")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("structconv-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"structconv/py.typed", "structconv/__main__.py",
            "structconv/configs/gcn_cora.toml"} <= names


def test_bench_all_help_lists_every_suite_and_its_options(capsys):
    assert main(["bench", "all", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: structconv bench all ")
    for name in SUITES:
        assert f"\n  {name}: " in out, name
    # the common options once, and each suite's own under its name
    assert out.count("--repeats REPEATS") == 2 and "--calibrate" in out and "--big-n" in out
    routes = out.index("\n  routes: ")
    assert routes < out.index("--calibrate") < out.index("\n  grid: ")


def test_bench_all_refuses_an_option_a_suite_lacks_before_running_any(tmp_path, capsys):
    rc = main(["bench", "all", "--calibrate", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "unrecognized arguments: --calibrate" in err[0], err
    assert not (tmp_path / "b").exists()  # routes (which takes it) did not run either

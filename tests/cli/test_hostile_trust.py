"""Import-path trust: a config is code, a run directory is data.

Before, a run directory ran any code its ``config.json`` named: ``{"kind": "venv.__main__:x"}``
made ``structconv eval RUN`` create virtual environments and exit 0, ``kind = "builtins:print"``
was called, and python-text's ``modules`` imported whatever it listed. Now ``eval RUN``,
``train --resume RUN``, ``load_run`` and ``train(resume=True)`` refuse every import path (basis
kinds, param forms, stack parts) with one line naming it, unless the user allows it
(``--allow-imports``, ``allow_imports=True`` or ``STRUCTCONV_ALLOW_IMPORTS=1``); python-text
reads module sources without importing them. Each case: exit 2 and one line, nothing imported.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import uuid
from types import SimpleNamespace

import pytest
import torch

import structconv as sc
from structconv.config import ConfigError, parse_config, validate
from structconv.registry import (
    ALLOW_IMPORTS_ENV,
    ImportRefused,
    KindError,
    check_import,
    imports_allowed,
    untrusted,
)
from structconv.training import load_run, prepare_run, train
from tests.conftest import ENV, run_cli

TINY = """
name = "tiny"
[data]
name = "karate"
[[model.layers]]
basis = "gcn"
channels = 8
activation = "relu"
[[model.layers]]
basis = "gcn"
channels = "classes"
[train]
epochs = 2
checkpoint_seconds = 0
"""

#: a module whose import leaves a file beside it: proof that a config ran code
SIDE_EFFECT = '''"""Imported only where a config may run code."""
import pathlib

pathlib.Path(__file__).with_suffix(".imported").write_text("imported")

import structconv as sc


def gcn(spec, structure):
    return sc.basis.build({"kind": "gcn"}, structure)


def full(spec, K, P, Q):
    return sc.params.Full(K, P, Q)

# padding so that python-text finds at least 100 characters here: the module's source is data
'''


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A 2-epoch run stopped after its first epoch (so ``--resume`` has work left)."""
    out = tmp_path_factory.mktemp("trust") / "run"
    torch.manual_seed(0)
    res = train(parse_config(TINY), out, stop_after=1)
    assert res == {"interrupted": True, "epoch": 1, "run": str(out)}
    return out


class Side:
    """A uniquely named side-effect module on ``sys.path`` and in ``PYTHONPATH``."""

    def __init__(self, folder):
        folder.mkdir(parents=True, exist_ok=True)
        self.name = f"sidefx_{uuid.uuid4().hex[:10]}"
        self.path = folder / f"{self.name}.py"
        self.path.write_text(SIDE_EFFECT)
        self.marker = self.path.with_suffix(".imported")
        self.env = {**ENV, "PYTHONPATH": f"{folder}:{ENV.get('PYTHONPATH', '')}"}

    @property
    def imported(self) -> bool:
        return self.marker.exists() or self.name in sys.modules

    def forget(self) -> None:
        """As if never imported (so that a later import shows again)."""
        sys.modules.pop(self.name, None)
        self.marker.unlink(missing_ok=True)


@pytest.fixture
def side(tmp_path, monkeypatch):
    s = Side(tmp_path / "mods")
    monkeypatch.syspath_prepend(str(s.path.parent))
    monkeypatch.delenv(ALLOW_IMPORTS_ENV, raising=False)
    yield s
    sys.modules.pop(s.name, None)


def _copy_with(base, tmp_path, edit):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    cfg = json.loads((run / "config.json").read_text())
    edit(cfg)
    (run / "config.json").write_text(json.dumps(cfg))
    return run


def _one_line_refusal(r, what: str):
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert f"refused to import {what}" in lines[0], lines[0]
    assert "--allow-imports" in lines[0] and ALLOW_IMPORTS_ENV in lines[0]


def _basis(kind):
    return lambda cfg: cfg["model"]["layers"][0].__setitem__("basis", {"kind": kind})


def _param(name):
    return lambda cfg: cfg["model"]["layers"][0].__setitem__("param", name)


def _stack_part(kind):
    return lambda cfg: cfg["model"]["layers"][0].__setitem__(
        "basis", {"kind": "stack", "parts": ["gcn", {"kind": kind}]})


def _cli(capsys, *args) -> SimpleNamespace:
    """``structconv ARGS`` in this process (the side module's folder is on ``sys.path``)."""
    from structconv.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return SimpleNamespace(returncode=rc, stdout=out.out, stderr=out.err)


# -- the command line: eval RUN and train --resume RUN -------------------------------------------
@pytest.mark.parametrize("command", ["eval", "resume"])
@pytest.mark.parametrize("where", ["basis", "param", "stack part"])
def test_run_directory_import_paths_are_refused(base_run, tmp_path, side, capsys, command,
                                                where):
    edit = {"basis": _basis(f"{side.name}:gcn"), "param": _param(f"{side.name}:full"),
            "stack part": _stack_part(f"{side.name}:gcn")}[where]
    run = _copy_with(base_run, tmp_path, edit)
    args = ["eval", run] if command == "eval" else ["train", "--resume", run]
    r = _cli(capsys, *args)
    kind = "param kind" if where == "param" else "basis kind"
    _one_line_refusal(r, f"{kind} '{side.name}:")
    assert str(run) in r.stderr
    assert not side.imported  # nothing was imported
    # the run directory is left as it was: no checkpoint written by a refused resume
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in base_run.iterdir())


def test_builtins_print_is_not_called(base_run, tmp_path, side, capsys):
    run = _copy_with(base_run, tmp_path, _basis("builtins:print"))
    r = _cli(capsys, "eval", run)
    _one_line_refusal(r, "basis kind 'builtins:print'")
    assert "'kind'" not in r.stdout  # before, print was called with the basis table


def test_venv_main_creates_nothing(base_run, tmp_path, side):
    # the case end to end, through a real process: before, it made virtual environments
    run = _copy_with(base_run, tmp_path, _basis("venv.__main__:x"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = run_cli("eval", run, env=side.env, cwd=cwd, timeout=300)
    _one_line_refusal(r, "basis kind 'venv.__main__:x'")
    assert list(cwd.iterdir()) == [] and not (run / "pyvenv.cfg").exists()


def test_resume_with_processes_is_refused_before_any_starts(base_run, tmp_path, side, capsys):
    run = _copy_with(base_run, tmp_path, _basis(f"{side.name}:gcn"))
    r = _cli(capsys, "train", "--resume", run, "--nproc", "2")
    if "exceeds the" in r.stderr:  # a one-core machine refuses --nproc 2 first
        pytest.skip(r.stderr.strip())
    _one_line_refusal(r, f"basis kind '{side.name}:gcn'")
    assert not side.imported


@pytest.mark.parametrize("allow", ["flag", "env"])
def test_the_user_may_allow_a_run_directory_its_imports(base_run, tmp_path, side, capsys,
                                                        monkeypatch, allow):
    run = _copy_with(base_run, tmp_path, _basis(f"{side.name}:gcn"))
    extra = []
    if allow == "flag":
        extra = ["--allow-imports"]
    else:
        monkeypatch.setenv(ALLOW_IMPORTS_ENV, "1")
    r = _cli(capsys, "eval", run, *extra)
    assert r.returncode == 0, r.stderr[-2000:]
    assert side.marker.exists() and "accuracy" in r.stdout
    side.forget()
    r = _cli(capsys, "train", "--resume", run, *extra)
    assert r.returncode == 0, r.stderr[-2000:]
    assert side.marker.exists() and (run / "result.json").is_file()


def test_the_variable_allows_only_when_it_says_1(base_run, tmp_path, side, capsys, monkeypatch):
    run = _copy_with(base_run, tmp_path, _basis(f"{side.name}:gcn"))
    for value in ("0", "", "true", "yes", "1 "):
        monkeypatch.setenv(ALLOW_IMPORTS_ENV, value)
        r = _cli(capsys, "eval", run)
        _one_line_refusal(r, f"basis kind '{side.name}:gcn'")
    assert not side.imported


def test_a_config_file_is_trusted_as_code(tmp_path, side, capsys):
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(TINY.replace('basis = "gcn"\nchannels = 8',
                                f'basis = {{ kind = "{side.name}:gcn" }}\nchannels = 8')
                   .replace("epochs = 2", "epochs = 1"))
    r = _cli(capsys, "train", "--config", cfg, "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert side.marker.exists()


# -- python-text's modules: read, never imported --------------------------------------------------
LM = """
name = "lm"
[data]
name = "python-text"
options = {{ modules = "{modules}" }}
batch_size = 4
seq_len = 16
batches_per_epoch = 2
eval_batch_size = 8
[model.lm]
width = 8
layers = 1
heads = 2
position = "shift"
shifts = 2
[train]
epochs = 1
monitor = "val_loss"
"""


def test_python_text_modules_are_read_not_imported(tmp_path, side, capsys):
    cfg = tmp_path / "lm.toml"
    cfg.write_text(LM.format(modules=f"textwrap,{side.name}"))
    run = tmp_path / "run"
    r = _cli(capsys, "train", "--config", cfg, "--out", run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not side.imported  # even a trusted config's modules are data
    r = _cli(capsys, "eval", run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not side.imported
    # the text holds the module's source, exactly
    text = sc.data.text.python_text(side.name)
    assert text == side.path.read_text() and not side.imported


@pytest.mark.parametrize("modules,match", [
    ("no_such_module_xyz", r"no module 'no_such_module_xyz'"),
    ("textwrap.nope", r"no module 'textwrap.nope'"),
    ("sys", r"no source for module 'sys'"),
    ("../etc/passwd", r"no module '\.\./etc/passwd'"),
    (" , ", r"modules names no module"),
    (["textwrap"], r"modules must be a comma-separated string"),
])
def test_python_text_bad_modules_are_named(modules, match):
    from structconv.data.registry import DatasetError

    with pytest.raises(DatasetError, match=match):
        sc.data.text.python_text(modules)


def test_python_text_finds_submodules_without_importing_their_packages():
    for m in [k for k in sys.modules if k == "wsgiref" or k.startswith("wsgiref.")]:
        pytest.skip(f"{m} is already imported in this process")
    src = sc.data.text.python_text("wsgiref.headers")
    assert "class Headers" in src and "wsgiref" not in sys.modules


# -- the Python API -------------------------------------------------------------------------------
def test_load_run_refuses_unless_allowed(base_run, tmp_path, side):
    run = _copy_with(base_run, tmp_path, _basis(f"{side.name}:gcn"))
    with pytest.raises(ImportRefused, match=rf"refused to import basis kind '{side.name}:gcn' "
                                            rf"named by {run}"):
        load_run(run)
    with pytest.raises(ImportRefused, match=r"config\.json: model\.layers\.0\.basis: refused"):
        prepare_run(run, None, True)
    assert not side.imported
    cfg, data, model = load_run(run, allow_imports=True)
    assert side.imported and isinstance(model, torch.nn.Module)


def test_train_resume_refuses_unless_allowed(base_run, tmp_path, side):
    run = _copy_with(base_run, tmp_path, _param(f"{side.name}:full"))
    with pytest.raises(ImportRefused, match=rf"refused to import param kind '{side.name}:full'"):
        train(None, run, resume=True)
    assert not side.imported and not (run / "result.json").exists()
    res = train(None, run, resume=True, allow_imports=True)
    assert side.imported and res["epochs"] == 2


# -- the registry's rule --------------------------------------------------------------------------
def test_untrusted_refuses_every_import_path_and_only_those(side):
    s = sc.basis.Structure(grid=(4, 3))
    path = f"{side.name}:gcn"
    assert path in sc.basis.BASES and imports_allowed()
    with untrusted("RUN"):
        assert not imports_allowed() and path not in sc.basis.BASES
        assert "grid" in sc.basis.BASES  # shipped kinds work as always
        assert sc.basis.build({"kind": "grid", "kernel_size": 3}, s).K == 9
        with pytest.raises(ImportRefused, match=rf"basis kind '{path}' named by RUN"):
            sc.basis.BASES.get(path)
        with pytest.raises(ImportRefused, match=r"parts\.0: refused to import basis kind"):
            sc.basis.build({"kind": "stack", "parts": [{"kind": path}]}, s)
        with pytest.raises(ImportRefused, match=rf"param kind '{side.name}:full'"):
            sc.params.build(f"{side.name}:full", 1, 2, 3)
        with pytest.raises(ImportRefused, match=r"model\.layers\.0\.basis: refused"):
            validate(parse_config(TINY.replace('basis = "gcn"', f'basis = "{path}"', 1)), "cfg")
        with pytest.raises(ImportRefused, match=r"model\.layers\.0: refused to import param"):
            validate(parse_config(TINY.replace('channels = 8', f'channels = 8\nparam = '
                                                               f'"{side.name}:full"')), "cfg")
        # an unknown name is still unknown, a registered one still registered
        with pytest.raises(ConfigError, match="unknown param 'nope'"):
            validate(parse_config(TINY.replace('channels = 8', 'channels = 8\nparam = "nope"')))
        with untrusted("INNER"):  # nested: still refused, the innermost source named
            with pytest.raises(ImportRefused, match="named by INNER"):
                check_import("x")
    assert not side.imported
    assert imports_allowed() and path in sc.basis.BASES  # the rule ends with the block


def test_allowing_reaches_nested_reads_and_the_variable_allows(side, monkeypatch):
    with untrusted("RUN", allow_imports=True):
        with untrusted("RUN"):  # prepare_run inside train(allow_imports=True)
            assert imports_allowed()
    with untrusted("RUN"):
        monkeypatch.setenv(ALLOW_IMPORTS_ENV, "1")
        assert imports_allowed()
        sc.basis.BASES.get(f"{side.name}:gcn")
    assert side.imported


def test_the_rule_ends_on_errors_and_stays_in_its_thread():
    with pytest.raises(RuntimeError):
        with untrusted("RUN"):
            raise RuntimeError("boom")
    assert imports_allowed()
    seen = []
    with untrusted("RUN"):
        # another thread's work (a user's own model built meanwhile) is not the run's
        t = threading.Thread(target=lambda: seen.append(imports_allowed()))
        t.start()
        t.join()
        assert not imports_allowed()
    assert seen == [True]
    assert issubclass(ImportRefused, KindError) and issubclass(ImportRefused, ValueError)


# -- hostile run directories: exit 2 and one line each, nothing imported --------------------------
def _nested_stack(kind):
    return lambda cfg: cfg["model"]["layers"][0].__setitem__("basis", {
        "kind": "stack", "parts": [{"kind": "stack", "parts": ["gcn", {"kind": kind}]}]})


def _hostile_edit(case: str, mod: str):
    return {
        "kind a number": (_basis(5), r"basis kind must be a string, got 5"),
        "kind a table": (_basis({"kind": f"{mod}:gcn"}), r"basis kind must be a string"),
        "empty module": (_basis(":gcn"), r"refused to import basis kind ':gcn'"),
        "stdlib callable": (_basis("os:system"), r"refused to import basis kind 'os:system'"),
        "padded path": (_basis(f" {mod}:gcn"), rf"refused to import basis kind ' {mod}:gcn'"),
        "module name alone": (_basis(mod), rf"unknown basis kind '{mod}'"),
        "nested stack": (_nested_stack(f"{mod}:gcn"),
                         r"basis\.parts\.0\.parts\.1: refused to import basis kind"),
        "param a table": (_param({"kind": f"{mod}:full"}), r"unknown param \{'kind'"),
        "param a number": (_param(7), r"unknown param 7"),
    }[case]


HOSTILE_EDITS = ["kind a number", "kind a table", "empty module", "stdlib callable",
                 "padded path", "module name alone", "nested stack", "param a table",
                 "param a number"]


def _main_refuses(capsys, args, match):
    import re

    from structconv.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(match, err), err
    return err


@pytest.mark.parametrize("case", HOSTILE_EDITS)
def test_hostile_run_configs_are_one_line(base_run, tmp_path, side, capsys, case):
    edit, match = _hostile_edit(case, side.name)
    run = _copy_with(base_run, tmp_path, edit)
    for args in (["eval", run], ["train", "--resume", run]):
        _main_refuses(capsys, args, match)
    assert not side.imported
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in base_run.iterdir())


@pytest.mark.parametrize("text,match", [
    ("[]", r"config\.json: a config is a JSON object, got list"),
    ("null", r"config\.json: a config is a JSON object, got NoneType"),
    ('"gcn"', r"config\.json: a config is a JSON object, got str"),
    ("[" * 100_000 + "]" * 100_000, r"config\.json: corrupt JSON \(RecursionError"),
    ('{"seed": ' + "9" * 5000 + "}", r"config\.json: corrupt JSON \(ValueError: Exceeds"),
    ("\ufeff{}", r"config\.json: corrupt JSON \(JSONDecodeError: Unexpected UTF-8 BOM"),
    ("{\"data\": ", r"config\.json: corrupt JSON \(JSONDecodeError"),
], ids=["list", "null", "string", "deep", "digits", "bom", "truncated"])
def test_a_config_json_that_is_not_a_config_is_one_line(base_run, tmp_path, capsys, text, match):
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    (run / "config.json").write_text(text, encoding="utf-8")
    for args in (["eval", run], ["train", "--resume", run]):
        _main_refuses(capsys, args, match)


# -- the resume commands printed for a run with imports allow them ---------------------------------
def test_printed_resume_commands_allow_the_runs_imports(tmp_path, side, monkeypatch, capsys):
    from structconv.cli import main
    from structconv.training.interrupt import TrainingInterrupted
    from tests.conftest import stop_at as _stop_at

    cfg = tmp_path / "cfg.toml"
    cfg.write_text(TINY.replace('basis = "gcn"\nchannels = 8',
                                f'basis = {{ kind = "{side.name}:gcn" }}\nchannels = 8')
                   .replace("epochs = 2", "epochs = 3"))
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--out", str(run), "--stop-after", "1"]) == 0
    hint = f"resume with: structconv train --resume {run} --allow-imports"
    assert hint in capsys.readouterr().out
    with monkeypatch.context() as m:  # a signal inside the resumed run's next epoch
        _stop_at(m, 1)
        with pytest.raises(TrainingInterrupted, match=hint):
            train(None, run, resume=True, allow_imports=True)
    # the printed command is one that works
    assert main(["train", "--resume", str(run), "--allow-imports"]) == 0
    assert json.loads((run / "result.json").read_text())["epochs"] == 3
    # a run without imports is told no more than before
    assert "--allow-imports" not in sc.training.resume_command(run, parse_config(TINY))

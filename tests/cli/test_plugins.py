"""Plug-in kinds: installed packages' entry points (groups ``structconv.bases`` and
``structconv.params``) are kinds of every process, the command line included.

Before, a basis registered from Python was invisible to the command line, and the only way a
config could name a user's kind was an import path. The distributions here are real: a package
and its ``.dist-info`` (``METADATA`` + ``entry_points.txt``) in a folder on ``sys.path``, found by
``importlib.metadata`` as pip's installs are.
"""

from __future__ import annotations

import sys
import uuid

import pytest
import torch

import structconv as sc
from structconv.registry import KindError, untrusted
from tests.conftest import ENV, run_cli

PLUGIN = '''"""A structconv plug-in: a ring basis (registering itself with traits) and more."""
import pathlib

import torch

import structconv as sc

pathlib.Path(__file__).with_name("imported").write_text("x")


def ring(spec, s):
    n = s.entries
    i = torch.arange(n)
    return sc.basis.Sparse(torch.stack([i * 0, i, (i + spec["shift"]) % n]), None, (1, n, n))


def plain(spec, s):
    return sc.basis.identity(s.entries)


def full(spec, K, P, Q):
    return sc.params.Full(K, P, Q)


NOT_CALLABLE = 3

# the module may register its kind itself to give it traits (defaults here)
sc.basis.register("{prefix}_ring", ring, defaults={{"shift": 1}})
'''


class Dist:
    """A distribution ``name`` holding package ``module`` with entry points, in ``site``."""

    def __init__(self, site, name: str, module: str, entries: dict, code: str = ""):
        self.site, self.name, self.module = site, name, module
        pkg = site / module
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(code)
        info = site / f"{name.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text("".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in table.items())
            for group, table in entries.items()))
        self.marker = pkg / "imported"


@pytest.fixture
def plug(tmp_path, monkeypatch):
    """An installed plug-in with uniquely named kinds; forgotten by the registries after."""
    prefix = f"p{uuid.uuid4().hex[:8]}"
    module = f"scplug_{prefix}"
    site = tmp_path / "site"
    d = Dist(site, f"sc-plugin-{prefix}", module, {
        "structconv.bases": {f"{prefix}_ring": f"{module}:ring",
                             f"{prefix}_plain": f"{module}:plain",
                             f"{prefix}_missing": f"{module}_nowhere:build",
                             f"{prefix}_attr": f"{module}:nope",
                             f"{prefix}_const": f"{module}:NOT_CALLABLE"},
        "structconv.params": {f"{prefix}_full": f"{module}:full"},
    }, PLUGIN.format(prefix=prefix))
    d.prefix = prefix
    monkeypatch.syspath_prepend(str(site))
    yield d
    for reg in (sc.basis.BASES, sc.params.PARAMS):
        for k in [k for k in reg.kinds() if k.startswith(prefix)]:
            reg.unregister(k)
    sys.modules.pop(module, None)


def test_installed_kinds_are_listed_and_load_on_first_use(plug):
    p = plug.prefix
    assert f"{p}_ring" in sc.basis.BASES and f"{p}_ring" in sc.basis.BASES.kinds()
    assert f"{p}_full" in sc.params.PARAMS and f"{p}_full" not in sc.basis.BASES
    assert not plug.marker.exists() and plug.module not in sys.modules  # listed, not imported
    s = sc.basis.Structure(grid=(4, 3))
    b = sc.basis.build({"kind": f"{p}_ring"}, s)
    assert plug.marker.exists()
    # the module's own registration gave the kind its defaults: shift 1 on a ring of 12
    dense = b.to_dense()[0]
    assert dense.shape == (12, 12) and dense[0, 1] == 1 and dense.sum() == 12
    assert sc.basis.with_defaults(f"{p}_ring") == {"kind": f"{p}_ring", "shift": 1}
    # a kind without a registration of its own has no traits
    assert sc.basis.build(f"{p}_plain", s).shape == (1, 12, 12)
    assert sc.basis.BASES.trait(f"{p}_plain", "defaults") is None
    theta = sc.params.build(f"{p}_full", 2, 3, 4)
    assert isinstance(theta, sc.params.Full) and theta().shape == (2, 3, 4)


def test_a_config_names_installed_kinds_and_builds_them(plug):
    from structconv.config import parse_config
    from structconv.models import build_model

    class Data:  # the smallest image dataset build_model accepts
        task, num_classes, shape = "image", 3, (1, 6, 6)

    cfg = parse_config(f'[data]\nname = "digits"\n[[model.layers]]\nbasis = "{plug.prefix}_ring"'
                       f'\nparam = "{plug.prefix}_full"\nchannels = 4\n')
    assert not plug.marker.exists()  # validated by name, not imported
    m = build_model(cfg, Data())
    assert plug.marker.exists()
    conv = m.blocks[0].conv
    assert isinstance(conv.param, sc.params.Full) and conv.basis.shape == (1, 36, 36)
    assert m(torch.randn(2, 1, 6, 6)).shape == (2, 3)


@pytest.mark.parametrize("suffix,match", [
    ("missing", r"entry point {p}_missing = scplug_{p}_nowhere:build of sc-plugin-{p} \(group "
                r"structconv\.bases\) failed to load \(ModuleNotFoundError: "),
    ("attr", r"entry point {p}_attr = scplug_{p}:nope of sc-plugin-{p} \(group structconv\.bases"
             r"\) failed to load \(AttributeError: "),
    ("const", r"entry point {p}_const = scplug_{p}:NOT_CALLABLE of sc-plugin-{p} \(group "
              r"structconv\.bases\) is int, not a callable builder"),
])
def test_an_entry_point_that_fails_to_load_is_one_line_naming_it(plug, suffix, match):
    p = plug.prefix
    with pytest.raises(KindError, match=match.format(p=p)) as e:
        sc.basis.BASES.get(f"{p}_{suffix}")
    assert "\n" not in str(e.value)
    assert f"{p}_{suffix}" not in sc.basis.BASES._builders  # tried again on the next use


def test_a_module_that_raises_on_import_is_named(tmp_path, monkeypatch):
    name = f"scbroken_{uuid.uuid4().hex[:8]}"
    Dist(tmp_path, "sc-broken", name, {"structconv.bases": {f"{name}_k": f"{name}:f"}},
         "raise RuntimeError('plug-in bug')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KindError, match=rf"basis kind '{name}_k': entry point {name}_k = {name}:f"
                                        r" of sc-broken .* failed to load \(RuntimeError: "
                                        r"plug-in bug\)"):
        sc.basis.build(f"{name}_k", sc.basis.Structure(grid=(3,)))
    sys.modules.pop(name, None)


def test_two_distributions_claiming_one_kind_are_named(tmp_path, monkeypatch):
    kind = f"dup_{uuid.uuid4().hex[:8]}"
    Dist(tmp_path / "a", "sc-dup-a", f"{kind}_a", {"structconv.bases": {kind: f"{kind}_a:f"}})
    Dist(tmp_path / "b", "sc-dup-b", f"{kind}_b", {"structconv.bases": {kind: f"{kind}_b:f"}})
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    with pytest.raises(KindError, match=rf"basis kind '{kind}' is installed twice under "
                                        rf"entry-point group 'structconv\.bases': {kind}_a:f by "
                                        rf"sc-dup-a; {kind}_b:f by sc-dup-b; uninstall one"):
        sc.basis.BASES.get(kind)


def test_shipped_and_registered_kinds_win_over_installed_names(tmp_path, monkeypatch):
    module = f"scshadow_{uuid.uuid4().hex[:8]}"
    Dist(tmp_path, "sc-shadow", module, {"structconv.bases": {"grid": f"{module}:f"},
                                         "structconv.params": {"full": f"{module}:f"}},
         "import pathlib\npathlib.Path(__file__).with_name('imported').write_text('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert sc.basis.BASES.get("grid") is sc.basis.BASES._builders["grid"]
    assert isinstance(sc.params.build("full", 1, 2, 2), sc.params.Full)
    assert not (tmp_path / module / "imported").exists()


def test_unknown_kinds_name_the_plug_in_groups():
    with pytest.raises(KindError, match=r"a kind installed under entry-point group "
                                        r"'structconv\.bases', or 'package\.module:function'"):
        sc.basis.BASES.get("no_such_kind_xyz")
    with pytest.raises(KindError, match=r"group 'structconv\.params'"):
        sc.params.PARAMS.get("no_such_form_xyz")


def test_installed_kinds_are_trusted_where_import_paths_are_not(plug):
    with untrusted("RUN"):
        assert f"{plug.prefix}_ring" in sc.basis.BASES
        assert sc.basis.build(f"{plug.prefix}_ring", sc.basis.Structure(grid=(5,))).K == 1
        assert f"{plug.module}:ring" not in sc.basis.BASES


# -- the command line ----------------------------------------------------------------------------
CFG = """
name = "plug"
[data]
name = "karate"
[[model.layers]]
basis = "{p}_plain"
param = "{p}_full"
channels = 8
activation = "relu"
[[model.layers]]
basis = {{ kind = "stack", parts = ["gcn", "{p}_ring"] }}
channels = "classes"
[train]
epochs = 1
"""


def _forget(plug) -> None:
    """The registries and the import system forget the plug-in (as a process that never met it)."""
    for reg in (sc.basis.BASES, sc.params.PARAMS):
        for k in [k for k in reg.kinds() if k.startswith(plug.prefix)]:
            reg.unregister(k)
    sys.modules.pop(plug.module, None)
    plug.marker.unlink(missing_ok=True)


def test_command_line_trains_and_evaluates_with_installed_kinds(plug, tmp_path, capsys,
                                                                monkeypatch):
    from structconv.cli import main

    # a fresh process finds the installed kinds by name (one real process; the rest in this one)
    env = {**ENV, "PYTHONPATH": f"{plug.site}:{ENV.get('PYTHONPATH', '')}"}
    cfg = tmp_path / "plug.toml"
    cfg.write_text(CFG.format(p=plug.prefix))
    run = tmp_path / "run"
    r = run_cli("train", "--config", cfg, "--out", run, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (run / "result.json").is_file() and plug.marker.exists()
    _forget(plug)
    # a run directory naming installed kinds needs no --allow-imports: they were installed
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert "accuracy" in capsys.readouterr().out and plug.marker.exists()
    # without the plug-in installed, its kind is unknown: one line
    _forget(plug)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(plug.site)])
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"unknown param '{plug.prefix}_full'" in err, err
    assert "a form installed under entry-point group 'structconv.params'" in err
    assert not plug.marker.exists()


def test_command_line_names_a_broken_entry_point_in_one_line(plug, tmp_path, capsys):
    from structconv.cli import main

    cfg = tmp_path / "plug.toml"
    cfg.write_text(CFG.format(p=plug.prefix).replace(f'"{plug.prefix}_plain"',
                                                     f'"{plug.prefix}_missing"'))
    capsys.readouterr()
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"entry point {plug.prefix}_missing = {plug.module}_nowhere:build of " \
           f"{plug.name}" in err and "failed to load" in err


# -- import failures of any kind: SystemExit and KeyboardInterrupt included ----------------------
ABRUPT = [("import sys\nsys.exit(0)\n", r"SystemExit: its module called sys\.exit\(0\)"),
          ("import sys\nsys.exit(3)\n", r"SystemExit: its module called sys\.exit\(3\)"),
          ("raise SystemExit\n", r"SystemExit: its module called sys\.exit\(None\)"),
          ("raise KeyboardInterrupt\n", r"KeyboardInterrupt\)")]


def _abrupt(tmp_path, monkeypatch, code):
    name = f"scabrupt_{uuid.uuid4().hex[:8]}"
    Dist(tmp_path, "sc-abrupt", name, {"structconv.bases": {f"{name}_k": f"{name}:f"}}, code)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.mark.parametrize("code, what", ABRUPT)
def test_a_module_that_exits_or_interrupts_on_import_is_named(tmp_path, monkeypatch, code,
                                                              what):
    # the registry caught Exception only: sys.exit(0) at import went through as a success
    name = _abrupt(tmp_path, monkeypatch, code)
    with pytest.raises(KindError, match=rf"entry point {name}_k = {name}:f of sc-abrupt .* "
                                        rf"failed to load \({what}"):
        sc.basis.build(f"{name}_k", sc.basis.Structure(grid=(3,)))
    sys.modules.pop(name, None)
    # the same for a config's import path
    with pytest.raises(KindError, match=rf"kind '{name}:f': cannot import '{name}' \({what}"):
        sc.basis.BASES.get(f"{name}:f")
    sys.modules.pop(name, None)


@pytest.mark.parametrize("code, what", ABRUPT[:1] + ABRUPT[3:])
def test_command_line_refuses_a_plug_in_that_exits_on_import(tmp_path, monkeypatch, capsys,
                                                             code, what):
    from structconv.cli import main

    name = _abrupt(tmp_path, monkeypatch, code)
    cfg = tmp_path / "exit.toml"
    cfg.write_text(f'name = "exit"\n[data]\nname = "karate"\n[[model.layers]]\nbasis = '
                   f'"{name}_k"\nchannels = "classes"\n[train]\nepochs = 1\n')
    capsys.readouterr()
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"entry point {name}_k = {name}:f of sc-abrupt" in err and "failed to load" in err
    assert not (tmp_path / "run" / "result.json").exists()
    sys.modules.pop(name, None)

"""What a new user meets first: help texts that list the names, errors that name the override,
an import that loads no heavy module, a kernel build that says what it does, an sdist that
holds what ``make docs`` and the examples need, and guides that list what the code accepts."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from structconv import cli
from tests.conftest import ROOT  # noqa: E402


def _run(capsys, argv) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_reproduce_and_bench_help_list_the_names_with_hyphens(capsys):
    rc, out, _ = _run(capsys, ["reproduce", "--help"])
    assert rc == 0
    flat = " ".join(out.split())
    for name in cli._known("experiments"):
        assert name in flat, name
    assert "kg-link" in flat and "shift-heads" in flat and "kg_link" not in flat
    rc, out, _ = _run(capsys, ["bench", "--help"])
    assert rc == 0 and all(n in out for n in ("routes", "grid", "graph", "attention", "lm"))


def test_reproduce_alone_names_the_recipes_and_claims_no_args(capsys):
    rc, _, err = _run(capsys, ["reproduce"])
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "needs NAME" in err and "kg-link" in err and "args" not in err
    rc, _, err = _run(capsys, ["bench"])
    assert rc == 2 and "needs NAME" in err and "routes" in err


def test_underscored_names_still_work(capsys):
    rc, out, _ = _run(capsys, ["reproduce", "kg_link", "--help"])
    assert rc == 0 and "--decoder" in out


@pytest.mark.parametrize("name", cli._known("experiments"))
def test_recipe_help_is_whole(capsys, name):
    rc, out, _ = _run(capsys, ["reproduce", name, "--help"])
    assert rc == 0
    description = out.split("\n\n")[1]  # after the usage block
    assert description.rstrip().endswith("."), description  # a whole sentence, not a cut line
    assert not re.search(r"\bissue \d+", out), out


def test_g2p_help_is_not_cut_mid_sentence(capsys):
    _, out, _ = _run(capsys, ["reproduce", "g2p", "--help"])
    assert "beside a baseline that reads spellings only." in " ".join(out.split())


def test_an_override_error_names_the_override(capsys, tmp_path):
    rc, _, err = _run(capsys, ["train", "--config", "cnn_digits", "train.epochs=-1",
                               "--out", str(tmp_path / "run")])
    assert rc == 2 and "override 'train.epochs=-1'" in err, err
    assert "cnn_digits.toml" not in err
    rc, _, err = _run(capsys, ["train", "--config", "cnn_digits", "model.layers.0.channels=0",
                               "--out", str(tmp_path / "run")])
    assert rc == 2 and "override 'model.layers.0.channels=0'" in err, err


HEAVY = ("torch._dynamo", "torch._inductor", "sympy", "matplotlib", "scipy", "networkx",
         "torch_geometric", "statsmodels", "rdkit", "pandas", "sklearn")


def test_import_structconv_loads_no_heavy_module():
    code = (f"import sys, structconv, json\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [], r.stdout


def test_the_cost_weights_carry_the_compiler_mark_without_loading_the_compiler():
    code = ("import sys, structconv.costs as c; assert 'torch._dynamo' not in sys.modules; "
            "print(c.weight._dynamo_marked_constant)\n"
            "import torch._dynamo\n"
            "def f(): pass\n"
            "def g(): pass\n"
            "torch._dynamo.assume_constant_result(f); c.constant_when_traced(g)\n"
            "assert vars(f) == vars(g) == {'_dynamo_marked_constant': True}, (vars(f), vars(g))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def test_a_kernel_build_says_what_it_does(monkeypatch, tmp_path, capsys):
    import torch.utils.cpp_extension as ext

    from structconv.kernels import native

    monkeypatch.setattr(ext, "_get_build_directory", lambda name, verbose: str(tmp_path))
    monkeypatch.setattr(ext, "load", lambda name, **kw: name)
    name = native._build("causal_taps")
    err = capsys.readouterr().err
    assert "compiling the kernel causal_taps.cpp" in err and "STRUCTCONV_NATIVE=0" in err
    (tmp_path / f"{name}.so").write_bytes(b"")  # built before: loaded without a word
    assert native._build("causal_taps") == name
    assert capsys.readouterr().err == ""
    src = tmp_path / "causal_taps.cpp"  # the build compiles its own copy of the source
    (tmp_path / "build.ninja").write_text("build causal_taps.o: compile /elsewhere/x.cpp\n")
    native._build("causal_taps")  # built from another checkout's file: ninja builds again
    assert "compiling the kernel" in capsys.readouterr().err
    (tmp_path / "build.ninja").write_text(f"build causal_taps.o: compile {src}\n")
    native._build("causal_taps")
    assert capsys.readouterr().err == ""


def test_the_sdist_holds_what_make_docs_and_the_examples_need():
    rules = (ROOT / "MANIFEST.in").read_text(encoding="utf-8")
    included = set()
    for line in rules.splitlines():
        words = line.split("#", 1)[0].split()
        if words and words[0] in ("include", "graft"):
            included.update(words[1:])
    for needed in ("docs", "examples", "mkdocs.yml", "CHANGELOG.md", "README.md", "Makefile",
                   "constraints.txt", "tests"):
        assert needed in included, needed
    # every file the site's pages include lies under an included path
    for page in (ROOT / "docs").rglob("*.md"):
        for path in re.findall(r'--8<-- "([^"]+)"', page.read_text(encoding="utf-8")):
            assert (ROOT / path).is_file() and (path.split("/")[0] in included), path


def test_the_lm_guide_lists_every_position_kind():
    from structconv.nn.lm import POSITIONS

    guide = (ROOT / "docs" / "guide" / "lm.md").read_text(encoding="utf-8")
    arguments = next(line for line in guide.splitlines() if line.startswith("| `position` |"))
    for kind in POSITIONS:
        assert f'`"{kind}"`' in arguments, kind
        assert f'| `"{kind}"` |' in guide, kind  # a row of the kinds' table


def test_a_recipe_says_it_is_working_when_it_has_been_silent(capsys):
    import time

    from structconv.experiments._common import heartbeat

    with heartbeat("reproduce x", every=0.2):
        time.sleep(0.75)
    out = capsys.readouterr().out
    assert out.count("reproduce x: working") >= 2, out
    with heartbeat("reproduce x", every=0.3):
        for _ in range(12):  # printing often: no extra line
            print("step", flush=True)
            time.sleep(0.05)
    out = capsys.readouterr().out
    assert "working" not in out and out.count("step") == 12

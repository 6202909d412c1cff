"""The documentation is true: the site builds strictly, every public name has an API entry, the
guide's Python blocks run, and every example runs (``--quick``) and prints what it should.

The examples run once (a module fixture); the site's build reads their output from there
(``$STRUCTCONV_EXAMPLE_OUTPUT``) instead of running them again.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tests.conftest import (
    ROOT,  # noqa: E402
    absent,
)

DOCS = ROOT / "docs"

#: each example and a line its --quick output must hold (what makes the output meaningful)
EXAMPLES = {
    "cnn": r"epoch  2  train loss \d\.\d+  test acc [01]\.\d+",
    "gcn_cora": r"epoch  30  loss \d\.\d+  val acc [01]\.\d+  test acc [01]\.\d+",
    "gat_edge_features": r"with edge_dim=2: +[01]\.\d+",
    "rgcn_link": r"MRR [01]\.\d+  Hits@1 [01]\.\d+  Hits@10 [01]\.\d+",
    "transformer_lm": r"sample: '.+'",
    "cyclic_shift": r"routes .+ agree to \d\.\de-\d+ \(float64\)",
    "sampled_graph": r"test accuracy \(exact layer-wise inference\): [01]\.\d+",
    "train_config": r"gcn_karate_dict on karate: val acc \d\.\d+, test acc \d\.\d+",
    "gin_tu": r"best validation accuracy [01]\.\d+ at epoch \d+: test accuracy [01]\.\d+",
    "hetero_dblp": r"test authors: Macro-F1 [01]\.\d+  Micro-F1 [01]\.\d+",
}
#: examples that read a dataset from the data home
NEEDS = {"gcn_cora": "cora", "gin_tu": "tu-mutag", "hetero_dblp": "dblp"}
#: the packages whose every public name must have an API entry (more: any ``::: module`` line)
PACKAGES = ["structconv", "structconv.basis", "structconv.params", "structconv.attention",
            "structconv.nn", "structconv.kg", "structconv.sampling", "structconv.data"]
#: top-level names documented under another path (sc.train is structconv.training.train)
ALIASES = {"structconv.train": "structconv.training.train"}


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """name -> (exit status, output, seconds) of ``examples/NAME.py --quick``; None where the
    example's dataset is absent. The outputs are also written for the site's build."""
    folder = tmp_path_factory.mktemp("example-output")
    runs = {}
    for name in EXAMPLES:
        if NEEDS.get(name) and absent(NEEDS[name]):
            runs[name] = None
            continue
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), "--quick"],
                           cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        runs[name] = (r.returncode, out, time.perf_counter() - t0)
        if r.returncode == 0:
            (folder / f"{name}.txt").write_text(out, encoding="utf-8")
    return folder, runs


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_runs_quick(name, example_runs):
    run = example_runs[1][name]
    if run is None:
        pytest.skip(absent(NEEDS[name]))
    code, out, seconds = run
    assert code == 0, f"examples/{name}.py --quick exited {code}:\n{out}"
    assert re.search(EXAMPLES[name], out), f"examples/{name}.py printed:\n{out}"
    assert "Traceback" not in out and "Warning" not in out, out


def test_every_example_is_tested_and_has_a_page():
    scripts = {p.stem for p in (ROOT / "examples").glob("*.py")}
    assert scripts == set(EXAMPLES), "add new examples to EXAMPLES (and a docs page)"
    for name in scripts:
        page = (DOCS / "examples" / f"{name}.md").read_text(encoding="utf-8")
        assert f'--8<-- "examples/{name}.py"' in page
        assert f"<!-- structconv:example-output {name} -->" in page


@pytest.fixture(scope="module")
def site(example_runs, tmp_path_factory):
    """The site, built with ``mkdocs build --strict`` into a temporary folder."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install "
                                         "'structconv[docs]')")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed")
    out = tmp_path_factory.mktemp("site")
    env = {**_env(), "STRUCTCONV_EXAMPLE_OUTPUT": str(example_runs[0])}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                        str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    return out


def test_site_builds_strictly(site):
    for page in ("index.html", "guide/configs.html", "guide/cli.html",
                 "api/nn.html", "examples/cnn.html"):
        assert (site / page).is_file(), page
    configs = (site / "guide/configs.html").read_text(encoding="utf-8")
    # generated from the schema: every [train.sampler] key and a basis kind's default
    from structconv.config import SAMPLER_KEYS

    for key in SAMPLER_KEYS:
        assert f"<code>{key}</code>" in configs, key
    cli = (site / "guide/cli.html").read_text(encoding="utf-8")
    assert "structconv kg" in cli and "--stop-after" in cli
    cnn = (site / "examples/cnn.html").read_text(encoding="utf-8")
    assert "DigitsCNN" in cnn and "test acc" in cnn  # the source (highlighted) and the output


def _documented_modules() -> list[str]:
    """PACKAGES and every module a ``::: path`` line of docs/api names."""
    names = list(PACKAGES)
    for page in sorted((DOCS / "api").glob("*.md")):
        for path in re.findall(r"^::: (\S+)", page.read_text(encoding="utf-8"), re.M):
            try:
                mod = importlib.import_module(path)
            except ImportError:
                continue  # an object, not a module
            if path not in names and hasattr(mod, "__all__"):
                names.append(path)
    return names


def test_every_public_name_has_an_api_entry(site):
    anchors = set()
    for html in (site / "api").rglob("*.html"):
        anchors |= set(re.findall(r'id="(structconv[\w.]*)"', html.read_text(encoding="utf-8")))
    referenced = "\n".join(p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.md"))
    missing = []
    for package in _documented_modules():
        assert f"::: {package}" in referenced, f"no `::: {package}` line in docs/api"
        mod = importlib.import_module(package)
        for name in mod.__all__:
            if name.startswith("__"):
                continue
            obj = getattr(mod, name)
            path = ALIASES.get(f"{package}.{name}", f"{package}.{name}")
            if isinstance(obj, types.ModuleType) and path == f"{package}.{name}":
                continue  # a subpackage: its own page
            # a function named as the module defining it (sc.kg.evaluate in kg/evaluate.py)
            # is documented where it is defined
            home = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
            if path not in anchors and home not in anchors:
                missing.append(path)
    assert not missing, "public names without an API entry (add a docstring and a `:::` " \
                        "line in docs/api):\n" + "\n".join(missing)


_RUNNER = r"""
import json, sys, traceback
pages, failed = json.loads(sys.stdin.read()), {}
for page, blocks in pages.items():
    ns = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{page} block {i + 1}", "exec"), ns)
        except BaseException:
            failed[page] = traceback.format_exc()
            break
print(json.dumps(failed))
"""


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)


#: the pages whose Python must run: the README's tour, the site's home and the guide
GUIDE = [ROOT / "README.md", *sorted([DOCS / "index.md", *(DOCS / "guide").glob("*.md")])]


@pytest.fixture(scope="module")
def guide_failures(tmp_path_factory):
    """Every ```python block of the guide run, page by page in a fresh namespace, in one
    process (the pages register kinds: kept out of the test process)."""
    pages = {str(p.relative_to(ROOT)): _python_blocks(p) for p in GUIDE}
    r = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(pages),
                       cwd=tmp_path_factory.mktemp("guide"), env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in GUIDE])
def test_guide_python_blocks_run(page, guide_failures):
    assert page not in guide_failures, guide_failures.get(page)


def test_readme_keeps_the_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for line in ("make demo    # creates .venv, installs structconv (CPU torch), runs "
                 "`structconv demo`",
                 "make test    # creates .venv, installs structconv with test extras, runs ruff "
                 "and the tests"):
        assert line in readme
    assert len(readme.splitlines()) < 120, "the README is the pitch; the guide holds the rest"


#: how the work was organised, which a user cannot look up: issue numbers, sessions, lent machines
PROCESS = re.compile(r"\bissues? #?\d+|\bthis session\b|\blent (?:GPU|H\d+|machine)|a lent\b|"
                     r"\bthe lead\b|\bthe issue(?:'s)?\b|\bno GPU was lent\b", re.I)


def _user_facing() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "mkdocs.yml"]
    files += sorted(DOCS.rglob("*.md")) + sorted((ROOT / "examples").glob("*.*"))
    return files + sorted((ROOT / "src" / "structconv").rglob("*.py"))


def test_docs_and_help_name_the_feature_not_the_process():
    """Docs, help texts, module headers and comments name the feature, the hardware and the
    command, never an issue number or how the work was organised."""
    found = []
    for path in _user_facing():
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PROCESS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
    assert PROCESS.search("Relation-aware attention (issue 24, item 5)")  # the check can fail
    assert PROCESS.search("run on a lent GPU")


def test_site_works_offline_from_disk(site):
    """Opened from disk with no network (as the README says): no page loads a script, style
    sheet, font or image from the network, search runs from file:// (its index inlined in a
    script, the Web Worker shim shipped), and diagrams are SVG files, not Mermaid (whose
    script would come from a CDN)."""
    remote = re.compile(r"<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)="
                        r"[\"']?(?:https?:)?//", re.I)
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert not remote.search(html), (page, remote.search(html))
        assert 'class="mermaid"' not in html, page
    index = (site / "search" / "search_index.js").read_text(encoding="utf-8")
    assert index.startswith("var __index = {") and '"guide/idea.html"' in index
    shim = site / "assets" / "iframe-worker" / "shim.js"
    assert "window.Worker" in shim.read_text(encoding="utf-8")
    assert 'src="../assets/iframe-worker/shim.js"' in (site / "guide/idea.html").read_text(
        encoding="utf-8")
    assert 'src="routes.svg"' in (site / "guide/idea.html").read_text(encoding="utf-8")
    assert (site / "guide" / "routes.svg").is_file()
    for md in DOCS.rglob("*.md"):
        assert "```mermaid" not in md.read_text(encoding="utf-8"), md

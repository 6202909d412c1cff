"""The house: the import graph has floors, not circles, and functions stay short.

Every ``import`` of a ``structconv`` module anywhere in a file counts, lazy ones inside functions
included: a lazy import that runs back up is still an arrow running back up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "structconv"

#: the floors, lowest first; a module may import its own floor (no circles) and those below
FLOORS = [
    ("_checks", "_paths", "io", "registry", "costs", "sparse", "_extras", "kernels", "checkpoint",
     "distributed"),
    ("basis",),
    ("algebra", "params"),
    ("engine",),
    ("", "attention"),  # "" is the package itself: it imports the core floors below
    ("nn",),
    ("kg", "data", "plots", "sampling"),
    ("models", "config", "minibatch"),
    ("train", "verify"),
    ("demo", "bench", "experiments"),
    ("cli", "__main__"),
]

#: functions over 60 lines, each with the reason it stays whole
LONG_FUNCTIONS = {
    ("experiments/routes_models.py", "cases"): "a table of the measured layers, one entry each",
    ("sampling/loader.py", "__init__"): "the loader's constructor: one check per DataLoader-style "
                                        "option, in the order of the signature",
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        rel = p.relative_to(SRC).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict) -> set[str]:
    """The structconv modules (dotted, without the ``structconv.`` prefix) ``path`` imports."""
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    pkg = [p for p in pkg if p]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("structconv"):
                mod = node.module[len("structconv"):].lstrip(".")
            else:
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}" if mod else a.name
                targets.append(sub if sub in modules else mod)
        elif isinstance(node, ast.Import):
            targets = [a.name[len("structconv"):].lstrip(".") for a in node.names
                       if a.name.split(".")[0] == "structconv"]
        for t in targets:
            # importing a.b.c runs the packages a and a.b first, except those the importer
            # lives in (Python initialised them before the importer ran)
            parts = t.split(".") if t else []
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if i == len(parts) or not (name == prefix or name.startswith(prefix + ".")):
                    out.add(prefix)
            if not t:
                out.add("")
    return {t for t in out if t in modules and t != name}


def _floor(name: str) -> int:
    head = name.split(".")[0]
    for i, names in enumerate(FLOORS):
        if head in names:
            return i
    raise AssertionError(f"module structconv.{name} has no floor: add it to FLOORS")


@pytest.fixture(scope="module")
def graph():
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def test_no_arrow_runs_back_up(graph):
    bad = [f"structconv.{m} (floor {_floor(m)}) imports structconv.{t} (floor {_floor(t)})"
           for m, ts in graph.items() for t in ts if _floor(t) > _floor(m)]
    assert not bad, "\n".join(sorted(bad))


def test_no_import_circles(graph):
    # the root package imports its submodules by design; circles through it are not circles
    edges = {m: {t for t in ts if t} for m, ts in graph.items() if m}
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                cyc = stack[stack.index(t):] + [t]
                found.append(" -> ".join(f"structconv.{c}" for c in cyc))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not found, "\n".join(found)


def test_functions_stay_short():
    long = []
    for p in SRC.rglob("*.py"):
        rel = str(p.relative_to(SRC))
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = n.end_lineno - n.lineno + 1
                if length > 60 and (rel, n.name) not in LONG_FUNCTIONS:
                    long.append(f"{rel}:{n.lineno} {n.name} ({length} lines)")
    assert not long, "split these (or list them with a reason):\n" + "\n".join(sorted(long))

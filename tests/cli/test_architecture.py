"""The house: the import graph has floors, not circles, and functions stay short.

Every ``import`` of a ``structconv`` module anywhere in a file counts, lazy ones inside functions
included: a lazy import that runs back up is still an arrow running back up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import SRC  # noqa: E402

#: the floors, lowest first; a module may import its own floor (no circles) and those below
FLOORS = [
    ("_checks", "_paths", "io", "registry", "costs", "sparse", "_extras", "kernels", "seeds",
     "_loading"),
    ("basis",),
    ("algebra", "params"),
    ("engine",),
    ("", "attention"),  # "" is the package itself: it imports the core floors below
    ("nn",),
    ("kg", "data", "plots", "sampling"),
    ("config",),  # the schema: names and validates components, builds nothing
    ("models",),
    ("training", "verify"),  # everything that trains: above the models it trains
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


# -- private names stay in their module; layers are built in sc.nn and models/ --------------------
#: cross-module uses of an underscore name, each with the reason it stays (keep this short)
PRIVATE_USES = {
    ("sampling/loader.py", "b._apply"): "a Basis maps its held tensors by the _apply protocol "
                                        "torch.nn.Module uses (Basis._apply), as .to does",
    ("sampling/typed_loader.py", "from loader import _check_int"): "the typed loader shares "
        "the homogeneous loader's option check, plan seeds and prefetch thread (one package)",
    ("sampling/typed_loader.py", "from loader import _splitmix"): "the same plan seeds",
    ("sampling/typed_loader.py", "from loader import _Prefetch"): "the same prefetch thread",
}


def _private_uses(path: Path, modules: dict) -> list[tuple[int, str]]:
    """(line, what) for each use in ``path`` of another structconv module's underscore name:
    ``from X import _y``, or ``a._y`` where ``a`` is a name imported from another module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported, out = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or
                                                 (node.module or "").startswith("structconv")):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append((node.lineno, f"from {node.module} import {a.name}"))
                imported.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            imported.update(a.asname or a.name.split(".")[0] for a in node.names
                            if a.name.startswith("structconv"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                not node.attr.startswith("__") and isinstance(node.value, ast.Name) and \
                node.value.id in imported:
            out.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return out


def test_no_module_uses_another_modules_private_names():
    mods = _modules()
    bad = []
    for p in SRC.rglob("*.py"):
        rel = str(p.relative_to(SRC))
        bad += [f"{rel}:{line} {what}" for line, what in _private_uses(p, mods)
                if (rel, what) not in PRIVATE_USES]
    # objects' private attributes (``x._y`` on a value of another module's class) are caught
    # by review, not here: the AST does not know a value's class
    assert not bad, ("make these public in their module (or list them with a reason):\n"
                     + "\n".join(sorted(bad)))


#: where nn.Module subclasses may be defined: layers, parameter forms, mechanisms, link
#: models and models; the benchmarks' reference implementations are listed one by one
LAYER_HOMES = ("nn/", "models/", "attention/", "kg/", "params.py")
REFERENCE_MODELS = {
    ("bench/lm.py", "PlainGPT"): "the plain torch GPT that bench lm times structconv against",
}


def test_layers_are_built_in_nn_and_models():
    bad = []
    for p in SRC.rglob("*.py"):
        rel = str(p.relative_to(SRC))
        if rel.startswith(LAYER_HOMES):
            continue
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.ClassDef) and (rel, n.name) not in REFERENCE_MODELS and any(
                    ast.unparse(b).split(".")[-1] in ("Module", "Sequential", "ModuleList")
                    for b in n.bases):
                bad.append(f"{rel}:{n.lineno} class {n.name}")
    assert not bad, ("define these in sc.nn or models/ (or list a benchmark's reference "
                     "model with a reason):\n" + "\n".join(sorted(bad)))


# -- one training loop; configs are configs ----------------------------------------------------
#: the one backward pass of all training
TRAINING_LOOP = {"training/loop.py": 1}
#: the other training loops that remain, by file, with how many backward calls each holds and
#: why: this list may only shrink (move a recipe onto the engine, then delete its line)
OTHER_LOOPS: dict[str, tuple[int, str]] = {}
#: the most backward sites src/ may hold outside bench/ and kernels/ once OTHER_LOOPS is
#: empty (the target was at most 2: the engine's own is the one left); those listed there
#: count on top of it while they remain
MAX_BACKWARD_SITES = 1


def _calls(path: Path, test) -> list[int]:
    """Lines of the calls in ``path`` whose function ``test(func)`` accepts."""
    return [n.lineno for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Call) and test(n.func)]


def _backward(func) -> bool:
    return isinstance(func, ast.Attribute) and func.attr == "backward"


def _backward_sites() -> dict[str, list[int]]:
    """The lines of the backward calls of each file of src/ outside bench/ and kernels/."""
    sites = {}
    for p in SRC.rglob("*.py"):
        rel = str(p.relative_to(SRC))
        if rel.startswith(("bench/", "kernels/")):
            continue
        lines = _calls(p, _backward)
        if lines:
            sites[rel] = lines
    return sites


def _loop_problems(sites: dict[str, list[int]]) -> list[str]:
    """What the backward ``sites`` break: a file with more than it is allowed, more sites than
    ``MAX_BACKWARD_SITES`` (plus OTHER_LOOPS'), a listed loop that is gone."""
    allowed = {**TRAINING_LOOP, **{k: n for k, (n, _) in OTHER_LOOPS.items()}}
    bad = [f"{rel}:{','.join(map(str, lines))} ({len(lines)} backward calls, allowed "
           f"{allowed.get(rel, 0)})" for rel, lines in sorted(sites.items())
           if len(lines) > allowed.get(rel, 0)]
    total = sum(len(v) for v in sites.values())
    most = MAX_BACKWARD_SITES + sum(n for n, _ in OTHER_LOOPS.values())
    if total > most:
        bad.append(f"{total} backward sites, more than {most}")
    gone = sorted(k for k in OTHER_LOOPS if k not in sites)
    if gone:
        bad.append(f"these loops are gone: delete their OTHER_LOOPS lines: {gone}")
    return bad


def test_one_training_loop():
    bad = _loop_problems(_backward_sites())
    assert not bad, ("a second training loop: train through structconv.training's Loop (a "
                     "Task says how batches are made and scored):\n" + "\n".join(bad))


def test_a_new_backward_site_fails_the_count():
    sites = _backward_sites()
    assert sum(map(len, sites.values())) == MAX_BACKWARD_SITES + sum(
        n for n, _ in OTHER_LOOPS.values()), "the count is not tight: lower MAX_BACKWARD_SITES"
    # one more anywhere: in a recipe, in a listed loop's file, in the loop itself
    for rel in ("experiments/fashion.py", *OTHER_LOOPS, *TRAINING_LOOP):
        more = {**sites, rel: [*sites.get(rel, []), 10_000]}
        assert any(rel in b for b in _loop_problems(more)), rel


def _namespace(func) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("Namespace", "SimpleNamespace")


#: modules that build a namespace as a config, by file with how many times and why (may only
#: shrink); cli.py builds the command line's namespaces by definition
NAMESPACE_CONFIGS: dict[str, tuple[int, str]] = {}


def test_no_namespace_built_as_a_config():
    bad = []
    for p in SRC.rglob("*.py"):
        rel = str(p.relative_to(SRC))
        lines = _calls(p, _namespace)
        if rel != "cli.py" and len(lines) > NAMESPACE_CONFIGS.get(rel, (0, ""))[0]:
            bad.append(f"{rel}:{','.join(map(str, lines))}")
    assert not bad, ("a namespace built as a config: pass a validated config dict (see "
                     "structconv.config) instead:\n" + "\n".join(sorted(bad)))

"""Character-level text: Tiny Shakespeare (a text file) and text that ships with Python."""

from __future__ import annotations

import codecs
import sys
import tokenize
from pathlib import Path

import torch

from .registry import DatasetError, TextData, check_fraction, check_int, register_dataset

__all__ = ["encode_text", "load_text_file", "python_text", "module_source"]


def _check_split(name: str, val, test, limit) -> None:
    if check_fraction(name, "val", val) + check_fraction(name, "test", test) >= 1:
        raise DatasetError(f"{name}: val + test must be below 1 (the rest trains), got "
                           f"{val} + {test}")
    if limit is not None:
        check_int(name, "limit", limit, 1)


def encode_text(name: str, text: str, val: float = 0.05, test: float = 0.05,
                limit: int | None = None) -> TextData:
    """Characters -> ids over the sorted vocabulary; contiguous train/val/test slices
    (fractions ``val`` and ``test`` of the first ``limit`` characters, the rest trains)."""
    _check_split(name, val, test, limit)
    if limit is not None:
        text = text[:limit]
    if len(text) < 100:
        raise DatasetError(f"{name}: text has {len(text)} characters, expected at least 100")
    vocab = "".join(sorted(set(text)))
    lut = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([lut[c] for c in text], dtype=torch.int64)
    n = ids.numel()
    n_val, n_test = int(val * n), int(test * n)
    a, b = n - n_val - n_test, n - n_test
    return TextData(name, {"train": ids[:a], "val": ids[a:b], "test": ids[b:]}, vocab)


def load_text_file(path: str | Path, name: str | None = None, **kw) -> TextData:
    """A UTF-8 text file as a character dataset."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: file not found (expected a UTF-8 text file)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return encode_text(name or path.stem, text, **kw)


@register_dataset("tinyshakespeare", "tinyshakespeare",
                  "Tiny Shakespeare characters (input.txt, 1.1M characters)", ("input.txt",))
def _tiny(root, val=0.05, test=0.05, limit=None):
    return load_text_file(Path(root) / "input.txt", "tinyshakespeare", val=val, test=test,
                          limit=limit)


def _find_spec(name: str):
    """``name``'s module spec found as the import system would, without importing (running)
    it or its parent packages: a loaded module's own spec, else the meta-path finders asked
    with the parent package's search path (None: not found)."""
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None)
    parent, _, _ = name.rpartition(".")
    path = None
    if parent:
        pspec = _find_spec(parent)
        path = getattr(pspec, "submodule_search_locations", None)
        if path is None:  # no such package, or a plain module (not a package)
            return None
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, path) if find is not None else None
        if spec is not None:
            return spec
    return None


def module_source(name: str) -> str:
    """The source text of module ``name``, read without importing it: a config naming modules
    (python-text's ``modules``) names data to read, never code to run."""
    try:
        spec = _find_spec(name) if name.replace(".", "").replace("_", "").isalnum() else None
    except (ImportError, ValueError) as e:
        raise DatasetError(f"python-text: no module {name!r} ({e})") from None
    if spec is None:
        raise DatasetError(f"python-text: no module {name!r} (modules are comma-separated "
                           "importable names, e.g. this,textwrap)")
    get = getattr(spec.loader, "get_source", None)
    try:
        src = get(spec.name) if get is not None else None
        # a frozen stdlib module (Python >= 3.11) names its file in the loader state
        file = getattr(spec.loader_state, "filename", None)
        if src is None and file:
            with tokenize.open(file) as f:
                src = f.read()
    except (ImportError, OSError, SyntaxError, UnicodeDecodeError) as e:
        raise DatasetError(f"python-text: no source for module {name!r} ({e})") from None
    if src is None:
        raise DatasetError(f"python-text: no source for module {name!r} (a compiled or "
                           "built-in module)")
    return src


def python_text(modules: str = "this,textwrap") -> str:
    """Text that ships with every Python: stdlib module sources (``this`` as the decoded Zen),
    read from their files; no module is imported."""
    if not isinstance(modules, str):
        raise DatasetError(f"python-text: modules must be a comma-separated string of module "
                           f"names, got {modules!r}")
    parts = []
    for name in [m.strip() for m in modules.split(",") if m.strip()]:
        src = module_source(name)
        if name == "this":
            # ``this`` holds the Zen rot13-encoded in its source: decode the text
            src = codecs.decode(src.split('"""')[1], "rot13")
        parts.append(src)
    if not parts:
        raise DatasetError(f"python-text: modules names no module, got {modules!r}")
    return "\n".join(parts)


@register_dataset("python-text", None,
                  "characters of stdlib text shipped with Python (the Zen + textwrap source)")
def _python_text(root=None, modules="this,textwrap", val=0.05, test=0.05, limit=None):
    return encode_text("python-text", python_text(modules), val=val, test=test, limit=limit)

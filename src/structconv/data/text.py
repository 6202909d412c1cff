"""Character-level text: Tiny Shakespeare (a text file) and text that ships with Python."""

from __future__ import annotations

import codecs
import importlib
import inspect
from pathlib import Path

import torch

from .registry import DatasetError, TextData, check_fraction, check_int, register_dataset

__all__ = ["encode_text", "load_text_file", "python_text"]


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


def python_text(modules: str = "this,textwrap") -> str:
    """Text that ships with every Python: stdlib module sources (``this`` as the decoded Zen)."""
    parts = []
    for name in [m.strip() for m in modules.split(",") if m.strip()]:
        if name == "this":
            # importing ``this`` prints the Zen; decode its rot13 source text instead
            spec = importlib.util.find_spec("this")
            src = Path(spec.origin).read_text(encoding="utf-8")
            body = src.split('"""')[1]
            parts.append(codecs.decode(body, "rot13"))
            continue
        try:
            parts.append(inspect.getsource(importlib.import_module(name)))
        except (ImportError, OSError, TypeError) as e:
            raise DatasetError(f"python-text: no source for module {name!r} ({e})") from None
    return "\n".join(parts)


@register_dataset("python-text", None,
                  "characters of stdlib text shipped with Python (the Zen + textwrap source)")
def _python_text(root=None, modules="this,textwrap", val=0.05, test=0.05, limit=None):
    return encode_text("python-text", python_text(modules), val=val, test=test, limit=limit)

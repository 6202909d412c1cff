"""Real datasets, found where the library finds them: the data home (``$STRUCTCONV_DATA``, else
the per-user folder) and each dataset's registered folder and files. A test that needs one
skips, naming what is missing and where, only when its files are truly absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from structconv.data.registry import data_root, data_root_source, dataset_dir, missing_files


def absent(name: str) -> str | None:
    """Why registered dataset ``name`` cannot be read (None: its files are all there)."""
    missing = missing_files(name)
    if not missing:
        return None
    more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
    return (f"{name} is not in the data home {data_root()} ({data_root_source()}): missing "
            f"{', '.join(missing[:3])}{more} in {dataset_dir(name)}")


def need(name: str) -> Path:
    """The folder holding dataset ``name``'s files; skips the test where they are absent."""
    why = absent(name)
    if why:
        pytest.skip(why)
    return dataset_dir(name)


def needs(*names: str) -> pytest.MarkDecorator:
    """A marker: skip unless every named dataset is in the data home."""
    why = [w for w in map(absent, names) if w]
    return pytest.mark.skipif(bool(why), reason="; ".join(why))

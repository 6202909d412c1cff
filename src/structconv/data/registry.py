"""Dataset registry: ``load_dataset(name, root=None, **options)`` returns one of three containers.

``ImageData`` (x (N, C, H, W) float, y (N,) long, per split), ``GraphData`` (node features (N, F),
labels, ``edge_index`` (2, E), split masks, optional ``edge_type``) and ``TextData`` (token ids
per split and the vocabulary). Loaders parse real files; file-backed sets look in ``root``, else in
``<data home>/<folder>``. The data home is ``$STRUCTCONV_DATA``, else a per-user folder,
``$XDG_CACHE_HOME/structconv/datasets`` (default ``~/.cache/structconv/datasets``): no machine
path is built in. ``missing_files(name)`` says which of a dataset's files are not there.
"""

from __future__ import annotations

import inspect
import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from .._paths import user_cache_dir

__all__ = ["ImageData", "GraphData", "TextData", "DatasetError", "DATASETS", "register_dataset",
           "load_dataset", "data_root", "data_root_source", "dataset_dir", "dataset_files",
           "missing_files", "dataset_names", "split_options", "check_int", "check_fraction"]


class DatasetError(ValueError):
    """A dataset file is missing or corrupt; the message names the file and what was expected."""


@dataclass
class ImageData:
    """Image classification: ``splits[name] = (x (N, C, H, W) float32, y (N,) long)``."""

    name: str
    splits: dict[str, tuple[Tensor, Tensor]]
    num_classes: int
    task: str = "image"

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        return tuple(next(iter(self.splits.values()))[0].shape[1:])

    def describe(self) -> str:
        sizes = ", ".join(f"{k} {v[0].shape[0]}" for k, v in self.splits.items())
        return f"{self.name}: images {self.shape}, {self.num_classes} classes ({sizes})"


@dataclass
class GraphData:
    """Node classification on one graph: x (N, F) (None: featureless), y (N,), masks (N,) bool.

    ``edge_index`` (2, E) is PyG's [source; target]; ``edge_type`` (E,) is set for relational
    graphs, with ``num_relations`` types; ``edge_attr`` (E, D) holds edge features where the
    graph has them (what a graph-attention layer's ``edge_dim`` reads).
    """

    name: str
    x: Tensor | None
    y: Tensor
    edge_index: Tensor
    masks: dict[str, Tensor]
    num_classes: int
    edge_type: Tensor | None = None
    num_relations: int = 1
    task: str = "node"
    #: names of the edge types (index = relation id, inverses included) where the data has them
    relations: list[str] | None = None
    edge_attr: Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.y.shape[0])

    @property
    def num_features(self) -> int:
        return self.num_nodes if self.x is None else int(self.x.shape[1])

    def describe(self) -> str:
        sizes = ", ".join(f"{k} {int(v.sum())}" for k, v in self.masks.items())
        rel = f", {self.num_relations} relations" if self.edge_type is not None else ""
        feats = "featureless" if self.x is None else f"{self.num_features} features"
        return (f"{self.name}: {self.num_nodes} nodes, {self.edge_index.shape[1]} edges{rel}, "
                f"{feats}, {self.num_classes} classes ({sizes})")


@dataclass
class TextData:
    """Character-level text: ``splits[name]`` a 1-d long tensor of ids into ``vocab``."""

    name: str
    splits: dict[str, Tensor]
    vocab: str
    task: str = "text"
    meta: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.vocab)

    def describe(self) -> str:
        sizes = ", ".join(f"{k} {v.numel()}" for k, v in self.splits.items())
        return f"{self.name}: {len(self.vocab)} symbols ({sizes} characters)"


DATASETS: dict[str, tuple[Callable, str | None, str]] = {}
"""Name -> (loader(root, **options), folder under the data root or None, one-line description)."""
#: name -> the files (relative to its folder) a file-backed dataset needs
_FILES: dict[str, tuple[str, ...]] = {}


def register_dataset(name: str, folder: str | None = None, description: str = "",
                     files: Sequence[str] = ()):
    """Decorator: register ``loader(root, **options)``; ``folder`` is its place in the data
    home (None: it ships with a dependency) and ``files`` what that folder must hold."""
    def deco(fn):
        DATASETS[name] = (fn, folder, description)
        _FILES[name] = tuple(files)
        return fn
    return deco


def data_root() -> Path | None:
    """The data home: ``$STRUCTCONV_DATA`` if set, else ``$XDG_CACHE_HOME/structconv/datasets``
    (default ``~/.cache/structconv/datasets``). It may not exist. None only where neither the
    variable nor a home folder is there."""
    env = os.environ.get("STRUCTCONV_DATA")
    if env:
        return Path(env)
    cache = user_cache_dir()
    return None if cache is None else cache / "datasets"


def data_root_source() -> str:
    """Where ``data_root()`` comes from, in words (for messages)."""
    return "$STRUCTCONV_DATA" if os.environ.get("STRUCTCONV_DATA") else \
        "the per-user default; set STRUCTCONV_DATA to use another folder"


def dataset_dir(name: str) -> Path | None:
    """Where the files of registered dataset ``name`` go: ``<data home>/<its folder>`` (None
    for a dataset that ships with a dependency, or without any data home)."""
    _, folder, _ = _registered(name)
    root = data_root()
    return None if folder is None or root is None else root / folder


def dataset_files(name: str) -> tuple[str, ...]:
    """The files (relative to its folder) registered dataset ``name`` needs."""
    _registered(name)
    return _FILES.get(name, ())


def missing_files(name: str, root: str | os.PathLike | None = None) -> list[str]:
    """The files of dataset ``name`` absent from ``root`` (default: its folder in the data
    home); [] when all are there or it ships with a dependency."""
    _, folder, _ = _registered(name)
    if folder is None:
        return []
    d = Path(root) if root is not None else dataset_dir(name)
    files = _FILES.get(name, ())
    if d is None or not d.is_dir():
        return list(files) or [f"{folder}/"]
    return [f for f in files if not (d / f).is_file()]


def _registered(name: str) -> tuple:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}")
    return DATASETS[name]


def dataset_names() -> list[str]:
    """Every registered dataset name."""
    return sorted(DATASETS)


def split_options(name: str) -> tuple[str, dict]:
    """``"synthetic:nodes=1000,edges=5000"`` -> ("synthetic", {"nodes": 1000, "edges": 5000}):
    options written after the name, values read as int, float, true/false or text."""
    if ":" not in name:
        return name, {}
    base, _, rest = name.partition(":")
    opts = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"dataset {name!r}: options after ':' must be key=value pairs "
                             f"separated by commas, got {item!r}")
        if key in opts:  # which of the two was meant? refuse rather than keep the last
            raise ValueError(f"dataset {name!r}: option {key!r} is given twice")
        opts[key] = _option_value(text.strip())
    return base, opts


def _option_value(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text.replace("_", "")) if text else text
        except ValueError:
            pass
    return text


def check_int(dataset: str, what: str, v, low: int = 0, high: int | None = None) -> int:
    """``v`` as an int in [low, high] (bool refused), or DatasetError naming the option."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low or \
            (high is not None and v > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise DatasetError(f"{dataset}: {what} must be an int {bound}, got {v!r}")
    return int(v)


def check_fraction(dataset: str, what: str, v) -> float:
    """``v`` as a fraction in [0, 1) (bool, NaN refused), or DatasetError naming the option."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v < 1:
        raise DatasetError(f"{dataset}: {what} must be a fraction in [0, 1), got {v!r}")
    return float(v)


def _check_options(name: str, fn: Callable, options: dict) -> None:
    """TypeError naming an option the loader does not take (and the ones it does)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = [k for k in params if k != "root"]
    bad = sorted(k for k in options if k not in known)
    if bad:
        raise TypeError(f"dataset {name!r}: unknown option(s) {', '.join(map(repr, bad))} "
                        f"(known: {', '.join(known) or 'none'})")


def load_dataset(name: str, root: str | os.PathLike | None = None, **options):
    """Load a registered dataset; ``root`` is its folder (default: data root / its folder).

    Options may follow the name (``"synthetic:nodes=1000,edges=5000"``); given both ways, the
    same option must not differ."""
    if name not in DATASETS and ":" in name:
        name, named = split_options(name)
        clash = sorted(k for k in set(named) & set(options) if named[k] != options[k])
        if clash:
            raise ValueError(f"dataset {name!r}: option(s) {', '.join(clash)} given both in the "
                             "name and in data.options with different values")
        options = {**named, **options}
    fn, folder, _ = _registered(name)
    _check_options(name, fn, options)
    if folder is not None:
        given = root is not None
        root = Path(root) if given else dataset_dir(name)
        if root is None:
            raise DatasetError(
                f"dataset {name!r} needs its files and there is no home folder for the data "
                f"home: set STRUCTCONV_DATA to the folder that holds {folder}/ or pass data.root")
        if not root.is_dir():
            where = "" if given else (f" (the data home is {data_root()}, {data_root_source()};"
                                      " `structconv datasets` lists where each dataset's files "
                                      "go)")
            raise DatasetError(f"dataset {name!r}: folder {root} does not exist{where}")
        return fn(root, **options)
    return fn(None, **options)

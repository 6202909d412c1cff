"""Planetoid citation graphs (Cora, CiteSeer, PubMed) from their original ``ind.<name>.*`` files.

The files are Python-2 pickles of scipy sparse matrices, numpy arrays and a dict of neighbour
lists (Yang et al. 2016). They are read with a restricted unpickler that only accepts those
classes, and assembled with the standard public split as Kipf & Welling's and PyG's loaders do.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .._extras import MissingExtra, require
from .registry import GraphData, data_root, register_dataset

__all__ = ["PlanetoidData", "load_planetoid", "PLANETOID_NAMES", "PLANETOID_FILES",
           "normalize_rows"]

PLANETOID_NAMES = ("cora", "citeseer", "pubmed")
#: the eight raw files of one dataset, ``ind.<name>.<suffix>``
PLANETOID_FILES = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
#: what each pickle must hold, for error messages
_EXPECTED = {
    "x": "a 2-d scipy sparse matrix (labelled training features)",
    "tx": "a 2-d scipy sparse matrix (test features)",
    "allx": "a 2-d scipy sparse matrix (features of all non-test nodes)",
    "y": "a 2-d numpy array of one-hot labels",
    "ty": "a 2-d numpy array of one-hot labels",
    "ally": "a 2-d numpy array of one-hot labels",
    "graph": "a dict {node id: [neighbour ids]}",
}


def shared_dir(sub: str | None = None) -> Path | None:
    """The data home (``sc.data.registry.data_root``: ``$STRUCTCONV_DATA``, else the per-user
    folder) if it exists; with ``sub``, its subfolder ``<home>/<sub>``. ``None`` when that
    folder does not exist."""
    root = data_root()
    if root is None:
        return None
    path = root / sub if sub else root
    return path if path.is_dir() else None


@dataclass
class PlanetoidData:
    """A node-classification graph: ``x`` (N, F), ``y`` (N,), ``edge_index`` (2, E), masks (N,)."""

    x: Tensor
    y: Tensor
    edge_index: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    num_classes: int
    name: str

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_edges(self) -> int:
        """Directed entries of ``edge_index`` (twice the undirected edges)."""
        return int(self.edge_index.shape[1])

    def to(self, device=None, dtype=None) -> PlanetoidData:
        """A copy on ``device``; ``dtype`` applies to the features only."""
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in kw.items():
            if isinstance(v, Tensor):
                kw[k] = v.to(device=device, dtype=dtype if k == "x" else None)
        return PlanetoidData(**kw)

    def __repr__(self) -> str:
        return (f"PlanetoidData(name={self.name!r}, nodes={self.num_nodes}, "
                f"edges={self.num_edges}, "
                f"features={self.num_features}, classes={self.num_classes}, "
                f"train/val/test={int(self.train_mask.sum())}/{int(self.val_mask.sum())}/"
                f"{int(self.test_mask.sum())})")


class _SafeUnpickler(pickle.Unpickler):
    """Only rebuilds numpy arrays, scipy sparse matrices and plain containers (data, not code)."""

    _ALLOWED = {
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("collections", "defaultdict"), ("collections", "OrderedDict"),
        ("__builtin__", "list"), ("builtins", "list"), ("__builtin__", "dict"),
        ("builtins", "dict"), ("__builtin__", "set"), ("builtins", "set"),
        ("__builtin__", "tuple"), ("builtins", "tuple"), ("copy_reg", "_reconstructor"),
        ("copyreg", "_reconstructor"), ("__builtin__", "object"), ("builtins", "object"),
        ("_codecs", "encode"),  # how Python-3 protocol-2 pickles spell bytes
    }
    _SPARSE = ("csr_matrix", "csc_matrix", "coo_matrix", "lil_matrix", "dok_matrix")

    def find_class(self, module, name):
        if module.startswith("scipy.sparse") and name in self._SPARSE:
            sparse = require("scipy.sparse", "graph", "loading Planetoid files")
            # the files name the private module scipy.sparse.csr; the class is public
            return getattr(sparse, name)
        if (module, name) in self._ALLOWED:
            mod = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)
            if mod == "numpy.core.multiarray" and not hasattr(np, "core"):
                mod = "numpy._core.multiarray"
            import importlib

            try:
                return getattr(importlib.import_module(mod), name)
            except ImportError:
                return getattr(importlib.import_module(mod.replace("core", "_core")), name)
        raise pickle.UnpicklingError(
            f"refusing to load global {module}.{name}: only numpy arrays, scipy sparse "
            "matrices and plain containers are allowed in dataset files"
        )


def _unpickle(path: Path, suffix: str):
    raw = path.read_bytes()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = _SafeUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except MissingExtra:  # scipy is not installed: say so, not that the file is corrupt
        raise
    except Exception as e:  # truncated streams raise EOFError, UnpicklingError, ValueError, ...
        raise ValueError(
            f"{path}: corrupt or truncated pickle ({type(e).__name__}: {e}); expected "
            f"{_EXPECTED[suffix]} in a Python-2 pickle"
        ) from None
    return obj


#: a file may expand to at most this many elements per byte (and 1e8 in all) once made dense
#: or unrolled into edges: Planetoid's real files expand 10-40x; a hostile pickle of shared
#: references expands by millions
_EXPANSION = 1000
_MAX_ELEMENTS = 10**8


def _check_expansion(n: int, path: Path, what: str) -> None:
    size = path.stat().st_size
    if n > min(_MAX_ELEMENTS, _EXPANSION * max(size, 1024)):
        raise ValueError(f"{path}: {what} would hold {n:,} elements from a file of {size:,} "
                         f"bytes (limit {min(_MAX_ELEMENTS, _EXPANSION * max(size, 1024)):,}): "
                         "refusing a file that expands far beyond its size")


def _check_sparse(obj, path: Path) -> None:
    """Refuse a scipy sparse matrix whose index arrays are inconsistent (making such a matrix
    dense reads and writes out of bounds: a crash, or silently wrong rows)."""
    fmt = obj.format
    rows, cols = obj.shape
    bad = None
    if fmt in ("csr", "csc"):
        major, minor = (rows, cols) if fmt == "csr" else (cols, rows)
        ip, ix = np.asarray(obj.indptr), np.asarray(obj.indices)
        if ip.dtype.kind not in "iu" or ix.dtype.kind not in "iu":
            bad = "index arrays are not integers"
        elif ip.shape != (major + 1,) or ip[0] != 0 or np.any(np.diff(ip) < 0):
            bad = f"indptr must be {major + 1} non-decreasing offsets from 0"
        elif ip[-1] != len(ix) or len(ix) != len(obj.data):
            bad = f"indptr ends at {ip[-1]} but there are {len(ix)} indices, {len(obj.data)} values"
        elif len(ix) and (ix.min() < 0 or ix.max() >= minor):
            bad = f"column indices in [{ix.min()}, {ix.max()}] outside [0, {minor})"
    elif fmt == "coo":
        r, c = np.asarray(obj.row), np.asarray(obj.col)
        if len(r) != len(c) or len(r) != len(obj.data):
            bad = "row, col and data lengths differ"
        elif len(r) and (r.min() < 0 or r.max() >= rows or c.min() < 0 or c.max() >= cols):
            bad = f"entries outside the shape {obj.shape}"
    else:
        bad = f"{fmt} matrices are not used by Planetoid files"
    if bad:
        raise ValueError(f"{path}: corrupt sparse matrix of shape {obj.shape}: {bad}")


def _as_matrix(obj, path: Path, suffix: str) -> np.ndarray:
    sparse = require("scipy.sparse", "graph", "loading Planetoid files")
    if sparse.issparse(obj):
        _check_sparse(obj, path)
        _check_expansion(obj.shape[0] * obj.shape[1], path, "the dense matrix")
        obj = obj.toarray()
    if not isinstance(obj, np.ndarray) or obj.ndim != 2:
        got = (f"array of shape {obj.shape}" if isinstance(obj, np.ndarray)
               else type(obj).__name__)
        raise ValueError(f"{path}: expected {_EXPECTED[suffix]}, got {got}")
    if obj.dtype.kind not in "biuf":
        raise ValueError(f"{path}: expected a numeric matrix, got dtype {obj.dtype}")
    if obj.dtype.kind == "f" and not np.isfinite(obj).all():
        raise ValueError(f"{path}: the matrix holds NaN or infinite values")
    return obj


def _read_test_index(path: Path) -> np.ndarray:
    out = []
    text = path.read_text(encoding="ascii", errors="replace")
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        try:
            out.append(int(s))
        except ValueError:
            raise ValueError(
                f"{path}: line {i} is {s[:40]!r}; expected one integer node id per line"
            ) from None
    if not out:
        raise ValueError(f"{path}: empty; expected one integer node id per line")
    return np.asarray(out, dtype=np.int64)


def _find_dir(root: Path, name: str) -> Path:
    """The folder with the files: ``root``, ``root/planetoid`` or ``root/<Name>/raw`` (PyG)."""
    for d in (root, root / "planetoid", root / name, root / name / "raw",
              root / _DISPLAY[name], root / _DISPLAY[name] / "raw"):
        if any((d / f"ind.{name}.{s}").exists() for s in ("graph", "x", "tx", "ally")):
            return d
    return root


_DISPLAY = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}


def _read_files(paths: dict) -> tuple[dict, dict, np.ndarray]:
    """The six matrices, the graph dict and the test ids, each checked for its type."""
    mats = {s: _as_matrix(_unpickle(paths[s], s), paths[s], s)
            for s in ("x", "y", "tx", "ty", "allx", "ally")}
    graph = _unpickle(paths["graph"], "graph")
    if not isinstance(graph, dict):
        raise ValueError(f"{paths['graph']}: expected {_EXPECTED['graph']}, "
                         f"got {type(graph).__name__}")
    return mats, graph, _read_test_index(paths["test.index"])


def _assemble_nodes(mats: dict, paths: dict, test_index: np.ndarray):
    """(features (N, F) float32, one-hot labels (N, C)) in node-id order, shapes checked."""
    x, y, tx, ty, allx, ally = (mats[s] for s in ("x", "y", "tx", "ty", "allx", "ally"))
    n_all, F, C = allx.shape[0], allx.shape[1], ally.shape[1]
    for s, rows, cols in (("x", y.shape[0], F), ("y", x.shape[0], C), ("ally", n_all, C),
                          ("tx", len(test_index), F), ("ty", len(test_index), C)):
        m = mats[s]
        if m.shape != (rows, cols):
            raise ValueError(
                f"{paths[s]}: shape {m.shape} disagrees with the other files; expected "
                f"({rows}, {cols}) (allx is {allx.shape}, ally {ally.shape}, "
                f"{len(test_index)} ids in test.index)"
            )
    if len(y) + 500 > n_all:
        raise ValueError(f"{paths['allx']}: {n_all} rows leave no room for {len(y)} training "
                         "plus 500 validation nodes")
    lo, hi = int(test_index.min()), int(test_index.max())
    if lo < n_all or len(np.unique(test_index)) != len(test_index):
        raise ValueError(
            f"{paths['test.index']}: test ids must be distinct and >= len(allx)={n_all}, got "
            f"range [{lo}, {hi}]"
        )
    if lo != n_all:
        raise ValueError(f"{paths['test.index']}: smallest test id {lo} should be "
                         f"len(allx)={n_all} (ids are contiguous after the non-test nodes)")
    span = hi - lo + 1
    _check_expansion(span * F, paths["test.index"], "the test features")
    # ids in [lo, hi] absent from test.index are featureless nodes (CiteSeer): zero rows; row i
    # of tx belongs to node test_index[i] (the canonical assembly's reordering, done as a direct
    # placement)
    tx_ext = np.zeros((span, F), dtype=np.float32)
    ty_ext = np.zeros((span, C), dtype=ty.dtype)
    tx_ext[test_index - lo] = tx
    ty_ext[test_index - lo] = ty
    return (np.concatenate([allx.astype(np.float32), tx_ext], 0),
            np.concatenate([ally, ty_ext], 0))


def _edges(graph: dict, N: int, path: Path) -> Tensor:
    """The graph dict as an undirected ``edge_index`` (2, E) without self loops or duplicates,
    ordered by (target, source) as PyG's coalesce."""
    total = 0
    for k, v in graph.items():
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"{path}: entry {k!r} is {type(v).__name__}; expected "
                             f"{_EXPECTED['graph']}")
        total += len(v)
    # counted before anything is built: shared lists in a pickle multiply edges for free
    _check_expansion(total, path, "the edge list")
    rows, cols = [], []
    for k, v in graph.items():
        rows.extend([k] * len(v))
        cols.extend(v)
    try:
        r = np.asarray(rows, dtype=np.int64)
        c = np.asarray(cols, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{path}: node ids must be integers; expected "
                         f"{_EXPECTED['graph']}") from None
    if len(r) and (min(r.min(), c.min()) < 0 or max(r.max(), c.max()) >= N):
        raise ValueError(f"{path}: node ids in [{min(r.min(), c.min())}, "
                         f"{max(r.max(), c.max())}] but the features give N={N} nodes")
    r, c = np.concatenate([r, c]), np.concatenate([c, r])
    keep = r != c
    key = np.unique(c[keep] * N + r[keep])
    return torch.from_numpy(np.stack([key % N, key // N]))


def normalize_rows(x: Tensor) -> Tensor:
    """Each row divided by its sum (rows summing to 0 stay 0), as PyG's ``NormalizeFeatures``."""
    s = x.sum(1, keepdim=True)
    return x / torch.where(s == 0, torch.ones_like(s), s)


def load_planetoid(root: str | os.PathLike, name: str, *,
                   normalize_features: bool = False) -> PlanetoidData:
    """Cora / CiteSeer / PubMed from the raw ``ind.<name>.*`` files in ``root``, public split.

    Returns ``PlanetoidData`` with ``x`` (N, F) float32, ``y`` (N,), an undirected ``edge_index``
    (2, E) without self loops or duplicates, and masks of 20 labels per class / 500 / 1000 nodes.
    Test ids missing from ``test.index`` (CiteSeer's 15 isolated nodes) get zero features and
    label 0 and belong to no mask, as in PyG. ``normalize_features`` divides rows by their sum.
    """
    if not isinstance(name, str) or name.lower() not in PLANETOID_NAMES:
        raise ValueError(f"unknown Planetoid dataset {name!r}: choose one of {PLANETOID_NAMES}")
    name = name.lower()
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"Planetoid folder {root} does not exist")
    d = _find_dir(root, name)
    paths = {s: d / f"ind.{name}.{s}" for s in PLANETOID_FILES}
    missing = [p.name for p in paths.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{_DISPLAY[name]} cannot be loaded from {d}: missing file(s) {', '.join(missing)}"
        )
    # the pickles hold scipy matrices: without the extra, say so before reading any file
    require("scipy.sparse", "graph", "loading Planetoid files")
    mats, graph, test_index = _read_files(paths)
    feats, labels = _assemble_nodes(mats, paths, test_index)
    N = feats.shape[0]
    yv = labels.argmax(1)
    edge_index = _edges(graph, N, paths["graph"])
    y, C = mats["y"], labels.shape[1]

    def mask(idx):
        m = torch.zeros(N, dtype=torch.bool)
        m[torch.as_tensor(idx, dtype=torch.long)] = True
        return m

    xt = torch.from_numpy(np.ascontiguousarray(feats))
    return PlanetoidData(
        x=normalize_rows(xt) if normalize_features else xt,
        y=torch.from_numpy(yv.astype(np.int64)),
        edge_index=edge_index,
        train_mask=mask(np.arange(len(y))),
        val_mask=mask(np.arange(len(y), len(y) + 500)),
        test_mask=mask(test_index),
        num_classes=int(C),
        name=_DISPLAY[name],
    )


def _register(name: str) -> None:
    @register_dataset(name, "planetoid", f"Planetoid {name} (ind.{name}.* pickles)",
                      tuple(f"ind.{name}.{s}" for s in PLANETOID_FILES))
    def load(root, normalize_features: bool = True):
        d = load_planetoid(root, name, normalize_features=normalize_features)
        return GraphData(name, d.x, d.y, d.edge_index,
                         {"train": d.train_mask, "val": d.val_mask, "test": d.test_mask},
                         d.num_classes)


for _n in ("cora", "citeseer", "pubmed"):
    _register(_n)

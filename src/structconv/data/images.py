"""Image datasets: scikit-learn's digits (shipped), MNIST and Fashion-MNIST (IDX gz files)."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from .._extras import require
from .registry import DatasetError, ImageData, check_fraction, check_int, register_dataset

__all__ = ["read_idx", "load_digits", "load_idx_images"]

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: str | Path, ndim: int | None = None) -> np.ndarray:
    """Parse a (gzip-compressed) IDX file into an array; ``ndim`` checks the stored rank."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: file not found (expected an IDX file, gzip-compressed)")
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise DatasetError(f"{path}: not a readable gzip stream ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise DatasetError(
            f"{path}: bad IDX magic {raw[:4].hex() or '(empty)'}; expected 0000 then a type "
            f"byte (08 = uint8) and the rank, e.g. 00000803 for images")
    dtype, d = np.dtype(_IDX_TYPES[raw[2]]), raw[3]
    if ndim is not None and d != ndim:
        raise DatasetError(f"{path}: IDX rank {d}, expected {ndim}")
    if len(raw) < 4 + 4 * d:
        raise DatasetError(f"{path}: truncated IDX header ({len(raw)} bytes)")
    dims = struct.unpack(f">{d}I", raw[4:4 + 4 * d])
    need = int(np.prod(dims)) * dtype.itemsize
    body = raw[4 + 4 * d:]
    if len(body) != need:
        raise DatasetError(
            f"{path}: IDX header says {dims} ({need} data bytes) but the file holds "
            f"{len(body)} data bytes ({'truncated' if len(body) < need else 'trailing data'})")
    return np.frombuffer(body, dtype=dtype).reshape(dims)


def _split_val(x, y, val: int, seed: int):
    # a fixed permutation (seeded) so that train/val do not depend on the file order's classes
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(x.shape[0], generator=g)
    return (x[perm[val:]], y[perm[val:]]), (x[perm[:val]], y[perm[:val]])


def _check_limit(limit) -> bool:
    """Whether ``data.options.limit`` asks for a subset (an int >= 1; None: everything)."""
    if limit is None:
        return False
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise DatasetError(f"data.options.limit must be an int >= 1 (or absent), got {limit!r}")
    return True


def load_idx_images(root: Path, name: str, val: int | str = 10000, limit: int | None = None,
                    seed: int = 0, mean: float | None = None, std: float | None = None,
                    sample: int | None = None, test_limit: int | None = None):
    """MNIST-style folder -> ImageData with train/val/test; pixels scaled to [0, 1], normalised.

    ``val``: training images held out for validation, or ``"test"`` (validate on the test
    images: a study that reports test accuracy after each epoch and selects nothing).
    ``sample``: a seeded random subset of that many training images (the first of a
    permutation drawn from ``seed``); ``test_limit``: the first that many test images;
    ``limit``: the first that many of every split."""
    on_test = val == "test"
    if isinstance(val, str) and not on_test:
        raise DatasetError(f'{name}: val must be an int >= 0 (training images held out) or '
                           f'"test", got {val!r}')
    if not on_test:
        check_int(name, "val (training images held out)", val, 0)
    check_int(name, "seed", seed, 0, 2**63 - 1)
    _check_limit(limit)
    for what, v in (("sample", sample), ("test_limit", test_limit)):
        if v is not None:
            check_int(name, what, v, 1)
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        imgs = read_idx(root / f"{prefix}-images-idx3-ubyte.gz", ndim=3)
        labels = read_idx(root / f"{prefix}-labels-idx1-ubyte.gz", ndim=1)
        if imgs.shape[0] != labels.shape[0]:
            raise DatasetError(
                f"{root}: {prefix}-images has {imgs.shape[0]} images but {prefix}-labels has "
                f"{labels.shape[0]} labels")
        # the format's values: labels 0..9 (a signed or float label type could hold -1 or 2.5),
        # pixels finite (a float image type could hold NaN)
        lab = root / f"{prefix}-labels-idx1-ubyte.gz"
        if labels.size and (labels.min() < 0 or labels.max() > 9 or
                            (labels.dtype.kind == "f" and not np.all(labels == np.round(labels)))):
            raise DatasetError(f"{lab}: labels must be integers 0..9, got values in "
                               f"[{labels.min()}, {labels.max()}]")
        if imgs.dtype.kind == "f" and not np.isfinite(imgs).all():
            raise DatasetError(f"{root}/{prefix}-images-idx3-ubyte.gz: NaN or infinite pixels")
        x = torch.from_numpy(imgs.astype(np.float32) / 255.0).unsqueeze(1)
        y = torch.from_numpy(labels.astype(np.int64))
        out[split] = (x, y)
    m = out["train"][0].mean().item() if mean is None else mean
    s = out["train"][0].std().item() if std is None else std
    out = {k: ((x - m) / s, y) for k, (x, y) in out.items()}
    if sample is not None:
        g = torch.Generator().manual_seed(seed)
        idx = torch.randperm(out["train"][0].shape[0], generator=g)[:sample]
        out["train"] = (out["train"][0][idx], out["train"][1][idx])
    if test_limit is not None:
        out["test"] = (out["test"][0][:test_limit], out["test"][1][:test_limit])
    if on_test:
        out["val"] = out["test"]
    elif val:
        if val >= out["train"][0].shape[0]:
            raise ValueError(f"val={val} must be smaller than the {out['train'][0].shape[0]} "
                             "training images")
        out["train"], out["val"] = _split_val(*out["train"], val, seed)
    if _check_limit(limit):
        out = {k: (x[:limit], y[:limit]) for k, (x, y) in out.items()}
    return ImageData(name, {k: out[k] for k in ("train", "val", "test") if k in out}, 10)


#: the four IDX files of an MNIST-style folder
IDX_FILES = tuple(f"{p}-{k}-idx{n}-ubyte.gz" for p in ("train", "t10k")
                  for k, n in (("images", 3), ("labels", 1)))


@register_dataset("mnist", "mnist", "MNIST 28x28 digits (IDX gz files)", IDX_FILES)
def _mnist(root, val=10000, limit=None, seed=0, sample=None, test_limit=None):
    return load_idx_images(root, "mnist", val, limit, seed, 0.1307, 0.3081, sample, test_limit)


@register_dataset("fashion-mnist", "fashion-mnist", "Fashion-MNIST 28x28 (IDX gz files)",
                  IDX_FILES)
def _fashion(root, val=10000, limit=None, seed=0, sample=None, test_limit=None):
    return load_idx_images(root, "fashion-mnist", val, limit, seed, 0.2860, 0.3530, sample,
                           test_limit)


@register_dataset("digits", None, "scikit-learn's 8x8 digits (ships with scikit-learn)")
def load_digits(root=None, val: float = 0.15, test: float = 0.15, seed: int = 0,
                limit: int | None = None) -> ImageData:
    """The 1797 8x8 digits, pixels scaled to [0, 1], split train/val/test by a seeded shuffle."""
    check_fraction("digits", "val", val)
    check_fraction("digits", "test", test)
    check_int("digits", "seed", seed, 0, 2**63 - 1)
    sk_digits = require("sklearn.datasets", "demo", "the digits dataset").load_digits

    d = sk_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    if _check_limit(limit):
        x, y = x[:limit], y[:limit]
    n = x.shape[0]
    n_val, n_test = int(round(val * n)), int(round(test * n))
    if n_val + n_test >= n:
        raise ValueError(f"val={val} + test={test} leave no training images out of {n}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    idx = {"test": perm[:n_test], "val": perm[n_test:n_test + n_val],
           "train": perm[n_test + n_val:]}
    return ImageData("digits", {k: (x[idx[k]], y[idx[k]]) for k in ("train", "val", "test")}, 10)

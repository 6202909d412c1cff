"""Shared by every test folder: the repository's paths, the command line as the tests run it,
real datasets found where the library finds them, and a float64 default dtype."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import structconv as sc
from structconv.data.registry import data_root, data_root_source, dataset_dir, missing_files

ROOT = Path(__file__).resolve().parents[1]  # the repository
SRC = ROOT / "src" / "structconv"

# -- the command line: one torch thread, warnings off, in a subprocess -------------------------
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
CLI = [sys.executable, "-m", "structconv.cli"]


def run_cli(*args, cwd=None, env=None, timeout=None) -> subprocess.CompletedProcess:
    """``structconv ARGS`` in a subprocess; stdout and stderr captured as text."""
    return subprocess.run(CLI + [str(a) for a in args], env=env or ENV, capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


# -- real datasets: the data home ($STRUCTCONV_DATA, else the per-user folder). A test that needs
# one skips, naming what is missing and where, only when its files are truly absent. ----------
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


class TwoSage(torch.nn.Module):
    """Two ``sc.nn.SAGEConv`` layers 4 -> 6 -> 3 with a ReLU between: a small homogeneous
    model for ``to_hetero``."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = sc.nn.SAGEConv(4, 6), sc.nn.SAGEConv(6, 3)

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


def nanogpt_lr(step: int, steps: int, lr: float) -> float:
    """The learning rate the recipes' former loop used at optimizer step ``step`` of
    ``steps``: a linear warm-up, then cosine decay to a tenth of ``lr``."""
    warm, lo = max(1, min(100, steps // 10)), lr / 10
    if step < warm:
        return lr * (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, steps - warm))
    return lo + 0.5 * (1 + math.cos(math.pi * t)) * (lr - lo)


class TinyImages:
    """A stand-in for a small image dataset: what ``build_model`` reads of one (the task, 3
    classes, images (1, 4, 4))."""
    task, num_classes, shape = "image", 3, (1, 4, 4)


@pytest.fixture
def float64():
    """torch's default dtype is float64 for the test, restored after it."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def stop_at(monkeypatch, k: int) -> None:
    """Make the k-th read of the training loop's stop flag find a SIGINT (the loop reads it
    once per step): an interrupt at a known step, in this process."""
    import signal

    from structconv.training.interrupt import StopRequest

    calls = {"n": 0}

    def requested(self):
        calls["n"] += 1
        if calls["n"] == k:
            self.request(signal.SIGINT)
        return self.signum != 0

    monkeypatch.setattr(StopRequest, "requested", property(requested))


def metric_rows(run: Path) -> list[dict]:
    """A run's ``metrics.jsonl`` rows without their timings (what an exact resume repeats)."""
    import json

    return [{k: v for k, v in json.loads(x).items() if k not in ("time_s", "items_per_s")}
            for x in (run / "metrics.jsonl").read_text().splitlines()]


def stop_and_resume(monkeypatch, cfg: dict, folder: Path, k: int) -> tuple[Path, Path, str]:
    """Train ``cfg`` uninterrupted into ``folder/ref``; train it into ``folder/run`` stopped at
    the k-th step (``stop_at``), check it left no result, resume it in this process. Returns
    (ref, run, the interrupt's message)."""
    from structconv.training import TrainingInterrupted, train

    ref, run = folder / "ref", folder / "run"
    train(cfg, ref)
    with monkeypatch.context() as m:
        stop_at(m, k)
        with pytest.raises(TrainingInterrupted) as e:
            train(cfg, run)
    assert not (run / "result.json").exists()
    train(None, run, resume=True)
    return ref, run, str(e.value)


# -- a tiny typed graph in PyG's raw IMDB format (movie / director / actor), for fast tests ----
def tiny_imdb(folder: Path, movies: int = 30, directors: int = 8, actors: int = 20,
              seed: int = 0) -> Path:
    """Write a small IMDB-format graph (``adjM.npz``, ``features_*.npz``, ``labels.npy``,
    ``node_types.npy``, ``train_val_test_idx.npz``) into ``folder/raw``; returns ``folder``.
    Movies of a genre share directors and actors whose features name it, so the genres can
    be learned."""
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    n = movies + directors + actors
    y = np.arange(movies) % 3
    A = np.zeros((n, n), dtype=np.float32)
    for m in range(movies):
        d = movies + (3 * rng.integers(0, directors // 3) + y[m]) % directors
        acts = movies + directors + (3 * rng.integers(0, actors // 3, size=2) + y[m]) % actors
        for j in (d, *acts):
            A[m, j] = A[j, m] = 1
    raw = folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    sp.save_npz(raw / "adjM.npz", sp.csr_matrix(A))
    for i, count in enumerate((movies, directors, actors)):
        x = (rng.random((count, 6)) < 0.4).astype(np.float32)
        if i:  # a director's / actor's genre (its id mod 3) in its first three columns
            x[:, :3] = np.eye(3, dtype=np.float32)[np.arange(count) % 3]
        sp.save_npz(raw / f"features_{i}.npz", sp.csr_matrix(x))
    np.save(raw / "labels.npy", y)
    np.save(raw / "node_types.npy", np.repeat([0, 1, 2], [movies, directors, actors]))
    idx = rng.permutation(movies)
    third = movies // 3
    np.savez(raw / "train_val_test_idx.npz", train_idx=np.sort(idx[:third]),
             val_idx=np.sort(idx[third:2 * third]), test_idx=np.sort(idx[2 * third:]))
    return folder


# -- a tiny MNIST-style folder (IDX gz files of random images), for fast image runs -----------
def tiny_idx_images(folder: Path, train: int = 40, test: int = 12, side: int = 28,
                    seed: int = 0) -> Path:
    """Write ``train`` / ``test`` random side x side uint8 images with labels 0..9 in
    MNIST's four IDX gz files into ``folder``; returns ``folder``."""
    import gzip
    import struct

    import numpy as np

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        for kind, arr in (("images", rng.integers(0, 256, (n, side, side))),
                          ("labels", rng.integers(0, 10, (n,)))):
            head = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
            with gzip.open(folder / f"{prefix}-{kind}-idx{arr.ndim}-ubyte.gz", "wb") as f:
                f.write(head + arr.astype(np.uint8).tobytes())
    return folder

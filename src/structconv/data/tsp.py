"""Random TSP instances (cities uniform in the unit square) and their LKH-3 reference tours.

The registered dataset ``tsp`` (options ``n`` cities, ``val_size`` and ``test_size`` instances,
``lkh_runs``, ``cache`` a folder for the references) is ``TSPData``: fixed validation and test
sets (seeds 4321 and 1234) whose LKH-3 tours (``elkai``, the ``routing`` extra) are computed
when first asked for, in chunks cached under ``cache`` (a killed run keeps the chunks it
finished). Training instances are drawn by the routing task from each epoch's seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from .._extras import require
from ..io import atomic_write_bytes
from .registry import DatasetError, check_int, register_dataset

__all__ = ["TSPData", "uniform_instances", "lkh_tours", "reference", "tour_length",
           "check_tours", "TEST_SEED", "VAL_SEED", "LKH_SCALE"]

TEST_SEED, VAL_SEED = 1234, 4321
#: LKH works on integer distances (EUC_2D rounds): coordinates are scaled by this first
LKH_SCALE = 1e6


def tour_length(coords: Tensor, tours: Tensor) -> Tensor:
    """Length (B,) of each closed tour: coords (B, n, 2), tours (B, n) a permutation each."""
    p = coords.gather(1, tours.unsqueeze(-1).expand(-1, -1, coords.shape[-1]))
    return (p - p.roll(-1, 1)).norm(dim=-1).sum(1)


def check_tours(tours: Tensor, n: int) -> None:
    """ValueError unless every row of ``tours`` (B, n) is a permutation of 0..n-1."""
    if tours.dim() != 2 or tours.shape[1] != n:
        raise ValueError(f"tours must be (B, n={n}), got {tuple(tours.shape)}")
    ok = (tours.sort(1).values == torch.arange(n, device=tours.device)).all(1)
    if not bool(ok.all()):
        bad = int((~ok).nonzero()[0])
        raise ValueError(f"tour {bad} is not a permutation of the {n} cities: "
                         f"{tours[bad].tolist()}")


def uniform_instances(count: int, n: int, seed: int) -> Tensor:
    """(count, n, 2) float64 cities uniform in the unit square, fixed by ``seed``."""
    if count < 1 or n < 3:
        raise ValueError(f"uniform_instances needs count >= 1 and n >= 3, got {count}, {n}")
    return torch.rand(count, n, 2, generator=torch.Generator().manual_seed(seed),
                      dtype=torch.float64)


def lkh_tours(coords: Tensor, runs: int = 10) -> tuple[Tensor, Tensor]:
    """(lengths (B,) float64, tours (B, n) long) of LKH-3's tours (``elkai``) of each
    instance (B, n, 2); the lengths are recomputed from the float coordinates."""
    elkai = require("elkai", "routing", "the LKH reference tours")
    tours = []
    for inst in coords.to(torch.float64).numpy() * LKH_SCALE:
        cities = {i: (float(x), float(y)) for i, (x, y) in enumerate(inst)}
        tour = elkai.Coordinates2D(cities).solve_tsp(runs=runs)
        tours.append(tour[:-1])  # elkai closes the tour on its first city
    t = torch.tensor(tours, dtype=torch.long)
    check_tours(t, coords.shape[1])
    return tour_length(coords.to(torch.float64), t), t


def _save(path: Path, tensors: dict) -> None:
    atomic_write_bytes(path, st_save({k: v.contiguous() for k, v in tensors.items()}))


def _load(path: Path) -> dict:
    return st_load(path.read_bytes())


def reference(which: str, count: int, n: int, seed: int, folder: Path | None, runs: int,
              chunk: int = 500) -> dict:
    """{"coords", "lengths", "tours"} of a fixed instance set and its LKH tours, computed in
    chunks cached under ``folder`` (None: not cached)."""
    coords = uniform_instances(count, n, seed)
    name = f"tsp{n}-{which}-{seed}-{count}"
    full = folder / f"{name}.safetensors" if folder is not None else None
    if full is not None and full.is_file():
        t = _load(full)
        if torch.equal(t["coords"], coords):
            return t
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for i in range(0, count, chunk):
        part = folder / f"{name}.part{i // chunk:04d}.safetensors" if folder else None
        if part is not None and part.is_file():
            parts.append(_load(part))
            continue
        lengths, tours = lkh_tours(coords[i:i + chunk], runs)
        if part is not None:
            _save(part, {"lengths": lengths, "tours": tours})
        parts.append({"lengths": lengths, "tours": tours})
        print(f"  LKH {which}: {min(count, i + chunk)}/{count} instances", flush=True)
    out = {"coords": coords, "lengths": torch.cat([p["lengths"] for p in parts]),
           "tours": torch.cat([p["tours"] for p in parts])}
    if full is not None:
        _save(full, out)
        for p in folder.glob(f"{name}.part*.safetensors"):
            p.unlink()
    return out


@dataclass
class TSPData:
    """Euclidean TSP on ``n`` cities: fixed ``val_size`` / ``test_size`` instance sets and
    their LKH references (``reference(split)``, computed once, cached under ``cache``)."""

    n: int = 20
    val_size: int = 1000
    test_size: int = 10_000
    lkh_runs: int = 10
    cache: Path | None = None
    name: str = "tsp"
    task: str = "routing"

    def __post_init__(self):
        self._refs: dict = {}

    def reference(self, split: str) -> dict:
        """{"coords" (count, n, 2) float64, "lengths" (count,), "tours" (count, n)} of the
        ``val`` or ``test`` instances."""
        if split not in self._refs:
            count, seed = (self.val_size, VAL_SEED) if split == "val" else \
                (self.test_size, TEST_SEED)
            self._refs[split] = reference(split, count, self.n, seed, self.cache, self.lkh_runs)
        return self._refs[split]

    def describe(self) -> str:
        return (f"tsp: {self.n} cities uniform in the unit square, {self.val_size} validation "
                f"and {self.test_size} test instances (LKH-3 references)")


@register_dataset("tsp", None, "random Euclidean TSP instances with LKH-3 reference tours "
                               "(the routing extra), e.g. tsp:n=20")
def _load_tsp(root=None, n: int = 20, val_size: int = 1000, test_size: int = 10_000,
              lkh_runs: int = 10, cache: str = "") -> TSPData:
    n = check_int("tsp", "n", n, 3, 10_000)
    sizes = [check_int("tsp", k, v, 1, 10_000_000)
             for k, v in (("val_size", val_size), ("test_size", test_size))]
    runs = check_int("tsp", "lkh_runs", lkh_runs, 1, 10_000)
    if not isinstance(cache, str):
        raise DatasetError(f"tsp: cache must be a folder's path (a string), got {cache!r}")
    return TSPData(n, *sizes, runs, Path(cache) if cache else None)

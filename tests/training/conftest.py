"""Shared by the training tests: a tiny knowledge graph written as FB15k-237-style files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def _tiny_kg(groups=8, size=5, R=3, seed=0):
    """Relation r links every entity of group g to every entity of group g XOR (r + 1):
    learnable (symmetric, so DistMult can express it); shuffled, 80 / 10 / 10 split."""
    ent = torch.arange(groups * size)
    g = ent // size
    rows = [(a, r, b) for r in range(R) for a in ent.tolist()
            for b in ent[g == (g[a] ^ (r + 1))].tolist()]
    t = torch.tensor(rows)[torch.randperm(len(rows),
                                          generator=torch.Generator().manual_seed(seed))]
    n, m = int(0.8 * len(rows)), int(0.9 * len(rows))
    return t[:n], t[n:m], t[m:]


@pytest.fixture(scope="module")
def kg(tmp_path_factory) -> Path:
    """The tiny graph as FB15k-237-style files (entity names e<id>, relations p, q, r)."""
    folder = tmp_path_factory.mktemp("kg") / "tiny"
    folder.mkdir()
    for split, rows in zip(("train", "valid", "test"), _tiny_kg()):
        (folder / f"{split}.txt").write_text(
            "".join(f"e{h}\t{'pqr'[r]}\te{t}\n" for h, r, t in rows.tolist()))
    return folder

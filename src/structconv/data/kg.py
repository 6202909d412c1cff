"""Knowledge-graph triples (FB15k-237, WN18RR): ``train/valid/test.txt``, ``head<TAB>rel<TAB>tail``.

Entities and relations keep their names as strings (WN18RR's synset offsets have leading zeros)
and get ids in order of first appearance over train, then valid, then test, so entities seen in
training come first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..basis.sorts import inverse_name
from .registry import register_dataset

__all__ = ["KGData", "load_kg", "KG_SPLITS"]

KG_SPLITS = ("train", "valid", "test")


@dataclass
class KGData:
    """Triples as (T, 3) long tensors of ids ``[head, relation, tail]`` per split."""

    name: str
    entities: list[str]
    relations: list[str]
    train: Tensor
    valid: Tensor
    test: Tensor

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    def split(self, name: str) -> Tensor:
        if name not in KG_SPLITS:
            raise ValueError(f"unknown split {name!r}: choose one of {KG_SPLITS}")
        return getattr(self, name)

    @property
    def relation_names(self) -> list[str]:
        """Names of the ``2R`` relation ids of queries and encoder graphs: the data's ``R``
        relations, then their inverses ``r + R`` named ``name^-1``."""
        return list(self.relations) + [inverse_name(r) for r in self.relations]

    def graph(self, split: str = "train") -> tuple[Tensor, Tensor]:
        """The triples of ``split`` as a graph with inverse edges: ``edge_index`` (2, 2T),
        ``edge_type`` (2T,) with ``r + R`` for the reversed edge of ``r``."""
        t = self.split(split)
        h, r, tl = t[:, 0], t[:, 1], t[:, 2]
        return (torch.stack([torch.cat([h, tl]), torch.cat([tl, h])]),
                torch.cat([r, r + self.num_relations]))

    def edge_index(self, split: str = "train") -> tuple[Tensor, Tensor]:
        """``edge_index`` (2, T) [head; tail] and ``edge_type`` (T,) of one split (PyG style)."""
        t = self.split(split)
        return t[:, [0, 2]].t().contiguous(), t[:, 1].contiguous()

    def __repr__(self) -> str:
        return (f"KGData(name={self.name!r}, entities={self.num_entities}, "
                f"relations={self.num_relations}, train/valid/test="
                f"{len(self.train)}/{len(self.valid)}/{len(self.test)})")


def _find_dir(root: Path, name: str) -> Path:
    for d in (root, root / name, root / "kg" / name):
        if (d / "train.txt").is_file():
            return d
    return root


def load_kg(root: str | os.PathLike, name: str | None = None) -> KGData:
    """Triples from ``root`` (or ``root/<name>``, ``root/kg/<name>``) with train/valid/test.txt."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"knowledge-graph folder {root} does not exist")
    d = _find_dir(root, name) if name else root
    name = name or d.name
    paths = {s: d / f"{s}.txt" for s in KG_SPLITS}
    missing = [p.name for p in paths.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{name} cannot be loaded from {d}: missing file(s) "
                                f"{', '.join(missing)}")
    ent: dict[str, int] = {}
    rel: dict[str, int] = {}
    out = {}
    for s, path in paths.items():
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e}); expected head<TAB>relation<TAB>"
                             "tail lines") from None
        rows = []
        for ln, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 3 or not all(p.strip() for p in parts):
                raise ValueError(f"{path}: line {ln} is {line[:80]!r}; expected "
                                 "head<TAB>relation<TAB>tail")
            h, r, t = (p.strip() for p in parts)
            rows.append((ent.setdefault(h, len(ent)), rel.setdefault(r, len(rel)),
                         ent.setdefault(t, len(ent))))
        if not rows:
            raise ValueError(f"{path}: no triples; expected head<TAB>relation<TAB>tail lines")
        out[s] = torch.tensor(rows, dtype=torch.long)
    return KGData(name=name, entities=list(ent), relations=list(rel), **out)


def _register(name: str) -> None:
    @register_dataset(name.lower(), f"kg/{name}",
                      f"{name} knowledge-graph triples (link prediction)")
    def load(root):
        d = load_kg(root, name)
        d.task = "link"  # link prediction: loaded here, trained by recipes, not by ``train``
        return d


for _n in ("FB15k-237", "WN18RR"):
    _register(_n)

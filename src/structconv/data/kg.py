"""Knowledge-graph triples (FB15k-237, WN18RR): ``train/valid/test.txt``, ``head<TAB>rel<TAB>tail``.

Entities and relations keep their names as strings (WN18RR's synset offsets have leading zeros)
and get ids in order of first appearance over train, then valid, then test, so entities seen in
training come first. Files are UTF-8 (a BOM is not part of the first name), lines end at "\n"
only, a repeated triple counts once per split, and a data relation may not be named like the
generated inverse of another (``r^-1`` beside ``r``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..basis.sorts import INVERSE, inverse_name
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


#: the blanks around a field: ASCII only (a Unicode space or separator belongs to the name)
_BLANKS = " \t\r\x0b\x0c"


def _lines(path: Path):
    """(line number, text) of a triples file: UTF-8 with or without a BOM, lines ended by
    "\n" (or "\r\n") only: U+2028, U+0085 and the other separators ``str.splitlines``
    breaks on are characters of a name, so line numbers match an editor's."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); expected "
                         "head<TAB>relation<TAB>tail lines") from None
    for ln, line in enumerate(text.split("\n"), 1):
        if line.strip(_BLANKS):
            yield ln, line.removesuffix("\r")


def _read_split(path: Path, ent: dict, rel: dict, first: dict) -> Tensor:
    """The distinct triples of one file as (T, 3) ids, in order of first appearance; new
    names get the next ids in ``ent`` / ``rel``; ``first[relation] = (path, line)``."""
    rows: dict[tuple[int, int, int], None] = {}  # an ordered set: a repeated line counts once
    for ln, line in _lines(path):
        parts = [p.strip(_BLANKS) for p in line.split("\t")]
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"{path}: line {ln} is {line[:80]!r}; expected "
                             "head<TAB>relation<TAB>tail")
        h, r, t = parts
        if r not in rel:
            rel[r], first[r] = len(rel), (path, ln)
        rows.setdefault((ent.setdefault(h, len(ent)), rel[r], ent.setdefault(t, len(ent))))
    if not rows:
        raise ValueError(f"{path}: no triples; expected head<TAB>relation<TAB>tail lines")
    return torch.tensor(list(rows), dtype=torch.long)


def _check_inverse_names(first: dict) -> None:
    """Refuse a relation whose name is the one the loader gives another's inverse (``r`` and
    ``r^-1`` both in the data): queries, sorts and mined paths name relations by these names,
    so two relations under one name would be confused."""
    for r, (path, ln) in first.items():
        inv = inverse_name(r)
        if r.endswith(INVERSE) and inv in first:
            p2, ln2 = first[inv]
            raise ValueError(
                f"{path}: line {ln}: relation {r!r} is also the name structconv gives the "
                f"inverse of relation {inv!r} ({p2.name} line {ln2}); rename one of them "
                f"(inverse relations are named r{INVERSE})")


def load_kg(root: str | os.PathLike, name: str | None = None) -> KGData:
    """Triples from ``root`` (or ``root/<name>``, ``root/kg/<name>``) with train/valid/test.txt.

    Each line is ``head<TAB>relation<TAB>tail`` (UTF-8, a BOM allowed, "\n" or "\r\n" line
    ends, blank lines skipped). A triple listed twice in a split counts once (deduplicated here,
    at the source, so that every consumer, sort mining and encoders alike, sees one edge). A
    relation named like the generated inverse of another (``r^-1`` beside ``r``) is refused.
    """
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
    first: dict[str, tuple[Path, int]] = {}
    out = {s: _read_split(path, ent, rel, first) for s, path in paths.items()}
    _check_inverse_names(first)
    return KGData(name=name, entities=list(ent), relations=list(rel), **out)


def _register(name: str) -> None:
    @register_dataset(name.lower(), f"kg/{name}",
                      f"{name} knowledge-graph triples (link prediction)",
                      tuple(f"{s}.txt" for s in KG_SPLITS))
    def load(root):
        d = load_kg(root, name)
        d.task = "link"  # link prediction: loaded here, trained by recipes, not by ``train``
        return d


for _n in ("FB15k-237", "WN18RR"):
    _register(_n)

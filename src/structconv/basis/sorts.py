"""Random-walk sorts by name: a sort is a sequence of relations, written as ids or names.

A relational basis has one matrix per *sort* ``(r1, ..., rL)``: the walk along ``r1``, then
``r2``, ... (the paper's ``played.characterIn.genre``). Users write sorts as relation ids, as
tuples of relation names, or as one dotted string when no name contains a dot. Inverse
relations are separate relation types; loaders name the inverse of ``r`` ``r + INVERSE``.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

__all__ = ["INVERSE", "inverse_name", "parse_sort", "parse_sorts", "sort_name"]

INVERSE = "^-1"
"""The suffix naming an inverse relation (``"affiliation^-1"``)."""


def inverse_name(name: str) -> str:
    """The name of the inverse of relation ``name`` (the inverse of an inverse is the relation)."""
    return name[:-len(INVERSE)] if name.endswith(INVERSE) else name + INVERSE


def _closest(name: str, relations: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(relations), n=3, cutoff=0.5)
    if not close:  # long IRIs: fall back on names sharing the last path segment
        tail = name.rstrip("/").rsplit("/", 1)[-1].lower()
        close = [r for r in relations if tail and tail in r.lower()][:3]
    return (f"; closest: {', '.join(repr(c) for c in close)}" if close
            else f"; known: {', '.join(repr(r) for r in list(relations)[:8])}"
            + (", ..." if len(relations) > 8 else ""))


def _relation_id(r, relations: Sequence[str] | None, index: dict[str, int] | None,
                 num_relations: int, sort) -> int:
    if isinstance(r, bool):
        raise ValueError(f"sort {sort!r}: a relation must be an id or a name, got {r!r}")
    if isinstance(r, int) or (hasattr(r, "__index__") and not isinstance(r, str)):
        r = int(r)
        if not 0 <= r < num_relations:
            raise ValueError(f"sort {sort!r}: relation id {r} is out of range "
                             f"[0, {num_relations - 1}]")
        return r
    if isinstance(r, str):
        if index is None:
            raise ValueError(f"sort {sort!r} names relation {r!r}, but no relation names were "
                             "given (pass relations=[names])")
        if r not in index:
            raise ValueError(f"sort {sort!r}: unknown relation {r!r}{_closest(r, relations)}")
        return index[r]
    raise ValueError(f"sort {sort!r}: a relation must be an id or a name, got "
                     f"{type(r).__name__}")


def parse_sort(sort, relations: Sequence[str] | None, num_relations: int,
               index: dict[str, int] | None = None) -> tuple[int, ...]:
    """One sort as a tuple of relation ids, from an id, a tuple of ids or names, or a dotted
    string (``"played.characterIn.genre"``, only where no relation name contains a dot)."""
    if relations is not None and index is None:
        index = {n: i for i, n in enumerate(relations)}
    if isinstance(sort, str):
        if index is not None and sort in index:
            parts: Sequence = (sort,)
        elif relations is not None and any("." in n for n in relations):
            raise ValueError(f"sort {sort!r}: relation names contain dots, so a sort cannot be "
                             "one dotted string; give a tuple of names" + _closest(sort, relations))
        else:
            parts = sort.split(".")
    elif isinstance(sort, (list, tuple)):
        parts = sort
    else:
        parts = (sort,)
    if not parts:
        raise ValueError("each sort must be a non-empty sequence of relations, got an empty one")
    return tuple(_relation_id(r, relations, index, num_relations, sort) for r in parts)


def parse_sorts(sorts, relations: Sequence[str] | None, num_relations: int) -> list[tuple]:
    """Every sort of ``sorts`` as tuples of relation ids (see ``parse_sort``)."""
    if relations is not None:
        relations = [str(n) for n in relations]
        if len(relations) != num_relations:
            raise ValueError(f"relations names {len(relations)} relations, the graph has "
                             f"{num_relations}")
        if len(set(relations)) != len(relations):
            dup = sorted({n for n in relations if relations.count(n) > 1})
            raise ValueError(f"relation names must be unique, repeated: {dup[:5]}")
    index = None if relations is None else {n: i for i, n in enumerate(relations)}
    if isinstance(sorts, str):
        sorts = [sorts]
    return [parse_sort(s, relations, num_relations, index) for s in sorts]


def sort_name(sort: Sequence[int], relations: Sequence[str] | None) -> str:
    """A sort written with names (dotted, or ``" . "``-joined where names hold dots)."""
    if relations is None:
        return ".".join(str(r) for r in sort)
    names = [relations[r] for r in sort]
    return (" . " if any("." in n for n in names) else ".").join(names)

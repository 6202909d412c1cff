"""AIFB and MUTAG typed by ``rdf:type``: the R-GCN entity-classification graphs as typed graphs.

A second view of the data ``load_entities`` reads (``"aifb"``, ``"mutag"``): the same nodes,
edges and split, with node types taken from the graph's own ``rdf:type`` triples. Each node's
type is the class its ``rdf:type`` triples name; a node with several takes the one that types
the most nodes of the graph (ties: the smaller IRI); a literal has type ``"literal"``; an IRI or
blank node with no ``rdf:type`` triple has type ``"untyped"``. A type is named by its class's
local name (``swrc#Person`` -> ``Person``; the whole IRI, dots as ``_``, where two classes share
one). Every homogeneous edge ``u -> v`` of edge type ``r`` (inverses included, named ``r^-1``;
the ``rdf:type`` edges too) becomes an edge of type ``(type(u), r, type(v))`` between the two
types' rows, a node's row within its type being its rank among that type's node ids: no edge is
lost or added. The graph is featureless (a typed model reads a constant 1 per node); the
labelled entities keep their labels and train / val / test masks (the homogeneous loader's
``val``/``seed`` split). The node types are cached beside the parse (keyed by the sha256 of the
N-Triples file).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import torch
from torch import Tensor

from ..io import atomic_write_json
from .hetero import HeteroGraph
from .registry import DatasetError, GraphData, load_dataset, register_dataset
from .rgcn import default_cache_dir, entities_dir, entity_nodes, local_name, read_triples

__all__ = ["rdf_node_types", "typed_view", "RDF_TYPE", "UNTYPED", "LITERAL"]

#: the predicate whose objects type the nodes
RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
#: the type of an IRI or blank node with no ``rdf:type`` triple
UNTYPED = "untyped"
#: the type of a literal
LITERAL = "literal"
_VERSION = 1


def _classes(triples) -> tuple[dict, Counter]:
    """{subject: the classes its rdf:type triples name} and how many subjects each class types."""
    of: dict = {}
    for s, p, o in triples:
        if str(p) == RDF_TYPE:
            of.setdefault(s, set()).add(o)
    return of, Counter(c for cs in of.values() for c in cs)


def _names(classes: list) -> dict:
    """A dot-free type name for each class: its local name, or its whole IRI (dots as ``_``)
    where two classes share a local name or one is named like ``untyped`` / ``literal``."""
    short = {c: local_name(str(c)) for c in classes}
    seen = Counter(short.values())
    return {c: n if seen[n] == 1 and n not in (UNTYPED, LITERAL) else str(c).replace(".", "_")
            for c, n in short.items()}


def _types_of(triples) -> tuple[list[int], list[str]]:
    """(type id of each node in ``entity_nodes`` order, type names by decreasing count, ties
    by name)."""
    from rdflib.term import Literal

    of, freq = _classes(triples)
    chosen = []
    for t in entity_nodes(triples):
        if isinstance(t, Literal):
            chosen.append(LITERAL)
        elif t in of:
            chosen.append(min(of[t], key=lambda c: (-freq[c], str(c))))
        else:
            chosen.append(UNTYPED)
    names = _names(sorted({c for c in chosen if c not in (LITERAL, UNTYPED)}, key=str))
    labels = [names.get(c, c) for c in chosen]
    count = Counter(labels)
    order = sorted(count, key=lambda n: (-count[n], n))
    index = {n: i for i, n in enumerate(order)}
    return [index[n] for n in labels], order


def rdf_node_types(root, name: str, cache: str | None = None) -> tuple[Tensor, list[str]]:
    """(node_type (N,) long, type names) of R-GCN dataset ``name`` in ``root``, its nodes in
    ``load_entities``' order (module doc for the rule); cached in ``cache`` (default the data
    cache's ``entities/``)."""
    nt = entities_dir(root, name) / f"{name}_stripped.nt.gz"
    if not nt.is_file():
        raise DatasetError(f"{name}-typed: {nt} is missing (the R-GCN N-Triples file)")
    key = hashlib.sha256(nt.read_bytes()).hexdigest()
    path = Path(cache) if cache is not None else default_cache_dir() / "entities"
    path = path / f"{name}-types-{key[:16]}.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        if meta.get("sha256") == key and meta.get("version") == _VERSION:
            return torch.tensor(meta["node_type"], dtype=torch.long), list(meta["types"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no cache, or a damaged one: parsed again
    ids, names = _types_of(read_triples(nt))
    try:
        atomic_write_json(path, {"version": _VERSION, "sha256": key, "types": names,
                                 "node_type": ids})
    except OSError:
        pass  # a read-only cache folder only costs the parse next time
    return torch.tensor(ids, dtype=torch.long), names


def _rows(node_type: Tensor, T: int) -> tuple[Tensor, list[Tensor]]:
    """(each node's row within its type (N,), the node ids of each type in row order)."""
    local = torch.empty_like(node_type)
    ids = []
    for t in range(T):
        i = torch.nonzero(node_type == t).flatten()
        local[i] = torch.arange(i.numel())
        ids.append(i)
    return local, ids


def typed_view(data: GraphData, node_type: Tensor, types: list[str],
               name: str | None = None) -> HeteroGraph:
    """The ``HeteroGraph`` of a relational ``GraphData`` (``edge_type``, ``relations`` names)
    whose node n has type ``types[node_type[n]]``: edge u -> v of relation r becomes an edge
    of type ``(type(u), r, type(v))``; labels and masks go to the types of labelled nodes."""
    T, N = len(types), data.num_nodes
    if node_type.shape != (N,) or (N and not 0 <= int(node_type.min()) <= int(node_type.max()) < T):
        raise ValueError(f"typed_view: node_type must be ({N},) ids in [0, {T - 1}], got "
                         f"{tuple(node_type.shape)}")
    if data.edge_type is None or data.relations is None:
        raise ValueError(f"typed_view: {data.name} has no edge types or relation names")
    local, ids = _rows(node_type, T)
    src, dst = data.edge_index
    key = (data.edge_type.long() * T + node_type[src]) * T + node_type[dst]
    order = torch.argsort(key, stable=True)
    kinds, counts = torch.unique_consecutive(key[order], return_counts=True)
    edges = {}
    for k, part in zip(kinds.tolist(), torch.split(order, counts.tolist())):
        et = (types[k // T % T], data.relations[k // (T * T)], types[k % T])
        edges[et] = torch.stack([local[src[part]], local[dst[part]]])
    labelled = torch.zeros(N, dtype=torch.bool)
    for m in data.masks.values():
        labelled |= m
    y, masks = {}, {}
    for t in torch.unique(node_type[labelled]).tolist():
        y[types[t]] = data.y[ids[t]]
        masks[types[t]] = {k: m[ids[t]] for k, m in data.masks.items()}
    return HeteroGraph({t: int(i.numel()) for t, i in zip(types, ids)}, edges, y=y,
                       masks=masks, name=name or f"{data.name}-typed")


def _register(name: str) -> None:
    @register_dataset(f"{name}-typed", f"rgcn/{name}",
                      f"R-GCN {name} as a typed graph: node types from rdf:type (N-Triples)",
                      (f"{name}_stripped.nt.gz", "trainingSet.tsv", "testSet.tsv"))
    def load(root, val: float = 0.2, seed: int = 0, cache: str | None = None):
        # the homogeneous view (same nodes, edges, split), then each node's rdf:type
        data = load_dataset(name, root, val=val, seed=seed, cache=cache)
        node_type, types = rdf_node_types(root, name, cache)
        if node_type.numel() != data.num_nodes:
            raise DatasetError(f"{name}-typed: the N-Triples file has {node_type.numel()} nodes "
                               f"but {name}'s parse has {data.num_nodes}: stale cache {cache}?")
        return typed_view(data, node_type, types)


for _n in ("aifb", "mutag"):
    _register(_n)

"""R-GCN entity-classification sets (AIFB, MUTAG, and BGS / AM when their files are present).

The graph is an N-Triples file (``<name>_stripped.nt.gz``) parsed with rdflib; labels come from
``trainingSet.tsv`` / ``testSet.tsv`` (columns chosen by header name). Preprocessing follows PyG's
``Entities``: every subject and object (literals included) is a node, relation ``r`` gives edges of
type ``2r`` (subject -> object) and ``2r+1`` (object -> subject). Unlike PyG, nodes are ordered
deterministically (by their N-Triples form) and a literal whose text equals an IRI stays a separate
node. Parsed tensors are cached as safetensors + JSON keyed by the sources' sha256.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import hashlib
import io
import json
import os
import re
import tempfile
import zlib
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor

from .._extras import require
from .._paths import user_cache_dir
from ..basis.sorts import inverse_name
from ..io import atomic_write_bytes, atomic_write_json
from .registry import GraphData, register_dataset

__all__ = ["EntitiesData", "load_entities", "ENTITIES_COLUMNS", "default_cache_dir",
           "edge_type_names", "local_name", "read_triples", "entity_nodes", "entities_dir"]

#: dataset -> (entity column, label column) of the TSV files, as named in their headers
ENTITIES_COLUMNS = {
    "aifb": ("person", "label_affiliation"),
    "mutag": ("bond", "label_mutagenic"),
    "bgs": ("rock", "label_lithogenesis"),
    "am": ("proxy", "label_cateogory"),  # sic: the AM files spell it this way
}
_CACHE_VERSION = 1


def local_name(iri: str) -> str:
    """The readable end of an IRI: after its last ``#`` or ``/`` (``.../swrc#author`` ->
    ``author``), dots replaced by ``_`` so that sorts can be written as dotted strings."""
    tail = re.split(r"[#/]", iri.rstrip("/#"))[-1] or iri
    return tail.replace(".", "_")


def edge_type_names(relations: list[str]) -> list[str]:
    """Names of edge types ``2r`` (relation r) and ``2r+1`` (its inverse, ``name^-1``)."""
    short = [local_name(r) for r in relations]
    seen = Counter(short)
    names = [s if seen[s] == 1 else r.replace(".", "_") for s, r in zip(short, relations)]
    return [n for name in names for n in (name, inverse_name(name))]


@dataclass
class EntitiesData:
    """A relational graph with labelled entities: ``edge_index`` (2, E), ``edge_type`` (E,).

    ``train_idx``/``test_idx`` are node ids with labels ``train_y``/``test_y``; relation ``r`` of
    ``relations`` has edge types ``2r`` (forward) and ``2r+1`` (inverse).
    """

    name: str
    num_nodes: int
    edge_index: Tensor
    edge_type: Tensor
    train_idx: Tensor
    train_y: Tensor
    test_idx: Tensor
    test_y: Tensor
    relations: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)

    @property
    def relation_names(self) -> list[str]:
        """Names of the ``2 * len(relations)`` edge types: the IRI's local name (the whole IRI
        where two share one) for ``2r``, the same with ``^-1`` for the inverse ``2r+1``."""
        return edge_type_names(self.relations)

    @property
    def num_relations(self) -> int:
        """Edge types, inverses included (``2 * len(relations)``)."""
        return 2 * len(self.relations)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    def to(self, device) -> EntitiesData:
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        return EntitiesData(**{k: v.to(device) if isinstance(v, Tensor) else v
                               for k, v in kw.items()})

    def __repr__(self) -> str:
        return (f"EntitiesData(name={self.name!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"relations={self.num_relations}, classes={self.num_classes}, "
                f"train/test={len(self.train_idx)}/{len(self.test_idx)})")


def default_cache_dir() -> Path:
    """``$STRUCTCONV_CACHE`` or ``$XDG_CACHE_HOME/structconv`` (``~/.cache/structconv``; the
    system's temp folder where there is no home folder)."""
    env = os.environ.get("STRUCTCONV_CACHE")
    if env:
        return Path(env)
    return user_cache_dir() or Path(tempfile.gettempdir()) / "structconv"


def _find_dir(root: Path, name: str) -> Path:
    for d in (root, root / name, root / "rgcn" / name, root / name / "raw"):
        if (d / f"{name}_stripped.nt.gz").exists() or (d / "trainingSet.tsv").exists():
            return d
    return root


class _Sink:
    """Collects the distinct triples in file order."""

    def __init__(self):
        self.triples: dict = {}

    def triple(self, s, p, o):
        self.triples.setdefault((s, p, o), None)


def _parse_nt(path: Path):
    nt = require("rdflib.plugins.parsers.ntriples", "graph", "loading R-GCN N-Triples")
    ParseError, W3CNTriplesParser = nt.ParseError, nt.W3CNTriplesParser

    sink = _Sink()
    parser = W3CNTriplesParser(sink)
    try:
        with gzip.open(path, "rb") as f:
            # skolemized blank nodes keep their label: rdflib would otherwise draw random ids
            parser.parse(codecs.getreader("utf-8")(f), skolemize=True)
    except ParseError as e:
        raise ValueError(f"{path}: not valid N-Triples ({e}); expected one "
                         "'<subject> <predicate> <object> .' per line") from None
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: corrupt or truncated gzip stream ({type(e).__name__}: {e}); "
                         "expected gzip-compressed UTF-8 N-Triples") from None
    if not sink.triples:
        raise ValueError(f"{path}: no triples; expected gzip-compressed N-Triples")
    return list(sink.triples)


def read_triples(path: str | os.PathLike) -> list:
    """The distinct triples (rdflib terms) of a gzipped N-Triples file, in file order."""
    return _parse_nt(Path(path))


def entity_nodes(triples) -> list:
    """The nodes of a triple list in id order: every subject and object (literals included),
    ordered by their N-Triples form (the node ids of ``load_entities``)."""
    return sorted({t for s, _, o in triples for t in (s, o)}, key=lambda t: t.n3())


def entities_dir(root: str | os.PathLike, name: str) -> Path:
    """The folder of ``root`` (or below it) holding dataset ``name``'s files."""
    return _find_dir(Path(root), name)


def _norm_label(s: str) -> str:
    # MUTAG writes 1 in completeDataset.tsv but 1.0 in the splits: compare numbers as numbers
    try:
        f = float(s)
    except ValueError:
        return s
    return str(int(f)) if f.is_integer() else s


def _read_tsv(path: Path, name: str) -> list[tuple[str, str, int]]:
    """(entity, label, line number) rows of a split file, columns chosen by header name."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e}); expected a tab-separated table") from None
    rows = list(csv.reader(io.StringIO(text, newline=""), delimiter="\t"))
    if not rows:
        raise ValueError(f"{path}: empty; expected a tab-separated table with a header row")
    header = [h.strip() for h in rows[0]]
    if name in ENTITIES_COLUMNS:
        ent_col, lab_col = ENTITIES_COLUMNS[name]
    else:
        labs = [h for h in header if h.startswith("label_")]
        ents = [h for h in header if h != "id" and not h.startswith("label_")]
        ent_col, lab_col = (ents[0] if ents else "?"), (labs[0] if labs else "label_*")
    missing = [c for c in (ent_col, lab_col) if c not in header]
    if missing:
        raise ValueError(f"{path}: header {header} lacks column(s) {missing}; expected the "
                         f"entity column {ent_col!r} and the label column {lab_col!r}")
    ie, il = header.index(ent_col), header.index(lab_col)
    out = []
    for ln, row in enumerate(rows[1:], 2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) <= max(ie, il):
            raise ValueError(f"{path}: line {ln} has {len(row)} fields; expected "
                             f"{len(header)} as in the header {header}")
        out.append((row[ie].strip(), _norm_label(row[il].strip()), ln))
    if not out:
        raise ValueError(f"{path}: no data rows after the header")
    return out


def _label_order(labels) -> list[str]:
    labels = set(labels)
    try:
        return sorted(labels, key=float)
    except ValueError:
        return sorted(labels)


def _sha256(paths) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _build(d: Path, name: str, nt: Path, train_tsv: Path, test_tsv: Path):
    URIRef = require("rdflib.term", "graph", "loading R-GCN N-Triples").URIRef

    # the small split files first: a bad header fails before the slow graph parse
    splits = {"train": _read_tsv(train_tsv, name), "test": _read_tsv(test_tsv, name)}
    triples = _parse_nt(nt)
    freq = Counter(p for _, p, _ in triples)
    # most frequent relation first (as PyG), ties by IRI so the order is reproducible
    relations = sorted(freq, key=lambda p: (-freq[p], str(p)))
    rel_id = {p: i for i, p in enumerate(relations)}
    nodes = entity_nodes(triples)
    node_id = {t: i for i, t in enumerate(nodes)}
    src = torch.tensor([node_id[s] for s, _, _ in triples], dtype=torch.long)
    dst = torch.tensor([node_id[o] for _, _, o in triples], dtype=torch.long)
    typ = torch.tensor([rel_id[p] for _, p, _ in triples], dtype=torch.long)
    N, R = len(nodes), 2 * len(relations)
    ei = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    et = torch.cat([2 * typ, 2 * typ + 1])
    perm = torch.argsort((ei[0] * N + ei[1]) * R + et)
    ei, et = ei[:, perm], et[perm]

    classes = _label_order(lab for rows in splits.values() for _, lab, _ in rows)
    cls_id = {c: i for i, c in enumerate(classes)}
    out = {"edge_index": ei.contiguous(), "edge_type": et.contiguous()}
    for split, path in (("train", train_tsv), ("test", test_tsv)):
        idx = []
        for ent, _, ln in splits[split]:
            t = URIRef(ent)
            if t not in node_id:
                raise ValueError(f"{path}: line {ln} names entity {ent!r}, which is not a node "
                                 f"of {nt.name}")
            idx.append(node_id[t])
        out[f"{split}_idx"] = torch.tensor(idx, dtype=torch.long)
        out[f"{split}_y"] = torch.tensor([cls_id[lab] for _, lab, _ in splits[split]],
                                         dtype=torch.long)
    meta = {"version": _CACHE_VERSION, "name": name, "num_nodes": N,
            "relations": [str(p) for p in relations], "classes": classes}
    return out, meta


_TENSORS = ("edge_index", "edge_type", "train_idx", "train_y", "test_idx", "test_y")


def _load_cache(st: Path, js: Path, key: str):
    from safetensors.torch import load

    try:
        meta = json.loads(js.read_text(encoding="utf-8"))
        if meta.get("sha256") != key or meta.get("version") != _CACHE_VERSION:
            return None
        tensors = load(st.read_bytes())
        if set(tensors) != set(_TENSORS):
            return None
        return tensors, meta
    except Exception:  # a damaged cache is rebuilt from the sources, never trusted
        return None


def load_entities(root: str | os.PathLike, name: str, *, cache_dir: str | os.PathLike | None = None,
                  use_cache: bool = True) -> EntitiesData:
    """AIFB / MUTAG (or BGS / AM) from ``root`` holding ``<name>_stripped.nt.gz`` and the TSVs.

    Returns ``EntitiesData``. The parse is cached in ``cache_dir`` (default
    ``default_cache_dir()/entities``), keyed by the sha256 of the four source files.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"dataset name must be a non-empty string, got {name!r}")
    name = name.lower()
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"entities folder {root} does not exist")
    d = _find_dir(root, name)
    nt = d / f"{name}_stripped.nt.gz"
    train_tsv, test_tsv = d / "trainingSet.tsv", d / "testSet.tsv"
    missing = [p.name for p in (nt, train_tsv, test_tsv) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{name} cannot be loaded from {d}: missing file(s) "
                                f"{', '.join(missing)}")
    key = _sha256([nt, train_tsv, test_tsv])
    result = None
    if use_cache:
        cdir = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "entities"
        st, js = cdir / f"{name}-{key[:16]}.safetensors", cdir / f"{name}-{key[:16]}.json"
        result = _load_cache(st, js, key)
    if result is None:
        tensors, meta = _build(d, name, nt, train_tsv, test_tsv)
        meta["sha256"] = key
        if use_cache:
            from safetensors.torch import save

            try:
                atomic_write_bytes(st, save(tensors))
                atomic_write_json(js, meta)  # written last: it validates the tensors file
            except OSError:
                pass  # a read-only cache folder only costs the parse next time
        result = tensors, meta
    tensors, meta = result
    return EntitiesData(name=meta["name"], num_nodes=int(meta["num_nodes"]),
                        relations=list(meta["relations"]), classes=list(meta["classes"]),
                        **{k: tensors[k] for k in _TENSORS})


def _register(name: str) -> None:
    @register_dataset(name, f"rgcn/{name}", f"R-GCN entity classification {name} (N-Triples)",
                      (f"{name}_stripped.nt.gz", "trainingSet.tsv", "testSet.tsv"))
    def load(root, val: float = 0.2, seed: int = 0, cache: str | None = None):
        # cache: the parse cache's folder (default: the data cache's entities/)
        d = load_entities(root, name, cache_dir=cache)
        n = d.num_nodes
        y = torch.zeros(n, dtype=torch.int64)
        y[d.train_idx], y[d.test_idx] = d.train_y, d.test_y
        # R-GCN tunes on a validation set of 20 % of the training entities
        perm = d.train_idx[torch.randperm(d.train_idx.numel(),
                                          generator=torch.Generator().manual_seed(seed))]
        n_val = int(round(val * perm.numel()))
        masks = {k: torch.zeros(n, dtype=torch.bool) for k in ("train", "val", "test")}
        masks["val"][perm[:n_val]] = True
        masks["train"][perm[n_val:]] = True
        masks["test"][d.test_idx] = True
        return GraphData(name, None, y, d.edge_index, masks, d.num_classes, d.edge_type,
                         d.num_relations, relations=d.relation_names)


for _n in ("aifb", "mutag"):
    _register(_n)

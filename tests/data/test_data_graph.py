"""Graph dataset loaders on the real files: Planetoid, R-GCN entities (AIFB, MUTAG), KG triples."""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from structconv.data.kg import load_kg
from structconv.data.planetoid import PLANETOID_FILES, load_planetoid
from structconv.data.registry import dataset_dir, missing_files
from structconv.data.rgcn import load_entities
from tests.conftest import need, needs

#: the data home's Planetoid folder (the library's: $STRUCTCONV_DATA, else the per-user one)
PLANETOID = dataset_dir("cora")


@pytest.fixture(scope="module")
def entities_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("entities-cache")


def _copy_planetoid(tmp_path: Path, name: str = "cora") -> Path:
    d = tmp_path / "planetoid"
    d.mkdir()
    for s in PLANETOID_FILES:
        shutil.copy(PLANETOID / f"ind.{name}.{s}", d / f"ind.{name}.{s}")
    return d


# ---------------------------------------------------------------------------------- Planetoid
@pytest.mark.parametrize("name,N,E,F,C,n_train", [
    ("cora", 2708, 10556, 1433, 7, 140),
    ("citeseer", 3327, 9104, 3703, 6, 120),
])
def test_planetoid_counts_and_split(name, N, E, F, C, n_train):
    d = load_planetoid(need(name), name)
    assert (d.num_nodes, d.num_edges, d.num_features, d.num_classes) == (N, E, F, C)
    assert d.x.dtype == torch.float32 and d.y.dtype == torch.long
    assert [int(m.sum()) for m in (d.train_mask, d.val_mask, d.test_mask)] == [n_train, 500, 1000]
    assert not (d.train_mask & d.val_mask).any() and not (d.val_mask & d.test_mask).any()
    assert torch.bincount(d.y[d.train_mask], minlength=C).tolist() == [20] * C
    src, dst = d.edge_index
    assert not (src == dst).any()
    key = src * N + dst
    assert torch.unique(key).numel() == E  # no duplicates
    assert torch.equal(torch.sort(key).values, torch.sort(dst * N + src).values)  # undirected


@needs("citeseer")
def test_citeseer_isolated_test_ids_are_featureless_and_unlabelled():
    d = load_planetoid(PLANETOID, "citeseer")
    empty = d.x.sum(1) == 0
    # 15 ids inside the test range are missing from test.index: zero rows, in no mask
    assert int(empty.sum()) == 15
    assert not (empty & (d.train_mask | d.val_mask | d.test_mask)).any()
    assert (d.y[empty] == 0).all()


@pytest.mark.parametrize("name", ["Cora", "CiteSeer"])
def test_planetoid_matches_pyg(name, tmp_path):
    need(name.lower())
    pyg = pytest.importorskip("torch_geometric.datasets")
    raw = tmp_path / name / "raw"
    raw.mkdir(parents=True)
    for f in PLANETOID.glob(f"ind.{name.lower()}.*"):
        os.symlink(f, raw / f.name)
    ref = pyg.Planetoid(str(tmp_path), name)[0]
    d = load_planetoid(PLANETOID, name)
    for field in ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(ref, field), getattr(d, field)), field


@needs("citeseer")
def test_planetoid_row_normalisation():
    raw = load_planetoid(PLANETOID, "citeseer")
    d = load_planetoid(PLANETOID, "citeseer", normalize_features=True)
    s = d.x.sum(1)
    nz = raw.x.sum(1) > 0
    assert torch.allclose(s[nz], torch.ones(int(nz.sum())))
    assert (s[~nz] == 0).all()
    assert torch.equal(d.x != 0, raw.x != 0)


@pytest.mark.skipif(missing_files("pubmed") != ["ind.pubmed.allx"],
                    reason="needs a data home holding PubMed without its ind.pubmed.allx (as the "
                           "shared datasets folder does)")
def test_pubmed_names_the_missing_file():
    with pytest.raises(FileNotFoundError, match=r"missing file\(s\) ind\.pubmed\.allx$"):
        load_planetoid(PLANETOID, "pubmed")


@needs("cora")
def test_planetoid_lists_every_missing_file(tmp_path):
    d = _copy_planetoid(tmp_path)
    (d / "ind.cora.ty").unlink()
    (d / "ind.cora.graph").unlink()
    with pytest.raises(FileNotFoundError, match=r"ind\.cora\.ty, ind\.cora\.graph"):
        load_planetoid(d, "cora")


def test_planetoid_unknown_name_and_folder(tmp_path):
    with pytest.raises(ValueError, match="unknown Planetoid dataset 'nell'"):
        load_planetoid(tmp_path, "nell")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_planetoid(tmp_path / "nope", "cora")


@needs("cora")
@pytest.mark.parametrize("suffix", ["x", "ally", "graph"])
def test_planetoid_truncated_pickle(tmp_path, suffix):
    d = _copy_planetoid(tmp_path)
    p = d / f"ind.cora.{suffix}"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"ind\.cora\.{suffix}: corrupt or truncated pickle"):
        load_planetoid(d, "cora")


@needs("cora")
def test_planetoid_refuses_code_in_pickles(tmp_path):
    d = _copy_planetoid(tmp_path)
    # a pickle that would call os.system on load must be rejected before anything runs
    (d / "ind.cora.y").write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(ValueError, match=r"ind\.cora\.y.*refusing to load global os\.system"):
        load_planetoid(d, "cora")


@needs("cora")
def test_planetoid_wrong_object_and_shapes(tmp_path):
    d = _copy_planetoid(tmp_path)
    (d / "ind.cora.tx").write_bytes(pickle.dumps([1, 2, 3], protocol=2))
    with pytest.raises(ValueError, match=r"ind\.cora\.tx: expected a 2-d scipy sparse matrix"):
        load_planetoid(d, "cora")
    shutil.copy(PLANETOID / "ind.cora.tx", d / "ind.cora.tx")
    (d / "ind.cora.ty").write_bytes(pickle.dumps(np.zeros((999, 7), np.int32), protocol=2))
    with pytest.raises(ValueError, match=r"ind\.cora\.ty: shape \(999, 7\).*expected \(1000, 7\)"):
        load_planetoid(d, "cora")


@needs("cora")
def test_planetoid_bad_test_index_line(tmp_path):
    d = _copy_planetoid(tmp_path)
    p = d / "ind.cora.test.index"
    lines = p.read_text().splitlines()
    lines[2] = "12x"
    p.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=r"ind\.cora\.test\.index: line 3 is '12x'"):
        load_planetoid(d, "cora")


# ------------------------------------------------------------------------------ R-GCN entities
@pytest.mark.parametrize("name,N,R,E,C,n_train,n_test", [
    ("aifb", 8285, 90, 2 * 29043, 4, 140, 36),
    ("mutag", 23644, 46, 2 * 74227, 2, 272, 68),
])
def test_entities_counts(name, N, R, E, C, n_train, n_test, entities_cache):
    d = load_entities(need(name), name, cache_dir=entities_cache)
    assert (d.num_nodes, d.num_relations, d.num_edges, d.num_classes) == (N, R, E, C)
    assert (len(d.train_idx), len(d.test_idx)) == (n_train, n_test)
    assert len(set(d.train_idx.tolist()) | set(d.test_idx.tolist())) == n_train + n_test
    assert int(d.edge_type.max()) == R - 1
    # every forward edge (s, o, 2r) has its inverse (o, s, 2r + 1)
    src, dst = d.edge_index
    fwd = d.edge_type % 2 == 0
    a = (src[fwd] * N + dst[fwd]) * R + d.edge_type[fwd] + 1
    b = (src[~fwd] * N + dst[~fwd]) * R + d.edge_type[~fwd]
    a_inv = (dst[fwd] * N + src[fwd]) * R + d.edge_type[fwd] + 1
    assert torch.equal(torch.sort(a_inv).values, torch.sort(b).values)
    assert a.numel() == b.numel()
    # edges sorted by (source, target, type), as PyG's Entities
    key = (src * N + dst) * R + d.edge_type
    assert (key[1:] >= key[:-1]).all()


def test_entities_deterministic_order(entities_cache):
    # AIFB has blank nodes, which rdflib would name at random: the order must not depend on it
    aifb = need("aifb")
    a = load_entities(aifb, "aifb", use_cache=False)
    b = load_entities(aifb.parent, "aifb", cache_dir=entities_cache)
    for f in ("edge_index", "edge_type", "train_idx", "train_y", "test_idx", "test_y"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert a.relations == b.relations and a.classes == b.classes


_NT = b"""<http://x/a> <http://x/p> <http://x/b> .
<http://x/a> <http://x/q> "lit" .
_:n1 <http://x/p> <http://x/a> .
<http://x/b> <http://x/p> _:n1 .
<http://x/c> <http://x/q> "http://x/a" .
"""
_TRAIN = "person\tid\tlabel_affiliation\r\nhttp://x/a\t1.0\tg1\r\nhttp://x/b\t2.0\tg2\r\n"
_TEST = "person\tid\tlabel_affiliation\r\nhttp://x/c\t3.0\tg1"


def _tiny_entities(tmp_path: Path) -> Path:
    d = tmp_path / "aifb"
    d.mkdir()
    (d / "aifb_stripped.nt.gz").write_bytes(gzip.compress(_NT))
    (d / "trainingSet.tsv").write_text(_TRAIN, newline="")
    (d / "testSet.tsv").write_text(_TEST, newline="")
    return d


def test_entities_tiny_graph_semantics(tmp_path):
    d = load_entities(_tiny_entities(tmp_path), "aifb", use_cache=False)
    # nodes: a, b, c, blank n1, literal "lit", literal "http://x/a" (not merged with the IRI)
    assert d.num_nodes == 6 and d.num_relations == 4 and d.num_edges == 10
    assert d.relations == ["http://x/p", "http://x/q"]  # most frequent first
    assert d.classes == ["g1", "g2"]
    assert d.train_y.tolist() == [0, 1] and d.test_y.tolist() == [0]
    a, b = d.train_idx.tolist()
    src, dst = d.edge_index.tolist()
    edges = set(zip(src, dst, d.edge_type.tolist()))
    assert (a, b, 0) in edges and (b, a, 1) in edges


def test_entities_cache_roundtrip_and_repair(tmp_path):
    root, cache = _tiny_entities(tmp_path), tmp_path / "cache"
    a = load_entities(root, "aifb", cache_dir=cache)
    assert sorted(p.suffix for p in cache.iterdir()) == [".json", ".safetensors"]
    b = load_entities(root, "aifb", cache_dir=cache)
    assert torch.equal(a.edge_index, b.edge_index) and a.relations == b.relations
    st = next(cache.glob("*.safetensors"))
    st.write_bytes(b"garbage")  # a damaged cache is rebuilt, never trusted
    c = load_entities(root, "aifb", cache_dir=cache)
    assert torch.equal(c.edge_type, a.edge_type) and st.stat().st_size > 100
    # a changed source file changes the key: no stale reuse
    (root / "testSet.tsv").write_text(_TEST.replace("g1", "g2"), newline="")
    d = load_entities(root, "aifb", cache_dir=cache)
    assert d.test_y.tolist() == [1] and len(list(cache.glob("*.json"))) == 2


def test_entities_truncated_gzip(tmp_path):
    d = _tiny_entities(tmp_path)
    p = d / "aifb_stripped.nt.gz"
    p.write_bytes(p.read_bytes()[:30])
    with pytest.raises(ValueError, match=r"aifb_stripped\.nt\.gz: corrupt or truncated gzip"):
        load_entities(d, "aifb", use_cache=False)


def test_entities_bad_ntriples_line(tmp_path):
    d = _tiny_entities(tmp_path)
    (d / "aifb_stripped.nt.gz").write_bytes(gzip.compress(_NT + b"this is not a triple\n"))
    with pytest.raises(ValueError, match=r"aifb_stripped\.nt\.gz: not valid N-Triples"):
        load_entities(d, "aifb", use_cache=False)


def test_entities_tsv_errors(tmp_path):
    d = _tiny_entities(tmp_path)
    p = d / "testSet.tsv"
    p.write_text(_TEST.replace("label_affiliation", "label_x"), newline="")
    with pytest.raises(ValueError, match=r"testSet\.tsv: header .* lacks column\(s\) "
                                         r"\['label_affiliation'\]"):
        load_entities(d, "aifb", use_cache=False)
    p.write_text(_TEST.replace("http://x/c", "http://x/nobody"), newline="")
    with pytest.raises(ValueError, match=r"testSet\.tsv: line 2 names entity "
                                         r"'http://x/nobody'"):
        load_entities(d, "aifb", use_cache=False)
    (d / "trainingSet.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing file\(s\) trainingSet\.tsv"):
        load_entities(d, "aifb", use_cache=False)


# ------------------------------------------------------------------------------- KG triples
@pytest.mark.parametrize("name,E,R,sizes,in_train", [
    ("FB15k-237", 14541, 237, (272115, 17535, 20466), 14505),
    ("WN18RR", 40943, 11, (86835, 3034, 3134), 40559),
])
def test_kg_counts(name, E, R, sizes, in_train):
    d = load_kg(need(name.lower()).parent, name)
    assert (d.num_entities, d.num_relations) == (E, R)
    assert (len(d.train), len(d.valid), len(d.test)) == sizes
    # ids in order of first appearance: the entities seen in training come first
    assert int(d.train[:, [0, 2]].max()) == in_train - 1
    ei, et = d.edge_index("train")
    assert ei.shape == (2, sizes[0]) and et.shape == (sizes[0],)


def test_wn18rr_keeps_string_ids():
    root = need("wn18rr")
    d = load_kg(root)
    assert d.name == "WN18RR"
    assert d.entities[0] == "00260881"  # leading zeros kept
    h, r, t = d.train[0].tolist()
    first = (root / "train.txt").read_text().splitlines()[0].split("\t")
    assert [d.entities[h], d.relations[r], d.entities[t]] == first


def test_kg_malformed_and_missing(tmp_path):
    (tmp_path / "train.txt").write_text("a\tr\tb\nc\tr\n")
    (tmp_path / "valid.txt").write_text("a\tr\tc\n")
    with pytest.raises(FileNotFoundError, match=r"missing file\(s\) test\.txt"):
        load_kg(tmp_path)
    (tmp_path / "test.txt").write_text("b\tr\ta\n")
    with pytest.raises(ValueError, match=r"train\.txt: line 2 is 'c\\tr'"):
        load_kg(tmp_path)
    (tmp_path / "train.txt").write_text("a\tr\tb\n")
    d = load_kg(tmp_path)
    assert d.entities == ["a", "b", "c"] and d.test.tolist() == [[1, 0, 0]]

"""AIFB / MUTAG typed by rdf:type: the type rule on a tiny file, and on the real AIFB file the
typed view holds exactly the homogeneous view's edges (none lost, none repeated) and split."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

import structconv as sc
from structconv.data.rdf_typed import rdf_node_types
from tests.conftest import need

T = "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>"
_NT = f"""<http://x/p1> {T} <http://x/o#Person> .
<http://x/p1> {T} <http://x/o#Student> .
<http://x/p2> {T} <http://x/o#Person> .
<http://x/p3> {T} <http://x/o#Person> .
<http://x/s9> {T} <http://x/o#Student> .
<http://x/g1> {T} <http://x/o#Group> .
<http://x/p3> <http://x/o#worksAt> <http://x/g1> .
<http://x/p1> <http://x/o#name> "Ann" .
<http://x/p2> <http://x/o#knows> <http://x/x> .
<http://x/p2> <http://x/o#knows> <http://x/p1> .
""".encode()
_TRAIN = "id\tperson\tlabel_affiliation\n1\thttp://x/p1\tg1\n2\thttp://x/p2\tg2\n"
_TEST = "id\tperson\tlabel_affiliation\n3\thttp://x/p3\tg1\n"


def _tiny(tmp_path: Path) -> Path:
    d = tmp_path / "aifb"
    d.mkdir()
    (d / "aifb_stripped.nt.gz").write_bytes(gzip.compress(_NT))
    (d / "trainingSet.tsv").write_text(_TRAIN)
    (d / "testSet.tsv").write_text(_TEST)
    return d


def _keys_back(g, homo, node_type, types):
    """The typed graph's edges as sorted homogeneous keys (src * N + dst) * R + relation."""
    N, R = homo.num_nodes, homo.num_relations
    ids = {t: torch.nonzero(node_type == i).flatten() for i, t in enumerate(types)}
    rel = {n: i for i, n in enumerate(homo.relations)}
    keys = []
    for (s, r, d), ei in g.edge_index.items():
        keys.append((ids[s][ei[0]] * N + ids[d][ei[1]]) * R + rel[r])
    return torch.sort(torch.cat(keys)).values


def _homo_keys(homo):
    src, dst = homo.edge_index
    return torch.sort((src * homo.num_nodes + dst) * homo.num_relations + homo.edge_type).values


def test_types_come_from_rdf_type_with_the_documented_rules(tmp_path):
    root, cache = _tiny(tmp_path), tmp_path / "cache"
    node_type, types = rdf_node_types(root, "aifb", str(cache))
    # p1 is a Person and a Student: Person types more nodes (3 against 2), so Person; the
    # classes' own IRIs and x have no rdf:type (untyped); "Ann" is a literal
    assert types == ["untyped", "Person", "Group", "Student", "literal"]
    assert torch.bincount(node_type).tolist() == [4, 3, 1, 1, 1]
    assert list(cache.glob("aifb-types-*.json"))  # cached: read back the same
    again = rdf_node_types(root, "aifb", str(cache))
    assert torch.equal(again[0], node_type) and again[1] == types
    g = sc.data.load_dataset("aifb-typed", root=root, cache=str(cache))
    homo = sc.data.load_dataset("aifb", root=root, cache=str(cache))
    assert g.num_nodes == {"untyped": 4, "Person": 3, "Group": 1, "Student": 1, "literal": 1}
    assert ("Person", "worksAt", "Group") in g.edge_types
    assert ("Group", "worksAt^-1", "Person") in g.edge_types
    assert ("Person", "type", "untyped") in g.edge_types  # rdf:type edges stay edges
    assert g.num_edges() == homo.edge_index.shape[1] == 20
    assert torch.equal(_keys_back(g, homo, node_type, types), _homo_keys(homo))
    # the labelled persons keep labels and split, in their type's rows (node-id order)
    persons = torch.nonzero(node_type == 1).flatten()
    assert torch.equal(g.y["Person"], homo.y[persons])
    for k in ("train", "val", "test"):
        assert torch.equal(g.masks["Person"][k], homo.masks[k][persons]), k
    assert list(g.y) == ["Person"]


def test_aifb_typed_holds_every_homogeneous_edge_once(tmp_path):
    root = need("aifb-typed")
    cache = str(tmp_path / "cache")
    g = sc.data.load_dataset("aifb-typed", cache=cache)
    homo = sc.data.load_dataset("aifb", cache=cache)
    node_type, types = rdf_node_types(root, "aifb", cache)
    assert sum(g.num_nodes.values()) == homo.num_nodes == 8285
    assert (len(g.node_types), len(g.edge_types)) == (22, 234)
    assert g.num_edges() == homo.edge_index.shape[1] == 2 * 29043
    assert torch.equal(_keys_back(g, homo, node_type, types), _homo_keys(homo))
    # the 176 labelled entities are all of one type and keep the homogeneous split
    (target,) = list(g.y)
    rows = torch.nonzero(node_type == types.index(target)).flatten()
    for k, m in homo.masks.items():
        assert int(m.sum()) == int(g.masks[target][k].sum()), k
        assert torch.equal(g.masks[target][k], m[rows]), k
    assert int(sum(m.sum() for m in g.masks[target].values())) == 176


@pytest.mark.parametrize("name", ["aifb-typed", "mutag-typed"])
def test_the_typed_views_are_registered(name):
    assert name in sc.data.dataset_names()

"""HeteroGraph: validation, moves, PyG round trip; DBLP / IMDB equal PyG's dataset classes."""

import shutil

import pytest
import torch

import structconv as sc
from structconv.data.hetero import HeteroGraph
from tests.conftest import need


def _small():
    return HeteroGraph({"a": 3, "b": 2, "c": 1},
                       {("a", "r", "b"): torch.tensor([[0, 2], [1, 1]]),
                        ("b", "s", "a"): torch.tensor([[1], [0]])},
                       x={"a": torch.randn(3, 4), "b": torch.randn(2, 5)},
                       edge_attr={("a", "r", "b"): torch.randn(2, 3)})


def test_views_and_metadata():
    g = _small()
    assert g.metadata() == (["a", "b", "c"], [("a", "r", "b"), ("b", "s", "a")])
    assert set(g.x_dict) == {"a", "b"} and len(g.edge_index_dict) == 2
    assert g.relation("r") == ("a", "r", "b") and g.relation("b__s__a") == ("b", "s", "a")
    h = g.to(dtype=torch.float64)
    assert h.x["a"].dtype == torch.float64 and h.edge_index[("a", "r", "b")].dtype == torch.long


@pytest.mark.parametrize("bad,match", [
    (dict(edge_index={("a", "r", "z"): torch.zeros(2, 0, dtype=torch.long)}), "node type 'z'"),
    (dict(edge_index={("a", "r", "b"): torch.tensor([[0], [5]])}), r"\[0, 1\]"),
    (dict(edge_index={("a", "r", "b"): torch.zeros(3, 1, dtype=torch.long)}), r"\(2, E\)"),
    (dict(x={"a": torch.randn(4, 2)}), "3 rows"),
    (dict(edge_index={"a__b__c__d": torch.zeros(2, 0, dtype=torch.long)}), "src, relation"),
])
def test_validation(bad, match):
    kw = dict(num_nodes={"a": 3, "b": 2}, edge_index={})
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        HeteroGraph(**kw)


def test_pyg_round_trip():
    pytest.importorskip("torch_geometric")
    g = _small()
    d = g.to_pyg()
    assert d.metadata() == g.metadata()
    back = HeteroGraph.from_pyg(d)
    assert back.num_nodes == g.num_nodes
    for et in g.edge_types:
        assert torch.equal(back.edge_index[et], g.edge_index[et])
    assert torch.equal(back.edge_attr[("a", "r", "b")], g.edge_attr[("a", "r", "b")])


@pytest.mark.parametrize("name,cls", [("dblp", "DBLP"), ("imdb", "IMDB")])
def test_loader_equals_pyg(name, cls, tmp_path):
    pyg_ds = pytest.importorskip("torch_geometric.datasets")
    folder = need(name)
    ours = sc.data.load_dataset(name)
    root = tmp_path / cls
    shutil.copytree(folder / "raw", root / "raw")
    ref = getattr(pyg_ds, cls)(str(root))[0]  # files present: PyG processes, never downloads
    assert ours.metadata() == (ref.node_types, ref.edge_types)
    for t in ref.node_types:
        assert ours.num_nodes[t] == ref[t].num_nodes
        if "x" in ref[t]:
            assert torch.equal(ours.x[t], ref[t].x)
        else:
            assert t not in ours.x
    for et in ref.edge_types:
        assert torch.equal(ours.edge_index[et], ref[et].edge_index)
    target = "author" if name == "dblp" else "movie"
    assert torch.equal(ours.y[target], ref[target].y)
    for s in ("train", "val", "test"):
        assert torch.equal(ours.masks[target][s], ref[target][f"{s}_mask"])
    assert int(ours.masks[target]["train"].sum()) == 400


def test_datasets_command_lists_them(capsys):
    from structconv.cli import main

    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert "dblp" in out and "imdb" in out and "hetero/DBLP" in out


def test_missing_or_corrupt_files_say_which(tmp_path):
    from structconv.data.registry import DatasetError

    with pytest.raises(DatasetError, match="adjM.npz is missing"):
        sc.data.load_dataset("dblp", root=tmp_path)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "adjM.npz").write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match="node_types.npy is missing"):
        sc.data.load_dataset("imdb", root=tmp_path)

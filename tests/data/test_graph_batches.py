"""Batches of graphs: GraphBatch equals PyG's Batch.from_data_list; the flat dataset's collate
and the loader (shuffle, seed, drop_last, resume, workers)."""

import pytest
import torch

import structconv as sc
from structconv.data import GraphBatch, GraphDataset, GraphLoader


def _graphs(seed=0, n_graphs=7, P=3, D=2, empty=True):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n_graphs):
        n = int(torch.randint(1, 9, (1,), generator=g))
        if empty and i == 2:
            n = 0  # a graph without nodes
        e = int(torch.randint(0, 14, (1,), generator=g)) if n else 0
        out.append({"x": torch.randn(n, P, generator=g, dtype=torch.float64),
                    "edge_index": torch.randint(0, max(n, 1), (2, e), generator=g),
                    "edge_attr": torch.randn(e, D, generator=g),
                    "y": torch.randint(0, 3, (1,), generator=g)})
    return out


def test_from_graphs_equals_pyg_batch_field_by_field():
    pyg = pytest.importorskip("torch_geometric")
    from torch_geometric.data import Batch, Data

    graphs = _graphs()
    ours = GraphBatch.from_graphs(graphs)
    theirs = Batch.from_data_list([Data(**g, num_nodes=g["x"].shape[0]) for g in graphs])
    for name in ("x", "edge_index", "edge_attr", "y", "batch", "ptr"):
        a, b = getattr(ours, name), getattr(theirs, name)
        assert a.dtype == b.dtype, name
        assert torch.equal(a, b), name
    assert ours.num_graphs == theirs.num_graphs == len(graphs)
    assert pyg  # (imported for the skip)


def test_from_graphs_scalar_y_and_objects():
    class G:
        def __init__(self, x, ei, y):
            self.x, self.edge_index, self.y = x, ei, y

    b = GraphBatch.from_graphs([G(torch.ones(2, 1), torch.tensor([[0], [1]]), torch.tensor(1)),
                                G(torch.ones(3, 1), torch.tensor([[2], [0]]), torch.tensor(0))])
    assert b.y.tolist() == [1, 0] and b.edge_attr is None
    assert b.edge_index.tolist() == [[0, 4], [1, 2]] and b.ptr.tolist() == [0, 2, 5]


def test_from_graphs_rejects_mixed_edge_attr():
    gs = _graphs(n_graphs=2)
    gs[1] = {k: v for k, v in gs[1].items() if k != "edge_attr"}
    with pytest.raises(ValueError, match="edge_attr"):
        GraphBatch.from_graphs(gs)


def test_dataset_batch_of_any_order_equals_from_graphs():
    graphs = _graphs(1, n_graphs=9)
    ds = GraphDataset.from_graphs(graphs)
    idx = [5, 2, 8, 0, 2]
    got = ds.batch(idx)
    want = GraphBatch.from_graphs([graphs[i] for i in idx])
    for name in ("x", "edge_index", "edge_attr", "y", "batch", "ptr"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    sub = ds.subset(idx)
    assert len(sub) == 5 and torch.equal(sub.batch().x, want.x)
    assert torch.equal(sub[1]["edge_index"], graphs[2]["edge_index"])


def test_batch_to_moves_floats_only():
    b = GraphBatch.from_graphs(_graphs()).to("cpu", torch.float32)
    assert b.x.dtype == torch.float32 and b.edge_attr.dtype == torch.float32
    assert b.edge_index.dtype == torch.long and b.y.dtype == torch.long


def test_loader_shuffle_seed_drop_last_and_resume():
    ds = GraphDataset.from_graphs(_graphs(2, n_graphs=23))
    loader = GraphLoader(ds, batch_size=5, shuffle=True, seed=3, drop_last=True)
    assert len(loader) == 4
    e0 = [b.y.clone() for b in loader]
    e1 = [b.y.clone() for b in loader]  # the next epoch: another permutation
    assert len(e0) == 4 and loader.epoch == 2
    assert any(not torch.equal(a, b) for a, b in zip(e0, e1))
    ids = torch.cat(GraphLoader(ds, 5, shuffle=True, seed=3, drop_last=True).order(0))
    assert len(set(ids.tolist())) == 20
    # resume mid-epoch 1: the same remaining batches
    again = GraphLoader(ds, batch_size=5, shuffle=True, seed=3, drop_last=True)
    it = iter(again)
    for _ in range(4):
        next(it)
    next(iter(again))  # epoch 1, batch 0
    state = again.state_dict()
    assert state == {"epoch": 1, "batch": 1}
    fresh = GraphLoader(ds, batch_size=5, shuffle=True, seed=3, drop_last=True)
    fresh.load_state_dict(state)
    rest = [b.y for b in fresh]
    assert all(torch.equal(a, b) for a, b in zip(rest, e1[1:])) and len(rest) == 3
    # another seed: another order
    other = GraphLoader(ds, batch_size=5, shuffle=True, seed=4).order(0)
    assert not torch.equal(torch.cat(other), torch.cat(loader.order(0)))


def test_loader_without_drop_last_keeps_the_tail_and_workers_agree():
    ds = GraphDataset.from_graphs(_graphs(3, n_graphs=11))
    plain = [b for b in GraphLoader(ds, batch_size=4)]
    assert [b.num_graphs for b in plain] == [4, 4, 3]
    workers = [b for b in GraphLoader(ds, batch_size=4, num_workers=1)]
    for a, b in zip(plain, workers):
        assert torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index)


def test_loader_rejects_bad_options():
    ds = GraphDataset.from_graphs(_graphs(n_graphs=3))
    with pytest.raises(ValueError, match="batch_size"):
        GraphLoader(ds, batch_size=0)
    with pytest.raises(TypeError, match="GraphDataset"):
        GraphLoader([1, 2], batch_size=2)


def test_readout_of_a_graph_batch_object():
    b = GraphBatch.from_graphs(_graphs())
    A = sc.basis.readout(b).to_dense()
    assert A.shape == (1, b.num_nodes, b.num_graphs)
    assert torch.equal(A[0].sum(0), (b.ptr[1:] - b.ptr[:-1]).to(A.dtype))


def test_loader_moves_batches_and_a_moved_dataset_collates_there():
    ds = GraphDataset.from_graphs(_graphs(4, n_graphs=6))
    b = next(iter(GraphLoader(ds, batch_size=3, dtype=torch.float32)))
    assert b.x.dtype == torch.float32 and b.edge_attr.dtype == torch.float32
    moved = ds.to("cpu", torch.float16)
    assert moved.batch([1, 0]).x.dtype == torch.float16
    assert torch.equal(moved.batch([1, 0]).edge_index, ds.batch([1, 0]).edge_index)

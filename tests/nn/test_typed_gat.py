"""The typed GAT of ``[model.hetero] kind = "gat"`` equals PyG's ``to_hetero`` of its tutorial
GAT on the same weights (float64; a relation with no edges, a node type with no nodes); a type
no relation reaches keeps its linear term; ``embed`` gives featureless types a learned vector
per node, and refuses what it cannot train."""

from __future__ import annotations

import pytest
import torch

import structconv as sc
from structconv.config import HETERO_KEYS, ConfigError
from structconv.models.hetero import TypedClassifier, TypedGATLayer, build_hetero
from tests.conftest import tiny_imdb

NUM = {"a": 5, "b": 7, "c": 0}
WIDTHS = {"a": 4, "b": 6, "c": 3}
META = (["a", "b", "c"], [("a", "r", "b"), ("b", "s", "a"), ("a", "t", "a"), ("b", "u", "b"),
                          ("c", "v", "b"), ("b", "w", "c")])


def _graph(empty=(("a", "t", "a"),), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = {t: torch.randn(NUM[t], WIDTHS[t], generator=g, dtype=torch.float64) for t in NUM}
    ei = {}
    for e in META[1]:
        n = 0 if e in empty or not NUM[e[0]] or not NUM[e[2]] else 11
        ei[e] = torch.stack([torch.randint(0, max(NUM[e[0]], 1), (n,), generator=g),
                             torch.randint(0, max(NUM[e[2]], 1), (n,), generator=g)])
    return x, ei


def _spec(**over):
    return {**HETERO_KEYS, "kind": "gat", "hidden": 6, "layers": 2, "heads": 1,
            "activation": "relu", **over}


def _pyg_gat(hidden, out):
    pnn = pytest.importorskip("torch_geometric.nn")

    class GAT(torch.nn.Module):  # PyG's heterogeneous tutorial's model
        def __init__(self):
            super().__init__()
            self.conv1 = pnn.GATConv((-1, -1), hidden, add_self_loops=False)
            self.lin1 = pnn.Linear(-1, hidden)
            self.conv2 = pnn.GATConv((-1, -1), out, add_self_loops=False)
            self.lin2 = pnn.Linear(-1, out)

        def forward(self, x, edge_index):
            x = self.conv1(x, edge_index) + self.lin1(x)
            x = x.relu()
            return self.conv2(x, edge_index) + self.lin2(x)
    return pnn.to_hetero(GAT(), META, aggr="sum")


def test_typed_gat_equals_pyg_to_hetero_gat_on_the_same_weights():
    torch.manual_seed(0)
    ref = _pyg_gat(6, 3)
    x, ei = _graph()
    ref({t: v.float() for t, v in x.items()}, ei)  # size PyG's lazy layers (float32)
    ref = ref.double()
    for p in ref.parameters():  # non-zero biases, so that a wrong sum shows
        torch.nn.init.normal_(p)
    ours = TypedClassifier(_spec(), WIDTHS, 3, META, "b").double()
    ours.convs[0].load_pyg(ref.conv1, ref.lin1)
    ours.convs[1].load_pyg(ref.conv2, ref.lin2)
    want = ref(x, ei)
    torch.testing.assert_close(ours(x, ei), want["b"], rtol=1e-12, atol=1e-12)
    h = {t: v.relu() for t, v in ours.convs[0](x, ei).items()}
    got = ours.convs[1](h, ei)
    assert set(got) == set(want) == {"a", "b", "c"} and got["c"].shape == (0, 3)
    for t in want:
        torch.testing.assert_close(got[t], want[t], rtol=1e-12, atol=1e-12)
    # gradients too: the same weights get the same gradients
    ga = torch.autograd.grad(ours(x, ei).square().sum(), ours.convs[0].skip["a"].weight)
    gb = torch.autograd.grad(ref(x, ei)["b"].square().sum(), ref.lin1["a"].weight)
    torch.testing.assert_close(ga[0], gb[0], rtol=1e-11, atol=1e-11)


def test_a_type_no_relation_reaches_keeps_its_linear_term():
    meta = (["a", "b", "c"], [("a", "r", "b"), ("b", "s", "a")])  # nothing reaches c
    layer = TypedGATLayer({"a": 4, "b": 6, "c": 3}, 5, meta).double()
    x = _graph()[0]
    x["c"] = torch.randn(2, 3, dtype=torch.float64)
    y = layer(x, {})  # no edge type given: no messages, the linear maps alone
    assert set(y) == {"a", "b", "c"}
    for t in y:
        torch.testing.assert_close(y[t], layer.skip[t](x[t]))
    none = TypedGATLayer({"a": 4}, 5, (["a"], []))  # no relation at all
    assert none({"a": x["a"].float()}, {})["a"].shape == (5, 5)


def test_heads_concatenate_in_hidden_layers_and_average_in_the_last():
    m = TypedClassifier(_spec(hidden=8, heads=4, layers=3), WIDTHS, 3, META, "b").double()
    assert [c.conv.convs["a__r__b"].heads for c in m.convs] == [4, 4, 4]
    assert [c.skip["b"].out_features for c in m.convs] == [8, 8, 3]
    x, ei = _graph()
    assert m(x, ei).shape == (7, 3)


@pytest.fixture(scope="module")
def imdb(tmp_path_factory):
    return sc.data.load_dataset("imdb", str(tiny_imdb(tmp_path_factory.mktemp("imdb"))))


def _cfg(**hetero):
    return {"data": {"name": "imdb"}, "model": {"hetero": hetero}}


def test_embed_gives_each_featureless_node_a_learned_vector(imdb):
    del imdb.x["director"]  # a featureless type, as DBLP's conferences or every RDF type
    torch.manual_seed(0)
    m = build_hetero(_cfg(kind="rgcn", param="separable", hidden=8, embed=5), imdb)
    assert m.embedded == ["director"] and m.embeds[0].shape == (8, 5)
    assert m.convs[0].widths["director"] == 5
    x, ei = sc.models.hetero.typed_inputs({**HETERO_KEYS, "embed": 5}, imdb)
    out = m(x, ei)
    g = torch.autograd.grad(out.square().sum(), m.embeds[0])[0]
    assert g.abs().sum() > 0  # the movies read their directors' vectors
    # another vector for one director changes the movies that director made, only them
    with torch.no_grad():
        m.embeds[0][0] += 1.0
    moved = (m(x, ei) - out).abs().sum(1) > 1e-6
    made = torch.zeros(imdb.num_nodes["movie"], dtype=torch.bool)
    for (s, _, d), e in ei.items():
        if (s, d) == ("director", "movie"):
            made[e[1][e[0] == 0]] = True
    assert moved.any() and torch.equal(moved, made)
    plain = build_hetero(_cfg(kind="rgcn", hidden=8), imdb)
    assert len(plain.embeds) == 0 and plain.convs[0].widths["director"] == 1


@pytest.mark.parametrize("over,named", [
    ({"embed": -1}, "model.hetero.embed"),
    ({"embed": 1.5}, "model.hetero.embed"),
    ({"kind": "gat", "hidden": 10, "heads": 4}, "heads"),
])
def test_bad_embed_and_gat_keys_are_named(over, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        sc.train(_cfg(**over), "unused")


def test_embed_with_a_sampler_is_refused_by_name(tmp_path):
    cfg = {"data": {"name": "dblp"}, "model": {"hetero": {"embed": 4}},
           "train": {"sampler": {"fanouts": [5, 5]}}}
    with pytest.raises(ConfigError, match="embed"):
        sc.train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()

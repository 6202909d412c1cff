"""Every layer of sc.nn and sc.attention, and every model of structconv.models, re-draws
its weights with ``reset_parameters()``.

Under one seed, ``reset_parameters()`` gives back the values the constructor drew (the
constructor's draws are the reset's), except where a constructor draws more than its reset
(PyG's graph layers: their sub-layers draw before the layer's own reset); there the reset's
values depend on the seed alone. Shapes, dtypes, devices and the parameter objects stay.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch
from torch import nn

import structconv as sc
import structconv.models as sc_models
from structconv import attention as at
from structconv import basis as B
from structconv.config import HETERO_KEYS, parse_config, validate
from structconv.models import declared, forecast, gin, hetero, mixed, routing
from structconv.models import graph as mg
from structconv.models import relational_attention as ra
from structconv.nn.blocks import FeedForward
from tests.conftest import TinyImages, TwoSage

META = (["a", "b"], [("a", "r", "b"), ("b", "s", "a"), ("a", "t", "a")])


def _mlp(p, q):
    return nn.Sequential(nn.Linear(p, 5), nn.ReLU(), nn.Linear(5, q))


#: name -> (maker, exact): exact when a fresh layer and a reset one agree value for value
MAKERS = {
    # SAGE's aggregations (an LSTM, learnt temperatures, a projection of several)
    "Readout-lstm": (lambda: sc.nn.aggregation.Readout("lstm", in_channels=3, out_channels=4),
                     True),
    "Readout-softmax-learn": (lambda: sc.nn.aggregation.Readout(
        "softmax", learn=True, channels=3), True),
    "MultiReadout-proj": (lambda: sc.nn.aggregation.MultiReadout(
        ["mean", "max"], mode="proj", mode_kwargs=dict(in_channels=3, out_channels=4)), True),
    # layers of a fixed basis
    "Convolution": (lambda: sc.nn.Convolution(sc.basis.Grid((5,), 3), 2, 3), True),
    "Convolution-glorot-separable": (lambda: sc.nn.Convolution(
        sc.basis.Grid((5,), 3), 2, 3, sc.params.ControlledSeparable(3, 2, 3, 2), init="glorot"),
        True),
    "Convolution-depthwise-nobias": (lambda: sc.nn.Convolution(
        sc.basis.Grid((5,), 3), 2, 2, "depthwise", bias=False), True),
    "GridConv": (lambda: sc.nn.GridConv(2, 3, 3, dim=1), True),
    "GridConv-grouped": (lambda: sc.nn.GridConv(4, 6, (2, 2), groups=2), True),
    # torch's and the paper's attention layers
    "MultiheadAttention": (lambda: sc.nn.MultiheadAttention(4, 2), True),
    "MultiheadAttention-kv": (lambda: sc.nn.MultiheadAttention(
        4, 2, kdim=3, vdim=5, add_bias_kv=True), True),
    "TransformerEncoderLayer": (lambda: sc.nn.TransformerEncoderLayer(4, 2, 6), True),
    "TransformerEncoderLayer-shifts": (lambda: sc.nn.TransformerEncoderLayer(
        4, 2, 6, shift_heads=(1, 2)), True),
    "TransformerDecoderLayer": (lambda: sc.nn.TransformerDecoderLayer(4, 2, 6), True),
    "MixedAttention": (lambda: sc.nn.MixedAttention(4, 2, (1,)), True),
    # sequence models
    "ResidualDepthwise": (lambda: sc.nn.canon.ResidualDepthwise(3, 4), True),
    "Canon": (lambda: sc.nn.Canon(4, 3), True),
    "CausalSelfAttention": (lambda: sc.nn.CausalSelfAttention(
        8, 2, 2, relative=True, canon=3), True),
    "TransformerLM": (lambda: sc.nn.TransformerLM(11, 8, 2, 2, canon="ABCD"), True),
    "TransformerLM-learned-untied": (lambda: sc.nn.TransformerLM(
        11, 8, 1, 2, "learned", context=5, tie_weights=False), True),
    "CentredCanon": (lambda: sc.nn.seq2seq.CentredCanon(4, 3), True),
    "SelfAttention": (lambda: sc.nn.SelfAttention(8, 2, [-1, 1], alibi=True, canon=3), True),
    "CrossAttention": (lambda: sc.nn.CrossAttention(8, 2), True),
    "EncoderBlock": (lambda: sc.nn.seq2seq.EncoderBlock(8, 2, [-1, 0], 12, canon="ABCD"), True),
    "DecoderBlock": (lambda: sc.nn.seq2seq.DecoderBlock(8, 2, [0, 1], 12, canon="ABCD"), True),
    "Seq2Seq": (lambda: sc.nn.Seq2Seq(7, 9, width=8, layers=1, heads=2, position="shift",
                                      canon="AD"), True),
    "Seq2Seq-learned": (lambda: sc.nn.Seq2Seq(7, 9, width=8, layers=1, dec_layers=2, heads=2,
                                              position="learned", context=6), True),
    "AttentionPooling": (lambda: sc.nn.AttentionPooling(4, 3, heads=2), True),
    "DenseGridLayer": (lambda: sc.nn.pervasive.DenseGridLayer(4, 2, 3), True),
    "PervasiveAttention": (lambda: sc.nn.PervasiveAttention(
        7, 9, embed=4, layers=2, growth=2), True),
    "PervasiveAttention-max": (lambda: sc.nn.PervasiveAttention(
        7, 9, embed=4, layers=1, growth=2, pooling="max"), True),
    # graph layers (PyG's: the sub-layers draw before the layer's own reset)
    "GCNConv": (lambda: sc.nn.GCNConv(3, 4), False),
    "ChebConv": (lambda: sc.nn.ChebConv(3, 4, K=2), False),
    "TAGConv": (lambda: sc.nn.TAGConv(3, 4, K=2), False),
    "SGConv": (lambda: sc.nn.SGConv(3, 4), False),
    "RGCNConv": (lambda: sc.nn.RGCNConv(3, 4, 2), False),
    "SAGEConv": (lambda: sc.nn.SAGEConv(3, 4), False),
    "GINConv": (lambda: sc.nn.GINConv(_mlp(3, 4), train_eps=True), False),
    "GINEConv": (lambda: sc.nn.GINEConv(_mlp(3, 4), edge_dim=2), False),
    "GATConv": (lambda: sc.nn.GATConv(3, 4, heads=2, edge_dim=2), False),
    "GATv2Conv": (lambda: sc.nn.GATv2Conv(3, 4, heads=2, edge_dim=2), False),
    "TransformerConv": (lambda: sc.nn.TransformerConv(3, 4, heads=2, edge_dim=2), False),
    "AttentionalAggregation": (lambda: sc.nn.AttentionalAggregation(
        nn.Linear(4, 1), _mlp(4, 3)), True),
    "NodeGate": (lambda: sc.nn.NodeGate(nn.Linear(4, 2)), True),
    "HeteroConv": (lambda: sc.nn.HeteroConv({e: sc.nn.SAGEConv(4, 3) for e in META[1]}),
                   False),
    "TypedGraphConv": (lambda: sc.nn.TypedGraphConv(4, 3, META), False),
    "TypedModel": (lambda: sc.nn.to_hetero(TwoSage(), META), False),
    "HGTConv": (lambda: sc.nn.HGTConv(4, 6, META, heads=2), False),
    "HANConv": (lambda: sc.nn.HANConv(4, 6, META, heads=2), False),
    # mechanisms
    "Biaffine": (lambda: at.Biaffine(2, 3, 4), True),
    "DotProduct": (lambda: at.DotProduct(2, 3, 4, 2, bias=True), True),
    "GATScores": (lambda: at.GATScores(2, 3), True),
    "EdgeTerm": (lambda: at.EdgeTerm(2, 3), True),
    "EdgeDot": (lambda: at.EdgeDot(2, 3, 4), True),
    "GATv2Scores": (lambda: at.GATv2Scores(2, 3, edge_dim=4), True),
    "RelativeBias": (lambda: at.RelativeBias(2), True),
    "PeriodicBias": (lambda: at.PeriodicBias(2, 3), True),
    "Sum": (lambda: at.DotProduct(2, 3, 3, 2) + at.RelativeBias(2) + at.Biaffine(2, 3, 3),
            True),
    "Masked": (lambda: at.Masked(at.DotProduct(2, 3, 3, 2), causal=True), True),
    "Softmax": (lambda: at.Softmax(at.Biaffine(2, 3, 3)), True),
    "LeakyReLU": (lambda: at.LeakyReLU(at.GATScores(2, 3)), True),
    "GraphMasked": (lambda: at.GraphMasked(at.GATScores(2, 3), torch.tensor([[0, 1], [1, 2]])),
                    True),
    "TanhClip": (lambda: at.TanhClip(at.DotProduct(2, 3, 3, 2)), True),
}

#: a small graph for the models: 5 nodes, 6 edges of 2 relations
EI = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])
ET = torch.tensor([0, 1, 0, 1, 0, 1])
GRAPH = B.Structure(edge_index=EI, num_nodes=5, edge_attr=torch.arange(12.0).view(6, 2) / 12,
                    edge_type=ET, num_relations=2)


_NET = """
name = "t"
[data]
name = "digits"
[[model.layers]]
basis = { kind = "grid", kernel_size = 3, padding = 1 }
channels = 4
[[model.layers]]
type = "mlp"
hidden = 6
norm = "layer"
[[model.layers]]
basis = { kind = "attention", heads = 2 }
norm = "layer"
residual = true
"""


def _gat(**spec):
    return declared.GraphAttentionConv({"kind": "graph_attention", "heads": 2, **spec}, GRAPH,
                                       3, 4, {"bias": True}, "model.layers.0.basis")


#: the models (structconv.models): name -> (maker, exact), as MAKERS
MODEL_MAKERS = {
    "GCN": (lambda: mg.GCN(EI, 5, 3, 4, 2), True),
    "ChebNet": (lambda: mg.ChebNet(EI, 5, 3, 4, 2, K=2), True),
    "SGC": (lambda: mg.SGC(EI, 5, 3, 2), True),
    "GAT": (lambda: mg.GAT(EI, 5, 3, 4, 2, heads=2), False),
    "RelationalLayer": (lambda: mg.RelationalLayer(mg.relational_basis(EI, ET, 5, 2),
                                                   mg.identity_basis(5), 3, 4), True),
    "RGCN": (lambda: mg.RGCN(EI, ET, 5, 2, 4, 3, num_bases=2), True),
    "TwoLayerGraphNet": (lambda: mg.TwoLayerGraphNet("sage", 3, 4, 2), False),
    "GIN": (lambda: gin.GIN(3, 4, 2, layers=2, readout="attention"), False),
    "TypedClassifier": (lambda: hetero.TypedClassifier({**HETERO_KEYS, "hidden": 4},
                                                       {"a": 4, "b": 4}, 3, META, "a"), False),
    "TypedGATLayer": (lambda: hetero.TypedGATLayer({"a": 4, "b": 5}, 3, META, heads=2), False),
    "TypedClassifier-gat-embed": (lambda: hetero.TypedClassifier(
        {**HETERO_KEYS, "kind": "gat", "hidden": 4, "heads": 2, "embed": 3}, {"a": 3, "b": 4}, 3,
        META, "a", embedded={"a": 5}), False),
    "EncoderLayer": (lambda: routing.EncoderLayer(4, 2, 6), True),
    "PointerDecoder": (lambda: routing.PointerDecoder(4, 2), True),
    "AttentionModel": (lambda: routing.AttentionModel(4, 2, 1, 6), True),
    "HeadsLayer": (lambda: mixed.HeadsLayer(EI[0], EI[1], 5, 3, 2, 2, None, True, 0.5), True),
    "HeadsNet": (lambda: mixed.HeadsNet(EI, 5, 3, 2, att=1, hops=2, r=2), True),
    "OffsetBias": (lambda: forecast.OffsetBias(2, 3), True),
    "SeriesAttention": (lambda: forecast.SeriesAttention(
        "period", 3, 2, 4, heads=2, dim=2, span=6, periods=[2]), True),
    "Forecaster": (lambda: forecast.Forecaster(6, 2, "period", width=4, heads=2, periods=[2]),
                   True),
    "RelationGATScores": (lambda: ra.RelationGATScores(2, 3), True),
    "RGATConv": (lambda: ra.RGATConv(3, 4, 2, heads=2), True),
    "RGATConv-bases-across": (lambda: ra.RGATConv(3, 4, 2, num_bases=2, attention="across"),
                              True),
    "RGAT": (lambda: ra.RGAT(EI, ET, 5, 2, 4, 3, heads=2), True),
    "MLP": (lambda: declared.MLP(3, 5, "gelu"), True),
    "AttentionConv": (lambda: declared.AttentionConv(
        {"kind": "attention", "heads": 2}, B.Structure(grid=(4,)), 4, 3, {}, "layer"), True),
    "GraphAttentionConv": (lambda: _gat(edge_dim=2), True),
    "GraphAttentionConv-v2": (lambda: _gat(v2=True, share_weights=False, edge_dim=2), True),
    "GraphAttentionConv-transformer": (lambda: _gat(transformer=True, beta=True, edge_dim=2),
                                       True),
    "GraphAttentionConv-relations": (lambda: declared.GraphAttentionConv(
        {"kind": "graph_attention", "edge_dim": 3, "relations": "embedding"},
        B.Structure(edge_index=EI, num_nodes=5, edge_type=ET, num_relations=2), 3, 4, {},
        "layer"), True),
    "Block": (lambda: declared.Block(declared.declared_conv(B.Grid((4,), 3), 2, 2, {}),
                                     {"norm": "layer"}, 2), True),
    "StructNet": (lambda: sc_models.build_model(validate(parse_config(_NET)), TinyImages()), True),
}


MAKERS.update(MODEL_MAKERS)
MAKERS["FeedForward"] = (lambda: FeedForward(3, 5, dropout=0.1, out_width=2), True)

#: exported modules without weights of their own (bases of layers, weightless terms)
NO_WEIGHTS = {"SparseDropout", "GridAvgPool", "PyGCompatible", "GraphConvolution", "Mechanism",
              "PerHead", "QueryDot", "IndexTerm", "HeadDot", "ALiBi",
              # a base class (its subclasses are the blocks with weights), a pooling layer,
              # a mechanism on projected inputs
              "PreNormBlock", "Pool", "KeyDot"}


def _state(m: nn.Module) -> dict:
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def _perturb(m: nn.Module) -> None:
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)


@pytest.mark.parametrize("name", list(MAKERS))
def test_reset_parameters_draws_the_fresh_layer_again(name):
    make, exact = MAKERS[name]
    torch.manual_seed(3)
    m = make()
    fresh = _state(m)
    assert fresh, f"{name} has no parameters"
    params = dict(m.named_parameters())
    _perturb(m)
    torch.manual_seed(3)
    m.reset_parameters()
    after = dict(m.named_parameters())
    assert after.keys() == fresh.keys()
    for n, p in after.items():
        assert p is params[n]  # the same Parameter objects (optimizers keep theirs)
        assert p.shape == fresh[n].shape and p.dtype == fresh[n].dtype
        assert p.device == fresh[n].device
        if exact:
            assert torch.equal(p, fresh[n]), f"{name}.{n} differs from the fresh layer's"
    # the reset's values depend on the seed alone, not on the values it replaces
    drawn = _state(m)
    _perturb(m)
    torch.manual_seed(3)
    m.reset_parameters()
    for n, p in m.named_parameters():
        assert torch.equal(p, drawn[n]), f"{name}.{n} keeps something of its perturbation"


@pytest.mark.parametrize("name", ["Convolution", "MultiheadAttention", "TransformerLM",
                                  "Seq2Seq", "GATConv", "DotProduct", "PervasiveAttention"])
def test_reset_parameters_keeps_dtype(name):
    m = MAKERS[name][0]().double()
    m.reset_parameters()
    assert all(p.dtype == torch.float64 for p in m.parameters())


def test_a_perturbed_weight_is_drawn_again_not_kept():
    # the test above can fail: a reset that forgets a parameter keeps its perturbation
    m = sc.nn.MultiheadAttention(4, 2)
    torch.manual_seed(0)
    want = _state(sc.nn.MultiheadAttention(4, 2))
    with torch.no_grad():
        m.out_proj.weight.add_(1.0)
    torch.manual_seed(0)
    m.reset_parameters()
    torch.testing.assert_close(m.out_proj.weight, want["out_proj.weight"], rtol=0, atol=0)


def _exported_layers() -> dict[str, type]:
    out = {}
    for pkg in (sc.nn, at, sc_models):
        for info in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            for n in getattr(mod, "__all__", []):
                o = getattr(mod, n)
                if inspect.isclass(o) and issubclass(o, nn.Module):
                    out[o.__name__] = o
    return out


def test_every_exported_layer_with_weights_is_covered():
    covered = {type(MAKERS[k][0]()).__name__ for k in MAKERS}
    missing = sorted(n for n, cls in _exported_layers().items()
                     if n not in covered and n not in NO_WEIGHTS)
    assert not missing, f"add these to MAKERS (or NO_WEIGHTS): {missing}"
    lacking = sorted(n for n, cls in _exported_layers().items()
                     if not hasattr(cls, "reset_parameters") and n not in NO_WEIGHTS)
    assert not lacking, f"these layers have no reset_parameters: {lacking}"


def test_glorot_convolution_keeps_the_seeded_values_of_glorot_over_the_default():
    # the recipes' GCN / R-GCN layers: a seed gives what Glorot over a default layer gave
    A = sc.basis.Grid((5,), 3)
    torch.manual_seed(1)
    ref = sc.nn.Convolution(A, 3, 4)
    sc.params.glorot_(ref.param.weight)
    torch.manual_seed(1)
    m = sc.nn.Convolution(A, 3, 4, init="glorot")
    torch.testing.assert_close(m.param.weight, ref.param.weight, rtol=0, atol=0)
    assert not m.bias.any()
    with pytest.raises(ValueError, match="init must be one of"):
        sc.nn.Convolution(A, 3, 4, init="xavier")

"""Declared ``graph_attention`` layers (configs): GAT with edge features, GATv2 and
TransformerConv mechanisms against PyG's layers holding the same weights (float64), featureless
inputs, relation types as edge features, and the config checks of the table."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from structconv import basis as B
from structconv.config import ConfigError, parse_config
from structconv.models import build_model
from structconv.models.declared import GraphAttentionConv
from structconv.sampling import Block
from structconv.training import load_data

pyg = pytest.importorskip("torch_geometric.nn", reason="PyG is the reference of these layers")

DT = torch.float64
N, P, Q, D = 11, 5, 3, 4


pytestmark = pytest.mark.usefixtures("float64")  # every test here runs in float64


def _graph(seed: int, into_all: bool = False):
    """A random directed graph over N nodes: duplicate edges, an existing self loop twice, and
    nodes N-2, N-1 without incoming edges (unless ``into_all``); edge features (E, D)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N - 2, (2, 30), generator=g)
    ei = torch.cat([ei, torch.tensor([[3, 3, 1], [3, 3, 2]]), ei[:, :2]], 1)
    if into_all:
        ei = torch.cat([ei, torch.tensor([[0, 1], [N - 2, N - 1]])], 1)
    return ei, torch.randn(ei.shape[1], D, generator=g), torch.randn(N, P, generator=g)


def _layer(spec: dict, ei, ea=None, bias=False, edge_type=None, R=None, Pin=P):
    ctx = B.Structure(edge_index=ei, num_nodes=N, edge_attr=ea, edge_type=edge_type,
                      num_relations=R)
    torch.manual_seed(0)
    return GraphAttentionConv({"kind": "graph_attention", **spec}, ctx, Pin, Q,
                              {"bias": bias}, "model.layers.0.basis")


def _heads(w, H):
    """PyG's projection weight (H*Q, P) as a theta (H, P, Q)."""
    return w.view(H, Q, -1).transpose(1, 2)


def _check(mine, ref_fn, x, sum_heads: int | None):
    """Values and the input's gradient: ours (summed heads) against PyG's (concat, summed)."""
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a = mine(x1.unsqueeze(0))[0]
    b = ref_fn(x2)
    if sum_heads:
        b = b.view(N, sum_heads, Q).sum(1)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(a)
    (a * w).sum().backward()
    (b * w).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("fill", ["mean", "add", 0.5, "max", "min", "mul"])
@pytest.mark.parametrize("H", [1, 3])
def test_gat_with_edge_features_equals_pyg(fill, H):
    ei, ea, x = _graph(1)
    ref = pyg.GATConv(P, Q, heads=H, edge_dim=D, fill_value=fill, bias=False)
    m = _layer({"heads": H, "edge_dim": D, "fill_value": fill}, ei, ea)
    with torch.no_grad():
        m.param.weight.copy_(_heads(ref.lin.weight, H))
        m.scores.mu.copy_(ref.att_src.view(H, Q))
        m.scores.nu.copy_(ref.att_dst.view(H, Q))
        # PyG's att_edge · lin_edge folded into one (H, D) map: the layer's own parameter
        m.edge_term.weight.copy_(torch.einsum("hcd,hc->hd", ref.lin_edge.weight.view(H, Q, D),
                                              ref.att_edge.view(H, Q)))
    _check(m, lambda v: ref(v, ei, ea), x, H)


def test_gat_without_self_loops_and_edge_dim_auto():
    ei, ea, x = _graph(2)
    ref = pyg.GATConv(P, Q, heads=2, edge_dim=D, add_self_loops=False, bias=False)
    m = _layer({"heads": 2, "edge_dim": "auto", "add_self_loops": False}, ei, ea)
    with torch.no_grad():
        m.param.weight.copy_(_heads(ref.lin.weight, 2))
        m.scores.mu.copy_(ref.att_src.view(2, Q))
        m.scores.nu.copy_(ref.att_dst.view(2, Q))
        m.edge_term.weight.copy_(torch.einsum("hcd,hc->hd", ref.lin_edge.weight.view(2, Q, D),
                                              ref.att_edge.view(2, Q)))
    _check(m, lambda v: ref(v, ei, ea), x, 2)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("H", [1, 2])
@pytest.mark.parametrize("edges", [False, True])
def test_v2_equals_pyg_gatv2(share, H, edges):
    ei, ea, x = _graph(3)
    ref = pyg.GATv2Conv(P, Q, heads=H, edge_dim=D if edges else None, bias=False,
                        share_weights=share, fill_value="add")
    spec = {"heads": H, "v2": True, "share_weights": share}
    if edges:
        spec.update(edge_dim=D, fill_value="add")
    m = _layer(spec, ei, ea)
    with torch.no_grad():
        m.param.weight.copy_(_heads(ref.lin_l.weight, H))
        if not share:
            m.target.weight.copy_(_heads(ref.lin_r.weight, H))
        m.scores.att.copy_(ref.att.view(H, Q))
        if edges:
            m.scores.edge_weight.copy_(ref.lin_edge.weight)
    _check(m, lambda v: ref(v, ei, ea if edges else None), x, H)


def _copy_transformer(m, ref, H):
    with torch.no_grad():
        m.param.weight.copy_(_heads(ref.lin_value.weight, H))
        for mine, theirs in ((m.key, ref.lin_key), (m.query, ref.lin_query),
                             (m.lin_edge, ref.lin_edge), (m.skip, ref.lin_skip),
                             (m.beta, ref.lin_beta)):
            if mine is not None:
                mine.load_state_dict(theirs.state_dict())


@pytest.mark.parametrize("root,beta", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("edges", [False, True])
def test_transformer_equals_pyg_transformerconv(root, beta, edges):
    # PyG's value bias is added to every message: it equals a layer bias where every node has
    # incoming edges; without biases, nodes without incoming edges keep the root term alone
    for into_all, bias in ((False, False), (True, True)):
        ei, ea, x = _graph(4, into_all)
        ref = pyg.TransformerConv(P, Q, heads=1, edge_dim=D if edges else None, beta=beta,
                                  root_weight=root, bias=bias)
        spec = {"transformer": True, "root_weight": root}
        if edges:
            spec["edge_dim"] = D
        if root:
            spec["beta"] = beta
        m = _layer(spec, ei, ea, bias=bias)
        _copy_transformer(m, ref, 1)
        if bias:
            with torch.no_grad():
                m.bias.copy_(ref.lin_value.bias)
        _check(m, lambda v, ref=ref, ei=ei, ea=ea if edges else None: ref(v, ei, ea), x, None)


def test_transformer_heads_add_up_as_pyg_concatenated():
    ei, ea, x = _graph(5)
    ref = pyg.TransformerConv(P, Q, heads=3, edge_dim=D, root_weight=False, bias=False)
    m = _layer({"transformer": True, "heads": 3, "edge_dim": D, "root_weight": False}, ei, ea)
    _copy_transformer(m, ref, 3)
    _check(m, lambda v: ref(v, ei, ea), x, 3)


@pytest.mark.parametrize("spec", [
    {"heads": 2, "edge_dim": D},
    {"heads": 2, "edge_dim": D, "v2": True},
    {"heads": 2, "edge_dim": D, "transformer": True, "beta": True},
])
def test_featureless_input_reads_the_weights_rows(spec):
    ei, ea, _ = _graph(6)
    m = _layer(spec, ei, ea, bias=True, Pin=N)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    eye = torch.eye(N)
    torch.testing.assert_close(m.featureless(), m(eye.unsqueeze(0))[0], rtol=1e-12, atol=1e-12)
    # a block over a subset of the nodes: its inputs are the rows' one-hots
    rows = torch.tensor([4, 0, 7, 2, 9])
    keep = torch.isin(ei[1], rows[:3]) & torch.isin(ei[0], rows)
    local = torch.full((N,), -1, dtype=torch.long)
    local[rows] = torch.arange(rows.numel())
    blk = Block(local[ei[:, keep]], rows.numel(), 3, keep.nonzero().squeeze(1))
    torch.testing.assert_close(m.featureless(blk, rows), m(eye[rows].unsqueeze(0), blk)[0],
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", [{}, {"v2": True}, {"transformer": True}])
def test_relation_types_as_one_hot_or_embedded_edge_features(mode):
    ei, _, x = _graph(7)
    R = 3
    et = torch.randint(0, R, (ei.shape[1],), generator=torch.Generator().manual_seed(8))
    hot = _layer({"edge_dim": "auto", **mode}, ei, edge_type=et, R=R)
    given = _layer({"edge_dim": R, **mode}, ei, ea=F.one_hot(et, R).to(DT))
    given.load_state_dict(hot.state_dict())
    torch.testing.assert_close(hot(x[None]), given(x[None]), rtol=1e-12, atol=1e-12)
    emb = _layer({"edge_dim": 2, "relations": "embedding", **mode}, ei, edge_type=et, R=R)
    table = _layer({"edge_dim": 2, **mode}, ei, ea=emb.embed.weight.detach()[et])
    table.load_state_dict({k: v for k, v in emb.state_dict().items() if "embed" not in k})
    torch.testing.assert_close(emb(x[None]), table(x[None]), rtol=1e-12, atol=1e-12)
    # the relations' vectors are learned: gradients reach them through the mechanism
    emb(x[None]).square().sum().backward()
    assert emb.embed.weight.grad is not None and emb.embed.weight.grad.abs().sum() > 0


KARATE = """
[data]
name = "karate"
[[model.layers]]
basis = { kind = "graph_attention", %s }
channels = "classes"
"""


@pytest.mark.parametrize("table,match", [
    ('heads = 2, edgedim = 3', r"unknown key 'edgedim' in a graph_attention table \(known: "),
    ('v2 = true, transformer = true', "v2 and transformer are two mechanisms: choose one"),
    ('share_weights = true', "share_weights applies to v2 = true only"),
    ('beta = true', "beta applies to transformer = true only"),
    ('transformer = true, root_weight = false, beta = true', "beta gates the root term"),
    ('transformer = true, negative_slope = 0.1', "negative_slope is GAT's LeakyReLU"),
    ('edge_dim = 0', r"edge_dim must be an int >= 1 or \"auto\""),
    ('edge_dim = "all"', r"edge_dim must be an int >= 1 or \"auto\""),
    ('fill_value = "mean"', "fill_value describes edge features: it needs edge_dim"),
    ('relations = "onehot"', "relations describes edge features: it needs edge_dim"),
    ('edge_dim = 3, relations = "learned"', "relations must be onehot or embedding"),
    ('edge_dim = "auto", relations = "embedding"', "give edge_dim as an int"),
    ('edge_dim = 3, fill_value = "median"', "fill_value must be a number or one of mean"),
    ('edge_dim = 3, add_self_loops = false, fill_value = 0.0', "but the layer adds none"),
    ('edge_dim = 3, transformer = true, fill_value = 0.0', "but the layer adds none"),
    ('heads = 0', "heads must be an int >= 1"),
    ('dropout = 1.0', r"dropout must be in \[0, 1\)"),
    ('v2 = 1', "v2 must be true or false"),
])
def test_bad_graph_attention_tables_name_the_key(table, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(KARATE % table)


def test_edge_features_the_data_lacks_or_mismatches_are_named_at_build():
    cfg = parse_config(KARATE % 'edge_dim = 3')
    data = load_data(cfg)
    with pytest.raises(ConfigError, match=r"model.layers.0.basis: edge_dim = 3 reads edge "
                                          r"features, but the data has none"):
        build_model(cfg, data)
    feats = dataclasses.replace(data, edge_attr=torch.randn(data.edge_index.shape[1], 5))
    with pytest.raises(ConfigError, match=r"edge_dim = 3 but the data's edge features are "
                                          r"\(156, 5\): use edge_dim = 5"):
        build_model(cfg, feats)
    assert build_model(parse_config(KARATE % 'edge_dim = "auto"'), feats)(
        feats.x.float()).shape == (34, data.num_classes)
    with pytest.raises(ConfigError, match="relations applies to edge types, but the data has "
                                          "edge features"):
        build_model(parse_config(KARATE % 'edge_dim = 5, relations = "onehot"'), feats)
    typed = dataclasses.replace(data, edge_type=torch.zeros(156, dtype=torch.long),
                                num_relations=2)
    with pytest.raises(ConfigError, match="one-hot relation features have edge_dim = R = 2, "
                                          "got edge_dim = 3"):
        build_model(cfg, typed)

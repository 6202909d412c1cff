"""Relation-aware attention: RGATConv against PyG's RGATConv (float64), its identities with
R-GCN and GAT, the per-edge-target mechanism, and the relational-attention recipe (quick)."""

import json
from argparse import Namespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv import attention as at
from structconv.experiments import relational_attention as ra
from structconv.models.relational_attention import RGAT, RelationGATScores, RGATConv
from tests.conftest import need

pyg = pytest.importorskip("torch_geometric.nn", reason="PyG is the reference of RGATConv")

DT = torch.float64
N, P, C, R = 13, 5, 3, 4


pytestmark = pytest.mark.usefixtures("float64")  # every test here runs in float64


def _graph(seed: int, n: int = N, e: int = 40, r: int = R):
    """Random directed edges over n - 2 nodes (the last two without incoming edges), a self
    loop twice, duplicates; types in [0, r); features (n, P)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 2, (2, e), generator=g)
    ei = torch.cat([ei, torch.tensor([[3, 3, 5], [3, 3, 4]]), ei[:, :3]], 1)
    et = torch.randint(0, r, (ei.shape[1],), generator=g)
    et[-3:] = et[:3]  # duplicates keep their relation
    return ei, et, torch.randn(n, P, generator=g)


def _from_pyg(ref, H: int, concat: bool, bases, attention: str) -> RGATConv:
    """Our layer holding the weights of PyG's ``ref``, whose query and key kernels are made
    per head (block-diagonal): PyG's q / k then are ν / μ."""
    m = RGATConv(P, C, R, heads=H, concat=concat, num_bases=bases, attention=attention)
    with torch.no_grad():
        ref.bias.normal_()
        eye = torch.eye(H).view(H, 1, H)
        q, k = ref.q.view(H, C, H), ref.k.view(H, C, H)
        q.mul_(eye)
        k.mul_(eye)
        if bases is None:
            m.param.weight.copy_(ref.weight)
        else:
            m.param.channel.copy_(ref.basis)
            m.param.basis_coef.copy_(ref.att.T)
        m.att_dst.copy_(torch.einsum("hch->hc", q))
        m.att_src.copy_(torch.einsum("hch->hc", k))
        m.bias.copy_(ref.bias)
    return m


@pytest.mark.parametrize("attention", ["within", "across"])
@pytest.mark.parametrize("bases", [None, 2])
@pytest.mark.parametrize("H,concat", [(1, True), (3, True), (3, False)])
def test_rgatconv_equals_pyg(attention, bases, H, concat):
    ei, et, x = _graph(0)
    ref = pyg.RGATConv(P, C, R, num_bases=bases, heads=H, concat=concat,
                       attention_mechanism=f"{attention}-relation")
    m = _from_pyg(ref, H, concat, bases, attention)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, (b, (_, alpha)) = m(x1, ei, et), ref(x2, ei, et, return_attention_weights=True)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # nodes 11, 12 have no incoming edge: the bias alone, as PyG's
    torch.testing.assert_close(a[-2:], m.bias.expand(2, -1), rtol=0, atol=0)
    w = torch.randn_like(a)
    (a * w).sum().backward()
    (b * w).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-11, atol=1e-12)
    # the weights: each target's edges sum to one within each relation (WIRGAT) or overall
    group = et * N + ei[1] if attention == "within" else ei[1]
    sums = torch.zeros(R * N, H).index_add_(0, group, alpha)
    assert torch.allclose(sums[torch.unique(group)], torch.ones(1, dtype=DT))


def test_featureless_equals_identity_features_and_dropout_only_in_training():
    ei, et, _ = _graph(1)
    for attention in ("within", "across"):
        m = RGATConv(N, C, R, heads=2, num_bases=3, attention=attention, dropout=0.5)
        m.eval()
        torch.testing.assert_close(m(None, ei, et), m(torch.eye(N), ei, et), rtol=1e-12,
                                   atol=1e-12)
        m.train()
        torch.manual_seed(0)
        a = m(None, ei, et)
        torch.manual_seed(1)
        assert not torch.allclose(a, m(None, ei, et))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), r=st.integers(1, 4), e=st.integers(0, 30))
def test_uniform_attention_within_relations_is_rgcn_mean(seed, r, e):
    """μ = ν = 0: every score equal, WIRGAT's weights are 1/|N_r(n)|: R-GCN's mean
    aggregation (sc.nn.RGCNConv without root weight), duplicates counted alike."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, 7, (2, e), generator=g)
    et = torch.randint(0, r, (e,), generator=g)
    x = torch.randn(7, P, generator=g)
    m = RGATConv(P, C, r, attention="within", bias=False)
    ref = sc.nn.RGCNConv(P, C, r, root_weight=False, bias=False)
    with torch.no_grad():
        m.att_src.zero_()
        m.att_dst.zero_()
        ref.param.weight.copy_(m.param.weight)
    torch.testing.assert_close(m(x, ei, et), ref(x, ei, et), rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), heads=st.integers(1, 3), e=st.integers(0, 30))
def test_one_relation_is_gat_either_way(seed, heads, e):
    """With a single relation WIRGAT and ARGAT normalise over the same edges: both are GAT
    (sc.nn.GATConv without added self loops, heads concatenated)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, 7, (2, e), generator=g)
    et = torch.zeros(e, dtype=torch.long)
    x = torch.randn(7, P, generator=g)
    gat = sc.nn.GATConv(P, C, heads=heads, add_self_loops=False)
    with torch.no_grad():
        gat.bias.normal_()
    for attention in ("within", "across"):
        m = RGATConv(P, C, 1, heads=heads, attention=attention)
        with torch.no_grad():
            m.param.weight.copy_(gat.lin.weight.t().unsqueeze(0))
            m.att_src.copy_(gat.att_src.view(heads, C))
            m.att_dst.copy_(gat.att_dst.view(heads, C))
            m.bias.copy_(gat.bias)
        torch.testing.assert_close(m(x, ei, et), gat(x, ei), rtol=1e-12, atol=1e-12)


def test_relation_scores_dense_equal_edge_scores_and_the_graph_basis():
    g = torch.Generator().manual_seed(3)
    M, Nt, K = 6, 4, 2
    h = torch.randn(M, K, C, generator=g)
    t = torch.randn(M, Nt, K, C, generator=g)  # every pair's target projection
    ei = torch.tensor([[0, 1, 5, 2, 2, 3], [0, 0, 1, 3, 1, 1]])
    mech = RelationGATScores(K, C)
    dense = mech(h, Nt, t)  # (K, M, N)
    on_edges = mech.edge_scores(h, Nt, ei, t[ei[0], ei[1]])
    torch.testing.assert_close(on_edges, dense[:, ei[0], ei[1]].T, rtol=1e-12, atol=1e-12)
    soft = at.Softmax(at.LeakyReLU(at.GraphMasked(mech, ei)))
    graph = at.attention_basis(soft, h, Nt, edge_attr=t[ei[0], ei[1]])
    # the dense chain: scores of every pair, the graph as a log mask, softmax over inputs
    torch.testing.assert_close(graph.to_dense(), soft(h, Nt, t), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"targets' projections as edge_attr \(6, 2, 3\)"):
        mech.edge_scores(h, Nt, ei, t[:5, 0])


def test_bad_inputs_are_named():
    ei, et, x = _graph(4)
    m = RGATConv(P, C, R)
    with pytest.raises(ValueError, match=r"edge types must lie in \[0, 4\)"):
        m(x, ei, et + 1)
    with pytest.raises(ValueError, match=r"edge_type must be \(46,\) to match edge_index"):
        m(x, ei, et[:-1])
    with pytest.raises(ValueError, match=r"RGATConv expects x \(M, 5\) or None"):
        m(x[:, :4], ei, et)
    with pytest.raises(ValueError, match="attention must be one of"):
        RGATConv(P, C, R, attention="both")
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        RGATConv(P, C, R, dropout=1.0)


def test_a_new_graph_in_the_same_tensor_is_not_served_from_the_cache():
    ei, et, x = _graph(5)
    m = RGATConv(P, C, R)
    m(x, ei, et)
    ei2, et2, _ = _graph(6)
    ei[:, :] = ei2  # the same storage, other edges
    et[:] = et2
    fresh = RGATConv(P, C, R)
    fresh.load_state_dict(m.state_dict())
    torch.testing.assert_close(m(x, ei, et), fresh(x, ei2, et2), rtol=1e-12, atol=1e-12)


def test_rgat_self_relation_within_is_a_root_weight():
    """WIRGAT's self relation has one edge per node: its weight is 1, so the node's own
    projection enters as R-GCN's root term."""
    ei, et, _ = _graph(7)
    net = RGAT(ei, et, N, R, 4, 2, attention="within")
    assert net.edge_type.max() == R and net.edge_index.shape[1] == ei.shape[1] + N
    with torch.no_grad():
        net.conv1.att_src.zero_()
        net.conv1.att_dst.zero_()
    ref = sc.nn.RGCNConv(N, 4, R, bias=False)
    with torch.no_grad():
        ref.param.weight.copy_(net.conv1.param.weight[:R])
        ref.root.copy_(net.conv1.param.weight[R])
    torch.testing.assert_close(net.conv1(None, net.edge_index, net.edge_type),
                               ref(None, ei, et) + net.conv1.bias, rtol=1e-12, atol=1e-12)


def test_recipe_quick_runs_resumes_and_keeps_the_test_set_out_of_tuning(tmp_path, capsys):
    torch.set_default_dtype(torch.float32)
    root = str(need("aifb"))
    base = dict(dataset="aifb", seeds=10, seed=0, data=root, out=str(tmp_path), epochs=None,
                quick=True, threads=1, heads=None, attention=None, bases=None, relations=None,
                edge_dim=None, device="cpu")
    base.update(ra.QUICK)  # what the command line's --quick makes of the defaults
    for model in ra.MODELS:
        args = Namespace(**base, model=model, val=0.0)
        assert ra.run(args) == 0
        path = next(tmp_path.glob(f"relational-attention-aifb-{model}-*quick.json"))
        res = json.loads(path.read_text())
        assert res["seeds"] == 2 and [r["seed"] for r in res["runs"]] == [0, 1]
        assert res["graph"]["nodes"] == 8285 and res["graph"]["train"] == 140
        assert res["rgcn"]["mean"] == 97.22 and res["published_rgcn"] == 95.83
        for r in res["runs"]:
            assert len(r["train_loss"]) == 5 and r["train_loss"][-1] < r["train_loss"][0]
            assert 0 <= r["test_acc"] <= 100
        # a second run finds both seeds done: nothing is trained again (no run file rewritten)
        done = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("seed-*/*") if p.is_file()}
        assert len(done) > 2
        assert ra.run(args) == 0
        assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("seed-*/*")
                if p.is_file() and p in done} == done
        assert json.loads(path.read_text())["runs"] == res["runs"]
    tune = Namespace(**{**base, "quick": True}, model="rgat", val=0.2)
    assert ra.run(tune) == 0
    res = json.loads(next(tmp_path.glob("*rgat-*-val0.2-quick.json")).read_text())
    assert res["split"] == "val" and res["graph"]["train"] == 112 and res["graph"]["val"] == 28
    assert all("test_acc" not in r and "val_acc" in r for r in res["runs"])

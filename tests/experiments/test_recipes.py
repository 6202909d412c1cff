"""Graph models against PyG's layers (float64) and smoke tests of the training recipes."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv.models.graph as mg
from structconv.cli import main
from structconv.config import config_from, load_config
from structconv.data.registry import GraphData
from structconv.experiments import planetoid as rp
from structconv.experiments import rgcn as rr
from structconv.models.build import build_model
from structconv.training.distributed import World
from structconv.training.loop import Loop
from structconv.training.run import make_optimizer
from structconv.training.tasks import NodeTask
from tests.conftest import need
from tests.conftest import stop_at as _stop_at

pyg = pytest.importorskip("torch_geometric.nn")

N, F_IN, HID, C = 13, 5, 4, 3


@pytest.fixture
def graph():
    g = torch.Generator().manual_seed(0)
    # random directed edges with duplicates and self loops; nodes 11 and 12 isolated
    ei = torch.randint(0, 11, (2, 40), generator=g)
    ei = torch.cat([ei, torch.tensor([[3, 3, 5], [3, 4, 4]])], 1)
    x = torch.randn(N, F_IN, generator=g, dtype=torch.float64)
    return ei, x


pytestmark = pytest.mark.usefixtures("float64")  # every test here runs in float64


def test_gcn_layer_equals_pyg(graph):
    ei, x = graph
    m = mg.GCN(ei, N, F_IN, HID, C).eval()
    ref = pyg.GCNConv(F_IN, HID)
    ref.lin.weight.data = m.conv1.param.weight[0].T.clone()
    ref.bias.data = torch.randn(HID)
    m.conv1.bias.data = ref.bias.data.clone()
    torch.testing.assert_close(m.conv1(x), ref(x, ei), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_cheb_layer_equals_pyg(graph, K):
    ei, x = graph
    m = mg.ChebNet(ei, N, F_IN, HID, C, K=K).eval()
    ref = pyg.ChebConv(F_IN, HID, K)
    for k in range(K):
        ref.lins[k].weight.data = m.conv1.param.weight[k].T.clone()
    ref.bias.data = m.conv1.bias.data.clone()
    torch.testing.assert_close(m.conv1(x), ref(x, ei), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("K", [1, 2, 3])
def test_sgc_equals_pyg(graph, K):
    ei, x = graph
    m = mg.SGC(ei, N, F_IN, C, K=K)
    ref = pyg.SGConv(F_IN, C, K=K)
    ref.lin.weight.data = m.conv.param.weight[0].T.clone()
    ref.lin.bias.data = m.conv.bias.data.clone()
    torch.testing.assert_close(m(x), ref(x, ei), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bases", [None, 2])
def test_rgcn_layer_equals_pyg(graph, bases):
    ei, x = graph
    R = 4
    et = torch.randint(0, R, (ei.shape[1],), generator=torch.Generator().manual_seed(1))
    m = mg.RGCN(ei, et, N, R, HID, C, num_bases=bases, in_channels=F_IN)
    ref = pyg.RGCNConv(F_IN, HID, R, num_bases=bases, aggr="mean")
    layer = m.conv1
    if bases is None:
        ref.weight.data = layer.conv.param.weight.data.clone()
    else:
        ref.weight.data = layer.conv.param.channel.data.clone()
        ref.comp.data = layer.conv.param.basis_coef.data.T.clone()
    ref.root.data = layer.root.param.weight[0].clone()
    ref.bias.data = torch.randn(HID)
    layer.root.bias.data = ref.bias.data.clone()
    torch.testing.assert_close(layer(x), ref(x, ei, et), rtol=1e-12, atol=1e-12)
    # featureless nodes: the same layer on one-hot features, without forming the identity
    m2 = mg.RGCN(ei, et, N, R, HID, C, num_bases=bases)
    torch.testing.assert_close(m2.conv1(None), m2.conv1(torch.eye(N)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m2(), m2.conv2(torch.relu(m2.conv1(torch.eye(N)))))


def test_featureless_gradient():
    ei = torch.tensor([[0, 1, 2, 2, 4, 4], [1, 2, 0, 3, 3, 3]])
    et = torch.tensor([0, 1, 0, 1, 1, 1])
    conv = mg.RGCN(ei, et, 5, 2, 3, 2).conv1.conv
    A = conv.basis.to_dense()  # (K, M, N)
    G = torch.randn(5, 3)
    y = mg.featureless_convolve(conv)
    torch.testing.assert_close(y, torch.einsum("kmn,kmq->nq", A, conv.param.weight))
    (y * G).sum().backward()
    # d/dΘ_k of <Σ_k A_kᵀ Θ_k, G> is A_k G
    torch.testing.assert_close(conv.param.weight.grad, A @ G)


def test_gat_equals_pyg(graph):
    ei, x = graph
    m = mg.GAT(ei, N, F_IN, HID, C, heads=3, out_heads=2, dropout=0.0).eval()
    for conv, ref, inp in ((m.conv1, pyg.GATConv(F_IN, HID, heads=3), x),
                           (m.conv2, pyg.GATConv(3 * HID, C, heads=2, concat=False),
                            torch.randn(N, 3 * HID, dtype=torch.float64))):
        ref.lin.weight.data = conv.lin.weight.data.clone()
        ref.att_src.data = conv.att_src.data.clone()
        ref.att_dst.data = conv.att_dst.data.clone()
        ref.bias.data = torch.randn_like(ref.bias)
        conv.bias.data = ref.bias.data.clone()
        torch.testing.assert_close(conv(inp, m.edge_index), ref(inp, ei), rtol=1e-12,
                                   atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.integers(1, 4), st.integers(0, 30), st.integers(0, 2**16))
def test_relational_basis_is_a_mean(n, R, E, seed):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, E), generator=g)
    et = torch.randint(0, R, (E,), generator=g)
    A = mg.relational_basis(ei, et, n, R).to_dense()
    assert A.shape == (R, n, n)
    # A[r, m, n] = (# edges m -> n of type r) / (# edges of type r into n)
    cnt = torch.zeros(R, n, n)
    cnt.index_put_((et, ei[0], ei[1]), torch.ones(E), accumulate=True)
    into = cnt.sum(1, keepdim=True)
    torch.testing.assert_close(A, torch.where(into > 0, cnt / into.clamp(min=1), 0.0))


def test_input_dropout():
    drop = mg.InputDropout(0.5)
    x = torch.zeros(200, 50)
    x[::3, ::2] = torch.rand(67, 25) + 0.5
    torch.manual_seed(0)
    y = drop(x)
    kept = y != 0
    assert not (kept & (x == 0)).any()  # zeros stay zero
    torch.testing.assert_close(y[kept], 2 * x[kept])  # survivors rescaled by 1 / (1 - p)
    frac = kept.sum() / (x != 0).sum()
    assert 0.4 < float(frac) < 0.6
    x[0, 1] = 7.0  # an in-place change of the input invalidates the cached non-zeros
    assert float(drop(x)[0, 1]) in (0.0, 14.0)
    drop.eval()
    assert drop(x) is x
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\), got 1.5"):
        mg.InputDropout(1.5)


def test_model_input_errors():
    ei = torch.tensor([[0, 5], [1, 2]])
    with pytest.raises(ValueError, match=r"node ids in \[0, 5\] but num_nodes=4"):
        mg.GCN(ei, 4, 3, 2, 2)
    with pytest.raises(ValueError, match=r"edge_type must be \(2,\)"):
        mg.relational_basis(ei, torch.zeros(3, dtype=torch.long), 6, 1)
    with pytest.raises(ValueError, match=r"edge_type ids must be < num_relations=2, got max 3"):
        mg.relational_basis(ei, torch.tensor([0, 3]), 6, 2)
    with pytest.raises(ValueError, match="K .* must be a positive int"):
        mg.SGC(ei, 6, 3, 2, K=0)


# ------------------------------------------------------------------------------- recipes
def _toy_data() -> GraphData:
    # two noisy communities whose features carry the class: every model should fit them
    g = torch.Generator().manual_seed(0)
    n = 40
    y = torch.arange(n) % 2
    same = y[:, None] == y[None, :]
    adj = (torch.rand(n, n, generator=g) < torch.where(same, 0.3, 0.02)).triu(1)
    src, dst = adj.nonzero().T
    ei = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1)
    x = torch.rand(n, 6, generator=g) + 0.5 * torch.nn.functional.one_hot(y, 6)
    masks = {k: torch.zeros(n, dtype=torch.bool) for k in ("train", "val", "test")}
    masks["train"][:10], masks["val"][10:20], masks["test"][20:] = True, True, True
    return GraphData("toy", x.float(), y, ei, masks, 2)


def _fit_toy(graph: dict, **train) -> tuple[dict, dict]:
    """(the loop's state, the result) of a [model.graph] model trained on the toy graph by
    the engine's loop (no run directory)."""
    cfg = config_from({"data": {"name": "cora"}, "model": {"graph": graph},
                       "train": {"checkpoint_seconds": 0.0, **train}})
    data = _toy_data()
    torch.manual_seed(0)
    model = build_model(cfg, data)
    task = NodeTask(cfg, data)
    task.setup(model, torch.device("cpu"), World())
    loop = Loop(task, model, make_optimizer(cfg, model), cfg["train"], seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 40 nodes: more threads only contend
    try:
        loop.fit()
        return loop.state, loop.finish(1)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("graph", [
    {"kind": "gcn"}, {"kind": "cheb", "K": 3}, {"kind": "sgc"},
    {"kind": "gat", "hidden": 4, "heads": 2}, {"kind": "heads", "heads": 2, "hops": 2,
                                                "hidden": 4}])
def test_recipe_models_train_on_the_engine(graph):
    # without dropout, so that the loss curve is the optimisation's, not the masks' draw
    graph = {**graph, "dropout": 0.0} if graph["kind"] != "sgc" else graph
    state, res = _fit_toy(graph, lr=0.2 if graph["kind"] == "sgc" else 0.01, weight_decay=5e-4,
                          epochs=30,
                          select="acc_then_loss", decay="first" if graph["kind"] in
                          ("gcn", "cheb") else "all")
    losses = [h["train_loss"] for h in state["history"]]
    assert losses[-1] < 0.8 * losses[0]
    assert 1 <= res["best_epoch"] <= 30 and 0 <= res["test_acc"] <= 1
    # the kept epoch has the best validation accuracy, the lowest loss among its ties
    best = max((h["val_acc"], -h["val_loss"]) for h in state["history"])
    kept = state["history"][res["best_epoch"] - 1]
    assert (kept["val_acc"], -kept["val_loss"]) == best


def test_recipe_settings():
    assert rp.settings("cheb", "citeseer")["K"] == 2
    assert rp.settings("cheb", "cora")["K"] == 3
    assert rp.settings("sgc", "citeseer")["weight_decay"] == 5e-3
    assert rp.settings("gcn", "cora", epochs=7)["epochs"] == 7
    assert rp.settings("gat", "cora", stopping="gat")["select"] == "gat"
    with pytest.raises(ValueError, match="unknown model 'mlp'"):
        rp.settings("mlp", "cora")
    mutag = load_config(rr.CONFIG, rr.PER_DATASET["mutag"])
    assert rr.settings(mutag)["num_bases"] == 30
    assert rr.settings(load_config(rr.CONFIG))["num_bases"] is None


def test_planetoid_recipe_smoke(tmp_path, capsys):
    args = Namespace(model="gcn", dataset="cora", seeds=1, seed=0, data=str(need("cora")),
                     out=str(tmp_path), epochs=15, quick=True, threads=1)
    assert rp.run(args) == 0
    res = json.loads((tmp_path / "planetoid-gcn-cora.json").read_text())
    assert res["seeds"] == 1 and res["published"] == 81.5 and len(res["runs"]) == 1
    losses = res["runs"][0]["train_loss"]
    assert len(losses) == 15 and losses[-1] < losses[0]
    assert res["runs"][0]["epochs_run"] == 15 and res["config"] == "planetoid_gcn"
    assert "Cora" in capsys.readouterr().out


def test_rgcn_recipe_smoke(tmp_path):
    args = Namespace(dataset="aifb", seeds=1, seed=0, data=str(need("aifb")),
                     out=str(tmp_path), epochs=4, bases=None, cache=str(tmp_path / "cache"),
                     quick=True, threads=1)
    assert rr.run(args) == 0
    res = json.loads((tmp_path / "rgcn-aifb.json").read_text())
    assert res["graph"]["nodes"] == 8285 and res["graph"]["relations"] == 90
    losses = res["runs"][0]["train_loss"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert len(res["runs"][0]["sort_norms"]) == 90
    # no validation split: the last epoch's model, evaluated on the test entities only
    run = json.loads(next(tmp_path.glob("rgcn-aifb-*/seed-0/result.json")).read_text())
    assert run["val_acc"] is None and run["best_epoch"] == 0 and run["epochs"] == 4


def test_gat_stopping_rule_stops_and_selects():
    state, res = _fit_toy({"kind": "sgc"}, epochs=300, patience=5, select="gat", lr=2.0,
                          weight_decay=0.05)
    # a large step and strong decay saturate the toy problem at once: 5 epochs in which
    # neither validation loss nor accuracy improves end the run
    assert len(state["history"]) < 300 and state["stopped"]
    assert 1 <= res["best_epoch"] <= len(state["history"]) - 5


def test_an_interrupted_planetoid_sweep_resumes_to_the_same_numbers(monkeypatch, tmp_path):
    need("cora")
    argv = ["reproduce", "planetoid", "--model", "sgc", "--quick", "--epochs", "4"]
    assert main([*argv, "--out", str(tmp_path / "ref")]) == 0
    with monkeypatch.context() as m:
        _stop_at(m, 6)  # seed 0 takes 4 steps (one per epoch): seed 1, epoch 2
        assert main([*argv, "--out", str(tmp_path / "run")]) == 130
    seed1 = next((tmp_path / "run").glob("planetoid-sgc-cora-*")) / "seed-1"
    assert (seed1 / "checkpoint.json").is_file() and not (seed1 / "result.json").exists()
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    ref, run = (json.loads((tmp_path / d / "planetoid-sgc-cora.json").read_text())
                for d in ("ref", "run"))
    for key in ("test_acc", "val_acc", "epoch", "last_test_acc", "train_loss"):
        assert [r[key] for r in run["runs"]] == [r[key] for r in ref["runs"]], key

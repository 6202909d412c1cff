"""The schema keys the node recipes run on: ``[model.graph]`` (a paper's node classifier),
``train.decay`` (L2 on the first layer) and ``train.select`` (which epoch's weights a run keeps),
each validated by name and doing what it says in the loop."""

from __future__ import annotations

import math

import pytest
import torch

from structconv.config import ConfigError, config_from
from structconv.data.registry import GraphData
from structconv.models.build import build_model
from structconv.training.loop import judge
from structconv.training.run import make_optimizer
from structconv.training.tasks import NodeTask


def _cfg(graph=None, **train) -> dict:
    model = {"graph": graph} if graph is not None else \
        {"layers": [{"basis": "gcn", "channels": 4, "activation": "relu"},
                    {"basis": "gcn", "channels": "classes"}]}
    return config_from({"data": {"name": "cora"}, "model": model, "train": train})


def _graph(val: bool = True) -> GraphData:
    g = torch.Generator().manual_seed(1)
    n = 12
    ei = torch.randint(0, n, (2, 30), generator=g)
    et = torch.randint(0, 3, (30,), generator=g)
    masks = {k: torch.zeros(n, dtype=torch.bool) for k in ("train", "val", "test")}
    masks["train"][:6], masks["test"][9:] = True, True
    masks["val"][6:9] = val
    return GraphData("toy", torch.rand(n, 5, generator=g), torch.arange(n) % 3, ei, masks, 3,
                     et, 3, relations=["a", "b", "c"])


@pytest.mark.parametrize("graph,match", [
    ({"kind": "mlp"}, "model.graph.kind must be one of gcn"),
    ({"kind": "sgc", "hidden": 8}, "model.graph.hidden does not apply to kind = 'sgc'"),
    ({"kind": "gcn", "hidden": 0}, r"model.graph.hidden must be an int in 1..4096, got 0"),
    ({"kind": "gcn", "hidden": 10**6}, r"model.graph.hidden must be an int in 1..4096"),
    ({"kind": "gat", "heads": 0}, "model.graph.heads must be >= 1 for kind = 'gat'"),
    ({"kind": "heads", "heads": 0, "hops": 0}, "needs attention heads or index hops"),
    ({"kind": "rgat", "attention": "both"}, "model.graph.attention must be within or across"),
    ({"kind": "gcn", "dropout": 1.0}, r"model.graph.dropout must be in \[0, 1\)"),
    ({"kind": "gcn", "width": 3}, "model.graph: unknown key 'width'"),
    ({"kind": "rgcn", "param": "lowrank"}, "model.graph.param must be one of auto, full"),
    ({"kind": "rgcn", "param": "separable"}, "param = 'separable' needs bases = H >= 1"),
    ({"kind": "rgcn", "param": "depthwise", "bases": 2}, "param = 'depthwise' takes no bases"),
    ({"kind": "gcn", "param": "full"}, "model.graph.param does not apply to kind = 'gcn'"),
])
def test_a_bad_graph_table_is_refused_by_name(graph, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(graph)


@pytest.mark.parametrize("key,value", [("decay", "second"), ("select", "best")])
def test_bad_decay_and_select_are_refused_by_name(key, value):
    with pytest.raises(ConfigError, match=f"train.{key} must be one of .* got '{value}'"):
        _cfg(**{key: value})


@pytest.mark.parametrize("graph", [{"kind": "gcn", "hidden": 4}, {"kind": "cheb", "K": 2},
                                   {"kind": "sgc"}, {"kind": "gat", "hidden": 2, "heads": 2},
                                   {"kind": "rgcn", "bases": 2}, {"kind": "rgat", "hidden": 4},
                                   {"kind": "heads", "heads": 1, "hops": 2, "hidden": 2}])
def test_every_graph_kind_builds_and_maps_the_nodes_to_logits(graph):
    data = _graph()
    model = build_model(_cfg(graph), data).eval()
    with torch.no_grad():
        x = data.x if graph["kind"] not in ("rgcn", "rgat") else torch.zeros(12, 0)
        out = model(x)
    assert out.shape == (12, 3) and torch.isfinite(out).all()


def test_rgcn_param_names_the_relational_weights_form():
    from structconv.params import ControlledSeparable, DepthwiseSeparable, Full

    data = _graph()

    def built(**graph):
        torch.manual_seed(0)
        return build_model(_cfg({"kind": "rgcn", "hidden": 4, **graph}), data)

    kinds = {"full": Full, "depthwise": DepthwiseSeparable, "separable": ControlledSeparable}
    for form, cls in kinds.items():
        net = built(param=form, bases=2 if form == "separable" else 0)
        for conv in (net.conv1.conv, net.conv2.conv):
            assert type(conv.param) is cls, form
    dw = built(param="depthwise").conv1.conv.param  # K P + P Q: per-relation scales, one map
    assert sum(p.numel() for p in dw.parameters()) == 3 * 12 + 12 * 4
    # "auto" is what a table without param always meant: separable with bases, else full
    for bases, form in ((2, "separable"), (0, "full")):
        a, b = built(bases=bases).state_dict(), built(bases=bases, param=form).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_decay_first_puts_l2_on_the_first_layer_only():
    data = _graph()
    for cfg in (_cfg({"kind": "gcn", "hidden": 4}, decay="first", weight_decay=0.1),
                _cfg(decay="first", weight_decay=0.1)):  # declared layers: blocks[0]
        model = build_model(cfg, data)
        first, rest = make_optimizer(cfg, model).param_groups
        assert first["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
        assert {id(p) for p in first["params"]} == {id(p) for p in
                                                    model.first_layer_parameters()}
        assert len(first["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_judge_keeps_the_epochs_each_rule_names():
    rows = [{"val_acc": 0.5, "val_loss": 1.0}, {"val_acc": 0.5, "val_loss": 0.9},
            {"val_acc": 0.6, "val_loss": 1.2}, {"val_acc": 0.6, "val_loss": 1.3},
            {"val_acc": 0.55, "val_loss": 1.4}]

    def walk(select, monitor="val_acc"):
        best, kept, progress = None, [], []
        for i, row in enumerate(rows):
            keep, better, best = judge(select, monitor, row, best)
            kept += [i] if keep else []
            progress.append(better)
        return kept, progress

    assert walk("monitor") == ([0, 2], [True, False, True, False, False])
    assert walk("monitor", "val_loss") == ([0, 1], [True, True, False, False, False])
    # ties in accuracy go to the lower loss
    assert walk("acc_then_loss") == ([0, 1, 2], [True, True, True, False, False])
    # both matching or beating their best to keep; either doing so is progress (rows 2, 3:
    # accuracy at its best, loss not)
    assert walk("gat") == ([0, 1], [True, True, True, True, False])
    assert judge("gat", "val_acc", rows[3], [0.6, 0.9])[2] == [0.6, 0.9]
    assert judge("acc_then_loss", "val_acc", {"val_acc": 0.1, "val_loss": math.inf},
                 None)[0]


def test_select_last_needs_no_validation_nodes():
    data = _graph(val=False)
    cfg = _cfg({"kind": "gcn", "hidden": 4}, select="last")
    model = build_model(cfg, data)
    task = NodeTask(cfg, data)
    task.setup(model, torch.device("cpu"), task.world)
    assert task.validate(model, 1, False) is None
    res = task.result(model, True)
    assert res["val_acc"] is None and 0 <= res["test_acc"] <= 1
    with pytest.raises(ConfigError, match="the val split of toy is empty"):
        NodeTask(_cfg({"kind": "gcn", "hidden": 4}), data).validate(model, 1, False)

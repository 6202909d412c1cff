"""[train.sampler]: sampled mini-batch training of declared models, its configs and DDP; the
synthetic graph; bench scale and the sampled-cora recipe at smoke sizes."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch
from safetensors.torch import load_file

from structconv.cli import main
from structconv.config import ConfigError, load_config, parse_config
from structconv.data.registry import DatasetError, load_dataset, split_options
from structconv.data.synthetic import synthetic_graph
from structconv.models import build_model
from structconv.training import load_data, train
from structconv.training.minibatch import (
    SampledEval,
    StepLoader,
    batch_inputs,
    make_loader,
    restrictions,
)
from tests.conftest import metric_rows as _rows
from tests.conftest import need, run_cli

MIXED = """
[data]
name = "karate"
[model]
dtype = "float64"
[[model.layers]]
basis = "gcn"
channels = 8
activation = "relu"
[[model.layers]]
basis = { kind = "chebyshev", K = 3 }
channels = 8
activation = "relu"
residual = true
[[model.layers]]
type = "linear"
channels = 8
[[model.layers]]
basis = { kind = "graph_attention", heads = 2 }
channels = "classes"
[train.sampler]
fanouts = ["all", ["all", "all"], "all"]
batch_size = 5
"""

RELATIONAL = """
[data]
name = "karate"
[model]
dtype = "float64"
[[model.layers]]
basis = { kind = "sgc", hops = 2 }
channels = 8
activation = "relu"
[[model.layers]]
basis = { kind = "relational", sorts = [[0], [0, 0]] }
channels = "classes"
[train.sampler]
fanouts = [-1, "all"]
batch_size = 7
"""

# graph attention reading edge features: the data's (GAT, GATv2, TransformerConv with its beta
# gate), and relation types (one-hot, a learned embedding) on featureless nodes
EDGES = """
[data]
name = "karate"
[model]
dtype = "float64"
[[model.layers]]
basis = { kind = "graph_attention", heads = 2, edge_dim = 3, fill_value = "add" }
channels = 8
activation = "relu"
[[model.layers]]
basis = { kind = "graph_attention", heads = 2, edge_dim = "auto", v2 = true }
channels = 8
activation = "relu"
[[model.layers]]
basis = { kind = "graph_attention", edge_dim = 3, transformer = true, beta = true }
channels = "classes"
[train.sampler]
fanouts = ["all", "all", "all"]
batch_size = 5
"""

RELATION_FEATURES = """
[data]
name = "karate"
[model]
dtype = "float64"
[[model.layers]]
basis = { kind = "graph_attention", heads = 2, edge_dim = "auto" }
channels = 8
activation = "relu"
[[model.layers]]
basis = { kind = "graph_attention", edge_dim = 2, relations = "embedding", v2 = true }
channels = "classes"
[train.sampler]
fanouts = [-1, "all"]
batch_size = 6
"""


def _one_line(capsys, argv, expect):
    assert main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("structconv: error: "), err
    assert expect in err[0], err[0]


def test_bad_sampler_configs_exit_2_with_one_line(capsys, tmp_path):
    base = ["train", "--config", "gcn_karate_sampled", "--out", str(tmp_path / "r")]
    for over, expect in (
            ("train.sampler.fanouts=[3]", "fanouts has 1 entries but the model has 2 graph"),
            ("train.sampler.fanouts=[3, 3, 3]", "fanouts has 3 entries"),
            ("train.sampler.fanouts=[0, 3]", "fanouts[0] must be a positive int, -1"),
            ("train.sampler.fanouts=[[2, 2], 3]", "fanouts[0] [2, 2] lists 2 hops but "
                                                  "model.layers.1 consumes 1"),
            ("train.sampler.batch_size=0", "train.sampler.batch_size must be an int in [1,"),
            ("train.sampler.workers=-1", "train.sampler.workers must be an int in [0,"),
            ("train.sampler.degrees=\"some\"", "degrees must be full or sample"),
            ("train.sampler.bogus=1", "train.sampler: unknown key 'bogus'"),
            ("train.sampler=3", "train.sampler must be a table")):
        _one_line(capsys, base + [over], expect)
    # a graph model on image data; an image model with a sampler
    _one_line(capsys, base + ['data.name="digits"'], "dataset 'digits' is a image task")
    _one_line(capsys, ["train", "--config", "cnn_digits", "--out", str(tmp_path / "c"),
                       "train.sampler={fanouts = [2]}"], "basis 'grid', which cannot be sampled")
    assert not (tmp_path / "r").exists()


def _forward_error(text: str, data_edit=None) -> tuple[float, float]:
    cfg = parse_config(text)
    data = load_data(cfg)
    if data_edit is not None:
        data = data_edit(data)
    torch.manual_seed(0)
    model = build_model(cfg, data).eval()
    restr = restrictions(model, cfg, data)
    x = torch.zeros(data.num_nodes, 0) if data.x is None else data.x
    full = model(x.double())
    loader = make_loader(cfg, data, restr, torch.float64)
    assert len(loader) >= 2
    err = max((model(*batch_inputs(b, torch.float64)) - full[b.seeds]).abs().max().item()
              for b in loader)
    cfg["data"]["eval_batch_size"] = 6
    lw = SampledEval(model, cfg, data).layerwise("cpu")
    return err, (lw - full).abs().max().item()


def test_fanout_all_and_layerwise_equal_the_full_forward():
    # gcn, chebyshev (2 hops), a pointwise layer, residual and graph attention (blocks)
    assert max(_forward_error(MIXED)) < 1e-12
    # featureless input (theta's rows gathered), sgc over 2 hops, a 2-step relational sort
    featureless = lambda d: dataclasses.replace(  # noqa: E731
        d, x=None, edge_type=torch.zeros(d.edge_index.shape[1], dtype=torch.long))
    assert max(_forward_error(RELATIONAL, featureless)) < 1e-12


def test_fanout_all_equals_full_forward_with_edge_features():
    # each block's edges read their features by Block.edge_ids, the self loops' from them
    def features(d):
        g = torch.Generator().manual_seed(0)
        return dataclasses.replace(d, edge_attr=torch.randn(d.edge_index.shape[1], 3,
                                                            generator=g, dtype=torch.float64))

    assert max(_forward_error(EDGES, features)) < 1e-12

    def relations(d):
        g = torch.Generator().manual_seed(1)
        return dataclasses.replace(d, x=None, num_relations=3, edge_type=torch.randint(
            0, 3, (d.edge_index.shape[1],), generator=g))

    assert max(_forward_error(RELATION_FEATURES, relations)) < 1e-12


def test_step_loader_deals_the_same_batches_to_any_world():
    ei = torch.randint(0, 50, (2, 300), generator=torch.Generator().manual_seed(0))
    kw = dict(input_nodes=torch.arange(0, 50, 2), batch_size=4, shuffle=True, seed=3)

    def steps(W, A):
        out = []
        for r in range(W):
            L = StepLoader(ei, 50, [2], rank=r, world_size=W, accumulate=A, **kw)
            p = L.plan(1)
            out.append([p[s * A:(s + 1) * A] for s in range(L.steps())])
        return [sorted(i for rank in out for pair in rank[s] for i in pair[0].tolist())
                for s in range(len(out[0]))]

    ref = steps(1, 6)  # 7 batches: the last step wraps around to the first
    assert len(ref) == 2 and steps(2, 3) == ref and steps(3, 2) == ref and steps(6, 1) == ref


def test_sampled_train_resume_matches_uninterrupted(tmp_path):
    over = ["train.epochs=6", "train.checkpoint_every=1", 'train.sampler.eval="layerwise"']
    cfg = load_config("gcn_karate_sampled", over)
    res = train(cfg, tmp_path / "ref")
    assert train(cfg, tmp_path / "run", stop_after=3) == {"interrupted": True, "epoch": 3,
                                                          "run": str(tmp_path / "run")}
    again = train(None, tmp_path / "run", resume=True)
    assert _rows(tmp_path / "run") == _rows(tmp_path / "ref")
    assert again["test_acc"] == res["test_acc"] and again["val_loss"] == res["val_loss"]
    a, b = load_file(tmp_path / "run" / "best.safetensors"), \
        load_file(tmp_path / "ref" / "best.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the loss went down: the sampled steps train
    rows = _rows(tmp_path / "ref")
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_sampled_ddp_two_processes_match_one_process_on_the_same_batches(tmp_path):
    # 8 training seeds in batches of 3: 3 batches, so the 2-process run's last step wraps
    over = ["train.epochs=3", 'model.dtype="float64"', "train.sampler.batch_size=3",
            "model.layers.1.dropout=0.3"]
    r = run_cli("train", "--config", "gcn_karate_sampled", *over, "--nproc", "2",
                "--out", tmp_path / "ddp")
    assert r.returncode == 0, r.stderr
    # one process taking both ranks' batches in each step
    cfg = load_config("gcn_karate_sampled", over + ["train.sampler.accumulate=2"])
    single = train(cfg, tmp_path / "one")
    ddp = json.loads((tmp_path / "ddp" / "result.json").read_text())
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    a, b = _rows(tmp_path / "ddp"), _rows(tmp_path / "one")
    for x, y in zip(a, b, strict=True):
        for k in ("train_loss", "val_loss", "train_acc", "val_acc"):
            assert x[k] == pytest.approx(y[k], rel=1e-10, abs=1e-12), (k, x, y)
    wa, wb = load_file(tmp_path / "ddp" / "best.safetensors"), \
        load_file(tmp_path / "one" / "best.safetensors")
    assert all(torch.allclose(wa[k], wb[k], rtol=1e-9, atol=1e-12) for k in wa)
    # without accumulation a single process takes other (smaller) steps
    plain = load_config("gcn_karate_sampled", over)
    train(plain, tmp_path / "plain")
    assert _rows(tmp_path / "plain")[0]["val_loss"] != a[0]["val_loss"]


def test_synthetic_graph_sizes_signal_and_reproducibility():
    d = load_dataset("synthetic:nodes=2000,edges=20001,classes=4,features=6,seed=3")
    assert d.edge_index.shape == (2, 20000) and d.x.shape == (2000, 6) and d.num_classes == 4
    assert d.edge_index.dtype == torch.long and 0 <= int(d.edge_index.min()) and \
        int(d.edge_index.max()) < 2000
    # both directions of every pair
    half = d.edge_index[:, :10000]
    assert torch.equal(d.edge_index[:, 10000:], half.flip(0))
    masks = d.masks
    assert int(masks["train"].sum() + masks["val"].sum() + masks["test"].sum()) == 2000
    assert not (masks["train"] & masks["test"]).any()
    same = (d.y[d.edge_index[0]] == d.y[d.edge_index[1]]).double().mean().item()
    assert abs(same - (0.8 + 0.2 / 4)) < 0.02  # p_in, plus the random ends that land inside
    # features carry the label: nearest class mean beats chance by far
    means = torch.stack([d.x[d.y == c].mean(0) for c in range(4)])
    acc = (torch.cdist(d.x, means).argmin(1) == d.y).double().mean().item()
    assert acc > 0.4
    again = synthetic_graph(nodes=2000, edges=20001, classes=4, features=6, seed=3)
    assert torch.equal(again.edge_index, d.edge_index) and torch.equal(again.x, d.x)
    other = synthetic_graph(nodes=2000, edges=20001, classes=4, features=6, seed=4)
    assert not torch.equal(other.edge_index, d.edge_index)


def test_synthetic_graph_scales_with_edges_not_nodes_squared():
    # 1M nodes: a dense N x N temporary would need 4 TB
    t0 = time.perf_counter()
    d = synthetic_graph(nodes=1_000_000, edges=1_000_000, features=2)
    assert d.edge_index.shape == (2, 1_000_000) and time.perf_counter() - t0 < 20


def test_synthetic_graph_bad_sizes_and_options():
    with pytest.raises(DatasetError, match=r"need about .* GiB .* more than the .* available"):
        load_dataset("synthetic:nodes=100000000000,edges=100000000000")
    for name, msg in (("synthetic:nodes=1", "nodes must be an int >= 2"),
                      ("synthetic:nodes=10,classes=20", "classes \\(20\\) must be at most"),
                      ("synthetic:p_in=2", "p_in must be a number in \\[0, 1\\]"),
                      ("synthetic:nodes", "key=value pairs")):
        with pytest.raises(ValueError, match=msg):
            load_dataset(name)
    with pytest.raises(ValueError, match="given both in the name and in data.options"):
        load_dataset("synthetic:nodes=100", nodes=200)
    assert split_options("synthetic:nodes=1_000,p_in=0.5,x=true") == \
        ("synthetic", {"nodes": 1000, "p_in": 0.5, "x": True})
    with pytest.raises(TypeError):
        load_dataset("synthetic:bogus=1")


def test_sampled_training_on_the_synthetic_graph_learns():
    cfg = load_config("gcn_karate_sampled", [
        'data.name="synthetic:nodes=3000,edges=30000,features=8"', "train.epochs=3",
        "train.sampler.batch_size=256", "train.sampler.fanouts=[5, 5]", "train.lr=0.05",
        'train.sampler.eval="layerwise"', "data.eval_batch_size=1000"])
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        res = train(cfg, tmp)
    assert res["test_acc"] > 0.5  # 8 classes: chance is 0.125


def test_bench_scale_quick_runs(tmp_path, capsys):
    assert main(["bench", "scale", "--quick", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "scale.json").read_text())
    for kind in ("gcn", "sage"):
        m = r["models"][kind]
        assert m["sampled"]["procs1"]["seeds_per_s"] > 0
        assert 0 < m["sampled"]["procs1"]["sampler_share"] < 1
        assert m["sampled"]["procs2"]["seeds"] == 2 * m["sampled"]["procs1"]["seeds"]
        assert m["full_batch"]["step_s"] > 0
    assert r["peak_rss_mib"] > r["graph_mib"]


def test_sampled_cora_recipe_smoke(tmp_path, capsys):
    need("cora")
    assert main(["reproduce", "sampled-cora", "--quick", "--seeds", "1", "--epochs", "2",
                 "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "sampled-cora.json").read_text())
    assert set(r["summary"]) == {"full_batch", "fanout_all", "fanout_10_10"}
    assert all(len(v) == 1 for v in r["runs"].values())
    # one engine run directory per (variant, seed); a second call reads them back, untrained
    done = sorted(tmp_path.glob("sampled-cora-*/*/result.json"))
    assert sorted(p.parent.name for p in done) == \
        ["fanout_10_10-seed-0", "fanout_all-seed-0", "full_batch-seed-0"]
    stamp = {p: p.stat().st_mtime_ns for p in done}
    assert main(["reproduce", "sampled-cora", "--quick", "--seeds", "1", "--epochs", "2",
                 "--out", str(tmp_path)]) == 0
    assert {p: p.stat().st_mtime_ns for p in stamp} == stamp
    again = json.loads((tmp_path / "sampled-cora.json").read_text())
    assert {v: [x["test_acc"] for x in rs] for v, rs in again["runs"].items()} == \
        {v: [x["test_acc"] for x in rs] for v, rs in r["runs"].items()}


def test_memory_estimate_counts_a_mini_batch_not_the_graph():
    from structconv.models import memory_estimate

    name = 'data.name="synthetic:nodes=20000,edges=100000,features=8"'
    full = load_config("gcn_karate", [name])
    sampled = load_config("gcn_karate_sampled", [name, "train.sampler.batch_size=10"])
    data = load_data(full)
    a, b = memory_estimate(full, data), memory_estimate(sampled, data)
    # 10 seeds x (1 + 3)^2 = 160 of 20,000 nodes
    assert b["activations"] == pytest.approx(a["activations"] * 160 / 20000, rel=0.02)
    every = load_config("gcn_karate_sampled", [name, 'train.sampler.fanouts=["all", 3]'])
    assert memory_estimate(every, data)["activations"] == a["activations"]


def test_config_error_is_raised_for_a_sampled_lm():
    with pytest.raises(ConfigError, match="a \\[model.lm\\] model has none"):
        parse_config('[data]\nname = "tinyshakespeare"\n[model.lm]\nwidth = 8\n'
                     '[train.sampler]\nfanouts = [2]')


def test_prefetch_trains_the_same_run_and_resumes_mid_epoch_exactly(tmp_path, monkeypatch):
    from structconv.training import TrainingInterrupted
    from tests.conftest import stop_at

    # 8 training seeds in batches of 3: 3 steps an epoch; dropout draws from each batch's seed
    over = ["train.epochs=3", 'model.dtype="float64"', "train.sampler.batch_size=3",
            "model.layers.1.dropout=0.3"]
    train(load_config("gcn_karate_sampled", over), tmp_path / "ref")
    ahead = load_config("gcn_karate_sampled", [*over, "train.sampler.prefetch=2"])
    train(ahead, tmp_path / "ahead")
    assert _rows(tmp_path / "ahead") == _rows(tmp_path / "ref")
    with monkeypatch.context() as m:
        stop_at(m, 5)  # inside epoch 2, with batches built ahead of the stop
        with pytest.raises(TrainingInterrupted):
            train(ahead, tmp_path / "run")
    train(None, tmp_path / "run", resume=True)
    assert _rows(tmp_path / "run") == _rows(tmp_path / "ref")
    a, b = (load_file(tmp_path / d / "best.safetensors") for d in ("run", "ref"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ConfigError, match="give one of them"):
        load_config("gcn_karate_sampled", ["train.sampler.prefetch=1", "train.sampler.workers=1"])

"""Hostile and corrupt input, generated here: refused with a clear error, never a crash.

(The start of issue 13's adversarial module: data files, weights, configs, run names.)
"""

import pickle
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from structconv.data.planetoid import _as_matrix, _edges, _unpickle


def _pickled(tmp_path: Path, obj, name="ind.cora.x") -> Path:
    p = tmp_path / name
    p.write_bytes(pickle.dumps(obj, protocol=2))
    return p


def _csr():
    return sp.csr_matrix(np.eye(4, 6, dtype=np.float32))


@pytest.mark.parametrize("corrupt,match", [
    (lambda m: m.indices.__setitem__(0, 2**30), r"column indices in \[1, 1073741824\]"),
    (lambda m: m.indices.__setitem__(0, -1), r"column indices in \[-1, 3\]"),
    (lambda m: m.indices.__setitem__(3, 6), r"column indices in \[0, 6\] outside \[0, 6\)"),
    (lambda m: m.indptr.__setitem__(2, 0), "non-decreasing"),
    (lambda m: m.indptr.__setitem__(4, 9), "indptr ends at 9"),
])
def test_inconsistent_sparse_matrices_are_refused(tmp_path, corrupt, match):
    m = _csr()
    corrupt(m)  # scipy does not check when arrays are edited in place
    p = _pickled(tmp_path, m)
    with pytest.raises(ValueError, match=rf"ind\.cora\.x: corrupt sparse matrix.*{match}"):
        _as_matrix(_unpickle(p, "x"), p, "x")


def test_consistent_sparse_matrix_loads():
    m = _csr()
    p = Path(__file__)  # any real file: its size bounds the expansion
    np.testing.assert_array_equal(_as_matrix(m, p, "x"), np.eye(4, 6, dtype=np.float32))


def test_a_matrix_far_larger_than_its_file_is_refused(tmp_path):
    m = sp.csr_matrix((40000, 30000), dtype=np.float32)  # 1.2e9 elements, no entries
    p = tmp_path / "ind.cora.x"
    p.write_bytes(b"x" * 300_000)  # what a 300 KB file may expand to is bounded by its size
    with pytest.raises(ValueError, match=r"would hold 1,200,000,000 elements from a file of "
                                         r"300,000 bytes"):
        _as_matrix(m, p, "x")


def test_nan_features_are_refused(tmp_path):
    p = _pickled(tmp_path, np.full((3, 3), np.nan, np.float32))
    with pytest.raises(ValueError, match="NaN or infinite"):
        _as_matrix(_unpickle(p, "x"), p, "x")


def test_graph_of_shared_references_is_refused_before_it_expands(tmp_path):
    big = list(range(5000))
    graph = {i: big for i in range(25000)}  # 1.25e8 edges; the pickle stores the list once
    p = _pickled(tmp_path, graph, "ind.cora.graph")
    assert p.stat().st_size < 200_000
    with pytest.raises(ValueError, match=r"the edge list would hold 125,000,000 elements"):
        _edges(_unpickle(p, "graph"), 25000, p)


# -------------------------------------------------------------------- caches never go stale
def _edit(kind, ei):
    if kind == "numpy":
        ei.numpy()[0, 0] = 2
    elif kind == "data":
        ei.data[1, 1] = 0
    else:  # through another tensor on the same storage (its own version counter)
        import torch

        torch.from_numpy(ei.numpy()).view(-1)[3] = 1


@pytest.mark.parametrize("kind", ["numpy", "data", "view"])
@pytest.mark.parametrize("layer", ["GCNConv", "GATConv", "ChebConv"])
def test_layer_caches_see_edits_that_bump_no_version(kind, layer):
    import torch

    import structconv as sc

    torch.manual_seed(0)
    ei = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
    x = torch.randn(5, 3)
    conv = {"GCNConv": lambda: sc.nn.GCNConv(3, 2), "GATConv": lambda: sc.nn.GATConv(3, 2),
            "ChebConv": lambda: sc.nn.ChebConv(3, 2, 2)}[layer]().eval()
    before = conv(x, ei)
    version = ei._version
    _edit(kind, ei)
    assert ei._version == version  # the edit went around the version counter
    after = conv(x, ei)
    fresh = conv(x, ei.clone())  # a new tensor: built from scratch
    torch.testing.assert_close(after, fresh)
    assert not torch.allclose(before, after)


def test_structure_cache_fingerprint_changes_with_content():
    import torch

    from structconv.basis.cache import GraphCache

    ei = torch.randint(0, 50, (2, 5000))
    fp = GraphCache.fingerprint((ei, None))
    assert GraphCache.same(fp, GraphCache.fingerprint((ei.clone(), None)))
    for i, j in [(0, 1), (7, 3000), (100, 4999)]:
        e = ei.clone()
        e[0, i], e[0, j] = ei[0, j], ei[0, i]  # an exchange of two entries
        if ei[0, i] != ei[0, j]:
            assert not GraphCache.same(GraphCache.fingerprint((e, None)), fp)
        e[1, i] += 1  # one entry changed
        assert not GraphCache.same(GraphCache.fingerprint((e, None)), fp)


@pytest.mark.parametrize("limit", [1 << 22, 0])  # a kept copy, then the checksum
def test_structure_cache_sees_every_edit_by_copy_and_by_checksum(limit, monkeypatch):
    import torch

    from structconv.basis import cache

    monkeypatch.setattr(cache, "COPY_LIMIT", limit)
    ei = torch.randint(0, 50, (2, 300))
    w = torch.rand(300)
    w[5] = float("nan")  # bitwise: a NaN weight still hits
    c = cache.GraphCache()
    calls = []

    def build():
        calls.append(1)
        return len(calls)

    assert c.get((ei, w), ("o",), build) == 1
    assert c.get((ei, w), ("o",), build) == 1
    assert c.hits == 1
    how = c.entries[next(iter(c.entries))][2]
    assert [h for h, _ in how] == (["copy", "copy"] if limit else ["sum", "sum"])
    ei.numpy()[1, 7] += 1  # around the version counter
    assert c.get((ei, w), ("o",), build) == 2
    w.numpy()[9] = 0.25
    assert c.get((ei, w), ("o",), build) == 3
    assert c.get((ei, w), ("o",), build) == 3


# ------------------------------------------------------- converters never silently differ
def test_converter_refuses_what_it_cannot_reproduce():
    import torch

    import structconv as sc

    pyg = pytest.importorskip("torch_geometric.nn")
    with pytest.raises(ValueError, match=r"flow='target_to_source' is not supported"):
        sc.nn.from_pyg(pyg.GATConv(4, 2, flow="target_to_source"))
    with pytest.raises(ValueError, match=r"aggr='mean' is not supported"):
        sc.nn.from_pyg(pyg.GATConv(4, 2, aggr="mean"))

    class Doubled(torch.nn.Conv2d):
        def forward(self, x):
            return 2 * super().forward(x)

    with pytest.raises(ValueError, match="Doubled subclasses Conv2d and overrides forward"):
        sc.nn.from_torch(Doubled(3, 4, 3))

    class MyGCN(pyg.GCNConv):
        def message(self, x_j, edge_weight):
            return 0.5 * super().message(x_j, edge_weight)

    with pytest.raises(ValueError, match="MyGCN subclasses GCNConv and overrides message"):
        sc.nn.from_pyg(MyGCN(4, 2))

    class Plain(torch.nn.Conv2d):  # a subclass that computes as its parent still converts
        pass

    m = Plain(3, 4, 3)
    x = torch.randn(1, 3, 6, 6)
    torch.testing.assert_close(sc.nn.from_torch(m)(x), m(x), rtol=1e-5, atol=1e-5)

    class PlainGCN(pyg.GCNConv):
        pass

    g = PlainGCN(4, 2).eval()
    xg, ei = torch.randn(5, 4), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    torch.testing.assert_close(sc.nn.from_pyg(g)(xg, ei), g(xg, ei), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------- smaller
def test_masked_softmax_never_nan():
    import torch

    from structconv.attention.masks import masked_softmax

    s = torch.tensor([[1.0, float("inf"), 2.0], [float("-inf")] * 3, [float("inf")] * 2 + [0.0],
                      [0.0, 1.0, 2.0]], requires_grad=True)
    p = masked_softmax(s, -1)
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p[0], torch.tensor([0.0, 1.0, 0.0]))
    torch.testing.assert_close(p[1], torch.zeros(3))
    torch.testing.assert_close(p[2], torch.tensor([0.5, 0.5, 0.0]))
    torch.testing.assert_close(p[3], torch.softmax(s[3].detach(), -1))
    p.sum().backward()
    assert torch.isfinite(s.grad).all()


def test_atomic_writes_get_an_ordinary_file_mode(tmp_path):
    import os

    from structconv.io import atomic_write_json

    atomic_write_json(tmp_path / "a.json", {"x": 1})
    (tmp_path / "b.json").write_text("{}")
    assert os.stat(tmp_path / "a.json").st_mode & 0o777 == os.stat(tmp_path / "b.json").st_mode \
        & 0o777


def test_negative_limit_is_refused():
    from structconv.data.images import _check_limit
    from structconv.data.registry import DatasetError

    with pytest.raises(DatasetError, match="limit must be an int >= 1"):
        _check_limit(-5)
    assert _check_limit(None) is False and _check_limit(3) is True


def test_graph_argument_types():
    import numpy as np
    import torch

    import structconv as sc

    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    ref = sc.basis.gcn(ei, 4).to_dense()
    for n in (np.int64(4), torch.tensor(4), 4):
        torch.testing.assert_close(sc.basis.gcn(ei, n).to_dense(), ref)
    with pytest.raises(TypeError, match="integer tensor, got dtype torch.bool"):
        sc.basis.gcn(ei.bool(), 4)
    for bad in (True, 4.0, torch.tensor(4.0), 0):
        with pytest.raises(ValueError, match="num_nodes must be a positive int"):
            sc.basis.gcn(ei, bad)


def _idx(path, arr, code):
    import gzip
    import struct

    import numpy as np

    arr = np.asarray(arr)
    head = bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    dt = {0x08: ">u1", 0x09: ">i1", 0x0D: ">f4"}[code]
    path.write_bytes(gzip.compress(head + arr.astype(dt).tobytes()))


@pytest.mark.parametrize("kind", ["nan_pixels", "label_minus_one", "label_ten"])
def test_mnist_values_are_checked(tmp_path, kind):
    import numpy as np

    from structconv.data.images import load_idx_images
    from structconv.data.registry import DatasetError

    for prefix, n in (("train", 30), ("t10k", 10)):
        imgs = np.zeros((n, 4, 4), np.float32)
        labels = np.arange(n) % 10
        if kind == "nan_pixels":
            imgs[1, 2, 2] = np.nan
            _idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", imgs, 0x0D)
        else:
            _idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", imgs.astype(np.uint8), 0x08)
        if kind == "label_minus_one":
            labels[3] = -1
            _idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", labels, 0x09)
        else:
            labels[3] = 10 if kind == "label_ten" else labels[3]
            _idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", labels, 0x08)
    match = "NaN or infinite pixels" if kind == "nan_pixels" else "labels must be integers 0..9"
    with pytest.raises(DatasetError, match=match):
        load_idx_images(tmp_path, "mnist", val=5)


@pytest.mark.parametrize("override,match", [
    (["train.lr=1e300"], "train.lr must be at most 1e+30"),
    # parameters that cannot be allocated: refused when the model is built, naming the bytes
    (["model.layers.0.channels=1000000000"], "its parameters do not fit in this machine"),
    # parameters that fit but a batch's activations do not: refused by the memory estimate
    (["data.batch_size=1000000"], "the model needs about"),
    (["data.batch_size=100000000"], "activations of a batch of 100000000"),
    (["data.batches_per_epoch=100000000"],
     "data.batches_per_epoch must be an int in [0, 1,000,000]"),
    (["model.layers.1.pool=3"], "pool must be avg, max or a table"),
    (['model.layers.1.pool={kind="max",stride=0}'], "stride must be an int >= 1"),
    (['model.layers.1.pool={kind="max",kernel_size=20}'], "max pooling over (8, 8)"),
    (['model.layers.1.pool={kind="avg",size=2}'], "unknown key(s) size"),
    (["model.readout=none", "model.classifier=false"], "an image task needs one per image"),
])
def test_absurd_configs_exit_2_with_one_line(tmp_path, capsys, override, match):
    from structconv.cli import main

    rc = main(["train", "--config", "cnn_digits", "train.epochs=1", *override, "--out",
               str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and match in err[0], err


def test_polynomial_order_is_bounded_in_configs(tmp_path, capsys):
    from structconv.cli import main

    cfg = tmp_path / "cheb.toml"
    cfg.write_text('name = "cheb"\n[data]\nname = "karate"\n[[model.layers]]\n'
                   'basis = { kind = "chebyshev", K = 1000000 }\nchannels = "classes"\n')
    rc = main(["train", "--config", str(cfg), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "K must be an int in [1, 1000], got 1000000" in err[0]


@pytest.mark.parametrize("pool", ["avg", "max"])
def test_pool_may_be_named_by_its_kind(tmp_path, capsys, pool):
    from structconv.cli import main

    rc = main(["train", "--config", "cnn_digits", "train.epochs=1", f'model.layers.1.pool="{pool}"',
               "--out", str(tmp_path / "r")])
    assert rc == 0, capsys.readouterr().err


def test_memory_estimate_counts_parameters_and_activations():
    from structconv.config import load_config, validate
    from structconv.models import memory_estimate
    from structconv.training import load_data

    cfg = validate(load_config("cnn_digits"))
    est = memory_estimate(cfg, load_data(cfg))
    # 9,930 parameters x (weights, grads, two Adam moments) in float32
    assert est["n_params"] == 9930 and est["params"] == 9930 * 4 * 4
    # per image: (1 in + 2 x 16) + (16 in + 2 x 32) channels over 64 cells, twice (grads), x 64
    assert est["activations"] == 2 * 64 * (64 * (1 + 32) + 64 * (16 + 64)) * 4


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A gcn_karate run stopped after 3 of 6 epochs: its directory to copy and corrupt."""
    from structconv.cli import main

    run = tmp_path_factory.mktemp("stopped") / "run"
    assert main(["train", "--config", "gcn_karate", "train.epochs=6", "train.checkpoint_every=1",
                 "--stop-after", "3", "--out", str(run)]) == 0
    return run


@pytest.mark.parametrize("edit,match", [
    (lambda o: o["param_groups"][0].__setitem__("lr", "fast"),
     r"param_groups\[0\].lr must be a finite"),
    (lambda o: o["param_groups"][0].__setitem__("lr", float("inf")),
     r"lr must be a finite number, got inf"),
    (lambda o: o["param_groups"][0].__setitem__("params", [99]), r"params must be \[0, 1, 2, 3\]"),
    (lambda o: o["param_groups"][0].__setitem__("betas", [0.9]), "betas must be a list of 2"),
    (lambda o: o["param_groups"][0].__setitem__("amsgrad", 3), "amsgrad must be a bool or null"),
    (lambda o: o["param_groups"][0].pop("eps"), r"param_groups\[0\] must have the keys"),
    (lambda o: o.__setitem__("param_groups", 5), "the optimizer field does not have"),
    (lambda o: o["scalars"].__setitem__("0.step", "x"),
     "state 0.step must be a tensor or a number"),
    (lambda o: o["scalars"].__setitem__("9.step", 1), "state for parameter 9"),
])
def test_corrupt_optimizer_metadata_is_named(tmp_path, capsys, stopped_run, edit, match):
    import json
    import shutil

    from structconv.cli import main

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    meta = json.loads((run / "checkpoint.json").read_text())
    edit(meta["optimizer"])
    (run / "checkpoint.json").write_text(json.dumps(meta))
    rc = main(["train", "--resume", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "corrupt optimizer metadata" in err[0]
    import re
    assert re.search(match, err[0]), err[0]


def test_eval_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    from structconv.cli import main

    rc = main(["eval", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not a run directory" in err[0], err
    assert "--resume" not in err[0]


# -- DDP faults: a lost rank ends the run in bounded time with one line ----------------------------
def _workers(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig,bound", [("SIGKILL", 60), ("SIGSTOP", 120)])
def test_a_lost_ddp_rank_is_named_and_resumable(tmp_path, sig, bound):
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    env = dict(os.environ, STRUCTCONV_DDP_TIMEOUT="5")
    p = subprocess.Popen([sys.executable, "-m", "structconv.cli", "train", "--config",
                          "gcn_karate", "train.epochs=100000", "train.checkpoint_every=1",
                          "--nproc", "2", "--out", str(run)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    victim = None
    try:
        t0 = time.monotonic()
        while not (run / "checkpoint.json").is_file():
            assert time.monotonic() - t0 < 60 and p.poll() is None, "the run did not start"
            time.sleep(0.05)
        kids = _workers(p.pid)
        assert len(kids) >= 2, kids
        victim = kids[-1]
        os.kill(victim, getattr(signal, sig))
        t1 = time.monotonic()
        _, err = p.communicate(timeout=bound)
        took = time.monotonic() - t1
    finally:
        # the whole group: a surviving worker holds the pipes, and communicate() would wait
        # for it forever
        if victim is not None and sig == "SIGSTOP":
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.communicate(timeout=30)
    lines = err.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, err
    assert "resume from the last checkpoint with: structconv train --resume" in lines[0]
    if sig == "SIGKILL":
        assert "killed by SIGKILL" in lines[0] and took < bound
    else:
        assert "stopped responding" in lines[0] and "STRUCTCONV_DDP_TIMEOUT" in lines[0]

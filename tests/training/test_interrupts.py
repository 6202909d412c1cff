"""Nothing lost (issue 25): a run stopped anywhere by SIGINT / SIGTERM checkpoints at the next batch
boundary and, resumed, ends exactly as an uninterrupted run; run directories are locked; the
smaller trainer defects (checkpoint files as --weights, mismatch messages, empty splits,
sampler workers, progress without a terminal)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import structconv as sc
from structconv.cli import main
from structconv.config import ConfigError, apply_overrides, load_config
from structconv.io import RunLock
from structconv.training import check_train_split, load_run, train
from structconv.training.checkpoint import CheckpointError
from structconv.training.interrupt import TrainingInterrupted
from tests.conftest import CLI, ENV
from tests.conftest import stop_at as _stop_at
from tests.training.test_link_train import _config as _link_config


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        for k in ("time_s", "items_per_s", "seconds"):
            r.pop(k, None)
    return rows


def _same_run(run: Path, ref: Path) -> None:
    assert _rows(run) == _rows(ref)
    a, b = load_file(run / "best.safetensors"), load_file(ref / "best.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = (json.loads((p / "result.json").read_text()) for p in (run, ref))
    for k in ("test_acc", "test_loss", "val_acc", "test_mrr", "val_mrr"):
        assert ra.get(k) == rb.get(k), k


def _interrupted_then_resumed(monkeypatch, cfg: dict, tmp_path: Path, k: int, tag: str):
    ref, run = tmp_path / f"ref-{tag}", tmp_path / f"run-{tag}"
    train(cfg, ref)
    with monkeypatch.context() as m:
        _stop_at(m, k)
        with pytest.raises(TrainingInterrupted) as e:
            train(cfg, run)
    assert e.value.exit_code == 130 and "resume with: structconv train --resume" in str(e.value)
    assert not (run / "result.json").exists() and (run / "checkpoint.json").is_file()
    train(None, run, resume=True)
    _same_run(run, ref)
    return str(e.value)


IMAGE = ["train.epochs=2", "data.options.limit=300", "data.batch_size=50",
         "model.layers.0.dropout=0.5", "train.checkpoint_seconds=1e9"]


@pytest.mark.parametrize("k,where", [(4, "epoch 1, step 4/5"), (5, "the end of epoch 1"),
                                     (8, "epoch 2, step 3/5")])
def test_image_run_stopped_anywhere_resumes_exactly(monkeypatch, tmp_path, k, where):
    cfg = apply_overrides(load_config("cnn_digits"), IMAGE)
    cfg["name"] = "cnn_digits"
    msg = _interrupted_then_resumed(monkeypatch, cfg, tmp_path, k, str(k))
    assert where in msg, msg


def test_text_and_node_runs_stopped_mid_epoch_resume_exactly(monkeypatch, tmp_path):
    lm = apply_overrides(load_config("transformer_python"), [
        "train.epochs=2", "data.batches_per_epoch=5", "data.batch_size=4", "data.seq_len=16",
        "model.lm.width=16", "model.lm.layers=1", "model.lm.heads=2", "model.lm.dropout=0.1",
        "train.checkpoint_seconds=1e9"])
    assert "step 3/5" in _interrupted_then_resumed(monkeypatch, lm, tmp_path, 3, "lm")
    node = apply_overrides(load_config("gcn_karate"), ["train.epochs=4",
                                                       "train.checkpoint_seconds=1e9"])
    assert "the end of epoch 2" in _interrupted_then_resumed(monkeypatch, node, tmp_path, 2,
                                                             "node")


def test_sampled_run_stopped_mid_epoch_resumes_exactly(monkeypatch, tmp_path):
    cfg = apply_overrides(load_config("gcn_karate_sampled"), [
        "train.epochs=3", "train.sampler.batch_size=2", "train.checkpoint_seconds=1e9"])
    msg = _interrupted_then_resumed(monkeypatch, cfg, tmp_path, 3, "sampled")
    assert "epoch 1, step 3/" in msg, msg


def test_link_run_stopped_mid_epoch_resumes_exactly(monkeypatch, tmp_path, kg):
    cfg = load_config(_link_config(kg, tmp_path, train_link='mode = "negative"'),
                      ["train.epochs=3", "train.checkpoint_seconds=1e9", "data.batch_size=16"])
    # the epoch generator also draws the negatives: it travels in the checkpoint
    msg = _interrupted_then_resumed(monkeypatch, cfg, tmp_path, 5, "link")
    assert "epoch 1, step 5/60" in msg, msg


def test_periodic_checkpoints_are_taken_inside_epochs(tmp_path):
    cfg = apply_overrides(load_config("cnn_digits"), IMAGE[:3] + ["train.checkpoint_seconds=0"])
    cfg["name"] = "cnn_digits"
    train(cfg, tmp_path / "run", stop_after=1)
    ck = json.loads((tmp_path / "run" / "checkpoint.json").read_text())
    assert ck["epoch"] == 1 and "partial" not in ck["trainer"]  # stop-after: at the epoch's end
    # a due checkpoint after every step of epoch 2: the latest is mid-epoch 2
    with pytest.raises(TrainingInterrupted):
        with pytest.MonkeyPatch.context() as m:
            _stop_at(m, 4)
            train(None, tmp_path / "run", resume=True)
    ck = json.loads((tmp_path / "run" / "checkpoint.json").read_text())
    assert ck["trainer"]["partial"]["epoch"] == 2 and ck["file"].endswith("-000004.safetensors")


def test_stop_after_leaves_a_resumable_run(tmp_path):
    cfg = apply_overrides(load_config("gcn_karate"), ["train.epochs=4",
                                                      "train.checkpoint_seconds=1e9"])
    assert train(cfg, tmp_path / "run", stop_after=2) == {"interrupted": True, "epoch": 2,
                                                          "run": str(tmp_path / "run")}
    train(None, tmp_path / "run", resume=True)
    train(cfg, tmp_path / "ref")
    _same_run(tmp_path / "run", tmp_path / "ref")


def _sigint_default():
    # a script's background job ignores SIGINT: the child takes the default back
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(path: Path, proc, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if path.is_file() and path.read_text().strip():
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} did not appear (exit {proc.poll()})")


def test_ctrl_c_at_the_command_line_saves_and_says_how_to_resume(tmp_path):
    over = ["train.epochs=3", "data.options.limit=1200", "data.batch_size=8",
            "model.layers.0.dropout=0.5", "train.checkpoint_seconds=1e9"]
    run = tmp_path / "run"
    proc = subprocess.Popen(CLI + ["train", "--config", "cnn_digits", *over, "--out", str(run)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_sigint_default)
    # epoch 1 is done: stop inside epoch 2 (150 steps of a few ms each; no sleep, which a quiet
    # machine would outrun)
    _wait_for(run / "metrics.jsonl", proc)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1].strip().splitlines()
    assert proc.returncode == 130, err
    assert len(err) == 1 and "interrupted by SIGINT at epoch 2, step" in err[0], err
    assert f"resume with: structconv train --resume {run}" in err[0]
    r = subprocess.run(CLI + ["train", "--resume", str(run)], env=ENV, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    cfg = apply_overrides(load_config("cnn_digits"), over)
    cfg["name"] = "cnn_digits"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the subprocesses (OMP_NUM_THREADS=1)
    try:
        train(cfg, tmp_path / "ref")
    finally:
        torch.set_num_threads(threads)
    _same_run(run, tmp_path / "ref")


@pytest.mark.skipif(sys.platform != "linux", reason="DDP workers fork on Linux")
def test_sigterm_to_a_data_parallel_run_stops_every_rank_cleanly(tmp_path):
    # five epochs: the signal must land inside the run even when this process is starved
    over = ["train.epochs=5", "data.options.limit=1000", "model.dtype=\"float64\"",
            "data.batch_size=10", "train.checkpoint_seconds=1e9"]
    run = tmp_path / "ddp"
    proc = subprocess.Popen(CLI + ["train", "--config", "cnn_digits", *over, "--out", str(run),
                                   "--nproc", "2"], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _wait_for(run / "metrics.jsonl", proc)  # inside epoch 2 (no sleep: a quiet machine outruns it)
    proc.send_signal(signal.SIGTERM)  # a scheduler signals the parent alone
    err = proc.communicate(timeout=120)[1].strip().splitlines()
    assert proc.returncode == 143, err
    assert len(err) == 1 and "interrupted by SIGTERM" in err[0] and "--nproc 2" in err[0], err
    ck = json.loads((run / "checkpoint.json").read_text())
    assert ck["epoch"] >= 1
    r = subprocess.run(CLI + ["train", "--resume", str(run), "--nproc", "2"], env=ENV,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cfg = apply_overrides(load_config("cnn_digits"), over)
    cfg["name"] = "cnn_digits"
    train(cfg, tmp_path / "one")
    a, b = _rows(run), _rows(tmp_path / "one")
    for x, y in zip(a, b, strict=True):
        for k in ("train_loss", "val_loss", "train_acc", "val_acc"):
            assert x[k] == pytest.approx(y[k], rel=1e-10, abs=1e-12), (k, x, y)


def test_a_second_writer_is_refused_naming_the_holder(tmp_path, capsys):
    run = tmp_path / "run"
    with RunLock(run, "another test") as lock:
        lock.acquire()
        rc = main(["train", "--config", "gcn_karate", "train.epochs=1", "--out", str(run)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, err
        assert f"is being written by another run (pid {os.getpid()}" in err[0] and \
            "another test" in err[0], err
        assert not (run / "config.json").exists()
    assert main(["train", "--config", "gcn_karate", "train.epochs=1", "--out", str(run)]) == 0


def test_checkpoint_files_load_as_weights_and_mismatches_name_keys(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config", "gcn_karate", "train.epochs=2", "train.checkpoint_every=1",
                 "--out", str(run)]) == 0
    ckpt = sorted(run.glob("ckpt-*.safetensors"))[-1]
    assert main(["eval", str(run), "--weights", str(ckpt)]) == 0
    _, _, model = load_run(run, str(ckpt))
    ck = sc.training.checkpoint.load_checkpoint(run)["model"]
    assert all(torch.equal(model.state_dict()[k], ck[k]) for k in ck)
    other = tmp_path / "other"
    assert main(["train", "--config", "gcn_karate", "train.epochs=1",
                 "model.layers.0.channels=7", "--out", str(other)]) == 0
    capsys.readouterr()
    with pytest.raises(CheckpointError, match=r"blocks\.0\.conv\.param\.weight is \(1, 34, 7\) "
                                              r"but the model's is \(1, 34, 16\)"):
        load_run(run, str(other / "best.safetensors"))


def test_empty_train_splits_and_too_many_workers_are_named(tmp_path):
    for task, data in (("node", SimpleNamespace(masks={"train": torch.zeros(3, dtype=bool)})),
                       ("link", SimpleNamespace(train=torch.zeros(0, 3))),
                       ("text", SimpleNamespace(splits={"train": torch.zeros(0)})),
                       ("image", SimpleNamespace(splits={"train": (torch.zeros(0, 1), None)}))):
        data.task, data.name = task, "x"
        with pytest.raises(ConfigError, match="the train split of x is empty"):
            check_train_split(data)
    cores = os.cpu_count() or 1
    if cores >= 256:
        pytest.skip("the schema's bound is below this machine's cores")
    cfg = apply_overrides(load_config("gcn_karate_sampled"),
                          [f"train.sampler.workers={cores + 1}"])
    with pytest.raises(ConfigError, match=f"exceeds the {cores} CPU cores"):
        train(cfg, tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_runs_without_a_terminal_print_progress_lines(tmp_path):
    env = {**ENV, "STRUCTCONV_PROGRESS_SECONDS": "0"}
    r = subprocess.run(CLI + ["train", "--config", "cnn_digits", "train.epochs=1",
                              "data.options.limit=200", "--out", str(tmp_path / "r")],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "epoch 1: 1/" in r.stderr and "batches  loss" in r.stderr, r.stderr
    assert "epoch   1  train_loss" in r.stdout


def test_image_data_has_no_relations():
    seen = []
    sc.basis.register("_probe_structure", lambda spec, s: seen.append(s) or
                      sc.basis.identity(s.entries))
    cfg = load_config("cnn_digits", ['model.layers.0.basis.kind="_probe_structure"'])
    sc.models.build_model(cfg, sc.training.load_data(cfg))
    assert seen and seen[0].num_relations is None and seen[0].edge_index is None


def test_a_finished_run_leaves_no_lock_and_no_stale_mid_epoch_checkpoint(monkeypatch, tmp_path):
    cfg = apply_overrides(load_config("cnn_digits"), IMAGE[:3] + ["train.epochs=1"])
    cfg["name"] = "cnn_digits"
    run = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        with pytest.MonkeyPatch.context() as m:
            _stop_at(m, 3)
            train(cfg, run)
    assert list(run.glob("ckpt-*-*.safetensors"))  # stopped inside the epoch
    train(None, run, resume=True)
    left = sorted(p.name for p in run.iterdir())
    assert ".lock" not in left, left
    assert not [n for n in left if n.startswith("ckpt-") and n.count("-") == 2], left
    ck = json.loads((run / "checkpoint.json").read_text())
    assert ck["file"] in left and "partial" not in ck["trainer"]

"""The language-model recipes (reproduce shift-heads, reproduce canon) run where --device says:
the model, its batches and its evaluation move there, and a CUDA run follows the CPU run's
numbers (same initial weights, same batches) to float rounding."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from structconv.experiments import canon, shift_heads
from structconv.experiments.sweep import Run, config_run
from structconv.training import load_run

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _lm_args(device: str, **kw):
    a = dict(width=16, layers=2, heads=2, shifts=2, context=12, canon_kernel=3, lr=3e-3,
             steps=8, batch=4, val_batches=2, eval_every=4, eval_chars=200, sliding_chars=100,
             stride=0, checkpoint_every=0, quick=False, data=None, device=device)
    return argparse.Namespace(**{**a, **kw})


def _depo_args(device: str):
    return argparse.Namespace(width=16, layers=1, heads=2, shifts=2, canon_kernel=3, lr=3e-3,
                              steps=8, batch=4, eval_per_k=8, eval_every=4, depth_at=0.9,
                              curriculum=0.5, checkpoint_every=0, nodes=8, n=5, max_hops=2,
                              queries=2, device=device)


def _canon_run(device: str, kind: str, folder):
    # the recipe's run of ``kind`` (its config and overrides)
    run = canon.kind_run(kind, 0, _depo_args(device), 24)
    res = config_run(folder, run, "test", device)
    res["curve"] = [json.loads(r) for r in
                    (folder / run.name / "metrics.jsonl").read_text().splitlines()]
    return res, load_run(folder / run.name, "last", device)[2]


def _shift_heads_run(device: str, kind: str, folder):
    # the recipe's run of ``kind`` (its config and overrides), on text that ships with Python
    a = _lm_args(device)
    run = shift_heads.kind_run(kind, 0, a.steps, a, 40)
    run = Run(run.name, run.config, (*run.overrides, "data.name=python-text", "data.options={}"))
    res = config_run(folder, run, "test", device)
    res.update(shift_heads.analyse(folder / run.name, a, device))
    res["curve"] = [json.loads(r) for r in
                    (folder / run.name / "metrics.jsonl").read_text().splitlines()]
    return res, load_run(folder / run.name, "last", device)[2]


@pytest.mark.parametrize("kind", ["shift+Canon-ABCD", "rotary"])
def test_shift_heads_run_reports_its_device(kind, tmp_path):
    res, model = _shift_heads_run("cpu", kind, tmp_path)
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert set(res["extrapolation"]["nonoverlap"]) == {str(f) for f in shift_heads.FACTORS}


def test_canon_run_reports_its_device(tmp_path):
    res, model = _canon_run("cpu", "none+Canon-ABCD", tmp_path)
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert {"val_acc@1", "val_acc@2"} <= set(res) and len(res["curve"]) == 2


@CUDA
@pytest.mark.parametrize("kind", ["shift+Canon-ABCD", "rotary", "alibi", "relative"])
def test_shift_heads_on_cuda_follows_the_cpu_run(kind, tmp_path):
    cpu, _ = _shift_heads_run("cpu", kind, tmp_path / "cpu")
    gpu, model = _shift_heads_run("cuda", kind, tmp_path / "cuda")
    assert all(p.device.type == "cuda" for p in model.parameters())
    for c, g in zip(cpu["curve"], gpu["curve"]):
        assert math.isclose(c["val_loss"], g["val_loss"], rel_tol=1e-3)
    for how in ("nonoverlap", "sliding"):
        for f, v in cpu["extrapolation"][how].items():
            assert math.isclose(v, gpu["extrapolation"][how][f], rel_tol=1e-3)


@CUDA
def test_canon_on_cuda_follows_the_cpu_run(tmp_path):
    cpu, _ = _canon_run("cpu", "shift+Canon-ABCD", tmp_path / "cpu")
    gpu, model = _canon_run("cuda", "shift+Canon-ABCD", tmp_path / "cuda")
    assert all(p.device.type == "cuda" for p in model.parameters())
    for c, g in zip(cpu["curve"], gpu["curve"]):
        assert math.isclose(c["step_loss"], g["step_loss"], rel_tol=1e-3)

"""Checkpoints: safetensors + JSON round trip, RNG states, atomic commit, corruption errors."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from structconv.training.checkpoint import (
    CHECKPOINT_JSON,
    CheckpointError,
    load_checkpoint,
    load_weights,
    optimizer_join,
    optimizer_split,
    save_checkpoint,
    save_weights,
    set_rng_state,
)


def _trained(opt_cls=torch.optim.Adam, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = opt_cls(model.parameters(), lr=0.01, **kw)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).sum().backward()
        opt.step()
    return model, opt


def _same_state(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        for k, v in a["state"][i].items():
            w = b["state"][i][k]
            assert torch.equal(v, w) if torch.is_tensor(v) else v == w


@pytest.mark.parametrize("opt_cls,kw", [(torch.optim.Adam, {}), (torch.optim.AdamW, {}),
                                        (torch.optim.SGD, {"momentum": 0.9})])
def test_optimizer_split_join_roundtrip(opt_cls, kw):
    _, opt = _trained(opt_cls, **kw)
    sd = opt.state_dict()
    tensors, meta = optimizer_split(sd)
    json.dumps(meta)  # scalars and hyper-parameters are plain JSON
    assert all(torch.is_tensor(v) for v in tensors.values())
    _same_state(optimizer_join(tensors, json.loads(json.dumps(meta))), sd)


def test_checkpoint_roundtrip_restores_everything(tmp_path):
    model, opt = _trained()
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    trainer = {"best": 0.5, "history": [{"epoch": 1, "loss": 1.0}], "stopped": False}
    save_checkpoint(tmp_path, 4, model.state_dict(), opt.state_dict(), trainer,
                    best_state=model.state_dict())
    expect = (torch.rand(3), random.random(), np.random.rand())
    ck = load_checkpoint(tmp_path)
    assert ck["epoch"] == 4 and ck["trainer"] == trainer
    for k, v in model.state_dict().items():
        assert torch.equal(ck["model"][k], v) and torch.equal(ck["best"][k], v)
    _same_state(ck["optimizer"], opt.state_dict())
    # the RNG streams continue exactly where they were saved
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    set_rng_state(*ck["rng"])
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expect[0]) and got[1:] == expect[1:]
    # a fresh optimizer accepts the restored state
    model2, opt2 = _trained()
    opt2.load_state_dict(ck["optimizer"])


def test_no_pickle_files(tmp_path):
    model, opt = _trained()
    save_checkpoint(tmp_path, 1, model.state_dict(), opt.state_dict(), {})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [CHECKPOINT_JSON, "ckpt-000001.safetensors"]
    json.loads((tmp_path / CHECKPOINT_JSON).read_text())


def test_json_is_the_commit_point_and_old_files_are_pruned(tmp_path):
    model, opt = _trained()
    for e in (1, 2, 3):
        save_checkpoint(tmp_path, e, model.state_dict(), opt.state_dict(), {"e": e})
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == \
        ["ckpt-000002.safetensors", "ckpt-000003.safetensors"]
    # a crash after writing the next tensor file but before the JSON commit: still epoch 3
    (tmp_path / "ckpt-000004.safetensors").write_bytes(b"half written")
    assert load_checkpoint(tmp_path)["epoch"] == 3


def test_corrupt_checkpoints_raise_clear_errors(tmp_path):
    model, opt = _trained()
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="run directory not found"):
        load_checkpoint(tmp_path / "absent")
    path = save_checkpoint(tmp_path, 1, model.state_dict(), opt.state_dict(), {})
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt checkpoint .sha256"):
        load_checkpoint(tmp_path)
    path.unlink()
    with pytest.raises(CheckpointError, match="ckpt-000001.safetensors: tensor file named by"):
        load_checkpoint(tmp_path)
    (tmp_path / CHECKPOINT_JSON).write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt checkpoint metadata"):
        load_checkpoint(tmp_path)


def test_weights_roundtrip_and_corruption(tmp_path):
    model, _ = _trained()
    save_weights(tmp_path / "w.safetensors", model.state_dict(), {"epoch": 3})
    sd = load_weights(tmp_path / "w.safetensors")
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())
    (tmp_path / "bad.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json")
    with pytest.raises(CheckpointError, match="bad.safetensors: corrupt safetensors"):
        load_weights(tmp_path / "bad.safetensors")


def test_weights_checksum_and_values_are_verified(tmp_path):
    from safetensors.torch import save as st_save

    model, _ = _trained()
    p = tmp_path / "w.safetensors"
    save_weights(p, model.state_dict())
    data = bytearray(p.read_bytes())
    data[-3] ^= 0xFF  # one flipped bit pattern inside the last tensor's bytes
    p.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 differs"):
        load_weights(p)
    # NaN weights written with a correct checksum are refused by value
    sd = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
          for k, v in model.state_dict().items()}
    save_weights(p, sd)
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        load_weights(p)
    # a safetensors file that carries no checksum is refused unless verification is off
    (tmp_path / "plain.safetensors").write_bytes(st_save({"w": torch.ones(2)}))
    with pytest.raises(CheckpointError, match="no checksum"):
        load_weights(tmp_path / "plain.safetensors")
    assert torch.equal(load_weights(tmp_path / "plain.safetensors", verify=False)["w"],
                       torch.ones(2))


@pytest.mark.parametrize("field,value", [("rng", {"python": 3}), ("trainer", [1, 2]),
                                         ("optimizer", {"scalars": [], "param_groups": 1}),
                                         ("rng", {"python": [1, [2], 3], "numpy": [1]})])
def test_checkpoint_metadata_of_the_wrong_structure(tmp_path, field, value):
    model, opt = _trained()
    save_checkpoint(tmp_path, 1, model.state_dict(), opt.state_dict(), {"best": 0.5})
    meta = json.loads((tmp_path / CHECKPOINT_JSON).read_text())
    meta[field] = value
    (tmp_path / CHECKPOINT_JSON).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=f"corrupt .* metadata \\(the {field} field does"):
        load_checkpoint(tmp_path)

"""Property-based fuzz of the config validator through the command line.

Hypothesis draws edits of a shipped config (any key, known or not, set to a value of any TOML
type, huge, negative, non-finite or of the wrong shape); ``structconv train`` on the result must
either finish (exit 0) or refuse with exit 2 and exactly one line on stderr: never a traceback,
an internal error (exit 1) or a hang.
"""

from __future__ import annotations

import math

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from structconv.cli import main  # noqa: E402
from structconv.config import load_config  # noqa: E402

# values that probe the edges: tiny and huge ints (none in between, which would be a legitimately
# slow run), non-finite floats, wrong types and shapes
SCALARS = st.one_of(
    st.sampled_from([-1, 0, 1, 2, 3, 10**9, 10**30, 2**63 - 1]),
    st.sampled_from([0.0, -0.5, 0.5, 1.5, 1e300, math.inf, -math.inf, math.nan]),
    st.booleans(),
    st.sampled_from(["", "none", "auto", "same", "classes", "gcn", "grid", "relu", "max", "avg",
                     "../../escaped", "float16", "attention", "x" * 300]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["kind", "K", "kernel_size", "stride", "padding", "heads",
                                     "parts", "bogus"]), inner, max_size=3)), max_leaves=6)


def _toml(v) -> str:
    """A TOML literal for an override's right-hand side."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) \
            else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(u) for u in v) + "]"
    return "{" + ", ".join(f"{k} = {_toml(u)}" for k, u in v.items()) + "}"


def _paths(node, prefix=()) -> list[str]:
    """Every key path of a config tree, tables and leaves alike."""
    out = []
    items = enumerate(node) if isinstance(node, list) else node.items()
    for k, v in items:
        p = prefix + (str(k),)
        out.append(".".join(p))
        if isinstance(v, (dict, list)):
            out += _paths(v, p)
    return out


BASE = {"gcn_karate": load_config("gcn_karate"), "cnn_digits": load_config("cnn_digits")}
EXTRA = ["model.layers.0.heads", "model.layers.0.pool", "model.layers.0.param",
         "model.layers.0.groups", "model.layers.0.rank", "model.layers.1.residual",
         "model.layers.0.basis.K", "model.layers.0.basis.kind", "model.readout",
         "model.classifier", "model.embedding", "model.dtype", "model.lm", "data.options",
         "data.options.limit", "data.batches_per_epoch", "data.eval_batch_size", "train.lr",
         "train.optimizer", "train.momentum", "train.grad_clip", "train.monitor",
         "train.patience", "name", "seed", "bogus", "train.bogus"]


def _leaf(cfg: dict, path: str):
    node = cfg
    for p in path.split("."):
        node = node[int(p)] if isinstance(node, list) else node[p]
    return node


def _typed(draw, old):
    """A value of the original's type, mostly plausible: edits that should train."""
    if isinstance(old, bool):
        return draw(st.booleans())
    if isinstance(old, int):
        return draw(st.integers(0, 20))
    if isinstance(old, float):
        return draw(st.floats(0, 1, allow_nan=False))
    if isinstance(old, str):
        return draw(st.sampled_from([old, "relu", "gelu", "tanh", "none", "same", "classes",
                                     "gcn", "sgd", "adamw", "val_loss", "mean", "max"]))
    return draw(VALUES)


@st.composite
def edits(draw):
    name = draw(st.sampled_from(sorted(BASE)))
    paths = sorted(set(_paths(BASE[name])) | set(EXTRA))
    leaves = [p for p in _paths(BASE[name])
              if not isinstance(_leaf(BASE[name], p), (dict, list))]
    out = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):  # hostile: any key, any value
            out.append(f"{draw(st.sampled_from(paths))}={_toml(draw(VALUES))}")
        else:  # careless: a known key, a value of its type
            path = draw(st.sampled_from(leaves))
            out.append(f"{path}={_toml(_typed(draw, _leaf(BASE[name], path)))}")
    return name, out


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits())
def test_any_config_edit_finishes_or_exits_2_with_one_line(tmp_path, capsys, case):
    name, overrides = case
    out = tmp_path / "runs" / f"r{abs(hash(tuple(overrides)))}"
    # one epoch, whatever the edit says about epochs: the fuzz is about validation, not duration
    rc = main(["train", "--config", name, *overrides, "--stop-after", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    event(f"exit {rc}")
    assert rc in (0, 2), (overrides, rc, err)
    if rc == 2:
        assert len(err) == 1 and err[0].startswith("structconv: error:"), (overrides, err)
        assert "internal error" not in err[0], (overrides, err)

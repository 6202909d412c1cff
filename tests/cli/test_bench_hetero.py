"""``structconv bench hetero``: its HGT model pair and its type-scaling figure, at toy sizes."""

import json
from types import SimpleNamespace

import pytest
import torch

from structconv.bench import hetero

pytest.importorskip("torch_geometric")


def test_hgt_pair_holds_the_same_model_in_both_libraries():
    meta, x, ei = hetero.synthetic(3, 60, 300, 5, seed=0)
    x = {t: v.double() for t, v in x.items()}
    torch.manual_seed(0)
    ref, ours = hetero.hgt_pair(meta, {t: 5 for t in x}, 8, 3)
    ref, ours = ref.double(), ours.double()
    assert type(ours["conv"]).__module__.startswith("structconv")
    want = hetero.hgt_forward(ref, x, ei, target="t1x")
    got = hetero.hgt_forward(ours, x, ei, target="t1x")
    assert want.shape == (20, 3)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for net in (ref, ours):  # a training step moves both alike
        hetero.hgt_forward(net, x, ei, target="t1x").square().sum().backward()
    for (n, a), b in zip(ref["lins"].named_parameters(), ours["lins"].parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-11, atol=1e-11, msg=n)


def _result():
    rows = [dict(types=T, relations=2 * T, n=400, E=4000, P=8, max_abs_err=0.0,
                 fwd_s={"ours": 0.010, "pyg": 0.012 + 0.001 * T}, ratio=0.8)
            for T in hetero.TYPES]
    return dict(suite="hetero", threads=1, conditions={"load_average_1min": 0.5}, types=rows)


def test_the_type_scaling_figure_is_drawn_from_a_saved_result(tmp_path):
    pytest.importorskip("matplotlib")
    saved = tmp_path / "hetero.json"
    saved.write_text(json.dumps(_result()))
    png = tmp_path / "types.png"
    args = SimpleNamespace(from_json=str(saved), plot=str(png))
    assert hetero.run(args) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert hetero.run(SimpleNamespace(from_json=str(saved), plot=None)) == 2
    with pytest.raises(ValueError, match="types"):
        hetero.plot_types({"suite": "hetero"}, tmp_path / "none.png")

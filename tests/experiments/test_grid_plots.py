"""plot_basis / plot-basis CLI and the grid benchmark's smoke run."""

import json

import matplotlib.image
import pytest
import torch

from structconv.basis import AvgPool, Grid
from structconv.plots import MAX_ENTRIES, plot_basis

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_basis_writes_png(tmp_path):
    path = plot_basis(Grid((8, 10), 3, padding=1), tmp_path / "sub" / "grid.png", max_k=4,
                      title="shifts")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    # the panels show ink: not a blank figure
    assert float(img[..., :3].std()) > 0.01


def test_plot_any_basis_and_dense_tensor(tmp_path):
    plot_basis(AvgPool((6,), 2), tmp_path / "pool.png")
    plot_basis(torch.randn(2, 5, 4), tmp_path / "dense.png")  # signed values
    assert (tmp_path / "pool.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "dense.png").read_bytes()[:8] == PNG_MAGIC


def test_plot_errors(tmp_path):
    big = Grid((2100,), 1)
    assert big.M * big.N > MAX_ENTRIES
    with pytest.raises(ValueError, match="too large"):
        plot_basis(big, tmp_path / "x.png")
    with pytest.raises(ValueError, match="max_k"):
        plot_basis(Grid((4,), 2), tmp_path / "x.png", max_k=0)
    assert not (tmp_path / "x.png").exists()


def test_cli_plot_basis(tmp_path, capsys):
    from structconv.cli import main

    out = tmp_path / "g.png"
    rc = main(["plot-basis", "grid", "--in-shape", "8", "10", "--kernel", "3", "3",
               "--padding", "1", "--out", str(out)])
    assert rc == 0 and out.read_bytes()[:8] == PNG_MAGIC
    rc = main(["plot-basis", "avgpool", "--in-shape", "6", "--kernel", "2", "--out",
               str(tmp_path)])
    assert rc == 0 and (tmp_path / "avgpool-6-k2.png").exists()
    rc = main(["plot-basis", "grid", "--in-shape", "4", "--kernel", "9", "--out", str(out)])
    assert rc == 2
    assert "kernel spans 9" in capsys.readouterr().err


def test_bench_grid_quick(tmp_path):
    import argparse

    from structconv.bench import grid

    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int)
    p.add_argument("--seed", type=int)
    grid.add_arguments(p)
    args = p.parse_args(["--out", str(tmp_path), "--quick", "--repeats", "1", "--seed", "0",
                         "--cases", "seq1d,separable5x5_H4"])
    assert grid.run(args) == 0
    res = json.loads((tmp_path / "grid.json").read_text())
    rows = {r["case"]: r for r in res["rows"]}
    assert set(rows) == {"seq1d", "separable5x5_H4"}
    assert rows["seq1d"]["max_abs_diff_vs_torch"] < 1e-4
    sep = rows["separable5x5_H4"]
    assert sep["params_ours"] < sep["params_torch"]
    for r in rows.values():
        assert r["fwd_ratio"]["dispatch"] > 0 and r["fwd_bwd_ratio"]["shift"] > 0
        assert r["shift_route"] != "native"
    with pytest.raises(ValueError, match="unknown case"):
        grid.run(p.parse_args(["--out", str(tmp_path), "--quick", "--repeats", "1",
                               "--seed", "0", "--cases", "nope"]))

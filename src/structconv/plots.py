"""Pictures of bases, like the paper's figure "grid-shift": one panel per matrix A_k (M, N).

``plot_basis`` works for any (small) basis through ``to_dense``; ``structconv plot-basis grid
--in-shape 8 10 --kernel 3 3 --out FILE`` draws the shift matrices of a grid. ``pyplot`` is
matplotlib's pyplot on a non-interactive backend, for the recipes' and benchmarks' figures.
"""

from __future__ import annotations

import argparse
import io
import math
from pathlib import Path

import torch
from torch import Tensor

from ._extras import require
from .basis.base import Basis, as_basis
from .io import atomic_write_bytes

__all__ = ["plot_basis", "add_plot_arguments", "run_plot", "plot_grid_cli", "pyplot",
           "MAX_ENTRIES"]

def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (the plots extra)."""
    require("matplotlib", "plots", "figures").use("Agg")
    return require("matplotlib.pyplot", "plots", "figures")


#: largest M * N drawn (a matrix image beyond this is unreadable and slow to build)
MAX_ENTRIES = 4_000_000


def _panel_title(basis: Basis, k: int) -> str:
    from .basis.grid import Grid

    if isinstance(basis, Grid):
        d = tuple(int(v) for v in basis.shifts[k])
        return f"k={k}  Δ={d if len(d) > 1 else d[0]}"
    return f"k={k}"


def plot_basis(basis: Basis | Tensor, path, max_k: int | None = None,
               title: str | None = None) -> Path:
    """Write a PNG of A_k (rows m = inputs, columns n = outputs) for k < max_k; returns the path.

    ``basis``: a ``sc.basis`` basis or a (K, M, N) tensor, made dense (so M*N <= MAX_ENTRIES).
    """
    basis = as_basis(basis)
    K, M, N = basis.shape
    if max_k is not None and (isinstance(max_k, bool) or not isinstance(max_k, int)
                              or max_k < 1):
        raise ValueError(f"max_k must be a positive int or None, got {max_k!r}")
    if M * N > MAX_ENTRIES:
        raise ValueError(f"basis matrices of (M, N)=({M}, {N}) are too large to draw "
                         f"(M*N={M * N} > {MAX_ENTRIES}); plot a smaller grid")
    shown = K if max_k is None else min(K, max_k)
    A = basis.to_dense()[:shown].detach().to("cpu", torch.float64)

    FigureCanvasAgg = require("matplotlib.backends.backend_agg", "plots",
                              "plotting").FigureCanvasAgg
    Figure = require("matplotlib.figure", "plots", "plotting").Figure

    cols = min(shown, 3 if shown <= 9 else math.ceil(math.sqrt(shown)))
    rows = math.ceil(shown / cols)
    aspect = M / N
    w = 3.2
    fig = Figure(figsize=(cols * w, rows * w * min(2.0, max(0.5, aspect)) + 0.6))
    FigureCanvasAgg(fig)
    lim = float(A.abs().max()) or 1.0
    signed = bool((A < 0).any())
    for i in range(shown):
        ax = fig.add_subplot(rows, cols, i + 1)
        # unit entries of shift matrices read best as dark cells on white, as in the figure
        ax.imshow(A[i].numpy(), cmap="RdBu_r" if signed else "Blues",
                  vmin=-lim if signed else 0.0, vmax=lim, interpolation="nearest", aspect="auto")
        ax.set_title(_panel_title(basis, i), fontsize=8)
        ax.set_xlabel("n (output)", fontsize=7)
        ax.set_ylabel("m (input)", fontsize=7)
        ax.tick_params(labelsize=6)
    if title is None:
        title = f"{type(basis).__name__}: K={K}, M={M}, N={N}"
        if shown < K:
            title += f" (first {shown} of {K} matrices)"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path


# ------------------------------------------------------------------------------------------------
# command line: ``structconv plot-basis grid|avgpool ...``
def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``structconv plot-basis``: the basis kind and its grid geometry."""
    parser.add_argument("kind", choices=("grid", "avgpool"), help="which basis to draw")
    parser.add_argument("--in-shape", type=int, nargs="+", required=True,
                        help="grid size, one int per dimension, e.g. 8 10")
    parser.add_argument("--kernel", type=int, nargs="+", default=[3],
                        help="kernel size (one int, or one per dimension; default 3)")
    parser.add_argument("--stride", type=int, nargs="+", default=None,
                        help="stride (default 1 for grid, the kernel for avgpool)")
    parser.add_argument("--padding", default="0",
                        help="an int, one int per dimension ('1 2'), 'same' or 'valid'")
    parser.add_argument("--dilation", type=int, nargs="+", default=[1], help="dilation (grid)")
    parser.add_argument("--max-k", type=int, default=None, help="draw only the first matrices")
    parser.add_argument("--title", default=None, help="figure title")
    parser.add_argument("--out", default="plots",
                        help="a .png file, or a directory for an automatic name (default plots)")


def _one_or_many(v):
    return v[0] if v is not None and len(v) == 1 else (None if v is None else tuple(v))


def _padding(text: str):
    text = str(text).strip()
    if text in ("same", "valid"):
        return text
    try:
        vals = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--padding must be ints, 'same' or 'valid', got {text!r}") from None
    if not vals:
        raise ValueError("--padding is empty")
    return vals[0] if len(vals) == 1 else tuple(vals)


def build_basis(args) -> Basis:
    """The basis described by parsed ``plot-basis`` arguments."""
    from .basis.grid import AvgPool, Grid

    in_shape = tuple(args.in_shape)
    kernel = _one_or_many(args.kernel)
    stride = _one_or_many(args.stride)
    padding = _padding(args.padding)
    if args.kind == "grid":
        return Grid(in_shape, kernel, 1 if stride is None else stride, padding,
                    _one_or_many(args.dilation))
    if isinstance(padding, str):
        raise ValueError("avgpool takes int padding, not 'same'/'valid'")
    return AvgPool(in_shape, kernel, stride, padding)


def run_plot(args) -> int:
    """Build the basis from ``args``, write its PNG, print the path; returns the exit status."""
    basis = build_basis(args)
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        shape = "x".join(map(str, args.in_shape))
        kern = "x".join(map(str, args.kernel))
        out = out / f"{args.kind}-{shape}-k{kern}.png"
    path = plot_basis(basis, out, max_k=args.max_k, title=args.title)
    print(f"wrote {path} ({basis!r})")
    return 0


def plot_grid_cli(args) -> int:
    """Alias of ``run_plot`` for the ``plot-basis grid`` command."""
    return run_plot(args)


def main(argv=None) -> int:
    """``python -m structconv.plots grid --in-shape 8 10 --kernel 3 3 --out grid.png``."""
    p = argparse.ArgumentParser(prog="structconv.plots", description=__doc__)
    add_plot_arguments(p)
    return run_plot(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

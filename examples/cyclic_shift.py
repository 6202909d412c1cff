"""A basis family written only against structconv's public protocol: weighted cyclic shifts.

``CyclicShift(length, shifts)`` has one matrix per shift s_k on a ring of ``length`` entries:
``A_k[m, n] = w_k`` where ``m = (n - s_k) mod length`` (output n reads input n - s_k, wrapping
around), with per-shift weights ``w`` (default 1). It is complete with ``__init__`` and
``propagate_heads``; ``apply_flops`` tells the planner it is sparse (one entry per column).

Use it from Python::

    import structconv as sc
    from cyclic_shift import CyclicShift
    y = sc.convolve(x, CyclicShift(64, [0, 1, -1]), theta)

or from a model config, with this file's folder on ``PYTHONPATH``::

    [[model.layers]]
    basis = { kind = "cyclic_shift:build", shifts = [0, 1, -1] }
"""

from __future__ import annotations

import torch

import structconv as sc


class CyclicShift(sc.basis.Basis):
    """K weighted cyclic shifts of a ring of ``length`` entries: (K, length, length)."""

    def __init__(self, length: int, shifts, weights: torch.Tensor | None = None):
        shifts = [int(s) for s in shifts]
        super().__init__(len(shifts), length, length)
        self.shifts = shifts
        # a float tensor attribute: it moves and casts with the basis (``.to``, ``cast_like``)
        self.w = torch.ones(len(shifts)) if weights is None else weights

    def propagate_heads(self, z: torch.Tensor) -> torch.Tensor:
        # out[:, n, k] = w_k z[:, n - s_k, k]: a roll of slice k by s_k along the entries
        outs = [torch.roll(z[:, :, k], s, dims=1) for k, s in enumerate(self.shifts)]
        return torch.stack(outs, 2) * self.w.to(z.dtype).view(1, 1, -1, 1)

    def apply_flops(self) -> float:
        return float(self.K * self.N)  # one entry per column of each matrix


def build(spec: dict, structure) -> CyclicShift:
    """The config builder: a ring over the data's entries (grid cells or graph nodes)."""
    n = structure.entries
    if n is None:
        raise ValueError("a cyclic_shift basis needs grid or graph data")
    return CyclicShift(n, spec.get("shifts", [0, 1, -1]))


def main(argv=None) -> None:
    """The family at work: every route agrees, the algebra applies, a layer trains on it."""
    import argparse

    p = argparse.ArgumentParser(description="a custom basis family: weighted cyclic shifts")
    p.add_argument("--quick", action="store_true", help="fewer training steps")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    basis = CyclicShift(32, [0, 1, -1, 8])
    x = torch.randn(4, 32, 3, dtype=torch.float64)
    theta = torch.randn(4, 3, 5, dtype=torch.float64)
    ys = {r: sc.convolve(x, basis.to(dtype=torch.float64), theta, route=r) for r in sc.ROUTES}
    spread = max((y - ys["input_param"]).abs().max().item() for y in ys.values())
    print(f"routes {', '.join(ys)} agree to {spread:.1e} (float64)")
    dense = sc.convolve(x, basis.to_dense().double(), theta)
    print(f"against its dense (K, M, N) tensor: {(dense - ys['input_param']).abs().max():.1e}")
    print(sc.explain(x, basis, theta))
    # the paper's algebra on the new family: Phi = A o Theta, and Theta back (Proposition 1)
    phi = sc.materialize(basis.to(dtype=torch.float64), theta)
    back = sc.invert(basis.to(dtype=torch.float64), phi)
    print(f"invert(materialize(theta)) recovers theta to {(back - theta).abs().max():.1e}")
    # a layer over a Stack of the new family and a 1-d grid learns a ring's circular blur
    both = sc.basis.Stack([CyclicShift(32, [0, 1, -1]), sc.basis.Grid((32,), 3, padding=1)])
    layer = sc.nn.Convolution(both, 1, 1, bias=False)
    opt = torch.optim.Adam(layer.parameters(), lr=0.05)
    target = CyclicShift(32, [1, -1], torch.tensor([0.5, 0.5]))
    for _ in range(60 if args.quick else 300):
        z = torch.randn(16, 32, 1)
        loss = (layer(z) - sc.convolve(z, target, torch.ones(2, 1, 1))).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"Convolution over Stack([CyclicShift, Grid]) fits a circular blur: mse {loss:.1e}")


if __name__ == "__main__":
    main()

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

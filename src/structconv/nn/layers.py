"""``Convolution``: a thin nn.Module holding a basis, a parameter form and a bias."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..basis.base import Basis, as_basis
from ..engine import convolve, featureless, plan
from ..params import Parameterization, make_param

__all__ = ["Convolution"]


class Convolution(nn.Module):
    """y = Σ_k A_kᵀ x Θ_k + bias for a fixed basis; x (B, M, P) or (M, P) -> (B, N, Q) or (N, Q).

    ``param`` is ``"full"``, ``"depthwise"`` or a module from ``sc.params``; ``route`` is passed
    to ``sc.convolve`` (``"auto"`` lets the planner choose per call).
    """

    def __init__(self, basis: Basis | Tensor, in_channels: int, out_channels: int,
                 param: str | Parameterization = "full", bias: bool = True, route: str = "auto"):
        super().__init__()
        self.basis = as_basis(basis)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.param = make_param(param, self.basis.K, in_channels, out_channels)
        self.route = route
        if bias:
            b = 1.0 / math.sqrt(self.param.fan_in)
            self.bias = nn.Parameter(torch.empty(out_channels).uniform_(-b, b))
        else:
            self.register_parameter("bias", None)

    def extra_repr(self) -> str:
        return (f"basis={self.basis!r}, in_channels={self.in_channels}, "
                f"out_channels={self.out_channels}, bias={self.bias is not None}")

    def forward(self, x: Tensor, basis: Basis | None = None) -> Tensor:
        """``basis``: another basis of the same K applied in place of ``self.basis`` (e.g. its
        restriction to a sampled block, (K, M', N'))."""
        # the bias goes into the route's kernel where it can (e.g. a Grid's depthwise taps)
        return convolve(x, self.basis if basis is None else basis, self.param, route=self.route,
                        bias=self.bias)

    def featureless(self, basis: Basis | None = None, rows: Tensor | None = None) -> Tensor:
        """The layer on one-hot inputs x = I without forming I: (N, Q). ``rows`` (M,): the
        entries whose one-hot rows the (restricted) ``basis``'s M inputs are."""
        return featureless(self.basis if basis is None else basis, self.param, bias=self.bias,
                           rows=rows)

    def plan(self, x: Tensor):
        """The planner's decision for this input (see ``sc.plan``)."""
        return plan(x, self.basis, self.param)

"""``Convolution``: a thin nn.Module holding a basis, a parameter form and a bias."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..basis.base import Basis, as_basis
from ..engine import convolve, featureless, plan
from ..params import ControlledSeparable, Full, Parameterization, glorot_, make_param

__all__ = ["Convolution", "INITS"]

#: the initialisations of ``Convolution``: the parameter form's own with torch's U(±1/√fan_in)
#: bias, or PyG's (Glorot weights, zero bias)
INITS = ("default", "glorot")


class Convolution(nn.Module):
    """y = Σ_k A_kᵀ x Θ_k + bias for a fixed basis; x (B, M, P) or (M, P) -> (B, N, Q) or (N, Q).

    ``param`` is ``"full"``, ``"depthwise"`` or a module from ``sc.params``; ``route`` is passed
    to ``sc.convolve`` (``"auto"`` lets the planner choose per call). ``init``: ``"default"``
    (the form's own draw, bias U(±1/√fan_in) as torch's) or ``"glorot"`` (PyG's layers:
    Glorot weights, both factors of a ``ControlledSeparable``, other forms as drawn; zero bias).
    """

    def __init__(self, basis: Basis | Tensor, in_channels: int, out_channels: int,
                 param: str | Parameterization = "full", bias: bool = True, route: str = "auto",
                 *, init: str = "default"):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"Convolution: init must be one of {INITS}, got {init!r}")
        self.basis = as_basis(basis)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.param = make_param(param, self.basis.K, in_channels, out_channels)
        self.route, self.init = route, init
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        # the form drew its theta in its constructor: the rest of reset_parameters follows
        self._reset_rest()

    def reset_parameters(self) -> None:
        """Re-draw theta and the bias from the layer's ``init``."""
        self.param.reset_parameters()
        self._reset_rest()

    def _reset_rest(self) -> None:
        # the default draws come first under "glorot" too, so a seed gives the values it gave
        # when Glorot was applied over a default-initialised layer
        with torch.no_grad():
            if self.bias is not None:
                b = 1.0 / math.sqrt(self.param.fan_in)
                self.bias.uniform_(-b, b)
            if self.init == "glorot":
                p = self.param
                if isinstance(p, Full):
                    glorot_(p.weight)
                elif isinstance(p, ControlledSeparable):
                    glorot_(p.channel)
                    glorot_(p.basis_coef)  # PyG's comp is (R, bases): ours is its transpose
                if self.bias is not None:
                    self.bias.zero_()

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

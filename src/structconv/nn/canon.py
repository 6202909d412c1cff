"""Canon layers (Allen-Zhu 2025) as structured convolutions: h + conv(h) along the sequence.

A Canon layer is a causal depthwise convolution of K taps with a residual connection. In the
paper's terms it is a ``Grid`` basis over the sequence (the shift matrices A_k of offsets
0..K-1, causal padding ``(K-1, 0)``) with a depthwise parameter θ_k = diag(w_k): exactly the
shift matrices of the paper's shift heads, with a K x C parameter instead of full low-rank
value/output maps. The residual is the shift-0 matrix with the identity parameter, so
``ResidualDepthwise`` folds it into the parameter (θ_{K-1} = diag(w_{K-1}) + I) and one
convolution computes h + conv(h).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..basis.grid import Grid
from ..costs import Route
from ..engine import convolve
from ..params import Parameterization

__all__ = ["ResidualDepthwise", "Canon", "CANON_PLACES", "CANON_INIT_STD"]

#: the Canon places of a decoder block: A before attention, B on q/k/v, C before the
#: feed-forward, D inside it
CANON_PLACES = "ABCD"

#: the initial standard deviation of the conv taps (see ``Canon``)
CANON_INIT_STD = 0.02

#: grids kept per Canon layer (one per sequence length and cache state it meets)
_GRIDS = 16


class ResidualDepthwise(Parameterization):
    """θ_k = diag(weight_k) + [k = identity]·I, a (K, C, C) depthwise theta with a residual tap.

    ``weight`` (K, C) holds the ``K*C`` parameters; the identity at tap ``identity`` is a
    constant, so over a causal ``Grid`` whose tap ``identity`` reads the current position the
    convolution is h + conv(h) in one pass. Block-diagonal with C groups of one channel:
    ``blocks()`` gives F.convNd's depthwise weight, and the form's own route applies the taps
    with the basis's channelwise kernel (``Basis.channelwise_sum``) without building theta.
    """

    def __init__(self, K: int, C: int, identity: int | None = None, *,
                 std: float = CANON_INIT_STD):
        super().__init__(K, C, C)
        self.identity = K - 1 if identity is None else int(identity)
        if not 0 <= self.identity < K:
            raise ValueError(f"ResidualDepthwise: identity tap {self.identity} outside 0..{K - 1}")
        self.groups = C  # one channel per group (F.convNd's depthwise form)
        self.weight = nn.Parameter(torch.randn(K, C) * std)
        self.register_buffer("eye", torch.zeros(K, 1), persistent=False)
        self.eye[self.identity] = 1.0

    @property
    def fan_in(self) -> int:
        return self.K

    def extra_repr(self) -> str:
        return super().extra_repr() + f", identity={self.identity}"

    def taps(self) -> Tensor:
        """(K, C) the per-channel tap weights, the identity included."""
        return self.weight + self.eye.to(self.weight.dtype)

    def forward(self) -> Tensor:
        return torch.diag_embed(self.taps())

    def blocks(self) -> Tensor:
        return self.taps()[:, :, None, None]

    def factored_routes(self, x: Tensor, basis) -> list[Route]:
        B, _, C = x.shape

        def taps(x, th, bias):
            return basis.channelwise_sum(x, th.taps().to(x.dtype), bias)

        return [Route("depthwise_taps", basis.channelwise_flops(C, B), B * basis.N * C, taps,
                      fuses_bias=True, device_type=basis.device.type)]


def causal_grid(length: int, kernel: int, past: int = 0, *, native: bool = True) -> Grid:
    """The Canon basis: a 1-d ``Grid`` of ``kernel`` taps whose tap ``kernel - 1`` reads the
    current position. ``past = 0``: over ``length`` inputs with causal zero padding
    ``(kernel - 1, 0)``; ``past = kernel - 1``: over the ``past`` cached inputs followed by the
    ``length`` new ones, no padding (generation). Output n reads inputs n - kernel + 1 .. n."""
    if past:
        return Grid((past + length,), kernel, padding=((0, 0),), native=native)
    return Grid((length,), kernel, padding=((kernel - 1, 0),), native=native)


class Canon(nn.Module):
    """A Canon layer: h (B, L, C) -> h + conv(h), a causal depthwise convolution of ``kernel``
    taps without bias along the sequence (``kernel * C`` parameters, ``param.weight``).

    Computed as ``sc.convolve(h, causal_grid(L, kernel), ResidualDepthwise(kernel, C))``; the
    planner picks the route. Output i reads inputs i - kernel + 1 .. i only (causal, any
    length). ``forward(h, cache)`` continues a sequence from a generation cache (a dict) that
    keeps the last ``kernel - 1`` inputs under ``key``.

    Initialisation: the taps start at N(0, 0.02) (GPT-2's scale for every weight of
    ``TransformerLM``), so a Canon layer starts within a few percent of the identity and a
    model with Canon layers starts close to the same function as the one without; the local
    mixing is learned. Allen-Zhu's reference code (PhysicsLM4, ``canon_helper.py``) keeps
    ``nn.Conv1d``'s default U(±1/√kernel) taps (±0.5 at 4 taps), a residual branch about half
    the size of its input from the first step; we prefer a start at the identity so that the
    Canon arms of a comparison differ from the others only by what training puts there.
    """

    def __init__(self, channels: int, kernel: int = 4, *, std: float = CANON_INIT_STD):
        super().__init__()
        for name, v in (("channels", channels), ("kernel", kernel)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Canon: {name} must be an int >= 1, got {v!r}")
        self.channels, self.kernel = channels, kernel
        self.param = ResidualDepthwise(kernel, channels, std=std)
        self._grids: dict = {}

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kernel={self.kernel}"

    def grid(self, length: int, past: int, device: torch.device) -> Grid:
        """The (cached) basis for ``length`` new inputs after ``past`` cached ones."""
        key = (length, past, device.type)
        g = self._grids.get(key)
        if g is None:
            if len(self._grids) >= _GRIDS:
                self._grids.clear()
            # torch's depthwise F.conv1d on CPU measured 2-6x slower (forward and backward)
            # than the Grid's channelwise taps at these sizes (C = 128..512, L = 64..512),
            # while the planner charges it at the GEMM rate: off the CPU the planner may take it
            g = self._grids[key] = causal_grid(length, self.kernel, past,
                                               native=device.type != "cpu")
        return g

    def forward(self, h: Tensor, cache: dict | None = None, key: str = "canon") -> Tensor:
        """h (B, L, C) -> (B, L, C); with ``cache``, h follows the inputs it holds (updated in
        place; an empty cache means the sequence starts here)."""
        if h.dim() != 3 or h.shape[-1] != self.channels:
            raise ValueError(f"Canon expects h (B, L, C={self.channels}), got "
                             f"{tuple(h.shape)}")
        B, L, C = h.shape
        R = self.kernel - 1
        if cache is None or not R:
            return convolve(h, self.grid(L, 0, h.device), self.param)
        past = cache.get(key)
        if past is None:
            past = h.new_zeros(B, R, C)  # before the start: the causal padding's zeros
        ext = torch.cat([past, h], 1)
        cache[key] = ext[:, L:]
        return convolve(ext, self.grid(L, R, h.device), self.param)

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

from .._checks import floating
from ..basis.grid import Grid
from ..costs import Route
from ..kernels import native
from ..params import Parameterization

__all__ = ["ResidualDepthwise", "Canon", "CausalTaps", "apply_taps", "causal_taps", "causal_past",
           "causal_grid", "CANON_PLACES", "CANON_INIT_STD"]

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
        self.std = float(std)
        self.weight = nn.Parameter(torch.empty(K, C))
        self.register_buffer("eye", torch.zeros(K, 1), persistent=False)
        self.eye[self.identity] = 1.0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The taps ~ N(0, std²) (the identity tap's constant stays)."""
        with torch.no_grad():
            self.weight.normal_().mul_(self.std)

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

        routes = [Route("depthwise_taps", basis.channelwise_flops(C, B), B * basis.N * C, taps,
                        fuses_bias=True, device_type=basis.device.type)]
        past = causal_past(basis)
        if past is not None:
            # the causal 1-d grid's own kernel (``CausalTaps``): the same passes as the taps
            # route without its padded copy and per-call layout work, hence charged less
            def causal(x, th, bias):
                y = apply_taps(x, th.weight, th.identity, past)
                return y if bias is None else y + bias

            routes.append(Route("causal_taps", 0.5 * basis.channelwise_flops(C, B),
                                B * basis.N * C, causal, device_type=basis.device.type))
        return routes


def causal_past(basis) -> int | None:
    """P when ``basis`` is a causal 1-d ``Grid`` whose output n reads inputs P + n − K + 1 ..
    P + n (unit stride and dilation): P = 0 with padding (K − 1, 0) (``causal_grid(L, K)``),
    P = K − 1 unpadded over K − 1 earlier inputs and N new ones (``causal_grid(L, K, K − 1)``);
    None for any other basis."""
    if not isinstance(basis, Grid) or len(basis.kernel_size) != 1 or basis.stride != (1,) \
            or basis.dilation != (1,):
        return None
    K = basis.kernel_size[0]
    if basis.padding == ((K - 1, 0),) and basis.M == basis.N:
        return 0
    if basis.padding == ((0, 0),) and basis.M == basis.N + K - 1:
        return K - 1
    return None


class CausalTaps(torch.autograd.Function):
    """h + conv(h) along the sequence in the fewest passes over memory.

    ``apply(x, weight, identity, past)``: x (B, P + N, C) holds P earlier inputs and N new
    ones, weight (K, C) the taps, ``identity`` the tap that carries the residual (+1); returns
    (B, N, C) with y[:, n] = Σ_s taps[K−1−s] ⊙ x[:, P + n − s], zero before x's start.

    A Canon layer is memory-bound (one multiply-add per tap and element), so the cost is the
    passes over its activations and the calls that make them. Forward: one multiply (the
    current position) and K − 1 ``addcmul_`` into y from shifted views of x: no padded copy,
    no (B, N, K, C) temporary. Backward: the input gradient the same way from g (the shifts
    reversed); the tap gradient as K dot products per channel, Σ_{b,n} g[b, n] ⊙ x[b, n − s].

    This is the torch-op definition; ``apply_taps`` runs the compiled kernel instead where it
    can (CPU float32 / float64).
    """

    @staticmethod
    def forward(ctx, x, weight, identity, past):
        w = weight.to(x.dtype)
        K, N = w.shape[0], x.shape[1] - past
        taps = w.unbind(0)
        cur = x[:, past:] if past else x
        # the residual rides on the first pass: y = x + x ⊙ w (no copy of the taps for +1)
        y = torch.addcmul(cur, cur, taps[-1]) if identity == K - 1 else torch.mul(cur, taps[-1])
        for s, lo, src in _shifted(K, N, past):
            out = y[:, lo:] if lo else y
            out.addcmul_(x[:, src], taps[-1 - s])
            if identity == K - 1 - s:
                out.add_(x[:, src])
        ctx.save_for_backward(x, w)
        ctx.past, ctx.identity, ctx.wdtype = past, identity, weight.dtype
        return y

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        P, K, N, identity = ctx.past, w.shape[0], g.shape[1], ctx.identity
        taps = w.unbind(0)
        gx = gw = None
        if ctx.needs_input_grad[0]:
            # the adjoint: the same taps, each shift read the other way
            cur = torch.addcmul(g, g, taps[-1]) if identity == K - 1 else torch.mul(g, taps[-1])
            if P:
                gx = g.new_zeros(x.shape)
                gx[:, P:] = cur
            else:
                gx = cur
            for s, lo, src in _shifted(K, N, P):
                gs = g[:, lo:] if lo else g
                gx[:, src].addcmul_(gs, taps[-1 - s])
                if identity == K - 1 - s:
                    gx[:, src].add_(gs)
        if ctx.needs_input_grad[1]:
            rows = [(g * (x[:, P:] if P else x)).sum((0, 1))]
            rows += [(g[:, lo:] * x[:, src]).sum((0, 1)) for _, lo, src in _shifted(K, N, P)]
            rows += [torch.zeros_like(rows[0])] * (K - len(rows))  # taps past the start
            gw = torch.stack(rows[::-1]).to(ctx.wdtype)
        return gx, gw, None, None


def _native(x: Tensor):
    """The compiled causal-taps module where it serves ``x`` (a CPU float32 / float64 tensor,
    outside ``torch.compile``'s tracing, which fuses the torch ops itself), else None."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or \
            torch.compiler.is_compiling():
        return None
    return native.causal_taps()


def _shifted(K: int, N: int, past: int):
    """(s, first output row lo, input rows) of every shift s = 1..K−1 that reads an input:
    outputs lo..N−1 read inputs past + lo − s .. past + N − 1 − s."""
    for s in range(1, K):
        lo = max(0, s - past)
        if lo < N:
            yield s, lo, slice(past + lo - s, past + N - s)


def apply_taps(x: Tensor, weight: Tensor, identity: int, past: int = 0) -> Tensor:
    """``CausalTaps.apply(x, weight, identity, past)``: x (B, past + N, C) -> (B, N, C).

    On CPU in float32 / float64 it runs the compiled kernel
    (``structconv.kernels.native.causal_taps``: one pass over the activations forward, one
    backward, with a C++ autograd node whose backward runs no Python and is itself
    differentiable); everywhere else (other devices and dtypes, ``torch.compile``'s tracing, no
    compiler) the torch ops of ``CausalTaps``. Both give the same values to float rounding.
    """
    ext = _native(x)
    if ext is not None:
        return ext.apply(x, weight, identity, past)
    return CausalTaps.apply(x, weight, identity, past)


def causal_taps(x: Tensor, param: ResidualDepthwise, past: int = 0) -> Tensor:
    """``apply_taps`` of x (B, past + N, C) with ``param``'s taps: (B, N, C)."""
    return apply_taps(x, param.weight, param.identity, past)


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

    Defined as ``sc.convolve(h, causal_grid(L, kernel), ResidualDepthwise(kernel, C))``, whose
    planner takes the causal grid's own route (``causal_taps``, the ``CausalTaps`` kernel); the
    layer calls that kernel directly, since the planner's per-call work (~0.1 ms) costs as much
    as the arithmetic at language-model sizes. Output i reads inputs i - kernel + 1 .. i only
    (causal, any length). ``forward(h, cache)`` continues a sequence from a generation cache
    (a dict) that keeps the last ``kernel - 1`` inputs under ``key``.

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

    def reset_parameters(self) -> None:
        """Re-draw the taps (``ResidualDepthwise``'s N(0, std²))."""
        self.param.reset_parameters()

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
        floating(h, "Canon: h")
        if h.dim() != 3 or h.shape[-1] != self.channels:
            raise ValueError(f"Canon expects h (B, L, C={self.channels}), got "
                             f"{tuple(h.shape)}")
        B, L, C = h.shape
        R = self.kernel - 1
        if cache is None or not R:
            return causal_taps(h, self.param)
        if not isinstance(cache, dict):
            raise TypeError(f"Canon: cache must be a dict (a generation cache), got "
                            f"{type(cache).__name__}")
        past = cache.get(key)
        if past is None:
            past = h.new_zeros(B, R, C)  # before the start: the causal padding's zeros
        elif not isinstance(past, Tensor) or tuple(past.shape) != (B, R, C):
            got = tuple(past.shape) if isinstance(past, Tensor) else type(past).__name__
            raise ValueError(f"Canon: cache[{key!r}] must hold the last inputs (B, kernel - 1, "
                             f"C)=({B}, {R}, {C}) of this sequence, got {got}")
        ext = torch.cat([past, h], 1)
        cache[key] = ext[:, L:]
        return causal_taps(ext, self.param, R)

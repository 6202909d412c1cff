"""Shift-matrix bases of N-d grids (CNN layers) and average pooling.

The paper's section "Grid convolutions": a CNN layer is a convolution whose basis matrices are
shift matrices, ``(A_Δ)[m, n] = 1`` iff grid position ``n - m = Δ``, with the kernel a right
cuboid of shifts. Both bases here are *implicit*: they apply themselves by padding, strided views
and sums over the kernel taps, and build the (K, M, N) tensor only in ``to_dense()``. Grids are
flattened row-major (the canonical bijection), channels last in the bundle ``(B, M, C)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..costs import Route
from ..kernels.flat import FlatTaps, GridChannelwise
from ..kernels.geometry import (
    CONV,
    GridGeometry,
    as_int,
    as_shape,
    grid_indices,
    outer_prod,
    row_major,
    row_major_ints,
    same_padding,
)
from ..kernels.shift import GridOp, batch_chunks
from ..kernels.taps import TapConv, TapLayout, is_channels_first
from .base import Basis, Sparse

__all__ = ["Grid", "AvgPool", "same_padding", "conv_weight"]

# ------------------------------------------------------------------------------------------------
class Grid(GridGeometry, Basis):
    """Shift matrices of an N-d grid: the basis of a CNN layer, ``K = prod(kernel_size)``.

    ``A[k, m, n] = 1`` iff input position m (row-major over ``in_shape``) is what output position
    n (row-major over ``out_shape``) reads at kernel offset k (row-major over ``kernel_size``),
    i.e. ``m = n * stride - padding_before + offset_k * dilation`` per grid dimension, so a torch
    weight ``W[q, p, *kernel]`` is ``theta[k, p, q]``. ``padding``: an int, one int per dim, one
    ``(before, after)`` pair per dim, ``"valid"`` or ``"same"`` (torch's rule, stride 1). Zero
    padding. ``native=False`` hides the fused ``F.convNd`` kernel from the planner, so that the
    shift-and-accumulate routes are used: the paper's three orders on the grid's own shift
    primitives, and the Grid's tap routes (``routes``), which apply every shift as a row offset
    into one padded copy of x.
    """

    _transient = ("_taps", "_tap_layout", "_flat_taps")

    def __init__(self, in_shape, kernel_size, stride=1, padding=0, dilation=1, *,
                 native: bool = True, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None):
        self._setup(in_shape, kernel_size, stride, padding, dilation, "Grid")
        self.out_shape = self._out_shape("Grid")
        Basis.__init__(self, math.prod(self.kernel_size), math.prod(self.in_shape),
                       math.prod(self.out_shape))
        self.native = bool(native)
        # a grid holds no tensors: these only set what ``dtype``/``device`` (to_dense) report
        self._to_dtype = dtype
        self._to_device = torch.device(device) if device is not None else None
        self._taps = None
        self._tap_layout = None
        self._flat_taps = None

    # -- description --------------------------------------------------------------------------
    def cache_key(self):
        """The geometry that identifies this grid (shape, kernel, stride, padding, dilation)."""
        return (self.in_shape, self.kernel_size, self.stride, self.padding, self.dilation)

    def __eq__(self, other):
        return isinstance(other, Grid) and self.cache_key() == other.cache_key()

    def __hash__(self):
        return hash(("Grid", self.cache_key()))

    def __repr__(self):
        return (f"Grid(in_shape={self.in_shape}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"out_shape={self.out_shape})")

    @property
    def offsets(self) -> Tensor:
        """(K, d) kernel offsets, row-major: tap k reads offset ``offsets[k] * dilation``."""
        return row_major(self.kernel_size)

    @property
    def shifts(self) -> Tensor:
        """(K, d) the paper's Δ_k: output n reads input ``n * stride - Δ_k`` (n - Δ_k at stride 1).

        Δ_k = ε + offset_k δ with offsets ε = padding_before and strides δ = -dilation
        (eq. "cnn-shift"); at stride 1, ``A_k`` is exactly the shift matrix of Δ_k.
        """
        before = torch.tensor([b for b, _ in self.padding])
        return before - self.offsets * torch.tensor(self.dilation)

    # -- explicit forms -----------------------------------------------------------------------
    def indices(self) -> Tensor:
        """(3, nnz) long tensor of the nonzero entries ``[k; m; n]`` (all values 1)."""
        return grid_indices(self.in_shape, self.out_shape, self.kernel_size, self.stride,
                        self.padding, self.dilation)

    def to_dense(self) -> Tensor:
        A = torch.zeros(self.K, self.M, self.N, dtype=self.dtype, device=self.device)
        k, m, n = self.indices().to(self.device)
        A[k, m, n] = 1
        return A

    def to_sparse(self) -> Sparse:
        """The same basis as an explicit ``Sparse`` (COO) basis."""
        idx = self.indices().to(self.device)
        return Sparse(idx, torch.ones(idx.shape[1], dtype=self.dtype, device=self.device),
                      self.shape)

    # -- primitives ---------------------------------------------------------------------------
    @property
    def taps(self) -> list[tuple[int, tuple[slice, ...], tuple[slice, ...]]]:
        """Per kernel tap k with any in-range read: ``(k, out_slices, in_slices)`` over the grid.

        ``y[out_slices] += x[in_slices]`` is the tap's shift with zero padding: the output
        positions whose input lies outside the grid are simply not written (no padded copy).
        """
        if self._taps is None:
            taps = []
            for k, off in enumerate(row_major_ints(self.kernel_size)):
                n_sl, m_sl = [], []
                for o, dl, s, (b, _), n_in, n_out in zip(off, self.dilation, self.stride,
                                                          self.padding, self.in_shape,
                                                          self.out_shape):
                    shift = o * dl - b  # input m = n * s + shift
                    lo = max(0, -(shift // s))  # ceil(-shift / s)
                    hi = min(n_out - 1, (n_in - 1 - shift) // s)
                    if hi < lo:
                        break
                    n_sl.append(slice(lo, hi + 1))
                    m0 = lo * s + shift
                    m_sl.append(slice(m0, m0 + (hi - lo) * s + 1, s))
                else:
                    taps.append((k, tuple(n_sl), tuple(m_sl)))
            self._taps = taps
        return self._taps

    def _check(self, t: Tensor, dims: int, what: str) -> None:
        if t.dim() != dims or t.shape[1] != self.M or (dims == 4 and t.shape[2] != self.K):
            exp = "(B, M, C)" if dims == 3 else "(B, M, K, C)"
            raise ValueError(
                f"Grid.{what} expects {exp} with M={self.M} (in_shape {self.in_shape})"
                + (f", K={self.K}" if dims == 4 else "") + f", got shape {tuple(t.shape)}")

    def propagate(self, x: Tensor) -> Tensor:
        """(B, M, C) -> (B, N, K, C): every kernel tap's shifted copy (im2col)."""
        self._check(x, 3, "propagate")
        return GridOp.apply(self, "im2col", x)

    def propagate_heads(self, z: Tensor) -> Tensor:
        """(B, M, K, C) -> (B, N, K, C): tap k's shift applied to slice k."""
        self._check(z, 4, "propagate_heads")
        return GridOp.apply(self, "heads", z)

    def propagate_sum(self, z: Tensor) -> Tensor:
        """(B, M, K, C) -> (B, N, C): Σ_k shift_k(z_k), accumulated tap by tap."""
        self._check(z, 4, "propagate_sum")
        return GridOp.apply(self, "psum", z)

    def channelwise_sum(self, x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
        """(B, M, C), w (K, C) -> (B, N, C): Σ_k A_kᵀ (x ⊙ w_k) (+ bias (C,)), a depthwise
        convolution.

        Shift-and-accumulate tap by tap (one multiply-add pass per tap), with no (B, M, K, C)
        temporary; an optional basis hook that depthwise parameter forms use when present.
        """
        self._check(x, 3, "channelwise_sum")
        C = x.shape[2]
        if w.dim() != 2 or w.shape[0] != self.K or w.shape[1] != C:
            raise ValueError(f"Grid.channelwise_sum needs w (K, C)=({self.K}, {C}), "
                             f"got shape {tuple(w.shape)}")
        if bias is not None and tuple(bias.shape) != (C,):
            raise ValueError(f"Grid.channelwise_sum needs bias (C,)=({C},), got shape "
                             f"{tuple(bias.shape)}")
        return GridChannelwise.apply(self, x, w.to(x.dtype),
                                      None if bias is None else bias.to(x.dtype))

    def apply_op(self, op: str, t: Tensor) -> Tensor:
        """The shift-and-accumulate kernel ``op`` on t, without autograd (``GridOp`` wraps it
        with its adjoint)."""
        B, C = t.shape[0], t.shape[-1]
        K = self.K
        full = (slice(None),)
        if op == "im2col":  # (B, M, C) -> (B, N, K, C)
            # pad once, view every window with unfold, and copy once in (n, k, c) order: one
            # pass, much faster than K strided copies when C is small (a 3-channel stem)
            d = self.ndim
            v = self._pad(t.reshape(B, *self.in_shape, C), 1)
            for i in range(d):
                span = self.dilation[i] * (self.kernel_size[i] - 1) + 1
                v = v.unfold(1 + i, span, self.stride[i])  # appends the window dim last
            if any(dl > 1 for dl in self.dilation):
                v = v[(Ellipsis, *[slice(None, None, dl) for dl in self.dilation])]
            perm = [0, *range(1, d + 1), *range(d + 2, 2 * d + 2), d + 1]
            return v.permute(perm).reshape(B, self.N, K, C)
        if op == "heads":  # (B, M, K, C) -> (B, N, K, C), uncovered reads are zero
            src = t.reshape(B, *self.in_shape, K, C)
            out = t.new_zeros(B, *self.out_shape, K, C)
            for k, n_sl, m_sl in self.taps:
                out[full + n_sl + (k,)] = src[full + m_sl + (k,)]
            return out.reshape(B, self.N, K, C)
        # the accumulating loops run per batch chunk so that the output stays in cache
        # across the K taps (read-modify-write from memory once, not K times)
        per_item = (self.M + self.N) * K * C * t.element_size()
        if op == "psum":  # (B, M, K, C) -> (B, *out, C)
            src = t.reshape(B, *self.in_shape, K, C)
            out = t.new_zeros(B, *self.out_shape, C)
            for bs in batch_chunks(B, per_item):
                s, o = src[bs], out[bs]
                for k, n_sl, m_sl in self.taps:
                    o[full + n_sl].add_(s[full + m_sl + (k,)])
            return out.reshape(B, self.N, C)
        # adjoints, from the output grid back to the input grid
        if op == "col2im":  # (B, N, K, C) -> (B, M, C)
            src = t.reshape(B, *self.out_shape, K, C)
            out = t.new_zeros(B, *self.in_shape, C)
            for bs in batch_chunks(B, per_item):
                s, o = src[bs], out[bs]
                for k, n_sl, m_sl in self.taps:
                    o[full + m_sl].add_(s[full + n_sl + (k,)])
            return out.reshape(B, self.M, C)
        if op in ("heads_T", "psum_T"):  # (B, N, K, C) or (B, N, C) -> (B, M, K, C)
            src = t.reshape(B, *self.out_shape, *((K,) if op == "heads_T" else ()), C)
            out = t.new_zeros(B, *self.in_shape, K, C)
            for k, n_sl, m_sl in self.taps:
                # each tap writes its own slice k and reads each n once: plain copies suffice
                out[full + m_sl + (k,)] = src[full + n_sl + ((k,) if op == "heads_T" else ())]
            return out.reshape(B, self.M, K, C)
        raise ValueError(f"unknown grid op {op!r}")

    # -- the Grid's own routes: taps as row offsets (see TapLayout) ----------------------------
    @property
    def tap_layout(self) -> TapLayout:
        """Where every tap reads in the phase-split padded copy of an input (built once)."""
        if self._tap_layout is None:
            self._tap_layout = TapLayout(self)
        return self._tap_layout

    @property
    def flat_taps(self) -> FlatTaps | None:
        """Every tap as a flat offset into channels-first planes (built once), or None unless
        the grid is stride 1 with an output of the input's shape."""
        if self._flat_taps is None and FlatTaps.applies(self):
            self._flat_taps = FlatTaps(self)
        return self._flat_taps

    def routes(self, x: Tensor, theta) -> list:
        """``native`` (F.convNd, unless ``native=False``), ``tap_gemm`` and ``tap_im2col``.

        The tap routes compute y = Σ_k A_kᵀ x Θ_k with each A_kᵀ a row offset: both read one
        zero-padded, stride-phase-split copy of x and never build a (B, N, K, C) temporary;
        ``tap_gemm`` runs one GEMM per tap, ``tap_im2col`` one GEMM per row chunk on the chunk's
        taps side by side (inner size K*P: better for few input channels). Each fuses the bias.
        """
        B, _, P = x.shape
        Q = theta.Q
        lay = self.tap_layout
        R, T = lay.rows(B), len(lay.taps)
        temp = (len(lay.phases) * B * lay.V + lay.tail) * P + B * lay.V * Q
        dev = self.device.type

        def gemm(x, th, bias):
            return TapConv.apply(self, "gemm", x, th().to(x.dtype), bias)

        def im2col(x, th, bias):
            return TapConv.apply(self, "im2col", x, th().to(x.dtype), bias)

        # measured weights (GEMM multiply-adds): a GEMM with inner size P below the full-rate
        # size runs slower (each tap rewrites its (rows, Q) output chunk for only P multiply-adds
        # per element); the im2col copy costs per element, more when channels-last rows are
        # short runs of P channels (an RGB stem)
        slow = max(1.0, self.cost_weight("tap_full_rate_p") / P)
        copy = self.cost_weight("tap_copy") * (1.0 if is_channels_first(x) else
                                          1.0 + self.cost_weight("tap_short_rows") / P)
        cf = "channels_first"
        routes = [Route("tap_gemm", R * T * (slow * P * Q + 6 * Q + 2 * P), temp, gemm,
                        fuses_bias=True, device_type=dev, reads=cf),
                  Route("tap_im2col", R * (T * P * Q + copy * T * P + 2 * Q), temp, im2col,
                        fuses_bias=True, device_type=dev, reads=cf)]
        form = self._native_form(theta)
        if form is not None:
            routes.insert(0, Route("native", self._native_flops(B, P, Q, theta, form), 0.0,
                                   self._native_run, fuses_bias=True, device_type=dev,
                                   reads=cf))
        return routes

    def channelwise_flops(self, C: int, B: int = 1) -> float:
        """Weighted cost of ``channelwise_sum`` on B items of C channels: one fused
        multiply-add pass per tap over the virtual rows."""
        lay = self.tap_layout
        return float(self.cost_weight("tap_copy") * self.cost_weight("tap_channelwise")
                     * len(lay.taps) * lay.rows(B) * C)

    # -- costs ----------------------------------------------------------------------------------
    #: one element of ``propagate`` (im2col) or ``propagate_sum``: a strided copy into a
    #: (B, N, K, C) temporary, usually larger than any cache (the cost table's "grid_shift")
    cost_kernel = "grid_shift"

    def apply_flops(self) -> float:
        return float(self.K * self.N)

    def propagate_sum_flops(self, C: int) -> float:
        # each tap reads and rewrites the output where propagate only copies
        return self.cost_weight("grid_sum") * self.flop_weight * self.apply_flops() * C

    # -- fused kernel: F.conv1d/2d/3d ----------------------------------------------------------
    def _native_form(self, theta):
        """How theta maps to F.convNd, or None: 'tensor', 'grouped', 'depthwise' or 'module'."""
        if not self.native or self.ndim not in CONV:
            return None
        return _theta_form(theta)

    def _native_flops(self, B, P, Q, theta, form) -> float:
        # F.convNd runs at about the GEMM rate with no temporaries, while the routes it competes
        # with move (B, M, K, C)-sized intermediates that the element cost undercounts (measured:
        # a 5x5 64->64 ControlledSeparable layer, 0.13 s by F.conv2d on the materialised theta
        # against 0.8-1.5 s by every factored route): the cost table's "native_conv"
        K, N = self.K, self.N
        if form == "grouped":
            flops = B * N * K * P * Q / theta.groups
        elif form == "depthwise":
            flops = B * N * (K * P + P * Q)
        else:
            flops = B * N * K * P * Q + (K * P * Q if form == "module" else 0)
        return float(self.cost_weight("native_conv") * flops)

    def conv_weight(self, theta) -> tuple[Tensor, int]:
        """The torch weight (Q, P/groups, *kernel_size) and groups equal to a theta / module."""
        return conv_weight(theta, self.kernel_size)

    def conv_image(self, x: Tensor, theta, bias: Tensor | None = None) -> Tensor:
        """x (B, P, *in_shape) channels-first -> (B, Q, *out_shape) by F.conv1d/2d/3d.

        ``theta``: a (K, P, Q) tensor or a parameter form (a depthwise-separable form runs as
        two convolutions, a grouped form as one grouped convolution).
        """
        form = self._native_form(theta)
        if form is None:
            raise ValueError(f"no F.convNd kernel for a {self.ndim}-d Grid with "
                             f"{type(theta).__name__} theta (native={self.native})")
        if x.dim() != self.ndim + 2 or tuple(x.shape[2:]) != self.in_shape:
            raise ValueError(f"Grid.conv_image expects (B, P, *in_shape) with in_shape "
                             f"{self.in_shape}, got shape {tuple(x.shape)}")
        conv = CONV[self.ndim]
        xp, pad = self._channels_first_pad(x)
        pad = pad if pad is not None else 0
        bias = None if bias is None else bias.to(x.dtype)
        if form == "depthwise":
            depth, point = theta.separable_factors()
            P = depth.shape[1]
            w = depth.to(x.dtype).t().contiguous().reshape(P, 1, *self.kernel_size)
            h = conv(xp, w, None, self.stride, pad, self.dilation, P)  # (B, P, *out)
            W = point.to(x.dtype).t().contiguous().reshape(point.shape[1], P, *(1,) * self.ndim)
            return conv(h, W, bias)
        W, g = self.conv_weight(theta)
        return conv(xp, W.to(x.dtype), bias, self.stride, pad, self.dilation, g)

    def _native_run(self, x: Tensor, theta, bias: Tensor | None = None) -> Tensor:
        """x (B, M, P) -> (B, N, Q) by F.convNd on the channels-first view of the bundle."""
        B, M, P = x.shape
        img = x.reshape(B, *self.in_shape, P).movedim(-1, 1)  # a view (channels_last strides)
        y = self.conv_image(img, theta, bias)
        return y.movedim(1, -1).reshape(B, self.N, y.shape[1])


def _theta_form(theta) -> str:
    """How a theta maps onto F.convNd: 'tensor', 'grouped', 'depthwise' or 'module' (any other
    parameter form: theta (K, P, Q) is small, materialise it)."""
    if isinstance(theta, Tensor):
        return "tensor"
    if theta.blocks() is not None:
        return "grouped"
    if theta.separable_factors() is not None:
        return "depthwise"
    return "module" if isinstance(theta, torch.nn.Module) else "tensor"


# ------------------------------------------------------------------------------------------------
class AvgPool(GridGeometry, Basis):
    """Average pooling as a ``K = 1`` basis: ``A[0, m, n] = 1/divisor(n)`` over n's window.

    As torch's ``AvgPoolNd``: ``stride`` defaults to ``kernel_size``, padding is counted in the
    divisor (``count_include_pad=True``), ``ceil_mode`` adds the last partial windows, and
    ``divisor_override`` replaces the divisor. ``padding`` takes the forms of ``Grid``.
    """

    cost_kernel = "avgpool"
    _transient = ("_weights",)

    def __init__(self, in_shape, kernel_size, stride=None, padding=0, *, ceil_mode=False,
                 count_include_pad=True, divisor_override=None, native: bool = True,
                 dtype=None, device=None):
        in_shape_t = as_shape(in_shape, "AvgPool in_shape")
        if stride is None:
            stride = kernel_size
        self._setup(in_shape_t, kernel_size, stride, padding, 1, "AvgPool")
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        if divisor_override is not None:
            divisor_override = as_int(divisor_override, "divisor_override")
            if divisor_override == 0:
                raise ValueError("divisor_override must be nonzero")
        self.divisor_override = divisor_override
        self.native = bool(native)
        self._to_dtype = dtype
        self._to_device = torch.device(device) if device is not None else None
        out = list(self._out_shape("AvgPool"))
        if self.ceil_mode:
            for i in range(self.ndim):
                b, a = self.padding[i]
                size = self.in_shape[i] + b + a
                o = -(-(size - self.kernel_size[i]) // self.stride[i]) + 1
                # torch: the last window must start inside the input or its left padding
                if (o - 1) * self.stride[i] >= self.in_shape[i] + b:
                    o -= 1
                out[i] = o
        self.out_shape = tuple(out)
        # ceil_mode windows may run past the padding: pad further (zeros) so all windows fit
        self._sum_pads = tuple(
            (b, max(a, (o - 1) * s + k - n - b)) for (b, a), o, s, k, n in
            zip(self.padding, self.out_shape, self.stride, self.kernel_size, self.in_shape))
        Basis.__init__(self, 1, math.prod(self.in_shape), math.prod(self.out_shape))
        self._weights: dict = {}

    def __repr__(self):
        return (f"AvgPool(in_shape={self.in_shape}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, ceil_mode={self.ceil_mode}, "
                f"count_include_pad={self.count_include_pad}, "
                f"divisor_override={self.divisor_override}, out_shape={self.out_shape})")

    def weights(self, dtype=None, device=None) -> Tensor:
        """(N,) the factor 1/divisor of each output (0 for a window with no input), as torch."""
        dtype = dtype or self.dtype
        device = device if device is not None else self.device
        key = (dtype, device)
        if key not in self._weights:
            per_dim_pool, per_dim_valid = [], []
            for i in range(self.ndim):
                b, a = self.padding[i]
                n_in, k = self.in_shape[i], self.kernel_size[i]
                start = torch.arange(self.out_shape[i]) * self.stride[i] - b
                end = torch.clamp(start + k, max=n_in + a)
                per_dim_pool.append(end - start)
                per_dim_valid.append(torch.clamp(end, max=n_in) - torch.clamp(start, min=0))
            pool = outer_prod(per_dim_pool)
            valid = outer_prod(per_dim_valid)
            if self.divisor_override is not None:
                div = torch.full_like(pool, self.divisor_override, dtype=torch.float64)
            elif self.count_include_pad:
                div = pool.double()
            else:
                div = valid.double()
            w = torch.where(valid > 0, 1.0 / div.clamp(min=1e-300), torch.zeros_like(div))
            self._weights[key] = w.to(device=device, dtype=dtype)
        return self._weights[key]

    def window_sum(self, x: Tensor) -> Tensor:
        """(B, M, C) -> (B, N, C): sum over each window (zeros outside), one dim at a time."""
        B, M, C = x.shape
        if M != self.M:
            raise ValueError(f"AvgPool expects (B, M, C) with M={self.M} (in_shape "
                             f"{self.in_shape}), got shape {tuple(x.shape)}")
        t = self._pad(x.reshape(B, *self.in_shape, C), 1, self._sum_pads)
        for i in range(self.ndim):
            # the box sum is separable: unfold dim i into windows and sum them
            t = t.unfold(1 + i, self.kernel_size[i], self.stride[i]).sum(-1)
            t = t.narrow(1 + i, 0, self.out_shape[i])
        return t.reshape(B, self.N, C)

    def propagate(self, x):
        y = self.window_sum(x) * self.weights(x.dtype, x.device).unsqueeze(-1)
        return y.unsqueeze(2)

    def propagate_heads(self, z):
        if z.dim() != 4 or z.shape[2] != 1:
            raise ValueError(f"AvgPool.propagate_heads expects (B, M, 1, C), got {tuple(z.shape)}")
        return self.propagate(z[:, :, 0])

    def propagate_sum(self, z):
        return self.propagate_heads(z)[:, :, 0]

    def apply_flops(self):
        return float(sum(self.kernel_size) * self.N)

    def to_dense(self):
        _, m, n = grid_indices(self.in_shape, self.out_shape, self.kernel_size, self.stride,
                           self.padding, self.dilation)
        A = torch.zeros(1, self.M, self.N, dtype=self.dtype, device=self.device)
        m, n = m.to(self.device), n.to(self.device)
        A[0, m, n] = self.weights()[n]
        return A

    # -- fused kernel: F.avg_poolNd -------------------------------------------------------------
    def native_ok(self) -> bool:
        """Whether torch's pooling kernel computes this pooling exactly."""
        return (self.native and self.ndim in (1, 2, 3)
                and all(b == a and 2 * b <= k for (b, a), k in
                        zip(self.padding, self.kernel_size)))

    def pool_image(self, x: Tensor) -> Tensor:
        """x (B, C, *in_shape) -> (B, C, *out_shape) by F.avg_pool1d/2d/3d."""
        if not self.native_ok():
            raise ValueError(f"no F.avg_poolNd kernel for {self!r} (needs 1-3 dims and symmetric "
                             "padding of at most half the kernel)")
        if x.dim() != self.ndim + 2 or tuple(x.shape[2:]) != self.in_shape:
            raise ValueError(f"AvgPool.pool_image expects (B, C, *in_shape) with in_shape "
                             f"{self.in_shape}, got shape {tuple(x.shape)}")
        pad = tuple(b for b, _ in self.padding)
        kw = dict(ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad)
        if self.ndim == 1:
            # avg_pool1d has no divisor_override: pool a unit 2nd dimension instead
            y = F.avg_pool2d(x.unsqueeze(2), (1, *self.kernel_size), (1, *self.stride),
                             (0, *pad), divisor_override=self.divisor_override, **kw)
            return y.squeeze(2)
        fn = F.avg_pool2d if self.ndim == 2 else F.avg_pool3d
        return fn(x, self.kernel_size, self.stride, pad,
                  divisor_override=self.divisor_override, **kw)

    def routes(self, x: Tensor, theta) -> list:
        """``native``: F.avg_poolNd and theta[0] on the side with fewer channels."""
        if not self.native_ok():
            return []
        B, _, P = x.shape
        Q = theta.Q
        pool = math.prod(self.kernel_size) * self.N
        flops = B * (min(P, Q) * pool + min(self.M * P * Q, self.N * P * Q))
        return [Route("native", float(flops), 0.0, self._native_run,
                      device_type=self.device.type)]

    def _native_run(self, x: Tensor, theta, bias=None) -> Tensor:
        """x (B, M, P) -> (B, N, Q): pool and apply theta[0], on the side with fewer channels."""
        th = theta()[0].to(x.dtype)  # (P, Q)
        B, M, P = x.shape
        Q = th.shape[1]
        first = Q < P  # pooling commutes with the channel map: pool the narrower side
        if first:
            x = x @ th
        C = x.shape[2]
        y = self.pool_image(x.reshape(B, *self.in_shape, C).movedim(-1, 1))
        y = y.movedim(1, -1).reshape(B, self.N, C)
        return y if first else y @ th


def conv_weight(theta, kernel_size: Sequence[int]) -> tuple[Tensor, int]:
    """theta (K, P, Q) or a params module -> torch weight (Q, P/groups, *kernel_size), groups.

    A block-diagonal (``Grouped``) form keeps its groups; any other is materialised (groups 1).
    """
    K = math.prod(kernel_size)
    blocks = None if isinstance(theta, Tensor) else theta.blocks()
    if blocks is not None:
        _, g, Pg, Qg = blocks.shape
        W = blocks.permute(1, 3, 2, 0).reshape(g * Qg, Pg, *kernel_size)
        # contiguous: torch's conv kernels take slower paths on a strided weight
        return W.contiguous(), g
    th = theta if isinstance(theta, Tensor) else theta()
    if th.dim() != 3 or th.shape[0] != K:
        raise ValueError(f"theta must be (K, P, Q) with K={K} (kernel_size {tuple(kernel_size)})"
                         f", got shape {tuple(th.shape)}")
    _, P, Q = th.shape
    return th.permute(2, 1, 0).reshape(Q, P, *kernel_size).contiguous(), 1


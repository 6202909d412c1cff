"""Shift-matrix bases of N-d grids (CNN layers) and average pooling.

The paper's section "Grid convolutions": a CNN layer is a convolution whose basis matrices are
shift matrices, ``(A_Δ)[m, n] = 1`` iff grid position ``n - m = Δ``, with the kernel a right
cuboid of shifts. Both bases here are *implicit*: they apply themselves by padding, strided views
and sums over the kernel taps, and build the (K, M, N) tensor only in ``to_dense()``. Grids are
flattened row-major (the canonical bijection), channels last in the bundle ``(B, M, C)``.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..costs import Route
from .base import Basis, Sparse

__all__ = ["Grid", "AvgPool"]

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


# ------------------------------------------------------------------------------------------------
# argument normalisation
def _int(v, what: str) -> int:
    if isinstance(v, bool):
        raise TypeError(f"{what} must be an int, got bool {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(v).__name__} {v!r}") from None


def _shape(v, what: str) -> tuple[int, ...]:
    """A non-empty tuple of positive ints from an int or a sequence of ints."""
    if isinstance(v, torch.Size):
        v = tuple(v)
    vals = (v,) if not isinstance(v, Sequence) or isinstance(v, str) else tuple(v)
    if not vals:
        raise ValueError(f"{what} must have at least one dimension, got {v!r}")
    out = tuple(_int(a, what) for a in vals)
    if any(a < 1 for a in out):
        raise ValueError(f"{what} entries must be >= 1, got {out}")
    return out


def _per_dim(v, d: int, what: str, low: int = 1) -> tuple[int, ...]:
    """An int broadcast to ``d`` dims, or a sequence of exactly ``d`` ints >= ``low``."""
    if isinstance(v, Sequence) and not isinstance(v, str):
        vals = tuple(_int(a, what) for a in v)
        if len(vals) != d:
            raise ValueError(f"{what} has {len(vals)} entries {vals} but the grid has {d} dims")
    else:
        vals = (_int(v, what),) * d
    if any(a < low for a in vals):
        raise ValueError(f"{what} entries must be >= {low}, got {vals}")
    return vals


def same_padding(kernel_size: Sequence[int],
                 dilation: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """torch's ``padding="same"``: total ``dilation*(k-1)`` per dim, the odd extra one after."""
    out = []
    for k, dl in zip(kernel_size, dilation):
        total = dl * (k - 1)
        out.append((total // 2, total - total // 2))
    return tuple(out)


def _pad_pairs(padding, d: int, kernel, stride, dilation) -> tuple[tuple[int, int], ...]:
    """((before, after), ...) per dim from an int, d ints, d pairs, ``"valid"`` or ``"same"``."""
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * d
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"padding='same' needs stride 1 in every dim, got stride {stride}")
            return same_padding(kernel, dilation)
        raise ValueError(f"padding string must be 'same' or 'valid', got {padding!r}")
    if isinstance(padding, Sequence):
        if len(padding) != d:
            raise ValueError(
                f"padding has {len(padding)} entries {tuple(padding)!r} but the grid has {d} dims"
                " (give an int, one int per dim, or one (before, after) pair per dim)")
        pairs = []
        for p in padding:
            if isinstance(p, Sequence) and not isinstance(p, str):
                if len(p) != 2:
                    raise ValueError(f"a padding pair must be (before, after), got {tuple(p)!r}")
                pairs.append((_int(p[0], "padding"), _int(p[1], "padding")))
            else:
                v = _int(p, "padding")
                pairs.append((v, v))
    else:
        v = _int(padding, "padding")
        pairs = [(v, v)] * d
    if any(a < 0 or b < 0 for a, b in pairs):
        raise ValueError(f"padding must be >= 0, got {tuple(pairs)}")
    return tuple(pairs)


def _pad_spec(pads, trailing: int) -> list[int]:
    """F.pad's flat list for spatial dims followed by ``trailing`` unpadded dims."""
    spec = [0, 0] * trailing
    for b, a in reversed(pads):
        spec += [b, a]
    return spec


def _row_major_ints(shape: Sequence[int]) -> list[tuple[int, ...]]:
    """The coordinates of ``shape``, row-major, as plain ints (``torch.compile`` traces the
    layouts built from them; a tensor's ``.tolist()`` would be data-dependent there)."""
    return list(itertools.product(*(range(s) for s in shape)))


def _row_major(shape: Sequence[int]) -> Tensor:
    """(prod(shape), len(shape)) coordinates, row-major."""
    axes = [torch.arange(s) for s in shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(shape))


# ------------------------------------------------------------------------------------------------
class _GridGeometry:
    """Sizes shared by Grid and AvgPool: input/output shapes, kernel, stride, dilation, pads."""

    def _setup(self, in_shape, kernel_size, stride, padding, dilation, name):
        self.in_shape = _shape(in_shape, f"{name} in_shape")
        d = self.ndim = len(self.in_shape)
        self.kernel_size = _per_dim(kernel_size, d, f"{name} kernel_size")
        self.stride = _per_dim(stride, d, f"{name} stride")
        self.dilation = _per_dim(dilation, d, f"{name} dilation")
        self.padding = _pad_pairs(padding, d, self.kernel_size, self.stride, self.dilation)

    def _out_shape(self, name, extra_after=None):
        out = []
        for i in range(self.ndim):
            span = self.dilation[i] * (self.kernel_size[i] - 1) + 1
            b, a = self.padding[i]
            size = self.in_shape[i] + b + a
            if size < span:
                raise ValueError(
                    f"{name}: along dim {i} the padded input has {size} positions (in_shape "
                    f"{self.in_shape}, padding {self.padding}) but the kernel spans {span} "
                    f"(kernel_size {self.kernel_size}, dilation {self.dilation}): no output")
            out.append((size - span) // self.stride[i] + 1)
        return tuple(out)

    def _pad(self, t: Tensor, trailing: int, pads=None) -> Tensor:
        """Zero-pad the grid dims of (B, *in_shape, *trailing) -> (B, *padded, *trailing)."""
        pads = self.padding if pads is None else pads
        if all(b == 0 and a == 0 for b, a in pads):
            return t
        return F.pad(t, _pad_spec(pads, trailing))

    def _channels_first_pad(self, x: Tensor) -> tuple[Tensor, tuple[int, ...] | None]:
        """x (B, C, *in_shape) padded by F.pad when asymmetric; else the symmetric padding."""
        if all(b == a for b, a in self.padding):
            return x, tuple(b for b, _ in self.padding)
        return F.pad(x, _pad_spec(self.padding, 0)), None


# ------------------------------------------------------------------------------------------------
class Grid(_GridGeometry, Basis):
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
    def _key(self):
        return (self.in_shape, self.kernel_size, self.stride, self.padding, self.dilation)

    def __eq__(self, other):
        return isinstance(other, Grid) and self._key() == other._key()

    def __hash__(self):
        return hash(("Grid", self._key()))

    def __repr__(self):
        return (f"Grid(in_shape={self.in_shape}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"out_shape={self.out_shape})")

    @property
    def offsets(self) -> Tensor:
        """(K, d) kernel offsets, row-major: tap k reads offset ``offsets[k] * dilation``."""
        return _row_major(self.kernel_size)

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
        return _indices(self.in_shape, self.out_shape, self.kernel_size, self.stride,
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
    def _check(self, t: Tensor, dims: int, what: str) -> None:
        if t.dim() != dims or t.shape[1] != self.M or (dims == 4 and t.shape[2] != self.K):
            exp = "(B, M, C)" if dims == 3 else "(B, M, K, C)"
            raise ValueError(
                f"Grid.{what} expects {exp} with M={self.M} (in_shape {self.in_shape})"
                + (f", K={self.K}" if dims == 4 else "") + f", got shape {tuple(t.shape)}")

    @property
    def taps(self) -> list[tuple[int, tuple[slice, ...], tuple[slice, ...]]]:
        """Per kernel tap k with any in-range read: ``(k, out_slices, in_slices)`` over the grid.

        ``y[out_slices] += x[in_slices]`` is the tap's shift with zero padding: the output
        positions whose input lies outside the grid are simply not written (no padded copy).
        """
        if self._taps is None:
            taps = []
            for k, off in enumerate(_row_major_ints(self.kernel_size)):
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
        return _GridOp.apply(self, "im2col", x)

    def propagate_heads(self, z: Tensor) -> Tensor:
        """(B, M, K, C) -> (B, N, K, C): tap k's shift applied to slice k."""
        self._check(z, 4, "propagate_heads")
        return _GridOp.apply(self, "heads", z)

    def propagate_sum(self, z: Tensor) -> Tensor:
        """(B, M, K, C) -> (B, N, C): Σ_k shift_k(z_k), accumulated tap by tap."""
        self._check(z, 4, "propagate_sum")
        return _GridOp.apply(self, "psum", z)

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
        return _GridChannelwise.apply(self, x, w.to(x.dtype),
                                      None if bias is None else bias.to(x.dtype))

    def _apply_op(self, op: str, t: Tensor) -> Tensor:
        """The shift-and-accumulate kernels (no autograd): see ``_GridOp``."""
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
            for bs in _batch_chunks(B, per_item):
                s, o = src[bs], out[bs]
                for k, n_sl, m_sl in self.taps:
                    o[full + n_sl].add_(s[full + m_sl + (k,)])
            return out.reshape(B, self.N, C)
        # adjoints, from the output grid back to the input grid
        if op == "col2im":  # (B, N, K, C) -> (B, M, C)
            src = t.reshape(B, *self.out_shape, K, C)
            out = t.new_zeros(B, *self.in_shape, C)
            for bs in _batch_chunks(B, per_item):
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

    # -- the Grid's own routes: taps as row offsets (see _TapLayout) ----------------------------
    @property
    def tap_layout(self) -> _TapLayout:
        """Where every tap reads in the phase-split padded copy of an input (built once)."""
        if self._tap_layout is None:
            self._tap_layout = _TapLayout(self)
        return self._tap_layout

    @property
    def flat_taps(self) -> _FlatTaps | None:
        """Every tap as a flat offset into channels-first planes (built once), or None unless
        the grid is stride 1 with an output of the input's shape."""
        if self._flat_taps is None and _FlatTaps.applies(self):
            self._flat_taps = _FlatTaps(self)
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
            return _TapConv.apply(self, "gemm", x, th().to(x.dtype), bias)

        def im2col(x, th, bias):
            return _TapConv.apply(self, "im2col", x, th().to(x.dtype), bias)

        # measured weights (GEMM multiply-adds): a GEMM with inner size P below the full-rate
        # size runs slower (each tap rewrites its (rows, Q) output chunk for only P multiply-adds
        # per element); the im2col copy costs per element, more when channels-last rows are
        # short runs of P channels (an RGB stem)
        slow = max(1.0, self.weight("tap_full_rate_p") / P)
        copy = self.weight("tap_copy") * (1.0 if _is_cf(x) else
                                          1.0 + self.weight("tap_short_rows") / P)
        routes = [Route("tap_gemm", R * T * (slow * P * Q + 6 * Q + 2 * P), temp, gemm,
                        fuses_bias=True, device_type=dev),
                  Route("tap_im2col", R * (T * P * Q + copy * T * P + 2 * Q), temp, im2col,
                        fuses_bias=True, device_type=dev)]
        form = self._native_form(theta)
        if form is not None:
            routes.insert(0, Route("native", self._native_flops(B, P, Q, theta, form), 0.0,
                                   self._native_run, fuses_bias=True, device_type=dev))
        return routes

    def channelwise_flops(self, C: int, B: int = 1) -> float:
        """Weighted cost of ``channelwise_sum`` on B items of C channels: one fused
        multiply-add pass per tap over the virtual rows."""
        lay = self.tap_layout
        return float(self.weight("tap_copy") * self.weight("tap_channelwise") * len(lay.taps)
                     * lay.rows(B) * C)

    # -- costs ----------------------------------------------------------------------------------
    #: one element of ``propagate`` (im2col) or ``propagate_sum``: a strided copy into a
    #: (B, N, K, C) temporary, usually larger than any cache (the cost table's "grid_shift")
    cost_kernel = "grid_shift"

    def apply_flops(self) -> float:
        return float(self.K * self.N)

    def propagate_sum_flops(self, C: int) -> float:
        # each tap reads and rewrites the output where propagate only copies
        return self.weight("grid_sum") * self.flop_weight * self.apply_flops() * C

    # -- fused kernel: F.conv1d/2d/3d ----------------------------------------------------------
    def _native_form(self, theta):
        """How theta maps to F.convNd, or None: 'tensor', 'grouped', 'depthwise' or 'module'."""
        if not self.native or self.ndim not in _CONV:
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
        return float(self.weight("native_conv") * flops)

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
        conv = _CONV[self.ndim]
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
class AvgPool(_GridGeometry, Basis):
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
        in_shape_t = _shape(in_shape, "AvgPool in_shape")
        if stride is None:
            stride = kernel_size
        self._setup(in_shape_t, kernel_size, stride, padding, 1, "AvgPool")
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        if divisor_override is not None:
            divisor_override = _int(divisor_override, "divisor_override")
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
            pool = _outer_prod(per_dim_pool)
            valid = _outer_prod(per_dim_valid)
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
        _, m, n = _indices(self.in_shape, self.out_shape, self.kernel_size, self.stride,
                           self.padding, self.dilation)
        A = torch.zeros(1, self.M, self.N, dtype=self.dtype, device=self.device)
        m, n = m.to(self.device), n.to(self.device)
        A[0, m, n] = self.weights()[n]
        return A

    # -- fused kernel: F.avg_poolNd -------------------------------------------------------------
    def _native_ok(self) -> bool:
        return (self.native and self.ndim in (1, 2, 3)
                and all(b == a and 2 * b <= k for (b, a), k in
                        zip(self.padding, self.kernel_size)))

    def pool_image(self, x: Tensor) -> Tensor:
        """x (B, C, *in_shape) -> (B, C, *out_shape) by F.avg_pool1d/2d/3d."""
        if not self._native_ok():
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
        if not self._native_ok():
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


#: each shift kernel's adjoint (a module constant: torch.compile traces the backward)
_ADJOINT = {"im2col": "col2im", "col2im": "im2col", "heads": "heads_T", "heads_T": "heads",
            "psum": "psum_T", "psum_T": "psum"}


class _GridOp(torch.autograd.Function):
    """A grid shift kernel whose backward is its adjoint kernel (itself a _GridOp, so twice
    differentiable): im2col <-> col2im, heads <-> heads_T, psum <-> psum_T."""

    @staticmethod
    def forward(ctx, grid, op, t):
        ctx.grid, ctx.op = grid, op
        out = grid._apply_op(op, t)
        # a 1-tap unpadded grid can return a view of t: hand autograd a tensor of its own
        # (while compiling, storage pointers are not there: copy whenever it can be a view)
        if torch.compiler.is_compiling():
            return out.clone() if grid.K == 1 else out
        return out.clone() if out.untyped_storage().data_ptr() == \
            t.untyped_storage().data_ptr() else out

    @staticmethod
    def backward(ctx, g):
        return None, None, _GridOp.apply(ctx.grid, _ADJOINT[ctx.op], g)


#: bytes of input plus output per batch chunk of the tap loops: small enough to stay in cache
#: across the K taps, so memory is read once per chunk instead of once per tap
_CHUNK_BYTES = 4 << 20
#: at most this many chunks: every tap of every chunk is one (multi-threaded) kernel launch,
#: and many small parallel regions stall badly when other processes share the cores
_MAX_CHUNKS = 8


def _batch_chunks(B: int, per_item: int):
    step = max(1, _CHUNK_BYTES // max(1, per_item), -(-B // _MAX_CHUNKS))
    return [slice(b, min(B, b + step)) for b in range(0, B, step)]


# ------------------------------------------------------------------------------------------------
# Tap routes: every shift becomes a row offset into one phase-split, zero-padded copy of the input
class _TapLayout:
    """Where each tap of a Grid reads, as row offsets into one phase-split padded buffer.

    The input is zero-padded and split into stride phases (``u = s*j + r`` per dim), each phase an
    image of ``phase_shape = ceil(padded / stride)``; only phases some tap reads are stored, one
    after the other, each holding the B images back to back. Output n (coordinates ``n_d``) then
    reads tap k at row ``v + off_k`` with ``v = b*V + Σ n_d S_d`` (S the phase image's row-major
    strides, V its size): every tap is a contiguous (rows, C) slice, so Σ_k A_kᵀ x Θ_k becomes K
    GEMMs on shifted views and nothing (B, N, K, C)-sized is built. Rows ``v`` that are no output
    (the phase image's margins) are computed and dropped; their gradient is zero. ``_Taps`` lays
    the buffer out channels-last or channels-first.
    """

    def __init__(self, grid: Grid):
        d = grid.ndim
        padded = [n + b + a for n, (b, a) in zip(grid.in_shape, grid.padding)]
        self.phase_shape = tuple(-(-p // s) for p, s in zip(padded, grid.stride))
        strides = [math.prod(self.phase_shape[i + 1:]) for i in range(d)]
        self.V = math.prod(self.phase_shape)
        phases: list[tuple[int, ...]] = []
        taps = []  # (k, phase, flat row offset in the phase image)
        kernel = _row_major_ints(grid.kernel_size)
        for k, _, _ in grid.taps:
            off = [o * dl for o, dl in zip(kernel[k], grid.dilation)]
            r = tuple(o % s for o, s in zip(off, grid.stride))
            if r not in phases:
                phases.append(r)
            qv = tuple(o // s for o, s in zip(off, grid.stride))
            taps.append((k, phases.index(r), sum(q * st for q, st in zip(qv, strides))))
        self.phases, self.taps = phases, taps
        self.tail = max([q for _, _, q in taps] or [0])
        # the last row any output reads from, per image: the rest of the phase image is margin
        self.last = sum((o - 1) * st for o, st in zip(grid.out_shape, strides))
        self.crop = tuple(slice(0, o) for o in grid.out_shape)
        # per phase with any input in it: (phase, input slices, where they land in its image)
        self.copies = []
        for ph, r in enumerate(phases):
            src, dst = [], []
            for n, (b, _), s, rr, P_d in zip(grid.in_shape, grid.padding, grid.stride, r,
                                              self.phase_shape):
                j_lo = max(0, -((rr - b) // s))  # ceil((b - r) / s)
                j_hi = min(P_d - 1, (n - 1 + b - rr) // s)
                i_lo = s * j_lo + rr - b
                src.append(slice(i_lo, i_lo + s * (j_hi - j_lo) + 1, s))
                dst.append(slice(j_lo, j_hi + 1))
                if j_hi < j_lo:  # a phase of padding only: it stays zero
                    break
            else:
                self.copies.append((ph, tuple(src), tuple(dst)))

    def rows(self, B: int) -> int:
        """Rows of the virtual output: every image's phase grid up to the last output of B."""
        return (B - 1) * self.V + self.last + 1

    def offsets(self, B: int) -> list[tuple[int, int]]:
        """(k, row offset) per tap for a batch of B."""
        return [(k, ph * B * self.V + q) for k, ph, q in self.taps]


#: bytes per chunk of the tap loops: a chunk's input and output stay in cache across the K
#: taps while each GEMM is still large enough to run at full rate
_TAP_CHUNK_BYTES = 4 << 20
_TAP_MIN_ROWS = 4096
#: chunk bytes of the depthwise multiply-add passes: they are cheap per element, so the fixed
#: ~20 us of every Python-issued op dominates small chunks (measured best at 16 MiB)
_CHANNELWISE_CHUNK_BYTES = 16 << 20


class _Taps:
    """One batch's tap layout in one memory order: buffers, outputs, chunks and tap views.

    Channels-last (``cf`` False): buffer (rows, C), virtual output (B*V, C), a chunk is a range
    of rows and a tap's view a (rows, C) slice. Channels-first (``cf`` True, for a view of an
    NCHW image): buffer (phases, B, C, V + tail), virtual output (B, C, V), a chunk is a range of
    images and a tap's view (images, C, V): every image-channel plane is one padded row.
    """

    def __init__(self, grid: Grid, B: int, cf: bool):
        self.grid, self.lay, self.B, self.cf = grid, grid.tap_layout, B, cf

    def _at(self, spatial: tuple) -> tuple:
        """An index for the grid dims of a (B, C, *grid) / (B, *grid, C) tensor."""
        return (slice(None), slice(None)) + spatial if self.cf else (slice(None),) + spatial

    def _grid(self, x: Tensor, shape) -> Tensor:
        """(B, M, C) -> the (B, C, *shape) / (B, *shape, C) view of the same entries."""
        if self.cf:
            return x.transpose(1, 2).unflatten(2, shape)
        return x.unflatten(1, shape)

    def images(self, buf: Tensor) -> Tensor:
        """The buffer's phase images: (phases, B, C, *phase_shape) / (phases, B, *phase, C)."""
        lay = self.lay
        if self.cf:
            return buf[..., :lay.V].unflatten(-1, lay.phase_shape)
        return buf[:len(lay.phases) * self.B * lay.V].view(len(lay.phases), self.B,
                                                           *lay.phase_shape, buf.shape[-1])

    def new_buffer(self, ref: Tensor, C: int, zero: bool = True) -> Tensor:
        """A phase buffer for C channels: zeros, or with only what ``fill`` leaves unset zeroed."""
        lay = self.lay
        if self.cf:
            shape = (len(lay.phases), self.B, C, lay.V + lay.tail)
        else:
            shape = (len(lay.phases) * self.B * lay.V + lay.tail, C)
        if zero:
            return ref.new_zeros(shape)
        # zero only the padding: the margins of every phase image and the tail
        buf = ref.new_empty(shape)
        (buf[..., lay.V:] if self.cf else buf[len(lay.phases) * self.B * lay.V:]).zero_()
        imgs = self.images(buf)
        filled = {ph: dst for ph, _, dst in lay.copies}
        for ph in range(len(lay.phases)):
            if ph not in filled:
                imgs[ph].zero_()
                continue
            for d, (sl, n) in enumerate(zip(filled[ph], lay.phase_shape)):
                pre = (slice(None),) * d
                if sl.start > 0:
                    imgs[ph][self._at(pre + (slice(0, sl.start),))] = 0
                if sl.stop < n:
                    imgs[ph][self._at(pre + (slice(sl.stop, n),))] = 0
        return buf

    def fill(self, x: Tensor) -> Tensor:
        """x (B, M, C), any strides (a channels-first view when ``cf``) -> the phase buffer:
        one copy of x, zero padding, split into stride phases."""
        buf = self.new_buffer(x, x.shape[2], zero=False)
        imgs, xg = self.images(buf), self._grid(x, self.grid.in_shape)
        for ph, src, dst in self.lay.copies:
            imgs[ph][self._at(dst)] = xg[self._at(src)]
        return buf

    def gather(self, buf: Tensor) -> Tensor:
        """The adjoint of ``fill``: buffer -> (B, M, C) (a channels-first view when ``cf``)."""
        g, B = self.grid, self.B
        C = buf.shape[2] if self.cf else buf.shape[1]
        imgs = self.images(buf)
        out = buf.new_zeros((B, C, *g.in_shape) if self.cf else (B, *g.in_shape, C))
        for ph, src, dst in self.lay.copies:
            out[self._at(src)] = imgs[ph][self._at(dst)]
        return out.flatten(2).transpose(1, 2) if self.cf else out.view(B, g.M, C)

    def new_out(self, ref: Tensor, C: int) -> Tensor:
        """The virtual output for C channels (uninitialised: its margins are never read)."""
        lay = self.lay
        return ref.new_empty(self.B, C, lay.V) if self.cf else ref.new_empty(self.B * lay.V, C)

    def take(self, out: Tensor, bias: Tensor | None = None) -> Tensor:
        """Virtual output -> a new (B, N, C) tensor, margins dropped (channels-first strides
        when ``cf``), plus a (C,) bias if given (in the same pass)."""
        lay, B, d = self.lay, self.B, self.grid.ndim
        C = out.shape[1] if self.cf else out.shape[-1]
        y = _new_result(out, B, self.grid.N, C, self.cf)
        if self.cf:
            dst = y.transpose(1, 2).unflatten(2, self.grid.out_shape)
            src = out.unflatten(-1, lay.phase_shape)[(slice(None), slice(None)) + lay.crop]
            b = None if bias is None else bias.view(C, *(1,) * d)
        else:
            dst = y.view(B, *self.grid.out_shape, C)
            src = out.view(B, *lay.phase_shape, C)[(slice(None),) + lay.crop]
            b = bias
        if b is None:
            dst.copy_(src)
        else:
            torch.add(src, b, out=dst)
        return y

    def spread(self, g: Tensor) -> Tensor:
        """(B, N, C) -> the virtual output with zero margins (the adjoint of ``take``)."""
        lay, B, C = self.lay, self.B, g.shape[2]
        if self.cf:
            full = g.new_zeros(B, C, lay.V)
            full.unflatten(-1, lay.phase_shape)[(slice(None), slice(None)) + lay.crop] = \
                g.transpose(1, 2).unflatten(2, self.grid.out_shape)
            return full
        full = g.new_zeros(B * lay.V, C)
        full.view(B, *lay.phase_shape, C)[(slice(None),) + lay.crop] = \
            g.reshape(B, *self.grid.out_shape, C)
        return full

    def image_chunks(self, width: int, size: int = 0) -> list[tuple[int, int]]:
        """(start, stop) ranges of images of about ``size`` bytes (default: cache-sized);
        ``width`` is the bytes a chunk touches per position of the phase image."""
        step = max(1, (size or _TAP_CHUNK_BYTES) // max(1, width * self.lay.V))
        return [(a, min(self.B, a + step)) for a in range(0, self.B, step)]

    def chunks(self, width: int, size: int = 0) -> list[tuple[int, int]]:
        """(start, stop) ranges of images (``cf``) or of virtual rows, of about ``size`` bytes
        (default: cache-sized); ``width`` is the bytes a chunk touches per output position."""
        if self.cf:
            return self.image_chunks(width, size)
        step = max(_TAP_MIN_ROWS, (size or _TAP_CHUNK_BYTES) // max(1, width))
        n = self.lay.rows(self.B)
        return [(a, min(n, a + step)) for a in range(0, n, step)]

    def views(self, buf: Tensor, c: tuple[int, int]) -> list[tuple[int, Tensor]]:
        """(k, tap k's view of ``buf``) for chunk c: what its output positions read at tap k."""
        a, b = c
        if self.cf:
            return [(k, buf[ph, a:b, :, q:q + self.lay.V]) for k, ph, q in self.lay.taps]
        return [(k, buf[a + off:b + off]) for k, off in self.lay.offsets(self.B)]

    # -- the products, on either layout ---------------------------------------------------------
    def mm(self, a: Tensor, w: Tensor, out: Tensor, accumulate: bool) -> None:
        """out (+)= a·w: channels-last a (R, P) @ w (P, Q); channels-first wᵀ @ a (n, P, V)."""
        if not self.cf:
            if accumulate:
                out.addmm_(a, w)
            else:
                torch.mm(a, w, out=out)
            return
        wt = w.t().expand(a.shape[0], -1, -1)
        if accumulate:
            out.baddbmm_(wt, a)
        else:
            torch.bmm(wt, a, out=out)

    def outer(self, a: Tensor, g: Tensor) -> Tensor:
        """The gradient of w in ``mm`` for output gradient g: aᵀ g over rows (and images)."""
        if not self.cf:
            return a.t() @ g
        return torch.bmm(a, g.transpose(1, 2)).sum(0)

    def scale(self, w: Tensor) -> Tensor:
        """A per-channel vector (C,) shaped to broadcast over a tap view."""
        return w[:, None] if self.cf else w

    def channel_sum(self, t: Tensor) -> Tensor:
        """A tap view's values summed per channel -> (C,)."""
        return t.sum((0, 2)) if self.cf else t.sum(0)

    def cols(self, views: list, col: Tensor | None) -> tuple[Tensor, Tensor]:
        """The taps' views side by side (im2col of one chunk) -> (GEMM operand, reused buffer).

        The operand is (rows, T*P) channels-last, (n, T*P, V) channels-first; the buffer is
        allocated for the first (largest) chunk and reused.
        """
        v = views[0][1]
        if col is None:
            col = v.new_empty(v.shape[0], len(views), *v.shape[1:])
        c = col[:v.shape[0]]
        for i, (_, t) in enumerate(views):
            c[:, i] = t
        return c.flatten(1, 2), col


# ------------------------------------------------------------------------------------------------
# Flat taps: a stride-1 grid whose output has the input's shape, on channels-first planes
#: bytes of one chunk of planes in the flat depthwise passes: a chunk's planes, their masked
#: copies and the output chunk stay in the L2/L3 caches across the K taps (measured on a 2-core
#: Xeon: 0.75-3 MiB alike within noise; 0.25-0.4 MiB 20-30% slower, the per-op cost growing)
_FLAT_CHUNK_BYTES = 1 << 20


class _FlatTaps:
    """Tap k of a stride-1, same-shaped grid as one flat offset into every contiguous plane.

    Output n reads input ``n + off_k`` (row-major flat). Where a tap reads past the edge of a
    dim other than the first, the flat index lands in the tap's *wrap zone* (the last ``-o``
    or first ``o`` entries of that dim, o the tap's offset along it), which no in-range read
    of that tap touches: so each tap reads a copy of the planes with its wrap zone zeroed
    (one copy per distinct offset over the trailing dims, made per cache-sized chunk), and
    reads past the first dim fall outside the flat range. Every tap is then a single strided
    multiply-add over (planes, M - |off_k|): no padded copy and no crop.
    """

    def __init__(self, grid: Grid):
        self.grid = grid
        shape = grid.in_shape
        strides = [math.prod(shape[i + 1:]) for i in range(grid.ndim)]
        self.taps = []  # (k, flat offset, offsets along the trailing dims)
        for k, n_sl, m_sl in grid.taps:
            off = tuple(m.start - n.start for n, m in zip(n_sl, m_sl))
            self.taps.append((k, sum(o * s for o, s in zip(off, strides)), off[1:]))
        self._masks: dict = {}

    @staticmethod
    def applies(grid: Grid) -> bool:
        """Whether the grid is stride 1 with an output of the input's shape."""
        return all(s == 1 for s in grid.stride) and grid.out_shape == grid.in_shape

    def mask(self, key: tuple[int, ...], ref: Tensor) -> Tensor:
        """(M,) ones with the wrap zone of trailing offsets ``key`` zeroed (a whole plane, so
        that masking a chunk is one long-run multiply)."""
        tag = (key, ref.dtype, ref.device)
        if tag not in self._masks:
            m = ref.new_ones(self.grid.in_shape)
            for d, o in enumerate(key, start=1):
                at = (slice(None),) * d
                if o < 0:
                    m[at + (slice(m.shape[d] + o, None),)] = 0
                elif o > 0:
                    m[at + (slice(0, o),)] = 0
            self._masks[tag] = m.reshape(-1)
        return self._masks[tag]

    def step(self, itemsize: int) -> int:
        """Planes per cache-sized chunk."""
        return max(1, _FLAT_CHUNK_BYTES // (self.grid.M * itemsize))

    def chunks(self, B: int, C: int, itemsize: int) -> tuple[int, list[list[tuple[int, int]]]]:
        """(u, groups): ranges of u planes (rows b*C + c of the (B*C, M) planes), grouped so
        that every range in a group holds the same u channels, in order: whole images when
        u >= C (one group), else u | C channels of every image, one group per channel block."""
        u, R = self.step(itemsize), B * C
        if u >= C:
            u = min(u // C * C, R)
            return u, [[(a, min(R, a + u)) for a in range(0, R, u)]]
        u = max(d for d in range(1, u + 1) if C % d == 0)
        return u, [[(b * C + c0, b * C + c0 + u) for b in range(B)] for c0 in range(0, C, u)]

    def _plan(self, flip: bool) -> list[tuple[int, slice, slice, tuple]]:
        """(k, output slice, input slice, trailing key) per tap, nearest the centre first;
        ``flip``: the adjoint's taps (offsets negated)."""
        M, sign, plan = self.grid.M, -1 if flip else 1, []
        for k, off, key in sorted(self.taps, key=lambda t: abs(t[1])):
            off, key = sign * off, tuple(sign * o for o in key)
            dst, src = (slice(0, M - off), slice(off, M)) if off >= 0 else \
                (slice(-off, M), slice(0, M + off))
            plan.append((k, dst, src, key if any(key) else None))
        return plan

    @staticmethod
    def _views(t: Tensor, cols: slice, chunks: list[tuple[int, int]]) -> list[Tensor]:
        """``t[a:b, cols]`` per chunk, built by one split where the chunks are regular."""
        step = chunks[0][1] - chunks[0][0]
        if all(a == i * step for i, (a, _) in enumerate(chunks)):
            return list(t[:, cols].split(step))
        return [t[a:b, cols] for a, b in chunks]

    class _Sources:
        """Per chunk: the chunk's planes with each key's wrap zone zeroed, into one reused
        (rows, M) buffer per key (key None: the planes themselves)."""

        def __init__(self, ft, planes: Tensor, keys, chunks, rows: int):
            self.planes, self.chunks = planes, chunks
            self.pieces = _FlatTaps._views(planes, slice(None), chunks)
            self.bufs = {key: (ft.mask(key, planes), planes.new_empty(rows, planes.shape[1]))
                         for key in dict.fromkeys(keys) if key is not None}

        def views(self, key, cols: slice) -> list[Tensor]:
            """Per chunk, the columns ``cols`` of the planes masked for ``key``."""
            if key is None:
                return _FlatTaps._views(self.planes, cols, self.chunks)
            buf = self.bufs[key][1]
            return [buf[:b - a, cols] for a, b in self.chunks]

        def fill(self, ci: int) -> None:
            """Mask chunk ci's planes into the buffers."""
            p = self.pieces[ci]
            for m, buf in self.bufs.values():
                torch.mul(p, m, out=buf[:p.shape[0]])

    @staticmethod
    def _neg(key):
        """The trailing key of the adjoint tap (offsets negated)."""
        return None if key is None else tuple(-o for o in key)

    @staticmethod
    def _init(out: Tensor, plan, bcol: Tensor | None) -> None:
        """Set the columns of out that the first tap of ``plan`` leaves unwritten (once, for
        every row): zeros or the bias."""
        _, dst0, _, _ = plan[0]
        for rest in (out[:, :dst0.start], out[:, dst0.stop:]):
            rest.zero_() if bcol is None else rest.copy_(bcol.expand(rest.shape))

    class _Accumulate:
        """out[chunk] = (bias +) Σ_taps w_k · (tap k's view of the sources), chunk by chunk,
        on the columns the first tap writes (``_init`` has set the others)."""

        def __init__(self, out: Tensor, src, wr: Tensor, plan, bcol: Tensor | None):
            ch, views = src.chunks, _FlatTaps._views
            self.src = [src.views(key, rd) for _, _, rd, key in plan]
            self.dst = [views(out, d, ch) for _, d, _, _ in plan]
            wcol = wr.t().unsqueeze(-1)  # (K, R, 1)
            self.w = [views(wcol[k], slice(None), ch) for k, *_ in plan]
            self.bias = None if bcol is None else views(bcol, slice(None), ch)

        def __call__(self, ci: int) -> None:
            src, dst, w = self.src, self.dst, self.w
            if self.bias is None:
                torch.mul(src[0][ci], w[0][ci], out=dst[0][ci])
            else:  # (addcmul with out= and a broadcast bias runs several times slower)
                dst[0][ci].copy_(self.bias[ci].expand_as(dst[0][ci]))
                dst[0][ci].addcmul_(src[0][ci], w[0][ci])
            for i in range(1, len(dst)):
                dst[i][ci].addcmul_(src[i][ci], w[i][ci])

    def apply(self, planes: Tensor, wr: Tensor, flip: bool = False,
              out: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
        """planes (B*C, M) contiguous, wr (B*C, K) per-plane tap weights -> (B*C, M):
        Σ_k w_k · (tap k of each plane); ``flip`` applies the adjoint (offsets negated).
        ``out``: a (B*C, M) tensor to write into; ``bias``: (B*C,) added per plane."""
        R, M = planes.shape
        out = planes.new_empty(R, M) if out is None else out
        bcol = None if bias is None else bias[:, None]
        plan = self._plan(flip)
        if not plan:
            return out.zero_() if bcol is None else out.copy_(bcol.expand(R, M))
        step = self.step(planes.element_size())
        chunks = [(a, min(R, a + step)) for a in range(0, R, step)]
        src = self._Sources(self, planes, [key for *_, key in plan], chunks, step)
        self._init(out, plan, bcol)
        taps = self._Accumulate(out, src, wr, plan, bcol)
        for ci in range(len(chunks)):
            src.fill(ci)
            taps(ci)
        return out

    def backward(self, x: Tensor, g: Tensor, wr: Tensor, B: int, C: int, want_x: bool,
                 want_w: bool) -> tuple[Tensor | None, Tensor | None]:
        """The adjoint of ``apply`` for planes x and output gradient g (both (B*C, M)):
        (gx (B*C, M) or None, gw (K, C) or None), in one pass over g's chunks.

        Both read g with the adjoint taps' wrap zones zeroed: where a forward tap's read of
        output n wraps, g[n] lies in that zone, so gw_k = Σ_n g_masked[n] x[n + off_k] over
        the flat range needs no masked copy of x. gw accumulates in a (T, u, M) buffer over a
        group's chunks and is reduced once per group.
        """
        R, M = g.shape
        fplan, bplan = self._plan(False), self._plan(True)
        gw = g.new_zeros(self.grid.K, C) if want_w else None
        if not fplan:  # every tap reads only padding
            return (g.new_zeros(R, M) if want_x else None), gw
        gx = g.new_empty(R, M) if want_x else None
        if want_x:
            self._init(gx, bplan, None)
        u, groups = self.chunks(B, C, g.element_size())
        acc = g.new_zeros(len(fplan), u, M) if want_w else None
        ks = [k for k, *_ in fplan]
        for gi, chunks in enumerate(groups):
            src = self._Sources(self, g, [key for *_, key in bplan], chunks, u)
            taps = self._Accumulate(gx, src, wr, bplan, None) if want_x else None
            if want_w:
                if gi:
                    acc.zero_()
                gm = [src.views(self._neg(key), d) for _, d, _, key in fplan]
                xv = [self._views(x, rd, chunks) for _, _, rd, _ in fplan]
                av = [[acc[i, :b - a, d] for a, b in chunks]
                      for i, (_, d, _, _) in enumerate(fplan)]
            for ci in range(len(chunks)):
                src.fill(ci)
                if taps is not None:
                    taps(ci)
                if want_w:
                    for i in range(len(fplan)):
                        av[i][ci].addcmul_(gm[i][ci], xv[i][ci])
            if want_w:
                red = acc.sum(-1)  # (T, u)
                if u >= C:
                    gw[ks] = red.view(len(ks), u // C, C).sum(1)
                else:
                    c0 = chunks[0][0] % C
                    gw[ks, c0:c0 + u] = red
        return gx, gw


def _new_result(ref: Tensor, B: int, N: int, C: int, cf: bool) -> Tensor:
    """An uninitialised (B, N, C) tensor, channels-first strides if ``cf``: a kernel's own
    output, not a view of a temporary."""
    if cf:
        return torch.empty_strided((B, N, C), (C * N, 1, N), dtype=ref.dtype, device=ref.device)
    return ref.new_empty(B, N, C)


def _is_cf(x: Tensor) -> bool:
    """Whether a (B, M, C) tensor is (a view of) channels-first planes, an NCHW image's: with
    one channel both layouts are the same memory, and planes are the faster one to copy."""
    return x.shape[1] > 1 and x.stride(1) == 1


def _planes(x: Tensor) -> Tensor:
    """(B, M, C) -> its (B*C, M) channel planes, contiguous (a view of an NCHW image's)."""
    return x.transpose(1, 2).reshape(-1, x.shape[1])


def _shift_conv(grid: Grid, x: Tensor, th: Tensor) -> Tensor:
    """Σ_k A_kᵀ x Θ_k by the paper's input_param order on the grid's own shift kernels, whose
    autograd is its adjoint kernels all the way down: the tap kernels' double backward."""
    B, M, P = x.shape
    K, _, Q = th.shape
    z = (x.reshape(B * M, P) @ th.permute(1, 0, 2).reshape(P, K * Q)).reshape(B, M, K, Q)
    return grid.propagate_sum(z)


def _fused_backward(ctx, g: Tensor, fn, fast, first: int) -> tuple:
    """Backward of a fused grid kernel with inputs (..., x, parameter, bias) that saved
    (buffer, parameter, x): ``fast(ctx, g)``, the adjoint kernels without a graph; under
    create_graph, the gradient of ``fn(x, parameter)`` (the same map on differentiable ops) as a
    graph, so that higher derivatives exist; the bias gradient sums g over (B, N). ``first`` is
    the index of x among the Function's inputs (the ones before it get None)."""
    gb = g.sum((0, 1)) if ctx.needs_input_grad[first + 2] else None
    if not torch.is_grad_enabled():  # a plain backward: autograd runs it without a graph
        return fast(ctx, g) + (gb,)
    _, p, x = ctx.saved_tensors
    want = (ctx.needs_input_grad[first], ctx.needs_input_grad[first + 1])
    wanted = [t for t, w in zip((x, p), want) if w]
    grads = iter(torch.autograd.grad(fn(x, p), wanted, g, create_graph=True,
                                     allow_unused=True))
    return (None,) * first + tuple(next(grads) if w else None for w in want) + (gb,)


def _taps_matrix(th: Tensor, ks: list[int]) -> Tensor:
    """theta (K, P, Q) -> the (T*P, Q) stack of the used taps' matrices."""
    return th[ks].reshape(len(ks) * th.shape[1], th.shape[2])


class _TapConv(torch.autograd.Function):
    """y = Σ_k A_kᵀ x Θ_k on the tap layout, (B, M, P) x (K, P, Q) -> (B, N, Q).

    ``mode`` "gemm": per chunk, one GEMM per tap on its shifted view, accumulated in place;
    "im2col": per chunk, the taps' views copied side by side into a small reused buffer and one
    GEMM with inner size K*P (better when P is small, e.g. an RGB stem). A channels-first x (a
    view of an NCHW image, ``x.stride(1) == 1``) is read as planes and y returned as a (B, N, Q)
    tensor with channels-first strides, so image layers make no layout copies; a (Q,) bias is
    added in the pass that crops the output. Backward is the
    adjoint on the same layout; under ``create_graph`` it is the same map's gradient through the
    grid's shift kernels instead, so higher derivatives exist.
    """

    @staticmethod
    def forward(ctx, grid, mode, x, th, bias):
        B, _, P = x.shape
        Q = th.shape[2]
        t = _Taps(grid, B, _is_cf(x))
        buf, out = t.fill(x), t.new_out(x, Q)
        taps = [k for k, *_ in t.lay.taps]
        if not taps:
            out.zero_()
        elif mode == "gemm":
            for c in t.chunks((P + Q) * x.element_size()):
                o = out[c[0]:c[1]]
                for i, (k, a) in enumerate(t.views(buf, c)):
                    t.mm(a, th[k], o, accumulate=i > 0)
        else:
            w, col = _taps_matrix(th, taps), None
            for c in t.chunks((len(taps) * P + Q) * x.element_size()):
                a, col = t.cols(t.views(buf, c), col)
                t.mm(a, w, out[c[0]:c[1]], accumulate=False)
        ctx.grid, ctx.mode, ctx.cf = grid, mode, t.cf
        # the padded copy of x is what the theta gradient reads; x itself only serves a double
        # backward (an input: saving it keeps nothing alive that the graph does not)
        ctx.save_for_backward(buf if ctx.needs_input_grad[3] else None, th, x)
        return t.take(out, bias)

    @staticmethod
    def backward(ctx, g):
        return _fused_backward(ctx, g, lambda x, th: _shift_conv(ctx.grid, x, th),
                               _TapConv._backward, 2)

    @staticmethod
    def _backward(ctx, g):
        buf, th, _ = ctx.saved_tensors
        B, _, Q = g.shape
        P = th.shape[1]
        t = _Taps(ctx.grid, B, ctx.cf)
        want_x, want_th = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        gv = t.spread(g)
        gbuf = t.new_buffer(g, P) if want_x else None
        gth = torch.zeros_like(th) if want_th else None
        taps = [k for k, *_ in t.lay.taps]
        if ctx.mode == "gemm":
            for c in t.chunks((P + Q) * g.element_size()):
                gc = gv[c[0]:c[1]]
                if want_x:
                    for k, a in t.views(gbuf, c):
                        t.mm(gc, th[k].t(), a, accumulate=True)
                if want_th:
                    for k, a in t.views(buf, c):
                        gth[k] += t.outer(a, gc)
        elif taps:
            w, col = _taps_matrix(th, taps), None
            gw = torch.zeros_like(w) if want_th else None
            for c in t.chunks((len(taps) * P + Q) * g.element_size()):
                gc = gv[c[0]:c[1]]
                if want_x:
                    # the chunk's im2col gradient, then each tap's slice back onto its view
                    gcol = gc @ w.t() if not t.cf else torch.bmm(w.expand(gc.shape[0], -1, -1),
                                                                  gc)
                    gcol = gcol.unflatten(1, (len(taps), P))
                    for i, (_, a) in enumerate(t.views(gbuf, c)):
                        a += gcol[:, i]
                if want_th:
                    a, col = t.cols(t.views(buf, c), col)
                    gw += t.outer(a, gc)
            if want_th:
                gth[taps] = gw.view(len(taps), P, Q)
        return None, None, t.gather(gbuf) if want_x else None, gth


class _GridChannelwise(torch.autograd.Function):
    """y = Σ_k A_kᵀ (x ⊙ w_k), (B, M, C) x (K, C) -> (B, N, C): a depthwise convolution as one
    fused multiply-add per tap and cache-sized chunk; backward gx = Σ_k A_k (g ⊙ w_k),
    gw_k = <A_kᵀ x, g>.

    Channels-last x: straight on the grid, each tap a slice whose rows are long runs of
    channels (no padded copy). Channels-first x (a view of an NCHW image), where every
    image-channel plane is one contiguous row (grid slices of planes would be runs of one image
    row only, several times slower): stride-1 grids with an output of the input's shape as flat
    offsets into the planes themselves (``_FlatTaps``: no padded copy, no crop), others on the
    tap layout.
    """

    @staticmethod
    def forward(ctx, grid, x, w, bias):
        B, _, C = x.shape
        cf = _is_cf(x)
        ctx.grid = grid
        ctx.mode = "grid" if not cf else "flat" if grid.flat_taps is not None else "taps"
        if ctx.mode == "grid":
            ctx.save_for_backward(None, w, x)
            y = _channelwise_grid(grid, x, w)
            return y if bias is None else y.add_(bias)
        if ctx.mode == "flat":
            ctx.save_for_backward(None, w, x)
            y = _new_result(x, B, grid.N, C, True)
            grid.flat_taps.apply(_planes(x), w.t().repeat(B, 1), out=_planes(y),
                                 bias=None if bias is None else bias.repeat(B))
            return y
        t = _Taps(grid, B, True)
        buf, out = t.fill(x), t.new_out(x, C)
        if not t.lay.taps:
            out.zero_()
        for c in t.chunks(2 * C * x.element_size(), _CHANNELWISE_CHUNK_BYTES):
            o = out[c[0]:c[1]]
            for i, (k, a) in enumerate(t.views(buf, c)):
                if i == 0:
                    torch.mul(a, t.scale(w[k]), out=o)
                else:
                    o.addcmul_(a, t.scale(w[k]))
        ctx.save_for_backward(buf if ctx.needs_input_grad[2] else None, w, x)
        return t.take(out, bias)

    @staticmethod
    def backward(ctx, g):
        return _fused_backward(ctx, g, lambda x, w: ctx.grid.propagate_sum(x.unsqueeze(2) * w),
                               _GridChannelwise._backward, 1)

    @staticmethod
    def _backward(ctx, g):
        want_x, want_w = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if ctx.mode == "grid":
            _, w, x = ctx.saved_tensors
            return (None,) + _channelwise_grid_backward(ctx.grid, x, w, g, want_x, want_w)
        buf, w, x = ctx.saved_tensors
        B, _, C = g.shape
        if ctx.mode == "flat":
            gx, gw = ctx.grid.flat_taps.backward(_planes(x), _planes(g), w.t().repeat(B, 1),
                                                 B, C, want_x, want_w)
            return None, None if gx is None else gx.view(B, C, -1).transpose(1, 2), gw
        t = _Taps(ctx.grid, B, True)
        gv = t.spread(g)
        gbuf = t.new_buffer(g, C) if want_x else None
        gw = torch.zeros_like(w) if want_w else None
        for c in t.chunks(2 * C * g.element_size(), _CHANNELWISE_CHUNK_BYTES):
            gc = gv[c[0]:c[1]]
            if want_x:
                for k, a in t.views(gbuf, c):
                    a.addcmul_(gc, t.scale(w[k]))
            if want_w:
                for k, a in t.views(buf, c):
                    gw[k] += t.channel_sum(a * gc)
        return None, t.gather(gbuf) if want_x else None, gw


def _channelwise_grid(grid: Grid, x: Tensor, w: Tensor) -> Tensor:
    """Channels-last depthwise taps on the grid itself: (B, M, C) -> (B, N, C)."""
    B, _, C = x.shape
    src = x.reshape(B, *grid.in_shape, C)
    out = x.new_zeros(B, *grid.out_shape, C)
    full = (slice(None),)
    for bs in _batch_chunks(B, (grid.M + grid.N) * C * x.element_size()):
        s, o = src[bs], out[bs]
        for k, n_sl, m_sl in grid.taps:
            o[full + n_sl].addcmul_(s[full + m_sl], w[k])
    return out.reshape(B, grid.N, C)


def _channelwise_grid_backward(grid: Grid, x, w, g, want_x: bool, want_w: bool):
    """Adjoint of ``_channelwise_grid``: (gx or None, gw or None)."""
    B, _, C = x.shape
    src = x.reshape(B, *grid.in_shape, C)
    gs = g.reshape(B, *grid.out_shape, C)
    full = (slice(None),)
    gx = gw = None
    chunks = _batch_chunks(B, (grid.M + grid.N) * C * x.element_size())
    if want_x:
        gx = x.new_zeros(B, *grid.in_shape, C)
        for bs in chunks:
            gxc, gc = gx[bs], gs[bs]
            for k, n_sl, m_sl in grid.taps:
                gxc[full + m_sl].addcmul_(gc[full + n_sl], w[k])
        gx = gx.reshape(B, grid.M, C)
    if want_w:
        gw = torch.zeros_like(w)
        dims = tuple(range(grid.ndim + 1))
        for bs in chunks:
            sc_, gc = src[bs], gs[bs]
            for k, n_sl, m_sl in grid.taps:
                gw[k] += (gc[full + n_sl] * sc_[full + m_sl]).sum(dims)
    return gx, gw

def _indices(in_shape, out_shape, kernel_size, stride, padding, dilation) -> Tensor:
    """(3, nnz) ``[k; m; n]``: output n reads input m at kernel tap k (row-major everywhere)."""
    d = len(in_shape)
    n_coord = _row_major(out_shape)  # (N, d)
    offsets = _row_major(kernel_size)  # (K, d)
    m = (n_coord.unsqueeze(0) * torch.tensor(stride) - torch.tensor([b for b, _ in padding])
         + (offsets * torch.tensor(dilation)).unsqueeze(1))  # (K, N, d)
    valid = ((m >= 0) & (m < torch.tensor(in_shape))).all(-1)
    strides = torch.tensor([math.prod(in_shape[i + 1:]) for i in range(d)])
    m_flat = (m * strides).sum(-1)
    k, n = valid.nonzero(as_tuple=True)
    return torch.stack([k, m_flat[k, n], n])


def _outer_prod(vectors: list[Tensor]) -> Tensor:
    """Row-major flattened outer product of 1-d integer tensors."""
    out = vectors[0]
    for v in vectors[1:]:
        out = (out.unsqueeze(-1) * v).reshape(-1)
    return out

"""Shift-matrix bases of N-d grids (CNN layers) and average pooling.

The paper's section "Grid convolutions": a CNN layer is a convolution whose basis matrices are
shift matrices, ``(A_Δ)[m, n] = 1`` iff grid position ``n - m = Δ``, with the kernel a right
cuboid of shifts. Both bases here are *implicit*: they apply themselves by padding, strided views
and sums over the kernel taps, and build the (K, M, N) tensor only in ``to_dense()``. Grids are
flattened row-major (the canonical bijection), channels last in the bundle ``(B, M, C)``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

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
    shift-and-accumulate routes are used.
    """

    #: strided copies and sums run at memory speed, far below the GEMM rate
    flop_weight = 4.0
    #: F.convNd runs at about the GEMM rate with no temporaries, while the routes it competes
    #: with move (B, M, K, C)-sized intermediates that the planner's element cost undercounts
    #: (measured: a 5x5 64->64 ControlledSeparable layer, 0.13 s by F.conv2d on the
    #: materialised theta against 0.8-1.5 s by every factored route)
    native_weight = 0.25

    def __init__(self, in_shape, kernel_size, stride=1, padding=0, dilation=1, *,
                 native: bool = True, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None):
        self._setup(in_shape, kernel_size, stride, padding, dilation, "Grid")
        self.out_shape = self._out_shape("Grid")
        Basis.__init__(self, math.prod(self.kernel_size), math.prod(self.in_shape),
                       math.prod(self.out_shape))
        self.native = bool(native)
        self._dtype = dtype
        self._device = torch.device(device) if device is not None else None
        self._taps = None

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

    # -- dtype / device (only used by to_dense: the primitives work on any input) -------------
    @property
    def dtype(self):
        return self._dtype or torch.get_default_dtype()

    @property
    def device(self):
        return self._device or torch.device("cpu")

    def to(self, device=None, dtype=None):
        return Grid(self.in_shape, self.kernel_size, self.stride, self.padding, self.dilation,
                    native=self.native, dtype=dtype or self._dtype,
                    device=device if device is not None else self._device)

    def _matching(self, t):
        return self

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
            for k, off in enumerate(self.offsets.tolist()):
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

    def channelwise_sum(self, x: Tensor, w: Tensor) -> Tensor:
        """(B, M, C), w (K, C) -> (B, N, C): Σ_k A_kᵀ (x ⊙ w_k), a depthwise convolution.

        Shift-and-accumulate tap by tap (one multiply-add pass per tap), with no (B, M, K, C)
        temporary; an optional basis hook that depthwise parameter forms use when present.
        """
        self._check(x, 3, "channelwise_sum")
        if w.dim() != 2 or w.shape[0] != self.K or w.shape[1] != x.shape[2]:
            raise ValueError(f"Grid.channelwise_sum needs w (K, C)=({self.K}, {x.shape[2]}), "
                             f"got shape {tuple(w.shape)}")
        return _GridChannelwise.apply(self, x, w.to(x.dtype))

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

    # -- costs ----------------------------------------------------------------------------------
    def apply_flops(self) -> float:
        return float(self.K * self.N)

    def propagate_sum_flops(self, C: int) -> float:
        # each tap reads and rewrites the output where propagate only copies: 1.5x the traffic
        return 1.5 * self.flop_weight * self.apply_flops() * C

    # -- fused kernel: F.conv1d/2d/3d ----------------------------------------------------------
    def _native_form(self, theta):
        """How theta maps to F.convNd, or None: 'tensor', 'grouped', 'depthwise' or 'module'."""
        from ..params import DepthwiseSeparable, Grouped, Parameterization

        if not self.native or self.ndim not in _CONV:
            return None
        if isinstance(theta, Tensor):
            return "tensor"
        if isinstance(theta, Grouped):
            return "grouped"
        if isinstance(theta, DepthwiseSeparable):
            return "depthwise"
        if isinstance(theta, Parameterization):
            return "module"  # any other form: theta (K, P, Q) is small, materialise it
        return None

    def native_flops(self, B, P, Q, theta=None):
        form = self._native_form(theta)
        if form is None:
            return None
        K, N = self.K, self.N
        if form == "grouped":
            flops = B * N * K * P * Q / theta.groups
        elif form == "depthwise":
            flops = B * N * (K * P + P * Q)
        else:
            flops = B * N * K * P * Q + (K * P * Q if form == "module" else 0)
        return float(self.native_weight * flops)

    def conv_weight(self, theta) -> tuple[Tensor, int]:
        """The torch weight (Q, P/groups, *kernel_size) and groups equal to a theta / module."""
        return conv_weight(theta, self.kernel_size)

    def conv_image(self, x: Tensor, theta, bias: Tensor | None = None) -> Tensor:
        """x (B, P, *in_shape) channels-first -> (B, Q, *out_shape) by F.conv1d/2d/3d."""
        from ..params import DepthwiseSeparable

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
        if isinstance(theta, DepthwiseSeparable):
            P = theta.P
            w = theta.depth.to(x.dtype).t().contiguous().reshape(P, 1, *self.kernel_size)
            h = conv(xp, w, None, self.stride, pad, self.dilation, P)  # (B, P, *out)
            W = theta.point.to(x.dtype).t().contiguous().reshape(theta.Q, P,
                                                                  *(1,) * self.ndim)
            return conv(h, W, bias)
        W, g = self.conv_weight(theta)
        return conv(xp, W.to(x.dtype), bias, self.stride, pad, self.dilation, g)

    def native_convolve(self, x, theta, route=None):
        """x (B, M, P) -> (B, N, Q) by F.convNd on the channels-first view of the bundle."""
        if self._native_form(theta) is None:
            return None
        B, M, P = x.shape
        img = x.reshape(B, *self.in_shape, P).movedim(-1, 1)  # a view (channels_last strides)
        y = self.conv_image(img, theta)
        return y.movedim(1, -1).reshape(B, self.N, y.shape[1])


# ------------------------------------------------------------------------------------------------
class AvgPool(_GridGeometry, Basis):
    """Average pooling as a ``K = 1`` basis: ``A[0, m, n] = 1/divisor(n)`` over n's window.

    As torch's ``AvgPoolNd``: ``stride`` defaults to ``kernel_size``, padding is counted in the
    divisor (``count_include_pad=True``), ``ceil_mode`` adds the last partial windows, and
    ``divisor_override`` replaces the divisor. ``padding`` takes the forms of ``Grid``.
    """

    flop_weight = 2.0

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
        self._dtype = dtype
        self._device = torch.device(device) if device is not None else None
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

    @property
    def dtype(self):
        return self._dtype or torch.get_default_dtype()

    @property
    def device(self):
        return self._device or torch.device("cpu")

    def to(self, device=None, dtype=None):
        return AvgPool(self.in_shape, self.kernel_size, self.stride, self.padding,
                       ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad,
                       divisor_override=self.divisor_override, native=self.native,
                       dtype=dtype or self._dtype,
                       device=device if device is not None else self._device)

    def _matching(self, t):
        return self

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

    def native_flops(self, B, P, Q, theta=None):
        if not self._native_ok():
            return None
        pool = math.prod(self.kernel_size) * self.N
        return float(B * (min(P, Q) * pool + min(self.M * P * Q, self.N * P * Q)))

    def native_convolve(self, x, theta, route=None):
        """x (B, M, P) -> (B, N, Q): pool and apply theta[0], on the side with fewer channels."""
        if not self._native_ok():
            return None
        th = (theta if isinstance(theta, Tensor) else theta())[0].to(x.dtype)  # (P, Q)
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

    A ``Grouped`` module keeps its groups; any other form is materialised (groups 1).
    """
    from ..params import Grouped

    K = math.prod(kernel_size)
    if isinstance(theta, Grouped):
        _, g, Pg, Qg = theta.weight.shape
        W = theta.weight.permute(1, 3, 2, 0).reshape(g * Qg, Pg, *kernel_size)
        # contiguous: torch's conv kernels take slower paths on a strided weight
        return W.contiguous(), g
    th = theta if isinstance(theta, Tensor) else theta()
    if th.dim() != 3 or th.shape[0] != K:
        raise ValueError(f"theta must be (K, P, Q) with K={K} (kernel_size {tuple(kernel_size)})"
                         f", got shape {tuple(th.shape)}")
    _, P, Q = th.shape
    return th.permute(2, 1, 0).reshape(Q, P, *kernel_size).contiguous(), 1


class _GridOp(torch.autograd.Function):
    """A grid shift kernel whose backward is its adjoint kernel (itself a _GridOp, so twice
    differentiable): im2col <-> col2im, heads <-> heads_T, psum <-> psum_T."""

    ADJOINT = {"im2col": "col2im", "col2im": "im2col", "heads": "heads_T",
               "heads_T": "heads", "psum": "psum_T", "psum_T": "psum"}

    @staticmethod
    def forward(ctx, grid, op, t):
        ctx.grid, ctx.op = grid, op
        out = grid._apply_op(op, t)
        # a 1-tap unpadded grid can return a view of t: hand autograd a tensor of its own
        return out.clone() if out.untyped_storage().data_ptr() == \
            t.untyped_storage().data_ptr() else out

    @staticmethod
    def backward(ctx, g):
        return None, None, _GridOp.apply(ctx.grid, _GridOp.ADJOINT[ctx.op], g)


#: bytes of input plus output per batch chunk of the tap loops: small enough to stay in cache
#: across the K taps, so memory is read once per chunk instead of once per tap
_CHUNK_BYTES = 4 << 20
#: at most this many chunks: every tap of every chunk is one (multi-threaded) kernel launch,
#: and many small parallel regions stall badly when other processes share the cores
_MAX_CHUNKS = 8


def _batch_chunks(B: int, per_item: int):
    step = max(1, _CHUNK_BYTES // max(1, per_item), -(-B // _MAX_CHUNKS))
    return [slice(b, min(B, b + step)) for b in range(0, B, step)]


class _GridChannelwise(torch.autograd.Function):
    """y = Σ_k A_kᵀ (x ⊙ w_k) tap by tap; backward: gx = Σ_k A_k (g ⊙ w_k), gw_k = <A_kᵀ x, g>."""

    @staticmethod
    def forward(ctx, grid, x, w):
        ctx.grid = grid
        ctx.save_for_backward(x, w)
        B, _, C = x.shape
        src = x.reshape(B, *grid.in_shape, C)
        out = x.new_zeros(B, *grid.out_shape, C)
        full = (slice(None),)
        for bs in _batch_chunks(B, (grid.M + grid.N) * C * x.element_size()):
            s, o = src[bs], out[bs]
            for k, n_sl, m_sl in grid.taps:
                o[full + n_sl].addcmul_(s[full + m_sl], w[k])
        return out.reshape(B, grid.N, C)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        grid = ctx.grid
        x, w = ctx.saved_tensors
        B, _, C = x.shape
        src = x.reshape(B, *grid.in_shape, C)
        gs = g.reshape(B, *grid.out_shape, C)
        full = (slice(None),)
        gx = gw = None
        chunks = _batch_chunks(B, (grid.M + grid.N) * C * x.element_size())
        if ctx.needs_input_grad[1]:
            gx = x.new_zeros(B, *grid.in_shape, C)
            for bs in chunks:
                gxc, gc = gx[bs], gs[bs]
                for k, n_sl, m_sl in grid.taps:
                    gxc[full + m_sl].addcmul_(gc[full + n_sl], w[k])
            gx = gx.reshape(B, grid.M, C)
        if ctx.needs_input_grad[2]:
            gw = torch.zeros_like(w)
            dims = tuple(range(grid.ndim + 1))
            for bs in chunks:
                sc_, gc = src[bs], gs[bs]
                for k, n_sl, m_sl in grid.taps:
                    gw[k] += (gc[full + n_sl] * sc_[full + m_sl]).sum(dims)
        return None, gx, gw


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

"""Grid layers (CNN convolution and average pooling) and their torch.nn converters.

Both layers take either layout:

* **image** (torch's): ``(N, C, *spatial)`` or unbatched ``(C, *spatial)``; the grid is built for
  the spatial size of each call (cached per size) and returned as ``(N, Q, *out_spatial)``.
* **bundle** (the paper's): ``(B, M, C)`` or ``(M, C)`` with ``M = prod(in_shape)`` row-major;
  needs ``in_shape`` at construction; returns ``(B, N, Q)`` or ``(N, Q)``.

``layout="auto"`` tells them apart by shape (an ambiguous shape raises; pass ``layout``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._checks import floating
from ..basis.grid import AvgPool, Grid, conv_weight, same_padding
from ..engine import plan
from ..kernels.geometry import as_shape, pad_pairs, per_dim
from ..params import DepthwiseSeparable, Grouped, Parameterization, make_param
from .convert import register_to_torch, register_torch

__all__ = ["GridConv", "GridAvgPool"]

_LAYOUTS = ("auto", "image", "bundle")
_CACHE_SIZE = 16


def _ndim(kernel_size, dim, in_shape, name) -> int:
    if in_shape is not None:
        d = len(as_shape(in_shape, f"{name} in_shape"))
    elif isinstance(kernel_size, Sequence):
        d = len(kernel_size)
    elif dim is not None:
        d = int(dim)
    else:
        raise ValueError(f"{name}: with an int kernel_size={kernel_size!r} give dim= (the number "
                         "of grid dimensions) or in_shape=")
    if dim is not None and int(dim) != d:
        raise ValueError(f"{name}: dim={dim} disagrees with the {d} grid dims of kernel_size / "
                         "in_shape")
    if d < 1:
        raise ValueError(f"{name}: a grid needs at least one dimension")
    return d


class _GridLayer(nn.Module):
    """Layout handling and the per-input-size basis cache shared by the grid layers."""

    def _init_layout(self, d: int, in_shape, layout: str):
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
        if layout == "bundle" and in_shape is None:
            raise ValueError("layout='bundle' needs in_shape (the grid of the (B, M, C) bundle)")
        self.ndim = d
        self.in_shape = None if in_shape is None else as_shape(in_shape, "in_shape")
        if self.in_shape is not None and len(self.in_shape) != d:
            raise ValueError(f"in_shape {self.in_shape} has {len(self.in_shape)} dims but the "
                             f"kernel has {d}")
        self.layout = layout
        self._bases: OrderedDict = OrderedDict()
        self._last = self._last_shape = None
        if self.in_shape is not None:
            self._last_shape, self._last = self.in_shape, self.basis_for(self.in_shape)

    def __getstate__(self):
        # the kept bases and plans are derived state, and a plan holds the planner's route
        # closures, which do not pickle: a copy keeps its grid without them and plans again
        state = self.__dict__.copy()
        state["_bases"] = OrderedDict()
        if self._last is not None:
            state["_last"] = self._last._apply(lambda t: t)  # (drops the basis's own memo)
        if "_plans" in state:
            state["_plans"] = {}
        return state

    @property
    def basis(self):
        """The basis of the last input size this layer was called on (or of ``in_shape``)."""
        shape = getattr(self, "_last_shape", None)  # (absent from layers pickled before it)
        if self._last is None and shape is not None:
            # last called inside a compiled graph, which keeps nothing: made here, eagerly
            self._last = self.basis_for(shape)
        return self._last

    def _use(self, in_shape) -> Grid | AvgPool:
        """The basis of this call's grid, remembered as the last one (``basis``)."""
        key = tuple(int(s) for s in in_shape)
        if torch.compiler.is_compiling():
            # a basis or plan made while tracing holds traced objects (bound methods, index
            # tensors) that the compiled graph cannot hand back: nothing made here is kept,
            # only the shape (ints), so ``basis`` can make it eagerly when asked
            self._last_shape, self._last = key, None
            return self.basis_for(key)
        self._last_shape, self._last = key, self.basis_for(key)
        return self._last

    def basis_for(self, in_shape) -> Grid | AvgPool:
        """The (cached) basis of this layer on a grid of ``in_shape``."""
        key = tuple(int(s) for s in in_shape)
        b = self._bases.get(key)
        if torch.compiler.is_compiling():
            return self._make_basis(key) if b is None else b  # (kept eagerly only)
        if b is None:
            b = self._make_basis(key)
            self._bases[key] = b
            if len(self._bases) > _CACHE_SIZE:
                self._bases.popitem(last=False)
        else:
            self._bases.move_to_end(key)
        return b

    def _which(self, x: Tensor, C: int | None) -> str:
        """'image' or 'bundle' for this input."""
        floating(x, f"{type(self).__name__}: x")
        d = self.ndim

        def chan_ok(c):
            return C is None or c == C

        img = x.dim() in (d + 1, d + 2) and chan_ok(x.shape[x.dim() - d - 1])
        if self.in_shape is not None:
            img = img and tuple(x.shape[-d:]) == self.in_shape
        bun = (self.in_shape is not None and x.dim() in (2, 3)
               and x.shape[-2] == math.prod(self.in_shape) and chan_ok(x.shape[-1]))
        if self.layout != "auto":
            ok = img if self.layout == "image" else bun
            if not ok:
                raise ValueError(self._layout_error(x, C, self.layout))
            return self.layout
        if img and bun:
            raise ValueError(f"input shape {tuple(x.shape)} reads both as an image and as a "
                             "bundle: construct the layer with layout='image' or 'bundle'")
        if not (img or bun):
            raise ValueError(self._layout_error(x, C, "image" if self.in_shape is None else
                                                "image or bundle"))
        return "image" if img else "bundle"

    def _layout_error(self, x, C, what) -> str:
        d, c = self.ndim, "C" if C is None else C
        exp = []
        if "image" in what:
            sp = "*spatial" if self.in_shape is None else ", ".join(map(str, self.in_shape))
            exp.append(f"an image (N, {c}, {sp}) or ({c}, {sp}) with {d} grid dims")
        if "bundle" in what:
            exp.append(f"a bundle (B, M, {c}) or (M, {c}) with M={math.prod(self.in_shape)}")
        return f"{type(self).__name__} expects {' or '.join(exp)}, got shape {tuple(x.shape)}"


# ------------------------------------------------------------------------------------------------
class GridConv(_GridLayer):
    """An N-d CNN layer as a structured convolution: ``Grid`` basis, any ``sc.params`` theta.

    x: image ``(N, P, *spatial)`` / ``(P, *spatial)`` -> ``(N, Q, *out_spatial)``, or bundle
    ``(B, M, P)`` / ``(M, P)`` -> ``(B, N, Q)`` when built with ``in_shape`` (see the module doc).
    Options as ``torch.nn.ConvNd`` (``padding`` also takes ``(before, after)`` pairs); ``param`` is
    ``"full"`` (``Grouped`` when ``groups > 1``), ``"depthwise"`` or a module from ``sc.params``
    with ``K = prod(kernel_size)``; ``route`` as ``sc.convolve`` (``"auto"``: the planner, which
    takes ``F.convNd`` whenever theta maps onto it; ``native=False`` keeps it to the
    shift-and-accumulate routes). ``.basis`` is the Grid of the last input.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True,
                 param: str | Parameterization = "full", *, dim: int | None = None,
                 in_shape=None, layout: str = "auto", route: str = "auto",
                 native: bool = True):
        super().__init__()
        d = _ndim(kernel_size, dim, in_shape, "GridConv")
        self._native = bool(native)
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels),
                        ("groups", groups)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GridConv {name} must be a positive int, got {v!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = per_dim(kernel_size, d, "GridConv kernel_size")
        self.stride = per_dim(stride, d, "GridConv stride")
        self.dilation = per_dim(dilation, d, "GridConv dilation")
        self.padding = pad_pairs(padding, d, self.kernel_size, self.stride, self.dilation)
        self.route = route
        K = math.prod(self.kernel_size)
        if groups > 1:
            if in_channels % groups or out_channels % groups:
                raise ValueError(f"groups={groups} must divide in_channels={in_channels} and "
                                 f"out_channels={out_channels}")
            if isinstance(param, Grouped):
                if param.groups != groups:
                    raise ValueError(f"param has groups={param.groups} but the layer groups="
                                     f"{groups}")
            elif param != "full":
                raise ValueError(f"groups={groups} needs param='full' or a sc.params.Grouped "
                                 f"module, got {param!r}")
            else:
                param = Grouped(K, in_channels, out_channels, groups)
        self.param = make_param(param, K, in_channels, out_channels)
        if isinstance(self.param, Grouped) and groups == 1:
            self.groups = self.param.groups
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self._reset_bias()  # (the form drew its theta in its constructor)
        self._plans: dict = {}
        self._init_layout(d, in_shape, layout)

    def reset_parameters(self) -> None:
        """Re-draw theta (the form's own init) and the bias, U(±1/√fan_in) as torch's."""
        self.param.reset_parameters()
        self._reset_bias()

    def _reset_bias(self) -> None:
        if self.bias is not None:
            b = 1.0 / math.sqrt(self.param.fan_in)
            with torch.no_grad():
                self.bias.uniform_(-b, b)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}, bias={self.bias is not None}, route={self.route!r}")

    @property
    def native(self) -> bool:
        """Whether the planner may dispatch to F.convNd (False: shift-and-accumulate only)."""
        return self._native

    @native.setter
    def native(self, value: bool) -> None:
        self._native = bool(value)
        self._bases.clear()
        self._plans.clear()
        self._last = None if self.in_shape is None else self.basis_for(self.in_shape)

    def _make_basis(self, in_shape) -> Grid:
        return Grid(in_shape, self.kernel_size, self.stride, self.padding, self.dilation,
                    native=self._native)

    def plan_for(self, grid: Grid, x: Tensor, route: str | None = None):
        """The ``sc.Plan`` of this layer on ``grid`` for the bundle ``x`` (B, M, P) the engine
        is handed (an image's channels-first view), made once per shape and kept: the layer
        runs it (no second planning). ``route``: the layer's ``route`` unless given."""
        route = self.route if route is None else route
        key = (grid.cache_key(), grid.native, tuple(x.shape), x.stride(), x.dtype,
               x.device.type, id(self.param), route)
        p = self._plans.get(key)
        if torch.compiler.is_compiling():
            # (a plan made while tracing holds a route bound to a traced basis: never kept)
            return plan(x, grid, self.param, route=route) if p is None else p
        if p is None:
            if len(self._plans) > 4 * _CACHE_SIZE:
                self._plans.clear()
            p = self._plans[key] = plan(x, grid, self.param, route=route)
        return p

    def forward(self, x: Tensor) -> Tensor:
        layout = self._which(x, self.in_channels)
        if layout == "bundle":
            grid = self._use(self.in_shape)
            return self.plan_for(grid, x if x.dim() == 3 else x.unsqueeze(0))(
                x, self.param, bias=self.bias)
        unbatched = x.dim() == self.ndim + 1
        if unbatched:
            x = x.unsqueeze(0)
        grid = self._use(x.shape[2:])
        B, Q = x.shape[0], self.out_channels
        # an image is planned as what the engine is handed: its channels-first view
        xv = x.flatten(2).transpose(1, 2)
        p = self.plan_for(grid, xv)
        if p.chosen.reads == "channels_first":
            # F.convNd and the tap kernels read the image's memory as it is (no copy), add the
            # bias inside, and write channels-first outputs
            y = p(xv, self.param, bias=self.bias)
            # a contiguous image always (free where the kernel wrote channels-first; a depthwise
            # multiplier comes back channels-last and is copied once)
            y = y.transpose(1, 2).contiguous().view(B, Q, *grid.out_shape)
        else:
            # one copy to channels-last: the shift kernels read channel runs contiguously
            xb = x.movedim(1, -1).reshape(B, grid.M, self.in_channels).contiguous()
            y = self.plan_for(grid, xb, p.route)(xb, self.param)
            # back to channels-first in one copy, then the bias in place on that fresh tensor
            img = y.new_empty(B, Q, *grid.out_shape)
            img.copy_(y.reshape(B, *grid.out_shape, Q).movedim(-1, 1))
            if self.bias is not None:
                img.add_(self.bias.to(y.dtype).reshape(-1, *(1,) * self.ndim))
            y = img
        return y.squeeze(0) if unbatched else y


# ------------------------------------------------------------------------------------------------
class IdentityParam(Parameterization):
    """theta = the (1, C, C) identity: pooling as a convolution with no channel map (no weights)."""

    def __init__(self, channels: int, dtype=None, device=None):
        super().__init__(1, channels, channels)
        self.register_buffer("eye", torch.eye(channels, dtype=dtype, device=device)[None],
                             persistent=False)

    def reset_parameters(self) -> None:
        """Nothing to draw: the identity has no weights."""

    def forward(self) -> Tensor:
        return self.eye


class GridAvgPool(_GridLayer):
    """Average pooling as a ``K = 1`` structured convolution (``sc.basis.AvgPool``), as torch's.

    x: image ``(N, C, *spatial)`` / ``(C, *spatial)`` or bundle ``(B, M, C)`` / ``(M, C)`` (with
    ``in_shape``); options as ``torch.nn.AvgPoolNd``. ``route``: ``"auto"`` (``F.avg_poolNd``
    where it applies) or ``"basis"`` (the basis's own window sums). ``.basis`` is the AvgPool of
    the last input and ``.param`` the identity theta of its channel count.
    """

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None, *,
                 dim: int | None = None, in_shape=None, layout: str = "auto",
                 route: str = "auto"):
        super().__init__()
        d = _ndim(kernel_size, dim, in_shape, "GridAvgPool")
        self.kernel_size = per_dim(kernel_size, d, "GridAvgPool kernel_size")
        self.stride = self.kernel_size if stride is None else per_dim(stride, d,
                                                                        "GridAvgPool stride")
        self.padding = pad_pairs(padding, d, self.kernel_size, self.stride, (1,) * d)
        self.ceil_mode, self.count_include_pad = bool(ceil_mode), bool(count_include_pad)
        self.divisor_override = divisor_override
        if route not in ("auto", "native", "basis"):
            raise ValueError(f"GridAvgPool route must be 'auto', 'native' or 'basis', got "
                             f"{route!r}")
        self.route = route
        self.param = None
        self._init_layout(d, in_shape, layout)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"ceil_mode={self.ceil_mode}, count_include_pad={self.count_include_pad}, "
                f"divisor_override={self.divisor_override}")

    def _make_basis(self, in_shape) -> AvgPool:
        return AvgPool(in_shape, self.kernel_size, self.stride, self.padding,
                       ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad,
                       divisor_override=self.divisor_override)

    def _set_param(self, x: Tensor, C: int):
        p = self.param
        if torch.compiler.is_compiling():
            return  # (a module made while tracing cannot be kept; the pooling never reads it)
        if p is None or p.P != C or p.eye.dtype != x.dtype or p.eye.device != x.device:
            self.param = IdentityParam(C, x.dtype, x.device)

    def forward(self, x: Tensor) -> Tensor:
        layout = self._which(x, None)
        if layout == "bundle":
            pool = self._use(self.in_shape)
            self._set_param(x, x.shape[-1])
            xb = x if x.dim() == 3 else x.unsqueeze(0)
            y = pool.propagate(xb)[:, :, 0]
            return y if x.dim() == 3 else y.squeeze(0)
        unbatched = x.dim() == self.ndim + 1
        if unbatched:
            x = x.unsqueeze(0)
        pool = self._use(x.shape[2:])
        B, C = x.shape[:2]
        self._set_param(x, C)
        if self.route != "basis" and pool.native_ok():
            y = pool.pool_image(x)
        elif self.route == "native":
            raise ValueError(f"route='native' but F.avg_poolNd cannot compute {pool!r}")
        else:
            xb = x.movedim(1, -1).reshape(B, pool.M, C).contiguous()
            y = pool.propagate(xb)[:, :, 0]
            y = y.reshape(B, *pool.out_shape, C).movedim(-1, 1).contiguous()
        return y.squeeze(0) if unbatched else y


# ------------------------------------------------------------------------------------------------
# converters
def _copy(src: Tensor) -> nn.Parameter:
    return nn.Parameter(src.detach().clone().contiguous(), requires_grad=src.requires_grad)


@register_torch(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def _from_conv(m: nn.Module) -> GridConv:
    if m.padding_mode != "zeros":
        raise ValueError(f"from_torch: {type(m).__name__} with padding_mode={m.padding_mode!r} "
                         "is not a zero-padded grid convolution; only padding_mode='zeros' "
                         "converts")
    if isinstance(m.weight, nn.parameter.UninitializedParameter):
        raise ValueError(f"from_torch: {type(m).__name__} has uninitialised (lazy) weights: "
                         "run it once first")
    d = len(m.kernel_size)
    padding = m.padding if isinstance(m.padding, str) else tuple(m.padding)
    W = m.weight  # (Q, P/groups, *kernel)
    Q, Pg = W.shape[:2]
    g = m.groups
    layer = GridConv(m.in_channels, m.out_channels, tuple(m.kernel_size), tuple(m.stride),
                     padding, tuple(m.dilation), groups=g, bias=m.bias is not None, dim=d)
    K = math.prod(m.kernel_size)
    layer = layer.to(device=W.device, dtype=W.dtype)
    if g == 1:
        layer.param.weight = _copy(W.reshape(Q, Pg, K).permute(2, 1, 0))
    else:
        w = W.reshape(g, Q // g, Pg, K).permute(3, 0, 2, 1)  # (K, g, P/g, Q/g)
        layer.param.weight = _copy(w)
    if m.bias is not None:
        layer.bias = _copy(m.bias)
    layer.train(m.training)
    return layer


_AVG = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}
_CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_PADS = {1: nn.ConstantPad1d, 2: nn.ConstantPad2d, 3: nn.ConstantPad3d}


@register_torch(nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)
def _from_avgpool(m: nn.Module) -> GridAvgPool:
    d = next(k for k, c in _AVG.items() if isinstance(m, c))

    def tup(v):
        return tuple(v) if isinstance(v, Sequence) else (v,) * d

    layer = GridAvgPool(tup(m.kernel_size), tup(m.stride), tup(m.padding), m.ceil_mode,
                        m.count_include_pad, getattr(m, "divisor_override", None), dim=d)
    layer.train(m.training)
    return layer


@register_to_torch
def _to_torch(m: nn.Module):
    if isinstance(m, GridConv):
        return _conv_to_torch(m)
    if isinstance(m, GridAvgPool):
        return _avgpool_to_torch(m)
    return None


def _conv_to_torch(m: GridConv) -> nn.Module:
    d = m.ndim
    if d not in _CONVS:
        raise TypeError(f"to_torch: torch has no Conv{d}d for a {d}-d GridConv")
    conv_cls = _CONVS[d]
    ref = next(iter(m.param.parameters()), None)
    fk = dict(device=ref.device, dtype=ref.dtype) if ref is not None else {}
    symmetric = all(b == a for b, a in m.padding)
    if symmetric:
        padding, pre = tuple(b for b, _ in m.padding), None
    elif all(s == 1 for s in m.stride) and m.padding == same_padding(m.kernel_size, m.dilation):
        padding, pre = "same", None
    else:
        spec = []
        for b, a in reversed(m.padding):
            spec += [b, a]
        padding, pre = 0, _PADS[d](tuple(spec), 0.0)
    bias = m.bias is not None
    with torch.no_grad():
        if isinstance(m.param, DepthwiseSeparable):
            # two torch layers hold the factors exactly: depthwise conv, then 1x1 conv
            P, Q = m.in_channels, m.out_channels
            dw = conv_cls(P, P, m.kernel_size, m.stride, padding, m.dilation, groups=P,
                          bias=False, **fk)
            dw.weight.copy_(m.param.depth.t().reshape(P, 1, *m.kernel_size))
            pw = conv_cls(P, Q, 1, bias=bias, **fk)
            pw.weight.copy_(m.param.point.t().reshape(Q, P, *(1,) * d))
            if bias:
                pw.bias.copy_(m.bias)
            layers = [dw, pw]
        else:
            W, g = conv_weight(m.param, m.kernel_size)
            conv = conv_cls(m.in_channels, m.out_channels, m.kernel_size, m.stride, padding,
                            m.dilation, groups=g, bias=bias, **fk)
            conv.weight.copy_(W)
            if bias:
                conv.bias.copy_(m.bias)
            layers = [conv]
    if pre is not None:
        layers.insert(0, pre)
    out = layers[0] if len(layers) == 1 else nn.Sequential(*layers)
    out.train(m.training)
    return out


def _avgpool_to_torch(m: GridAvgPool) -> nn.Module:
    d = m.ndim
    if d not in _AVG:
        raise TypeError(f"to_torch: torch has no AvgPool{d}d for a {d}-d GridAvgPool")
    if any(b != a or 2 * b > k for (b, a), k in zip(m.padding, m.kernel_size)):
        raise TypeError(f"to_torch: torch's AvgPool{d}d needs symmetric padding of at most half "
                        f"the kernel, got padding {m.padding} for kernel_size {m.kernel_size}")
    pad = tuple(b for b, _ in m.padding)
    kw = dict(ceil_mode=m.ceil_mode, count_include_pad=m.count_include_pad)
    if d == 1:
        if m.divisor_override is not None:
            raise TypeError("to_torch: torch's AvgPool1d has no divisor_override")
        out = nn.AvgPool1d(m.kernel_size, m.stride, pad, **kw)
    else:
        out = _AVG[d](m.kernel_size, m.stride, pad, divisor_override=m.divisor_override, **kw)
    out.train(m.training)
    return out

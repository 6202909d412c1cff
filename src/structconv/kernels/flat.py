"""Flat taps: depthwise grid convolutions on channels-first planes by flat offsets.

A stride-1 grid whose output has the input's shape reads every tap at one flat offset of each
plane (``FlatTaps``); ``GridChannelwise`` is the fused depthwise kernel and its backward.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .shift import batch_chunks
from .taps import (
    CHANNELWISE_CHUNK_BYTES,
    GridLike,
    Taps,
    fused_backward,
    is_channels_first,
    new_result,
    planes,
)

# ------------------------------------------------------------------------------------------------
# Flat taps: a stride-1 grid whose output has the input's shape, on channels-first planes
#: bytes of one chunk of planes in the flat depthwise passes: a chunk's planes, their masked
#: copies and the output chunk stay in the L2/L3 caches across the K taps (measured on a 2-core
#: Xeon: 0.75-3 MiB alike within noise; 0.25-0.4 MiB 20-30% slower, the per-op cost growing)
_FLAT_CHUNK_BYTES = 1 << 20


class FlatTaps:
    """Tap k of a stride-1, same-shaped grid as one flat offset into every contiguous plane.

    Output n reads input ``n + off_k`` (row-major flat). Where a tap reads past the edge of a
    dim other than the first, the flat index lands in the tap's *wrap zone* (the last ``-o``
    or first ``o`` entries of that dim, o the tap's offset along it), which no in-range read
    of that tap touches: so each tap reads a copy of the planes with its wrap zone zeroed
    (one copy per distinct offset over the trailing dims, made per cache-sized chunk), and
    reads past the first dim fall outside the flat range. Every tap is then a single strided
    multiply-add over (planes, M - |off_k|): no padded copy and no crop.
    """

    def __init__(self, grid: GridLike):
        self.grid = grid
        shape = grid.in_shape
        strides = [math.prod(shape[i + 1:]) for i in range(grid.ndim)]
        self.taps = []  # (k, flat offset, offsets along the trailing dims)
        for k, n_sl, m_sl in grid.taps:
            off = tuple(m.start - n.start for n, m in zip(n_sl, m_sl))
            self.taps.append((k, sum(o * s for o, s in zip(off, strides)), off[1:]))
        self._masks: dict = {}

    @staticmethod
    def applies(grid: GridLike) -> bool:
        """Whether the grid is stride 1 with an output of the input's shape."""
        return all(s == 1 for s in grid.stride) and grid.out_shape == grid.in_shape

    def mask(self, key: tuple[int, ...], ref: Tensor) -> Tensor:
        """(M,) ones with the wrap zone of trailing offsets ``key`` zeroed (a whole plane, so
        that masking a chunk is one long-run multiply)."""
        tag = (key, ref.dtype, ref.device)
        m = self._masks.get(tag)
        if m is None:
            m = ref.new_ones(self.grid.in_shape)
            for d, o in enumerate(key, start=1):
                at = (slice(None),) * d
                if o < 0:
                    m[at + (slice(m.shape[d] + o, None),)] = 0
                elif o > 0:
                    m[at + (slice(0, o),)] = 0
            m = m.reshape(-1)
            if not torch.compiler.is_compiling():
                # (a mask made while tracing, e.g. inside a traced backward, is the graph's own
                # tensor and cannot be kept: the compiled graph makes it as a constant)
                self._masks[tag] = m
        return m

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
            self.pieces = FlatTaps._views(planes, slice(None), chunks)
            self.bufs = {key: (ft.mask(key, planes), planes.new_empty(rows, planes.shape[1]))
                         for key in dict.fromkeys(keys) if key is not None}

        def views(self, key, cols: slice) -> list[Tensor]:
            """Per chunk, the columns ``cols`` of the planes masked for ``key``."""
            if key is None:
                return FlatTaps._views(self.planes, cols, self.chunks)
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
            ch, views = src.chunks, FlatTaps._views
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



class GridChannelwise(torch.autograd.Function):
    """y = Σ_k A_kᵀ (x ⊙ w_k), (B, M, C) x (K, C) -> (B, N, C): a depthwise convolution as one
    fused multiply-add per tap and cache-sized chunk; backward gx = Σ_k A_k (g ⊙ w_k),
    gw_k = <A_kᵀ x, g>.

    Channels-last x: straight on the grid, each tap a slice whose rows are long runs of
    channels (no padded copy). Channels-first x (a view of an NCHW image), where every
    image-channel plane is one contiguous row (grid slices of planes would be runs of one image
    row only, several times slower): stride-1 grids with an output of the input's shape as flat
    offsets into the planes themselves (``FlatTaps``: no padded copy, no crop), others on the
    tap layout.
    """

    @staticmethod
    def forward(ctx, grid, x, w, bias):
        B, _, C = x.shape
        cf = is_channels_first(x)
        ctx.grid = grid
        ctx.mode = "grid" if not cf else "flat" if grid.flat_taps is not None else "taps"
        if ctx.mode == "grid":
            ctx.save_for_backward(None, w, x)
            y = channelwise_grid(grid, x, w)
            return y if bias is None else y.add_(bias)
        if ctx.mode == "flat":
            ctx.save_for_backward(None, w, x)
            y = new_result(x, B, grid.N, C, True)
            grid.flat_taps.apply(planes(x), w.t().repeat(B, 1), out=planes(y),
                                 bias=None if bias is None else bias.repeat(B))
            return y
        t = Taps(grid, B, True)
        buf, out = t.fill(x), t.new_out(x, C)
        if not t.lay.taps:
            out.zero_()
        for c in t.chunks(2 * C * x.element_size(), CHANNELWISE_CHUNK_BYTES):
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
        return fused_backward(ctx, g, lambda x, w: ctx.grid.propagate_sum(x.unsqueeze(2) * w),
                               GridChannelwise._backward, 1)

    @staticmethod
    def _backward(ctx, g):
        want_x, want_w = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if ctx.mode == "grid":
            _, w, x = ctx.saved_tensors
            return (None,) + channelwise_grid_backward(ctx.grid, x, w, g, want_x, want_w)
        buf, w, x = ctx.saved_tensors
        B, _, C = g.shape
        if ctx.mode == "flat":
            gx, gw = ctx.grid.flat_taps.backward(planes(x), planes(g), w.t().repeat(B, 1),
                                                 B, C, want_x, want_w)
            return None, None if gx is None else gx.view(B, C, -1).transpose(1, 2), gw
        t = Taps(ctx.grid, B, True)
        gv = t.spread(g)
        gbuf = t.new_buffer(g, C) if want_x else None
        gw = torch.zeros_like(w) if want_w else None
        for c in t.chunks(2 * C * g.element_size(), CHANNELWISE_CHUNK_BYTES):
            gc = gv[c[0]:c[1]]
            if want_x:
                for k, a in t.views(gbuf, c):
                    a.addcmul_(gc, t.scale(w[k]))
            if want_w:
                for k, a in t.views(buf, c):
                    gw[k] += t.channel_sum(a * gc)
        return None, t.gather(gbuf) if want_x else None, gw


def channelwise_grid(grid: GridLike, x: Tensor, w: Tensor) -> Tensor:
    """Channels-last depthwise taps on the grid itself: (B, M, C) -> (B, N, C)."""
    B, _, C = x.shape
    src = x.reshape(B, *grid.in_shape, C)
    out = x.new_zeros(B, *grid.out_shape, C)
    full = (slice(None),)
    for bs in batch_chunks(B, (grid.M + grid.N) * C * x.element_size()):
        s, o = src[bs], out[bs]
        for k, n_sl, m_sl in grid.taps:
            o[full + n_sl].addcmul_(s[full + m_sl], w[k])
    return out.reshape(B, grid.N, C)


def channelwise_grid_backward(grid: GridLike, x, w, g, want_x: bool, want_w: bool):
    """Adjoint of ``channelwise_grid``: (gx or None, gw or None)."""
    B, _, C = x.shape
    src = x.reshape(B, *grid.in_shape, C)
    gs = g.reshape(B, *grid.out_shape, C)
    full = (slice(None),)
    gx = gw = None
    chunks = batch_chunks(B, (grid.M + grid.N) * C * x.element_size())
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

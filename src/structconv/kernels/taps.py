"""Tap routes of a grid convolution: every shift a row offset into one phase-split padded copy.

``TapLayout`` says where each tap reads; ``TapConv`` computes y = Σ_k A_kᵀ x Θ_k (+ bias) as one
GEMM per tap (``gemm``) or per row chunk (``im2col``), never building a (B, N, K, C) temporary.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .geometry import row_major_ints

#: a ``sc.basis.Grid`` (the kernels read its geometry; they never import the basis layer)
GridLike = object


# ------------------------------------------------------------------------------------------------
# Tap routes: every shift becomes a row offset into one phase-split, zero-padded copy of the input
class TapLayout:
    """Where each tap of a Grid reads, as row offsets into one phase-split padded buffer.

    The input is zero-padded and split into stride phases (``u = s*j + r`` per dim), each phase an
    image of ``phase_shape = ceil(padded / stride)``; only phases some tap reads are stored, one
    after the other, each holding the B images back to back. Output n (coordinates ``n_d``) then
    reads tap k at row ``v + off_k`` with ``v = b*V + Σ n_d S_d`` (S the phase image's row-major
    strides, V its size): every tap is a contiguous (rows, C) slice, so Σ_k A_kᵀ x Θ_k becomes K
    GEMMs on shifted views and nothing (B, N, K, C)-sized is built. Rows ``v`` that are no output
    (the phase image's margins) are computed and dropped; their gradient is zero. ``Taps`` lays
    the buffer out channels-last or channels-first.
    """

    def __init__(self, grid: GridLike):
        d = grid.ndim
        padded = [n + b + a for n, (b, a) in zip(grid.in_shape, grid.padding)]
        self.phase_shape = tuple(-(-p // s) for p, s in zip(padded, grid.stride))
        strides = [math.prod(self.phase_shape[i + 1:]) for i in range(d)]
        self.V = math.prod(self.phase_shape)
        phases: list[tuple[int, ...]] = []
        taps = []  # (k, phase, flat row offset in the phase image)
        kernel = row_major_ints(grid.kernel_size)
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
CHANNELWISE_CHUNK_BYTES = 16 << 20


class Taps:
    """One batch's tap layout in one memory order: buffers, outputs, chunks and tap views.

    Channels-last (``cf`` False): buffer (rows, C), virtual output (B*V, C), a chunk is a range
    of rows and a tap's view a (rows, C) slice. Channels-first (``cf`` True, for a view of an
    NCHW image): buffer (phases, B, C, V + tail), virtual output (B, C, V), a chunk is a range of
    images and a tap's view (images, C, V): every image-channel plane is one padded row.
    """

    def __init__(self, grid: GridLike, B: int, cf: bool):
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
        y = new_result(out, B, self.grid.N, C, self.cf)
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



def new_result(ref: Tensor, B: int, N: int, C: int, cf: bool) -> Tensor:
    """An uninitialised (B, N, C) tensor, channels-first strides if ``cf``: a kernel's own
    output, not a view of a temporary."""
    if cf:
        return torch.empty_strided((B, N, C), (C * N, 1, N), dtype=ref.dtype, device=ref.device)
    return ref.new_empty(B, N, C)


def is_channels_first(x: Tensor) -> bool:
    """Whether a (B, M, C) tensor is (a view of) channels-first planes, an NCHW image's: with
    one channel both layouts are the same memory, and planes are the faster one to copy."""
    return x.shape[1] > 1 and x.stride(1) == 1


def planes(x: Tensor) -> Tensor:
    """(B, M, C) -> its (B*C, M) channel planes, contiguous (a view of an NCHW image's)."""
    return x.transpose(1, 2).reshape(-1, x.shape[1])


def shift_conv(grid: GridLike, x: Tensor, th: Tensor) -> Tensor:
    """Σ_k A_kᵀ x Θ_k by the paper's input_param order on the grid's own shift kernels, whose
    autograd is its adjoint kernels all the way down: the tap kernels' double backward."""
    B, M, P = x.shape
    K, _, Q = th.shape
    z = (x.reshape(B * M, P) @ th.permute(1, 0, 2).reshape(P, K * Q)).reshape(B, M, K, Q)
    return grid.propagate_sum(z)


def fused_backward(ctx, g: Tensor, fn, fast, first: int) -> tuple:
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


def taps_matrix(th: Tensor, ks: list[int]) -> Tensor:
    """theta (K, P, Q) -> the (T*P, Q) stack of the used taps' matrices."""
    return th[ks].reshape(len(ks) * th.shape[1], th.shape[2])


class TapConv(torch.autograd.Function):
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
        t = Taps(grid, B, is_channels_first(x))
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
            w, col = taps_matrix(th, taps), None
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
        return fused_backward(ctx, g, lambda x, th: shift_conv(ctx.grid, x, th),
                               TapConv._backward, 2)

    @staticmethod
    def _backward(ctx, g):
        buf, th, _ = ctx.saved_tensors
        B, _, Q = g.shape
        P = th.shape[1]
        t = Taps(ctx.grid, B, ctx.cf)
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
            w, col = taps_matrix(th, taps), None
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

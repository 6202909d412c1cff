"""The grid shift kernels as one autograd op whose backward is its adjoint kernel.

``propagate`` (im2col), ``propagate_heads`` and ``propagate_sum`` of a ``Grid`` and their adjoints,
twice differentiable; the kernels themselves are the grid's ``apply_op``.
"""

from __future__ import annotations

import torch

#: each shift kernel's adjoint (a module constant: torch.compile traces the backward)
_ADJOINT = {"im2col": "col2im", "col2im": "im2col", "heads": "heads_T", "heads_T": "heads",
            "psum": "psum_T", "psum_T": "psum"}


class GridOp(torch.autograd.Function):
    """A grid shift kernel whose backward is its adjoint kernel (itself a GridOp, so twice
    differentiable): im2col <-> col2im, heads <-> heads_T, psum <-> psum_T."""

    @staticmethod
    def forward(ctx, grid, op, t):
        ctx.grid, ctx.op = grid, op
        out = grid.apply_op(op, t)
        # a 1-tap unpadded grid can return a view of t: hand autograd a tensor of its own
        # (while compiling, storage pointers are not there: copy whenever it can be a view)
        if torch.compiler.is_compiling():
            return out.clone() if grid.K == 1 else out
        return out.clone() if out.untyped_storage().data_ptr() == \
            t.untyped_storage().data_ptr() else out

    @staticmethod
    def backward(ctx, g):
        return None, None, GridOp.apply(ctx.grid, _ADJOINT[ctx.op], g)


#: bytes of input plus output per batch chunk of the tap loops: small enough to stay in cache
#: across the K taps, so memory is read once per chunk instead of once per tap
_CHUNK_BYTES = 4 << 20
#: at most this many chunks: every tap of every chunk is one (multi-threaded) kernel launch,
#: and many small parallel regions stall badly when other processes share the cores
_MAX_CHUNKS = 8


def batch_chunks(B: int, per_item: int):
    step = max(1, _CHUNK_BYTES // max(1, per_item), -(-B // _MAX_CHUNKS))
    return [slice(b, min(B, b + step)) for b in range(0, B, step)]

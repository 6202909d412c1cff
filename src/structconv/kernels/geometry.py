"""Grid geometry: argument normalisation, padding, output shapes, row-major coordinates.

Shared by the grid bases (``sc.basis.Grid``, ``AvgPool``) and their kernels; the lowest floor of
the grid code (it imports only torch).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


# ------------------------------------------------------------------------------------------------
# argument normalisation
def as_int(v, what: str) -> int:
    if isinstance(v, bool):
        raise TypeError(f"{what} must be an int, got bool {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(v).__name__} {v!r}") from None


def as_shape(v, what: str) -> tuple[int, ...]:
    """A non-empty tuple of positive ints from an int or a sequence of ints."""
    if isinstance(v, torch.Size):
        v = tuple(v)
    vals = (v,) if not isinstance(v, Sequence) or isinstance(v, str) else tuple(v)
    if not vals:
        raise ValueError(f"{what} must have at least one dimension, got {v!r}")
    out = tuple(as_int(a, what) for a in vals)
    if any(a < 1 for a in out):
        raise ValueError(f"{what} entries must be >= 1, got {out}")
    return out


def per_dim(v, d: int, what: str, low: int = 1) -> tuple[int, ...]:
    """An int broadcast to ``d`` dims, or a sequence of exactly ``d`` ints >= ``low``."""
    if isinstance(v, Sequence) and not isinstance(v, str):
        vals = tuple(as_int(a, what) for a in v)
        if len(vals) != d:
            raise ValueError(f"{what} has {len(vals)} entries {vals} but the grid has {d} dims")
    else:
        vals = (as_int(v, what),) * d
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


def pad_pairs(padding, d: int, kernel, stride, dilation) -> tuple[tuple[int, int], ...]:
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
                pairs.append((as_int(p[0], "padding"), as_int(p[1], "padding")))
            else:
                v = as_int(p, "padding")
                pairs.append((v, v))
    else:
        v = as_int(padding, "padding")
        pairs = [(v, v)] * d
    if any(a < 0 or b < 0 for a, b in pairs):
        raise ValueError(f"padding must be >= 0, got {tuple(pairs)}")
    return tuple(pairs)


def pad_spec(pads, trailing: int) -> list[int]:
    """F.pad's flat list for spatial dims followed by ``trailing`` unpadded dims."""
    spec = [0, 0] * trailing
    for b, a in reversed(pads):
        spec += [b, a]
    return spec


def row_major_ints(shape: Sequence[int]) -> list[tuple[int, ...]]:
    """The coordinates of ``shape``, row-major, as plain ints (``torch.compile`` traces the
    layouts built from them; a tensor's ``.tolist()`` would be data-dependent there)."""
    return list(itertools.product(*(range(s) for s in shape)))


def row_major(shape: Sequence[int]) -> Tensor:
    """(prod(shape), len(shape)) coordinates, row-major."""
    axes = [torch.arange(s) for s in shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(shape))



# ------------------------------------------------------------------------------------------------
class GridGeometry:
    """Sizes shared by Grid and AvgPool: input/output shapes, kernel, stride, dilation, pads."""

    def _setup(self, in_shape, kernel_size, stride, padding, dilation, name):
        self.in_shape = as_shape(in_shape, f"{name} in_shape")
        d = self.ndim = len(self.in_shape)
        self.kernel_size = per_dim(kernel_size, d, f"{name} kernel_size")
        self.stride = per_dim(stride, d, f"{name} stride")
        self.dilation = per_dim(dilation, d, f"{name} dilation")
        self.padding = pad_pairs(padding, d, self.kernel_size, self.stride, self.dilation)

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
        return F.pad(t, pad_spec(pads, trailing))

    def _channels_first_pad(self, x: Tensor) -> tuple[Tensor, tuple[int, ...] | None]:
        """x (B, C, *in_shape) padded by F.pad when asymmetric; else the symmetric padding."""
        if all(b == a for b, a in self.padding):
            return x, tuple(b for b, _ in self.padding)
        return F.pad(x, pad_spec(self.padding, 0)), None



def grid_indices(in_shape, out_shape, kernel_size, stride, padding, dilation) -> Tensor:
    """(3, nnz) ``[k; m; n]``: output n reads input m at kernel tap k (row-major everywhere)."""
    d = len(in_shape)
    n_coord = row_major(out_shape)  # (N, d)
    offsets = row_major(kernel_size)  # (K, d)
    m = (n_coord.unsqueeze(0) * torch.tensor(stride) - torch.tensor([b for b, _ in padding])
         + (offsets * torch.tensor(dilation)).unsqueeze(1))  # (K, N, d)
    valid = ((m >= 0) & (m < torch.tensor(in_shape))).all(-1)
    strides = torch.tensor([math.prod(in_shape[i + 1:]) for i in range(d)])
    m_flat = (m * strides).sum(-1)
    k, n = valid.nonzero(as_tuple=True)
    return torch.stack([k, m_flat[k, n], n])


def outer_prod(vectors: list[Tensor]) -> Tensor:
    """Row-major flattened outer product of 1-d integer tensors."""
    out = vectors[0]
    for v in vectors[1:]:
        out = (out.unsqueeze(-1) * v).reshape(-1)
    return out

"""GIN and GINE (Xu et al. 2019; Hu et al. 2020) with PyG's call signatures.

GIN's layer is ``nn(Aᵀ x + (1 + eps) x)``: ``A`` the sum basis (``sc.basis.adjacency``, K = 1,
``(M_src, N_dst)``: rectangular for a bipartite pair ``(x_src, x_dst)``), applied as a
structconv convolution primitive (one CSR SpMM, the structure cached per graph). GINE's
messages ``ReLU(x_m + e_mn)`` depend on the edge: an edge term, summed into each target by the
same sum over incoming edges, applied to per-edge values. ``gin_conv`` / ``gine_conv`` are the
functions; the modules hold ``nn``, ``eps`` and GINE's edge projection.

Under ``torch.compile`` the sum is traced as a gather and an ``index_add`` (what the sparse
operator computes while tracing) with the sizes taken from the tensors, so that a compiled
model with ``dynamic=True`` serves every batch size with one graph.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..basis.base import Basis
from ..basis.batch import adjacency
from ..basis.edges import as_edge_index
from .convert import register_pyg
from .pool import reset_module
from .pyg import PyGCompatible, check_mask

__all__ = ["GINConv", "GINEConv", "gin_conv", "gine_conv", "sum_neighbours"]


def _pair(x, who: str) -> tuple[Tensor, Tensor | None]:
    """(x_src, x_dst) from a tensor (both the same) or a pair (x_dst may be None); node
    features are (M, F), or (B, M, F) for a batch of graphs on the same edges (PyG's static
    graphs)."""
    pair = tuple(x) if isinstance(x, (tuple, list)) else (x, x)
    if len(pair) != 2:
        raise ValueError(f"{who} expects x as a tensor or a pair (x_src, x_dst), got "
                         f"{len(pair)} entries")
    for t, what in ((pair[0], "x (source)"), (pair[1], "x (target)")):
        if t is None and what == "x (target)":
            continue
        if isinstance(t, Tensor) and t.dim() in (2, 3) and not t.is_floating_point():
            # a ValueError, as every other malformed x here
            raise ValueError(f"{who} expects {what} as floating node features, got dtype "
                            f"{t.dtype}")
        if not isinstance(t, Tensor) or t.dim() not in (2, 3):
            got = f"shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{who} expects {what} as floating node features (M, F) or "
                             f"(B, M, F), got {got}")
    return pair[0], pair[1]


def _graph(edge_index, size, who: str):
    """(edge_index (2, E) or a Basis, edge weights or None, edge values or None, size) of any
    graph input (``as_edge_index``). A torch sparse ``adj_t``'s 1-d values weight the sum (PyG
    sums by a sparse product with them), its wider values and a ``SparseTensor``'s are
    GINE's edge features; a sparse input's shape is the size unless ``size`` is given."""
    if type(edge_index) is Tensor and edge_index.layout == torch.strided:  # the common path
        if edge_index.dtype == torch.bool or edge_index.is_floating_point():
            raise TypeError(f"{who}: edge_index must be an integer (2, E) tensor, got dtype "
                            f"{edge_index.dtype}")
        return edge_index, None, None, size
    if isinstance(edge_index, Basis):
        return edge_index, None, None, size
    e = as_edge_index(edge_index, f"{who}: edge_index")
    weight = attr = None
    if e.value is not None:
        if e.kind == "torch_sparse" and e.value.dim() == 1 and e.value.is_floating_point():
            weight = e.value
        elif e.kind == "sparse_tensor" or e.value.dim() > 1:
            attr = e.value
    return e.index, weight, attr, size if size is not None else e.size


def _sizes(x_src: Tensor, x_dst, edge_index, size, who: str) -> tuple[int, int]:
    if isinstance(edge_index, Basis) and who == "GINConv":
        b = edge_index
        N = x_dst.shape[-2] if x_dst is not None else b.N
        if b.K != 1 or b.M != x_src.shape[-2] or b.N != N:
            raise ValueError(f"GINConv: a given basis must be (1, M_src, N_dst) = (1, "
                             f"{x_src.shape[-2]}, {N}), got {b.shape}")
        return b.M, b.N
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        got = tuple(edge_index.shape) if isinstance(edge_index, Tensor) else \
            type(edge_index).__name__
        raise ValueError(f"{who} expects edge_index as a (2, E) integer tensor, got {got}")
    M = x_src.shape[-2]
    N = x_dst.shape[-2] if x_dst is not None else None
    if size is not None:
        if len(size) != 2:
            raise ValueError(f"{who}: size must be a pair (M_src, N_dst), got {size!r}")
        if size[0] is not None and size[0] != M:
            raise ValueError(f"{who}: size[0]={size[0]} but x (source) has {M} rows")
        if size[1] is not None and N is not None and size[1] != N:
            raise ValueError(f"{who}: size[1]={size[1]} but x (target) has {N} rows")
        N = size[1] if size[1] is not None else N
    if N is None:  # (x_src, None) without a size: as PyG, as many targets as sources
        N = M
    return M, N


def _scale(weight: Tensor | None, mask: Tensor | None, E: int, who: str) -> Tensor | None:
    """Per-edge factors of the messages: a sparse input's weights times an explain mask."""
    if mask is not None:
        check_mask(mask, E, who)
    if weight is None:
        return mask
    return weight if mask is None else weight * mask


def sum_neighbours(x_src: Tensor, edge_index: Tensor | Basis, N: int,
                   cache: bool = True, edge_weight: Tensor | None = None) -> Tensor:
    """``Aᵀ x_src``: each of the N targets' sum over its incoming edges, (N, F) (or (B, N, F)
    for x_src (B, M, F)), by the sum basis ``sc.basis.adjacency`` (its structure cached per
    ``edge_index``), or by the basis given in place of ``edge_index`` (built once and shared
    by the layers of a model). ``edge_weight`` (E,) scales each edge's message."""
    M, F = x_src.shape[-2:]
    if isinstance(edge_index, Basis):
        # squeeze, not [0]: a select's backward zero-fills and copies the whole gradient
        return edge_index.propagate_sum(x_src.reshape(1, M, 1, F)).squeeze(0)
    if torch.compiler.is_compiling() or M == 0 or N == 0 or x_src.dim() == 3 or \
            edge_weight is not None:
        # the traced form of the sparse product, sizes symbolic (no per-size graph)
        src, dst = edge_index[0], edge_index[1]
        msg = x_src.index_select(-2, src)
        if edge_weight is not None:
            msg = msg * edge_weight.to(msg.dtype).unsqueeze(-1)
        return x_src.new_zeros(*x_src.shape[:-2], N, F).index_add(-2, dst, msg)
    basis = adjacency(edge_index, (M, N), dtype=x_src.dtype, cache=cache)
    # Σ_k A_kᵀ z_k with K = 1: one SpMM, no stacking of heads
    return basis.propagate_sum(x_src.reshape(1, M, 1, F)).squeeze(0)


def gin_conv(x, edge_index: Tensor, nn: nn.Module, eps: Tensor | float = 0.0,
             size=None, edge_mask: Tensor | None = None) -> Tensor:
    """GIN: ``nn(Σ_{m -> n} x_m + (1 + eps) x_n)``; x (M, F) or a pair (x_src, x_dst);
    ``edge_index`` a (2, E) tensor, an ``EdgeIndex``, a sparse ``adj_t`` (N, M) or a built
    basis; ``edge_mask`` (E,) scales each message (PyG's explain masks)."""
    x_src, x_dst = _pair(x, "GINConv")
    edge_index, weight, _, size = _graph(edge_index, size, "GINConv")
    M, N = _sizes(x_src, x_dst, edge_index, size, "GINConv")
    if edge_mask is not None and isinstance(edge_index, Basis):
        raise ValueError("GINConv: explain masks need edge_index, not a built basis")
    scale = _scale(weight, edge_mask, edge_index.shape[-1], "GINConv") \
        if weight is not None or edge_mask is not None else None
    out = sum_neighbours(x_src, edge_index, N, edge_weight=scale)
    if x_dst is not None:
        out = out + (1 + eps) * x_dst
    return nn(out)


def gine_conv(x, edge_index: Tensor, edge_attr: Tensor, nn: nn.Module,
              eps: Tensor | float = 0.0, lin: nn.Module | None = None, size=None,
              edge_mask: Tensor | None = None) -> Tensor:
    """GINE: ``nn(Σ_{m -> n} ReLU(x_m + lin(e_mn)) + (1 + eps) x_n)``; ``lin`` None means the
    edge features are added as they are (same width as x); a ``SparseTensor`` ``adj_t``
    carries the edge features as its values."""
    x_src, x_dst = _pair(x, "GINEConv")
    edge_index, weight, values, size = _graph(edge_index, size, "GINEConv")
    M, N = _sizes(x_src, x_dst, edge_index, size, "GINEConv")
    E = edge_index.shape[1]
    if edge_attr is None:
        edge_attr = values
    if not isinstance(edge_attr, Tensor):
        raise ValueError("GINEConv needs edge_attr (E, D) with edge_index (2, E), got "
                         f"{type(edge_attr).__name__}")
    e = edge_attr.unsqueeze(-1) if edge_attr.dim() == 1 else edge_attr
    if e.dim() != 2 or e.shape[0] != E:
        raise ValueError(f"GINEConv expects edge_attr ({E}, D) to match edge_index (2, {E}), "
                         f"got {tuple(edge_attr.shape)}")
    if lin is None and e.shape[-1] != x_src.shape[-1]:
        raise ValueError(f"GINEConv: edge features have {e.shape[-1]} channels but x has "
                         f"{x_src.shape[-1]}; give edge_dim to project them")
    if lin is not None:
        e = lin(e)
    # the edge term: one message per edge, summed into its target
    msg = (x_src.index_select(-2, edge_index[0]) + e).relu()
    if weight is not None or edge_mask is not None:
        msg = msg * _scale(weight, edge_mask, E, "GINEConv").to(msg.dtype).unsqueeze(-1)
    out = msg.new_zeros(*msg.shape[:-2], N, msg.shape[-1]).index_add_(-2, edge_index[1], msg)
    if x_dst is not None:
        out = out + (1 + eps) * x_dst
    return nn(out)


class _GIN(PyGCompatible):
    """What GIN and GINE share: the ``nn`` applied after aggregating, and ``eps`` (a parameter
    with ``train_eps``, else a buffer), reset to its initial value."""

    def __init__(self, nn: nn.Module, eps: float, train_eps: bool):
        super().__init__()
        self.nn = nn
        self.initial_eps = float(eps)
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))

    def reset_parameters(self) -> None:
        reset_module(self.nn)
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)

    def extra_repr(self) -> str:
        return f"eps={self.initial_eps}, train_eps={isinstance(self.eps, torch.nn.Parameter)}"


class GINConv(_GIN):
    """PyG's ``GINConv(nn, eps=0.0, train_eps=False)``, called ``(x, edge_index, size=None)``
    with x (M, F) or a bipartite pair (x_src, x_dst): ``nn(Aᵀ x + (1 + eps) x)``.
    ``edge_index`` may also be the built sum basis ``sc.basis.adjacency(edge_index, ...)``
    (one structure for every layer of a model, no cache look-up per layer)."""

    def __init__(self, nn: nn.Module, eps: float = 0.0, train_eps: bool = False):
        super().__init__(nn, eps, train_eps)
        self.reset_parameters()

    def forward(self, x, edge_index: Tensor, size=None) -> Tensor:
        mask = self._explain_mask() if self.__dict__.get("_explain") else None
        return gin_conv(x, edge_index, self.nn, self.eps, size, mask)


def _in_channels(module: nn.Module) -> int:
    first = module[0] if isinstance(module, nn.Sequential) else module
    for attr in ("in_features", "in_channels"):
        v = getattr(first, attr, None)
        if isinstance(v, int):
            return v
    raise ValueError(f"GINEConv with edge_dim could not infer the input channels of nn "
                     f"({type(first).__name__} has no in_features / in_channels)")


class GINEConv(_GIN):
    """PyG's ``GINEConv(nn, eps=0.0, train_eps=False, edge_dim=None)``, called
    ``(x, edge_index, edge_attr, size=None)``: ``nn(Σ_{m -> n} ReLU(x_m + e_mn) +
    (1 + eps) x_n)``, with ``e = Linear(edge_dim, F)(edge_attr)`` when ``edge_dim`` is given."""

    def __init__(self, nn: nn.Module, eps: float = 0.0, train_eps: bool = False,
                 edge_dim: int | None = None):
        super().__init__(nn, eps, train_eps)
        self.lin = None if edge_dim is None else torch.nn.Linear(edge_dim, _in_channels(nn))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.lin is not None:
            self.lin.reset_parameters()

    def forward(self, x, edge_index: Tensor, edge_attr: Tensor | None = None,
                size=None) -> Tensor:
        mask = self._explain_mask() if self.__dict__.get("_explain") else None
        return gine_conv(x, edge_index, edge_attr, self.nn, self.eps, self.lin, size, mask)


# ------------------------------------------------------------------------------------------------
# converters from PyG (the ``nn`` is kept as it is: the converted layer shares it)
def _eps_of(m, out):
    # eps only: the shared nn stays exactly as the PyG layer holds it
    eps = m.eps.detach().reshape(1).clone()
    out.eps = torch.nn.Parameter(eps) if isinstance(out.eps, torch.nn.Parameter) else eps
    return out.train(m.training)


def _check_pyg_options(m) -> None:
    """Refuse a PyG layer built with an aggregation or flow other than GIN's (sum, source to
    target): converting it as GIN would silently compute something else."""
    aggr, flow = getattr(m, "aggr", "add"), getattr(m, "flow", "source_to_target")
    if not isinstance(aggr, str) or aggr not in ("add", "sum"):
        raise ValueError(f"from_pyg: {type(m).__name__} with aggr={aggr!r} is not GIN's sum "
                         "aggregation; only aggr='add' converts")
    if flow != "source_to_target":
        raise ValueError(f"from_pyg: {type(m).__name__} with flow={flow!r}: only "
                         "'source_to_target' converts (flip edge_index instead)")


@register_pyg("GINConv")
def _from_gin(m):
    _check_pyg_options(m)
    # built around a placeholder, then given the PyG layer's nn (a constructor would reset it)
    out = GINConv(nn.Identity(), eps=m.initial_eps,
                  train_eps=isinstance(m.eps, torch.nn.Parameter))
    out.nn = m.nn
    return _eps_of(m, out)


@register_pyg("GINEConv")
def _from_gine(m):
    _check_pyg_options(m)
    lin = getattr(m, "lin", None)
    out = GINEConv(nn.Identity(), eps=m.initial_eps,
                   train_eps=isinstance(m.eps, torch.nn.Parameter))
    out.nn = m.nn
    if lin is not None:
        out.lin = torch.nn.Linear(lin.in_channels, lin.out_channels, bias=lin.bias is not None)
        out.lin = out.lin.to(device=lin.weight.device, dtype=lin.weight.dtype)
        with torch.no_grad():
            out.lin.weight.copy_(lin.weight.detach())
            if lin.bias is not None:
                out.lin.bias.copy_(lin.bias.detach())
    return _eps_of(m, out)

"""Edge features in attention: edge terms, GATv2's mechanism, and self loops with features.

Per-edge auxiliary inputs e_mn (E, D) extend the bi-affine mechanism to a third input:

* ``EdgeTerm``     a linear map per head, score_k = e_mn · w_k (GAT's edge term: PyG's
  ``lin_edge`` and ``att_edge`` fold into w = att_edge · W_edge);
* ``EdgeDot``      the edge features against the output's per-head inputs, score_k =
  scale · (e_mn Wᵀ)[k] · h2[n, k] (TransformerConv: the edge shifts the key, k_m + e_mn Wᵀ);
* ``GATv2Scores``  GATv2's mechanism, score_k = a_k · LeakyReLU(h1[m, k] + h2[n, k] +
  e_mn W_k): the attention vector after the nonlinearity of the summed projections.

On edges they take e (E, D) (or (E,) when D = 1, or (B, E, D)); densely a tensor (M, N, D) (or
(B, M, N, D)) of every pair's features. ``add_self_loops`` gives a graph its self loops with
PyG's features for them (``self_loop_attr``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_index_tensor
from ..basis.edges import FILL_REDUCTIONS  # re-exported: the kind checks it
from ..params import glorot_
from .mechanisms import Mechanism, PerHead, QueryDot, check_scale, check_sizes, edges, heads

__all__ = ["EdgeTerm", "EdgeDot", "GATv2Scores", "add_self_loops", "self_loop_attr",
           "edge_features", "FILL_REDUCTIONS"]



def _own(given: dict) -> list[str]:
    """The names among ``given`` (name -> a given tensor or None) that a mechanism makes itself
    (None: drawn by its ``reset_parameters``); given weights belong to the caller (a layer
    resets its own)."""
    return [n for n, w in given.items() if w is None]


def _glorot_own(module) -> None:
    """Glorot-initialise the weights ``module`` made itself (``module._own``)."""
    for n in module._own:
        w = getattr(module, n)
        if w is not None:
            glorot_(w)


def edge_features(edge_attr, D: int, who: str, E: int | None = None) -> Tensor:
    """Per-edge features (E, D), (E,) (D = 1) or (B, E, D), checked, as (.., E, D)."""
    if edge_attr is None:
        raise ValueError(f"{who} reads edge features: give edge_attr (E, {D})")
    if not isinstance(edge_attr, Tensor) or not edge_attr.is_floating_point():
        got = getattr(edge_attr, "dtype", type(edge_attr).__name__)
        raise TypeError(f"{who}: edge_attr must be a floating tensor, got {got}")
    e = edge_attr.unsqueeze(-1) if edge_attr.dim() == 1 and D == 1 else edge_attr
    if e.dim() not in (2, 3) or e.shape[-1] != D or (E is not None and e.shape[-2] != E):
        want = f"({'E' if E is None else E}, {D})" + (" or (E,)" if D == 1 else "")
        raise ValueError(f"{who}: edge_attr must be {want} (one row per edge), got "
                         f"{tuple(edge_attr.shape)}")
    return e


def _dense_features(edge_attr, D: int, who: str, M: int, N: int) -> Tensor:
    if not isinstance(edge_attr, Tensor) or edge_attr.dim() not in (3, 4) or \
            tuple(edge_attr.shape[-3:]) != (M, N, D):
        got = tuple(edge_attr.shape) if isinstance(edge_attr, Tensor) else edge_attr
        raise ValueError(f"{who}: the dense form takes every pair's features (M, N, D)=({M}, "
                         f"{N}, {D}) or (B, M, N, D), got {got}")
    return edge_attr


def _num_edges(edge_index) -> int:
    check_index_tensor(edge_index, 2, "edge_index")
    return edge_index.shape[1]


class EdgeTerm(Mechanism):
    """Scores from edge features, a linear map per head: score_k(m, n) = e_mn · w_k.

    ``weight`` (K, D) (given: used as it is, e.g. computed from a layer's parameters). Reads
    no node content: in a ``Sum`` it gets the entry counts and the content terms' dtype.
    """

    reads_inputs = False

    def __init__(self, K: int, edge_dim: int, *, weight: Tensor | None = None):
        super().__init__()
        check_sizes("EdgeTerm", K=K, edge_dim=edge_dim)
        self.K, self.edge_dim = K, edge_dim
        self._own = _own({"weight": weight})
        self.weight = nn.Parameter(torch.empty(K, edge_dim)) if weight is None else weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``weight`` (unless given) ~ Glorot."""
        _glorot_own(self)

    def extra_repr(self):
        return f"K={self.K}, edge_dim={self.edge_dim}"

    def _w(self, like: Tensor) -> Tensor:
        return self.weight.reshape(self.K, self.edge_dim).to(like.dtype)

    def forward(self, x1, x2, edge_attr=None, *, dtype=None, device=None):
        M, N = self.entries(x1), self.entries(x2)
        if edge_attr is None:
            raise ValueError(f"EdgeTerm reads edge features: give edge_attr (M, N, "
                             f"{self.edge_dim}) (every pair's features) to the dense form")
        e = _dense_features(edge_attr, self.edge_dim, "EdgeTerm", M, N)
        out = torch.einsum("...mnd,kd->...kmn", e, self._w(e))
        return out if dtype is None else out.to(dtype)

    def edge_scores(self, x1, x2, edge_index, edge_attr=None, *, dtype=None, device=None):
        e = edge_features(edge_attr, self.edge_dim, "EdgeTerm", _num_edges(edge_index))
        out = e @ self._w(e).t()
        return out if dtype is None else out.to(dtype)


class EdgeDot(QueryDot):
    """Edge features against the outputs' per-head inputs: score_k(m, n) = scale ·
    ê_mn,k · h2[n, k], with per-head edge keys ê = e Wᵀ.

    With ``edge_dim``, ``weight`` (K·C, D) maps raw features e (E, D) to ê (PyG's
    ``lin_edge`` weight, given as it is); with ``edge_dim=None`` the edge features are the
    keys ê themselves, (E, K, C) (or (B, E, K, C)), e.g. projected once by a layer that also
    uses them as messages. Added to ``HeadDot`` it makes TransformerConv's scores
    q_n · (k_m + ê_mn) · scale, computed as one product per edge (``QueryDot``); ``scale``
    defaults to 1/sqrt(C).
    """

    def __init__(self, K: int, C: int, edge_dim: int | None = None, *,
                 scale: float | None = None, weight: Tensor | None = None):
        super().__init__()
        check_sizes("EdgeDot", K=K, C=C, **({} if edge_dim is None else {"edge_dim": edge_dim}))
        self.K, self.C, self.edge_dim = K, C, edge_dim
        self.scale = check_scale(scale, 1.0 / math.sqrt(C), "EdgeDot")
        self._own = _own({"weight": weight})
        if edge_dim is None:
            self.weight = None
        else:
            self.weight = nn.Parameter(torch.empty(K * C, edge_dim)) if weight is None else weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``weight`` (with ``edge_dim``, unless given) ~ Glorot."""
        _glorot_own(self)

    def extra_repr(self):
        return f"K={self.K}, C={self.C}, edge_dim={self.edge_dim}, scale={self.scale:.4g}"

    def project(self, edge_attr, E: int | None = None) -> Tensor:
        """Per-head edge keys ê (.., K, C) of edge features: per edge (E, D) / (B, E, D) -> (E,
        K, C) / (B, E, K, C), or dense (M, N, D) / (B, M, N, D) (``E`` None) -> (.., M, N, K,
        C); without a weight the features are the keys already and are returned as given."""
        if self.weight is None:
            lead = 1 if E is not None else 2  # entry dims before (K, C)
            e = edge_attr
            if not isinstance(e, Tensor) or e.dim() not in (2 + lead, 3 + lead) or \
                    tuple(e.shape[-2:]) != (self.K, self.C) or \
                    (E is not None and e.shape[-3] != E):
                got = tuple(e.shape) if isinstance(e, Tensor) else e
                raise ValueError(f"EdgeDot without edge_dim takes per-head edge keys ("
                                 f"{'E' if E is None else E}, K={self.K}, C={self.C}) (dense: "
                                 f"(M, N, K, C)), got {got}")
            return e
        if E is not None:
            e = edge_features(edge_attr, self.edge_dim, "EdgeDot", E)
        else:
            e = edge_attr
        return (e @ self.weight.to(e.dtype).t()).unflatten(-1, (self.K, self.C))

    def forward(self, h1, h2, edge_attr=None):
        b = heads(h2, self.K, self.C, "h2", "EdgeDot")
        M, N = self.entries(h1), b.shape[1]
        if self.weight is not None:
            _dense_features(edge_attr, self.edge_dim, "EdgeDot", M, N)
        elif not isinstance(edge_attr, Tensor) or tuple(edge_attr.shape[-4:-2]) != (M, N):
            got = tuple(edge_attr.shape) if isinstance(edge_attr, Tensor) else edge_attr
            raise ValueError(f"EdgeDot: the dense form takes every pair's keys (M, N, K, C)="
                             f"({M}, {N}, {self.K}, {self.C}), got {got}")
        eh = self.project(edge_attr)  # (M, N, K, C) or (B, M, N, K, C): small graphs only
        batched = eh.dim() == 5 or h1.dim() == 4 or h2.dim() == 4
        eh = eh if eh.dim() == 5 else eh.unsqueeze(0)
        out = (eh * b.unsqueeze(1).to(eh.dtype)).sum(-1).permute(0, 3, 1, 2) * self.scale
        return out if batched else out[0]

    def edge_keys(self, h1, h2, edge_index, edge_attr=None):
        return self.project(edge_attr, _num_edges(edge_index))


class GATv2Scores(PerHead):
    """GATv2's mechanism (Brody et al., ICLR 2022): score_k(m, n) = a_k · LeakyReLU(h1[m, k] +
    h2[n, k] (+ ê_mn,k)), the attention vector applied after the nonlinearity.

    Inputs are per-head projections h1 = x_m W_s (M, K, C) and h2 = x_n W_t (N, K, C); with
    ``edge_dim`` the edge features enter inside the nonlinearity as ê = e Wᵀ (``edge_weight``
    (K·C, D), PyG's ``lin_edge``). ``att`` (K, C) (or (1, K, C)) is PyG's ``att``; given tensors
    are used as they are. Without edge features the edge part is left out (as PyG).
    """

    def __init__(self, K: int, C: int, *, edge_dim: int | None = None, negative_slope: float = 0.2,
                 att: Tensor | None = None, edge_weight: Tensor | None = None):
        super().__init__()
        check_sizes("GATv2Scores", K=K, C=C, **({} if edge_dim is None else {"edge_dim": edge_dim}))
        self.K, self.C, self.edge_dim = K, C, edge_dim
        self.negative_slope = float(negative_slope)
        self._own = _own({"att": att, "edge_weight": edge_weight})
        self.att = nn.Parameter(torch.empty(K, C)) if att is None else att
        if edge_dim is None:
            self.edge_weight = None
        else:
            self.edge_weight = nn.Parameter(torch.empty(K * C, edge_dim)) if edge_weight is None \
                else edge_weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``att`` and ``edge_weight`` (those not given) ~ Glorot."""
        _glorot_own(self)

    def extra_repr(self):
        return (f"K={self.K}, C={self.C}, edge_dim={self.edge_dim}, "
                f"negative_slope={self.negative_slope}")

    def _edge_keys(self, edge_attr, like: Tensor, dense: tuple[int, int] | None, E=None):
        if edge_attr is None:
            return None
        if self.edge_weight is None:
            raise ValueError("GATv2Scores was built without edge_dim: edge_attr must be None")
        if dense is None:
            e = edge_features(edge_attr, self.edge_dim, "GATv2Scores", E)
        else:
            e = _dense_features(edge_attr, self.edge_dim, "GATv2Scores", *dense)
        return (e @ self.edge_weight.to(like.dtype).t()).unflatten(-1, (self.K, self.C))

    def _score(self, z: Tensor) -> Tensor:
        z = F.leaky_relu(z, self.negative_slope)
        return torch.linalg.vecdot(z, self.att.reshape(self.K, self.C).to(z.dtype))

    def forward(self, h1, h2, edge_attr=None):
        a = heads(h1, self.K, self.C, "h1", "GATv2Scores")
        b = heads(h2, self.K, self.C, "h2", "GATv2Scores")
        z = a.unsqueeze(2) + b.unsqueeze(1)  # (B, M, N, K, C): small graphs only
        ek = self._edge_keys(edge_attr, a, (a.shape[1], b.shape[1]))
        if ek is not None:
            z = z + (ek if ek.dim() == 5 else ek.unsqueeze(0))
        out = self._score(z).permute(0, 3, 1, 2)
        batched = h1.dim() == 4 or h2.dim() == 4 or (ek is not None and ek.dim() == 5)
        return out if batched else out[0]

    def edge_scores(self, h1, h2, edge_index, edge_attr=None):
        src, dst = edges(edge_index)
        a = heads(h1, self.K, self.C, "h1", "GATv2Scores")
        heads(h2, self.K, self.C, "h2", "GATv2Scores")
        # gathered along the entries dim as given: (E, K, C), or (B, E, K, C) when batched
        z = h1.index_select(-3, src) + h2.index_select(-3, dst)
        ek = self._edge_keys(edge_attr, a, None, src.shape[0])
        return self._score(z if ek is None else z + ek)


# ------------------------------------------------------------------------------------------------
def _fill_reduce(edge_attr: Tensor, targets: Tensor, n: int, how: str) -> Tensor:
    size = (n, *edge_attr.shape[1:])
    idx = targets.view(-1, *([1] * (edge_attr.dim() - 1))).expand_as(edge_attr)
    if how in ("add", "sum", "mean"):
        out = edge_attr.new_zeros(size).scatter_add(0, idx, edge_attr)
        if how == "mean":
            count = edge_attr.new_zeros(n).index_add(0, targets, edge_attr.new_ones(len(targets)))
            out = out / count.clamp_min(1).view(-1, *([1] * (edge_attr.dim() - 1)))
        return out
    if how == "mul":
        return edge_attr.new_ones(size).scatter_reduce(0, idx, edge_attr, "prod",
                                                       include_self=True)
    # max / min: nodes without incoming edges keep 0, as PyG's scatter
    return edge_attr.new_zeros(size).scatter_reduce(0, idx, edge_attr, "a" + how[-3:],
                                                    include_self=False)


def self_loop_attr(edge_attr: Tensor, targets: Tensor, num_nodes: int,
                   fill_value="mean") -> Tensor:
    """The features (num_nodes, *) of the self loops of nodes 0..num_nodes−1, as PyG's
    ``add_self_loops(..., fill_value)``: None = ones, a number or a tensor (broadcast to each
    loop), or a reduction ("mean", "add"/"sum", "max", "min", "mul") of the features of each
    node's incoming edges (``targets`` (E,) of the loop-free edges; a node without incoming
    edges gets 0, or 1 for "mul"; edges into nodes without a loop are not counted).
    """
    if fill_value is None:
        return edge_attr.new_ones((num_nodes, *edge_attr.shape[1:]))
    if isinstance(fill_value, (int, float)):
        return edge_attr.new_full((num_nodes, *edge_attr.shape[1:]), float(fill_value))
    if isinstance(fill_value, Tensor):
        v = fill_value.to(edge_attr.device, edge_attr.dtype)
        feat = tuple(edge_attr.shape[1:])
        # one loop's features (*), or one row of them (1, *); a scalar broadcasts to them
        if tuple(v.shape) not in (feat, (1, *feat)) and v.numel() != 1:
            raise ValueError(f"fill_value: a tensor fill must hold one self loop's features, "
                             f"shape {feat} (edge_attr is {tuple(edge_attr.shape)}), got shape "
                             f"{tuple(fill_value.shape)}")
        v = v.reshape(()) if v.numel() == 1 else v.reshape(feat)
        return v.expand((num_nodes, *feat)).contiguous()
    if isinstance(fill_value, str) and fill_value in FILL_REDUCTIONS:
        t = targets.long()
        # (reads the ids: not while compiling nor on the meta device, which has shapes only)
        if not torch.compiler.is_compiling() and t.device.type != "meta" and t.numel() and \
                int(t.max()) >= num_nodes:
            keep = t < num_nodes  # bipartite blocks: targets without a loop
            edge_attr, t = edge_attr[keep], t[keep]
        return _fill_reduce(edge_attr, t, num_nodes, fill_value)
    raise ValueError(f"fill_value must be None, a number, a tensor or one of "
                     f"{FILL_REDUCTIONS}, got {fill_value!r}")


def add_self_loops(edge_index: Tensor, num_nodes: int | tuple[int, int],
                   edge_attr: Tensor | None = None, fill_value="mean"
                   ) -> tuple[Tensor, Tensor | None]:
    """(edge_index (2, E' + n), edge_attr (E' + n, *) or None): the graph's self loops removed
    and one loop per node 0..n−1 appended, as PyG's ``remove_self_loops`` then
    ``add_self_loops(..., fill_value)`` (what its attention layers do).

    ``num_nodes`` is n, or (M, N) for a bipartite block (n = min(M, N)); ``edge_attr`` (E, *)
    keeps the features of the kept edges and gets the loops' from ``self_loop_attr``.
    """
    check_index_tensor(edge_index, 2, "add_self_loops edge_index")
    n = min(num_nodes) if isinstance(num_nodes, (tuple, list)) else num_nodes
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"add_self_loops: num_nodes must be an int >= 0 or a pair (M, N), "
                         f"got {num_nodes!r}")
    if edge_attr is not None and (not isinstance(edge_attr, Tensor) or edge_attr.dim() < 1 or
                                  edge_attr.shape[0] != edge_index.shape[1]):
        got = tuple(edge_attr.shape) if isinstance(edge_attr, Tensor) else edge_attr
        raise ValueError(f"add_self_loops: edge_attr must have one row per edge (E="
                         f"{edge_index.shape[1]}, ...), got {got}")
    if edge_index.device.type == "meta":
        # which edges are loops needs the ids: shape inference keeps every edge (the layer's
        # output shape does not depend on how many there are)
        keep = slice(None)
    else:
        keep = edge_index[0] != edge_index[1]
    ei = edge_index[:, keep]
    loop = torch.arange(n, device=edge_index.device, dtype=edge_index.dtype)
    out = torch.cat([ei, torch.stack([loop, loop])], 1)
    if edge_attr is None:
        return out, None
    kept = edge_attr[keep]
    return out, torch.cat([kept, self_loop_attr(kept, ei[1], n, fill_value)], 0)

"""``sc.nn.HeteroConv``: one bipartite layer per edge type, outputs grouped per destination type.

Called ``(x_dict, edge_index_dict, ...)`` like PyG's ``HeteroConv``: for each edge type
``(src, rel, dst)`` the layer gets ``x_dict[src]`` (or the pair ``(x_dict[src], x_dict[dst])``
where they differ) and ``edge_index_dict[(src, rel, dst)]``; other ``*_dict`` arguments are
handed out the same way (an edge type's own entry, else its node types'). A destination type's
outputs are grouped by ``aggr`` ("sum", "mean", "max", "min", "cat", or None: stacked (N, T, Q)).
A node type that no relation reaches is absent from the output (as PyG), never an error; an edge
type absent from ``edge_index_dict`` is skipped.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .convert import from_pyg, register_pyg

__all__ = ["HeteroConv", "group_outputs", "edge_key"]

_AGGRS = ("sum", "mean", "max", "min", "cat", None)


def edge_key(edge_type) -> str:
    """An edge type (src, rel, dst) as a module key, ``"src__rel__dst"``."""
    return "__".join(edge_type)


def group_outputs(xs: list[Tensor], aggr: str | None) -> Tensor | None:
    """The outputs of the relations ending at one node type, grouped as PyG's HeteroConv."""
    if not xs:
        return None
    if aggr is None:
        return torch.stack(xs, dim=1)
    if len(xs) == 1:
        return xs[0]
    if aggr == "cat":
        return torch.cat(xs, dim=-1)
    out = getattr(torch, aggr)(torch.stack(xs, dim=0), dim=0)
    return out[0] if isinstance(out, tuple) else out


def _check_convs(convs) -> dict:
    if not isinstance(convs, dict) or not convs:
        raise TypeError(f"HeteroConv: convs must be a non-empty dict from (src, rel, dst) to a "
                        f"layer, got {type(convs).__name__}")
    out = {}
    for et, m in convs.items():
        et = tuple(et.split("__")) if isinstance(et, str) else tuple(et)
        if len(et) != 3 or not all(isinstance(p, str) for p in et):
            raise ValueError(f"HeteroConv: an edge type must be (src, relation, dst) strings, "
                             f"got {et!r}")
        if not isinstance(m, nn.Module):
            raise TypeError(f"HeteroConv: the layer of {et} must be a torch.nn.Module, got "
                            f"{type(m).__name__}")
        out[et] = m
    return out


def _pick(value_dict: dict, edge_type):
    """(value for this edge type or its node types, whether it was the edge type's own)."""
    src, _, dst = edge_type
    if edge_type in value_dict:
        return value_dict[edge_type], True
    if src == dst and src in value_dict:
        return value_dict[src], False
    if src in value_dict or dst in value_dict:
        return (value_dict.get(src), value_dict.get(dst)), False
    return _MISSING, False


_MISSING = object()


class HeteroConv(nn.Module):
    """A layer per edge type (``convs``: (src, rel, dst) -> layer); returns {dst type: grouped
    outputs}, as PyG's ``HeteroConv``."""

    def __init__(self, convs: dict, aggr: str | None = "sum"):
        super().__init__()
        if aggr not in _AGGRS:
            raise ValueError(f"HeteroConv: aggr must be one of {list(_AGGRS)}, got {aggr!r}")
        convs = _check_convs(convs)
        self.edge_types = list(convs)
        self.convs = nn.ModuleDict({edge_key(et): m for et, m in convs.items()})
        self.aggr = aggr

    def reset_parameters(self) -> None:
        for m in self.convs.values():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def extra_repr(self) -> str:
        return f"num_relations={len(self.edge_types)}, aggr={self.aggr!r}"

    def _call_args(self, edge_type, args_dict, kwargs_dict):
        has_edge, args, kwargs = False, [], {}
        for d in args_dict:
            v, own = _pick(d, edge_type)
            has_edge |= own
            if v is not _MISSING:
                args.append(v)
        for name, d in kwargs_dict.items():
            if not name.endswith("_dict"):
                raise ValueError(f"HeteroConv: keyword arguments must end with '_dict' (one "
                                 f"value per node or edge type), got {name!r}")
            v, own = _pick(d, edge_type)
            has_edge |= own
            if v is not _MISSING:
                kwargs[name[:-5]] = v
        return has_edge, args, kwargs

    def forward(self, *args_dict, **kwargs_dict) -> dict[str, Tensor]:
        """(x_dict, edge_index_dict, ...) -> {dst type: (N_dst, Q)} (aggr None: (N, T, Q))."""
        outs: dict[str, list[Tensor]] = {}
        for et in self.edge_types:
            has_edge, args, kwargs = self._call_args(et, args_dict, kwargs_dict)
            if not has_edge:
                continue
            outs.setdefault(et[2], []).append(self.convs[edge_key(et)](*args, **kwargs))
        return {t: group_outputs(v, self.aggr) for t, v in outs.items()}


@register_pyg("HeteroConv")
def _from_hetero(m):
    convs = {}
    for key, conv in m.convs.items():
        et = tuple(key) if isinstance(key, tuple) else tuple(key.split("__"))
        convs[et] = from_pyg(conv)
    return HeteroConv(convs, aggr=m.aggr).train(m.training)

"""Typed node classifiers of ``[model.hetero]`` tables: typed SAGE, R-GCN with any parameter
form across relations, HGT and HAN, each a few graph layers and a linear head on one node type.

A model takes ``(x_dict, edge_index_dict)`` as ``typed_inputs`` gives them for a typed graph
(a node type without features reads a constant 1, as PyG's ``T.Constant``; a "han" model reads
the named or mined metapaths' graphs, each the nonzero pattern of its relations' product) and
returns the target type's logits (n_target, classes).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..basis.typed import metapath_edges, parse_metapath
from ..basis.typed_mining import mine_metapaths
from ..config import ConfigError, hetero_spec, mined_metapaths
from ..nn.han import HANConv
from ..nn.hgt import HGTConv
from ..nn.typed import TypedGraphConv
from .declared import ACTIVATIONS

__all__ = ["TypedClassifier", "build_hetero", "typed_target", "typed_metadata", "typed_inputs",
           "typed_classes"]


def typed_target(spec: dict, graph) -> str:
    """The node type a model classifies: ``spec['target']``, or the graph's one labelled type."""
    labelled = [t for t in graph.y if t in graph.masks]
    if spec.get("target"):
        if spec["target"] not in labelled:
            raise ConfigError(f"model.hetero.target {spec['target']!r} is not a labelled node "
                              f"type of {graph.name} (labelled: {labelled})")
        return spec["target"]
    if len(labelled) != 1:
        raise ConfigError(f"{graph.name} has labelled node types {labelled}: name one as "
                          "model.hetero.target")
    return labelled[0]


def typed_classes(graph, target: str) -> int:
    """The number of classes of the target type's labels."""
    y = graph.y[target]
    return int(y.max()) + 1 if y.numel() else 0


def _mined(spec: dict, graph, k: int, length: int) -> list[str]:
    """The names of the k best supported metapaths of length 1..``length`` from the target
    type back to it (``sc.basis.mine_metapaths``)."""
    target = typed_target(spec, graph)
    found = mine_metapaths(graph, target, target, max_length=length, top=k)
    if not found:
        raise ConfigError(f"model.hetero.metapaths {spec['metapaths']!r}: {graph.name} has no "
                          f"metapath from {target!r} back to it of length up to {length}")
    return [m.name for m in found]


def _sorts(spec: dict, graph) -> list[tuple[str, str, str]]:
    """The metapaths' edge types (start, sort name, end), checked against the graph: the
    named ones, or those mined (``"mined:K"`` / ``"mined:K:L"``)."""
    mined = mined_metapaths(spec["metapaths"])
    names = spec["metapaths"] if mined is None else _mined(spec, graph, *mined)
    out = []
    for s in names:
        try:
            path = parse_metapath(s, graph.edge_types)
        except ValueError as e:
            raise ConfigError(f"model.hetero.metapaths: {e}") from None
        out.append((path[0][0], s, path[-1][2]))
    return out


def typed_metadata(spec: dict, graph) -> tuple[list[str], list[tuple[str, str, str]]]:
    """(node types, edge types) the model sees: the graph's, or the metapaths' for "han"."""
    if spec["kind"] != "han":
        return graph.metadata()
    ets = _sorts(spec, graph)
    types = [t for t in graph.node_types if any(t in (e[0], e[2]) for e in ets)]
    return types, ets


def typed_inputs(spec: dict, graph) -> tuple[dict[str, Tensor], dict]:
    """(x_dict, edge_index_dict) on the graph's device: a featureless type reads ones (n, 1);
    a "han" model's edges are its metapaths' graphs (``sc.basis.metapath_edges``)."""
    types, ets = typed_metadata(spec, graph)
    like = next(iter(graph.x.values()), None)
    x = {t: graph.x[t] if t in graph.x else
         torch.ones(graph.num_nodes[t], 1, dtype=like.dtype if like is not None else None)
         for t in types}
    if spec["kind"] != "han":
        return x, graph.edge_index_dict
    return x, {et: metapath_edges(graph, et[1]) for et in ets}


class TypedClassifier(nn.Module):
    """A ``[model.hetero]`` model: (x_dict, edge_index_dict) -> the target type's logits
    (n_target, classes)."""

    def __init__(self, spec: dict, widths: dict[str, int], classes: int, metadata, target: str):
        super().__init__()
        self.kind, self.target = spec["kind"], target
        self.act = ACTIVATIONS[spec["activation"]]
        self.dropout = float(spec["dropout"])
        hid, L = int(spec["hidden"]), int(spec["layers"])
        self.lins = None
        if self.kind in ("sage", "rgcn"):
            param = {"param": spec["param"], "H": spec["H"], "groups": spec["groups"],
                     "rank": spec["rank"]} if self.kind == "rgcn" else "full"
            self.convs = nn.ModuleList([TypedGraphConv(widths if i == 0 else hid, hid, metadata,
                                                       param=param, aggr="mean")
                                        for i in range(L)])
        elif self.kind == "hgt":
            self.lins = nn.ModuleDict({t: nn.Linear(w, hid) for t, w in widths.items()})
            self.convs = nn.ModuleList([HGTConv(hid, hid, metadata, spec["heads"])
                                        for _ in range(L)])
        else:  # han: one HANConv per layer over the metapath graphs (attention dropout)
            self.convs = nn.ModuleList([HANConv(widths if i == 0 else hid, hid, metadata,
                                                heads=spec["heads"], dropout=self.dropout)
                                        for i in range(L)])
        self.head = nn.Linear(hid, classes)
        #: activation scalars the backward pass keeps, about (models.build.memory_estimate)
        n = sum(1 for _ in metadata[0])
        self.activation_elements = 4 * L * hid * max(n, 1)

    def reset_parameters(self) -> None:
        for m in [*self.convs, self.head, *(self.lins.values() if self.lins else [])]:
            m.reset_parameters()

    def forward(self, x_dict: dict[str, Tensor], edge_index_dict: dict) -> Tensor:
        """{type: (n_t, P_t)}, {edge type: (2, E)} -> (n_target, classes)."""
        if self.lins is not None:
            x_dict = {t: F.relu(self.lins[t](x)) for t, x in x_dict.items()}
        for conv in self.convs:
            x_dict = conv(x_dict, edge_index_dict)
            if self.kind == "han":
                continue  # HANConv's metapath outputs are already ReLU'd; its dropout is inside
            if self.act is not None and self.kind != "hgt":
                x_dict = {t: self.act(x) for t, x in x_dict.items()}
            if self.dropout:
                x_dict = {t: F.dropout(x, self.dropout, self.training) for t, x in x_dict.items()}
        return self.head(x_dict[self.target])


def build_hetero(cfg: dict, data) -> TypedClassifier:
    """The ``TypedClassifier`` of a ``[model.hetero]`` table, for a typed graph."""
    if getattr(data, "task", None) != "hetero":
        raise ConfigError(f"model.hetero classifies the nodes of a typed graph (dblp, imdb), "
                          f"got a {getattr(data, 'task', '?')} task ({cfg['data']['name']})")
    spec = hetero_spec(cfg)
    target = typed_target(spec, data)
    meta = typed_metadata(spec, data)
    widths = {t: int(data.x[t].shape[1]) if t in data.x else 1 for t in meta[0]}
    return TypedClassifier(spec, widths, typed_classes(data, target), meta, target)

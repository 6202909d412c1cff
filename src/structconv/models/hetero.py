"""Typed node classifiers of ``[model.hetero]`` tables: typed SAGE, R-GCN with any parameter
form across relations, HGT and HAN, each a few graph layers and a linear head on one node type;
typed GAT (PyG's ``to_hetero`` of its tutorial GAT), whose last layer gives the classes.

A model takes ``(x_dict, edge_index_dict)`` as ``typed_inputs`` gives them for a typed graph
(a node type without features reads a constant 1, as PyG's ``T.Constant``, or with ``embed``
a learned vector per node; a "han" model reads the named or mined metapaths' graphs, each the
nonzero pattern of its relations' product) and returns the target type's logits (n_target,
classes).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..basis.typed import metapath_edges, parse_metapath
from ..basis.typed_mining import mine_metapaths
from ..config import ConfigError, hetero_spec, mined_metapaths
from ..nn.graph_attention import GATConv
from ..nn.han import HANConv
from ..nn.hetero import HeteroConv, edge_key
from ..nn.hgt import HGTConv
from ..nn.typed import TypedGraphConv, check_metadata
from .declared import ACTIVATIONS

__all__ = ["TypedClassifier", "TypedGATLayer", "build_hetero", "typed_target", "typed_metadata",
           "typed_inputs", "typed_classes"]


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


class TypedGATLayer(nn.Module):
    """PyG's ``to_hetero`` of ``GATConv((-1, -1), Q, add_self_loops=False)(x, ei) +
    Linear(-1, Q)(x)``: a GAT layer per relation on its own source and target widths, summed
    per target type, plus a linear map per node type. {type: (n_t, P_t)} -> {type: (n_t, Q·heads)}
    (``concat``) or (n_t, Q); a type that no relation reaches gets its linear map alone."""

    def __init__(self, widths: dict[str, int], out_channels: int, metadata, heads: int = 1,
                 concat: bool = True):
        super().__init__()
        nts, ets = check_metadata(metadata)
        self.node_types, self.edge_types = nts, ets
        total = out_channels * (heads if concat else 1)
        self.conv = HeteroConv({e: GATConv((widths[e[0]], widths[e[2]]), out_channels, heads,
                                           concat, add_self_loops=False) for e in ets},
                               aggr="sum") if ets else None
        self.skip = nn.ModuleDict({t: nn.Linear(widths[t], total) for t in nts})

    def reset_parameters(self) -> None:
        for m in [*([self.conv] if self.conv is not None else []), *self.skip.values()]:
            m.reset_parameters()

    @torch.no_grad()
    def load_pyg(self, conv: nn.Module, lin: nn.Module) -> TypedGATLayer:
        """Copy the weights of PyG's ``to_hetero`` layers (``conv``: a ModuleDict of GATConv
        keyed "src__rel__dst", ``lin``: of Linear keyed by node type) into this layer."""
        for e in self.edge_types:
            self.conv.convs[edge_key(e)].load_state_dict(conv[edge_key(e)].state_dict())
        for t in self.node_types:
            self.skip[t].load_state_dict(lin[t].state_dict())
        return self

    def forward(self, x_dict: dict[str, Tensor], edge_index_dict: dict) -> dict[str, Tensor]:
        """{type: (n_t, P_t)}, {(s, rel, d): (2, E)} -> {type: (n_t, out)}."""
        msgs = self.conv(x_dict, edge_index_dict) if self.conv is not None else {}
        return {t: msgs[t] + self.skip[t](x) if t in msgs else self.skip[t](x)
                for t, x in x_dict.items()}


def _gat_layers(spec: dict, widths: dict, classes: int, metadata) -> list[TypedGATLayer]:
    """``layers`` typed GAT layers: hidden ones of ``hidden`` channels (``heads`` heads of
    hidden / heads, concatenated), the last one to the classes (heads averaged)."""
    hid, L, heads = int(spec["hidden"]), int(spec["layers"]), int(spec["heads"])
    out, w = [], dict(widths)
    for i in range(L):
        last = i == L - 1
        out.append(TypedGATLayer(w, classes if last else hid // heads, metadata, heads,
                                 concat=not last))
        w = {t: hid for t in w}
    return out


class TypedClassifier(nn.Module):
    """A ``[model.hetero]`` model: (x_dict, edge_index_dict) -> the target type's logits
    (n_target, classes). ``embedded`` {type: node count}: the featureless types that read a
    learned ``spec["embed"]``-wide vector per node (their ``widths`` entry is that width)."""

    def __init__(self, spec: dict, widths: dict[str, int], classes: int, metadata, target: str,
                 embedded: dict[str, int] | None = None):
        super().__init__()
        self.kind, self.target = spec["kind"], target
        self.act = ACTIVATIONS[spec["activation"]]
        self.dropout = float(spec["dropout"])
        hid, L = int(spec["hidden"]), int(spec["layers"])
        self.lins = None
        self.embedded = list(embedded or {})
        # nn.Embedding's initialisation, N(0, 1); drawn first (no draw when there is none)
        self.embeds = nn.ParameterList([nn.Parameter(torch.randn(n, int(spec["embed"])))
                                        for n in (embedded or {}).values()])
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
        elif self.kind == "gat":
            self.convs = nn.ModuleList(_gat_layers(spec, widths, classes, metadata))
        else:  # han: one HANConv per layer over the metapath graphs (attention dropout)
            self.convs = nn.ModuleList([HANConv(widths if i == 0 else hid, hid, metadata,
                                                heads=spec["heads"], dropout=self.dropout)
                                        for i in range(L)])
        # gat: the last layer gives the classes (PyG's tutorial model has no head)
        self.head = None if self.kind == "gat" else nn.Linear(hid, classes)
        #: activation scalars the backward pass keeps, about (models.build.memory_estimate)
        n = sum(1 for _ in metadata[0])
        self.activation_elements = 4 * L * hid * max(n, 1)

    def reset_parameters(self) -> None:
        for m in [*self.convs, *([self.head] if self.head is not None else []),
                  *(self.lins.values() if self.lins else [])]:
            m.reset_parameters()
        for e in self.embeds:
            nn.init.normal_(e)

    def forward(self, x_dict: dict[str, Tensor], edge_index_dict: dict) -> Tensor:
        """{type: (n_t, P_t)}, {edge type: (2, E)} -> (n_target, classes)."""
        if self.embedded:
            x_dict = {**x_dict, **dict(zip(self.embedded, self.embeds))}
        if self.lins is not None:
            x_dict = {t: F.relu(self.lins[t](x)) for t, x in x_dict.items()}
        for i, conv in enumerate(self.convs):
            x_dict = conv(x_dict, edge_index_dict)
            if self.kind == "han" or (self.kind == "gat" and i == len(self.convs) - 1):
                continue  # HANConv's outputs are already ReLU'd; GAT's last gives the logits
            if self.act is not None and self.kind != "hgt":
                x_dict = {t: self.act(x) for t, x in x_dict.items()}
            if self.dropout:
                x_dict = {t: F.dropout(x, self.dropout, self.training) for t, x in x_dict.items()}
        out = x_dict[self.target]
        return out if self.head is None else self.head(out)


def build_hetero(cfg: dict, data) -> TypedClassifier:
    """The ``TypedClassifier`` of a ``[model.hetero]`` table, for a typed graph."""
    if getattr(data, "task", None) != "hetero":
        raise ConfigError(f"model.hetero classifies the nodes of a typed graph (dblp, imdb), "
                          f"got a {getattr(data, 'task', '?')} task ({cfg['data']['name']})")
    spec = hetero_spec(cfg)
    target = typed_target(spec, data)
    meta = typed_metadata(spec, data)
    embedded = {t: int(data.num_nodes[t]) for t in meta[0] if t not in data.x} \
        if spec["embed"] else {}
    widths = {t: int(spec["embed"]) if t in embedded else
              int(data.x[t].shape[1]) if t in data.x else 1 for t in meta[0]}
    return TypedClassifier(spec, widths, typed_classes(data, target), meta, target, embedded)

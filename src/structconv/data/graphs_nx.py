"""Graphs that ship with networkx, as node-classification sets (karate club, Davis women)."""

from __future__ import annotations

import torch

from .._extras import require
from .registry import GraphData, check_fraction, check_int, register_dataset

__all__ = ["from_networkx", "karate_club"]


def from_networkx(name: str, g, label_attr: str, train_per_class: int = 4, val: float = 0.3,
                  seed: int = 0, features: str = "identity") -> GraphData:
    """A networkx graph with a categorical node attribute -> GraphData (both edge directions).

    ``features`` "identity" gives one-hot node ids (x = I, the classic featureless input) and
    "degree" a one-hot degree; train holds ``train_per_class`` nodes of each class.
    """
    check_int(name, "train_per_class", train_per_class, 1)
    check_fraction(name, "val", val)
    check_int(name, "seed", seed, 0, 2**63 - 1)
    nodes = list(g.nodes())
    pos = {v: i for i, v in enumerate(nodes)}
    classes = sorted({g.nodes[v][label_attr] for v in nodes}, key=str)
    cls = {c: i for i, c in enumerate(classes)}
    y = torch.tensor([cls[g.nodes[v][label_attr]] for v in nodes])
    src, dst = [], []
    for u, v in g.edges():
        if u != v:
            src += [pos[u], pos[v]]
            dst += [pos[v], pos[u]]
    edge_index = torch.tensor([src, dst], dtype=torch.int64)
    n = len(nodes)
    if features == "identity":
        x = torch.eye(n)
    elif features == "degree":
        deg = torch.bincount(edge_index[1], minlength=n)
        x = torch.nn.functional.one_hot(deg, int(deg.max()) + 1).float()
    else:
        raise ValueError(f"features must be 'identity' or 'degree', got {features!r}")
    g_rng = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g_rng)
    train = torch.zeros(n, dtype=torch.bool)
    for c in range(len(classes)):
        members = perm[y[perm] == c][:train_per_class]
        train[members] = True
    rest = perm[~train[perm]]
    n_val = int(round(val * rest.numel()))
    val_m = torch.zeros(n, dtype=torch.bool)
    val_m[rest[:n_val]] = True
    test_m = ~(train | val_m)
    return GraphData(name, x, y, edge_index, {"train": train, "val": val_m, "test": test_m},
                     len(classes))


@register_dataset("karate", None, "Zachary's karate club (networkx), 34 nodes, 2 clubs")
def karate_club(root=None, train_per_class: int = 4, val: float = 0.3, seed: int = 0,
                features: str = "identity") -> GraphData:
    """Zachary's karate club: predict each member's club from the friendship graph."""
    nx = require("networkx", "graph", "the networkx graphs (karate, davis)")

    return from_networkx("karate", nx.karate_club_graph(), "club", train_per_class, val, seed,
                         features)


@register_dataset("davis", None, "Davis southern women (networkx), bipartite, 2 node kinds")
def _davis(root=None, train_per_class: int = 3, val: float = 0.3, seed: int = 0,
           features: str = "degree"):
    nx = require("networkx", "graph", "the networkx graphs (karate, davis)")

    return from_networkx("davis", nx.davis_southern_women_graph(), "bipartite",
                         train_per_class, val, seed, features)

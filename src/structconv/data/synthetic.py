"""A synthetic node-classification graph of any size: a stochastic block model with signal.

``load_dataset("synthetic:nodes=1000000,edges=10000000")`` (or ``data.options``): every node
belongs to one of ``classes`` blocks (its label); an edge's far end lies in the same block with
probability ``p_in``, else anywhere; features are the block's centroid plus Gaussian noise, so
both the features and the neighbourhood carry the label. Generated in chunks in torch, memory
proportional to the edges (16 bytes each) and nodes (4 bytes per feature), never N x N;
reproducible from ``seed``.
"""

from __future__ import annotations

import math
import numbers

import torch

from .._checks import available_memory, gib
from .registry import DatasetError, GraphData, register_dataset

__all__ = ["synthetic_graph", "synthetic_bytes"]

#: undirected pairs drawn per chunk (bounds the generator's temporaries at ~200 MiB)
CHUNK = 1 << 22


def synthetic_bytes(nodes: int, edges: int, features: int) -> int:
    """The bytes a synthetic graph holds (edge_index, features, labels, masks) plus the
    generator's per-node temporaries."""
    return 16 * edges + nodes * (4 * features + 8 + 3 + 24)


#: sizes beyond int64 overflow torch's index arithmetic (the memory check refuses far less)
MAX_SIZE = 2**62
#: torch.Generator.manual_seed takes a 64-bit seed
MAX_SEED = 2**64 - 1


def _int(v, what: str, low: int, high: int = MAX_SIZE) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not low <= v <= high:
        top = "2^64 - 1" if high == MAX_SEED else f"2^{high.bit_length() - 1}"
        raise DatasetError(f"synthetic: {what} must be an int >= {low} (and at most {top}), "
                           f"got {v!r}")
    return int(v)


def _fraction(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v <= 1:
        raise DatasetError(f"synthetic: {what} must be a number in [0, 1], got {v!r}")
    return float(v)


def _check(nodes, edges, classes, features, p_in, noise, train, val):
    nodes, edges = _int(nodes, "nodes", 2), _int(edges, "edges", 2)
    classes, features = _int(classes, "classes", 2), _int(features, "features", 1)
    if classes > nodes:
        raise DatasetError(f"synthetic: classes ({classes}) must be at most nodes ({nodes})")
    p_in, train, val = _fraction(p_in, "p_in"), _fraction(train, "train"), _fraction(val, "val")
    if train + val > 1:
        raise DatasetError(f"synthetic: train + val must be at most 1, got {train} + {val}")
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real) or \
            not 0 <= noise < math.inf:
        raise DatasetError(f"synthetic: noise must be a finite number >= 0, got {noise!r}")
    need, free = synthetic_bytes(nodes, edges, features), available_memory("cpu")
    if free is not None and need > free:
        raise DatasetError(f"synthetic: {nodes:,} nodes and {edges:,} edges with {features} "
                           f"features need about {gib(need)} ({gib(16 * edges)} of edges), "
                           f"more than the {gib(free)} available on this machine: lower "
                           "nodes, edges or features")
    return nodes, edges, classes, features, p_in, float(noise), train, val


@register_dataset("synthetic", None, "stochastic block model of any size, e.g. "
                                     "synthetic:nodes=1000000,edges=10000000")
def synthetic_graph(root=None, nodes: int = 10_000, edges: int = 100_000, classes: int = 8,
                    features: int = 32, p_in: float = 0.8, noise: float = 4.0, seed: int = 0,
                    train: float = 0.6, val: float = 0.2) -> GraphData:
    """A ``GraphData`` of ``nodes`` nodes, ``edges`` directed edges (both directions of
    edges // 2 undirected pairs), labels in [0, classes), features (nodes, features) float32
    = centroid of the label (N(0, 1) entries) + N(0, noise²), and random train / val / test
    masks of the given fractions."""
    nodes, edges, classes, features, p_in, noise, train, val = _check(
        nodes, edges, classes, features, p_in, noise, train, val)
    g = torch.Generator().manual_seed(_int(seed, "seed", 0, MAX_SEED))
    y = torch.randint(0, classes, (nodes,), generator=g)
    # the blocks' members, contiguous: a node of block c is members[start[c] + uniform(size)]
    members = torch.argsort(y, stable=True)
    size = torch.bincount(y, minlength=classes)
    start = torch.cumsum(size, 0) - size
    pairs = edges // 2
    ei = torch.empty(2, 2 * pairs, dtype=torch.long)
    for lo in range(0, pairs, CHUNK):
        n = min(CHUNK, pairs - lo)
        u = torch.randint(0, nodes, (n,), generator=g)
        cu = y[u]
        inside = members[start[cu] + (torch.rand(n, generator=g, dtype=torch.float64)
                                      * size[cu]).long().clamp_max(size[cu] - 1)]
        v = torch.where(torch.rand(n, generator=g) < p_in, inside,
                        torch.randint(0, nodes, (n,), generator=g))
        ei[0, lo:lo + n], ei[1, lo:lo + n] = u, v
        ei[0, pairs + lo:pairs + lo + n], ei[1, pairs + lo:pairs + lo + n] = v, u
    del members
    centroids = torch.randn(classes, features, generator=g)
    x = torch.empty(nodes, features)
    for lo in range(0, nodes, CHUNK):
        hi = min(nodes, lo + CHUNK)
        x[lo:hi] = centroids[y[lo:hi]] + noise * torch.randn(hi - lo, features, generator=g)
    r = torch.rand(nodes, generator=g)
    masks = {"train": r < train, "val": (r >= train) & (r < train + val),
             "test": r >= train + val}
    return GraphData("synthetic", x, y, ei, masks, classes)

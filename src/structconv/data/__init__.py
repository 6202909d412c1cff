"""Datasets: loaders that parse real files into tensors, and a registry by name.

Each loader module registers its datasets with ``register_dataset`` when imported; this package
imports them all, so the registry (the floor below them) never imports a loader.
"""

from . import (  # noqa: F401  (the loader modules, imported for their registrations)
    depo,
    g2p,
    graphs_nx,
    hetero,
    images,
    kg,
    molecules,
    planetoid,
    rdf_typed,
    rgcn,
    series,
    synthetic,
    text,
    tsp,
    tu,
)
from .batch import GraphBatch, GraphDataset, GraphLoader
from .hetero import HeteroGraph
from .registry import DATASETS, dataset_names, load_dataset, register_dataset

__all__ = ["DATASETS", "dataset_names", "load_dataset", "register_dataset", "GraphBatch",
           "GraphDataset", "GraphLoader", "HeteroGraph"]

"""The training graph of a relational dataset, as sort mining and encoders see it."""

from __future__ import annotations

from torch import Tensor

__all__ = ["training_graph"]


def training_graph(data) -> tuple[Tensor, Tensor, int, list[str] | None]:
    """(edge_index (2, E), edge_type (E,), num_nodes, edge-type names) of a dataset's training
    graph: a link-prediction set's training triples with inverses (``r + R``), or an
    entity-classification graph (all of it: its labels are on nodes, not edges)."""
    if hasattr(data, "graph") and hasattr(data, "train"):  # KGData
        ei, et = data.graph("train")
        return ei, et, data.num_entities, data.relation_names
    if getattr(data, "edge_type", None) is not None:  # GraphData of a relational graph
        return data.edge_index, data.edge_type, data.num_nodes, getattr(data, "relations", None)
    raise ValueError(f"{getattr(data, 'name', 'this dataset')} has no relation types: sorts "
                     "need a knowledge graph or a relational (R-GCN) dataset")

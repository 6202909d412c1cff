"""Knowledge graphs: filtered link-prediction ranking, decoders, models and sort mining.

``evaluate`` ranks a scorer exactly as ``CONTRACT.md`` defines it; ``DistMult`` / ``ComplEx``
score triples; ``LinkPredictor`` + ``train_link`` train them (1-vs-all or negative sampling,
optionally through R-GCN layers over random-walk sorts); ``mine_sorts`` lists the relation paths a
training graph holds, by name.
"""

from ..basis.mining import MinedSort, mine_sorts
from .decoders import DECODERS, ComplEx, DistMult
from .evaluate import FilterIndex, check_triples, evaluate
from .graphs import training_graph
from .model import (
    LinkPredictor,
    inverse_graph,
    link_metrics,
    regularizer,
    score_triples,
    train_link,
)

__all__ = ["evaluate", "FilterIndex", "check_triples", "DistMult", "ComplEx", "DECODERS",
           "LinkPredictor", "train_link", "link_metrics", "inverse_graph", "regularizer",
           "mine_sorts", "MinedSort", "training_graph", "score_triples"]

"""Knowledge graphs: filtered link-prediction ranking, decoders, models and sort mining.

``evaluate`` ranks a scorer exactly as ``CONTRACT.md`` defines it; ``DistMult`` / ``ComplEx``
score triples; ``LinkPredictor`` (optionally through R-GCN layers over random-walk sorts) is
trained on the objective ``LinkObjective`` / ``link_loss`` (1-vs-all or negative sampling) by
the training loop (``structconv.training.train_link``, or a ``[model.link]`` config);
``mine_sorts`` lists the relation paths a training
graph holds, by name.
"""

from ..basis.mining import MinedSort, mine_sorts
from .decoders import DECODERS, ComplEx, DistMult
from .evaluate import FilterIndex, check_triples, evaluate
from .graphs import training_graph
from .model import LinkPredictor, corrupt_triples, inverse_graph, link_metrics, score_triples
from .objective import LinkObjective, link_loss, regularizer, training_queries

__all__ = ["evaluate", "FilterIndex", "check_triples", "DistMult", "ComplEx", "DECODERS",
           "LinkPredictor", "link_metrics", "inverse_graph", "regularizer",
           "mine_sorts", "MinedSort", "training_graph", "score_triples", "corrupt_triples",
           "LinkObjective", "link_loss", "training_queries"]

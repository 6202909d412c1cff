"""Models built from structconv layers: declared models of configs and ready-made graph models.

``build_model(cfg, data)`` turns a validated config (``structconv.config``) into a model
(``declared.StructNet`` of ``[[model.layers]]``, ``sc.nn.TransformerLM`` of ``[model.lm]``, a
sequence-to-sequence model of ``[model.seq2seq]`` (``models.seq2seq``) or
``sc.kg.LinkPredictor`` of ``[model.link]``) and ``memory_estimate`` / ``check_memory`` say what
it needs to train; ``models.graph`` holds the classic GCN, ChebNet, SGC, GAT and R-GCN.
"""

from .build import (
    build_link,
    build_lm,
    build_model,
    build_seq2seq_model,
    check_memory,
    data_info,
    memory_estimate,
    optimizer_copies,
)
from .declared import StructNet

__all__ = ["build_model", "build_lm", "build_link", "build_seq2seq_model", "data_info",
           "memory_estimate", "check_memory", "optimizer_copies", "StructNet"]

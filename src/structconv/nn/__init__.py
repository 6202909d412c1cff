"""Layers (``nn.Module``s) built on ``sc.convolve``, and converters from torch.nn and PyG."""

from .attention import (
                        MixedAttention,
                        MultiheadAttention,
                        TransformerDecoderLayer,
                        TransformerEncoderLayer,
)
from .canon import Canon
from .convert import from_pyg, from_torch, register_pyg, register_torch, to_torch
from .dropout import SparseDropout, sparse_dropout
from .gin import GINConv, GINEConv, gin_conv, gine_conv
from .graph import ChebConv, GCNConv, RGCNConv, SGConv, TAGConv
from .graph_attention import (
                        GATConv,
                        GATv2Conv,
                        TransformerConv,
                        gat_conv,
                        gatv2_conv,
                        transformer_conv,
)
from .grid import GridAvgPool, GridConv
from .han import HANConv
from .hetero import HeteroConv
from .hgt import HGTConv
from .layers import Convolution
from .lm import CausalSelfAttention, TransformerLM
from .pervasive import AttentionPooling, PervasiveAttention, SourcePooling
from .pool import (
                        AttentionalAggregation,
                        NodeGate,
                        global_add_pool,
                        global_max_pool,
                        global_mean_pool,
)
from .pyg import pyg_compatible, pyg_state_dict
from .sage import SAGEConv
from .seq2seq import CrossAttention, SelfAttention, Seq2Seq
from .typed import TypedGraphConv, TypedModel, to_hetero

__all__ = ["Convolution", "from_torch", "from_pyg", "to_torch", "register_torch", "register_pyg",
           "GCNConv", "ChebConv", "TAGConv", "SGConv", "RGCNConv",
           "MultiheadAttention", "GATConv", "GATv2Conv", "TransformerConv",
           "TransformerEncoderLayer", "TransformerDecoderLayer",
           "MixedAttention", "GridConv", "GridAvgPool", "CausalSelfAttention", "TransformerLM",
           "SparseDropout", "sparse_dropout", "Canon",
           "Seq2Seq", "SelfAttention", "CrossAttention",
           "PervasiveAttention", "AttentionPooling", "SourcePooling",
           "GINConv", "GINEConv", "gin_conv", "gine_conv", "global_add_pool", "global_mean_pool",
           "global_max_pool", "AttentionalAggregation", "NodeGate", "SAGEConv",
           "HeteroConv", "TypedGraphConv", "TypedModel", "to_hetero", "HGTConv", "HANConv",
           "pyg_compatible", "pyg_state_dict",
           "gat_conv", "gatv2_conv", "transformer_conv"]

"""Declared models: the modules a config's ``[[model.layers]]`` describe, and ``StructNet``.

A layer with a fixed basis is a ``sc.nn.Convolution`` (bias fused into the route's kernel); a
layer whose basis is computed from content is an ``AttentionConv`` (``attention``, optionally
stacked with fixed parts such as shift heads) or a ``GraphAttentionConv`` (``graph_attention``:
GAT's, GATv2's or TransformerConv's mechanism, with edge features); ``linear`` and ``mlp``
layers act on each entry alone. A ``Block`` adds dropout, activation, pooling, residual and
norm around one of them.

One stack serves full-batch and sampled training: ``StructNet.forward(x, structures,
node_ids)`` takes, for a sampled mini-batch, each graph layer's restriction (a restricted basis,
or the edge ``Block`` of a graph-attention layer) in place of the full data's, and the input
nodes' ids (featureless inputs read their rows of theta); without them it runs on the data the
model was built for.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import attention as att
from .. import basis as B
from .. import params as P
from ..config import ConfigError, is_content
from ..engine import convolve
from ..nn.blocks import FeedForward, PreNormBlock, former_keys
from ..nn.dropout import sparse_dropout
from ..nn.graph_attention import gat_conv, gated_root, gatv2_conv, transformer_conv
from ..nn.layers import Convolution
from ..sampling import Block as SampledBlock

__all__ = ["ACTIVATIONS", "StructNet", "Block", "AttentionConv", "GraphAttentionConv", "MLP",
           "Pool", "declared_conv"]

#: the activations a declared layer may name
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "elu": F.elu, "tanh": torch.tanh,
               "sigmoid": torch.sigmoid, "none": None, "leaky_relu": F.leaky_relu}


def _need(cond: bool, msg: str):
    if not cond:
        raise ConfigError(msg)


def _zero(bias: Tensor | None) -> None:
    if bias is not None:
        with torch.no_grad():
            bias.zero_()


def declared_conv(basis: B.Basis, Pin: int, Q: int, layer: dict) -> Convolution:
    """A fixed-basis layer: ``sc.nn.Convolution`` with the layer's parameter form, route and a
    zero-initialised bias."""
    conv = Convolution(basis, Pin, Q, param=P.build(layer, basis.K, Pin, Q),
                       bias=layer.get("bias", True), route=layer.get("route", "auto"))
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)
    return conv


class AttentionConv(nn.Module):
    """Content bases from ``sc.attention``, optionally stacked with fixed bases (shift heads).

    ``attention``: A_k = softmax over inputs of the scaled dot product (``DotProduct``, masked
    causally when ``causal``), applied by ``DotProductAttention``. y = Σ_k A_kᵀ x Θ_k with one
    theta over all K = heads + fixed; x (B, M, P) -> (B, N, Q). (``graph_attention`` layers are
    ``GraphAttentionConv``s.)
    """

    def __init__(self, spec: dict, ctx: B.Structure, Pin: int, Q: int, layer: dict,
                 where: str):
        super().__init__()
        parts = [B.with_defaults(p) for p in (spec["parts"] if spec["kind"] == "stack"
                                              else [spec])]
        content = [p for p in parts if is_content(p)]
        fixed = [p for p in parts if not is_content(p)]
        _need(len(content) == 1, f"{where}: use one attention part (with heads = H) per layer")
        a = content[0]
        _need(a["kind"] != "graph_attention", f"{where}: graph_attention cannot be stacked")
        self.heads = H = int(a["heads"])
        _need(H >= 1, f"{where}: heads must be >= 1, got {H}")
        self.fixed = B.Stack([B.build(p, ctx, f"{where}.basis") for p in fixed]) if fixed \
            else None
        K = H + (self.fixed.K if self.fixed is not None else 0)
        self.dropout = float(a["dropout"])
        self.causal = bool(a["causal"])
        d = int(a["dim"] or max(1, Pin // H))
        self.scores = att.DotProduct(H, Pin, Pin, d)
        self.param = P.build(layer, K, Pin, Q)
        self.bias = nn.Parameter(torch.zeros(Q)) if layer.get("bias", True) else None

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does: the scores' and theta's own inits,
        a zero bias."""
        P.reset_children(self)
        _zero(self.bias)

    def content_basis(self, x: Tensor):
        """The attention part of the basis for bundle x (B, M, P): a batched sc.attention
        basis (SDPA's)."""
        p = self.dropout if self.training else 0.0
        q, k = self.scores.project(x, x)
        return att.DotProductAttention(q, k, causal=self.causal, dropout_p=p)

    def forward(self, x: Tensor, structure=None) -> Tensor:
        theta = self.param()
        H = self.heads
        y = convolve(x, self.content_basis(x), theta[:H])
        if self.fixed is not None:
            y = y + convolve(x, self.fixed, theta[H:])
        return y if self.bias is None else y + self.bias


def _rows(w: Tensor, rows: Tensor | None, dim: int = 0) -> Tensor:
    """x·W for one-hot inputs: W's rows along ``dim`` (P), those of the inputs ``rows``."""
    return w if rows is None else w.index_select(dim, rows.to(w.device))


class GraphAttentionConv(nn.Module):
    """A declared ``graph_attention`` layer: y = Σ_k A_kᵀ x Θ_k (+ bias), the weights A_k of
    the graph's edges computed by ``sc.nn``'s ``gat_conv``, ``gatv2_conv`` or
    ``transformer_conv`` (the functions its GATConv, GATv2Conv, TransformerConv call) on h = xΘ:

    * GAT (default): Softmax(LeakyReLU(GATScores(h) (+ EdgeTerm(e)))) on h = xΘ_k, the edge
      term w_k·e_mn (``sc.nn.GATConv``'s, PyG's att_edge·lin_edge folded into w);
    * ``v2``: Softmax(GATv2Scores(h, h')) with targets h' = xΘ'_k (Θ' = Θ with
      ``share_weights``) and edge features inside the nonlinearity (``sc.nn.GATv2Conv``);
    * ``transformer``: Softmax(HeadDot(k, q) (+ EdgeDot(ê))) with keys k = x W_k, queries
      q = x W_q, edge keys ê = W_e e, messages h_m + ê_mn (``sc.nn.TransformerConv``), then the
      root term x_n W_r (``root_weight``), gated by beta (``beta``) as PyG's.

    Heads add up (the paper's sum: one theta (K, P, Q) for all heads, so ``param`` forms
    apply). Edge features e (E, edge_dim) are the data's ``edge_attr``, or its relation types
    one-hot (edge_dim = R) or as a learned embedding of edge_dim per relation (``relations``);
    self loops get theirs from ``fill_value`` (``sc.attention.add_self_loops``). x (B, M, P) ->
    (B, N, Q); ``featureless`` one-hot inputs read the weights' rows. On a sampled ``Block``
    the edges' features are gathered by ``Block.edge_ids``.
    """

    def __init__(self, spec: dict, ctx: B.Structure, Pin: int, Q: int, layer: dict,
                 where: str):
        super().__init__()
        a = B.with_defaults(spec)
        _need(ctx.edge_index is not None, f"{where}: graph_attention needs a graph dataset")
        self.heads = H = int(a["heads"])
        _need(H >= 1, f"{where}: heads must be >= 1, got {H}")
        self.dropout, self.slope = float(a["dropout"]), float(a["negative_slope"])
        self.mode = "transformer" if a["transformer"] else "v2" if a["v2"] else "gat"
        loops = a["add_self_loops"]
        # TransformerConv adds no loops (its root weight is the node's own term)
        self.add_self_loops = self.mode != "transformer" if loops is None else bool(loops)
        self.fill_value = a["fill_value"]
        self.num_nodes = ctx.num_nodes
        self.register_buffer("edge_index", ctx.edge_index.long(), persistent=False)
        D = self._edge_source(spec, a, ctx, f"{where}.basis")
        bias = layer.get("bias", True)
        self.param = P.build(layer, H, Pin, Q)
        self.bias = nn.Parameter(torch.zeros(Q)) if bias else None
        if self.mode == "gat":
            self.scores = att.GATScores(H, Q)
            self.edge_term = att.EdgeTerm(H, D) if D else None
        elif self.mode == "v2":
            self.target = None if a["share_weights"] else P.build(layer, H, Pin, Q)
            self.scores = att.GATv2Scores(H, Q, edge_dim=D, negative_slope=self.slope)
        else:
            self.query = nn.Linear(Pin, H * Q, bias=bias)
            self.key = nn.Linear(Pin, H * Q, bias=bias)
            self.lin_edge = nn.Linear(D, H * Q, bias=False) if D else None
            root = bool(a["root_weight"])
            self.skip = nn.Linear(Pin, Q, bias=bias) if root else None
            self.beta = nn.Linear(3 * Q, 1, bias=False) if root and a["beta"] else None

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does, in its order (relation embeddings,
        theta, the mechanism's weights: each one's own init), and a zero bias."""
        P.reset_children(self)
        _zero(self.bias)

    def _edge_source(self, spec: dict, a: dict, ctx: B.Structure, where: str) -> int | None:
        """Register the per-edge table the features come from (the data's ``edge_attr``, or
        its edge types); returns edge_dim (None: no edge features)."""
        self.relations, self.embed = None, None
        self.register_buffer("edge_table", None, persistent=False)
        D = a["edge_dim"]
        if D is None:
            return None
        if ctx.edge_attr is not None:
            _need("relations" not in spec, f"{where}: relations applies to edge types, but the "
                                           "data has edge features (edge_attr): drop it")
            e = ctx.edge_attr
            e = e.unsqueeze(1) if e.dim() == 1 else e
            _need(D in ("auto", e.shape[1]), f"{where}: edge_dim = {D} but the data's edge "
                                             f"features are {tuple(e.shape)}: use edge_dim = "
                                             f"{e.shape[1]} (or \"auto\")")
            self.edge_table = e
            return int(e.shape[1])
        _need(ctx.edge_type is not None, f"{where}: edge_dim = {D!r} reads edge features, but "
                                         "the data has none (no edge_attr, no edge types)")
        R = int(ctx.num_relations or int(ctx.edge_type.max()) + 1)
        self.edge_table, self.relations, self.num_relations = ctx.edge_type.long(), \
            a["relations"], R
        if self.relations == "onehot":
            _need(D in ("auto", R), f"{where}: one-hot relation features have edge_dim = R = "
                                    f"{R}, got edge_dim = {D}")
            return R
        _need(isinstance(D, int), f"{where}: relations = \"embedding\" needs edge_dim = the "
                                  f"width of each relation's learned vector, got {D!r}")
        self.embed = nn.Embedding(R, D)
        return D

    def _features(self, ids: Tensor | None, dtype) -> Tensor | None:
        """The features (E, edge_dim) of the graph's edges, or of the edges ``ids``."""
        t = self.edge_table
        if t is None:
            return None
        t = t if ids is None else t[ids.to(t.device)]
        if self.relations == "onehot":
            return F.one_hot(t, self.num_relations).to(dtype)
        return (self.embed(t) if self.relations == "embedding" else t).to(dtype)

    def _graph(self, structure, dtype, device):
        """(edges (2, E') with their self loops, targets N, edge features (E', D) or None,
        their ``GraphStructure`` or None): the data's graph, or a sampled block's."""
        if structure is None:
            return self._full_graph(dtype, device)
        # a sampled block: its N targets are the first of its sources
        ei, N = structure.edge_index.to(device).long(), structure.num_dst
        e = self._features(structure.edge_ids, dtype)
        if self.add_self_loops:
            ei, e = att.add_self_loops(ei, N, e, self.fill_value)
        return ei, N, e, None

    def _full_graph(self, dtype, device):
        """The data's graph with its loops, their features and the sparse layout, built once
        per dtype and device (learned relation embeddings: the features of this call)."""
        n, key = self.num_nodes, (dtype, device)
        c = self.__dict__.get("_full")
        if c is None or c[0] != key:
            ei = self.edge_index.to(device)
            e = None if self.embed is not None else self._features(None, dtype)
            if self.add_self_loops:
                ei, e = att.add_self_loops(ei, n, e, self.fill_value)
            e = None if e is None else e.to(device)
            self._full = c = (key, ei, e, att.GraphStructure(ei, n, n, self.heads))
        _, ei, e, st = c
        if self.embed is not None:
            e = self._features(None, dtype)
            if self.add_self_loops:
                e = att.add_self_loops(self.edge_index, n, e, self.fill_value)[1]
        return ei, n, e, st

    def _project(self, theta: Tensor, x: Tensor | None, rows: Tensor | None) -> Tensor:
        """h_k = xΘ_k (M, K, Q) for one item x (M, P), or Θ's rows for one-hot inputs."""
        if x is None:
            return _rows(theta, rows, 1).permute(1, 0, 2)
        return torch.einsum("mp,kpq->mkq", x, theta)

    def _one(self, x: Tensor | None, rows: Tensor | None, structure) -> Tensor:
        """One item: x (M, P), or None for one-hot inputs (``rows`` their ids) -> (N, Q), by
        ``sc.nn``'s ``gat_conv``, ``gatv2_conv`` or ``transformer_conv`` with heads summed."""
        theta = self.param()
        ref = theta if x is None else x
        ei, N, e, st = self._graph(structure, ref.dtype, ref.device)
        h = self._project(theta, x, rows)
        kw = dict(dropout=self.dropout if self.training else 0.0, structure=st, sum_heads=True)
        if self.mode == "gat":
            scores = self.scores + self.edge_term if e is not None else self.scores
            y = gat_conv(h, h[:N], ei, scores, edge_attr=e, negative_slope=self.slope, **kw)[0]
        elif self.mode == "v2":
            t = h if self.target is None else self._project(self.target(), x, rows)
            y = gatv2_conv(h, t[:N], ei, self.scores, edge_attr=e, **kw)[0]
        else:
            H, Q = self.heads, self.param.Q
            k = self._linear(self.key, x, rows).view(-1, H, Q)
            q = self._linear(self.query, x, rows)[:N].view(-1, H, Q)
            # the edge keys ê = W_e e, projected once: in the scores q·(k + ê) and the messages
            ek = None if e is None else self.lin_edge(e).view(-1, H, Q)
            y = transformer_conv(q, k, h, ei, edge_keys=ek, **kw)[0]
        if self.bias is not None:
            y = y + self.bias
        if self.mode == "transformer" and self.skip is not None:
            # the root term r = x_n W_r added to y, or gated: β r + (1 − β) y (PyG's beta)
            y = gated_root(y, self._linear(self.skip, x, rows)[:N], self.beta)
        return y

    def _linear(self, lin: nn.Linear, x: Tensor | None, rows: Tensor | None) -> Tensor:
        if x is not None:
            return lin(x)
        y = _rows(lin.weight.t(), rows)
        return y if lin.bias is None else y + lin.bias

    def forward(self, x: Tensor, structure=None) -> Tensor:
        """x (B, M, P) -> (B, N, Q) (each batch item on the same graph)."""
        return torch.stack([self._one(xb, None, structure) for xb in x])

    def featureless(self, structure=None, rows: Tensor | None = None) -> Tensor:
        """The layer on one-hot inputs x = I without forming I: (N, Q); ``rows`` (M,) the ids
        of a sampled block's inputs."""
        return self._one(None, rows, structure)


class MLP(FeedForward):
    """A declared ``mlp`` layer: the Transformer's feed-forward (``sc.nn.blocks.FeedForward``,
    two pointwise maps of the channels) with its activation named (``ACTIVATIONS``);
    (B, M, C) -> (B, M, C). Checkpoints keep the maps' declared names, ``inner`` and
    ``outer`` (``former_keys``)."""

    def __init__(self, channels: int, hidden: int, activation: str, bias: bool = True):
        super().__init__(channels, hidden, ACTIVATIONS[activation], bias=bias)
        former_keys(self, inner="fc", outer="proj")


def _pool_sizes(spec: dict, nd: int, where: str):
    """(kernel_size, stride, padding) of a pool table, checked (torch's rules)."""
    ks, st, pad = spec.get("kernel_size", 2), spec.get("stride"), spec.get("padding", 0)
    for name, v, low in (("kernel_size", ks, 1), ("stride", st, 1), ("padding", pad, 0)):
        ok = lambda u: isinstance(u, int) and not isinstance(u, bool) and u >= low  # noqa
        _need(v is None and name == "stride" or ok(v) or
              isinstance(v, list) and len(v) == nd and all(map(ok, v)),
              f"{where}: {name} must be an int >= {low} or a list of {nd}, got {v!r}")
    per_dim = lambda v: list(v) if isinstance(v, list) else [v] * nd  # noqa
    # torch's rule for both pools: a window is never more than half padding
    _need(all(p <= k // 2 for p, k in zip(per_dim(pad), per_dim(ks))),
          f"{where}: padding must be at most half the kernel_size, got padding {pad!r} "
          f"with kernel_size {ks!r}")
    unknown = set(spec) - {"kind", "kernel_size", "stride", "padding"}
    _need(not unknown, f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: kind, "
                       "kernel_size, stride, padding)")
    return ks, st, pad


class Pool(nn.Module):
    """Grid pooling of a (B, H*W, C) bundle: ``avg`` is the K = 1 AvgPool basis, ``max`` torch's."""

    def __init__(self, spec: dict, in_shape: tuple, where: str):
        super().__init__()
        kind = spec.get("kind", "avg")
        _need(kind in ("avg", "max"), f"{where}: pool kind must be avg or max, got {kind!r}")
        self.kind, self.in_shape = kind, tuple(in_shape)
        ks, st, pad = _pool_sizes(spec, len(self.in_shape), where)
        if kind == "avg":
            self.basis = B.AvgPool(self.in_shape, ks, stride=st, padding=pad)
            self.out_shape = tuple(self.basis.out_shape)
            return
        self.args = (ks, st if st is not None else ks, pad)
        self.fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[len(self.in_shape) - 1]
        try:
            probe = self.fn(torch.zeros(1, 1, *self.in_shape, device="cpu"), *self.args)
        except RuntimeError as e:  # torch's own check of the sizes, named by this layer
            raise ConfigError(f"{where}: max pooling over {self.in_shape}: {e}") from None
        self.out_shape = tuple(probe.shape[2:])

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "avg":
            return self.basis.cast_like(x).propagate(x)[:, :, 0]
        Bn, M, C = x.shape
        g = x.transpose(1, 2).reshape(Bn, C, *self.in_shape)
        return self.fn(g, *self.args).reshape(Bn, C, -1).transpose(1, 2)


def _inputs(structure) -> int:
    """The number M of input entries of a restricted basis or a sampled edge ``Block``."""
    return structure.num_src if isinstance(structure, SampledBlock) else structure.M


def _unchanged(x: Tensor) -> Tensor:
    return x


class Block(PreNormBlock):
    """One declared layer: dropout on the input, the convolution, activation, pool, residual.

    ``forward(x, structure=None, node_ids=None)``: x (B, M, P) -> (B, N, Q). ``structure``
    replaces the data's structure for a sampled mini-batch (see the module doc), whose N
    targets are the first of the M inputs; ``node_ids`` (M,) the inputs' global ids.
    ``type = "mlp"`` layers take their activation inside (between the two maps) and are
    residual unless ``residual = false``; ``linear`` and ``mlp`` layers are ``pointwise``.
    A ``PreNormBlock`` of one branch: x <- x + act(conv(dropout(norm(x)))) (the skip from the
    targets' rows of x; without ``residual`` the branch alone), then the pool.
    """

    def __init__(self, conv: nn.Module, layer: dict, Pin: int, pool: Pool | None = None,
                 featureless: bool = False):
        kind = layer.get("type", "conv")
        # the dropout is on the branch's input (inside it), none on its output
        super().__init__(0.0, residual=bool(layer.get("residual", kind == "mlp")))
        self.conv = conv
        self.pointwise = kind in ("linear", "mlp")
        self.featureless = bool(featureless)
        self.act = None if kind == "mlp" else ACTIVATIONS[layer.get("activation", "none")]
        self.dropout = float(layer.get("dropout", 0.0))
        self.norm = nn.LayerNorm(Pin) if layer.get("norm", "none") == "layer" else None
        self.pool = pool

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does: the layer's own init (a fixed-basis
        layer's bias at zero, as ``declared_conv`` makes it) and the norm's."""
        P.reset_children(self)
        if isinstance(self.conv, Convolution):
            _zero(self.conv.bias)

    def branches(self, structure=None, node_ids: Tensor | None = None):
        """The one (norm, sublayer) pair: the norm where the layer has one."""
        return ((self.norm if self.norm is not None else _unchanged,
                 lambda h: self._sublayer(h, structure, node_ids)),)

    def _sublayer(self, h: Tensor, structure, node_ids: Tensor | None) -> Tensor:
        """act(conv(dropout(h))) of the normed input."""
        h = sparse_dropout(h, self.dropout, self.training)
        if self.pointwise:
            h = self.conv(h)
        elif self.featureless:
            # one-hot input: x·Θ_k is Θ_k's rows (of the mini-batch's input nodes)
            rows = None if node_ids is None else node_ids[:_inputs(structure)]
            h = self.conv.featureless(structure, rows).expand(h.shape[0], -1, -1)
        else:
            h = self.conv(h, structure)
        return self.act(h) if self.act is not None else h

    def skip(self, x: Tensor, h: Tensor) -> Tensor:
        return x[:, :h.shape[1]]  # a sampled block's targets are its first inputs

    def forward(self, x: Tensor, structure=None, node_ids: Tensor | None = None) -> Tensor:
        h = super().forward(x, structure, node_ids)
        return self.pool(h) if self.pool is not None else h


def _out_grid(basis, grid):
    """The grid of a basis's output entries: its own ``out_shape``, the input's grid when the
    basis keeps the number of entries, else None (no grid: pooling and flatten need one)."""
    if grid is None:
        return None
    if basis.out_shape is not None:
        return tuple(basis.out_shape)
    return tuple(grid) if basis.N == math.prod(grid) else None


class StructNet(nn.Module):
    """A stack of declared layers over a bundle; input/readout set by the data's task.

    image: (B, C, H, W) -> (B, classes); node: x (N, F) -> (N, classes); text: ids (B, T) ->
    (B, T, classes). ``info`` is ``models.build.data_info``'s summary of the dataset.
    """

    def __init__(self, cfg: dict, info: dict):
        super().__init__()
        m = cfg["model"]
        self.task, self.classes = info["task"], info["num_classes"]
        ctx = B.Structure(grid=info.get("grid"), edge_index=info.get("edge_index"),
                          num_nodes=info.get("num_nodes"), edge_type=info.get("edge_type"),
                          num_relations=info.get("num_relations"),
                          relations=info.get("relations"), edge_attr=info.get("edge_attr"))
        channels = info["channels"]
        self.embed = None
        if self.task == "text":
            channels = int(m["embedding"]) or 64
            self.embed = nn.Embedding(info["vocab"], channels)
        featureless = self.task == "node" and info.get("featureless", False)
        blocks = []
        #: activation scalars one sample keeps for the backward pass, about (memory_estimate)
        self.activation_elements = 0
        for i, layer in enumerate(m["layers"]):
            first = featureless and i == 0
            conv, pool, Q, ctx = self._layer(layer, ctx, channels, info, f"model.layers.{i}",
                                             first)
            grid = pool.in_shape if pool is not None else ctx.grid  # the conv's output grid
            entries = math.prod(grid) if grid else (info.get("num_nodes") or 1)
            # the input's dropout copy (none for the identity input of featureless nodes), the
            # conv's output and the activation's
            self.activation_elements += entries * ((0 if first else channels) + 2 * Q)
            if layer.get("residual"):
                _need(Q == channels, f"model.layers.{i}: residual needs channels == input "
                                     f"channels ({channels}), got {Q}")
            blocks.append(Block(conv, layer, channels, pool, featureless=first))
            channels = Q
        self.blocks = nn.ModuleList(blocks)
        self._set_readout(m, channels, ctx.grid)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (the embedding, each layer's own
        init, the classifier)."""
        P.reset_children(self)

    def first_layer_parameters(self) -> list:
        """The first declared layer's parameters (``train.decay = "first"``)."""
        return list(self.blocks[0].parameters())

    def _layer(self, layer: dict, ctx: B.Structure, channels: int, info: dict, where: str,
               featureless: bool):
        """(conv, pool, output channels, the structure after the layer) of one layer table."""
        ch = layer.get("channels", "same")
        Q = self.classes if ch == "classes" else channels if ch == "same" else int(ch)
        if layer.get("type", "conv") == "linear":
            return nn.Linear(channels, Q, bias=layer.get("bias", True)), None, Q, ctx
        if layer.get("type") == "mlp":
            return MLP(channels, int(layer.get("hidden", 0)) or 4 * channels,
                       layer.get("activation", "gelu"), layer.get("bias", True)), \
                None, channels, ctx
        spec = B.as_spec(layer["basis"])
        if spec.get("kind") == "graph_attention":
            # featureless nodes: the input is the identity, the weights' P runs over the nodes
            conv = GraphAttentionConv(spec, ctx, info["num_nodes"] if featureless else channels,
                                      Q, layer, where)
        elif any(is_content(p) for p in spec.get("parts", [spec])):
            _need(not featureless, f"{where}: attention cannot take featureless input")
            conv = AttentionConv(spec, ctx, channels, Q, layer, where)
        else:
            basis = B.build(spec, ctx, f"{where}.basis")
            # featureless nodes: the input is the identity, theta's P runs over the nodes
            conv = declared_conv(basis, info["num_nodes"] if featureless else channels, Q,
                                 layer)
            ctx = replace(ctx, grid=_out_grid(basis, ctx.grid))
        pool = None
        if "pool" in layer:
            _need(ctx.grid is not None, f"{where}: pool needs grid-shaped input")
            spec_p = layer["pool"]
            pool = Pool({"kind": spec_p} if isinstance(spec_p, str) else dict(spec_p),
                        ctx.grid, f"{where}.pool")
            ctx = replace(ctx, grid=pool.out_shape)
        return conv, pool, Q, ctx

    def _set_readout(self, m: dict, channels: int, grid) -> None:
        """The readout over entries and the classifier after it, checked against the task."""
        readout = m["readout"]
        if readout == "auto":
            readout = "flatten" if self.task == "image" else "none"
        _need(not (self.task == "image" and readout == "none"),
              "model.readout=none leaves one output per grid cell, but an image task needs one "
              "per image: use flatten, mean, sum or max")
        _need(not (self.task == "node" and readout != "none"),
              f"model.readout={readout} pools the graph's nodes into one output, but a node "
              "task needs one per node: use none (or auto)")
        self.readout = readout
        feat = channels * (math.prod(grid) if readout == "flatten" and grid else 1)
        clf = m["classifier"]
        if clf == "auto":
            clf = channels != self.classes or readout == "flatten"
        self.classifier = nn.Linear(feat, self.classes) if clf else None
        self.out_channels = channels

    def forward(self, x: Tensor, structures=None, node_ids: Tensor | None = None) -> Tensor:
        """Logits; ``structures`` (one per graph layer, input side first) and ``node_ids`` run
        the node model on a sampled mini-batch: x (M, F) on its input nodes (or (M, 0) for
        featureless nodes) -> (S, classes) on its S seeds."""
        if self.task == "image":
            Bn, C = x.shape[:2]
            x = x.reshape(Bn, C, -1).transpose(1, 2)  # row-major grid flattening, (B, H*W, C)
        elif self.task == "node":
            x = x.unsqueeze(0)
        else:
            x = self.embed(x)
        items = iter(structures) if structures is not None else None
        for blk in self.blocks:
            item = next(items) if items is not None and not blk.pointwise else None
            x = blk(x, item, node_ids)
        if self.readout == "flatten":
            x = x.reshape(x.shape[0], -1)
        elif self.readout in ("mean", "sum", "max"):
            x = getattr(x, self.readout)(1)
            x = x.values if self.readout == "max" else x
        if self.classifier is not None:
            x = self.classifier(x)
        return x[0] if self.task == "node" else x

"""The model a validated config describes, for a dataset, and the memory it needs to train.

``build_model`` picks the model kind from the config (``[model.link]``: ``sc.kg.LinkPredictor``;
``[model.lm]``: ``sc.nn.TransformerLM``; ``[model.seq2seq]``: ``sc.nn.Seq2Seq`` or
``sc.nn.PervasiveAttention``; ``[model.gin]``: ``sc.models.GIN``; ``[model.forecast]``:
``models.forecast.Forecaster``; ``[model.routing]``: ``models.routing.AttentionModel``;
``[model.hetero]``: a ``models.hetero.TypedClassifier``; ``[model.twin]``: the Fashion-MNIST
study's torch CNN or a structconv twin of it (``models.fashion.twin_cnn``); ``[model.graph]``:
a paper's two-layer node classifier; else a ``StructNet`` of declared layers).
``memory_estimate`` reads the built model's parameter count and per-sample activation count,
or computes both from the config alone for the link predictor and the sequence models (whose
sizes a config can make absurd: they are refused before anything is built), so that a run
that cannot fit is refused before it starts (``check_memory``), without a second build.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import basis as B
from .._checks import available_memory, gib
from ..config import (
    LM_KEYS,
    ConfigError,
    forecast_spec,
    gin_spec,
    graph_layer_hops,
    graph_spec,
    is_forecast,
    is_gin,
    is_graph,
    is_hetero,
    is_link,
    is_routing,
    is_seq2seq,
    is_twin,
    link_spec,
    link_train_spec,
    routing_spec,
    sampler_spec,
    seq2seq_spec,
    twin_spec,
)
from .declared import StructNet
from .seq2seq import build_seq2seq
from .sizes import lm_parameters, seq2seq_parameters

__all__ = ["build_model", "build_gin", "build_graph", "graph_sorts", "graph_feature_dims",
           "build_lm", "build_link", "build_seq2seq_model", "data_info", "link_sorts",
           "optimizer_copies", "estimated_from_config", "memory_estimate", "check_memory",
           "sampled_share", "build_forecast", "build_routing", "lm_shape", "LM_TASKS",
           "build_twin"]


def _need(cond: bool, msg: str):
    if not cond:
        raise ConfigError(msg)


def data_info(data, cfg: dict) -> dict:
    """What a ``StructNet`` needs to know about a dataset (shapes, graph, classes)."""
    info = {"task": data.task, "num_classes": data.num_classes}
    if data.task == "image":
        C, *grid = data.shape
        info.update(channels=C, grid=tuple(grid))
    elif data.task == "node":
        info.update(channels=data.num_features, edge_index=data.edge_index,
                    num_nodes=data.num_nodes, edge_type=data.edge_type,
                    num_relations=data.num_relations, featureless=data.x is None,
                    relations=tuple(data.relations) if data.relations else None,
                    edge_attr=data.edge_attr)
    else:
        info.update(channels=0, grid=(cfg["data"]["seq_len"],), vocab=len(data.vocab))
    return info


#: the datasets a ``[model.lm]`` model reads: text, and the generated k-hop task
LM_TASKS = ("text", "depo")


def lm_shape(cfg: dict, data) -> tuple[int, int]:
    """(vocabulary size, sequence length) of a ``[model.lm]`` model on ``data``: a text
    dataset's windows are ``data.seq_len`` tokens, the k-hop task's sequences its own length."""
    _need(data.task in LM_TASKS, f"model.lm builds a language model: it needs a text dataset "
                                 f"(or the depo k-hop task), got a {data.task} task "
                                 f"({cfg['data']['name']})")
    return len(data.vocab), data.length if data.task == "depo" else cfg["data"]["seq_len"]


def build_lm(cfg: dict, data) -> nn.Module:
    """The ``sc.nn.TransformerLM`` of a ``[model.lm]`` table, for a text dataset or the k-hop
    task; a learned position table covers ``context`` (default: the sequence length,
    ``lm_shape``)."""
    from ..nn.lm import TransformerLM

    vocab, length = lm_shape(cfg, data)
    s = {**LM_KEYS, **cfg["model"]["lm"]}
    return TransformerLM(vocab, s["width"], s["layers"], s["heads"], s["position"],
                         s["shifts"], s["ffn"] or None, float(s["dropout"]),
                         context=s["context"] or length, bias=s["bias"],
                         tie_weights=s["tie_weights"], canon=s["canon"],
                         canon_kernel=s["canon_kernel"])


def build_seq2seq_model(cfg: dict, data) -> nn.Module:
    """The sequence-to-sequence model of a ``[model.seq2seq]`` table, for a
    grapheme-to-phoneme dataset's vocabularies."""
    _need(data.task == "g2p", f"model.seq2seq maps a sequence to a sequence: it needs a "
                              f"grapheme-to-phoneme dataset (cmudict), got a {data.task} task "
                              f"({cfg['data']['name']})")
    return build_seq2seq(seq2seq_spec(cfg), data)


def link_sorts(spec: dict, data) -> list | None:
    """The encoder's sorts over the 2R edge types of the training graph (None: one per
    relation); "mined" mines the training graph only, so no valid/test edge shapes them."""
    return _link_sorts(spec, data)[0]


def _link_sorts(spec: dict, data) -> tuple[list | None, list]:
    """(``link_sorts``, the ``MinedSort``s behind them: [] unless "mined")."""
    if spec["sorts"] == "single":
        return None, []
    if spec["sorts"] == "mined":
        ei, et = data.graph("train")
        return B.single_and_mined_sorts(ei, et, data.num_entities, 2 * data.num_relations,
                                        relations=data.relation_names,
                                        max_length=spec["max_length"], top=spec["top"],
                                        backtrack=spec["backtrack"])
    return [tuple(x) if isinstance(x, list) else x for x in spec["sorts"]], []


def build_link(cfg: dict, data) -> nn.Module:
    """The ``sc.kg.LinkPredictor`` of a ``[model.link]`` table, for a knowledge-graph dataset;
    an encoder runs over the training triples with their inverses."""
    from ..kg import LinkPredictor, inverse_graph

    _need(data.task == "link", f"model.link predicts links: it needs a knowledge-graph dataset, "
                               f"got a {data.task} task ({cfg['data']['name']})")
    s = link_spec(cfg)
    layers = s["encoder_layers"]
    sorts, mined = _link_sorts(s, data) if layers else (None, [])
    model = LinkPredictor(data.num_entities, data.num_relations, s["dim"], s["decoder"],
                          reciprocal=s["reciprocal"], init_std=float(s["init_std"]),
                          encoder_layers=layers,
                          graph=inverse_graph(data.train, data.num_relations) if layers else None,
                          block=s["block"], sorts=sorts, relations=data.relation_names,
                          edge_dropout=float(s["edge_dropout"]),
                          self_dropout=float(s["self_dropout"]), dropout=float(s["dropout"]))
    # the mined paths behind the sorts (their supports), for reports: mined once, here
    model.mined_sorts = mined
    return model


def graph_feature_dims(data) -> tuple[tuple | None, tuple | None]:
    """The sizes of a graph dataset's categorical node and edge columns (long ``x`` /
    ``edge_attr``, e.g. molecules), which a model reads one-hot; None for float features."""

    def dims(t, named):
        if t is None or t.is_floating_point():
            return None
        return tuple(named) if named is not None else \
            tuple(int(v) + 1 for v in t.max(0).values.tolist())

    return (dims(data.x, getattr(data, "feature_dims", None)),
            dims(data.edge_attr, getattr(data, "edge_feature_dims", None)))


def build_gin(cfg: dict, data) -> nn.Module:
    """The ``sc.models.GIN`` of a ``[model.gin]`` table, for a dataset of many graphs (its
    head: one logit per class, or one output per regression target for float labels)."""
    from .gin import GIN

    _need(data.task == "graph", f"model.gin reads batches of graphs: it needs a graph-level "
                                f"dataset (tu-mutag, tu-proteins, tu-nci1, hiv), got a "
                                f"{data.task} task ({cfg['data']['name']})")
    s = gin_spec(cfg)
    xd, ed = graph_feature_dims(data)
    edge_dim = None
    if s["edge_features"]:
        _need(data.edge_attr is not None, f"model.gin.edge_features: dataset "
                                          f"{cfg['data']['name']!r} has no edge features")
        edge_dim = sum(ed) if ed else data.num_edge_features
    y = data.y
    out = data.num_classes if y is None or not y.is_floating_point() else \
        (1 if y.dim() == 1 else int(y.shape[1]))
    return GIN(sum(xd) if xd else data.num_features, s["hidden"], out, s["layers"],
               readout=s["readout"], dropout=float(s["dropout"]), edge_dim=edge_dim,
               train_eps=s["train_eps"], batch_norm=s["batch_norm"])


def build_forecast(cfg: dict, data) -> nn.Module:
    """The ``Forecaster`` of a ``[model.forecast]`` table, for a series dataset (the period
    form's period is the series')."""
    from .forecast import Forecaster

    _need(data.task == "series", f"model.forecast forecasts a series: it needs a series "
                                 f"dataset (co2, elnino, sunspots, elec_equip), got a "
                                 f"{data.task} task ({cfg['data']['name']})")
    s = forecast_spec(cfg)
    return Forecaster(s["context"], s["horizon"], s["form"], width=s["width"], heads=s["heads"],
                      periods=[data.period])


def build_twin(cfg: dict, data) -> nn.Module:
    """The network of a ``[model.twin]`` table, for a one-channel square image dataset."""
    from .fashion import twin_cnn

    C, *grid = getattr(data, "shape", (0,))
    _need(data.task == "image" and C == 1 and len(grid) == 2 and grid[0] == grid[1],
          f"model.twin is a CNN of one-channel square images: it needs an image dataset "
          f"(fashion-mnist, mnist), got a {data.task} task ({cfg['data']['name']})")
    s = twin_spec(cfg)
    return twin_cnn(s["network"], s["channels"], grid[0], data.num_classes)


def build_routing(cfg: dict, data) -> nn.Module:
    """The ``AttentionModel`` of a ``[model.routing]`` table, for a TSP dataset."""
    from .routing import AttentionModel

    _need(data.task == "routing", f"model.routing builds tours: it needs a TSP dataset (tsp), "
                                  f"got a {data.task} task ({cfg['data']['name']})")
    s = routing_spec(cfg)
    return AttentionModel(s["width"], s["heads"], s["layers"], s["ffn"] or 4 * s["width"],
                          float(s["clip"]))


def graph_sorts(spec: dict, data) -> tuple[list | None, list]:
    """(the sorts of a ``[model.graph]`` R-GCN: None for one per relation, the mined paths
    found): with ``sorts = "mined"`` the single relations plus the ``top`` best supported
    relation paths of length 2 of the whole graph (R-GCN's transductive setting)."""
    if spec["sorts"] == "single":
        return None, []
    from ..basis.mining import mine_sorts

    mined = mine_sorts(data.edge_index, data.edge_type, data.num_nodes,
                       num_relations=data.num_relations, relations=data.relations,
                       top=spec["top"], confidence=False, backtrack=spec["backtrack"])
    return [(r,) for r in range(data.num_relations)] + [m.sort for m in mined], mined


def build_graph(cfg: dict, data) -> nn.Module:
    """The two-layer node classifier of a ``[model.graph]`` table for a node dataset (its one
    graph), built as its paper has it; ``forward(x)`` maps the node features to logits."""
    from .graph import GAT, GCN, RGCN, SGC, ChebNet
    from .mixed import HeadsNet
    from .relational_attention import RGAT

    _need(data.task == "node", f"model.graph classifies the nodes of one graph: it needs a "
                               f"node dataset, got a {data.task} task ({cfg['data']['name']})")
    s = graph_spec(cfg)
    kind, ei, N, C = s["kind"], data.edge_index, data.num_nodes, data.num_classes
    if kind in ("rgcn", "rgat"):
        _need(data.edge_type is not None, f"model.graph.kind = {kind!r} needs typed edges: "
                                          f"dataset {cfg['data']['name']!r} has none")
        bases = s["bases"] or None
        if kind == "rgat":
            return RGAT(ei, data.edge_type, N, data.num_relations, s["hidden"], C,
                        heads=s["heads"], num_bases=bases, attention=s["attention"])
        # "auto" and "separable" are the bases' form (ControlledSeparable with H = bases)
        form = s["param"] if s["param"] in ("full", "depthwise") else "full"
        return RGCN(ei, data.edge_type, N, data.num_relations, s["hidden"], C, num_bases=bases,
                    sorts=graph_sorts(s, data)[0], param=form)
    _need(data.x is not None, f"model.graph.kind = {kind!r} reads node features: dataset "
                              f"{cfg['data']['name']!r} has none")
    F_in = data.num_features
    if kind == "heads":
        return HeadsNet(ei, N, F_in, C, s["heads"], s["hops"], s["hidden"], s["dropout"],
                        sparse=s["sparse"])
    if kind == "sgc":
        return SGC(ei, N, F_in, C, K=s["K"])
    if kind == "gat":
        return GAT(ei, N, F_in, s["hidden"], C, heads=s["heads"], out_heads=s["out_heads"],
                   dropout=s["dropout"])
    if kind == "cheb":
        return ChebNet(ei, N, F_in, s["hidden"], C, K=s["K"], dropout=s["dropout"])
    return GCN(ei, N, F_in, s["hidden"], C, dropout=s["dropout"])


def build_model(cfg: dict, data) -> nn.Module:
    """The model described by ``cfg['model']`` for ``data`` (a registry dataset)."""
    try:
        if is_hetero(cfg):
            from .hetero import build_hetero
            return build_hetero(cfg, data).to(getattr(torch, cfg["model"]["dtype"]))
        model = build_forecast(cfg, data) if is_forecast(cfg) else build_routing(cfg, data) \
            if is_routing(cfg) else \
            build_link(cfg, data) if is_link(cfg) else build_gin(cfg, data) if is_gin(cfg) \
            else build_graph(cfg, data) if is_graph(cfg) else \
            build_twin(cfg, data) if is_twin(cfg) else \
            build_seq2seq_model(cfg, data) if is_seq2seq(cfg) else build_lm(cfg, data) \
            if cfg["model"]["lm"] else StructNet(cfg, data_info(data, cfg))
        return model.to(getattr(torch, cfg["model"]["dtype"]))
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"cannot build the model: {e}") from None
    except (MemoryError, RuntimeError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, MemoryError) or "allocate" in msg:
            raise ConfigError(f"cannot build the model: its parameters do not fit in this "
                              f"machine's memory ({msg})") from None
        raise


# -- memory ---------------------------------------------------------------------------------------
def optimizer_copies(train: dict) -> int:
    """Copies of the weights one training step holds: weights and gradients, plus the
    optimizer's state (Adam's two moments, Adagrad's sums, SGD's momentum buffer)."""
    state = {"adam": 2, "adamw": 2, "adagrad": 1}.get(train["optimizer"],
                                                      int(train["momentum"] > 0))
    return 2 + state


def _link_memory(cfg: dict, data) -> dict:
    """``memory_estimate`` of a link predictor, from its sizes (mined sorts counted at ``top``):
    the entity and relation tables and encoder weights, and one batch's activations (a 1-vs-all
    batch's (batch, entities) scores with their softmax and gradient, the encoder's per-entity
    and per-edge vectors)."""
    s, lt = link_spec(cfg), link_train_spec(cfg)
    E, R, dim, L = data.num_entities, data.num_relations, s["dim"], s["encoder_layers"]
    K = 2 * R if s["sorts"] == "single" else 2 * R + s["top"] if s["sorts"] == "mined" \
        else len(s["sorts"])
    n_params = E * dim + (2 * R if s["reciprocal"] else R) * dim + \
        L * (K * dim * s["block"] + dim * dim + dim)
    nbytes = 8 if cfg["model"]["dtype"] == "float64" else 4
    copies = optimizer_copies(cfg["train"])
    bsz = cfg["data"]["batch_size"]
    rows = bsz if lt["mode"] == "1vsall" else bsz * (1 + lt["negatives"])
    per_batch = 6 * rows * dim + (3 * bsz * E if lt["mode"] == "1vsall" else 2 * rows)
    # per layer: the self part, its dropout, the output and its activation, and the messages
    # of the 2T training edges (with inverses)
    encoder = L * (4 * E * dim + 2 * 2 * data.train.shape[0] * dim)
    return {"params": n_params * nbytes * copies, "activations": (per_batch + encoder) * nbytes,
            "n_params": n_params, "batch": bsz, "copies": copies,
            "hint": "reduce model.link.dim or data.batch_size"}


def _lm_activations(cfg: dict, data) -> int:
    """Activation scalars one text sample keeps: per token and layer norms, q/k/v, attention
    output, residuals and the MLP's two maps, each Canon place's output; per layer the
    (heads, T, T) attention weights; then the logits."""
    s = {**LM_KEYS, **cfg["model"]["lm"]}
    T, w = lm_shape(cfg, data)[1], s["width"]
    ffn = s["ffn"] or 4 * w
    canon = {"A": w, "B": 3 * w, "C": w, "D": ffn}
    per_layer = 10 * w + 2 * ffn + s["heads"] * T + sum(canon[c] for c in s["canon"])
    return T * s["layers"] * per_layer + 2 * T * len(data.vocab)


def _seq2seq_activations(cfg: dict, data) -> int:
    """Activation scalars one word pair keeps, about, at the longest word (S letters) and
    pronunciation (T phonemes): a Transformer's per-token maps of each layer (self- and
    cross-attention weights included) and the logits; a pervasive model's S x T grid of
    every layer's channels."""
    s = seq2seq_spec(cfg)
    S, T = data.longest()
    T += 1  # the decoder reads <s> and the targets end with </s>
    if s["kind"] == "pervasive":
        # a dense stack: layer l reads the 2·embed + l·growth channels before it (normalised
        # and activated), makes a bottleneck and its growth
        E, L, G = s["embed"], s["layers"], s["growth"]
        per_cell = 2 * E + L * (2 * (2 * E + L * G // 2) + 2 * (s["bottleneck"] or G) + 2 * G)
        return S * T * per_cell + 2 * T * len(data.phonemes)
    w = s["width"]
    ffn = s["ffn"] or 4 * w
    enc = S * s["layers"] * (10 * w + 2 * ffn + s["heads"] * S)
    dec = T * s["layers"] * (16 * w + 2 * ffn + s["heads"] * (T + S))
    return enc + dec + 2 * T * len(data.phonemes)


def _sequence_parameters(cfg: dict, data) -> int:
    """The parameter count of the ``[model.lm]`` / ``[model.seq2seq]`` model ``build_model``
    would build for ``data`` (its vocabularies), from the sizes alone."""
    if is_seq2seq(cfg):
        s = seq2seq_spec(cfg)
        _need(data.task == "g2p", f"model.seq2seq maps a sequence to a sequence: it needs a "
                                  f"grapheme-to-phoneme dataset (cmudict), got a {data.task} "
                                  f"task ({cfg['data']['name']})")
        context = s["context"] or 2 * data.longest()[0] + 8
        return seq2seq_parameters(s, len(data.graphemes), len(data.phonemes), context)
    vocab, length = lm_shape(cfg, data)
    s = {**LM_KEYS, **cfg["model"]["lm"]}
    return lm_parameters(s, vocab, s["context"] or length)


def estimated_from_config(cfg: dict) -> bool:
    """Whether ``memory_estimate`` reads ``cfg`` alone (link and sequence models) rather than a
    built model (declared layers): a trainer checks those before it builds anything."""
    return is_link(cfg) or is_seq2seq(cfg) or bool(cfg["model"]["lm"])


def _twin_activations(cfg: dict, data) -> int:
    """Activation scalars one image keeps in a ``[model.twin]`` CNN, about."""
    from .fashion import twin_activations

    return twin_activations(twin_spec(cfg)["channels"], data.shape[-1], data.num_classes)


def _gin_activations(cfg: dict, data) -> int:
    """Activation scalars one graph keeps, about, at the mean graph size: per layer and node
    the MLP's two linear maps, norms and activations (and an edge's message for GINE)."""
    s = gin_spec(cfg)
    G = max(len(data), 1)
    nodes, edges = data.x.shape[0] / G, data.edge_index.shape[1] / G
    per_layer = 7 * s["hidden"] * nodes + (s["hidden"] * edges if s["edge_features"] else 0)
    return int(s["layers"] * per_layer + s["hidden"])


def _task_activations(cfg: dict, data) -> int:
    """Activation scalars one window (forecast) or one instance (routing) keeps, about: a
    forecaster's GRU states, attention and head per step and its (heads, L, H) weights; a
    routing model's encoder blocks (with their (heads, n, n) weights) and the n decoding
    steps' glimpse and pointer over the n cities."""
    if is_forecast(cfg):
        s = forecast_spec(cfg)
        L, H, w = s["context"], s["horizon"], s["width"]
        return 8 * (L + H) * w + s["heads"] * L * H
    s = routing_spec(cfg)
    n, w, ffn = data.n, s["width"], s["ffn"] or 4 * s["width"]
    encoder = s["layers"] * n * (8 * w + 2 * ffn + s["heads"] * n)
    return encoder + n * (6 * w + n * (s["heads"] + 4))


def _graph_activations(cfg: dict, data) -> int:
    """Activation scalars a ``[model.graph]`` model keeps, about: per node the input's dropout
    copy, each layer's output and activation (every head's), and per edge and head an
    attention weight with its softmax."""
    s = graph_spec(cfg)
    heads = max(s["heads"], 1) if s["kind"] in ("gat", "rgat", "heads") else 1
    width = s["hidden"] * heads if s["kind"] != "sgc" else data.num_classes
    per_node = (data.num_features or 0) + 3 * width + 2 * data.num_classes
    per_edge = 2 * heads if s["kind"] in ("gat", "rgat", "heads") else 0
    return int(data.num_nodes * per_node + data.edge_index.shape[1] * per_edge)


def memory_estimate(cfg: dict, data, model: nn.Module | None = None) -> dict | None:
    """Bytes one training step of ``cfg``'s model on ``data`` needs, about: ``params``
    (weights, gradients and optimizer state) and ``activations`` (one batch, kept for the
    backward pass, and their gradients). ``model``: the built model; without it the link
    predictor and the sequence models (``[model.lm]``, ``[model.seq2seq]``) are estimated from
    the config alone (nothing is built), declared layers are built here."""
    if is_link(cfg):
        return _link_memory(cfg, data)
    if model is None and not estimated_from_config(cfg):
        model = build_model(cfg, data)
    t, d = cfg["train"], cfg["data"]
    nbytes = 8 if cfg["model"]["dtype"] == "float64" else 4
    copies = optimizer_copies(t)
    n_params = sum(p.numel() for p in model.parameters()) if model is not None else \
        _sequence_parameters(cfg, data)
    per_sample = _task_activations(cfg, data) if is_forecast(cfg) or is_routing(cfg) else \
        _gin_activations(cfg, data) if is_gin(cfg) else \
        _seq2seq_activations(cfg, data) if is_seq2seq(cfg) else \
        _lm_activations(cfg, data) if cfg["model"]["lm"] else \
        _graph_activations(cfg, data) if is_graph(cfg) else \
        _twin_activations(cfg, data) if is_twin(cfg) else model.activation_elements
    batch = 1 if data.task in ("node", "hetero") else d["batch_size"]
    if data.task == "node" and sampler_spec(cfg):
        per_sample = int(per_sample * sampled_share(cfg, data.num_nodes))
    return {"params": n_params * nbytes * copies, "activations": 2 * per_sample * batch * nbytes,
            "n_params": n_params, "batch": batch, "copies": copies}


def sampled_share(cfg: dict, num_nodes: int) -> float:
    """The share of the graph's nodes a sampled mini-batch reaches at most: batch_size x the
    product of (1 + fanout) over the hops, capped at 1 (a fanout "all" reaches every node)."""
    s = sampler_spec(cfg)
    graph = [h for h in map(graph_layer_hops, cfg["model"]["layers"]) if h is not None]
    reach = float(s["batch_size"])
    for f, h in zip(s["fanouts"], reversed(graph)):
        for v in (f if isinstance(f, list) else [f] * h):
            if v in (-1, "all"):
                return 1.0
            reach *= 1 + v
    return min(1.0, reach / max(num_nodes, 1))


def check_memory(cfg: dict, data, device: str | torch.device = "cpu",
                 model: nn.Module | None = None) -> dict | None:
    """Refuse (ConfigError with the estimate) a run whose ``memory_estimate`` exceeds the
    memory available on ``device``; returns the estimate."""
    est = memory_estimate(cfg, data, model)
    free = available_memory(device)
    if est is None or free is None:
        return est
    need = est["params"] + est["activations"]
    _need(need <= free, f"the model needs about {gib(need)} to train ({est['n_params']:,} "
                        f"parameters x{est['copies']} with gradients and optimizer state: "
                        f"{gib(est['params'])}; activations of a batch of {est['batch']}: "
                        f"{gib(est['activations'])}), more than the {gib(free)} available "
                        f"on this machine: "
                        f"{est.get('hint', 'reduce channels, layers or data.batch_size')}")
    return est

"""mkdocs hooks: the parts of the site that are generated from the code, so they stay true.

A page asks for a generated part with an HTML comment on a line of its own:

- ``<!-- structconv:config TABLE -->``: the keys of a config table with their defaults, read
  from ``structconv.config``'s schema (``DEFAULTS``, ``LM_KEYS``, ``LINK_KEYS``,
  ``LINK_TRAIN_KEYS``, ``SAMPLER_KEYS``, the layer keys), the shipped basis kinds with their
  defaults from the registry, or the parameter forms. Each key's meaning is written below in
  ``MEANINGS``; a key of the schema without one, or a meaning of a key the schema no longer
  has, fails the build (so a new key cannot go undocumented).
- ``<!-- structconv:commands -->``: every command of ``structconv`` with its options, read
  from the argument parser.
- ``<!-- structconv:example-output NAME -->``: the output of ``python examples/NAME.py
  --quick``, run at build time, or read from ``$STRUCTCONV_EXAMPLE_OUTPUT/NAME.txt`` where
  the examples' test has written it (CI then runs each example once). A failing example fails
  the build, except one whose dataset is absent from the data home, which says so.

And a results page (``docs/results-*.md``) missing from ``mkdocs.yml``'s nav joins its Results
section (``on_config``), so another branch's new results page needs no nav edit.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^<!-- structconv:(\S+)(?: (\S+))? -->$", re.M)

#: examples that read a dataset from the data home: without it their page says so
EXAMPLE_DATA = {"gcn_cora": "cora", "gin_tu": "tu-mutag", "hetero_dblp": "dblp"}

#: the meaning of every config key, "table.key" (top-level keys by their name)
MEANINGS = {
    "seed": "random seed: initialisation, data order, dropout (every draw derives from it and "
            "the epoch)",
    "name": "the run's name (default: the config file's stem); the default run directory is "
            "`runs/<name>-<date>-<time>`",
    "description": "free text, shown by `structconv configs`",
    "data.name": "a registered dataset (`structconv datasets`), options may follow: "
                 "`synthetic:nodes=1000,edges=5000`",
    "data.root": "the dataset's folder (default: its folder in the data home)",
    "data.options": "keyword options of the dataset's loader (e.g. `{ limit = 2000 }`)",
    "data.batch_size": "examples per optimizer step (image, text and graph-level tasks; split "
                       "across processes)",
    "data.seq_len": "characters per training window (text tasks)",
    "data.eval_batch_size": "examples per evaluation batch",
    "data.batches_per_epoch": "batches in an epoch; 0: one pass over the training split",
    "data.val_sample": "validate on a fixed seeded sample of this many windows (text) or words "
                       "(seq2seq, decoded greedily too: `val_per`, `val_wer`); 0: the whole split",
    "model.layers": "the `[[model.layers]]` array: one table per layer (keys below)",
    "model.readout": "over the entries after the last layer: `flatten`, `mean`, `sum`, `max` "
                     "or `none` (node and text tasks); `auto`: flatten for images, none "
                     "otherwise",
    "model.classifier": "a linear classifier after the readout: `true`, `false`, or `auto` "
                        "(added when the channels differ from the classes or after flatten)",
    "model.embedding": "text tasks: the token embedding's width (0: 64)",
    "model.dtype": "`float32` or `float64`",
    "model.lm": "the `[model.lm]` table: a `sc.nn.TransformerLM` instead of layers",
    "model.link": "the `[model.link]` table: a `sc.kg.LinkPredictor` for a knowledge graph",
    "model.gin": "the `[model.gin]` table: a graph-level GIN (`sc.models.GIN`) for a dataset "
                 "of many graphs (tu-mutag, tu-proteins, tu-nci1, hiv)",
    "model.graph": "the `[model.graph]` table: a paper's two-layer node classifier (GCN, "
                   "ChebNet, SGC, GAT, R-GCN, RGAT, mixed heads) for one graph",
    "model.graph.kind": "`gcn`, `cheb`, `sgc`, `gat`, `rgcn`, `rgat` or `heads`",
    "model.graph.hidden": "hidden channels (per head for `gat`, `rgat`, `heads`)",
    "model.graph.dropout": "dropout on the input and between the layers",
    "model.graph.K": "`cheb`: Chebyshev terms; `sgc`: the power of the normalised adjacency",
    "model.graph.heads": "`gat`, `rgat`: first-layer heads; `heads`: attention heads (0: none)",
    "model.graph.out_heads": "`gat`: second-layer heads, averaged",
    "model.graph.bases": "`rgcn`, `rgat`: controlled-separable bases over the relations (0: "
                         "full weights)",
    "model.graph.attention": "`rgat`: softmax `within` each relation (WIRGAT) or `across` "
                             "(ARGAT)",
    "model.graph.sorts": "`rgcn`: `single` (one matrix per relation) or `mined` (plus mined "
                         "paths of length 2)",
    "model.graph.top": "`rgcn` with mined sorts: the best supported paths to add",
    "model.graph.backtrack": "`rgcn` with mined sorts: allow paths r.r^-1",
    "model.graph.hops": "`heads`: index heads A^1..A^hops",
    "model.graph.sparse": "`heads`: feed the features as a sparse matrix (same results)",
    "model.graph.param": "`rgcn`: the relational weights' form: `full`, `depthwise`, "
                         "`separable` (H = `bases`) or `auto` (separable where `bases` > 0)",
    "model.gin.hidden": "channels of every GIN layer",
    "model.gin.layers": "GIN layers (each a two-layer MLP after the neighbour sum)",
    "model.gin.readout": "one vector per graph: `sum`, `mean`, `max` or `attention`",
    "model.gin.dropout": "dropout before the linear head",
    "model.gin.edge_features": "GINE layers reading the dataset's edge features (categorical "
                               "columns one-hot, e.g. HIV's bond features)",
    "model.gin.train_eps": "learn each layer's eps (GIN-eps) instead of 0 (GIN-0)",
    "model.gin.batch_norm": "batch norm inside each layer's MLP (under `--nproc` > 1 each "
                            "process normalises by its share of a batch: no SyncBatchNorm on "
                            "CPU, the run differs from a 1-process run)",
    "model.twin": "the `[model.twin]` table: the Fashion-MNIST study's CNN in plain torch or as "
                  "its structconv twin (`models.fashion.twin_cnn`)",
    "model.twin.network": "`torch` (nn.Conv2d / nn.AvgPool2d), `structconv` (`sc.nn.from_torch` "
                          "of the torch network drawn under the same seed: the same initial "
                          "weights) or `structconv-shift` (that twin off `F.conv2d`)",
    "model.twin.channels": "the two convolutions' output channels",
    "model.forecast": "the `[model.forecast]` table: a forecaster of a univariate series "
                      "(`models.forecast.Forecaster`)",
    "model.forecast.form": "the attention's scores: `content`, `position` (plus a bias per "
                           "offset) or `period` (plus biases per phase and per whole period of "
                           "the series)",
    "model.forecast.context": "steps a forecast reads (required)",
    "model.forecast.horizon": "steps a forecast predicts (required)",
    "model.forecast.width": "the GRUs' and the attention's channels",
    "model.forecast.heads": "attention heads (width must divide by heads)",
    "model.routing": "the `[model.routing]` table: Kool et al.'s attention model of TSP tours "
                     "(`models.routing.AttentionModel`)",
    "model.routing.width": "channels of the city embeddings",
    "model.routing.heads": "attention heads (width must divide by heads)",
    "model.routing.layers": "encoder blocks",
    "model.routing.ffn": "the encoder's feed-forward width (0: 4 x width)",
    "model.routing.clip": "the pointer's tanh clipping C",
    "model.hetero": "the `[model.hetero]` table: a typed node classifier for a typed graph "
                    "(dblp, imdb)",
    "model.hetero.kind": "`sage` (typed SAGE, as `to_hetero`), `rgcn` (`param` across "
                         "relations), `hgt` or `han` (attention over `metapaths`)",
    "model.hetero.hidden": "channels of every graph layer",
    "model.hetero.layers": "graph layers",
    "model.hetero.heads": "hgt, han: attention heads (divide `hidden`)",
    "model.hetero.dropout": "han: on the attention coefficients; else: on each layer's output",
    "model.hetero.activation": "sage, rgcn: after each layer",
    "model.hetero.param": "rgcn: the `sc.params` form across relations (`full`, `separable`, "
                          "`grouped`, `lowrank`)",
    "model.hetero.H": "rgcn, `separable`: shared channel matrices (`to_hetero_with_bases`)",
    "model.hetero.groups": "rgcn, `grouped`: blocks",
    "model.hetero.rank": "rgcn, `lowrank`: the rank",
    "model.hetero.metapaths": "han: named metapath sorts, e.g. `movie.to.actor.to.movie`",
    "model.hetero.target": "the node type classified (empty: the labelled one)",
    "model.seq2seq": "the `[model.seq2seq]` table: a sequence-to-sequence model "
                     "(`sc.nn.Seq2Seq` or `sc.nn.PervasiveAttention`) for word pairs",
    "model.seq2seq.kind": "`transformer` (an encoder-decoder Transformer) or `pervasive` "
                          "(Elbayad's 2-D convolution over source x target)",
    "model.seq2seq.width": "transformer: the model's width",
    "model.seq2seq.layers": "transformer: encoder and decoder blocks each; pervasive: 2-D "
                            "convolution layers",
    "model.seq2seq.heads": "transformer: attention heads per layer; pervasive: heads of the "
                           "attention pooling",
    "model.seq2seq.position": "transformer: any `[model.lm]` position kind except `relative` "
                              "(`sinusoidal`, `shift`, `rotary`, ...)",
    "model.seq2seq.shifts": "transformer: causal shift heads per decoder block",
    "model.seq2seq.src_shifts": "transformer: centred shift heads per encoder block (0: the "
                                "default for `shifts`)",
    "model.seq2seq.ffn": "transformer: the feed-forward width (0: 4 x width)",
    "model.seq2seq.dropout": "dropout (both kinds)",
    "model.seq2seq.context": "transformer, `learned` positions: the longest input (0: twice the "
                               "longest word + 8, the longest decoding)",
    "model.seq2seq.canon": "transformer: Canon layers at the places named, a subset of `ABCD`",
    "model.seq2seq.canon_kernel": "transformer: taps of each Canon layer",
    "model.seq2seq.embed": "pervasive: source and target embedding size",
    "model.seq2seq.growth": "pervasive: channels each layer adds",
    "model.seq2seq.bottleneck": "pervasive: a layer's 1 x 1 bottleneck (0: none)",
    "model.seq2seq.kernel": "pervasive: k x k taps, causal along the target",
    "model.seq2seq.pooling": "pervasive: pooling over the source, `attention` or `max`",
    "model.seq2seq.beam": "the beam width of the final decoding of every validation and test "
                          "word (1: greedy)",
    "train.label_smoothing": "label smoothing of the training loss (classification tasks; a "
                             "link predictor's is `train.link.label_smoothing`)",
    "train.optimizer": "`adam`, `adamw`, `sgd` or `adagrad`",
    "train.lr": "learning rate",
    "train.weight_decay": "weight decay (L2 for adam / sgd / adagrad, decoupled for adamw)",
    "train.momentum": "SGD's momentum",
    "train.epochs": "epochs to train (at most)",
    "train.patience": "stop after this many epochs without a better `monitor` (0: never)",
    "train.monitor": "the validation figure that picks the best epoch: `val_acc` or "
                     "`val_loss` (link prediction: `val_mrr`, `val_hits@1`, `val_hits@3`, "
                     "`val_hits@10`; a `[model.gin]` model of two classes: also `val_auc`; "
                     "forecasting: `val_mase`, `val_smape`; routing: `val_gap`, `val_length` "
                     "or `none`, the last weights)",
    "train.grad_clip": "clip the gradient's norm to this value (0: no clipping)",
    "train.checkpoint_every": "a checkpoint every this many epochs; 0: by time (below), and "
                              "always after the last epoch",
    "train.checkpoint_seconds": "with `checkpoint_every = 0`, a checkpoint once this many "
                                "seconds have passed since the last, inside an epoch too",
    "train.max_steps": "a step budget: the run ends after this many optimizer steps, inside an "
                       "epoch too (0: `epochs` alone; `epochs` stays the upper bound)",
    "train.accumulate": "global batches per optimizer step, their gradients summed (image, "
                        "text, node and seq2seq tasks; `[train.sampler]` has its own)",
    "train.schedule": "the learning rate over optimizer steps: `constant`, or `linear` / "
                      "`cosine` decay to `min_lr_ratio` x `lr` (default 0) at `max_steps`",
    "train.warmup_steps": "a linear learning-rate warm-up over this many first steps",
    "train.no_decay": "parameters without weight decay: a list of `bias`, `norm` (normalisation "
                      "layers), `embedding`",
    "train.amp": "bfloat16 autocast on CUDA devices (ignored on CPU)",
    "train.betas": "Adam's and AdamW's moment decays, two numbers in [0, 1)",
    "train.min_lr_ratio": "the fraction of `lr` a `linear` / `cosine` schedule decays to "
                          "(0: to 0; nanoGPT's 0.1)",
    "train.decay": "`all` parameters take `weight_decay`, or the `first` layer's only (the "
                   "Planetoid and R-GCN papers' L2)",
    "train.select": "the weights a run keeps: `monitor` (the best `monitor` epoch's), "
                    "`acc_then_loss` (best validation accuracy, ties to the lower loss), `gat` "
                    "(Velickovic et al.'s rule: accuracy and loss both at their best; patience "
                    "counts epochs where neither improves) or `last` (no validation needed); a "
                    "link predictor: `monitor` or `last`",
    "train.sampler": "the `[train.sampler]` table: sampled mini-batches for node tasks",
    "train.link": "the `[train.link]` table: how a link predictor trains",
    "train.lr_decay": "the learning rate's factor per epoch (1: none)",
    "train.time_limit": "seconds of a call after which no new epoch starts (0: none); the run "
                        "ends there with a checkpoint, and a resumed run continues it",
    "train.routing": "the `[train.routing]` table: REINFORCE's baselines for a routing model",
    "train.routing.warmup_epochs": "epochs with the exponential baseline before the greedy "
                                   "rollout of a frozen copy of the policy",
    "train.routing.bl_eval": "instances of the baseline's paired t-test at each epoch's end",
    "train.routing.alpha": "the t-test's level: the baseline becomes the policy below it",
    "train.routing.beta": "the exponential baseline's factor",
    "train.depo": "the `[train.depo]` table: the hop curriculum of the k-hop task",
    "train.depo.curriculum": "the largest number of hops trained grows from 1 to the task's "
                             "`max_hops` over this fraction of `max_steps` (0: every k from "
                             "the start)",
    "model.lm.width": "the model's width (embedding and residual stream)",
    "model.lm.layers": "decoder blocks",
    "model.lm.heads": "attention heads per block (width must divide by heads)",
    "model.lm.position": "`none`, `sinusoidal`, `learned`, `rotary`, `alibi`, `shift` or "
                         "`shift+alibi` (see [Language models](lm.md))",
    "model.lm.shifts": "causal shift heads per block for `shift` and `shift+alibi`",
    "model.lm.ffn": "the feed-forward width (0: 4 x width)",
    "model.lm.dropout": "dropout on embeddings, attention and feed-forward outputs",
    "model.lm.context": "`learned` positions: the longest input (0: data.seq_len; the `depo` "
                        "task's sequence length)",
    "model.lm.bias": "biases in the linear maps and layer norms",
    "model.lm.tie_weights": "the output map shares the token embedding",
    "model.lm.canon": "Canon layers at the places named, a subset of `ABCD`",
    "model.lm.canon_kernel": "taps of each Canon layer's causal depthwise convolution",
    "model.link.decoder": "`distmult` or `complex`",
    "model.link.dim": "entity vector size (even for complex)",
    "model.link.reciprocal": "a relation `r + R` for each inverse query (tail and head "
                             "prediction get their own relation vectors)",
    "model.link.init_std": "standard deviation of the initial vectors",
    "model.link.encoder_layers": "R-GCN layers refining the entity vectors (0: none)",
    "model.link.block": "the encoder's block-diagonal weight blocks, `block` x `block` (must "
                        "divide dim)",
    "model.link.sorts": "the encoder's sorts: `single` (one weight per relation), `mined` "
                        "(plus the `top` best supported paths up to `max_length`) or a list "
                        "of sorts by name",
    "model.link.max_length": "longest mined path (2..4)",
    "model.link.top": "mined paths kept",
    "model.link.backtrack": "mined paths may step straight back along an inverse",
    "model.link.edge_dropout": "fraction of edges the encoder drops at each training step",
    "model.link.self_dropout": "fraction of the encoder's self-connections dropped",
    "model.link.dropout": "dropout on the entity vectors",
    "train.link.mode": "`1vsall` (each query against every entity, cross-entropy) or "
                       "`negative` (corrupted triples, binary cross-entropy)",
    "train.link.label_smoothing": "label smoothing of the 1-vs-all targets",
    "train.link.reg": "`n3`, `l2` or `none`",
    "train.link.reg_weight": "the regulariser's weight",
    "train.link.negatives": "corruptions per positive triple (`negative` mode)",
    "train.link.eval_every": "rank the validation triples every this many epochs",
    "train.link.val_limit": "rank only the first this many validation triples (0: all)",
    "train.sampler.fanouts": "one per graph layer in PyG's order (the first is the seeds' hop, "
                             "i.e. the last layer's): a positive int, -1 / `\"all\"`, or a "
                             "list of per-hop fanouts for a multi-hop layer",
    "train.sampler.batch_size": "seed nodes per mini-batch and process",
    "train.sampler.accumulate": "mini-batches per optimizer step and process",
    "train.sampler.workers": "background sampling processes",
    "train.sampler.prefetch": "batches built ahead in a background thread of the process, "
                              "overlapping sampling with the model step (not with `workers`)",
    "train.sampler.degrees": "normalise by the `full` graph's degrees or the `sample`'s",
    "train.sampler.eval": "evaluation: `full` (full batch), `layerwise` (exact, one layer's "
                          "activations at a time) or `auto`",
    "train.sampler.typed.fanouts": "one per layer of `model.hetero.layers` in PyG's order (the "
                                   "first is the seeds' hop), each a positive int, -1 / "
                                   "`\"all\"` or 0: one list for every relation, or a table of "
                                   "lists keyed by edge type (`\"paper.to.author\"`) or relation "
                                   "name covering every edge type",
    "train.sampler.typed.batch_size": "seeds of the target node type per mini-batch and process",
    "train.sampler.typed.prefetch": "batches built ahead in a background thread",
    "train.sampler.typed.replace": "draw neighbours with replacement",
    "layer.type": "`conv` (a basis and a parameter form), `linear` (a channel map) or `mlp` "
                  "(the Transformer's residual feed-forward block)",
    "layer.basis": "a basis kind's name or table (kinds below)",
    "layer.channels": "output channels: an int, `classes` or `same`",
    "layer.param": "the parameter form (forms below) or `package.module:function`",
    "layer.groups": "`grouped`: the number of groups",
    "layer.H": "`separable`: the number of channel maps H",
    "layer.rank": "`lowrank`: the rank",
    "layer.activation": "`relu`, `gelu`, `elu`, `tanh`, `sigmoid`, `leaky_relu` or `none` (an "
                        "`mlp` layer's hidden activation, default `gelu`)",
    "layer.dropout": "dropout on the layer's input",
    "layer.bias": "a bias of `channels` entries",
    "layer.pool": "`avg`, `max` or a table `{ kind = \"max\", kernel_size = 2 }` after the "
                  "activation (grid data)",
    "layer.residual": "add the layer's input to its output (channels must match); `mlp` layers "
                      "default to `true`",
    "layer.norm": "`layer`: a pre-norm LayerNorm on the layer's input; `none`",
    "layer.route": "the contraction order passed to `sc.convolve` (`auto`: the planner)",
    "layer.hidden": "`mlp`: the hidden width (0: 4 x channels)",
}

#: the layer keys' defaults (a layer table has no defaults table in the schema)
LAYER_DEFAULTS = {"type": "conv", "basis": "(required for conv)", "channels": "same",
                  "param": "full", "groups": 1, "H": 1, "rank": 1, "activation": "none",
                  "dropout": 0.0, "bias": True, "pool": None, "residual": False,
                  "norm": "none", "route": "auto", "hidden": 0}

#: what each shipped basis kind is
KINDS = {
    "grid": "shift matrices of an N-d grid (`sc.basis.Grid`): `kernel_size`, `stride`, "
            "`padding`, `dilation`; `causal` pads before only (sequences)",
    "identity": "K = 1, the identity (a pointwise layer)",
    "gcn": "Kipf & Welling's normalised adjacency (`sc.basis.gcn`), K = 1",
    "sgc": "SGC: the GCN basis to the power `hops`, K = 1",
    "chebyshev": "Chebyshev polynomials T_0..T_{K-1} of the scaled Laplacian (ChebNet)",
    "diffusion": "monomials S^0..S^K of the normalised adjacency (TAGConv; `rw` for "
                 "diffusion convolution)",
    "relational": "one matrix per random-walk sort (`single`, `mined` or a list by name), "
                  "plus the identity: R-GCN and its extension",
    "stack": "the concatenation of `parts = [...]` along k (e.g. attention and shift heads)",
    "attention": "scaled dot-product attention computed from the layer's input (`heads`, "
                 "`causal`, `dim`)",
    "graph_attention": "attention on the graph's edges (`heads`, `negative_slope`): GAT's "
                       "mechanism, GATv2's (`v2`, `share_weights`) or TransformerConv's "
                       "(`transformer`, `root_weight`, `beta`); edge features by `edge_dim` "
                       "(the data's `edge_attr`, or relation types: `relations = \"onehot\"` "
                       "or `\"embedding\"`), self-loop features by `fill_value`",
}

#: what each parameter form is
FORMS = {
    "full": "K·P·Q parameters, every theta[k] free",
    "grouped": "K·P·Q/groups, each theta[k] block diagonal (`groups`)",
    "depthwise": "K·P + P·Q: a per-channel filter, then a channel map",
    "depthwise_separable": "the same form as `depthwise`, by its full name",
    "separable": "controlled separability, H·(K + P·Q) (`H`; eq. \"separable\")",
    "lowrank": "K·rank·(P + Q) (`rank`): the Transformer's value/output form",
}


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "`true`" if v else "`false`"
    if v is None:
        return "(none)"
    if isinstance(v, str):
        return f"`\"{v}\"`" if v else "`\"\"`"
    if isinstance(v, dict) and not v:
        return "`{}`"
    if isinstance(v, list) and not v:
        return "`[]`"
    return f"`{v}`"


def _meaning(key: str) -> str:
    if key not in MEANINGS:
        raise PluginError(f"docs/hooks/structconv_docs.py: config key {key!r} has no meaning "
                          "in MEANINGS: describe it there")
    return MEANINGS[key]


def _key_table(prefix: str, defaults: dict) -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for k, v in defaults.items():
        key = f"{prefix}.{k}" if prefix else k
        default = v if isinstance(v, str) and prefix == "layer" and v.startswith("(") else _fmt(v)
        rows.append(f"| `{k}` | {default} | {_meaning(key)} |")
    return "\n".join(rows)


def _schema() -> dict[str, dict]:
    from structconv import config as C

    layer_keys = set(getattr(C, "LAYER_KEYS", None) or C._LAYER_KEYS)
    if layer_keys != set(LAYER_DEFAULTS):
        raise PluginError(f"docs/hooks/structconv_docs.py: the layer keys changed: schema "
                          f"{sorted(layer_keys)}, documented {sorted(LAYER_DEFAULTS)}")
    top = {"seed": C.DEFAULTS["seed"], "name": None, "description": None}
    return {"top": top, "data": C.DEFAULTS["data"], "model": C.DEFAULTS["model"],
            "train": C.DEFAULTS["train"], "model.lm": C.LM_KEYS, "model.link": C.LINK_KEYS,
            "model.seq2seq": C.SEQ2SEQ_KEYS, "model.gin": C.GIN_KEYS,
            "model.graph": C.GRAPH_KEYS,
            "model.hetero": C.HETERO_KEYS,
            "train.link": C.LINK_TRAIN_KEYS, "train.sampler": C.SAMPLER_KEYS,
            "model.forecast": C.FORECAST_KEYS, "model.routing": C.ROUTING_KEYS,
            "model.twin": C.TWIN_KEYS,
            "train.routing": C.ROUTING_TRAIN_KEYS,
            "train.depo": C.DEPO_TRAIN_KEYS,
            "train.sampler.typed": C.TYPED_SAMPLER_KEYS,
            "layer": LAYER_DEFAULTS}


def _check_meanings(schema: dict) -> None:
    known = {k if p == "top" else f"{p}.{k}" for p, keys in schema.items() for k in keys}
    stale = sorted(set(MEANINGS) - known)
    if stale:
        raise PluginError(f"docs/hooks/structconv_docs.py: MEANINGS describes keys the schema "
                          f"no longer has: {', '.join(stale)}")


def _kinds_table() -> str:
    from structconv import basis as B

    rows = ["| kind | keys (defaults) | what |", "|---|---|---|"]
    for kind in B.BASES.kinds():
        build = B.BASES.get(kind)
        if not getattr(build, "__module__", "").startswith("structconv"):
            continue  # registered by another package: not ours to describe
        if kind not in KINDS:
            raise PluginError(f"docs/hooks/structconv_docs.py: basis kind {kind!r} has no "
                              "entry in KINDS: describe it there")
        d = B.BASES.trait(kind, "defaults", {}) or {}
        keys = ", ".join(f"`{k}` = {_fmt(v)}" for k, v in d.items()) or "—"
        rows.append(f"| `{kind}` | {keys} | {KINDS[kind]} |")
    return "\n".join(rows)


def _forms_table() -> str:
    from structconv import params as P

    rows = ["| param | parameters |", "|---|---|"]
    for form in P.PARAMS.kinds():
        if form not in FORMS:
            raise PluginError(f"docs/hooks/structconv_docs.py: parameter form {form!r} has "
                              "no entry in FORMS: describe it there")
        rows.append(f"| `{form}` | {FORMS[form]} |")
    return "\n".join(rows)


def config_part(table: str) -> str:
    """The generated part for ``<!-- structconv:config TABLE -->``."""
    if table == "kinds":
        return _kinds_table()
    if table == "params":
        return _forms_table()
    schema = _schema()
    _check_meanings(schema)
    if table not in schema:
        raise PluginError(f"unknown config table {table!r} (known: {', '.join(schema)}, kinds, "
                          "params)")
    return _key_table("" if table == "top" else table, schema[table])


def _option_row(a: argparse.Action) -> str:
    name = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest}`"
    default = "" if a.default in (None, argparse.SUPPRESS, False) or a.nargs in ("*", "...") \
        else f" (default `{a.default}`)"
    text = (a.help or "").replace("|", "\\|")
    return f"| {name} | {text}{default} |"


def commands_part() -> str:
    """Every command of the command line with its options and arguments."""
    from structconv.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for name, p in sub.choices.items():
        out += [f"### `structconv {name}`", "", p.description or "", "",
                "| option | meaning |", "|---|---|"]
        out += [_option_row(a) for a in p._actions
                if not isinstance(a, argparse._HelpAction) and
                a.dest not in ("seed", "device", "out")]
        out.append("")
    return "\n".join(out)


def _example_output(name: str) -> tuple[int, str]:
    given = os.environ.get("STRUCTCONV_EXAMPLE_OUTPUT")
    if given and (Path(given) / f"{name}.txt").is_file():
        return 0, (Path(given) / f"{name}.txt").read_text(encoding="utf-8")
    script = ROOT / "examples" / f"{name}.py"
    if not script.is_file():
        raise PluginError(f"example-output: no example {script}")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    r = subprocess.run([sys.executable, str(script), "--quick"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def example_part(name: str) -> str:
    """The ``--quick`` output of ``examples/NAME.py`` as a code block."""
    code, text = _example_output(name)
    if code:
        dataset = EXAMPLE_DATA.get(name)
        if dataset is None:
            raise PluginError(f"examples/{name}.py --quick failed (exit {code}):\n{text}")
        return (f"!!! note \"Not run for this build\"\n    The `{dataset}` files were not in the "
                f"data home when this site was built; the script said:\n\n"
                f"        {text.strip()}\n")
    return f"```text\n$ python examples/{name}.py --quick\n{text.rstrip()}\n```"


def _nav_files(items) -> set[str]:
    out = set()
    for item in items or []:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            out |= _nav_files(value)
        elif isinstance(value, str):
            out.add(value)
    return out


def on_config(config):
    """Results pages (``docs/results-*.md``) that the nav does not list join its Results
    section, titled by their first heading: a branch that adds one needs no nav edit."""
    nav = config.get("nav")
    if not nav:
        return config
    listed = _nav_files(nav)
    section = next((item["Results"] for item in nav
                    if isinstance(item, dict) and isinstance(item.get("Results"), list)), None)
    if section is not None:
        for path in sorted(Path(config["docs_dir"]).glob("results*.md")):
            if path.name not in listed:
                section.append(path.name)
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:
    def part(m: re.Match) -> str:
        what, arg = m.group(1), m.group(2)
        if what == "config":
            return config_part(arg)
        if what == "commands":
            return commands_part()
        if what == "example-output":
            return example_part(arg)
        raise PluginError(f"{page.file.src_path}: unknown generated part {what!r}")

    return MARK.sub(part, markdown)

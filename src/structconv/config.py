"""Model configs as a schema: defaults, key tables, loading, overrides and validation.

A config is a TOML file (or a shipped config's name). ``load_config`` merges it over
``DEFAULTS``, applies ``key=value`` overrides and validates every section; the result is a plain
dict the rest of the library reads. This module names components and checks them against the
registries (basis kinds, parameter forms); it builds nothing: ``structconv.models`` turns a
validated config into a model.

Each ``[[model.layers]]`` entry names its basis in the paper's terms (a registered kind such as
``grid``, ``gcn``, ``chebyshev``, ``diffusion``, ``sgc``, ``relational``, ``attention``,
``graph_attention``, ``identity`` or a ``stack`` of those), its parameter form (``full``,
``grouped``, ``depthwise``, ``separable`` with ``H``, ``lowrank`` with ``rank``), its output
``channels``, ``activation``, ``dropout`` (on the layer's input), ``pool`` and
``residual``/``norm``. A ``[train.sampler]`` table (``SAMPLER_KEYS``) trains a node model on
sampled mini-batches; ``[model.lm]`` (``LM_KEYS``) describes a language model instead of layers,
``[model.seq2seq]`` (``SEQ2SEQ_KEYS``) a sequence-to-sequence model (grapheme-to-phoneme data),
``[model.link]`` (``LINK_KEYS``) a knowledge-graph link predictor trained as ``[train.link]``
(``LINK_TRAIN_KEYS``) says; ``[model.gin]`` (``GIN_KEYS``) a graph-level GIN for a dataset of
many graphs; ``[model.forecast]`` (``FORECAST_KEYS``) a forecaster of a univariate series;
``[model.twin]`` (``TWIN_KEYS``) the Fashion-MNIST study's CNN in plain torch or as its
structconv twin; ``[model.routing]`` (``ROUTING_KEYS``) an attention model of TSP tours
trained by REINFORCE as ``[train.routing]`` (``ROUTING_TRAIN_KEYS``) says; ``[model.hetero]``
(``HETERO_KEYS``) a typed model for a typed graph (DBLP, IMDB), with ``[train.sampler]``
(``TYPED_SAMPLER_KEYS``) on typed mini-batches; ``[train.depo]`` (``DEPO_TRAIN_KEYS``) the hop
curriculum of a ``[model.lm]`` on the k-hop task (the ``depo`` dataset).
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

from . import basis as B
from . import params as P
from ._checks import int_in, number_in
from .registry import ImportRefused

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["ConfigError", "load_config", "parse_config", "apply_overrides", "validate",
           "DEFAULTS", "config_path", "sampler_spec", "SAMPLER_KEYS", "graph_kinds",
           "graph_layer_hops", "shipped_configs", "LINK_KEYS", "LINK_TRAIN_KEYS", "LM_KEYS",
           "LINK_MONITORS", "ACTIVATIONS", "link_spec", "link_train_spec", "is_link",
           "is_content", "import_paths", "config_from", "SEQ2SEQ_KEYS", "SEQ2SEQ_KINDS",
           "seq2seq_spec", "is_seq2seq", "GIN_KEYS", "gin_spec", "is_gin",
           "FORECAST_KEYS", "forecast_spec", "is_forecast", "ROUTING_KEYS", "ROUTING_TRAIN_KEYS",
           "routing_spec", "routing_train_spec", "is_routing",
           "HETERO_KEYS", "HETERO_KINDS", "hetero_spec", "is_hetero", "TYPED_SAMPLER_KEYS",
           "typed_sampler_spec", "GRAPH_KEYS", "GRAPH_KINDS", "graph_spec", "is_graph",
           "mined_metapaths", "MINED_LENGTH",
           "SELECTIONS", "DECAYS", "GRAPH_PARAMS", "DEPO_TRAIN_KEYS", "depo_train_spec",
           "TWIN_KEYS", "TWIN_NETWORKS", "twin_spec", "is_twin"]


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the bad value."""


DEFAULTS = {
    "seed": 0,
    "data": {"name": "digits", "root": None, "options": {}, "batch_size": 64, "seq_len": 64,
             "eval_batch_size": 512, "batches_per_epoch": 0, "val_sample": 0},
    "model": {"layers": [], "readout": "auto", "classifier": "auto", "embedding": 0,
              "dtype": "float32", "lm": {}, "link": None, "seq2seq": None, "gin": None,
              "forecast": None, "routing": None, "hetero": None, "graph": None,
              "twin": None},
    "train": {"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0, "momentum": 0.9,
              "epochs": 10, "patience": 0, "monitor": "val_acc", "grad_clip": 0.0,
              "checkpoint_every": 0, "checkpoint_seconds": 10.0, "sampler": {}, "link": {},
              "label_smoothing": 0.0, "max_steps": 0, "accumulate": 1, "schedule": "constant",
              "warmup_steps": 0, "no_decay": [], "amp": False, "betas": [0.9, 0.999],
              "min_lr_ratio": 0.0, "lr_decay": 1.0, "routing": {}, "decay": "all",
              "select": "monitor", "depo": {}, "time_limit": 0.0},
}
"""Defaults merged under every config (the file's values win)."""

LINK_KEYS = {"decoder": "distmult", "dim": 200, "reciprocal": True, "init_std": 1e-3,
             "encoder_layers": 0, "block": 5, "sorts": "single", "max_length": 2, "top": 10,
             "backtrack": True, "edge_dropout": 0.4, "self_dropout": 0.2, "dropout": 0.0}
"""``[model.link]``: a link predictor (``sc.kg.LinkPredictor``) for a knowledge-graph dataset:
entity vectors of ``dim`` reals scored by ``decoder``, optionally refined by ``encoder_layers``
R-GCN layers (blocks of ``block`` x ``block``) over the training graph with ``sorts`` "single"
(one weight per relation), "mined" (plus the ``top`` best supported paths of length
2..``max_length``, as the relational basis kind) or a list of sorts by name (the encoder's whole
set: list the single relations too, e.g. ["p", "p^-1", "p.q"])."""
LINK_TRAIN_KEYS = {"mode": "1vsall", "label_smoothing": 0.0, "reg": "none", "reg_weight": 0.0,
                   "negatives": 1, "eval_every": 1, "val_limit": 0}
"""``[train.link]``: how a link predictor trains (``sc.training.train_link``'s options): ``mode``
"1vsall" or "negative" (``negatives`` corruptions per positive), ``label_smoothing``, ``reg``
"n3" / "l2" / "none" times ``reg_weight``; validation ranks every ``eval_every`` epochs the
first ``val_limit`` validation triples (0: all of them)."""
LINK_MONITORS = ("val_mrr", "val_hits@1", "val_hits@3", "val_hits@10")
"""What a link predictor's training may monitor (filtered, on the validation triples)."""

SAMPLER_KEYS = {"fanouts": None, "batch_size": 1024, "accumulate": 1, "workers": 0,
                "prefetch": 0, "degrees": "full", "eval": "auto"}
"""``[train.sampler]``: mini-batches of sampled neighbourhoods for node classification (empty: full
batch). ``fanouts`` one per graph layer in PyG's order: fanouts[0] is the seeds' hop, i.e. the
LAST graph layer's; each a positive int, -1 / "all", or a list of per-hop fanouts for a
multi-hop layer. ``batch_size`` seeds per mini-batch and process; ``accumulate`` mini-batches
per optimizer step and process; ``workers`` background sampling processes, or ``prefetch``
batches built ahead in a background thread of the process (overlapping sampling with the model
step; not with ``workers``); ``degrees`` "full"
(the full graph's normalisation) or "sample"; ``eval`` "full" (full batch), "layerwise" (exact,
one layer's activations at a time) or "auto"."""
_TOP = {"seed", "name", "description", "data", "model", "train"}
ACTIVATIONS = ("relu", "gelu", "elu", "tanh", "sigmoid", "none", "leaky_relu")
"""The activations a declared layer may name."""


def graph_kinds() -> list[str]:
    """The basis kinds a sampler can restrict (those registered with a ``Sampled`` trait)."""
    out = []
    for k in B.BASES.kinds():
        try:
            if B.BASES.trait(k, "sampled") is not None:
                out.append(k)
        except B.KindError:  # a broken plug-in is named where a config uses it, not here
            continue
    return out


# -- loading -------------------------------------------------------------------------------------
#: batches in one epoch at most: beyond it an epoch runs for days with nothing written
MAX_BATCHES = 1_000_000


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def shipped_configs() -> dict[str, Path]:
    """The example configs shipped in the package, by name (file stem)."""
    folder = Path(__file__).with_name("configs")
    return {p.stem: p for p in sorted(folder.glob("*.toml"))}


def config_path(name_or_path: str | Path) -> Path:
    """A path as given, or the shipped config of that name (``cnn_digits``)."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    shipped = shipped_configs()
    if str(name_or_path) in shipped:
        return shipped[str(name_or_path)]
    if p.suffix == ".toml" or p.parent != Path("."):
        raise ConfigError(f"config file {p} not found")
    raise ConfigError(f"unknown config {str(name_or_path)!r}: not a file, and not one of the "
                      f"shipped configs ({', '.join(shipped)})")


def parse_config(text: str, source: str = "<config>") -> dict:
    """TOML text -> validated config dict with defaults filled in."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: invalid TOML ({e})") from None
    return validate(_merge(DEFAULTS, raw), source)


def load_config(path: str | Path, overrides: list[str] | tuple = ()) -> dict:
    """Read a TOML config (path or shipped name), apply ``key=value`` overrides, validate."""
    p = config_path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config {p}: {e}") from None
    cfg = parse_config(text, str(p))
    if not overrides:
        return cfg
    try:  # defaults again under the result: an override may replace a whole table (``data={}``)
        return validate(_merge(DEFAULTS, apply_overrides(cfg, overrides)), str(p))
    except ConfigError as e:  # the file validated alone: an override is what is refused
        raise ConfigError(_blame_override(str(e), str(p), overrides)) from None


def _blame_override(message: str, where: str, overrides) -> str:
    """``message`` (``<where>: <key> ...``) naming the override that set the refused key."""
    rest = message[len(where) + 2:] if message.startswith(f"{where}: ") else message
    named = rest.split(" ", 1)[0].rstrip(":")
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key == named or key.startswith(f"{named}.") or named.startswith(f"{key}."):
            return f"override {item!r}: {rest}"
    return f"{where} with overrides {' '.join(overrides)}: {rest}"


def _parse_value(text: str):
    # a TOML value when it parses as one (numbers, booleans, arrays, quoted strings), else a string
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(cfg: dict, overrides) -> dict:
    """Apply ``a.b.c=value`` overrides; ``model.layers.0.channels=8`` indexes a list."""
    cfg = copy.deepcopy(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"bad override {item!r}: expected key=value, e.g. train.epochs=3")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        if not key.strip() or any(not p for p in parts):
            raise ConfigError(f"bad override {item!r}: empty key")
        if parts[0] not in _TOP:
            raise ConfigError(f"bad override {item!r}: unknown section {parts[0]!r} "
                              f"(expected one of {', '.join(sorted(_TOP))})")
        node = cfg
        for i, p in enumerate(parts[:-1]):
            if isinstance(node, list):
                if not p.isdigit() or int(p) >= len(node):
                    raise ConfigError(f"bad override {item!r}: {'.'.join(parts[:i + 1])} is not "
                                      f"an index below {len(node)}")
                node = node[int(p)]
                if not isinstance(node, (dict, list)):
                    raise ConfigError(f"bad override {item!r}: {'.'.join(parts[:i + 1])} is "
                                      f"{node!r}, not a table")
            else:
                if not isinstance(node.get(p), (dict, list)):
                    raise ConfigError(f"bad override {item!r}: no table "
                                      f"{'.'.join(parts[:i + 1])}")
                node = node[p]
        last = parts[-1]
        value = _parse_value(text.strip())
        if isinstance(node, list):
            if not last.isdigit() or int(last) >= len(node):
                raise ConfigError(f"bad override {item!r}: {last!r} is not an index below "
                                  f"{len(node)}")
            node[int(last)] = value
        else:
            section = parts[0]
            known = DEFAULTS.get(section) if len(parts) == 2 else None
            if isinstance(known, dict) and last not in known and last not in node:
                raise ConfigError(f"bad override {item!r}: unknown key {key!r} (known in "
                                  f"[{section}]: {', '.join(sorted(known))})")
            old = node.get(last)
            if isinstance(old, bool) and not isinstance(value, bool):
                raise ConfigError(f"bad override {item!r}: {key} expects true/false")
            if isinstance(old, (int, float)) and not isinstance(old, bool) and \
                    not isinstance(value, (int, float)):
                raise ConfigError(f"bad override {item!r}: {key} expects a number, got {text!r}")
            if isinstance(old, float) and isinstance(value, int):
                value = float(value)
            node[last] = value
    return cfg


def _need(cond: bool, msg: str):
    if not cond:
        raise ConfigError(msg)


#: ``train`` keys added after runs were first written (a saved config may lack them)
_LATER_KEYS = ("label_smoothing", "max_steps", "accumulate", "schedule", "warmup_steps",
               "no_decay", "amp", "betas", "min_lr_ratio", "lr_decay", "val_sample", "decay",
               "select", "graph", "depo", "time_limit")
#: what ``train.no_decay`` may exempt from weight decay; ``train.schedule``'s schedules
NO_DECAY = ("bias", "norm", "embedding")
SCHEDULES = ("constant", "linear", "cosine")
DECAYS = ("all", "first")
"""``train.decay``: weight decay on every parameter, or on the first layer's only (the
Planetoid and R-GCN papers' L2 on the first layer)."""
SELECTIONS = ("monitor", "acc_then_loss", "gat", "last")
"""``train.select``: the weights a run keeps. ``monitor``: the best ``train.monitor`` epoch's;
``acc_then_loss``: the best validation accuracy's, ties to the lower validation loss; ``gat``:
Velickovic et al.'s rule (kept where accuracy and loss both match or beat their best; patience
counts epochs in which neither improved); ``last``: the last epoch's (no validation needed: an
empty validation split is allowed)."""


def _check_loop(cfg: dict, source: str) -> None:
    """The training loop's keys: step budget, accumulation, schedule, decay groups, AMP."""
    t = cfg["train"]
    for k, lo in (("max_steps", 0), ("accumulate", 1), ("warmup_steps", 0)):
        v = t.get(k, DEFAULTS["train"][k])
        _need(int_in(v, lo, math.inf), f"{source}: train.{k} must be an int >= {lo}, got {v!r}")
    sched = t.get("schedule", "constant")
    _need(sched in SCHEDULES, f"{source}: train.schedule must be one of "
                              f"{', '.join(SCHEDULES)}, got {sched!r}")
    if sched != "constant":
        _need(t.get("max_steps", 0) > t.get("warmup_steps", 0),
              f"{source}: train.schedule = {sched!r} decays over the step budget: set "
              f"train.max_steps above train.warmup_steps ({t.get('warmup_steps', 0)})")
    nd = t.get("no_decay", [])
    _need(isinstance(nd, list) and all(isinstance(x, str) and x in NO_DECAY for x in nd),
          f"{source}: train.no_decay must be a list of {', '.join(NO_DECAY)}, got {nd!r}")
    _need(t.get("accumulate", 1) == 1 or not (t.get("sampler") or cfg["model"].get("link")),
          f"{source}: train.accumulate is for batches a task cuts itself: [train.sampler] has "
          "its own accumulate, and a [model.link] run steps once per batch of queries")
    _need(isinstance(t.get("amp", False), bool),
          f"{source}: train.amp must be true or false, got {t.get('amp')!r}")
    _need(number_in(t.get("lr_decay", 1.0), 0, 1) and t.get("lr_decay", 1.0) > 0,
          f"{source}: train.lr_decay (the learning rate's factor per epoch) must be a number "
          f"in (0, 1], got {t.get('lr_decay')!r}")
    betas = t.get("betas", DEFAULTS["train"]["betas"])
    _need(isinstance(betas, list) and len(betas) == 2 and
          all(number_in(b, 0, 1, open_hi=True) for b in betas),
          f"{source}: train.betas must be two numbers in [0, 1) (Adam's and AdamW's moment "
          f"decays), got {betas!r}")
    floor = t.get("min_lr_ratio", 0.0)
    _need(number_in(floor, 0, 1), f"{source}: train.min_lr_ratio must be a number in [0, 1] "
                                  f"(the fraction of train.lr a schedule decays to), got {floor!r}")
    for k, allowed in (("decay", DECAYS), ("select", SELECTIONS)):
        v = t.get(k, DEFAULTS["train"][k])
        _need(v in allowed, f"{source}: train.{k} must be one of {', '.join(allowed)}, "
                            f"got {v!r}")
    # acc_then_loss and gat rank by validation accuracy and loss, which a link predictor's
    # ranking has not; its best train.monitor epoch or its last are both well defined
    _need(t.get("select", "monitor") in ("monitor", "last") or not cfg["model"].get("link"),
          f"{source}: train.select for a [model.link] model is monitor (its best "
          f"train.monitor epoch) or last; acc_then_loss and gat rank classification accuracy "
          f"and loss, got {t.get('select')!r}")
    limit = t.get("time_limit", 0.0)
    _need(number_in(limit, 0, 1e9), f"{source}: train.time_limit must be a number of "
                                    f"seconds in [0, 1e9] (0: none), got {limit!r}")


def validate(cfg: dict, source: str = "<config>") -> dict:
    """Check sections, keys and value types; returns ``cfg``."""
    for k in cfg:
        _need(k in _TOP, f"{source}: unknown top-level key {k!r} "
                         f"(expected {', '.join(sorted(_TOP))})")
    for sec in ("data", "model", "train", "seed"):
        _need(sec in cfg, f"{source}: missing {'key' if sec == 'seed' else 'table'} {sec}")
    for sec in ("data", "model", "train"):
        _need(isinstance(cfg[sec], dict), f"{source}: [{sec}] must be a table")
        for k in cfg[sec]:
            _need(k in DEFAULTS[sec], f"{source}: unknown key {sec}.{k} (known: "
                                      f"{', '.join(sorted(DEFAULTS[sec]))})")
        # (a run directory written before these keys existed has none of them)
        missing = [f"{sec}.{k}" for k in DEFAULTS[sec]
                   if k not in {*cfg[sec], "sampler", "link", "seq2seq", "gin", "forecast",
                                "routing", "hetero", "twin", *_LATER_KEYS}]
        _need(not missing, f"{source}: missing key(s) {', '.join(missing)}")
    t = cfg["train"]
    for k in ("epochs", "patience", "checkpoint_every"):
        _need(int_in(t[k], 0, math.inf), f"{source}: train.{k} must be an int >= 0, got {t[k]!r}")
    _need(t["epochs"] >= 1, f"{source}: train.epochs must be >= 1, got {t['epochs']}")
    _need(number_in(t.get("label_smoothing", 0.0), 0, 1, open_hi=True),
          f"{source}: train.label_smoothing must be a number in [0, 1), got "
          f"{t.get('label_smoothing')!r}")
    for k in ("lr", "weight_decay", "momentum", "grad_clip", "checkpoint_seconds"):
        _need(isinstance(t[k], (int, float)) and not isinstance(t[k], bool) and t[k] >= 0
              and math.isfinite(t[k]), f"{source}: train.{k} must be a number >= 0, got {t[k]!r}")
    # beyond these a float32 optimizer state overflows (3.4e38) or momentum diverges by
    # definition: no training run can mean them
    for k, top in (("lr", 1e30), ("weight_decay", 1e30), ("momentum", 1.0)):
        _need(t[k] <= top, f"{source}: train.{k} must be at most {top:g}, got {t[k]!r}")
    _need(t["optimizer"] in ("adam", "adamw", "sgd", "adagrad"),
          f"{source}: train.optimizer must be adam, adamw, sgd or adagrad, got "
          f"{t['optimizer']!r}")
    _check_loop(cfg, source)
    _check_depo_train(t, source)
    d = cfg["data"]
    _need(isinstance(d["name"], str), f"{source}: data.name must be a string")
    _need(isinstance(d["options"], dict), f"{source}: data.options must be a table")
    for k in ("batch_size", "seq_len", "eval_batch_size"):
        _need(int_in(d[k], 1, math.inf), f"{source}: data.{k} must be an int >= 1, got {d[k]!r}")
    bpe = d["batches_per_epoch"]
    _need(int_in(bpe, 0, MAX_BATCHES), f"{source}: data.batches_per_epoch must be an int in "
          f"[0, {MAX_BATCHES:,}] (0: one pass over the data), got {bpe!r}")
    vs = d.get("val_sample", 0)
    _need(int_in(vs, 0, 10**9), f"{source}: data.val_sample must be an int in [0, 10^9] (0: "
                                f"validate on the whole split), got {vs!r}")
    _need(isinstance(cfg["seed"], int), f"{source}: seed must be an int, got {cfg['seed']!r}")
    return _check_model(cfg, source)


def _check_tables(m: dict, t: dict, source: str) -> None:
    """The model section's scalar keys, and each model table a table (or absent)."""
    _need(isinstance(m["embedding"], int) and not isinstance(m["embedding"], bool)
          and m["embedding"] >= 0, f"{source}: model.embedding must be an int >= 0, "
          f"got {m['embedding']!r}")
    _need(m["classifier"] in ("auto", True, False),
          f"{source}: model.classifier must be auto, true or false, got {m['classifier']!r}")
    _need(m["dtype"] in ("float32", "float64"),
          f"{source}: model.dtype must be float32 or float64, got {m['dtype']!r}")
    _need(isinstance(m["lm"], dict), f"{source}: model.lm must be a table ([model.lm])")
    # model.link and the other kinds' tables: None (not that kind) or a table, empty for all
    # defaults
    for k in ("link", "seq2seq", "gin", "hetero", "graph", "twin"):
        _need(m.get(k) is None or isinstance(m[k], dict),
              f"{source}: model.{k} must be a table ([model.{k}]), got {m.get(k)!r}")
    _need(isinstance(t.get("link", {}), dict),
          f"{source}: train.link must be a table ([train.link]), got {t['link']!r}")
    _need(m.get("graph") is None or all(m.get(k) is None for k in ("link", "seq2seq", "gin")),
          f"{source}: a [model.graph] model is the whole model: remove [model.link], "
          "[model.seq2seq] and [model.gin]")


def _check_model(cfg: dict, source: str) -> dict:
    """The model section (declared layers, ``[model.lm]`` or ``[model.link]``) and what
    depends on its kind: the monitor, ``[train.link]``, the sampler."""
    m, t = cfg["model"], cfg["train"]
    _check_tables(m, t, source)
    if is_link(cfg):
        _need(not t.get("label_smoothing"), f"{source}: train.label_smoothing is for "
                                            "classification; a link predictor's is "
                                            "train.link.label_smoothing")
        _check_link(cfg, source)
        return _check_rest(cfg, source)
    _need(not t.get("link"), f"{source}: [train.link] trains a link predictor: it needs a "
                             "[model.link] table")
    if is_forecast(cfg) or is_routing(cfg) or t.get("routing"):
        _check_task_model(cfg, source)
        return _check_rest(cfg, source)
    _need(t["monitor"] in ("val_acc", "val_loss") or (is_gin(cfg) and t["monitor"] == "val_auc"),
          f"{source}: train.monitor must be val_acc or val_loss (or val_auc for a [model.gin] "
          f"model of a two-class dataset), got {t['monitor']!r}"
          + (" (the val_mrr / val_hits@K monitors are for [model.link] models)"
             if t["monitor"] in LINK_MONITORS else ""))
    if is_seq2seq(cfg):
        _check_seq2seq(m, f"{source}: model.seq2seq")
        return _check_rest(cfg, source)
    if is_gin(cfg):
        _check_gin(m, f"{source}: model.gin")
        return _check_rest(cfg, source)
    if is_twin(cfg):
        _check_twin(m, f"{source}: model.twin")
        return _check_rest(cfg, source)
    if is_graph(cfg):
        _check_graph_model(m, f"{source}: model.graph")
        _need(not t.get("sampler"), f"{source}: a [model.graph] model trains full batch: "
                                    "remove [train.sampler]")
        return _check_rest(cfg, source)
    if is_hetero(cfg):
        _check_hetero(m, f"{source}: model.hetero")
        return _check_rest(cfg, source)
    if m["lm"]:
        _check_lm(m, f"{source}: model.lm")
        return _check_rest(cfg, source)
    _need(isinstance(m["layers"], list) and m["layers"],
          f"{source}: model.layers must be a non-empty list of [[model.layers]] tables")
    for i, layer in enumerate(m["layers"]):
        _need(isinstance(layer, dict), f"{source}: model.layers.{i} must be a table")
        _check_layer(layer, f"{source}: model.layers.{i}")
    return _check_rest(cfg, source)


def sampler_spec(cfg: dict) -> dict | None:
    """The ``[train.sampler]`` table with its defaults filled in, or None (full batch)."""
    s = cfg["train"].get("sampler") or {}
    return {**SAMPLER_KEYS, **s} if s else None


def graph_layer_hops(layer: dict) -> int | None:
    """Sample hops one declared layer consumes (its kind's ``Sampled`` trait): None for a
    layer that is not a graph convolution (linear, mlp, or a basis of another kind)."""
    if layer.get("type", "conv") != "conv":
        return None
    trait = B.sampled(layer["basis"])
    return None if trait is None else trait.hops(B.with_defaults(layer["basis"]))


def _check_fanout(f, where: str) -> None:
    def ok(v) -> bool:
        return v == "all" or (isinstance(v, int) and not isinstance(v, bool) and
                              (v >= 1 or v == -1))

    _need(ok(f) or (isinstance(f, list) and f and all(map(ok, f))),
          f"{where} must be a positive int, -1 or \"all\" (or a list of those for a "
          f"multi-hop layer), got {f!r}")


def _check_sampler(cfg: dict, where: str) -> None:
    s = cfg["train"]["sampler"]
    for k in s:
        _need(k in SAMPLER_KEYS, f"{where}: unknown key {k!r} (known: "
                                 f"{', '.join(SAMPLER_KEYS)})")
    s = {**SAMPLER_KEYS, **s}
    # workers are processes: past a few hundred no machine has the cores (the run checks
    # this machine's count)
    for k, low, high in (("batch_size", 1, MAX_BATCHES), ("accumulate", 1, MAX_BATCHES),
                         ("workers", 0, 256), ("prefetch", 0, 64)):
        _need(int_in(s[k], low, high),
              f"{where}.{k} must be an int in [{low}, {high:,}], got {s[k]!r}")
    _need(not (s["prefetch"] and s["workers"]),
          f"{where}: prefetch builds batches in a thread of this process, workers in processes "
          f"of their own: give one of them, got prefetch={s['prefetch']}, "
          f"workers={s['workers']}")
    _need(s["degrees"] in ("full", "sample"),
          f"{where}.degrees must be full or sample, got {s['degrees']!r}")
    _need(s["eval"] in ("auto", "full", "layerwise"),
          f"{where}.eval must be auto, full or layerwise, got {s['eval']!r}")
    fan = s["fanouts"]
    _need(isinstance(fan, list) and fan, f"{where}.fanouts must be a list with one fanout per "
                                         f"graph layer, e.g. [10, 10], got {fan!r}")
    for i, f in enumerate(fan):
        _check_fanout(f, f"{where}.fanouts[{i}]")
    layers = cfg["model"]["layers"]
    for i, lay in enumerate(layers):
        if graph_layer_hops(lay) is None and lay.get("type", "conv") == "conv":
            raise ConfigError(f"{where}: model.layers.{i} has basis "
                              f"{B.as_spec(lay['basis']).get('kind')!r}, which cannot be "
                              f"sampled (graph kinds: {', '.join(graph_kinds())})")
        _need("pool" not in lay, f"{where}: model.layers.{i} pools, which a sampled "
                                 "mini-batch cannot")
    hops = [(i, graph_layer_hops(lay)) for i, lay in enumerate(layers)]
    graph = [(i, h) for i, h in hops if h is not None]
    _need(len(fan) == len(graph),
          f"{where}.fanouts has {len(fan)} entries but the model has {len(graph)} graph "
          f"layer(s) (model.layers {[i for i, _ in graph]}): give one fanout per graph layer, "
          "fanouts[0] for the last")
    for j, f in enumerate(fan):
        i, h = graph[len(graph) - 1 - j]  # PyG's order: fanouts[0] is the last graph layer's
        if isinstance(f, list) and isinstance(h, int) and len(f) != h:
            raise ConfigError(f"{where}.fanouts[{j}] {f} lists {len(f)} hops but "
                              f"model.layers.{i} consumes {h}")


def _check_rest(cfg: dict, source: str) -> dict:
    m, t = cfg["model"], cfg["train"]
    _need(isinstance(t.get("sampler", {}), dict),
          f"{source}: train.sampler must be a table ([train.sampler]), got {t['sampler']!r}")
    if t.get("sampler"):
        _need(not m["lm"], f"{source}: train.sampler samples graph neighbourhoods for node "
                           "classification; a [model.lm] model has none")
        if is_hetero(cfg):  # typed seeds and a fanout per relation: its own keys
            _check_typed_sampler(cfg, f"{source}: train.sampler")
        else:
            _check_sampler(cfg, f"{source}: train.sampler")
    _need(m["readout"] in ("auto", "flatten", "mean", "sum", "max", "none"),
          f"{source}: model.readout must be auto, flatten, mean, sum, max or none, "
          f"got {m['readout']!r}")
    return cfg


LM_KEYS = {"width": 128, "layers": 4, "heads": 4, "position": "shift", "shifts": 4, "ffn": 0,
            "dropout": 0.0, "context": 0, "bias": True, "tie_weights": True, "canon": "",
            "canon_kernel": 4}
"""``[model.lm]``: a ``sc.nn.TransformerLM`` instead of declared layers (text tasks)."""


def _check_ints(spec: dict, where: str, positive, natural) -> None:
    for k in positive:
        _need(int_in(spec[k], 1, 1_000_000), f"{where}.{k} must be an int in 1..1000000, "
                                              f"got {spec[k]!r}")
    for k in natural:
        _need(int_in(spec[k], 0, 1_000_000), f"{where}.{k} must be an int in 0..1000000, "
                                              f"got {spec[k]!r}")
    _need(number_in(spec["dropout"], 0, 1, open_hi=True),
          f"{where}.dropout must be in [0, 1), got {spec['dropout']!r}")


def _check_attention_stack(spec: dict, where: str, positions) -> None:
    """The keys a Transformer's blocks share (``[model.lm]`` and ``[model.seq2seq]``)."""
    from .nn.lm import check_canon

    _need(spec["position"] in positions, f"{where}.position must be one of "
                                         f"{', '.join(positions)}, got {spec['position']!r}")
    _need(spec["width"] % spec["heads"] == 0,
          f"{where}: width={spec['width']} must be divisible by heads={spec['heads']}")
    _need(not (spec["position"] == "rotary" and (spec["width"] // spec["heads"]) % 2),
          f"{where}: rotary needs an even head size (width/heads), got "
          f"{spec['width'] // spec['heads']}")
    _need(not (spec["position"].startswith("shift") and spec["shifts"] < 1),
          f"{where}: position={spec['position']!r} needs shifts >= 1")
    _need(int_in(spec["canon_kernel"], 1, 1024),
          f"{where}.canon_kernel must be an int in 1..1024, got {spec['canon_kernel']!r}")
    try:
        check_canon(spec["canon"], spec["canon_kernel"])
    except ValueError as e:
        raise ConfigError(f"{where}.{e}") from None


def _check_lm(m: dict, where: str) -> None:
    from .nn.lm import POSITIONS

    for k in m["lm"]:
        _need(k in LM_KEYS, f"{where}: unknown key {k!r} (known: {', '.join(LM_KEYS)})")
    _need(not m["layers"], f"{where}: a [model.lm] model takes no [[model.layers]]")
    spec = {**LM_KEYS, **m["lm"]}
    _check_ints(spec, where, ("width", "layers", "heads"), ("ffn", "context", "shifts"))
    for k in ("bias", "tie_weights"):
        _need(isinstance(spec[k], bool), f"{where}.{k} must be true or false, got {spec[k]!r}")
    _check_attention_stack(spec, where, POSITIONS)
    _check_applies(m["lm"], spec, where)


SEQ2SEQ_KINDS = ("transformer", "pervasive")
"""The models a ``[model.seq2seq]`` table may name: an encoder-decoder Transformer or
Elbayad et al.'s pervasive attention."""
SEQ2SEQ_KEYS = {"kind": "transformer", "width": 128, "layers": 3, "heads": 4,
                "position": "sinusoidal", "shifts": 4, "src_shifts": 0, "ffn": 0, "dropout": 0.1,
                "context": 0, "canon": "", "canon_kernel": 4, "embed": 32, "growth": 24,
                "bottleneck": 48, "kernel": 3, "pooling": "attention", "beam": 1}
"""``[model.seq2seq]``: a sequence-to-sequence model for a grapheme-to-phoneme dataset. ``kind``
"transformer" (``sc.nn.Seq2Seq``: ``width``, ``layers`` per side, ``heads``, ``position``,
decoder ``shifts`` and encoder ``src_shifts`` (0: the default centred offsets), ``ffn`` (0: 4 x
width), ``context``, ``canon``) or "pervasive" (``sc.nn.PervasiveAttention``: ``embed``, ``layers``
of 2-D convolutions of ``kernel`` x ``kernel`` taps, ``growth``, ``bottleneck``, ``pooling``
"attention" (``heads`` heads) or "max"); ``dropout`` for both; ``beam`` the width of the test
decoding (1: greedy)."""


_BOTH = ("kind", "layers", "heads", "dropout", "beam")
SEQ2SEQ_APPLIES = {
    "transformer": (*_BOTH, "width", "position", "shifts", "src_shifts", "ffn", "context",
                    "canon", "canon_kernel"),
    "pervasive": (*_BOTH, "embed", "growth", "bottleneck", "kernel", "pooling"),
}
"""The ``[model.seq2seq]`` keys each kind reads; a table that sets another is refused."""


def _check_applies(given: dict, spec: dict, where: str) -> None:
    """Keys of a Transformer's table (``[model.lm]``, a transformer ``[model.seq2seq]``) that
    only size a part the chosen options leave out: ``context`` (the learned position table)
    and ``canon_kernel`` (the Canon layers). (``shifts`` stays allowed with any position: a
    shipped config's shift heads must not block an override of the position.)"""
    _need("context" not in given or spec["position"] == "learned" or not given["context"],
          f"{where}.context sizes the learned position table: it does not apply to "
          f"position = {spec['position']!r} (remove it, or set position = \"learned\")")
    _need("canon_kernel" not in given or spec["canon"],
          f"{where}.canon_kernel sizes the Canon layers: it does not apply without canon "
          f"(remove it, or name Canon places, e.g. canon = \"ABCD\")")


def seq2seq_spec(cfg: dict) -> dict:
    """The ``[model.seq2seq]`` table with its defaults filled in."""
    return {**SEQ2SEQ_KEYS, **(cfg["model"].get("seq2seq") or {})}


def is_seq2seq(cfg: dict) -> bool:
    """Whether ``cfg`` describes a sequence-to-sequence model (a ``[model.seq2seq]`` table)."""
    return cfg["model"].get("seq2seq") is not None


def _check_seq2seq(m: dict, where: str) -> None:
    from .nn.seq2seq import SEQ2SEQ_POSITIONS

    for k in m["seq2seq"]:
        _need(k in SEQ2SEQ_KEYS, f"{where}: unknown key {k!r} (known: {', '.join(SEQ2SEQ_KEYS)})")
    _need(not m["layers"] and not m["lm"], f"{where}: a [model.seq2seq] model takes no "
                                           "[[model.layers]] and no [model.lm]")
    s = {**SEQ2SEQ_KEYS, **m["seq2seq"]}
    _need(s["kind"] in SEQ2SEQ_KINDS, f"{where}.kind must be one of {', '.join(SEQ2SEQ_KINDS)}"
                                      f", got {s['kind']!r}")
    _check_ints(s, where, ("width", "layers", "heads", "embed", "growth", "kernel", "beam"),
                ("shifts", "src_shifts", "ffn", "context", "bottleneck"))
    _need(s["pooling"] in ("attention", "max"),
          f"{where}.pooling must be attention or max, got {s['pooling']!r}")
    for k in m["seq2seq"]:
        _need(k in SEQ2SEQ_APPLIES[s["kind"]],
              f"{where}.{k} does not apply to kind = {s['kind']!r}: it is a key of kind "
              f"{' or '.join(repr(w) for w in SEQ2SEQ_KINDS if k in SEQ2SEQ_APPLIES[w])} "
              f"(remove it, or choose that kind)")
    if s["kind"] == "transformer":
        _check_attention_stack(s, where, SEQ2SEQ_POSITIONS)
        _check_applies(m["seq2seq"], s, where)


GIN_KEYS = {"hidden": 64, "layers": 5, "readout": "sum", "dropout": 0.0, "edge_features": False,
            "train_eps": False, "batch_norm": True}
"""``[model.gin]``: a graph-level GIN (``sc.models.GIN``) for a dataset of many graphs: ``layers``
GIN layers of ``hidden`` channels (two-layer MLPs, with ``batch_norm``: per process under
DDP, as torch's DDP without ``SyncBatchNorm``, so a run over several processes does not equal
a 1-process run), GIN-eps where
``train_eps``, GINE layers reading the dataset's edge features where ``edge_features``, a
``readout`` (sum, mean, max or attention) to one vector per graph, ``dropout`` before the
linear head."""


def gin_spec(cfg: dict) -> dict:
    """The ``[model.gin]`` table with its defaults filled in."""
    return {**GIN_KEYS, **(cfg["model"].get("gin") or {})}


def is_gin(cfg: dict) -> bool:
    """Whether ``cfg`` describes a graph-level GIN (a ``[model.gin]`` table)."""
    return cfg["model"].get("gin") is not None


def _check_gin(m: dict, where: str) -> None:
    for k in m["gin"]:
        _need(k in GIN_KEYS, f"{where}: unknown key {k!r} (known: {', '.join(GIN_KEYS)})")
    _need(not m["layers"] and not m["lm"] and m.get("seq2seq") is None,
          f"{where}: a [model.gin] model takes no [[model.layers]], [model.lm] or "
          "[model.seq2seq]")
    s = {**GIN_KEYS, **m["gin"]}
    _check_ints(s, where, ("hidden", "layers"), ())
    _need(s["readout"] in ("sum", "mean", "max", "attention"),
          f"{where}.readout must be sum, mean, max or attention, got {s['readout']!r}")
    for k in ("edge_features", "train_eps", "batch_norm"):
        _need(isinstance(s[k], bool), f"{where}.{k} must be true or false, got {s[k]!r}")


TWIN_NETWORKS = ("torch", "structconv", "structconv-shift")
"""The networks a ``[model.twin]`` table may name."""
TWIN_KEYS = {"network": "torch", "channels": [16, 32]}
"""``[model.twin]``: the Fashion-MNIST study's CNN (``models.fashion``): Conv(C->c1, 3x3)
ReLU AvgPool(2) Conv(c1->c2, 3x3) ReLU AvgPool(2) Linear, with ``channels`` = [c1, c2];
``network`` "torch" is it in plain torch, "structconv" its twin of grid layers built by
``sc.nn.from_torch`` from the torch network drawn under the same seed (the same initial
weights), "structconv-shift" that twin kept off ``F.conv2d`` (the paper's contraction
orders)."""


def twin_spec(cfg: dict) -> dict:
    """The ``[model.twin]`` table with its defaults filled in."""
    return {**TWIN_KEYS, **(cfg["model"].get("twin") or {})}


def is_twin(cfg: dict) -> bool:
    """Whether ``cfg`` describes the torch CNN or a structconv twin (a ``[model.twin]``)."""
    return cfg["model"].get("twin") is not None


def _check_twin(m: dict, where: str) -> None:
    for k in m["twin"]:
        _need(k in TWIN_KEYS, f"{where}: unknown key {k!r} (known: {', '.join(TWIN_KEYS)})")
    _need(not m["layers"] and not m["lm"] and all(
        m.get(k) is None for k in ("link", "seq2seq", "gin", "hetero", "graph")),
        f"{where}: a [model.twin] model is the whole model: it takes no [[model.layers]] "
        "or other model table")
    s = {**TWIN_KEYS, **m["twin"]}
    _need(s["network"] in TWIN_NETWORKS, f"{where}.network must be one of "
                                         f"{', '.join(TWIN_NETWORKS)}, got {s['network']!r}")
    c = s["channels"]
    _need(isinstance(c, list) and len(c) == 2 and all(int_in(v, 1, math.inf) for v in c),
          f"{where}.channels must be two ints >= 1, got {c!r}")


HETERO_KINDS = ("sage", "rgcn", "hgt", "han", "gat")
"""The typed models a ``[model.hetero]`` table may name."""
HETERO_KEYS = {"kind": "sage", "hidden": 64, "layers": 2, "heads": 1, "dropout": 0.0,
               "activation": "leaky_relu", "param": "full", "H": 4, "groups": 1, "rank": 1,
               "metapaths": [], "target": "", "embed": 0}
"""``[model.hetero]``: a typed node classifier (``sc.models.TypedClassifier``) for a typed graph:
``kind`` "sage" (typed SAGE, as PyG's ``to_hetero`` of SAGE: one mean-aggregated weight per
relation, a root weight per type), "rgcn" (the same typed convolution with ``param`` any
``sc.params`` form across the relations: "full", "separable" with ``H`` shared channel matrices,
PyG's ``to_hetero_with_bases``, "grouped" with ``groups``, "lowrank" with ``rank``), "hgt"
(a linear map per type, then ``layers`` ``HGTConv`` of ``heads`` heads) or "han" (``HANConv``
over the named ``metapaths``, e.g. "movie.to.actor.to.movie", or ``"mined:K"`` /
``"mined:K:L"``: the K best supported metapaths from the target type back to it, of length up
to L (default 2), mined from the graph by ``sc.basis.mine_metapaths``; attention ``dropout``)
or "gat" (PyG's ``to_hetero`` of its tutorial GAT: per relation a ``GATConv`` without self
loops, summed per target type, plus a linear map per type; ``heads`` divides ``hidden``; the
last layer gives the classes, averaged over heads, with no head after it);
``layers`` graph layers of ``hidden`` channels with ``activation`` and feature ``dropout``, a
linear head on the ``target`` node type (default: the labelled one). ``embed`` D > 0: every
node of a node type without features reads a learned D-wide vector of its own (R-GCN's
one-hot input, factored; full batch only) instead of a constant 1."""


MINED_LENGTH = 2
"""The longest mined metapath ``"mined:K"`` takes (``"mined:K:L"`` names another, up to 4)."""


def mined_metapaths(value, where: str = "model.hetero") -> tuple[int, int] | None:
    """(K, L) of a ``model.hetero.metapaths`` value ``"mined:K"`` / ``"mined:K:L"`` (K >= 1
    metapaths of length up to L in 1..4, default ``MINED_LENGTH``); None for a list of named
    sorts; ConfigError for another string."""
    if not isinstance(value, str):
        return None
    parts = value.split(":")
    ok = parts[0] == "mined" and len(parts) in (2, 3) and \
        all(p.isascii() and p.isdigit() for p in parts[1:])
    k, length = (int(parts[1]), int(parts[2]) if len(parts) == 3 else MINED_LENGTH) if ok \
        else (0, 0)
    if not ok or k < 1 or not 1 <= length <= 4:
        raise ConfigError(f"{where}.metapaths must be a list of dotted sorts "
                          f"(\"movie.to.actor.to.movie\") or \"mined:K\" / \"mined:K:L\" (the K "
                          f"best supported metapaths from the target type back to it, of length "
                          f"up to L in 1..4, default {MINED_LENGTH}), got {value!r}")
    return k, length


def hetero_spec(cfg: dict) -> dict:
    """The ``[model.hetero]`` table with its defaults filled in."""
    return {**HETERO_KEYS, **(cfg["model"].get("hetero") or {})}


def is_hetero(cfg: dict) -> bool:
    """Whether ``cfg`` describes a typed model (a ``[model.hetero]`` table)."""
    return cfg["model"].get("hetero") is not None


def _check_hetero(m: dict, where: str) -> None:
    for k in m["hetero"]:
        _need(k in HETERO_KEYS, f"{where}: unknown key {k!r} (known: {', '.join(HETERO_KEYS)})")
    _need(not m["layers"] and not m["lm"] and m.get("seq2seq") is None and m.get("gin") is None,
          f"{where}: a [model.hetero] model takes no [[model.layers]], [model.lm], "
          "[model.seq2seq] or [model.gin]")
    s = {**HETERO_KEYS, **m["hetero"]}
    _need(s["kind"] in HETERO_KINDS, f"{where}.kind must be one of {', '.join(HETERO_KINDS)}, "
                                     f"got {s['kind']!r}")
    _check_ints(s, where, ("hidden", "layers", "heads", "H", "groups", "rank"), ("embed",))
    _need(s["kind"] not in ("hgt", "han", "gat") or s["hidden"] % s["heads"] == 0,
          f"{where}.heads ({s['heads']}) must divide hidden ({s['hidden']})")
    _need(number_in(s["dropout"], 0, 1, open_hi=True),
          f"{where}.dropout must be a number in [0, 1), got {s['dropout']!r}")
    _need(s["activation"] in ACTIVATIONS, f"{where}.activation must be one of "
                                          f"{', '.join(ACTIVATIONS)}, got {s['activation']!r}")
    _need(s["param"] in P.PARAMS, f"{where}.param must be a registered form "
                                  f"({', '.join(P.PARAMS.kinds())}), got {s['param']!r}")
    mp = s["metapaths"]
    _need(mined_metapaths(mp, where) is not None or isinstance(mp, list) and
          all(isinstance(x, str) and x for x in mp),
          f"{where}.metapaths must be a list of dotted sorts (\"movie.to.actor.to.movie\"), "
          f"got {mp!r}")
    _need(bool(mp) == (s["kind"] == "han"),
          f"{where}.metapaths: kind 'han' needs at least one metapath and the other kinds "
          f"take none, got kind {s['kind']!r} with "
          f"{mp if isinstance(mp, str) else len(mp)}")
    _need(isinstance(s["target"], str), f"{where}.target must be a node type's name, got "
                                        f"{s['target']!r}")


TYPED_SAMPLER_KEYS = {"fanouts": None, "batch_size": 1024, "prefetch": 0, "replace": False}
"""``[train.sampler]`` of a ``[model.hetero]`` model: typed mini-batches (``TypedNeighborLoader``)
of ``batch_size`` seeds of the target type. ``fanouts`` one entry per graph layer in PyG's order
(fanouts[0] for the seeds' hop, i.e. the last layer), each a positive int, -1 / "all" or 0 (the
relation draws nothing at that hop): one list for every relation, or a table of such lists keyed
by edge type ``"src.rel.dst"`` or by relation name (every edge type of that relation; the edge
type's own key wins) that covers every edge type of the graph. ``prefetch`` batches built ahead
in a background thread; ``replace`` draws with replacement. Evaluation is full batch."""


def typed_sampler_spec(cfg: dict) -> dict | None:
    """A typed model's ``[train.sampler]`` table with its defaults filled in, or None."""
    s = cfg["train"].get("sampler") or {}
    return {**TYPED_SAMPLER_KEYS, **s} if s else None


def _typed_fanout_list(fs, where: str, hops: int) -> None:
    def ok(v) -> bool:
        return v == "all" or (isinstance(v, int) and not isinstance(v, bool) and v >= -1)

    _need(isinstance(fs, list) and len(fs) == hops and all(map(ok, fs)),
          f"{where} must be a list of {hops} fanouts (one per layer of model.hetero.layers = "
          f"{hops}, the first for the seeds' hop), each a positive int, -1 / \"all\" or 0, "
          f"got {fs!r}")


def _check_typed_sampler(cfg: dict, where: str) -> None:
    s, spec = cfg["train"]["sampler"], hetero_spec(cfg)
    for k in s:
        _need(k in TYPED_SAMPLER_KEYS, f"{where}: unknown key {k!r} for a [model.hetero] model "
                                       f"(known: {', '.join(TYPED_SAMPLER_KEYS)})")
    s = {**TYPED_SAMPLER_KEYS, **s}
    _need(spec["kind"] != "han",
          f"{where}: model.hetero.kind 'han' cannot be sampled: its metapath graphs join "
          "several relations, which a per-relation neighbour sample does not keep; use kind "
          "sage, rgcn or hgt, or remove [train.sampler]")
    _need(not spec["embed"],
          f"{where}: model.hetero.embed (a learned vector per node of the whole graph) trains "
          f"full batch: remove [train.sampler] or set embed = 0, got embed {spec['embed']!r}")
    _need(int_in(s["batch_size"], 1, MAX_BATCHES),
          f"{where}.batch_size must be an int in [1, {MAX_BATCHES:,}], got {s['batch_size']!r}")
    _need(int_in(s["prefetch"], 0, 64),
          f"{where}.prefetch must be an int in [0, 64], got {s['prefetch']!r}")
    _need(isinstance(s["replace"], bool),
          f"{where}.replace must be true or false, got {s['replace']!r}")
    fan, hops = s["fanouts"], spec["layers"]
    if isinstance(fan, dict):
        _need(bool(fan), f"{where}.fanouts must name at least one relation")
        for k, fs in fan.items():
            _typed_fanout_list(fs, f"{where}.fanouts[{k!r}]", hops)
    else:
        _typed_fanout_list(fan, f"{where}.fanouts", hops)


GRAPH_KINDS = ("gcn", "cheb", "sgc", "gat", "rgcn", "rgat", "heads")
"""The two-layer node classifiers of the papers a ``[model.graph]`` table may name."""
GRAPH_KEYS = {"kind": "gcn", "hidden": 16, "dropout": 0.0, "K": 2, "heads": 8, "out_heads": 1,
              "bases": 0, "attention": "within", "sorts": "single", "top": 10,
              "backtrack": True, "hops": 0, "sparse": True, "param": "auto"}
"""``[model.graph]``: a paper's two-layer node classifier (``sc.models.graph``,
``sc.models.relational_attention``, ``sc.models.mixed``) for one graph, built as the paper
has it: ``kind`` "gcn", "cheb" (``K`` Chebyshev terms), "sgc" (S^``K``), "gat" (``heads`` x
``hidden``, then ``out_heads`` averaged), "rgcn" (featureless, ``bases`` controlled-separable
bases, 0: full; ``param`` the relational weights' form: "full", "depthwise"
(``DepthwiseSeparable``), "separable" (``ControlledSeparable`` with ``bases`` = H >= 1) or
"auto" (separable where ``bases`` > 0, else full); ``sorts`` "single" or "mined" with the
``top`` mined paths of length 2, ``backtrack`` allowing r.r^-1), "rgat" (``heads`` x
``hidden``, ``attention`` "within" or "across" relations, ``bases``), "heads" (``heads``
attention heads plus index heads A^1..A^``hops``, ``hidden`` channels each; ``sparse`` input
features); ``dropout``."""
GRAPH_APPLIES = {
    "gcn": ("kind", "hidden", "dropout"),
    "cheb": ("kind", "hidden", "dropout", "K"),
    "sgc": ("kind", "K"),
    "gat": ("kind", "hidden", "dropout", "heads", "out_heads"),
    "rgcn": ("kind", "hidden", "bases", "sorts", "top", "backtrack", "param"),
    "rgat": ("kind", "hidden", "heads", "bases", "attention"),
    "heads": ("kind", "hidden", "dropout", "heads", "hops", "sparse"),
}
"""The ``[model.graph]`` keys each kind reads; a table that sets another is refused."""


def graph_spec(cfg: dict) -> dict:
    """The ``[model.graph]`` table with its defaults filled in."""
    return {**GRAPH_KEYS, **(cfg["model"].get("graph") or {})}


def is_graph(cfg: dict) -> bool:
    """Whether ``cfg`` describes a paper's node classifier (a ``[model.graph]`` table)."""
    return cfg["model"].get("graph") is not None


def _check_graph_model(m: dict, where: str) -> None:
    for k in m["graph"]:
        _need(k in GRAPH_KEYS, f"{where}: unknown key {k!r} (known: {', '.join(GRAPH_KEYS)})")
    _need(not m["layers"] and not m["lm"], f"{where}: a [model.graph] model takes no "
                                           "[[model.layers]] and no [model.lm]")
    s = {**GRAPH_KEYS, **m["graph"]}
    _need(s["kind"] in GRAPH_KINDS, f"{where}.kind must be one of {', '.join(GRAPH_KINDS)}, "
                                    f"got {s['kind']!r}")
    for k in m["graph"]:
        _need(k in GRAPH_APPLIES[s["kind"]],
              f"{where}.{k} does not apply to kind = {s['kind']!r} (its keys: "
              f"{', '.join(GRAPH_APPLIES[s['kind']])})")
    # widths and counts a CPU run can hold: the first layer of a featureless model is
    # (nodes x hidden) per relation already
    for k, lo, hi in (("hidden", 1, 4096), ("K", 1, 64), ("heads", 0, 64), ("out_heads", 1, 64),
                      ("bases", 0, 4096), ("top", 1, 10_000), ("hops", 0, 16)):
        _need(int_in(s[k], lo, hi), f"{where}.{k} must be an int in {lo}..{hi}, got {s[k]!r}")
    _need(number_in(s["dropout"], 0, 1, open_hi=True),
          f"{where}.dropout must be in [0, 1), got {s['dropout']!r}")
    _need(s["attention"] in ("within", "across"),
          f"{where}.attention must be within or across, got {s['attention']!r}")
    _need(s["sorts"] in ("single", "mined"),
          f"{where}.sorts must be single or mined, got {s['sorts']!r}")
    for k in ("backtrack", "sparse"):
        _need(isinstance(s[k], bool), f"{where}.{k} must be true or false, got {s[k]!r}")
    _need(s["kind"] not in ("gat", "rgat") or s["heads"] >= 1,
          f"{where}.heads must be >= 1 for kind = {s['kind']!r}, got {s['heads']}")
    _need(s["kind"] != "heads" or s["heads"] + s["hops"] >= 1,
          f"{where}: kind = 'heads' needs attention heads or index hops (heads + hops >= 1)")
    _check_graph_param(s, where)


GRAPH_PARAMS = ("auto", "full", "depthwise", "separable")
"""``[model.graph]``'s ``param``: the forms of an R-GCN's relational weights."""


def _check_graph_param(s: dict, where: str) -> None:
    """An R-GCN's ``param`` is a known form, and ``bases`` (H) is set for "separable" only."""
    form = s["param"]
    _need(form in GRAPH_PARAMS, f"{where}.param must be one of {', '.join(GRAPH_PARAMS)}, "
                                f"got {form!r}")
    _need(form != "separable" or s["bases"] >= 1,
          f"{where}.param = 'separable' needs bases = H >= 1 (the number of shared channel "
          f"maps), got bases = {s['bases']}")
    _need(form not in ("full", "depthwise") or s["bases"] == 0,
          f"{where}.param = {form!r} takes no bases (they are the separable form's H), got "
          f"bases = {s['bases']}: set param = 'separable' or bases = 0")


def _check_link_sorts(spec: dict, where: str) -> None:
    sorts = spec["sorts"]
    ok = sorts in ("single", "mined") or (
        isinstance(sorts, list) and sorts and all(
            isinstance(x, str) and x or int_in(x, 0, 10**9) or
            isinstance(x, list) and x and all(isinstance(u, str) and u or int_in(u, 0, 10**9)
                                              for u in x) for x in sorts))
    _need(ok, f"{where}.sorts must be \"single\", \"mined\" or a non-empty list of sorts (dotted "
              f"names such as \"r.s^-1\", lists of names or relation ids), got {sorts!r}")
    _need(sorts == "single" or spec["encoder_layers"] >= 1,
          f"{where}.sorts={sorts!r} needs an R-GCN encoder: set encoder_layers >= 1")
    _need(int_in(spec["max_length"], 2, 4),
          f"{where}.max_length must be an int in 2..4, got {spec['max_length']!r}")
    _need(int_in(spec["top"], 1, 10_000), f"{where}.top must be an int in 1..10000, "
                                          f"got {spec['top']!r}")


def _check_link_model(spec: dict, where: str) -> None:
    from .kg import DECODERS

    _need(spec["decoder"] in DECODERS, f"{where}.decoder must be one of "
                                       f"{', '.join(DECODERS)}, got {spec['decoder']!r}")
    dim, block = spec["dim"], spec["block"]
    _need(int_in(dim, 1, 1_000_000), f"{where}.dim must be an int in 1..1000000, got {dim!r}")
    _need(not (spec["decoder"] == "complex" and dim % 2),
          f"{where}.dim must be even for complex (real and imaginary halves), got {dim}")
    _need(int_in(spec["encoder_layers"], 0, 100), f"{where}.encoder_layers must be an int in "
                                                   f"0..100, got {spec['encoder_layers']!r}")
    _need(int_in(block, 1, 1_000_000), f"{where}.block must be an int >= 1, got {block!r}")
    _need(not spec["encoder_layers"] or dim % block == 0,
          f"{where}.block={block} must divide dim={dim} (block-diagonal encoder weights)")
    for k in ("reciprocal", "backtrack"):
        _need(isinstance(spec[k], bool), f"{where}.{k} must be true or false, got {spec[k]!r}")
    _need(number_in(spec["init_std"], 0, 1e3) and spec["init_std"] > 0,
          f"{where}.init_std must be a number in (0, 1000], got {spec['init_std']!r}")
    for k in ("edge_dropout", "self_dropout", "dropout"):
        _need(number_in(spec[k], 0, 1, open_hi=True),
              f"{where}.{k} must be in [0, 1), got {spec[k]!r}")
    _check_link_sorts(spec, where)


def _check_link_train(spec: dict, where: str) -> None:
    _need(spec["mode"] in ("1vsall", "negative"),
          f"{where}.mode must be 1vsall or negative, got {spec['mode']!r}")
    _need(spec["reg"] in ("n3", "l2", "none"),
          f"{where}.reg must be n3, l2 or none, got {spec['reg']!r}")
    _need(number_in(spec["label_smoothing"], 0, 1, open_hi=True),
          f"{where}.label_smoothing must be in [0, 1), got {spec['label_smoothing']!r}")
    _need(number_in(spec["reg_weight"], 0, 1e30),
          f"{where}.reg_weight must be a number in [0, 1e30], got {spec['reg_weight']!r}")
    for k, lo, hi in (("negatives", 1, 10_000), ("eval_every", 1, MAX_BATCHES),
                      ("val_limit", 0, 10**12)):
        _need(int_in(spec[k], lo, hi), f"{where}.{k} must be an int in [{lo}, {hi:,}], "
                                        f"got {spec[k]!r}")


def _check_link(cfg: dict, source: str) -> None:
    """``[model.link]`` and ``[train.link]``: keys, kinds, ranges, and what a link model
    cannot have (declared layers, a language model, a sampler)."""
    m, t = cfg["model"], cfg["train"]
    for table, keys, where in ((m["link"], LINK_KEYS, "model.link"),
                               (t.get("link", {}), LINK_TRAIN_KEYS, "train.link")):
        for k in table:
            _need(k in keys, f"{source}: {where}: unknown key {k!r} (known: {', '.join(keys)})")
    _need(not m["layers"] and not m["lm"], f"{source}: a [model.link] model takes no "
                                           "[[model.layers]] and no [model.lm]")
    _need(not t.get("sampler"), f"{source}: train.sampler samples graph neighbourhoods for "
                                "node classification; a [model.link] model trains on triples")
    _need(t["monitor"] in LINK_MONITORS,
          f"{source}: a [model.link] model is monitored by {', '.join(LINK_MONITORS)} "
          f"(filtered ranking of validation triples), got train.monitor={t['monitor']!r}: "
          "set train.monitor = \"val_mrr\"")
    _check_link_model(link_spec(cfg), f"{source}: model.link")
    _check_link_train(link_train_spec(cfg), f"{source}: train.link")


def link_spec(cfg: dict) -> dict:
    """The ``[model.link]`` table with its defaults filled in."""
    return {**LINK_KEYS, **(cfg["model"].get("link") or {})}


def link_train_spec(cfg: dict) -> dict:
    """The ``[train.link]`` table with its defaults filled in."""
    return {**LINK_TRAIN_KEYS, **(cfg["train"].get("link") or {})}


def is_link(cfg: dict) -> bool:
    """Whether ``cfg`` describes a link predictor (a ``[model.link]`` table)."""
    return cfg["model"].get("link") is not None


_LAYER_KEYS = {"type", "basis", "channels", "param", "groups", "H", "rank", "activation",
               "dropout", "bias", "pool", "residual", "norm", "route", "hidden"}


def _check_layer(layer: dict, where: str):
    for k in layer:
        _need(k in _LAYER_KEYS, f"{where}: unknown key {k!r} (known: "
                                f"{', '.join(sorted(_LAYER_KEYS))})")
    kind = layer.get("type", "conv")
    _need(kind in ("conv", "linear", "mlp"),
          f"{where}: type must be conv, linear or mlp, got {kind!r}")
    if kind == "mlp":
        hid = layer.get("hidden", 0)
        _need(int_in(hid, 0, math.inf), f"{where}: hidden must be an int >= 1 (0: four times "
              f"the channels), got {hid!r}")
    ch = layer.get("channels", "same")
    _need(ch in ("classes", "same") or int_in(ch, 1, math.inf),
          f"{where}: channels must be a positive int, 'classes' or 'same', got {ch!r}")
    act = layer.get("activation", "none")
    _need(act in ACTIVATIONS, f"{where}: unknown activation {act!r} (known: "
                              f"{', '.join(ACTIVATIONS)})")
    dp = layer.get("dropout", 0.0)
    _need(isinstance(dp, (int, float)) and 0 <= dp < 1,
          f"{where}: dropout must be in [0, 1), got {dp!r}")
    _check_param(layer.get("param", "full"), where)
    if kind == "conv":
        _need("basis" in layer, f"{where}: a conv layer needs a basis (e.g. basis = "
                                f"{{ kind = \"grid\", kernel_size = 3 }})")
        _check_basis(layer["basis"], f"{where}.basis")
    _need(layer.get("norm", "none") in ("none", "layer"),
          f"{where}: norm must be none or layer, got {layer.get('norm')!r}")
    if "pool" in layer:
        pool = layer["pool"]
        _need(isinstance(pool, (str, dict)), f"{where}: pool must be avg, max or a table like "
                                             f"{{ kind = \"max\", kernel_size = 2 }}, got {pool!r}")


def _check_param(name, where: str):
    """A layer's ``param`` names a registered or installed form, or ``package.module:function``
    (imported later, and refused where imports are not allowed: a run directory's config)."""
    if name in P.PARAMS:
        return
    if isinstance(name, str) and ":" in name:
        try:
            P.PARAMS.get(name)  # raises ImportRefused, naming the import and the source
        except ImportRefused as e:
            raise ImportRefused(f"{where}: {e}") from None
    raise ConfigError(f"{where}: unknown param {name!r} (known: "
                      f"{', '.join(P.PARAMS.kinds())}, a form installed under entry-point "
                      f"group {P.PARAMS.group!r}, or 'package.module:function')")


def import_paths(cfg: dict) -> list[str]:
    """The import paths (``package.module:function``) a validated config names as basis kinds
    (stack parts included) or param forms: the code it runs when built, which a run directory
    holding it may import only when allowed (``--allow-imports``)."""
    out: list[str] = []
    for layer in (cfg.get("model") or {}).get("layers") or []:
        param = layer.get("param")
        if isinstance(param, str) and ":" in param:
            out.append(param)
        specs = [layer["basis"]] if "basis" in layer else []
        while specs:
            spec = specs.pop()
            kind = B.as_spec(spec).get("kind") if isinstance(spec, (str, dict)) else None
            if isinstance(kind, str) and ":" in kind:
                out.append(kind)
            elif kind == "stack":
                specs.extend(spec.get("parts") or [])
    return out


def _check_basis(spec, where: str):
    """A basis table names a registered or installed kind, or ``package.module:function``
    (imported later, and refused where imports are not allowed: a run directory's config)."""
    _need(isinstance(spec, (str, dict)), f"{where}: a basis is a kind name or a table, "
                                         f"got {spec!r}")
    spec = B.as_spec(spec)
    kind = spec.get("kind")
    if kind not in B.BASES:
        try:
            B.BASES.get(kind)
        except ImportRefused as e:  # a run directory's import path: refused, as its own kind
            raise ImportRefused(f"{where}: {e}") from None
        except B.KindError as e:
            raise ConfigError(f"{where}: {e}") from None
    if kind == "stack":
        parts = spec.get("parts")
        _need(isinstance(parts, list) and parts, f"{where}: a stack needs parts = [...]")
        for i, p in enumerate(parts):
            _check_basis(p, f"{where}.parts.{i}")
    try:
        B.check(spec, where)  # the kind's own table check (its ``check`` trait)
    except B.KindError as e:
        raise ConfigError(str(e)) from None


def is_content(spec) -> bool:
    """Whether a basis table's kind is computed from content by its layer (attention)."""
    kind = B.as_spec(spec).get("kind")
    return isinstance(kind, str) and bool(B.BASES.trait(kind, "content", False))


def config_from(config, overrides=()) -> dict:
    """A validated config from a dict of tables (merged over ``DEFAULTS``), a TOML file's path
    or a shipped config's name, with ``key=value`` overrides applied (``sc.train``'s input)."""
    if isinstance(config, dict):
        cfg = validate(_merge(DEFAULTS, config), "<config dict>")
        return validate(_merge(DEFAULTS, apply_overrides(cfg, overrides)), "<config dict>") \
            if overrides else cfg
    if isinstance(config, (str, Path)):
        return load_config(config, overrides)
    raise ConfigError(f"a config is a dict, a TOML file's path or a shipped config's name, "
                      f"got {type(config).__name__}")


# -- forecasting and routing: a model table each, monitored by their own metrics ---------------
FORECAST_KEYS = {"form": "content", "context": 0, "horizon": 0, "width": 32, "heads": 4}
"""``[model.forecast]``: a ``sc.models.forecast.Forecaster`` for a univariate series dataset
(co2, elnino, sunspots, elec_equip): attention ``form`` "content", "position" or "period" (the
series' period), ``context`` steps read and ``horizon`` steps forecast (both required),
``width`` channels in ``heads`` heads. Trained on random windows of the training part (L1 on
window-scaled values), monitored by ``val_mase`` or ``val_smape`` (mean over the horizon)."""
FORECAST_MONITORS = ("val_mase", "val_smape")
ROUTING_KEYS = {"width": 128, "heads": 8, "layers": 3, "ffn": 0, "clip": 10.0}
"""``[model.routing]``: Kool et al.'s attention model (``sc.models.routing.AttentionModel``) for
a TSP dataset: ``layers`` encoder blocks of ``width`` channels in ``heads`` heads, feed-forward
``ffn`` (0: 4 x width), tanh clipping ``clip``."""
ROUTING_TRAIN_KEYS = {"warmup_epochs": 1, "bl_eval": 10_000, "alpha": 0.05, "beta": 0.8}
"""``[train.routing]``: REINFORCE with a baseline: an exponential moving average (factor
``beta``) for ``warmup_epochs`` epochs, then a frozen greedy rollout of the policy, replaced
at an epoch's end when the policy is shorter on ``bl_eval`` instances by a one-sided paired
t-test at level ``alpha``."""
#: a routing run keeps its last weights ("none", the paper's) or those of the best validation gap
ROUTING_MONITORS = ("none", "val_gap", "val_length")


def forecast_spec(cfg: dict) -> dict:
    """The ``[model.forecast]`` table with its defaults filled in."""
    return {**FORECAST_KEYS, **(cfg["model"].get("forecast") or {})}


def is_forecast(cfg: dict) -> bool:
    """Whether ``cfg`` describes a forecaster (a ``[model.forecast]`` table)."""
    return cfg["model"].get("forecast") is not None


def routing_spec(cfg: dict) -> dict:
    """The ``[model.routing]`` table with its defaults filled in."""
    return {**ROUTING_KEYS, **(cfg["model"].get("routing") or {})}


def routing_train_spec(cfg: dict) -> dict:
    """The ``[train.routing]`` table with its defaults filled in."""
    return {**ROUTING_TRAIN_KEYS, **(cfg["train"].get("routing") or {})}


def is_routing(cfg: dict) -> bool:
    """Whether ``cfg`` describes a routing model (a ``[model.routing]`` table)."""
    return cfg["model"].get("routing") is not None


def _check_task_model(cfg: dict, source: str) -> None:
    """``[model.forecast]`` or ``[model.routing]`` (with ``[train.routing]``): keys, ranges,
    the monitor, and nothing else describing the model."""
    m, t = cfg["model"], cfg["train"]
    _need(m.get("routing") is None or isinstance(m["routing"], dict),
          f"{source}: model.routing must be a table ([model.routing]), got {m['routing']!r}")
    _need(m.get("forecast") is None or isinstance(m["forecast"], dict),
          f"{source}: model.forecast must be a table ([model.forecast]), got {m['forecast']!r}")
    _need(isinstance(t.get("routing", {}), dict),
          f"{source}: train.routing must be a table ([train.routing]), got {t['routing']!r}")
    _need(not t.get("routing") or is_routing(cfg),
          f"{source}: [train.routing] trains a routing model: it needs a [model.routing] table")
    kind = "forecast" if is_forecast(cfg) else "routing"
    others = [f"[model.{k}]" for k in ("lm", "seq2seq", "gin", "forecast", "routing")
              if k != kind and m.get(k)] + (["[[model.layers]]"] if m["layers"] else []) + \
        (["[train.sampler]"] if t.get("sampler") else [])
    _need(not others, f"{source}: a [model.{kind}] model takes no {', '.join(others)}")
    keys = FORECAST_KEYS if kind == "forecast" else ROUTING_KEYS
    where = f"{source}: model.{kind}"
    for k in m[kind]:
        _need(k in keys, f"{where}: unknown key {k!r} (known: {', '.join(keys)})")
    s = {**keys, **m[kind]}
    monitors = FORECAST_MONITORS if kind == "forecast" else ROUTING_MONITORS
    _need(t["monitor"] in monitors, f"{source}: a [model.{kind}] model is monitored by "
                                    f"{' or '.join(monitors)}, got train.monitor="
                                    f"{t['monitor']!r}: set train.monitor = \"{monitors[0]}\"")
    if kind == "forecast":
        _need(s["form"] in ("content", "position", "period"),
              f"{where}.form must be content, position or period, got {s['form']!r}")
        for k, what in (("context", "reads"), ("horizon", "predicts")):
            _need(int_in(s[k], 1, 1_000_000), f"{where}.{k} (the steps a forecast {what}) "
                                              f"must be an int in 1..1000000, got {s[k]!r}")
        _check_ints({**s, "dropout": 0.0}, where, ("width", "heads"), ())
    else:
        _check_ints({**s, "dropout": 0.0}, where, ("width", "heads", "layers"), ("ffn",))
        _need(number_in(s["clip"], 0, 1e6) and s["clip"] > 0,
              f"{where}.clip must be a number in (0, 1e6], got {s['clip']!r}")
        _check_routing_train(routing_train_spec(cfg), f"{source}: train.routing")
    _need(s["width"] % s["heads"] == 0,
          f"{where}: width={s['width']} must be divisible by heads={s['heads']}")


def _check_routing_train(s: dict, where: str) -> None:
    for k in s:
        _need(k in ROUTING_TRAIN_KEYS, f"{where}: unknown key {k!r} (known: "
                                       f"{', '.join(ROUTING_TRAIN_KEYS)})")
    s = {**ROUTING_TRAIN_KEYS, **s}
    _need(int_in(s["warmup_epochs"], 0, 1_000_000),
          f"{where}.warmup_epochs must be an int in 0..1000000, got {s['warmup_epochs']!r}")
    _need(int_in(s["bl_eval"], 2, 10_000_000),
          f"{where}.bl_eval must be an int in 2..10000000, got {s['bl_eval']!r}")
    for k in ("alpha", "beta"):
        _need(number_in(s[k], 0, 1, open_hi=True) and s[k] > 0,
              f"{where}.{k} must be a number in (0, 1), got {s[k]!r}")


# -- the k-hop task: its hop curriculum ------------------------------------------------------------
DEPO_TRAIN_KEYS = {"curriculum": 0.5}
"""``[train.depo]``: how the k-hop task (the ``depo`` dataset) draws its training questions:
each one's number of hops is uniform in 1..a limit that grows from 1 to the task's max_hops
over the first ``curriculum`` fraction of the step budget (0: every k from the start)."""


def depo_train_spec(cfg: dict) -> dict:
    """The ``[train.depo]`` table with its defaults filled in."""
    return {**DEPO_TRAIN_KEYS, **(cfg["train"].get("depo") or {})}


def _check_depo_train(t: dict, source: str) -> None:
    d = t.get("depo", {})
    _need(isinstance(d, dict), f"{source}: train.depo must be a table ([train.depo]), got {d!r}")
    for k in d:
        _need(k in DEPO_TRAIN_KEYS, f"{source}: train.depo: unknown key {k!r} (known: "
                                    f"{', '.join(DEPO_TRAIN_KEYS)})")
    c = {**DEPO_TRAIN_KEYS, **d}["curriculum"]
    _need(number_in(c, 0, 1), f"{source}: train.depo.curriculum must be a number in [0, 1] (the "
                              f"fraction of the step budget over which the largest k trained "
                              f"grows to max_hops), got {c!r}")

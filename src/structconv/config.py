"""Declarative models: a TOML file -> an ``nn.Module`` built from structconv convolutions.

Each ``[[model.layers]]`` entry names its basis in the paper's terms (``grid``, ``gcn``,
``chebyshev``, ``diffusion``, ``sgc``, ``relational``, ``attention``, ``graph_attention``,
``identity`` or a ``stack`` of those), its parameter form (``full``, ``grouped``, ``depthwise``,
``separable`` with ``H``, ``lowrank`` with ``rank``), its output ``channels``, ``activation``,
``dropout`` (on the layer's input), ``pool`` and ``residual``/``norm``. See ``configs/*.toml``.
A ``[train.sampler]`` table (``SAMPLER_KEYS``) trains a node-classification model on sampled
mini-batches instead of the full graph (``structconv.minibatch``). ``[model.lm]`` describes a
language model instead of layers, ``[model.link]`` (``LINK_KEYS``) a knowledge-graph link
predictor, trained as ``[train.link]`` (``LINK_TRAIN_KEYS``) says.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from . import basis as B
from . import params as P
from ._checks import available_memory
from ._checks import gib as _gib
from .engine import convolve, featureless

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["ConfigError", "load_config", "parse_config", "apply_overrides", "build_model",
           "StructNet", "DEFAULTS", "config_path", "sampler_spec", "SAMPLER_KEYS", "GRAPH_KINDS",
           "shipped_configs", "LINK_KEYS", "LINK_TRAIN_KEYS", "LINK_MONITORS", "link_spec",
           "link_train_spec", "is_link", "build_link"]


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the bad value."""


#: defaults merged under every config (the file's values win)
DEFAULTS = {
    "seed": 0,
    "data": {"name": "digits", "root": None, "options": {}, "batch_size": 64, "seq_len": 64,
             "eval_batch_size": 512, "batches_per_epoch": 0},
    "model": {"layers": [], "readout": "auto", "classifier": "auto", "embedding": 0,
              "dtype": "float32", "lm": {}, "link": None},
    "train": {"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0, "momentum": 0.9,
              "epochs": 10, "patience": 0, "monitor": "val_acc", "grad_clip": 0.0,
              "checkpoint_every": 0, "checkpoint_seconds": 10.0, "sampler": {}, "link": {}},
}

#: ``[model.link]``: a link predictor (``sc.kg.LinkPredictor``) for a knowledge-graph dataset:
#: entity vectors of ``dim`` reals scored by ``decoder``, optionally refined by
#: ``encoder_layers`` R-GCN layers (blocks of ``block`` x ``block``) over the training graph with
#: ``sorts`` "single" (one weight per relation), "mined" (plus the ``top`` best supported paths
#: of length 2..``max_length``, as the relational basis kind) or a list of sorts by name (the
#: encoder's whole set: list the single relations too, e.g. ["p", "p^-1", "p.q"]).
LINK_KEYS = {"decoder": "distmult", "dim": 200, "reciprocal": True, "init_std": 1e-3,
             "encoder_layers": 0, "block": 5, "sorts": "single", "max_length": 2, "top": 10,
             "backtrack": True, "edge_dropout": 0.4, "self_dropout": 0.2, "dropout": 0.0}
#: ``[train.link]``: how a link predictor trains (``sc.kg.train_link``'s options): ``mode``
#: "1vsall" or "negative" (``negatives`` corruptions per positive), ``label_smoothing``,
#: ``reg`` "n3" / "l2" / "none" times ``reg_weight``; validation ranks every ``eval_every``
#: epochs the first ``val_limit`` validation triples (0: all of them).
LINK_TRAIN_KEYS = {"mode": "1vsall", "label_smoothing": 0.0, "reg": "none", "reg_weight": 0.0,
                   "negatives": 1, "eval_every": 1, "val_limit": 0}
#: what a link predictor's training may monitor (filtered, on the validation triples)
LINK_MONITORS = ("val_mrr", "val_hits@1", "val_hits@3", "val_hits@10")

#: ``[train.sampler]``: mini-batches of sampled neighbourhoods for node classification (empty:
#: full batch). ``fanouts`` one per graph layer in PyG's order: fanouts[0] is the seeds' hop,
#: i.e. the LAST graph layer's; each a positive int, -1 / "all", or a list of per-hop fanouts
#: for a multi-hop layer. ``batch_size`` seeds per mini-batch and process; ``accumulate``
#: mini-batches per optimizer step and process; ``workers`` background sampling processes;
#: ``degrees`` "full" (the full graph's normalisation) or "sample"; ``eval`` "full" (full
#: batch), "layerwise" (exact, one layer's activations at a time) or "auto".
SAMPLER_KEYS = {"fanouts": None, "batch_size": 1024, "accumulate": 1, "workers": 0,
                "degrees": "full", "eval": "auto"}
#: basis kinds a sampler can restrict, with the hops one layer of each consumes
GRAPH_KINDS = ("gcn", "sgc", "chebyshev", "diffusion", "relational", "graph_attention")

_TOP = {"seed", "name", "description", "data", "model", "train"}
_ACT = {"relu": F.relu, "gelu": F.gelu, "elu": F.elu, "tanh": torch.tanh,
        "sigmoid": torch.sigmoid, "none": None, "leaky_relu": F.leaky_relu}


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
    # defaults again under the result: an override may replace a whole table (``data={}``)
    return validate(_merge(DEFAULTS, apply_overrides(cfg, overrides)), str(p)) \
        if overrides else cfg


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
        # (a run directory written before [train.sampler] existed has no such key)
        missing = [f"{sec}.{k}" for k in DEFAULTS[sec]
                   if k not in {*cfg[sec], "sampler", "link"}]
        _need(not missing, f"{source}: missing key(s) {', '.join(missing)}")
    t = cfg["train"]
    for k in ("epochs", "patience", "checkpoint_every"):
        _need(isinstance(t[k], int) and not isinstance(t[k], bool) and t[k] >= 0,
              f"{source}: train.{k} must be an int >= 0, got {t[k]!r}")
    _need(t["epochs"] >= 1, f"{source}: train.epochs must be >= 1, got {t['epochs']}")
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
    d = cfg["data"]
    _need(isinstance(d["name"], str), f"{source}: data.name must be a string")
    _need(isinstance(d["options"], dict), f"{source}: data.options must be a table")
    for k in ("batch_size", "seq_len", "eval_batch_size"):
        _need(isinstance(d[k], int) and not isinstance(d[k], bool) and d[k] >= 1,
              f"{source}: data.{k} must be an int >= 1, got {d[k]!r}")
    bpe = d["batches_per_epoch"]
    _need(isinstance(bpe, int) and not isinstance(bpe, bool) and 0 <= bpe <= MAX_BATCHES,
          f"{source}: data.batches_per_epoch must be an int in [0, {MAX_BATCHES:,}] (0: one "
          f"pass over the data), got {bpe!r}")
    _need(isinstance(cfg["seed"], int), f"{source}: seed must be an int, got {cfg['seed']!r}")
    return _check_model(cfg, source)


def _check_model(cfg: dict, source: str) -> dict:
    """The model section (declared layers, ``[model.lm]`` or ``[model.link]``) and what
    depends on its kind: the monitor, ``[train.link]``, the sampler."""
    m, t = cfg["model"], cfg["train"]
    _need(isinstance(m["embedding"], int) and not isinstance(m["embedding"], bool)
          and m["embedding"] >= 0, f"{source}: model.embedding must be an int >= 0, "
          f"got {m['embedding']!r}")
    _need(m["classifier"] in ("auto", True, False),
          f"{source}: model.classifier must be auto, true or false, got {m['classifier']!r}")
    _need(m["dtype"] in ("float32", "float64"),
          f"{source}: model.dtype must be float32 or float64, got {m['dtype']!r}")
    _need(isinstance(m["lm"], dict), f"{source}: model.lm must be a table ([model.lm])")
    # model.link: None (no link predictor) or a table, empty for all defaults
    _need(m.get("link") is None or isinstance(m["link"], dict),
          f"{source}: model.link must be a table ([model.link]), got {m['link']!r}")
    _need(isinstance(t.get("link", {}), dict),
          f"{source}: train.link must be a table ([train.link]), got {t['link']!r}")
    if is_link(cfg):
        _check_link(cfg, source)
        return _check_rest(cfg, source)
    _need(not t.get("link"), f"{source}: [train.link] trains a link predictor: it needs a "
                             "[model.link] table")
    _need(t["monitor"] in ("val_acc", "val_loss"),
          f"{source}: train.monitor must be val_acc or val_loss, got {t['monitor']!r}"
          + (" (the val_mrr / val_hits@K monitors are for [model.link] models)"
             if t["monitor"] in LINK_MONITORS else ""))
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
    """Sample hops one declared layer consumes: None for a layer that is not a graph
    convolution (linear, mlp, or a basis of another kind), 0 for a pointwise polynomial."""
    if layer.get("type", "conv") != "conv":
        return None
    spec = _basis_spec(layer["basis"])
    kind = spec.get("kind")
    if kind not in GRAPH_KINDS:
        return None
    if kind == "sgc":
        return spec.get("hops", 2)
    if kind == "chebyshev":
        return spec.get("K", 3) - 1 if isinstance(spec.get("K", 3), int) else 0
    if kind == "diffusion":
        return spec.get("K", 2)
    if kind == "relational":
        sorts = spec.get("sorts", "single")
        if sorts == "mined":
            return spec.get("max_length", 2)
        if isinstance(sorts, list):
            return max((len(s) if isinstance(s, list) else
                        s.count(".") + 1 if isinstance(s, str) else 1 for s in sorts), default=0)
    return 1


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
    for k, low in (("batch_size", 1), ("accumulate", 1), ("workers", 0)):
        v = s[k]
        _need(isinstance(v, int) and not isinstance(v, bool) and low <= v <= MAX_BATCHES,
              f"{where}.{k} must be an int in [{low}, {MAX_BATCHES:,}], got {v!r}")
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
                              f"{_basis_spec(lay['basis']).get('kind')!r}, which cannot be "
                              f"sampled (graph kinds: {', '.join(GRAPH_KINDS)})")
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
        _check_sampler(cfg, f"{source}: train.sampler")
    _need(m["readout"] in ("auto", "flatten", "mean", "sum", "max", "none"),
          f"{source}: model.readout must be auto, flatten, mean, sum, max or none, "
          f"got {m['readout']!r}")
    return cfg


#: ``[model.lm]``: a ``sc.nn.TransformerLM`` instead of declared layers (text tasks)
_LM_KEYS = {"width": 128, "layers": 4, "heads": 4, "position": "shift", "shifts": 4, "ffn": 0,
            "dropout": 0.0, "context": 0, "bias": True, "tie_weights": True}


def _check_lm(m: dict, where: str) -> None:
    from .nn.lm import POSITIONS

    lm = m["lm"]
    for k in lm:
        _need(k in _LM_KEYS, f"{where}: unknown key {k!r} (known: {', '.join(_LM_KEYS)})")
    _need(not m["layers"], f"{where}: a [model.lm] model takes no [[model.layers]]")
    spec = {**_LM_KEYS, **lm}
    for k in ("width", "layers", "heads"):
        v = spec[k]
        _need(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1_000_000,
              f"{where}.{k} must be an int in 1..1000000, got {v!r}")
    for k in ("ffn", "context", "shifts"):
        v = spec[k]
        _need(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1_000_000,
              f"{where}.{k} must be an int in 0..1000000, got {v!r}")
    _need(spec["position"] in POSITIONS, f"{where}.position must be one of "
                                         f"{', '.join(POSITIONS)}, got {spec['position']!r}")
    _need(spec["width"] % spec["heads"] == 0,
          f"{where}: width={spec['width']} must be divisible by heads={spec['heads']}")
    _need(not (spec["position"] == "rotary" and (spec["width"] // spec["heads"]) % 2),
          f"{where}: rotary needs an even head size (width/heads), got "
          f"{spec['width'] // spec['heads']}")
    _need(not (spec["position"].startswith("shift") and spec["shifts"] < 1),
          f"{where}: position={spec['position']!r} needs shifts >= 1")
    dp = spec["dropout"]
    _need(isinstance(dp, (int, float)) and not isinstance(dp, bool) and 0 <= dp < 1,
          f"{where}.dropout must be in [0, 1), got {dp!r}")
    for k in ("bias", "tie_weights"):
        _need(isinstance(spec[k], bool), f"{where}.{k} must be true or false, got {spec[k]!r}")


def _int_in(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _number_in(v, lo: float, hi: float, open_hi: bool = False) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
        lo <= v and (v < hi if open_hi else v <= hi)


def _check_link_sorts(spec: dict, where: str) -> None:
    sorts = spec["sorts"]
    ok = sorts in ("single", "mined") or (
        isinstance(sorts, list) and sorts and all(
            isinstance(x, str) and x or _int_in(x, 0, 10**9) or
            isinstance(x, list) and x and all(isinstance(u, str) and u or _int_in(u, 0, 10**9)
                                              for u in x) for x in sorts))
    _need(ok, f"{where}.sorts must be \"single\", \"mined\" or a non-empty list of sorts (dotted "
              f"names such as \"r.s^-1\", lists of names or relation ids), got {sorts!r}")
    _need(sorts == "single" or spec["encoder_layers"] >= 1,
          f"{where}.sorts={sorts!r} needs an R-GCN encoder: set encoder_layers >= 1")
    _need(_int_in(spec["max_length"], 2, 4),
          f"{where}.max_length must be an int in 2..4, got {spec['max_length']!r}")
    _need(_int_in(spec["top"], 1, 10_000), f"{where}.top must be an int in 1..10000, "
                                          f"got {spec['top']!r}")


def _check_link_model(spec: dict, where: str) -> None:
    from .kg import DECODERS

    _need(spec["decoder"] in DECODERS, f"{where}.decoder must be one of "
                                       f"{', '.join(DECODERS)}, got {spec['decoder']!r}")
    dim, block = spec["dim"], spec["block"]
    _need(_int_in(dim, 1, 1_000_000), f"{where}.dim must be an int in 1..1000000, got {dim!r}")
    _need(not (spec["decoder"] == "complex" and dim % 2),
          f"{where}.dim must be even for complex (real and imaginary halves), got {dim}")
    _need(_int_in(spec["encoder_layers"], 0, 100), f"{where}.encoder_layers must be an int in "
                                                   f"0..100, got {spec['encoder_layers']!r}")
    _need(_int_in(block, 1, 1_000_000), f"{where}.block must be an int >= 1, got {block!r}")
    _need(not spec["encoder_layers"] or dim % block == 0,
          f"{where}.block={block} must divide dim={dim} (block-diagonal encoder weights)")
    for k in ("reciprocal", "backtrack"):
        _need(isinstance(spec[k], bool), f"{where}.{k} must be true or false, got {spec[k]!r}")
    _need(_number_in(spec["init_std"], 0, 1e3) and spec["init_std"] > 0,
          f"{where}.init_std must be a number in (0, 1000], got {spec['init_std']!r}")
    for k in ("edge_dropout", "self_dropout", "dropout"):
        _need(_number_in(spec[k], 0, 1, open_hi=True),
              f"{where}.{k} must be in [0, 1), got {spec[k]!r}")
    _check_link_sorts(spec, where)


def _check_link_train(spec: dict, where: str) -> None:
    _need(spec["mode"] in ("1vsall", "negative"),
          f"{where}.mode must be 1vsall or negative, got {spec['mode']!r}")
    _need(spec["reg"] in ("n3", "l2", "none"),
          f"{where}.reg must be n3, l2 or none, got {spec['reg']!r}")
    _need(_number_in(spec["label_smoothing"], 0, 1, open_hi=True),
          f"{where}.label_smoothing must be in [0, 1), got {spec['label_smoothing']!r}")
    _need(_number_in(spec["reg_weight"], 0, 1e30),
          f"{where}.reg_weight must be a number in [0, 1e30], got {spec['reg_weight']!r}")
    for k, lo, hi in (("negatives", 1, 10_000), ("eval_every", 1, MAX_BATCHES),
                      ("val_limit", 0, 10**12)):
        _need(_int_in(spec[k], lo, hi), f"{where}.{k} must be an int in [{lo}, {hi:,}], "
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
        _need(isinstance(hid, int) and not isinstance(hid, bool) and hid >= 0,
              f"{where}: hidden must be an int >= 1 (0: four times the channels), got {hid!r}")
    ch = layer.get("channels", "same")
    _need(ch in ("classes", "same") or (isinstance(ch, int) and not isinstance(ch, bool)
                                        and ch >= 1),
          f"{where}: channels must be a positive int, 'classes' or 'same', got {ch!r}")
    act = layer.get("activation", "none")
    _need(act in _ACT, f"{where}: unknown activation {act!r} (known: {', '.join(_ACT)})")
    dp = layer.get("dropout", 0.0)
    _need(isinstance(dp, (int, float)) and 0 <= dp < 1,
          f"{where}: dropout must be in [0, 1), got {dp!r}")
    _need(layer.get("param", "full") in P.PARAMS,
          f"{where}: unknown param {layer.get('param')!r} (known: "
          f"{', '.join(P.PARAMS.kinds())}, or 'package.module:function')")
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


def _basis_spec(spec) -> dict:
    return {"kind": spec} if isinstance(spec, str) else dict(spec)


def _check_basis(spec, where: str):
    """A basis table names a registered kind (or ``package.module:function``, imported later)."""
    _need(isinstance(spec, (str, dict)), f"{where}: a basis is a kind name or a table, "
                                         f"got {spec!r}")
    spec = _basis_spec(spec)
    kind = spec.get("kind")
    if kind not in B.BASES:
        try:
            B.BASES.get(kind)
        except B.KindError as e:
            raise ConfigError(f"{where}: {e}") from None
    if kind == "stack":
        parts = spec.get("parts")
        _need(isinstance(parts, list) and parts, f"{where}: a stack needs parts = [...]")
        for i, p in enumerate(parts):
            _check_basis(p, f"{where}.parts.{i}")


def _is_content(spec: dict) -> bool:
    return bool(B.BASES.trait(spec.get("kind"), "content", False))


def _out_grid(basis, grid):
    """The grid of a basis's output entries: its own ``out_shape``, the input's grid when the
    basis keeps the number of entries, else None (no grid: pooling and flatten need one)."""
    if grid is None:
        return None
    if basis.out_shape is not None:
        return tuple(basis.out_shape)
    return tuple(grid) if basis.N == math.prod(grid) else None


# -- layers --------------------------------------------------------------------------------------
class FixedConv(nn.Module):
    """y = Σ_k A_kᵀ x Θ_k + b for a fixed basis; x (B, M, P) -> (B, N, Q).

    ``identity_input`` convolves the identity bundle x = I (featureless nodes): then
    x·Θ_k = Θ_k, so theta's P axis runs over the M input entries.
    """

    def __init__(self, basis, Pin: int, Q: int, layer: dict, identity_input: bool = False):
        super().__init__()
        self.basis = basis
        self.param = P.build(layer, basis.K, Pin, Q)
        self.identity_input = identity_input
        self.route = layer.get("route", "auto")
        self.bias = nn.Parameter(torch.zeros(Q)) if layer.get("bias", True) else None

    def forward(self, x: Tensor) -> Tensor:
        if self.identity_input:
            y = featureless(self.basis, self.param).expand(x.shape[0], -1, -1)
        else:
            y = convolve(x, self.basis, self.param, route=self.route)
        return y if self.bias is None else y + self.bias


class AttentionConv(nn.Module):
    """Content bases from ``sc.attention``, optionally stacked with fixed bases (shift heads).

    ``attention``: A_k = softmax over inputs of the scaled dot product (``DotProduct``, masked
    causally when ``causal``), applied by ``DotProductAttention``; ``graph_attention``: GAT's
    LeakyReLU(μ_k·h_m + ν_k·h_n) on h = x Θ_k over the edges m -> n (``GraphAttention``).
    y = Σ_k A_kᵀ x Θ_k with one theta over all K = heads + fixed.
    """

    def __init__(self, spec: dict, ctx: B.Structure, Pin: int, Q: int, layer: dict,
                 where: str):
        super().__init__()
        from . import attention as att

        spec = _basis_spec(spec)
        parts = [_basis_spec(p) for p in (spec["parts"] if spec["kind"] == "stack" else [spec])]
        content = [p for p in parts if _is_content(p)]
        fixed = [p for p in parts if not _is_content(p)]
        _need(len(content) == 1, f"{where}: use one attention part (with heads = H) per layer")
        a = content[0]
        self.kind = a["kind"]
        self.heads = H = int(a.get("heads", 1))
        _need(H >= 1, f"{where}: heads must be >= 1, got {H}")
        self.fixed = B.Stack([B.build(p, ctx, f"{where}.basis") for p in fixed]) if fixed \
            else None
        K = H + (self.fixed.K if self.fixed is not None else 0)
        self.dropout = float(a.get("dropout", 0.0))
        if self.kind == "graph_attention":
            _need(ctx.edge_index is not None, f"{where}: graph_attention needs a graph dataset")
            _need(self.fixed is None, f"{where}: graph_attention cannot be stacked")
            ei = ctx.edge_index
            if a.get("add_self_loops", True):
                # GAT attends to the node itself as well
                loops = torch.arange(ctx.num_nodes).repeat(2, 1)
                ei = torch.cat([ei[:, ei[0] != ei[1]], loops], 1)
            self.register_buffer("edge_index", ei, persistent=False)
            self.num_nodes = ctx.num_nodes
            self.slope = float(a.get("negative_slope", 0.2))
            self.scores = att.GATScores(H, Q)
        else:
            self.causal = bool(a.get("causal", False))
            d = int(a.get("dim", max(1, Pin // H)))
            self.scores = att.DotProduct(H, Pin, Pin, d)
        self.param = P.build(layer, K, Pin, Q)
        self.bias = nn.Parameter(torch.zeros(Q)) if layer.get("bias", True) else None

    def content_basis(self, x: Tensor, theta: Tensor):
        """The attention part of the basis for bundle x (B, M, P): a batched sc.attention basis."""
        from . import attention as att

        p = self.dropout if self.training else 0.0
        if self.kind == "graph_attention":
            h = torch.einsum("bmp,kpq->bmkq", x, theta)  # per-head features h = x Θ_k
            s = F.leaky_relu(self.scores.edge_scores(h, h, self.edge_index), self.slope)
            basis = att.GraphAttention.from_scores(self.edge_index, s, self.num_nodes)
            if p:
                basis = att.GraphAttention(self.edge_index, F.dropout(basis.alpha, p),
                                           self.num_nodes, structure=basis.structure)
            return basis
        q, k = self.scores.project(x, x)
        return att.DotProductAttention(q, k, causal=self.causal, dropout_p=p)

    def forward(self, x: Tensor) -> Tensor:
        theta = self.param()
        H = self.heads
        y = convolve(x, self.content_basis(x, theta[:H]), theta[:H])
        if self.fixed is not None:
            y = y + convolve(x, self.fixed, theta[H:])
        return y if self.bias is None else y + self.bias


def _dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout that draws random numbers only for the nonzero entries of a sparse input.

    Zeros stay zero under dropout, so drawing only for nonzeros has the same distribution; on
    bag-of-words features (Cora: 1.3 % nonzero) it is ~10x faster than ``F.dropout`` on CPU.
    """
    if not training or not p:
        return x
    flat = x.reshape(-1)
    idx = flat.nonzero().squeeze(1)
    if idx.numel() * 4 > flat.numel():
        return F.dropout(x, p, True)
    keep = torch.rand(idx.numel(), dtype=x.dtype, device=x.device) >= p
    vals = flat[idx] * keep / (1.0 - p)
    return torch.zeros_like(flat).index_put((idx,), vals).reshape(x.shape)


class _MLP(nn.Module):
    """The Transformer's feed-forward part: two pointwise convolutions (identity basis, K = 1,
    i.e. linear maps of the channels) with an activation between; (B, M, C) -> (B, M, C)."""

    def __init__(self, channels: int, hidden: int, activation: str, bias: bool = True):
        super().__init__()
        self.inner = nn.Linear(channels, hidden, bias=bias)
        self.outer = nn.Linear(hidden, channels, bias=bias)
        self.act = _ACT[activation]

    def forward(self, x: Tensor) -> Tensor:
        h = self.inner(x)
        return self.outer(self.act(h) if self.act is not None else h)


class Block(nn.Module):
    """One declared layer: dropout on the input, the convolution, activation, pool, residual.

    ``type = "mlp"`` layers take their activation inside (between the two maps) and are
    residual unless ``residual = false``.
    """

    def __init__(self, conv: nn.Module, layer: dict, Pin: int, pool=None, pool_shape=None):
        super().__init__()
        self.conv = conv
        mlp = layer.get("type") == "mlp"
        self.act = None if mlp else _ACT[layer.get("activation", "none")]
        self.dropout = float(layer.get("dropout", 0.0))
        self.residual = bool(layer.get("residual", mlp))
        self.norm = nn.LayerNorm(Pin) if layer.get("norm", "none") == "layer" else None
        self.pool, self.pool_shape = pool, pool_shape

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x) if self.norm is not None else x
        h = _dropout(h, self.dropout, self.training)
        h = self.conv(h)
        if self.act is not None:
            h = self.act(h)
        if self.residual:
            h = h + x
        if self.pool is not None:
            h = self.pool(h)
        return h


class _Pool(nn.Module):
    """Grid pooling of a (B, H*W, C) bundle: ``avg`` is the K = 1 AvgPool basis, ``max`` torch's."""

    def __init__(self, spec: dict, in_shape: tuple, where: str):
        super().__init__()
        kind = spec.get("kind", "avg")
        _need(kind in ("avg", "max"), f"{where}: pool kind must be avg or max, got {kind!r}")
        self.kind, self.in_shape = kind, tuple(in_shape)
        ks, st = spec.get("kernel_size", 2), spec.get("stride")
        pad = spec.get("padding", 0)
        for name, v, low in (("kernel_size", ks, 1), ("stride", st, 1), ("padding", pad, 0)):
            ok = lambda u: isinstance(u, int) and not isinstance(u, bool) and u >= low  # noqa
            _need(v is None and name == "stride" or ok(v) or
                  isinstance(v, list) and len(v) == len(in_shape) and all(map(ok, v)),
                  f"{where}: {name} must be an int >= {low} or a list of {len(in_shape)}, "
                  f"got {v!r}")
        per_dim = lambda v: list(v) if isinstance(v, list) else [v] * len(in_shape)  # noqa
        # torch's rule for both pools: a window is never more than half padding
        _need(all(p <= k // 2 for p, k in zip(per_dim(pad), per_dim(ks))),
              f"{where}: padding must be at most half the kernel_size, got padding {pad!r} "
              f"with kernel_size {ks!r}")
        unknown = set(spec) - {"kind", "kernel_size", "stride", "padding"}
        _need(not unknown, f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: kind, "
                           "kernel_size, stride, padding)")
        if kind == "avg":
            self.basis = B.AvgPool(self.in_shape, ks, stride=st, padding=pad)
            self.out_shape = tuple(self.basis.out_shape)
        else:
            nd = len(self.in_shape)
            self.args = (ks, st if st is not None else ks, pad)
            fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
            self.fn = fn
            try:
                probe = fn(torch.zeros(1, 1, *self.in_shape, device="cpu"), *self.args)
            except RuntimeError as e:  # torch's own check of the sizes, named by this layer
                raise ConfigError(f"{where}: max pooling over {self.in_shape}: {e}") from None
            self.out_shape = tuple(probe.shape[2:])

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "avg":
            return self.basis.cast_like(x).propagate(x)[:, :, 0]
        Bn, M, C = x.shape
        g = x.transpose(1, 2).reshape(Bn, C, *self.in_shape)
        return self.fn(g, *self.args).reshape(Bn, C, -1).transpose(1, 2)


class StructNet(nn.Module):
    """A stack of declared layers over a bundle; input/readout set by the data's task.

    image: (B, C, H, W) -> (B, classes); node: x (N, F) -> (N, classes); text: ids (B, T) ->
    (B, T, classes).
    """

    def __init__(self, cfg: dict, info: dict):
        super().__init__()
        m = cfg["model"]
        self.task = info["task"]
        self.classes = info["num_classes"]
        ctx = B.Structure(grid=info.get("grid"), edge_index=info.get("edge_index"),
                          num_nodes=info.get("num_nodes"), edge_type=info.get("edge_type"),
                          num_relations=info.get("num_relations", 1),
                          relations=info.get("relations"))
        channels = info["channels"]
        self.embed = None
        if self.task == "text":
            d = int(m["embedding"]) or 64
            self.embed = nn.Embedding(info["vocab"], d)
            channels = d
        featureless = self.task == "node" and info.get("featureless", False)
        blocks = []
        #: activation scalars one sample keeps for the backward pass, about (memory_estimate)
        self.activation_elements = 0
        for i, layer in enumerate(m["layers"]):
            where = f"model.layers.{i}"
            ch = layer.get("channels", "same")
            Q = self.classes if ch == "classes" else channels if ch == "same" else int(ch)
            pool = None
            if layer.get("type", "conv") == "linear":
                conv = nn.Linear(channels, Q, bias=layer.get("bias", True))
            elif layer.get("type") == "mlp":
                Q = channels
                conv = _MLP(channels, int(layer.get("hidden", 0)) or 4 * channels,
                            layer.get("activation", "gelu"), layer.get("bias", True))
            else:
                spec = _basis_spec(layer["basis"])
                if any(_is_content(_basis_spec(p)) for p in spec.get("parts", [spec])):
                    _need(not (featureless and i == 0),
                          f"{where}: attention cannot take featureless input")
                    conv = AttentionConv(spec, ctx, channels, Q, layer, where)
                else:
                    basis = B.build(spec, ctx, f"{where}.basis")
                    conv = FixedConv(basis, channels, Q, layer,
                                     identity_input=featureless and i == 0)
                    ctx = replace(ctx, grid=_out_grid(basis, ctx.grid))
                if "pool" in layer:
                    _need(ctx.grid is not None, f"{where}: pool needs grid-shaped input")
                    spec_p = layer["pool"]
                    pool = _Pool({"kind": spec_p} if isinstance(spec_p, str) else dict(spec_p),
                                 ctx.grid, f"{where}.pool")
                    ctx = replace(ctx, grid=pool.out_shape)
            grid = pool.in_shape if pool is not None else ctx.grid  # the conv's output grid
            entries = math.prod(grid) if grid else (info.get("num_nodes") or 1)
            # the input's dropout copy (none for the identity input of featureless nodes), the
            # conv's output and the activation's
            pin = 0 if featureless and i == 0 else channels
            self.activation_elements += entries * (pin + 2 * Q)
            if layer.get("residual"):
                _need(Q == channels, f"{where}: residual needs channels == input channels "
                                     f"({channels}), got {Q}")
            blocks.append(Block(conv, layer, channels, pool))
            channels = Q
        self.blocks = nn.ModuleList(blocks)
        self._set_readout(m, channels, ctx.grid)

    def _set_readout(self, m: dict, channels: int, grid) -> None:
        """The readout over entries and the classifier after it, checked against the task."""
        readout = m["readout"]
        if readout == "auto":
            readout = "flatten" if self.task == "image" else "none"
        _need(not (self.task == "image" and readout == "none"),
              "model.readout=none leaves one output per grid cell, but an image task needs one "
              "per image: use flatten, mean, sum or max")
        self.readout = readout
        feat = channels * (math.prod(grid) if readout == "flatten" and grid else 1)
        clf = m["classifier"]
        if clf == "auto":
            clf = channels != self.classes or readout == "flatten"
        self.classifier = nn.Linear(feat, self.classes) if clf else None
        self.out_channels = channels

    def forward(self, x: Tensor) -> Tensor:
        if self.task == "image":
            Bn, C = x.shape[:2]
            x = x.reshape(Bn, C, -1).transpose(1, 2)  # row-major grid flattening, (B, H*W, C)
        elif self.task == "node":
            x = x.unsqueeze(0)
        else:
            x = self.embed(x)
        for blk in self.blocks:
            x = blk(x)
        if self.readout == "flatten":
            x = x.reshape(x.shape[0], -1)
        elif self.readout in ("mean", "sum", "max"):
            x = getattr(x, self.readout)(1)
            x = x.values if self.readout == "max" else x
        if self.classifier is not None:
            x = self.classifier(x)
        return x[0] if self.task == "node" else x


def data_info(data, cfg: dict) -> dict:
    """What ``build_model`` needs to know about a dataset (shapes, graph, classes)."""
    info = {"task": data.task, "num_classes": data.num_classes}
    if data.task == "image":
        C, *grid = data.shape
        info.update(channels=C, grid=tuple(grid))
    elif data.task == "node":
        info.update(channels=data.num_features, edge_index=data.edge_index,
                    num_nodes=data.num_nodes, edge_type=data.edge_type,
                    num_relations=data.num_relations, featureless=data.x is None,
                    relations=tuple(data.relations) if data.relations else None)
    else:
        info.update(channels=0, grid=(cfg["data"]["seq_len"],), vocab=len(data.vocab))
    return info


def build_lm(cfg: dict, data) -> nn.Module:
    """The ``sc.nn.TransformerLM`` of a ``[model.lm]`` table, for a text dataset; a learned
    position table covers ``context`` (default: the data's seq_len)."""
    from .nn.lm import TransformerLM

    _need(data.task == "text", f"model.lm builds a language model: it needs a text dataset, "
                               f"got a {data.task} task ({cfg['data']['name']})")
    s = {**_LM_KEYS, **cfg["model"]["lm"]}
    return TransformerLM(len(data.vocab), s["width"], s["layers"], s["heads"], s["position"],
                         s["shifts"], s["ffn"] or None, float(s["dropout"]),
                         context=s["context"] or cfg["data"]["seq_len"], bias=s["bias"],
                         tie_weights=s["tie_weights"])


def _link_sorts(spec: dict, data) -> list | None:
    """The encoder's sorts over the 2R edge types of the training graph (None: one per
    relation); "mined" mines the training graph only, so no valid/test edge shapes them."""
    from .kg import mine_sorts

    if spec["sorts"] == "single":
        return None
    if spec["sorts"] == "mined":
        ei, et = data.graph("train")
        mined = mine_sorts(ei, et, data.num_entities, relations=data.relation_names,
                           max_length=spec["max_length"], top=spec["top"], confidence=False,
                           backtrack=spec["backtrack"])
        return [(r,) for r in range(2 * data.num_relations)] + [m.sort for m in mined]
    return [tuple(x) if isinstance(x, list) else x for x in spec["sorts"]]


def build_link(cfg: dict, data) -> nn.Module:
    """The ``sc.kg.LinkPredictor`` of a ``[model.link]`` table, for a knowledge-graph dataset;
    an encoder runs over the training triples with their inverses."""
    from .kg import LinkPredictor, inverse_graph

    _need(data.task == "link", f"model.link predicts links: it needs a knowledge-graph dataset, "
                               f"got a {data.task} task ({cfg['data']['name']})")
    s = link_spec(cfg)
    layers = s["encoder_layers"]
    return LinkPredictor(data.num_entities, data.num_relations, s["dim"], s["decoder"],
                         reciprocal=s["reciprocal"], init_std=float(s["init_std"]),
                         encoder_layers=layers,
                         graph=inverse_graph(data.train, data.num_relations) if layers else None,
                         block=s["block"], sorts=_link_sorts(s, data) if layers else None,
                         relations=data.relation_names, edge_dropout=float(s["edge_dropout"]),
                         self_dropout=float(s["self_dropout"]), dropout=float(s["dropout"]))


def _link_memory(cfg: dict, data) -> dict:
    """``memory_estimate`` of a link predictor, from its sizes (mined sorts counted at ``top``):
    the entity and relation tables and encoder weights, and one batch's activations (a 1-vs-all
    batch's (batch, entities) scores with their softmax and gradient, the encoder's per-entity
    and per-edge vectors)."""
    s, lt, t = link_spec(cfg), link_train_spec(cfg), cfg["train"]
    E, R, dim, L = data.num_entities, data.num_relations, s["dim"], s["encoder_layers"]
    K = 2 * R if s["sorts"] == "single" else 2 * R + s["top"] if s["sorts"] == "mined" \
        else len(s["sorts"])
    n_params = E * dim + (2 * R if s["reciprocal"] else R) * dim + \
        L * (K * dim * s["block"] + dim * dim + dim)
    nbytes = 8 if cfg["model"]["dtype"] == "float64" else 4
    copies = 2 + {"adam": 2, "adamw": 2, "adagrad": 1}.get(t["optimizer"],
                                                           int(t["momentum"] > 0))
    B = cfg["data"]["batch_size"]
    rows = B if lt["mode"] == "1vsall" else B * (1 + lt["negatives"])
    per_batch = 6 * rows * dim + (3 * B * E if lt["mode"] == "1vsall" else 2 * rows)
    # per layer: the self part, its dropout, the output and its activation, and the messages
    # of the 2T training edges (with inverses)
    encoder = L * (4 * E * dim + 2 * 2 * data.train.shape[0] * dim)
    return {"params": n_params * nbytes * copies, "activations": (per_batch + encoder) * nbytes,
            "n_params": n_params, "batch": B, "copies": copies,
            "hint": "reduce model.link.dim or data.batch_size"}


def memory_estimate(cfg: dict, data) -> dict | None:
    """Bytes one training step of ``cfg``'s model on ``data`` needs, about: ``params``
    (weights, gradients and optimizer state) and ``activations`` (one batch, kept for the
    backward pass, and their gradients). The model is built on the meta device, so nothing is
    allocated; None when a basis cannot be built there (its estimate is then skipped)."""
    if is_link(cfg):
        return _link_memory(cfg, data)
    try:
        with torch.device("meta"):
            model = build_lm(cfg, data) if cfg["model"]["lm"] else \
                StructNet(cfg, data_info(data, cfg))
    except ConfigError:
        raise
    except Exception:  # a basis that computes on its real structure tensors: no estimate
        return None
    t, d = cfg["train"], cfg["data"]
    nbytes = 8 if cfg["model"]["dtype"] == "float64" else 4
    # weights + gradients, and Adam's two moments or SGD's momentum buffer
    copies = 2 + (2 if t["optimizer"] in ("adam", "adamw") else int(t["momentum"] > 0))
    n_params = sum(p.numel() for p in model.parameters())
    if cfg["model"]["lm"]:
        s = {**_LM_KEYS, **cfg["model"]["lm"]}
        T, w = d["seq_len"], s["width"]
        ffn = s["ffn"] or 4 * w
        # per token and layer: norms, q/k/v, attention output, residuals and the MLP's two
        # maps; per layer the (heads, T, T) attention weights; then the logits
        per_sample = T * s["layers"] * (10 * w + 2 * ffn + s["heads"] * T) \
            + 2 * T * len(data.vocab)
    else:
        per_sample = model.activation_elements
    batch = 1 if data.task == "node" else d["batch_size"]
    if data.task == "node" and sampler_spec(cfg):
        per_sample = int(per_sample * _sampled_share(cfg, data.num_nodes))
    return {"params": n_params * nbytes * copies, "activations": 2 * per_sample * batch * nbytes,
            "n_params": n_params, "batch": batch, "copies": copies}


def _sampled_share(cfg: dict, num_nodes: int) -> float:
    """The share of the graph's nodes a sampled mini-batch reaches at most: batch_size x the
    product of (1 + fanout) over the hops, capped at 1 (a fanout "all" reaches every node)."""
    s = sampler_spec(cfg)
    graph = [h for h in map(graph_layer_hops, cfg["model"]["layers"]) if h is not None]
    reach = float(s["batch_size"])
    for f, h in zip(s["fanouts"], reversed(graph)):
        for v in (f if isinstance(f, list) else [f] * (h if isinstance(h, int) else 1)):
            if v in (-1, "all"):
                return 1.0
            reach *= 1 + v
    return min(1.0, reach / max(num_nodes, 1))


def check_memory(cfg: dict, data, device: str | torch.device = "cpu") -> dict | None:
    """Refuse (ConfigError with the estimate) a run whose ``memory_estimate`` exceeds the
    memory available on ``device``; returns the estimate."""
    est = memory_estimate(cfg, data)
    free = available_memory(device)
    if est is None or free is None:
        return est
    need = est["params"] + est["activations"]
    _need(need <= free, f"the model needs about {_gib(need)} to train ({est['n_params']:,} "
                        f"parameters x{est['copies']} with gradients and optimizer state: "
                        f"{_gib(est['params'])}; activations of a batch of {est['batch']}: "
                        f"{_gib(est['activations'])}), more than the {_gib(free)} available "
                        f"on this machine: "
                        f"{est.get('hint', 'reduce channels, layers or data.batch_size')}")
    return est


def build_model(cfg: dict, data) -> nn.Module:
    """The model described by ``cfg['model']`` for ``data`` (a registry dataset)."""
    try:
        model = build_link(cfg, data) if is_link(cfg) else build_lm(cfg, data) \
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

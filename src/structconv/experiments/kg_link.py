"""Recipe: link prediction on FB15k-237 / WN18RR, filtered MRR and Hits@1/3/10 on the full test set.

``structconv reproduce kg-link --dataset fb15k-237 --decoder distmult --mode 1vsall --out runs``
trains ``sc.kg.LinkPredictor`` (entity table, optionally R-GCN layers over the training graph
with its inverses and ``--sorts mined`` 2-sorts) and ranks every test triple in both directions
against all entities, filtered by train + valid + test (``sc.kg.evaluate``). Validation MRR is
logged every ``--eval-every`` epochs (full filtered validation set) for the learning curve; the
test set is scored once, at the end, always in full. ``--time-limit`` stops training at an
epoch's end; the run checkpoints every epoch and continues when started again with the same
``--out`` (``<out>/kg_link/<tag>/``). Writes ``<out>/kg_link/<tag>/result.json``.

The size and count options are bounded above by their types (a value past a sensible maximum
is refused at once, by name); every argument is then checked by the config schema
(``structconv.config.validate``, as the ``[model.link]`` / ``[train.link]`` keys they stand
for) before anything is read. A run folder is keyed by every setting that changes what it
computes (``KEYED`` and the data's digest, written to ``settings.json``): continuing a folder
with other settings is refused, naming each one.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import re
import time
from pathlib import Path

import torch
from torch import Tensor

from ..config import (
    ConfigError,
    apply_overrides,
    link_train_spec,
    load_config,
    validate,
)
from ..data.kg import load_kg
from ..data.registry import data_root
from ..io import atomic_write_json
from ..kg import LinkPredictor, link_metrics
from ..models import build_model
from ..training import train_link
from ..training.checkpoint import CHECKPOINT_JSON
from ._common import Bounded, hardware, param_count, publish, run_lock, set_threads

__all__ = ["add_arguments", "run", "PUBLISHED", "KEYED", "check_arguments", "run_settings",
           "check_settings", "SETTINGS_JSON", "CONFIGS", "FIXED", "base_config", "overrides",
           "link_config"]

#: published filtered test MRR (REFERENCES.md)
PUBLISHED = {
    ("fb15k-237", "distmult", "negative", 2): 0.248,  # R-GCN + DistMult
    ("fb15k-237", "distmult", "negative", 0): 0.191,
    ("fb15k-237", "distmult", "1vsall", 0): 0.343,
    ("fb15k-237", "complex", "1vsall", 0): 0.348,
    ("wn18rr", "distmult", "1vsall", 0): 0.452,
    ("wn18rr", "complex", "1vsall", 0): 0.475,
}
_NAMES = {"fb15k-237": "FB15k-237", "wn18rr": "WN18RR"}


#: the defaults of ``--quick`` (a value given on the command line is kept): a smoke test of a
#: minute on two cores, where 1-vs-all scoring of every entity takes minutes an epoch
QUICK = dict(epochs=1, dim=16, mode="negative", batch=4000)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", choices=sorted(_NAMES), default="wn18rr")
    parser.add_argument("--data", default=None, help="folder with train/valid/test.txt (default "
                                                     "kg/<name>/ in the data home, see "
                                                     "`structconv datasets`)")
    parser.add_argument("--decoder", choices=["distmult", "complex"], default="distmult")
    parser.add_argument("--mode", choices=["1vsall", "negative"], default="1vsall")
    parser.add_argument("--dim", type=Bounded(int, hi=4096), default=200,
                        help="entity vector size (reals)")
    parser.add_argument("--init-std", type=float, default=1e-3,
                        help="initial scale of entity and relation vectors (1e-3 suits "
                             "1-vs-all with N3; an R-GCN trained by negative sampling needs "
                             "~0.1: DistMult's gradients are products of two vectors)")
    parser.add_argument("--epochs", type=Bounded(int, hi=100000), default=100)
    parser.add_argument("--batch", type=Bounded(int, hi=10**6), default=1000)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--optimizer", choices=["adam", "adagrad"], default="adagrad")
    parser.add_argument("--reg", choices=["n3", "l2", "none"], default="n3")
    parser.add_argument("--reg-weight", type=float, default=5e-2)
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--negatives", type=Bounded(int, hi=1000), default=1,
                        help="negatives per positive")
    parser.add_argument("--encoder-layers", type=Bounded(int, hi=16), default=0,
                        help="R-GCN layers (0: none)")
    parser.add_argument("--sorts", choices=["single", "mined"], default="single",
                        help="encoder sorts: every relation alone, or plus --top mined 2-sorts")
    parser.add_argument("--top", type=Bounded(int, hi=10000), default=10)
    parser.add_argument("--block", type=Bounded(int, hi=4096), default=5,
                        help="encoder block size (block-diagonal weights, block x block)")
    parser.add_argument("--edge-dropout", type=float, default=0.4)
    parser.add_argument("--time-limit", type=float, default=None, help="seconds of training")
    parser.add_argument("--eval-every", type=Bounded(int, hi=100000), default=2)
    parser.add_argument("--eval-batch", type=Bounded(int, hi=10**6), default=512)
    parser.add_argument("--threads", type=Bounded(int, hi=4096), default=0,
                        help="torch threads (0: default)")
    parser.add_argument("--tag", default=None, help="run folder name (default from settings)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: by default 1 epoch, --dim 16, --mode negative, "
                             "--batch 4000")


#: each option's key in a link config: the options are checked by the config schema, so a value
#: a [model.link] / [train.link] config refuses is refused here too (the error names the option)
CONFIG_KEYS = {
    "decoder": "model.link.decoder", "dim": "model.link.dim", "init_std": "model.link.init_std",
    "encoder_layers": "model.link.encoder_layers", "sorts": "model.link.sorts",
    "top": "model.link.top", "block": "model.link.block",
    "edge_dropout": "model.link.edge_dropout", "mode": "train.link.mode",
    "reg": "train.link.reg", "reg_weight": "train.link.reg_weight",
    "label_smoothing": "train.link.label_smoothing", "negatives": "train.link.negatives",
    "eval_every": "train.link.eval_every", "epochs": "train.epochs", "lr": "train.lr",
    "optimizer": "train.optimizer", "batch": "data.batch_size",
    "eval_batch": "data.eval_batch_size", "seed": "seed",
}
#: the options that change what a run computes (its model and scores at every epoch): a run
#: folder holds one combination of them. Not keyed: how long it trains (--epochs, --quick,
#: --time-limit) and how it reports (--eval-every, --eval-batch, --threads), which a continued
#: run may change; and --data, keyed by the content it holds instead of its path
KEYED = ("dataset", "decoder", "mode", "dim", "init_std", "batch", "lr", "optimizer", "reg",
         "reg_weight", "label_smoothing", "negatives", "encoder_layers", "sorts", "top", "block",
         "edge_dropout", "seed")
#: a run folder's settings (``run_settings``), written when it starts
SETTINGS_JSON = "settings.json"
#: seeds as numpy takes them; the epoch seed rule (structconv.seeds) multiplies them further
MAX_SEED = 2**32 - 1


def _flag(attr: str) -> str:
    return "--" + attr.replace("_", "-")


#: the shipped config an arm starts from: (dataset, encoder) -> name; the options are then set
#: over it as overrides (``overrides``), so every arm is a shipped config plus overrides
CONFIGS = {("fb15k-237", False): "distmult_fb15k237", ("wn18rr", False): "complex_wn18rr",
           ("fb15k-237", True): "rgcn_distmult_fb15k237",
           ("wn18rr", True): "rgcn_distmult_fb15k237"}
#: what this recipe has always trained with and no option sets, over whichever config an arm
#: starts from (the R-GCN config clips gradients, one vector per relation and ranks 2000
#: validation triples; the recipe did not), and the mining it did (no backtracking paths)
FIXED = ("model.link.reciprocal=true", "model.link.self_dropout=0.2", "model.link.dropout=0.0",
         "model.link.max_length=2", "model.link.backtrack=false", "train.grad_clip=0.0",
         "train.link.val_limit=0", 'train.monitor="val_mrr"')


def base_config(args) -> str:
    """The shipped config the arm of ``args`` starts from (``CONFIGS``)."""
    return CONFIGS[(args.dataset, bool(args.encoder_layers))]


def _values(args, epochs: int) -> dict:
    """Each config key the options set, with its value (``CONFIG_KEYS``, and the dataset)."""
    values = {**vars(args), "epochs": epochs, "seed": 0 if args.seed is None else args.seed}
    return {"data.name": args.dataset,
            **{key: values[attr] for attr, key in CONFIG_KEYS.items()}}


def overrides(args, epochs: int) -> list[str]:
    """The arm's ``key=value`` overrides of its shipped config (``base_config``): the options'
    values, then ``FIXED``."""
    return [f"{k}={_toml(v)}" for k, v in _values(args, epochs).items()] + list(FIXED)


def _toml(v) -> str:
    return repr(v) if isinstance(v, float) else json.dumps(v)


def link_config(args, epochs: int) -> dict:
    """The config a run trains: the arm's shipped config with the options' values and ``FIXED``
    set over it, validated as ``reproduce kg-link`` (ConfigError naming the key)."""
    cfg = apply_overrides(load_config(base_config(args)), FIXED)
    for key, value in _values(args, epochs).items():
        *path, last = key.split(".")
        node = cfg
        for part in path:
            node = node[part]
        node[last] = value
    cfg["name"] = f"kg-link-{base_config(args)}"
    return validate(cfg, "reproduce kg-link")


def _named_as_options(message: str) -> str:
    """A schema error about the config keys the options stand for, naming the options."""
    flags = {key: _flag(attr) for attr, key in CONFIG_KEYS.items()}
    keys = "|".join(map(re.escape, sorted(flags, key=len, reverse=True)))
    message = re.sub(rf"(?<![\w.-])({keys})(?![\w.])", lambda m: flags[m.group(1)], message)
    # a bare key in a hint ("set encoder_layers >= 1", "must divide dim=200")
    bare = "|".join(map(re.escape, (a for a in CONFIG_KEYS if a != "seed")))
    return re.sub(rf"(?<![\w.-])({bare})(?=\s*>?=)", lambda m: _flag(m.group(1)), message)


def check_arguments(args) -> None:
    """Every option checked before anything is read: ConfigError (one line naming the option
    and its value) for a value the link config schema refuses, or that this recipe cannot
    use (--time-limit, --threads, --tag, --seed)."""
    where = "reproduce kg-link"
    try:
        link_config(args, args.epochs)
    except ConfigError as e:
        raise ConfigError(_named_as_options(str(e))) from None
    seed = 0 if args.seed is None else args.seed
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{where}: --seed must be an int in [0, {MAX_SEED}], got {seed}")
    t = args.time_limit
    if t is not None and not (math.isfinite(t) and t > 0):
        raise ConfigError(f"{where}: --time-limit must be a number of seconds > 0, got {t}")
    cores = os.cpu_count() or 1
    if not 0 <= args.threads <= cores:
        raise ConfigError(f"{where}: --threads must be in [0, {cores}] (0: torch's default; "
                          f"this machine has {cores} cores), got {args.threads}")
    tag = args.tag
    if tag is not None and (not tag or tag in (".", "..") or Path(tag).name != tag
                            or any(c in tag for c in "/\\\0")):
        raise ConfigError(f"{where}: --tag must be a plain folder name (no path), got {tag!r}")


def run(args) -> int:
    check_arguments(args)
    set_threads(args)
    name = _NAMES[args.dataset]
    root = Path(args.data) if args.data else (data_root() or Path(".")) / "kg" / name
    data = load_kg(root)
    data.task = "link"
    cfg = link_config(args, args.epochs)
    tag = args.tag or (f"{args.dataset}-{args.decoder}-{args.mode}-d{args.dim}"
                       f"-enc{args.encoder_layers}" + ("-mined" if args.sorts == "mined" else "")
                       + (f"-block{args.block}" if args.encoder_layers and args.block != 5
                          else ""))
    folder = Path(args.out) / "kg_link" / tag
    # one process trains a folder at a time (a second is refused by name)
    with run_lock(folder.parent, tag, "kg-link"):
        check_settings(folder, run_settings(args, data))
        atomic_write_json(folder / "config.json", cfg)
        torch.manual_seed(cfg["seed"])
        model = build_model(cfg, data)
        mined = model.mined_sorts
        if mined:
            print(f"mined 2-sorts (training graph only): {', '.join(m.name for m in mined)}")
        print(f"{data}: {tag}, {param_count(model):,} parameters")
        _train_and_test(args, cfg, data, model, folder, tag, mined)
    return 0


def data_digest(data) -> str:
    """sha256 of a knowledge graph's content: entity and relation names (their ids) and the
    triples of every split."""
    h = hashlib.sha256()
    for names in (data.entities, data.relations):
        h.update(json.dumps(names, ensure_ascii=False).encode("utf-8"))
    for split in ("train", "valid", "test"):
        t = getattr(data, split).to(torch.int64).contiguous()
        h.update(f"{split}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def run_settings(args, data) -> dict:
    """What a run computes, by option (``KEYED``; None where an option has no effect under
    the others), and the digest of its data."""
    s = {k: getattr(args, k) for k in KEYED}
    s["seed"] = 0 if args.seed is None else args.seed
    if not args.encoder_layers:  # no R-GCN encoder: no blocks, edge dropout or sorts
        s["block"] = s["edge_dropout"] = s["top"] = None
    if args.sorts != "mined":  # --top picks mined sorts only
        s["top"] = None
    if args.mode != "negative":  # corruptions are drawn in negative sampling only
        s["negatives"] = None
    if args.reg == "none":
        s["reg_weight"] = None
    return {**s, "data": data_digest(data)}


def check_settings(folder: Path, settings: dict) -> None:
    """Start ``folder`` with ``settings`` (written to ``settings.json``), or continue it when
    it holds a run of the same settings; a run of other settings (or of unrecorded ones) is
    refused (ConfigError naming each differing setting, its two values and how to start
    fresh)."""
    path = folder / SETTINGS_JSON
    started = (folder / CHECKPOINT_JSON).is_file() or (folder / "result.json").is_file()
    fresh = (f"start fresh with another --tag (or --out), or delete {folder}")
    if started:
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"reproduce kg-link: {folder} holds a run whose settings were not "
                              f"recorded (no {SETTINGS_JSON}): it cannot be continued safely; "
                              f"{fresh}") from None
        except (OSError, ValueError, RecursionError) as e:
            raise ConfigError(f"reproduce kg-link: {path}: unreadable ({str(e)[:200]}); "
                              f"{fresh}") from None
        if not isinstance(saved, dict):
            raise ConfigError(f"reproduce kg-link: {path}: unreadable (a JSON object of "
                              f"settings expected, got {type(saved).__name__}); {fresh}")
        diff = [k for k in sorted(set(saved) | set(settings)) if saved.get(k) != settings.get(k)]
        if diff:
            more = f"; and {len(diff) - 20} more" if len(diff) > 20 else ""
            raise ConfigError(f"reproduce kg-link: {folder} holds a run with other settings: "
                              + "; ".join(_difference(k, saved.get(k), settings.get(k))
                                          for k in diff[:20])
                              + f"{more}; continue it with its settings, or {fresh}")
        return
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, settings)


def _difference(key: str, was, now) -> str:
    def show(v):  # a hand-edited settings.json may hold anything: shown short
        if v is None:
            return "(no effect)"
        text = " ".join(str(v).split())  # on one line
        return f"{text[:12]}..." if key == "data" else text[:80]

    name = ("the data (its content)" if key == "data" else _flag(key) if key in KEYED
            else f"setting {ascii(key)[:80]}")
    return f"{name} {show(was)} in the run, {show(now)} now"


def _train_and_test(args, cfg: dict, data, model, folder: Path, tag: str, mined) -> None:
    """Train (resuming from ``folder``), then rank the full test set; writes result.json."""
    known = torch.cat([data.train, data.valid, data.test])
    tr, lt = cfg["train"], link_train_spec(cfg)

    def valid(epoch):
        t = time.perf_counter()
        m = link_metrics(model, data.valid, known, cfg["data"]["eval_batch_size"])
        m["eval_seconds"] = time.perf_counter() - t
        return m

    # the untrained encoder: what each sort's share is before training (sorts reaching more
    # nodes start larger, so the usage report compares against it)
    init = copy.deepcopy(model) if model.layers else None
    t0 = time.perf_counter()
    history = train_link(model, data.train, mode=lt["mode"], epochs=tr["epochs"],
                         batch_size=cfg["data"]["batch_size"], lr=tr["lr"],
                         optimizer=tr["optimizer"], label_smoothing=lt["label_smoothing"],
                         reg=lt["reg"], reg_weight=lt["reg_weight"], negatives=lt["negatives"],
                         seed=cfg["seed"], time_limit=args.time_limit, valid=valid,
                         eval_every=lt["eval_every"], log=lambda s: print("  " + s, flush=True),
                         checkpoint_dir=folder)
    train_wall = time.perf_counter() - t0
    t = time.perf_counter()
    test = link_metrics(model, data.test, known, cfg["data"]["eval_batch_size"])
    eval_wall = time.perf_counter() - t
    pub = PUBLISHED.get((args.dataset, args.decoder, args.mode, args.encoder_layers))
    result = dict(recipe="kg-link", dataset=data.name, tag=tag,
                  settings=vars(args) | {"epochs": tr["epochs"]},
                  config=base_config(args), overrides=overrides(args, tr["epochs"]),
                  parameters=param_count(model), epochs_done=len(history),
                  train_seconds=sum(h["seconds"] for h in history), wall_seconds=train_wall,
                  test=test, test_eval_seconds=eval_wall, published_mrr=pub, history=history,
                  mined=[m.as_dict() for m in mined], hardware=hardware(),
                  torch=torch.__version__)
    if model.layers:
        result["sort_usage"] = _sort_usage(model, init, data.relation_names, mined)
    publish(folder / "result.json", result)
    print(f"test (filtered, {2 * len(data.test)} rankings, {eval_wall:.1f} s): "
          f"MRR {test['mrr']:.4f}  H@1 {test['hits@1']:.4f}  H@3 {test['hits@3']:.4f}  "
          f"H@10 {test['hits@10']:.4f}  (raw MRR {test['raw_mrr']:.4f}); published "
          f"{pub if pub is not None else '-'}; {len(history)} epochs")
    print(f"wrote {folder / 'result.json'}")


def _shares(model: LinkPredictor) -> tuple[Tensor, Tensor]:
    c = model.sort_contributions()
    return c, (c / c.sum(1, keepdim=True)).mean(0)


def _sort_usage(model: LinkPredictor, init: LinkPredictor, names, mined, top: int = 8) -> dict:
    """Which sorts the trained encoder relies on: each sort's share of the norm of the sort
    terms ``A_kᵀ x Θ_k`` (``LinkPredictor.sort_contributions``), mean over layers, by name, with
    its share in the untrained encoder, and the rank of every mined sort among all K."""
    from ..basis.sorts import sort_name

    sorts = model.layers[0].sorts or [(r,) for r in range(len(names))]
    c, share = _shares(model)
    _, share0 = _shares(init)
    order = torch.argsort(share, descending=True).tolist()
    rank = {k: i + 1 for i, k in enumerate(order)}
    top_sorts = [(sort_name(sorts[k], names), float(share[k]), float(share0[k]))
                 for k in order[:top]]
    first_mined = len(sorts) - len(mined)
    mined_ranks = [(m.name, rank[first_mined + i], float(share[first_mined + i]),
                    float(share0[first_mined + i])) for i, m in enumerate(mined)]
    print(f"most used sorts (share of the sort terms' norm, mean over layers, trained <- "
          f"untrained; uniform {1 / len(sorts):.4f}): "
          + ", ".join(f"{n} {v:.4f} <- {v0:.4f}" for n, v, v0 in top_sorts))
    if mined_ranks:
        total, total0 = (sum(m[i] for m in mined_ranks) for i in (2, 3))
        print(f"mined 2-sorts' ranks among {len(sorts)}: "
              + ", ".join(f"{n} #{r} ({v:.4f})" for n, r, v, _ in mined_ranks)
              + f"; their total share {total:.4f} (untrained {total0:.4f})")
    return dict(measure="share of sum_k ||A_k^T x Theta_k||_F, mean over layers; "
                        "(name, share, untrained share)",
                sorts=len(sorts), top=top_sorts, mined=mined_ranks,
                mined_share=sum(m[2] for m in mined_ranks),
                mined_share_untrained=sum(m[3] for m in mined_ranks), per_layer=c.tolist())

"""The tasks a run trains, one file each; ``task_for`` picks a run's task once, from its data.

A dataset says what it is (``data.task``) and the config what model it describes: ``load_data``
refuses a pair that cannot train together, ``task_for`` returns the task object (a
``[train.sampler]`` node run samples its batches; a typed graph trains ``TypedNodeTask``). A
new task is one new file and one entry in ``TASKS``.
"""

from __future__ import annotations

from torch import nn

from ...config import (
    ConfigError,
    is_forecast,
    is_gin,
    is_hetero,
    is_link,
    is_routing,
    is_seq2seq,
    sampler_spec,
)
from ...data.registry import load_dataset
from ..minibatch import SampledEval
from .base import ItemTask, Task
from .forecast import ForecastTask
from .graph import GraphTask
from .hops import HopTask
from .image import ImageTask
from .link import LinkTask, TripleTask, evaluate_link, train_link
from .node import NodeTask, SampledNodeTask
from .routing import RoutingTask
from .seq2seq import Seq2SeqTask, decode_result
from .text import TextTask
from .typed import TypedNodeTask
from .typed_sampled import SampledTypedNodeTask

__all__ = ["TASKS", "Task", "ItemTask", "ImageTask", "GraphTask", "NodeTask", "SampledNodeTask",
           "TextTask", "TypedNodeTask", "LinkTask", "TripleTask", "Seq2SeqTask", "task_for",
           "load_data", "SampledTypedNodeTask",
           "check_train_split", "evaluate", "evaluate_link", "decode_result", "train_link",
           "ForecastTask", "RoutingTask", "HopTask"]

#: a dataset's ``task`` -> the task that trains on it
TASKS: dict[str, type[Task]] = {"image": ImageTask, "node": NodeTask, "text": TextTask,
                                "link": LinkTask, "g2p": Seq2SeqTask, "graph": GraphTask,
                                "series": ForecastTask, "routing": RoutingTask,
                                "hetero": TypedNodeTask, "depo": HopTask}


def load_data(cfg: dict):
    """The dataset named by ``cfg['data']`` (image, node, text, link, g2p or graph task), refused
    (ConfigError) where the config's model cannot train on it."""
    d = cfg["data"]
    try:
        data = load_dataset(d["name"], d.get("root"), **d.get("options", {}))
    except TypeError as e:  # an option the loader does not take
        raise ConfigError(f"data.options for {d['name']!r}: {e}") from None
    task = getattr(data, "task", None)
    if is_link(cfg) and task != "link":
        raise ConfigError(f"model.link predicts links: it needs a knowledge-graph dataset "
                          f"(fb15k-237, wn18rr or a folder of train/valid/test.txt triples), but "
                          f"dataset {d['name']!r} is a {task} task")
    if task == "link" and not is_link(cfg):
        raise ConfigError(f"dataset {d['name']!r} is a link-prediction task: describe the model "
                          "with a [model.link] table (decoder, dim, ...), not layers")
    if task == "g2p" and not is_seq2seq(cfg):
        raise ConfigError(f"dataset {d['name']!r} maps words to pronunciations: describe the "
                          "model with a [model.seq2seq] table (kind, width, ...), not layers")
    if is_seq2seq(cfg) and task != "g2p":
        raise ConfigError(f"model.seq2seq maps a sequence to a sequence: it needs a "
                          f"grapheme-to-phoneme dataset (cmudict), but dataset {d['name']!r} is "
                          f"a {task} task")
    _check_graph(cfg, d["name"], task)
    if (task == "hetero") != is_hetero(cfg):
        raise ConfigError(f"dataset {d['name']!r} is a typed graph: describe the model with a "
                          "[model.hetero] table (kind, hidden, ...)" if task == "hetero" else
                          f"model.hetero classifies the nodes of a typed graph (dblp, imdb), "
                          f"but dataset {d['name']!r} is a {task} task")
    _check_pair(is_forecast(cfg), task == "series", d["name"], task, "model.forecast",
                "forecasts a series: it needs a series dataset (co2, elnino, sunspots, "
                "elec_equip)")
    _check_pair(is_routing(cfg), task == "routing", d["name"], task, "model.routing",
                "builds tours: it needs a TSP dataset (tsp)")
    _check_hops(cfg, d["name"], task)
    if task not in TASKS:
        raise ConfigError(f"dataset {d['name']!r} is a {task or '?'} task; train handles "
                          f"{', '.join(TASKS)} tasks")
    if sampler_spec(cfg) and TASKS[task] not in (NodeTask, TypedNodeTask):
        raise ConfigError(f"train.sampler samples graph neighbourhoods, but dataset "
                          f"{d['name']!r} is a {task} task: use a node-classification "
                          "(graph) dataset or remove [train.sampler]")
    return data


def _check_graph(cfg: dict, name: str, task) -> None:
    """A graph-level dataset trains a [model.gin] model, and that model nothing else."""
    if task == "graph" and not is_gin(cfg):
        raise ConfigError(f"dataset {name!r} is a graph-level task (many graphs): describe "
                          "the model with a [model.gin] table (hidden, layers, readout, ...)")
    if is_gin(cfg) and task != "graph":
        raise ConfigError(f"model.gin reads batches of graphs: it needs a graph-level dataset "
                          f"(tu-mutag, tu-proteins, tu-nci1, hiv), but dataset {name!r} is a "
                          f"{task} task")


def _check_hops(cfg: dict, name: str, task) -> None:
    """The k-hop task trains a [model.lm] model, and [train.depo] is for it alone."""
    if task == "depo" and not cfg["model"]["lm"]:
        raise ConfigError(f"dataset {name!r} is the k-hop task: describe the model with a "
                          "[model.lm] table (width, layers, heads, position, ...)")
    if task != "depo" and cfg["train"].get("depo"):
        raise ConfigError(f"[train.depo] sets the hop curriculum of the k-hop task: it needs "
                          f"the depo dataset, but dataset {name!r} is a {task} task")


def _check_pair(model: bool, data: bool, name: str, task, table: str, needs: str) -> None:
    """A task that one model table describes: that table, and it nothing else."""
    if model and not data:
        raise ConfigError(f"{table} {needs}, but dataset {name!r} is a {task} task")
    if data and not model:
        raise ConfigError(f"dataset {name!r} is a {task} task: describe the model with a "
                          f"[{table}] table")


def task_for(cfg: dict, data) -> Task:
    """The task of a run of ``cfg`` on ``data`` (as ``load_data`` returns it)."""
    cls = TASKS[data.task]
    if cls is NodeTask and sampler_spec(cfg):
        cls = SampledNodeTask
    if cls is TypedNodeTask and sampler_spec(cfg):
        cls = SampledTypedNodeTask
    return cls(cfg, data)


def check_train_split(data) -> None:
    """Refuse (ConfigError) a dataset whose training split is empty: nothing can train."""
    if TASKS[data.task].train_size(data) == 0:
        raise ConfigError(f"the train split of {data.name} is empty: there is nothing to train "
                          "on (check data.options: the split sizes or the limit)")


def evaluate(model: nn.Module, data, cfg: dict, split: str, device=None,
             sampled: SampledEval | None = None) -> dict:
    """``{loss, acc, n}`` of a model on a split (mean cross-entropy, accuracy). A model
    trained on sampled mini-batches is evaluated exactly by ``sampled`` (a ``SampledEval``,
    made here when not given)."""
    task = task_for(cfg, data)
    if isinstance(task, SampledNodeTask):
        task.sampled = sampled
    return task.evaluate(model, split, device)

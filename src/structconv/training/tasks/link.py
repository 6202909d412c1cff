"""Link prediction on a knowledge graph's triples: batches of training queries, ranked validation.

An epoch passes over the training queries (each triple, and its inverse (t, r + R, h) for
1-vs-all or a reciprocal decoder) in the order drawn from (seed, epoch), a step per batch,
scored by ``sc.kg``'s objective (1-vs-all or negative sampling, label smoothing, N3/L2); the
epoch's generator also draws the negatives, so a mid-epoch checkpoint keeps its state.
``LinkTask`` is a ``[model.link]`` config's task (filtered validation ranking every
``eval_every`` epochs); ``train_link`` trains a ``LinkPredictor`` on a tensor of triples with the
same loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from ...config import link_train_spec
from ...kg import LinkObjective, check_triples, link_loss, link_metrics, training_queries
from ..checkpoint import CHECKPOINT_JSON
from ..loop import Loop
from ..optim import epoch_generator, make_optimizer
from ..runlog import LINK_PANELS
from .base import Task

__all__ = ["LinkTask", "TripleTask", "evaluate_link", "train_link", "RANKS"]

#: the trainer's split names -> a knowledge graph's
KG_SPLITS = {"train": "train", "val": "valid", "test": "test"}
RANKS = ("mrr", "hits@1", "hits@3", "hits@10")


def link_known(data) -> Tensor:
    """The filter of the standard filtered setting: every true triple of every split."""
    return torch.cat([data.train, data.valid, data.test])


@torch.no_grad()
def evaluate_link(model: nn.Module, data, cfg: dict, split: str, limit: int = 0,
                  known: Tensor | None = None) -> dict:
    """Filtered and raw MRR, MR and Hits@1/3/10 (``sc.kg.evaluate``, both directions, filtered
    by train + valid + test) of a link predictor on ``split`` (``val``: the valid triples), its
    first ``limit`` triples (0: all); ``n`` is the number of rankings."""
    triples = data.split(KG_SPLITS[split])
    if limit:
        triples = triples[:limit]
    dev, was = next(model.parameters()).device, model.training
    known = link_known(data) if known is None else known
    m = link_metrics(model, triples.to(dev), known, cfg["data"]["eval_batch_size"])
    model.train(was)
    return {**m, "n": 2 * int(triples.shape[0])}


class TripleTask(Task):
    """Training queries of ``triples`` in batches of ``batch_size`` scored by ``objective``;
    ``valid(epoch)`` (optional, every ``eval_every`` epochs and at the last) gives the row's
    ``valid_*`` metrics. The rows: epoch, loss (mean per query), seconds."""

    time_key = "seconds"
    panels = LINK_PANELS

    def __init__(self, triples: Tensor, objective: LinkObjective, batch_size: int, seed: int,
                 valid: Callable[[int], dict] | None = None, eval_every: int = 1, name="triples"):
        super().__init__({}, None)
        self.triples, self.objective, self.batch, self.seed = triples, objective, batch_size, seed
        self.valid, self.eval_every, self.name = valid, eval_every, name
        self.gen: torch.Generator | None = None
        self.queries, self.n = None, 0  # the queries; the items of the step being taken

    def setup(self, model, dev, world) -> None:
        super().setup(model, dev, world)
        # the training draws (an encoder's edge dropout) start from the seed, whatever building
        # the model drew: a config's run and ``train_link`` of the same model draw alike
        torch.manual_seed(self.seed)
        self.queries = training_queries(model, self.triples, self.objective.mode).to(dev)

    def epoch_steps(self, epoch: int, done: int, extra: dict | None):
        # batch order and negatives from (seed, epoch): the same after a resume
        self.gen = epoch_generator(self.seed, epoch)
        perm = torch.randperm(self.queries.shape[0], generator=self.gen)
        if done:  # where a mid-epoch checkpoint left the epoch's generator
            self.gen.set_state(extra["epoch_generator"])
        starts = range(0, perm.numel(), self.batch)
        dev = self.queries.device
        return len(starts), ([self.queries[perm[i:i + self.batch].to(dev)]]
                             for i in starts[done:])

    def position(self) -> dict:
        return {"epoch_generator": self.gen.get_state()}

    def group_items(self, group: list) -> float:
        self.n = sum(q.shape[0] for q in group)
        return self.n

    def batch_loss(self, net, q, share: float):
        loss = link_loss(net, q, self.objective, self.gen)
        # the loss is the batch's mean; a step of several batches weighs each by its size
        objective = loss if q.shape[0] == self.n else loss * (q.shape[0] / self.n)
        n = q.shape[0]
        zero = torch.zeros((), dtype=torch.float64, device=loss.device)
        return objective, torch.stack([loss.detach().double() * n, zero, zero + n])

    def validate(self, model, epoch: int, last: bool) -> dict | None:
        if self.valid is None or not (epoch % self.eval_every == 0 or last):
            return None
        model.eval()
        return {f"valid_{k}": v for k, v in self.valid(epoch).items()}

    def row(self, epoch: int, totals: list, dt: float, val: dict | None, lr: float) -> dict:
        return {"epoch": epoch, "loss": totals[0] / max(totals[2], 1), "seconds": dt,
                **(val or {})}

    def line(self, row: dict) -> str:
        return "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in row.items())


class LinkTask(TripleTask):
    """A ``[model.link]`` config's run: ``[train.link]``'s objective, filtered validation
    ranking every ``eval_every`` epochs (``val_limit`` triples), the result ranked on the full
    valid and test sets."""

    def __init__(self, cfg: dict, data):
        sp = link_train_spec(cfg)
        objective = LinkObjective(sp["mode"], float(sp["label_smoothing"]),
                                  None if sp["reg"] == "none" else sp["reg"],
                                  float(sp["reg_weight"]), sp["negatives"])
        super().__init__(data.train, objective, cfg["data"]["batch_size"], cfg["seed"],
                         eval_every=sp["eval_every"])
        self.cfg, self.data, self.spec = cfg, data, sp
        self.known = link_known(data)

    @staticmethod
    def train_size(data) -> int:
        return int(data.train.shape[0])

    def validate(self, model, epoch: int, last: bool) -> dict | None:
        if not (epoch % self.eval_every == 0 or last):
            return None
        m = evaluate_link(model, self.data, self.cfg, "val", self.spec["val_limit"], self.known)
        return {f"val_{k}": m[k] for k in RANKS}

    def row(self, epoch: int, totals: list, dt: float, val: dict | None, lr: float) -> dict:
        return {"epoch": epoch, "loss": totals[0] / totals[2],
                **(val or {f"val_{k}": None for k in RANKS}), "seconds": round(dt, 4), "lr": lr}

    def line(self, row: dict) -> str:
        val = "  ".join(f"{k} {row[k]:.4f}" for k in ("val_mrr", "val_hits@1", "val_hits@10")
                        if row[k] is not None)
        rate = self.queries.shape[0] / max(row["seconds"], 1e-9)
        return (f"epoch {row['epoch']:3d}  loss {row['loss']:.4f}  {val}{'  ' if val else ''}"
                f"{rate:.0f} queries/s")

    def result(self, model, main: bool) -> dict:
        """The (best) weights ranked on the full valid and test sets."""
        t0 = time.perf_counter()
        test = evaluate_link(model, self.data, self.cfg, "test", 0, self.known)
        val = evaluate_link(model, self.data, self.cfg, "val", 0, self.known)
        return {"task": "link", **{f"val_{k}": val[k] for k in RANKS},
                **{f"test_{k}": test[k] for k in RANKS}, "val": val, "test": test,
                "eval_time_s": round(time.perf_counter() - t0, 3)}


def train_link(model, train: Tensor, *, mode: str = "1vsall", epochs: int = 10,
               batch_size: int = 1000, lr: float = 1e-3, optimizer: str = "adam",
               label_smoothing: float = 0.0, reg: str | None = None, reg_weight: float = 0.0,
               negatives: int = 1, seed: int = 0, time_limit: float | None = None,
               valid: Callable[[int], dict] | None = None, eval_every: int = 1,
               log: Callable[[str], None] | None = None,
               checkpoint_dir=None) -> list[dict]:
    """Train ``model`` (a ``sc.kg.LinkPredictor``) on ``train`` (T, 3) triples with the
    training loop; returns the per-epoch rows (loss, seconds, ``valid_*`` metrics when
    ``valid(epoch)`` is given, every ``eval_every`` epochs).

    ``mode="1vsall"``: each triple gives two queries, (h, r) -> t and (t, r + R) -> h, scored
    against all entities with cross-entropy. ``mode="negative"``: each triple (and its reverse
    ``(t, r + R, h)`` where the decoder is reciprocal) and ``negatives`` corruptions of its head
    or tail (uniform), binary cross-entropy (R-GCN's setting). ``optimizer`` is one of
    ``structconv.training.optim.OPTIMIZERS``. No epoch starts after ``time_limit`` seconds.
    With ``checkpoint_dir`` every epoch ends with a checkpoint (safetensors, atomic) and a
    later call continues from the last one: a resumed run equals an uninterrupted one.
    """
    objective = LinkObjective(mode, label_smoothing, None if reg == "none" else reg, reg_weight,
                              negatives)
    train = check_triples(train, model.num_entities, model.num_relations, "train")
    opt = make_optimizer(optimizer, model.parameters(), lr)
    task = TripleTask(train, objective, batch_size, seed, valid, eval_every)
    dev = next(model.parameters()).device
    task.setup(model, dev, task.world)
    run = Path(checkpoint_dir) if checkpoint_dir is not None else None
    loop = Loop(task, model, opt, {"epochs": epochs, "monitor": "", "checkpoint_every": 1},
                seed=seed, run=run, files=False, dev=dev,
                on_row=None if log is None else (lambda row: log(task.line(row))))
    if run is not None and (run / CHECKPOINT_JSON).is_file():
        loop.resume()
    elif run is not None:
        run.mkdir(parents=True, exist_ok=True)
    loop.fit(time_limit=time_limit)
    return loop.state["history"]

"""Graph-level learning: batches of whole graphs, one prediction per graph.

Classification (integer labels): cross-entropy and accuracy, and ROC-AUC where there are two
classes; regression (float labels): mean squared error, and mean absolute error. An epoch's
batches are ``sc.data.GraphLoader``'s order of the training graphs for (seed, epoch); a
mid-epoch checkpoint keeps the loader's position, which the resumed epoch checks. Under DDP
each process takes a contiguous share of a batch's graphs; GIN's batch norms
(``model.gin.batch_norm``) then normalise by that share's statistics, as torch's DDP does
without ``SyncBatchNorm`` (which refuses CPU tensors), so such a run does not equal a
1-process run (the run log notes it; without batch norm and dropout it does).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ...config import ConfigError, gin_spec
from ...data.batch import GraphBatch, GraphLoader
from ...data.molecules import one_hot as _one_hot
from ...models.build import graph_feature_dims
from ..checkpoint import CheckpointError
from ..runlog import CLASSIFICATION_PANELS
from .base import Task, batch_sums, rank_rows

__all__ = ["GraphTask", "graph_splits", "roc_auc"]

REGRESSION_PANELS = (("loss", "mean squared error", (("train_loss", "train"),
                                                     ("val_loss", "val"))),
                     ("error", "mean absolute error", (("val_mae", "val"),)))


def graph_splits(data) -> dict[str, Tensor]:
    """The graph ids of ``train``, ``val`` and ``test`` (a ``valid`` split read as ``val``);
    ConfigError where the dataset has no splits."""
    splits = getattr(data, "splits", None)
    if not splits:
        raise ConfigError(f"dataset {data.name} has no train/val/test split of its graphs: "
                          "choose one (e.g. data.options.fold for a TU dataset)")
    out = {("val" if k == "valid" else k): torch.as_tensor(v, dtype=torch.long)
           for k, v in splits.items()}
    missing = sorted({"train", "val"} - set(out))
    if missing:
        raise ConfigError(f"dataset {data.name}'s split has no {', '.join(missing)} graphs")
    return out


def roc_auc(score: Tensor, y: Tensor) -> float | None:
    """The area under the ROC curve of scores ``score`` (n,) for binary labels ``y`` (n,):
    the Mann-Whitney statistic with tied scores at their mean rank; None with one class."""
    pos = y == 1
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if n1 == 0 or n0 == 0:
        return None
    order = score.double().argsort()
    _, inv, counts = torch.unique_consecutive(score.double()[order], return_inverse=True,
                                              return_counts=True)
    ends = counts.cumsum(0).double()
    ranks = torch.empty_like(ends[inv])
    ranks[order] = (ends - (counts.double() - 1) / 2)[inv]
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


class GraphTask(Task):
    """``data`` a ``GraphDataset`` with ``splits`` (graph ids); a step is ``accumulate``
    batches of ``data.batch_size`` training graphs, ``data.batches_per_epoch`` of them (0: one
    pass), each process its contiguous share of a batch's graphs."""

    def __init__(self, cfg: dict, data):
        super().__init__(cfg, data)
        self.ids = graph_splits(data)
        self.regression = data.y is not None and data.y.is_floating_point()
        self.binary = not self.regression and data.num_classes == 2
        self.panels = REGRESSION_PANELS if self.regression else CLASSIFICATION_PANELS
        mon = cfg["train"]["monitor"]
        if self.regression and mon != "val_loss":
            raise ConfigError(f"train.monitor={mon!r}: {data.name} has float labels "
                              "(regression), monitor val_loss")
        if mon == "val_auc" and not self.binary:
            raise ConfigError(f"train.monitor='val_auc' needs two classes; {data.name} has "
                              f"{data.num_classes}: monitor val_acc or val_loss")
        self.dims = graph_feature_dims(data)
        self.edges = gin_spec(cfg)["edge_features"]
        self.train_set = data.subset(self.ids["train"])
        self.loader = GraphLoader(self.train_set, cfg["data"]["batch_size"], shuffle=True,
                                  seed=cfg["seed"])

    @staticmethod
    def train_size(data) -> int:
        return int(graph_splits(data)["train"].numel())

    # -- batches ----------------------------------------------------------------------------------
    def epoch_steps(self, epoch: int, done: int, extra: dict | None):
        acc = self.cfg["train"].get("accumulate", 1)
        order = self.loader.order(epoch)
        order = order[:self.cfg["data"]["batches_per_epoch"] or len(order)]
        groups = [order[i:i + acc] for i in range(0, len(order), acc)]
        self.loader.load_state_dict({"epoch": epoch, "batch": min(done * acc, len(order))})
        if extra and "graph_position" in extra:
            got = [int(v) for v in extra["graph_position"].tolist()]
            if got != [epoch, self.loader.position]:
                raise CheckpointError(f"the checkpoint's graph-loader position (epoch, batch) "
                                      f"{got} is not where its epoch stood "
                                      f"{[epoch, self.loader.position]}")
        return len(groups), self._groups(groups[done:])

    def _groups(self, groups: list):
        for g in groups:
            self.loader.position += len(g)
            yield g

    def position(self) -> dict:
        return {"graph_position": torch.tensor([self.loader.epoch, self.loader.position])}

    def group_items(self, group: list) -> float:
        return float(sum(ids.numel() for ids in group))

    def inputs(self, b: GraphBatch) -> tuple:
        """(x, edge_index, batch, num_graphs, edge_attr) of a batch on the task's device, in
        the model's dtype (categorical columns one-hot)."""
        (xd, ed), dev, dt = self.dims, self.dev, self.dtype
        x = _one_hot(b.x, xd) if xd else b.x
        ea = None
        if self.edges:
            ea = _one_hot(b.edge_attr, ed) if ed else b.edge_attr
            ea = ea.to(dev, dt)
        return x.to(dev, dt), b.edge_index.to(dev), b.batch.to(dev), b.num_graphs, ea

    def losses(self, model, b: GraphBatch) -> tuple[Tensor, Tensor | None, Tensor]:
        """Per-graph loss (n,), correct predictions (n,) (None for regression), outputs."""
        out = model(*self.inputs(b))
        y = b.y.to(self.dev)
        if self.regression:
            y = y.to(out.dtype).reshape(out.shape)
            return (out - y).pow(2).mean(-1), None, out
        loss = F.cross_entropy(out, y, reduction="none",
                               label_smoothing=self.cfg["train"].get("label_smoothing", 0.0)
                               if model.training else 0.0)
        return loss, out.argmax(-1) == y, out

    def batch_loss(self, net, batch, share: float):
        ids = batch[rank_rows(batch.numel(), self.world, "graphs")]
        loss, ok, _ = self.losses(net, self.train_set.batch(ids))
        return loss.sum() * share, batch_sums(loss, ok, ids.numel())

    # -- evaluation -------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model, split: str, device=None) -> dict:
        """``{loss, acc, n}`` (classification, with ``auc`` for two classes) or
        ``{loss, mae, n}`` (regression) of a model on a split's graphs."""
        if split not in self.ids or self.ids[split].numel() == 0:
            raise ConfigError(f"the {split} split of {self.data.name} is empty")
        was = model.training
        model.eval()
        self.dev = device or self.dev
        self.dtype = self.dtype or next(model.parameters()).dtype
        ids, b = self.ids[split], self.cfg["data"]["eval_batch_size"]
        outs, losses = [], []
        for i in range(0, ids.numel(), b):
            loss, _, out = self.losses(model, self.data.batch(ids[i:i + b]))
            outs.append(out.double())
            losses.append(loss.double())
        model.train(was)
        out, loss = torch.cat(outs), torch.cat(losses)
        y = self.data.y[ids].to(out.device)
        res = {"loss": loss.mean().item(), "n": int(ids.numel())}
        if self.regression:
            res["mae"] = (out - y.double().reshape(out.shape)).abs().mean().item()
            return res
        res["acc"] = (out.argmax(-1) == y).double().mean().item()
        if self.binary:
            res["auc"] = roc_auc(out.softmax(-1)[:, 1], y)
        return res

    def _named(self, res: dict, prefix: str) -> dict:
        return {f"{prefix}_{k}": v for k, v in res.items() if k != "n"}

    def validate(self, model, epoch: int, last: bool) -> dict:
        return self._named(self.evaluate(model, "val", self.dev), "val")

    def row(self, epoch: int, totals: list, dt: float, val: dict | None, lr: float) -> dict:
        loss, ok, n = totals
        acc = {} if self.regression else {"train_acc": ok / n}
        return {"epoch": epoch, "train_loss": loss / n, **acc, **(val or {}),
                "time_s": round(dt, 4), "items_per_s": round(n / max(dt, 1e-9), 1), "lr": lr}

    def line(self, row: dict) -> str:
        keys = ("val_mae",) if self.regression else ("val_acc", "val_auc")
        shown = "  ".join(f"{k} {row[k]:.4f}" for k in keys if row.get(k) is not None)
        return (f"epoch {row['epoch']:3d}  train_loss {row['train_loss']:.4f}  "
                f"val_loss {row['val_loss']:.4f}  {shown}  {row['items_per_s']:.0f} graphs/s")

    def result(self, model, main: bool) -> dict:
        out = self._named(self.evaluate(model, "val", self.dev), "val")
        if "test" in self.ids and self.ids["test"].numel():
            out.update(self._named(self.evaluate(model, "test", self.dev), "test"))
        return out


"""A typed graph: classify DBLP's authors with two typed SAGE layers.

DBLP has four node types (author, paper, term, conference) with their own feature widths and six
relations between them. ``sc.nn.TypedGraphConv`` is the typed convolution
y_d = Σ_{r = (s, rel, d)} A_rᵀ x_s θ_r + x_d W_d + b_d: each relation a rectangular basis from
one node type to another (mean over a target's neighbours of that relation, as PyG's
``to_hetero(SAGE)``), θ one matrix per relation (``param="full"``) or any ``sc.params`` form
across the relations (``ControlledSeparable``: PyG's ``to_hetero_with_bases``). The authors'
split is PyG's (400 train, 400 val, 3,257 test); Macro- and Micro-F1 on the test authors.

DBLP's files are read from the data home (``$STRUCTCONV_DATA/hetero/DBLP``, see
``structconv datasets``); without them the script exits 2 with one line saying where they go.

    python examples/hetero_dblp.py            # 100 epochs
    python examples/hetero_dblp.py --quick    # 8 epochs (what CI runs)
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.nn import functional as F

import structconv as sc
from structconv.data import load_dataset
from structconv.params import ControlledSeparable


def f1_scores(pred: torch.Tensor, y: torch.Tensor, classes: int) -> tuple[float, float]:
    """(Macro-F1, Micro-F1) of predicted labels."""
    f1 = []
    for c in range(classes):
        tp = ((pred == c) & (y == c)).sum().item()
        fp = ((pred == c) & (y != c)).sum().item()
        fn = ((pred != c) & (y == c)).sum().item()
        f1.append(2 * tp / max(2 * tp + fp + fn, 1))
    return sum(f1) / classes, (pred == y).float().mean().item()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8 epochs (a smoke test)")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--bases", type=int, default=0,
                   help="share H channel matrices across relations (0: one per relation)")
    args = p.parse_args(argv)
    try:
        g = load_dataset("dblp")
    except ValueError as e:  # the files are absent: the library's error names them
        print(f"hetero_dblp: {e}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    g.x["conference"] = torch.ones(g.num_nodes["conference"], 1)  # featureless: a constant
    print(g.describe())
    meta, x, ei = g.metadata(), g.x_dict, g.edge_index_dict
    widths, hidden, R = {t: v.shape[1] for t, v in x.items()}, 32, len(meta[1])
    param = ControlledSeparable(R, max(widths.values()), hidden, args.bases) if args.bases \
        else "full"
    convs = torch.nn.ModuleList([sc.nn.TypedGraphConv(widths, hidden, meta, param=param),
                                 sc.nn.TypedGraphConv(hidden, 4, meta)])

    def model(train: bool) -> torch.Tensor:
        h = {t: F.dropout(v, 0.5, train) for t, v in convs[0](x, ei).items()}
        return convs[1]({t: v.relu() for t, v in h.items()}, ei)["author"]

    opt = torch.optim.Adam(convs.parameters(), lr=0.005, weight_decay=1e-3)
    y, masks = g.y["author"], g.masks["author"]
    epochs = 8 if args.quick else args.epochs
    for epoch in range(1, epochs + 1):
        loss = F.cross_entropy(model(True)[masks["train"]], y[masks["train"]])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if epoch % 4 == 0 or epoch == epochs:
            with torch.no_grad():
                pred = model(False).argmax(1)
            val = f1_scores(pred[masks["val"]], y[masks["val"]], 4)
            print(f"epoch {epoch:3d}  loss {loss.item():.3f}  val Micro-F1 {val[1]:.3f}")
    macro, micro = f1_scores(pred[masks["test"]], y[masks["test"]], 4)
    print(f"test authors: Macro-F1 {macro:.3f}  Micro-F1 {micro:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

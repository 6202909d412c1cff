"""Kipf & Welling's GCN on Cora, with structconv's layers.

A GCN layer is the structured convolution with K = 1 and the normalised adjacency
``D^-1/2 (Adj + I) D^-1/2`` as its basis (``sc.basis.gcn``, computed as PyG's ``gcn_norm``);
``sc.nn.GCNConv`` is called like PyG's. Two layers, 16 hidden units, dropout 0.5, Adam
(lr 0.01, weight decay 5e-4), the Planetoid split: about 81 % test accuracy.

Cora's files are read from the data home (``$STRUCTCONV_DATA/planetoid``, see
``structconv datasets``); without them the script exits 2 with one line saying where they go.

    python examples/gcn_cora.py            # 200 epochs
    python examples/gcn_cora.py --quick    # 30 epochs (what CI runs)
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn
from torch.nn import functional as F

import structconv as sc
from structconv.data import load_dataset


class GCN(nn.Module):
    """Two ``sc.nn.GCNConv`` layers: x (N, F) -> logits (N, classes)."""

    def __init__(self, features: int, hidden: int, classes: int, dropout: float = 0.5):
        super().__init__()
        self.conv1, self.conv2 = sc.nn.GCNConv(features, hidden), sc.nn.GCNConv(hidden, classes)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, edge_index)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="30 epochs (a smoke test)")
    p.add_argument("--epochs", type=int, default=200)
    args = p.parse_args(argv)
    try:
        data = load_dataset("cora")
    except ValueError as e:  # the files are absent: the library's error names them
        print(f"gcn_cora: {e}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    print(data.describe())
    basis = sc.basis.gcn(data.edge_index, data.num_nodes)
    print(f"GCN basis: K={basis.K}, M=N={basis.N}, {type(basis).__name__}")
    model = GCN(data.num_features, 16, data.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    masks = data.masks
    epochs = 30 if args.quick else args.epochs
    for epoch in range(1, epochs + 1):
        model.train()
        loss = F.cross_entropy(model(data.x, data.edge_index)[masks["train"]],
                               data.y[masks["train"]])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if epoch % 10 == 0 or epoch == epochs:
            model.eval()
            with torch.no_grad():
                pred = model(data.x, data.edge_index).argmax(1)
            acc = {k: (pred[m] == data.y[m]).float().mean().item() for k, m in masks.items()}
            print(f"epoch {epoch:3d}  loss {loss.item():.3f}  val acc {acc['val']:.3f}  "
                  f"test acc {acc['test']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Mini-batch training of a GCN on a large synthetic graph with sampled neighbourhoods.

``sc.sampling.NeighborLoader`` yields mini-batches whose bases are *restrictions* of the full
graph's basis: the rows of the sampled sources and the columns of the seed targets, one
bipartite basis per layer, GCN-normalised by the full graph's degrees. The same
``sc.nn.GCNConv`` layers run on a batch (``apply_layers``) and, for evaluation, exactly on
every node's whole neighbourhood, layer by layer (``sc.sampling.inference``), without ever
holding the graph's N x N matrix. The graph is the ``synthetic`` dataset (a stochastic block
model of any size: ``synthetic:nodes=...,edges=...``).

    python examples/sampled_graph.py            # 200,000 nodes, 2,000,000 edges
    python examples/sampled_graph.py --quick    # 20,000 nodes, 200,000 edges (what CI runs)
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn import functional as F

import structconv as sc
from structconv.data import load_dataset


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tenth of the graph, 10 batches")
    args = p.parse_args(argv)
    nodes = 20_000 if args.quick else 200_000
    data = load_dataset(f"synthetic:nodes={nodes},edges={10 * nodes}")
    print(data.describe())
    torch.manual_seed(0)
    layers = [sc.nn.GCNConv(data.num_features, 32), sc.nn.GCNConv(32, data.num_classes)]
    params = [p for layer in layers for p in layer.parameters()]
    opt = torch.optim.Adam(params, lr=0.01)
    # fanouts in PyG's order: 10 neighbours for the seeds' hop (the last layer), 5 before it
    loader = sc.sampling.NeighborLoader(data.edge_index, data.num_nodes, [10, 5], layers=layers,
                                        x=data.x, y=data.y, input_nodes=data.masks["train"],
                                        batch_size=512, shuffle=True, seed=0)
    t0, limit = time.perf_counter(), 10 if args.quick else len(loader)
    for i, batch in enumerate(loader):
        if i == limit:
            break
        out = sc.sampling.apply_layers(layers, batch.x, batch.bases, act=torch.relu)
        loss = F.cross_entropy(out, batch.y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i % max(1, limit // 5) == 0:
            print(f"batch {i:4d}: {batch.batch_size} seeds, {batch.node_ids.numel():,} input "
                  f"nodes, loss {loss.item():.3f}")
    print(f"{limit} of {len(loader)} batches in {time.perf_counter() - t0:.1f} s")
    with torch.no_grad():  # exact: whole neighbourhoods, one layer's activations at a time
        pred = sc.sampling.inference(layers, data.x, data.edge_index, data.num_nodes,
                                     batch_size=8192).argmax(1)
    for split, mask in data.masks.items():
        print(f"{split} accuracy (exact layer-wise inference): "
              f"{(pred[mask] == data.y[mask]).float().mean().item():.3f}")


if __name__ == "__main__":
    main()

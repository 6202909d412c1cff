"""A character language model with shift heads instead of positional encodings, and generation.

``sc.nn.TransformerLM(position="shift")`` stacks, in every attention layer, ``shifts`` causal
shift-matrix heads (a ``Grid`` basis: head s reads the token s steps back) with the content
attention heads: the model needs no positional encoding and runs at any length. Trains on text
that ships with every Python (stdlib sources, the ``python-text`` dataset), prints the
validation loss, then samples text with ``generate`` (a cache of past keys/values; the shift
heads keep only their last ``shifts`` inputs).

    python examples/transformer_lm.py            # 600 steps
    python examples/transformer_lm.py --quick    # 40 steps (what CI runs)
"""

from __future__ import annotations

import argparse
import math

import torch
from torch.nn import functional as F

import structconv as sc
from structconv.data import load_dataset


def batches(ids: torch.Tensor, length: int, size: int, g: torch.Generator):
    """An endless stream of (inputs, targets): ``size`` random windows of ``length`` tokens."""
    while True:
        start = torch.randint(ids.numel() - length - 1, (size,), generator=g)
        w = torch.stack([ids[s:s + length + 1] for s in start.tolist()])
        yield w[:, :-1], w[:, 1:]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="40 steps (a smoke test)")
    p.add_argument("--steps", type=int, default=600)
    args = p.parse_args(argv)
    steps = 40 if args.quick else args.steps
    torch.manual_seed(0)
    data = load_dataset("python-text")
    print(data.describe())
    model = sc.nn.TransformerLM(len(data.vocab), width=64, layers=2, heads=2,
                                position="shift", shifts=4, dropout=0.0)
    print(f"TransformerLM(position='shift', shifts=4): "
          f"{sum(p.numel() for p in model.parameters()):,} parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    stream = batches(data.splits["train"], 64, 16, torch.Generator().manual_seed(0))
    for step in range(1, steps + 1):
        x, y = next(stream)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % max(1, steps // 4) == 0:
            print(f"step {step:4d}  train loss {loss.item():.3f}")
    model.eval()
    val = data.splits["val"][:1025]
    with torch.no_grad():  # a window 16x the training length: shift heads take any length
        v = F.cross_entropy(model(val[None, :-1])[0], val[1:]).item()
    print(f"validation loss on {val.numel() - 1} characters at once: {v:.3f} "
          f"({v / math.log(2):.2f} bits per character)")
    prompt = torch.tensor([[data.vocab.index(c) for c in "def "]])
    out = model.generate(prompt, 80, temperature=0.8, top_k=10,
                         generator=torch.Generator().manual_seed(0))
    print("sample: " + repr("".join(data.vocab[i] for i in out[0].tolist())))


if __name__ == "__main__":
    main()

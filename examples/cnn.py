"""A CNN written as structured convolutions: grid shift bases and two parameter forms.

Every layer computes ``y = Σ_k A_kᵀ x Θ_k``. ``A`` is the K = 9 shift matrices of a 3 x 3 kernel
on the image grid (``sc.basis.Grid``), ``x`` the image as a bundle ``(B, H*W, C)`` (row-major, the
paper's canonical bijection). The first layer's Θ is full (K·P·Q parameters), the second
controlled-separable (``sc.params.ControlledSeparable``, H·(K + P·Q): eq. "separable"), and the
pooling is the K = 1 ``sc.basis.AvgPool``. Trains on scikit-learn's 8 x 8 digits.

    python examples/cnn.py            # 20 epochs, seconds on a laptop CPU
    python examples/cnn.py --quick    # 2 epochs (what CI runs)
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import structconv as sc
from structconv.data import load_dataset


class DigitsCNN(nn.Module):
    """Two grid convolutions and an average pooling over 8 x 8 images: (B, 64, 1) -> (B, 10)."""

    def __init__(self, classes: int):
        super().__init__()
        grid8 = sc.basis.Grid((8, 8), kernel_size=3, padding=1)   # K = 9 shifts, 64 -> 64
        self.conv1 = sc.nn.Convolution(grid8, 1, 16)               # full: 9 * 1 * 16
        # average pooling: the K = 1 basis sc.basis.AvgPool on the bundle, 64 -> 16 entries
        self.pool = sc.nn.GridAvgPool(2, in_shape=(8, 8))
        grid4 = sc.basis.Grid((4, 4), kernel_size=3, padding=1)
        sep = sc.params.ControlledSeparable(K=9, P=16, Q=32, H=4)  # 4 * (9 + 16 * 32)
        self.conv2 = sc.nn.Convolution(grid4, 16, 32, param=sep)
        self.out = nn.Linear(32 * 16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(2).transpose(1, 2)          # (B, 1, 8, 8) -> the bundle (B, 64, 1)
        h = self.pool(torch.relu(self.conv1(h)))  # (B, 16, 16)
        h = torch.relu(self.conv2(h))             # (B, 16, 32)
        return self.out(h.flatten(1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 epochs (a smoke test)")
    p.add_argument("--epochs", type=int, default=20)
    args = p.parse_args(argv)
    epochs = 2 if args.quick else args.epochs
    torch.manual_seed(0)
    data = load_dataset("digits")
    (xtr, ytr), (xte, yte) = data.splits["train"], data.splits["test"]
    model = DigitsCNN(data.num_classes)
    print(data.describe())
    print(f"parameters: conv1 {sum(p.numel() for p in model.conv1.param.parameters())} "
          f"(K*P*Q = 9*1*16), conv2 {sum(p.numel() for p in model.conv2.param.parameters())} "
          f"(H*(K + P*Q) = 4*(9 + 16*32))")
    print(sc.explain(xtr[:64].flatten(2).transpose(1, 2), model.conv1.basis, model.conv1.param))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(1, epochs + 1):
        model.train()
        for idx in torch.randperm(len(xtr)).split(64):
            loss = nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item()
        print(f"epoch {epoch:2d}  train loss {loss.item():.3f}  test acc {acc:.3f}")


if __name__ == "__main__":
    main()

"""The networks of the Fashion-MNIST study (``structconv reproduce fashion``): a small CNN in
plain torch and its structconv twins, built by ``sc.nn.from_torch`` with its weights."""

from __future__ import annotations

import copy

from torch import nn

__all__ = ["torch_cnn", "structconv_cnn", "twin_cnn", "twin_activations"]


def torch_cnn(channels=(16, 32), side: int = 28, classes: int = 10) -> nn.Sequential:
    """The reference CNN in plain torch: images (B, 1, side, side) -> logits (B, classes)."""
    c1, c2 = channels
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(c2 * (side // 4) ** 2, classes))


def structconv_cnn(reference: nn.Sequential, native: bool = True) -> nn.Sequential:
    """The same network with every conv / pool a structconv grid layer (weights copied).

    ``native=False`` keeps the grid layers on the paper's contraction orders (no F.conv2d).
    """
    from ..nn.convert import from_torch

    layers = []
    for m in reference:
        if isinstance(m, (nn.Conv2d, nn.AvgPool2d)):
            g = from_torch(m)
            if not native:
                if isinstance(m, nn.Conv2d):
                    g.native = False
                else:
                    g.route = "basis"
            layers.append(g)
        else:
            layers.append(copy.deepcopy(m))
    return nn.Sequential(*layers)


def twin_cnn(network: str, channels=(16, 32), side: int = 28, classes: int = 10) -> nn.Sequential:
    """The study's network ``network`` (``[model.twin]``): the torch CNN drawn from the global
    RNG, or (``structconv``, ``structconv-shift``) its twin, built from that same torch draw,
    so that every network of one seed starts from the same weights."""
    ref = torch_cnn(tuple(channels), side, classes)
    if network == "torch":
        return ref
    if network not in ("structconv", "structconv-shift"):
        raise ValueError(f"network must be torch, structconv or structconv-shift, got "
                         f"{network!r}")
    return structconv_cnn(ref, native=network == "structconv")


def twin_activations(channels=(16, 32), side: int = 28, classes: int = 10) -> int:
    """Activation scalars one image keeps in a twin CNN, about: each convolution's output and
    activation, each pooling's output, the logits."""
    c1, c2 = channels
    return 2 * c1 * side ** 2 + c1 * (side // 2) ** 2 + 2 * c2 * (side // 2) ** 2 + \
        c2 * (side // 4) ** 2 + classes

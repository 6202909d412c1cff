"""The models of the controlled-separability study (``structconv reproduce separability``): a
digits CNN and a featureless R-GCN whose convolutions take any parameter form by name."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from ..nn.grid import GridAvgPool, GridConv
from ..params import ControlledSeparable, DepthwiseSeparable, Full, reset_children
from .graph import RelationalLayer, identity_basis, relational_basis

__all__ = ["make_form", "DigitsCNN", "RelationalNet"]


def _count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def make_form(name: str, K: int, P: int, Q: int):
    """'full', 'depthwise' or 'H<n>' -> the parameter module (K, P, Q)."""
    if name == "full":
        return Full(K, P, Q)
    if name == "depthwise":
        return DepthwiseSeparable(K, P, Q)
    if name.startswith("H") and name[1:].isdigit() and int(name[1:]) > 0:
        return ControlledSeparable(K, P, Q, int(name[1:]))
    raise ValueError(f"unknown form {name!r}: use 'full', 'depthwise' or 'H<n>' (e.g. H4)")


class DigitsCNN(nn.Module):
    """images (B, 1, S, S) -> logits (B, 10); the second convolution has parameter form ``form``."""

    def __init__(self, form: str, side: int = 8, kernel: int = 5, channels=(16, 32)):
        super().__init__()
        c1, c2 = channels
        K = kernel * kernel
        self.conv1 = GridConv(1, c1, (kernel, kernel), padding=kernel // 2)
        self.conv2 = GridConv(c1, c2, (kernel, kernel), padding=kernel // 2,
                              param=make_form(form, K, c1, c2))
        self.pool = GridAvgPool((2, 2))
        self.fc = nn.Linear(c2 * (side // 2) ** 2, 10)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        reset_children(self)

    def form_parameters(self) -> int:
        return _count(self.conv2.param)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc(x.flatten(1))


class RelationalNet(nn.Module):
    """R-GCN (featureless nodes) with parameter form ``form`` on both relational convolutions."""

    def __init__(self, data, hidden: int, form: str):
        super().__init__()
        rel = relational_basis(data.edge_index, data.edge_type, data.num_nodes,
                               data.num_relations)
        eye = identity_basis(data.num_nodes)
        N, C = data.num_nodes, data.num_classes
        self.l1 = RelationalLayer(rel, eye, N, hidden, make_form(form, rel.K, N, hidden))
        self.l2 = RelationalLayer(rel, eye, hidden, C, make_form(form, rel.K, hidden, C))

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        reset_children(self)

    def form_parameters(self) -> int:
        return _count(self.l1.conv.param) + _count(self.l2.conv.param)

    def forward(self):
        return self.l2(F.relu(self.l1(None)))

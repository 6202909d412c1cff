"""The Transformer's feed-forward and its residual wiring, once for every layer that has them.

``feed_forward`` is the position-wise two-layer map (with the Canon places C and D of
``structconv.nn.canon`` where a layer has them); ``pre_norm`` and ``post_norm`` are the two ways a
sub-layer joins the residual stream. The layers keep their own module names (torch's
``linear1`` / ``norm1``, GPT-2's ``fc`` / ``proj``, ...) so that their checkpoints and converters
stay as they are; the computation is this one.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

__all__ = ["feed_forward", "pre_norm", "post_norm"]


def _same(place: str, h: Tensor) -> Tensor:
    return h


def feed_forward(x: Tensor, fc: nn.Module, proj: nn.Module, activation: Callable | None = None,
                 canon: Callable[[str, Tensor], Tensor] | None = None,
                 dropout: nn.Module | None = None) -> Tensor:
    """proj(dropout(act(D(fc(C(x)))))): x (.., E) -> (.., E'), ``fc`` E -> F, ``proj`` F -> E'.

    ``activation`` None is the identity; ``canon(place, h)`` applies the Canon layer at place
    "C" (before ``fc``) or "D" (after it, before the activation), the identity where a layer
    has none; ``dropout`` on the hidden layer (torch's Transformer layers).
    """
    canon = _same if canon is None else canon
    h = canon("D", fc(canon("C", x)))
    if activation is not None:
        h = activation(h)
    if dropout is not None:
        h = dropout(h)
    return proj(h)


def pre_norm(x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor],
             dropout: nn.Module | None = None) -> Tensor:
    """x + dropout(sublayer(norm(x))): a pre-norm residual branch (GPT-2's)."""
    h = sublayer(norm(x))
    return x + (h if dropout is None else dropout(h))


def post_norm(x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
    """norm(x + sublayer(x)): a post-norm residual branch (the original Transformer's)."""
    return norm(x + sublayer(x))

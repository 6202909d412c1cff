"""The Transformer's feed-forward and its residual wiring, once for every layer that has them.

``feed_forward`` is the position-wise two-layer map (with the Canon places C and D of
``structconv.nn.canon`` where a layer has them) and ``FeedForward`` the module over it;
``pre_norm`` and ``post_norm`` are the two ways a sub-layer joins the residual stream, and
``PreNormBlock`` is a block of pre-norm branches (the language model's, the encoder's and the
decoder's: attention, cross-attention, feed-forward). torch's drop-in Transformer layers keep
torch's module names (``linear1`` / ``norm1``, for ``from_torch``) and call the functions.

Where a block's parts moved into these modules, ``former_keys`` keeps its checkpoints as they
were: its ``state_dict`` writes the former names and ``load_state_dict`` reads either.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from ..params import reset_children

__all__ = ["feed_forward", "pre_norm", "post_norm", "FeedForward", "PreNormBlock",
           "former_keys"]


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
             dropout: nn.Module | None = None,
             skip: Callable[[Tensor, Tensor], Tensor] | None = None) -> Tensor:
    """x + dropout(sublayer(norm(x))): a pre-norm residual branch (GPT-2's). ``skip(x, h)``:
    the part of ``x`` the branch's output h adds to (default all of x)."""
    h = sublayer(norm(x))
    h = h if dropout is None else dropout(h)
    return (x if skip is None else skip(x, h)) + h


def post_norm(x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
    """norm(x + sublayer(x)): a post-norm residual branch (the original Transformer's)."""
    return norm(x + sublayer(x))


def _size(who: str, name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"{who}: {name} must be an int >= 1, got {v!r}")
    return int(v)


class FeedForward(nn.Module):
    """The position-wise feed-forward: x (.., width) -> proj(dropout(act(fc(x)))) (.., out),
    ``fc`` a Linear width -> hidden and ``proj`` hidden -> out (``out_width``, default width).

    ``activation``: a function of a tensor (default GELU) or None (the identity); ``dropout``
    on the hidden layer (none at 0). ``forward(x, canon)`` runs the Canon places C and D
    through ``canon(place, h)`` (``feed_forward``), for the blocks that have them.
    """

    def __init__(self, width: int, hidden: int, activation: Callable | None = F.gelu,
                 dropout: float = 0.0, bias: bool = True, *, out_width: int | None = None,
                 device=None, dtype=None):
        super().__init__()
        width, hidden = _size("FeedForward", "width", width), _size("FeedForward", "hidden", hidden)
        out_width = width if out_width is None else _size("FeedForward", "out_width", out_width)
        if activation is not None and not callable(activation):
            raise TypeError(f"FeedForward: activation must be a function or None, got "
                            f"{activation!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or \
                not 0.0 <= dropout < 1.0:
            raise ValueError(f"FeedForward: dropout must be a number in [0, 1), got {dropout!r}")
        fk = {"device": device, "dtype": dtype}
        self.fc = nn.Linear(width, hidden, bias=bias, **fk)
        self.proj = nn.Linear(hidden, out_width, bias=bias, **fk)
        self.activation = activation
        # no module at 0: the forward is then exactly fc, activation, proj
        self.drop = nn.Dropout(dropout) if dropout else None

    def reset_parameters(self) -> None:
        """Re-draw both maps (torch's ``Linear`` init), as the constructor does."""
        self.fc.reset_parameters()
        self.proj.reset_parameters()

    def extra_repr(self) -> str:
        act = getattr(self.activation, "__name__", repr(self.activation))
        return f"activation={act}"

    def forward(self, x: Tensor, canon: Callable[[str, Tensor], Tensor] | None = None) -> Tensor:
        return feed_forward(x, self.fc, self.proj, self.activation, canon, self.drop)


class PreNormBlock(nn.Module):
    """A Transformer block of pre-norm residual branches: x (B, L, E) -> (B, L, E), each
    branch x <- x + dropout(sublayer(norm(x))) (``pre_norm``) in the order ``branches`` gives.

    A block (``TransformerLM``'s, ``Seq2Seq``'s encoder and decoder blocks) owns its norms
    and sub-layers under its own names and says, per call, which (norm, sublayer) pairs run,
    with the call's other inputs (a cache, a padding mask, the encoder's memory) bound:
    ``forward(x, *args)`` is the branches of ``branches(*args)`` in turn. ``dropout``: on each
    branch's output. ``residual=False``: each branch replaces the stream, x <- dropout(
    sublayer(norm(x))) (a declared layer without a skip). ``skip(x, h)`` is the stream a
    branch's output ``h`` adds to: ``x`` itself (a block whose sublayer keeps fewer rows, a
    sampled graph layer's targets, says which of ``x`` by overriding it).
    """

    def __init__(self, dropout: float = 0.0, residual: bool = True):
        super().__init__()
        if not isinstance(residual, bool):
            raise TypeError(f"PreNormBlock: residual must be True or False, got {residual!r}")
        self.drop = nn.Dropout(dropout)
        self.residual = residual

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each sub-layer's own init)."""
        reset_children(self)

    def branches(self, *args, **kwargs) -> Iterable[tuple[nn.Module, Callable[[Tensor], Tensor]]]:
        """The (norm, sublayer) pairs of one call, in order."""
        raise NotImplementedError

    def skip(self, x: Tensor, h: Tensor) -> Tensor:
        """The residual stream a branch's output ``h`` joins: ``x``."""
        return x

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        for norm, sublayer in self.branches(*args, **kwargs):
            if not self.residual:
                x = self.drop(sublayer(norm(x)))
            else:
                x = pre_norm(x, norm, sublayer, self.drop, self.skip)
        return x


def _rename(d: dict, prefix: str, renames: dict[str, str]) -> None:
    """Rename, in place and keeping the order, the keys of ``d`` under ``prefix`` that start
    with a key of ``renames`` (a name prefix ending with ".") to its value."""
    if not any(k.startswith(prefix + old) for k in d for old in renames):
        return
    items = list(d.items())
    d.clear()
    for k, v in items:
        if k.startswith(prefix):
            rest = k[len(prefix):]
            for old, new in renames.items():
                if rest.startswith(old):
                    k = prefix + new + rest[len(old):]
                    break
        d[k] = v


def _save_former(renames, module, state_dict, prefix, local_metadata):
    _rename(state_dict, prefix, renames)


def _load_former(renames, module, state_dict, prefix, *args):
    _rename(state_dict, prefix, renames)


def former_keys(module: nn.Module, **renames: str) -> None:
    """Keep ``module``'s checkpoint names where its parts moved: ``former="present"`` (module
    paths, e.g. ``fc="mlp.fc"``) makes ``state_dict`` write the entries of ``present`` under
    ``former`` and ``load_state_dict`` read them under either name."""
    save = {f"{new}.": f"{old}." for old, new in renames.items()}
    load = {f"{old}.": f"{new}." for old, new in renames.items()}
    module.register_state_dict_post_hook(partial(_save_former, save))
    module.register_load_state_dict_pre_hook(partial(_load_former, load))

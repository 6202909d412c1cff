"""Pervasive attention (Elbayad, Besacier & Verbeek, CoNLL 2018) from structconv's parts.

No encoder, no decoder: the source (S tokens) and the target so far (T tokens) make one
T x S grid whose cell (i, j) holds the concatenated embeddings of target token i and source
token j, a 2-d bundle of M = T·S entries (row-major, the paper's canonical bijection). A stack
of 2-d grid convolutions (``Grid`` bases, DenseNet-style: every layer's g new channels are
concatenated to its input) mixes the cells; each is causal along the target axis (padding
``(k − 1, 0)``: row i reads rows i − k + 1 .. i only) and centred along the source axis. Then
the source axis is pooled away, one output per target row:

* ``"max"``: y_i = max_j h_ij, channel by channel (a hard attention with one head per channel:
  A_c[(i, j), i] = 1 at channel c's argmax, a depthwise parameter);
* ``"attention"``: an attention convolution with the grid as main input, y_i = Σ_k Σ_j
  α_k[i, j] h_ij Θ_k, α_k[i, ·] = softmax over the row's source cells of the bi-affine
  mechanism's linear term h_ij μ_k (the paper's eq. "biaffine-attention" with Λ = ν = 0: the
  authors' aggregator scores each cell by a linear map of its features), masked to the row:
  the basis ``SourcePooling``, A_k[(i', j), i] = δ_{i i'} α_k[i, j], and a full Θ_k.

Decoding goes row by row: each layer keeps the last k − 1 rows of its convolution's input
(``decoding_state``), so a step computes one new row of every layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import count, floating, number_in, token_ids
from ..attention.masks import masked_softmax
from ..attention.mechanisms import Biaffine
from ..basis.base import Basis
from ..basis.grid import Grid
from ..engine import convolve
from ..params import Full, reset_children
from .decoding import generate
from .grid import GridConv

__all__ = ["SourcePooling", "AttentionPooling", "DenseGridLayer", "PervasiveAttention",
           "POOLINGS"]

#: the poolings over the source axis
POOLINGS = ("max", "attention")


class SourcePooling(Basis):
    """Attention pooling of a T x S grid over its source axis as a basis (K, T·S, T):
    A_k[(i', j), i] = δ_{i i'} alpha[b, k, i, j], grid cells row-major. ``alpha`` (B, K, T, S)
    (each row a distribution over the source, or zeros for a fully masked row) is computed per
    batch item from content, as an attention basis is. ``propagate_heads`` is one contraction
    over j, never the (T·S) x T matrix."""

    cost_kernel = "element"

    def __init__(self, alpha: Tensor):
        if not isinstance(alpha, Tensor) or alpha.dim() != 4:
            got = tuple(alpha.shape) if isinstance(alpha, Tensor) else type(alpha).__name__
            raise ValueError(f"SourcePooling needs alpha (B, K, T, S), got {got}")
        B, K, T, S = alpha.shape
        super().__init__(K, T * S, T)
        self.alpha, self.batch, self.grid = alpha, B, (T, S)

    def __repr__(self):
        return f"SourcePooling(K={self.K}, grid={self.grid}, batch={self.batch})"

    def apply_flops(self):
        return float(self.K * self.M)

    def propagate_heads(self, z: Tensor) -> Tensor:
        if z.dim() != 4 or z.shape[1] != self.M or z.shape[2] != self.K or \
                z.shape[0] not in (self.batch, 1):
            raise ValueError(f"SourcePooling.propagate_heads expects z (B={self.batch}, "
                             f"M={self.M}, K={self.K}, C), got shape {tuple(z.shape)}")
        T, S = self.grid
        zz = z.reshape(z.shape[0], T, S, self.K, z.shape[-1])
        return torch.einsum("bkts,btskc->btkc", self.alpha.to(z.dtype), zz)

    def to_dense(self) -> Tensor:
        """(K, T·S, T), or (B, K, T·S, T) for more than one batch item."""
        B, K, T, S = self.alpha.shape
        eye = torch.eye(T, dtype=self.alpha.dtype, device=self.alpha.device)
        A = torch.einsum("bkts,tu->bktsu", self.alpha, eye).reshape(B, K, T * S, T)
        return A[0] if B == 1 else A


class AttentionPooling(nn.Module):
    """h (B, T, S, C) -> (B, T, Q): y_i = Σ_k Σ_j α_k[i, j] h_ij Θ_k + bias, an attention
    convolution over the ``SourcePooling`` basis; α_k[i, ·] = softmax over the row's unpadded
    source cells of the scores h_ij μ_k (``mechanism``: a ``Biaffine`` with the linear term μ
    alone). ``pad`` (B, S) bool masks padded source positions; a row with none left pools to
    zero (plus the bias)."""

    def __init__(self, channels: int, out_channels: int, heads: int = 1, bias: bool = True):
        super().__init__()
        for name, v in (("channels", channels), ("out_channels", out_channels),
                        ("heads", heads)):
            count(v, f"AttentionPooling: {name}")
        self.mechanism = Biaffine(heads, channels, channels, bilinear=False, linear2=False,
                                  bias=False)
        self.param = Full(heads, channels, out_channels)
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.heads, self.channels = heads, channels

    def reset_parameters(self) -> None:
        """Re-draw μ (``Biaffine``'s init) and theta (``Full``'s); the bias is zero."""
        self.mechanism.reset_parameters()
        self.param.reset_parameters()
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()

    def weights(self, h: Tensor, pad: Tensor | None = None) -> Tensor:
        """α (B, K, T, S): each target row's distribution over the source cells."""
        s = torch.einsum("btsc,kc->bkts", h, self.mechanism.mu.to(h.dtype))
        if pad is not None:
            s = s.masked_fill(pad[:, None, None, :], float("-inf"))
        return masked_softmax(s, -1)

    def basis(self, h: Tensor, pad: Tensor | None = None) -> SourcePooling:
        return SourcePooling(self.weights(h, pad))

    def forward(self, h: Tensor, pad: Tensor | None = None) -> Tensor:
        floating(h, "AttentionPooling: h")
        if h.dim() != 4 or h.shape[-1] != self.channels:
            raise ValueError(f"AttentionPooling expects h (B, T, S, C={self.channels}), got "
                             f"{tuple(h.shape)}")
        B, T, S, C = h.shape
        if pad is not None and (not isinstance(pad, Tensor) or pad.dtype != torch.bool
                                or tuple(pad.shape) != (B, S)):
            got = f"{pad.dtype} {tuple(pad.shape)}" if isinstance(pad, Tensor) else \
                type(pad).__name__
            raise ValueError(f"AttentionPooling: pad must be a (B, S)=({B}, {S}) bool tensor "
                             f"(True: padding), got {got}")
        return convolve(h.reshape(B, T * S, C), self.basis(h, pad), self.param, bias=self.bias)


class DenseGridLayer(nn.Module):
    """One DenseNet layer on the grid (channels last): h (B, T, S, C) -> (B, T, S, growth),
    LayerNorm -> ReLU -> 1x1 (C -> bottleneck) -> LayerNorm -> ReLU -> k x k ``GridConv``
    causal along the target axis (padding (k − 1, 0)) and centred along the source axis.
    The caller concatenates the output to h. ``pad`` (B, S): padded source columns are read
    as zeros by the k x k convolution (the grid's zero padding)."""

    def __init__(self, channels: int, growth: int, bottleneck: int, kernel: int = 3,
                 dropout: float = 0.0):
        super().__init__()
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"DenseGridLayer: kernel must be an odd int >= 1 (centred along "
                             f"the source), got {kernel}")
        self.kernel = kernel
        self.ln1, self.ln2 = nn.LayerNorm(channels), nn.LayerNorm(bottleneck)
        self.reduce = nn.Linear(channels, bottleneck)  # the 1 x 1 convolution
        p = kernel // 2
        self.conv = GridConv(bottleneck, growth, (kernel, kernel),
                             padding=((kernel - 1, 0), (p, p)), layout="image")
        self.drop = nn.Dropout(dropout)
        self._grids: dict = {}

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each sub-layer's own init)."""
        reset_children(self)

    def conv_input(self, h: Tensor, pad: Tensor | None) -> Tensor:
        """The k x k convolution's input (B, T, S, bottleneck), zero at padded columns."""
        u = F.relu(self.ln2(self.reduce(F.relu(self.ln1(h)))))
        return u if pad is None else u.masked_fill(pad[:, None, :, None], 0.0)

    def forward(self, h: Tensor, pad: Tensor | None = None) -> Tensor:
        u = self.conv_input(h, pad).permute(0, 3, 1, 2)  # channels first for the image layout
        return self.drop(self.conv(u).permute(0, 2, 3, 1))

    def step(self, h: Tensor, pad: Tensor | None, past: Tensor) -> tuple[Tensor, Tensor]:
        """One new target row h (B, 1, S, C) after the rows whose convolution inputs ``past``
        (B, k − 1, S, bottleneck) holds -> (its output (B, 1, S, growth), the new ``past``)."""
        u = torch.cat([past, self.conv_input(h, pad)], 1)  # (B, k, S, bottleneck)
        B, k, S, P = u.shape
        grid = self._grids.get(S)
        if grid is None:
            # the same taps over the k rows at hand, no padding along the target: one row
            p = self.kernel // 2
            grid = self._grids[S] = Grid((k, S), (k, k), padding=((0, 0), (p, p)))
        y = convolve(u.reshape(B, k * S, P), grid, self.conv.param, bias=self.conv.bias)
        return self.drop(y.reshape(B, 1, S, -1)), u[:, 1:]


class PervasiveAttention(nn.Module):
    """Elbayad et al.'s pervasive attention: a 2-d convolutional network over the target x
    source grid, then pooling over the source axis; no encoder, no decoder.

    ``forward(src (B, S), tgt (B, T))`` -> logits (B, T, tgt_vocab): row t predicts the token
    after tgt[:, :t+1] (tgt starts with ``bos_id``); the logits of row t depend only on
    tgt[:, :t+1] (the convolutions are causal along the target) and on the whole source.
    Sources are right-padded with ``pad_id`` and padding is masked (an item gives what it would
    alone). The grid's cells start as [target embedding (``embed``); source embedding
    (``embed``)]; ``layers`` ``DenseGridLayer``s of ``growth`` channels (bottleneck
    ``bottleneck``, default 4·growth) on ``kernel`` x ``kernel`` taps; ``pooling`` "max" or
    "attention" (``heads`` heads); a linear map to ``width`` and the output layer.
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, embed: int = 64, layers: int = 8,
                 growth: int = 32, kernel: int = 3, *, bottleneck: int | None = None,
                 pooling: str = "attention", heads: int = 1, width: int | None = None,
                 dropout: float = 0.0, pad_id: int = 0, bos_id: int = 1, eos_id: int = 2):
        super().__init__()
        for name, v in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab), ("embed", embed),
                        ("layers", layers), ("growth", growth), ("heads", heads),
                        ("kernel", kernel), ("bottleneck", bottleneck), ("width", width)):
            if name in ("bottleneck", "width") and (v is None or (v == 0 and not isinstance(
                    v, bool))):
                continue  # (None or 0: the defaults, 4 x growth and 2 x embed)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"PervasiveAttention: {name} must be an int >= 1, got {v!r}")
        if not number_in(dropout, 0.0, 1.0, open_hi=True):
            raise ValueError(f"PervasiveAttention: dropout must be in [0, 1), got {dropout!r}")
        if pooling not in POOLINGS:
            raise ValueError(f"PervasiveAttention: pooling must be one of {POOLINGS}, got "
                             f"{pooling!r}")
        special = (pad_id, bos_id, eos_id)
        if len(set(special)) != 3 or not all(0 <= s < tgt_vocab for s in special):
            raise ValueError(f"PervasiveAttention: pad_id, bos_id, eos_id must be distinct "
                             f"target ids in 0..{tgt_vocab - 1}, got {special}")
        self.src_vocab, self.tgt_vocab, self.pooling = src_vocab, tgt_vocab, pooling
        self.pad_id, self.bos_id, self.eos_id = special
        self.kernel = kernel
        self.src_tok, self.tgt_tok = nn.Embedding(src_vocab, embed), nn.Embedding(tgt_vocab, embed)
        bottleneck = bottleneck or 4 * growth
        C = 2 * embed
        self.layers = nn.ModuleList()
        for _ in range(layers):
            self.layers.append(DenseGridLayer(C, growth, bottleneck, kernel, dropout))
            C += growth
        self.channels, width = C, width or 2 * embed
        self.ln = nn.LayerNorm(C)
        self.pool = AttentionPooling(C, width, heads) if pooling == "attention" else \
            nn.Linear(C, width)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(width, tgt_vocab)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each sub-layer's own init)."""
        reset_children(self)

    def extra_repr(self):
        return f"pooling={self.pooling!r}, channels={self.channels}, kernel={self.kernel}"

    def check_ids(self, ids, vocab: int, what: str) -> Tensor:
        """Token ids (B, L), L >= 1, integers in 0..vocab-1, as long (``ValueError`` else;
        ``what``: "src" or "tgt")."""
        return token_ids(ids, vocab, "PervasiveAttention", f"{what} ids")

    def source(self, src) -> tuple[Tensor, Tensor]:
        """src (B, S) -> (source embeddings (B, S, embed), pad (B, S) bool)."""
        src = self.check_ids(src, self.src_vocab, "src")
        return self.src_tok(src), src == self.pad_id

    def grid(self, tgt: Tensor, src_emb: Tensor) -> Tensor:
        """The input grid (B, T, S, 2·embed): cell (i, j) = [tgt emb i; src emb j]."""
        t = self.tgt_tok(tgt)
        B, T, E = t.shape
        S = src_emb.shape[1]
        return torch.cat([t[:, :, None].expand(B, T, S, E), src_emb[:, None].expand(B, T, S, E)],
                         -1)

    def features(self, src, tgt) -> tuple[Tensor, Tensor]:
        """(the last layer's normalised grid features (B, T, S, channels), pad (B, S))."""
        src_emb, pad = self.source(src)
        tgt = self.check_ids(tgt, self.tgt_vocab, "tgt")
        if tgt.shape[0] != src_emb.shape[0]:
            raise ValueError(f"PervasiveAttention: src has {src_emb.shape[0]} rows, tgt "
                             f"{tgt.shape[0]}")
        h = self.drop(self.grid(tgt, src_emb))
        for layer in self.layers:
            h = torch.cat([h, layer(h, pad)], -1)
        return self.ln(h), pad

    def readout(self, h: Tensor, pad: Tensor) -> Tensor:
        """Grid features (B, T, S, C) -> logits (B, T, V): pool over the source, then map."""
        if self.pooling == "attention":
            y = self.pool(h, pad)
        else:
            y = self.pool(h.masked_fill(pad[:, None, :, None], float("-inf")).amax(2)
                          .nan_to_num(neginf=0.0))  # a fully padded source pools to zero
        return self.head(self.drop(y))

    def forward(self, src, tgt) -> Tensor:
        """src (B, S), tgt (B, T) -> logits (B, T, tgt_vocab)."""
        return self.readout(*self.features(src, tgt))

    @torch.no_grad()
    def pooling_maps(self, src, tgt) -> Tensor:
        """How each target row pools the source (B, T, S), in eval mode: attention pooling's
        weights (mean over heads), or for max pooling the fraction of channels whose max
        sits at each source position."""
        was = self.training
        self.eval()
        try:
            h, pad = self.features(src, tgt)
            if self.pooling == "attention":
                return self.pool.weights(h, pad).mean(1)
            arg = h.masked_fill(pad[:, None, :, None], float("-inf")).argmax(2)  # (B, T, C)
            onehot = F.one_hot(arg, h.shape[2]).to(h.dtype)  # (B, T, C, S)
            return onehot.mean(2)
        finally:
            self.train(was)

    def decoding_state(self, src, use_cache: bool = True) -> _Decoding:
        """A decoding state over src (B, S) for ``structconv.nn.decoding``."""
        return _Decoding(self, src, use_cache)

    @torch.no_grad()
    def generate(self, src, max_len: int | None = None, *, beam: int = 1,
                 use_cache: bool = True, length_penalty: float = 0.0) -> Tensor:
        """Decode src (B, S) -> tokens (B, L) (no start token, ``eos_id`` then padding ends a
        row): greedy for ``beam = 1``, else beam search; ``max_len`` defaults to 2·S + 8.
        ``use_cache=False`` recomputes the whole grid at every step."""
        return generate(self, src, max_len, beam=beam, use_cache=use_cache,
                        length_penalty=length_penalty)


class _Decoding:
    """A ``PervasiveAttention`` decoding state: the source embeddings, and per layer the last
    k − 1 rows of its convolution's input (zeros before the first row: the causal padding), or
    the target prefix when decoding without a cache."""

    def __init__(self, model: PervasiveAttention, src: Tensor, use_cache: bool):
        self.model, self.src = model, src
        self.src_emb, self.pad = model.source(src)
        self.prefix: Tensor | None = None
        self.past: list[Tensor] | None = None
        if use_cache:
            B, S = src.shape
            self.past = [self.src_emb.new_zeros(B, model.kernel - 1, S, layer.reduce.out_features)
                         for layer in model.layers]

    def step(self, last: Tensor) -> Tensor:
        m, last = self.model, last[:, None]
        if self.past is None:
            self.prefix = last if self.prefix is None else torch.cat([self.prefix, last], 1)
            return m(self.src, self.prefix)[:, -1]
        h = m.grid(last, self.src_emb)  # (B, 1, S, 2·embed)
        for i, layer in enumerate(m.layers):
            out, self.past[i] = layer.step(h, self.pad, self.past[i])
            h = torch.cat([h, out], -1)
        return m.readout(m.ln(h), self.pad)[:, -1]

    def select(self, index: Tensor) -> None:
        self.src, self.src_emb, self.pad = self.src[index], self.src_emb[index], self.pad[index]
        if self.prefix is not None:
            self.prefix = self.prefix[index]
        if self.past is not None:
            self.past = [p[index] for p in self.past]

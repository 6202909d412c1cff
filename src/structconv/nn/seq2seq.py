"""The encoder-decoder Transformer whose three attention layers are structured convolutions.

The paper's section "Attention in Transformer" names the three layers: self-attention on the
source, masked self-attention on the target, and cross-attention, "the main input is the source
sequence and the remaining auxiliary input is the target sequence". Each is y = Σ_k A_kᵀ x Θ_k
with A_k = softmax over inputs of (x' Λ_key,k)(y' Λ_query,k)ᵀ / √D (a ``DotProductAttention``
basis, applied by SDPA) and a low-rank Θ_k = V_k O_k (``value_out``):

* ``SelfAttention``    the encoder's: x = x' = y' = the source, bidirectional, with a key padding
  mask; index-based heads are shift matrices of *signed* offsets (``SignedShift``: a 1-d grid
  convolution's basis, the paper's proposal), ALiBi is its symmetric form −m_h·|n − m|;
* ``CausalSelfAttention`` (``structconv.nn.lm``) the decoder's, reused as it is;
* ``CrossAttention``   x = x' = the encoded source (M source positions), y' = the target states
  (N target positions); source padding masks inputs; a fully padded source gives a zero
  attention column (a finite output), never NaN.

``Seq2Seq`` stacks them in pre-norm blocks with every position kind of ``TransformerLM`` on both
sides and Canon layers (causal on the target, centred on the source: ``CentredCanon``), and
decodes greedily or by beam search with a KV cache (``structconv.nn.decoding``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import floating, token_ids
from ..attention.basis import DotProductAttention
from ..attention.index import ALiBi, index_bias
from ..attention.positions import rotary, rotary_angles, sinusoidal
from ..basis.base import Stack
from ..basis.grid import Grid
from ..basis.shift import Shift
from ..engine import convolve
from ..params import LowRank, reset_children
from .blocks import FeedForward, PreNormBlock, former_keys
from .canon import Canon, ResidualDepthwise
from .decoding import generate
from .lm import (
    POSITIONS,
    SINUSOIDAL_SCALE,
    CausalSelfAttention,
    check_cache,
    check_canon,
    check_ffn,
    gpt2_init,
    size_cached,
)

__all__ = ["SignedShift", "CentredCanon", "SelfAttention", "CrossAttention", "EncoderBlock",
           "DecoderBlock", "Seq2Seq", "encoder_shifts", "SEQ2SEQ_POSITIONS"]

SEQ2SEQ_POSITIONS = tuple(p for p in POSITIONS if p != "relative")
"""The position kinds of ``Seq2Seq``: TransformerLM's, except the learned relative bias (its
buckets are causal: the encoder would need signed ones, not built yet)."""


def encoder_shifts(shifts) -> list[int]:
    """Signed shift offsets of the encoder's index heads: an int S gives S offsets centred on 0,
    ``range(-(S // 2), S - S // 2)`` (3 -> -1, 0, 1; 4 -> -2, -1, 0, 1); a sequence is taken
    as given. Offset s makes output n read input n − s (s > 0: an earlier letter)."""
    if isinstance(shifts, bool):
        raise ValueError(f"shifts must be an int >= 0 or a list of offsets, got {shifts!r}")
    if isinstance(shifts, int):
        if shifts < 0:
            raise ValueError(f"shifts must be >= 0, got {shifts}")
        return list(range(-(shifts // 2), shifts - shifts // 2))
    return [int(s) for s in shifts]


class SignedShift(Shift):
    """Shift matrices of signed offsets: A_s[m, n] = 1 iff m = n − shifts[s]; (S, L, L), i.e.
    ``sc.basis.Shift(length, shifts, causal=False)``: head s of output n is the input
    ``shifts[s]`` steps before (after, for a negative offset), zero outside the sequence."""

    def __init__(self, length: int, shifts: Sequence[int]):
        super().__init__(length, shifts, causal=False)


class CentredCanon(nn.Module):
    """A Canon layer for a sequence read both ways: h (B, L, C) -> h + conv(h), a depthwise
    convolution of ``kernel`` taps centred on each position (output n reads inputs
    n − (kernel−1)//2 .. n + kernel//2), no bias: a ``Grid`` basis with 'same' zero padding and
    a ``ResidualDepthwise`` parameter whose identity is the centre tap. ``pad`` (B, L) bool
    marks padding: those inputs are read as zeros, so a padded sequence sees what it would
    alone. The encoder's counterpart of the causal ``Canon``."""

    def __init__(self, channels: int, kernel: int = 4, *, std: float = 0.02):
        super().__init__()
        for name, v in (("channels", channels), ("kernel", kernel)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"CentredCanon: {name} must be an int >= 1, got {v!r}")
        self.channels, self.kernel = channels, kernel
        self.param = ResidualDepthwise(kernel, channels, identity=(kernel - 1) // 2, std=std)
        self._grids: dict = {}

    def reset_parameters(self) -> None:
        """Re-draw the taps (``ResidualDepthwise``'s N(0, std²))."""
        self.param.reset_parameters()

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kernel={self.kernel}"

    def grid(self, length: int) -> Grid:
        """The (cached) basis over ``length`` positions."""
        g = self._grids.get(length)
        if g is None:
            if len(self._grids) >= 16:
                self._grids.clear()
            k = self.kernel
            g = self._grids[length] = Grid((length,), k, padding=(((k - 1) // 2, k // 2),))
        return g

    def forward(self, h: Tensor, pad: Tensor | None = None) -> Tensor:
        floating(h, "CentredCanon: h")
        if h.dim() != 3 or h.shape[-1] != self.channels:
            raise ValueError(f"CentredCanon expects h (B, L, C={self.channels}), got "
                             f"{tuple(h.shape)}")
        if pad is not None:
            h = h.masked_fill(pad[..., None], 0.0)
        return convolve(h, self.grid(h.shape[1]), self.param)


def _check_heads(embed_dim: int, heads: int) -> int:
    if embed_dim < 1 or heads < 1 or embed_dim % heads:
        raise ValueError(f"embed_dim={embed_dim} must be a positive multiple of heads={heads}")
    return embed_dim // heads


def _check_pad(pad: Tensor | None, B: int, L: int, what: str) -> None:
    if pad is not None and (not isinstance(pad, Tensor) or pad.dtype != torch.bool or
                            tuple(pad.shape) != (B, L)):
        got = f"{pad.dtype} {tuple(pad.shape)}" if isinstance(pad, Tensor) else \
            type(pad).__name__
        raise ValueError(f"{what}: pad must be a (B, L)=({B}, {L}) bool tensor (True: padding), "
                         f"got {got}")


class SelfAttention(nn.Module):
    """Bidirectional self-attention over a padded batch: ``heads`` attention heads and one head
    per signed shift offset, one structured convolution over the basis
    ``Stack([DotProductAttention, SignedShift])`` with a LowRank theta (``value_out``).

    x (B, L, E), pad (B, L) bool or None (True: a padding position, masked as a key and read as
    zero by the shift heads) -> (B, L, E). ``rotary`` rotates queries and keys by position;
    ``alibi`` adds −m_h·|n − m| to the scores (``sc.attention.ALiBi``, unmasked: symmetric);
    ``canon`` > 0 puts a ``CentredCanon`` of that many taps on the packed q/k/v.
    """

    def __init__(self, embed_dim: int, heads: int, shifts: Sequence[int] = (), *,
                 rotary: bool = False, alibi: bool = False, dropout: float = 0.0,
                 bias: bool = True, canon: int = 0):
        super().__init__()
        self.D = D = _check_heads(embed_dim, heads)
        if rotary and D % 2:
            raise ValueError(f"rotary needs an even head size, got {D} (embed_dim/heads)")
        if not isinstance(shifts, Sequence) or any(isinstance(s, bool) or not isinstance(s, int)
                                                   for s in shifts):
            raise ValueError(f"SelfAttention: shifts must be a list of int offsets, got "
                             f"{shifts!r}")
        self.shifts = [int(s) for s in shifts]
        self.E, self.H, self.S = embed_dim, heads, len(self.shifts)
        self.rotary, self.dropout = bool(rotary), float(dropout)
        # rows: queries, keys, values of the H attention heads, values of the S shift heads
        self.in_proj = nn.Linear(embed_dim, (3 * heads + self.S) * D, bias=bias)
        self.out_proj = nn.Linear((heads + self.S) * D, embed_dim, bias=bias)
        self.alibi = ALiBi(heads) if alibi else None
        self.canon = CentredCanon(3 * embed_dim, canon) if canon else None
        self._memo: dict = {}

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each sub-layer's own init)."""
        reset_children(self)

    def extra_repr(self):
        return (f"embed_dim={self.E}, heads={self.H}, shifts={self.shifts}, "
                f"rotary={self.rotary}, alibi={self.alibi is not None}")

    def _cached(self, key, make):
        return size_cached(self._memo, key, make)  # rotary angles and ALiBi tables

    def _mask(self, L: int, pad: Tensor | None, dtype, device) -> Tensor | None:
        """SDPA-orientation mask: bool (B, 1, 1, L) keys allowed, or float (B|1, H, L, L)
        with ALiBi's scores and -inf on padded keys."""
        if self.alibi is None:
            return None if pad is None else ~pad[:, None, None, :]
        m = self._cached(("alibi", L, dtype, device), lambda: index_bias(
            [self.alibi], L, L, dtype=dtype, device=device)[None])
        return m if pad is None else m.masked_fill(pad[:, None, None, :], float("-inf"))

    def _parts(self, x: Tensor, pad: Tensor | None) -> list:
        """[(basis, value heads (B, L, K, D))]: the attention heads and the shift heads."""
        B, L, _ = x.shape
        H, S, D = self.H, self.S, self.D
        y = self.in_proj(x)
        qkv, zs = y.split([3 * H * D, S * D], -1)
        if self.canon is not None:
            qkv = self.canon(qkv, pad)
        q, k, v = (t.reshape(B, L, H, D).transpose(1, 2) for t in qkv.split(H * D, -1))
        if self.rotary:
            ang = self._cached(("rot", L, q.dtype, q.device), lambda: rotary_angles(
                L, D, dtype=q.dtype, device=q.device))
            q, k = rotary(q, angles=ang), rotary(k, angles=ang)
        att = DotProductAttention(q, k, sdpa_mask=self._mask(L, pad, q.dtype, q.device),
                                  dropout_p=self.dropout if self.training else 0.0,
                                  check_dead=pad is not None)
        out = [(att, v.transpose(1, 2))]
        if S:
            zs = zs.reshape(B, L, S, D)
            if pad is not None:  # the shift heads read zeros beyond the sequence's end
                zs = zs.masked_fill(pad[:, :, None, None], 0.0)
            out.append((SignedShift(L, self.shifts), zs))
        return out

    def basis(self, x: Tensor, pad: Tensor | None = None):
        """The layer's basis on x (B, L, E): the attention heads, stacked with the shift heads
        when the layer has them."""
        parts = [b for b, _ in self._parts(x, pad)]
        return parts[0] if len(parts) == 1 else Stack(parts)

    def value_out(self) -> LowRank:
        """theta_k = V_k O_k for the H + S heads as ``sc.params.LowRank`` (copied, no biases)."""
        H, S, D, E = self.H, self.S, self.D, self.E
        W = self.in_proj.weight
        lr = LowRank(H + S, E, E, D).to(W)
        with torch.no_grad():
            V = torch.cat([W[2 * H * D: 3 * H * D], W[3 * H * D:]], 0)
            lr.value.copy_(V.reshape(H + S, D, E).transpose(1, 2))
            lr.out.copy_(self.out_proj.weight.reshape(E, H + S, D).permute(1, 2, 0))
        return lr

    def forward(self, x: Tensor, pad: Tensor | None = None) -> Tensor:
        floating(x, "SelfAttention: x")
        if x.dim() != 3 or x.shape[-1] != self.E:
            raise ValueError(f"SelfAttention expects x (B, L, E={self.E}), got {tuple(x.shape)}")
        B, L = x.shape[:2]
        _check_pad(pad, B, L, "SelfAttention")
        hs = [basis.propagate_heads(z) for basis, z in self._parts(x, pad)]
        h = hs[0] if len(hs) == 1 else torch.cat(hs, 2)  # (B, L, H + S, D)
        return self.out_proj(h.reshape(B, L, (self.H + self.S) * self.D))


class CrossAttention(nn.Module):
    """Cross-attention as an attention convolution: main input x = x' = the source (B, S, E)
    (``memory``), auxiliary input y' = the target states (B, T, E); A_k[m, n] is the weight of
    source position m on target position n. ``pad`` (B, S) bool masks source padding (a fully
    padded source gives zero columns: a finite output). y (B, T, E) -> (B, T, E).

    With a ``cache`` (a dict) the source keys and values are computed once, on the first call,
    and read on every later step.
    """

    def __init__(self, embed_dim: int, heads: int, *, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.D = _check_heads(embed_dim, heads)
        self.E, self.H, self.dropout = embed_dim, heads, float(dropout)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.kv_proj = nn.Linear(embed_dim, 2 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each sub-layer's own init)."""
        reset_children(self)

    def extra_repr(self):
        return f"embed_dim={self.E}, heads={self.H}"

    def _parts(self, y: Tensor, memory: Tensor, pad: Tensor | None, cache: dict | None):
        """(basis (K = H, M = S, N = T), source value heads z (B, S, H, D))."""
        B, T, _ = y.shape
        H, D = self.H, self.D
        if cache is not None and "ck" in cache:
            k, v = cache["ck"], cache["cv"]
        else:
            S = memory.shape[1]
            k, v = (t.reshape(B, S, H, D).transpose(1, 2)
                    for t in self.kv_proj(memory).split(self.E, -1))
            if cache is not None:
                cache["ck"], cache["cv"] = k, v
        q = self.q_proj(y).reshape(B, T, H, D).transpose(1, 2)
        mask = None if pad is None else ~pad[:, None, None, :]
        att = DotProductAttention(q, k, sdpa_mask=mask, check_dead=pad is not None,
                                  dropout_p=self.dropout if self.training else 0.0)
        return att, v.transpose(1, 2)

    def basis(self, y: Tensor, memory: Tensor, pad: Tensor | None = None) -> DotProductAttention:
        """The attention basis (K = heads, M = source positions, N = target positions)."""
        return self._parts(y, memory, pad, None)[0]

    def value_out(self) -> LowRank:
        """theta_k = V_k O_k as ``sc.params.LowRank`` (copied, no biases)."""
        H, D, E = self.H, self.D, self.E
        lr = LowRank(H, E, E, D).to(self.out_proj.weight)
        with torch.no_grad():
            lr.value.copy_(self.kv_proj.weight[E:].reshape(H, D, E).transpose(1, 2))
            lr.out.copy_(self.out_proj.weight.reshape(E, H, D).permute(1, 2, 0))
        return lr

    def forward(self, y: Tensor, memory: Tensor, pad: Tensor | None = None,
                cache: dict | None = None) -> Tensor:
        floating(y, "CrossAttention: y")
        floating(memory, "CrossAttention: memory")
        if y.dim() != 3 or y.shape[-1] != self.E or memory.dim() != 3 or \
                memory.shape[-1] != self.E or memory.shape[0] != y.shape[0]:
            raise ValueError(f"CrossAttention expects y (B, T, E={self.E}) and memory (B, S, "
                             f"E={self.E}), got {tuple(y.shape)} and {tuple(memory.shape)}")
        _check_pad(pad, memory.shape[0], memory.shape[1], "CrossAttention")
        basis, z = self._parts(y, memory, pad, cache)
        B, T = y.shape[:2]
        return self.out_proj(basis.propagate_heads(z).reshape(B, T, self.E))


def _ff_canon(E: int, ffn: int, canon: str, make) -> nn.ModuleDict:
    """The Canon layers of a block's feed-forward: C (before it, E channels) and D (inside it,
    before the activation, ffn channels) where ``canon`` names them; ``make(channels)``."""
    return nn.ModuleDict({p: make(E if p == "C" else ffn) for p in canon if p in "CD"})


#: where the blocks' checkpoints keep the feed-forward's norm and Canon layers (their names
#: from before ``FeedForward``): ``ff.ln`` and ``ff.canon``
_FORMER_FF = {"ff.ln": "ln_ff", "ff.canon": "canon_ff"}


class EncoderBlock(PreNormBlock):
    """Pre-norm encoder block: x + attn(A(ln x)), then x + ffn(ln_ff x) with Canon C, D
    (centred Canon layers where ``canon`` names them); (B, L, E), pad (B, L) -> (B, L, E)."""

    def __init__(self, E: int, heads: int, shifts, ffn: int, dropout: float = 0.0,
                 bias: bool = True, rotary: bool = False, alibi: bool = False, canon: str = "",
                 canon_kernel: int = 4):
        super().__init__(dropout)
        self.ln = nn.LayerNorm(E, bias=bias)
        self.attn = SelfAttention(E, heads, shifts, rotary=rotary, alibi=alibi, dropout=dropout,
                                  bias=bias, canon=canon_kernel if "B" in canon else 0)
        self.ln_ff = nn.LayerNorm(E, bias=bias)
        self.ff = FeedForward(E, ffn, F.gelu, bias=bias)
        self.canon_ff = _ff_canon(E, ffn, canon, lambda c: CentredCanon(c, canon_kernel))
        self.canon_a = CentredCanon(E, canon_kernel) if "A" in canon else None
        former_keys(self, **_FORMER_FF)

    def branches(self, pad: Tensor | None = None):
        def apply(place, h):
            return self.canon_ff[place](h, pad) if place in self.canon_ff else h

        def attend(h):
            return self.attn(h if self.canon_a is None else self.canon_a(h, pad), pad)

        return ((self.ln, attend), (self.ln_ff, lambda h: self.ff(h, apply)))


class DecoderBlock(PreNormBlock):
    """Pre-norm decoder block: y + self-attn(A(ln1 y)) (causal, ``CausalSelfAttention``), then
    y + cross-attn(ln2 y, memory), then y + ffn(ln_ff y) with causal Canon C, D; (B, T, E) ->
    (B, T, E). ``cache`` (a dict) continues a target sequence step by step."""

    def __init__(self, E: int, heads: int, shifts, ffn: int, dropout: float = 0.0,
                 bias: bool = True, rotary: bool = False, alibi: bool = False, canon: str = "",
                 canon_kernel: int = 4):
        super().__init__(dropout)
        self.ln1, self.ln2 = nn.LayerNorm(E, bias=bias), nn.LayerNorm(E, bias=bias)
        self.self_attn = CausalSelfAttention(E, heads, shifts, rotary=rotary, alibi=alibi,
                                             dropout=dropout, bias=bias,
                                             canon=canon_kernel if "B" in canon else 0)
        self.cross_attn = CrossAttention(E, heads, dropout=dropout, bias=bias)
        self.ln_ff = nn.LayerNorm(E, bias=bias)
        self.ff = FeedForward(E, ffn, F.gelu, bias=bias)
        self.canon_ff = _ff_canon(E, ffn, canon, lambda c: Canon(c, canon_kernel))
        self.canon_a = Canon(E, canon_kernel) if "A" in canon else None
        former_keys(self, **_FORMER_FF)

    def self_attention_input(self, y: Tensor, cache: dict | None = None) -> Tensor:
        """What the self-attention reads: Canon-A of the normalised input."""
        return self._canon_a(self.ln1(y), cache)

    def _canon_a(self, h: Tensor, cache: dict | None) -> Tensor:
        return h if self.canon_a is None else self.canon_a(h, cache, "canon_A")

    def branches(self, memory: Tensor, pad: Tensor | None = None, cache: dict | None = None):
        def apply(place, h):
            return self.canon_ff[place](h, cache, f"canon_{place}") if place in self.canon_ff \
                else h

        return ((self.ln1, lambda h: self.self_attn(self._canon_a(h, cache), cache)),
                (self.ln2, lambda h: self.cross_attn(h, memory, pad, cache)),
                (self.ln_ff, lambda h: self.ff(h, apply)))


class Seq2Seq(nn.Module):
    """An encoder-decoder Transformer whose attention layers are structured convolutions.

    ``forward(src (B, S), tgt (B, T))`` -> logits (B, T, tgt_vocab): position t predicts the
    target token after tgt[:, :t+1] (tgt starts with ``bos_id``), reading the whole source; the
    logits at t depend only on tgt[:, :t+1]. Sources are right-padded with ``pad_id``: padding
    is masked everywhere (a batch item gives what it would alone). ``layers`` encoder and
    ``dec_layers`` (default ``layers``) decoder blocks of ``width``, ``heads`` attention heads
    and feed-forward width ``ffn`` (default 4·width). ``position``: one of
    ``SEQ2SEQ_POSITIONS`` on both sides: ``"shift"`` adds ``shifts`` index heads, causal
    offsets 0..S-1 in the decoder and signed offsets (``src_shifts``, default
    ``encoder_shifts(shifts)``) in the encoder;
    ``"alibi"`` is causal in the decoder and symmetric in the encoder; ``"learned"`` needs
    ``context`` (the longest source or target). Cross-attention carries no position term.
    ``canon``: Canon places (a subset of "ABCD") in every block, causal in the decoder,
    centred in the encoder. The output map is tied to the target embedding (``tie_weights``).
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, width: int = 256, layers: int = 3,
                 heads: int = 4, position: str = "sinusoidal", shifts: int | Sequence[int] = 4,
                 ffn: int | None = None, dropout: float = 0.0, *, dec_layers: int | None = None,
                 src_shifts: int | Sequence[int] | None = None, context: int | None = None,
                 bias: bool = True, tie_weights: bool = True, canon: str = "",
                 canon_kernel: int = 4, pad_id: int = 0, bos_id: int = 1, eos_id: int = 2):
        super().__init__()
        dec_layers = layers if dec_layers is None else dec_layers
        self._check_sizes(src_vocab, tgt_vocab, width, layers, dec_layers, heads, position,
                          dropout, context, (pad_id, bos_id, eos_id))
        self.canon, self.canon_kernel = check_canon(canon, canon_kernel), canon_kernel
        self.src_vocab, self.tgt_vocab, self.width, self.position = (src_vocab, tgt_vocab,
                                                                      width, position)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.context = context if position == "learned" else None
        self.ffn = check_ffn("Seq2Seq", ffn, width)
        dec_shifts, enc_shifts = self._shifts(position, shifts, src_shifts)
        self.shifts, self.src_shifts = dec_shifts, enc_shifts
        self.src_tok, self.tgt_tok = nn.Embedding(src_vocab, width), nn.Embedding(tgt_vocab, width)
        learned = position == "learned"
        self.src_pos = nn.Parameter(torch.zeros(context, width)) if learned else None
        self.tgt_pos = nn.Parameter(torch.zeros(context, width)) if learned else None
        self.drop = nn.Dropout(dropout)
        kw = dict(ffn=self.ffn, dropout=dropout, bias=bias, rotary=position == "rotary",
                  alibi=position in ("alibi", "shift+alibi"), canon=self.canon,
                  canon_kernel=canon_kernel)
        self.encoder = nn.ModuleList(EncoderBlock(width, heads, enc_shifts, **kw)
                                     for _ in range(layers))
        self.decoder = nn.ModuleList(DecoderBlock(width, heads, dec_shifts, **kw)
                                     for _ in range(dec_layers))
        self.ln_enc, self.ln_dec = nn.LayerNorm(width, bias=bias), nn.LayerNorm(width, bias=bias)
        self.head = nn.Linear(width, tgt_vocab, bias=False)
        if tie_weights:
            self.head.weight = self.tgt_tok.weight
        self._init()

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does: the layers' own inits, then GPT-2's
        (``gpt2_init``) over them."""
        reset_children(self)
        self._init()

    @staticmethod
    def _check_sizes(src_vocab, tgt_vocab, width, layers, dec_layers, heads, position, dropout,
                     context, special) -> None:
        if position not in SEQ2SEQ_POSITIONS:
            why = (" (TransformerLM's relative bias has no encoder form here yet)"
                   if position == "relative" else "")
            raise ValueError(f"unknown position {position!r}{why}: choose one of "
                             f"{', '.join(SEQ2SEQ_POSITIONS)}")
        for name, v in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab), ("width", width),
                        ("layers", layers), ("dec_layers", dec_layers), ("heads", heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Seq2Seq: {name} must be an int >= 1, got {v!r}")
        if width % heads:
            raise ValueError(f"Seq2Seq: width={width} must be a multiple of heads={heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"Seq2Seq: dropout must be in [0, 1), got {dropout}")
        if position == "learned" and (not isinstance(context, int) or isinstance(context, bool)
                                      or context < 1):
            raise ValueError(f"position='learned' needs context=int >= 1, got {context!r}")
        for name, v in zip(("pad_id", "bos_id", "eos_id"), special):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < tgt_vocab:
                raise ValueError(f"Seq2Seq: {name}={v!r} must be a target token id in "
                                 f"0..{tgt_vocab - 1}")
        if len(set(special)) != 3:
            raise ValueError(f"Seq2Seq: pad_id, bos_id, eos_id must differ, got {special}")

    @staticmethod
    def _shifts(position: str, shifts, src_shifts) -> tuple[list[int], list[int]]:
        """(decoder offsets, encoder offsets) of the shift heads (none unless a shift kind)."""
        if not position.startswith("shift"):
            return [], []
        if isinstance(shifts, bool) or (isinstance(shifts, int) and shifts < 1):
            raise ValueError(f"position={position!r} needs at least one shift head, got "
                             f"shifts={shifts!r}")
        dec = list(range(shifts)) if isinstance(shifts, int) else [int(s) for s in shifts]
        if not dec or min(dec) < 0:
            raise ValueError(f"decoder shift offsets must be >= 0 (causal), got {dec}")
        enc = encoder_shifts(shifts if src_shifts is None else src_shifts)
        if not enc:
            raise ValueError(f"position={position!r} needs at least one encoder shift head")
        return dec, enc

    def _init(self) -> None:
        # GPT-2's, as TransformerLM's: the residual projections scaled by 1/sqrt(branches ·
        # layers), two branches per encoder block and three per decoder block
        n = len(self.encoder) + len(self.decoder)
        gpt2_init(self, [self.src_pos, self.tgt_pos],
                  [(w, 2 * n) for b in self.encoder for w in (b.attn.out_proj.weight,
                                                              b.ff.proj.weight)]
                  + [(w, 3 * n) for b in self.decoder for w in (
                      b.self_attn.out_proj.weight, b.cross_attn.out_proj.weight,
                      b.ff.proj.weight)])

    def extra_repr(self):
        return (f"position={self.position!r}, shifts={self.shifts}, "
                f"src_shifts={self.src_shifts}, context={self.context}, canon={self.canon!r}")

    # -- inputs --------------------------------------------------------------------------------
    def check_ids(self, ids, vocab: int, what: str) -> Tensor:
        """Token ids (B, L), L >= 1, of an integer dtype with 0 <= id < vocab, as long;
        ``ValueError`` naming what is wrong (``what``: "src" or "tgt")."""
        return token_ids(ids, vocab, "Seq2Seq", f"{what} ids")

    def _positions(self, x: Tensor, table: Tensor | None, start: int) -> Tensor:
        L = x.shape[1]
        if self.position == "learned":
            if start + L > self.context:
                raise ValueError(f"sequence length {start + L} exceeds the learned context "
                                 f"{self.context} (position='learned' cannot extrapolate)")
            return x + table[start:start + L]
        if self.position == "sinusoidal":
            pos = torch.arange(start, start + L, device=x.device)
            # at the token embeddings' initial scale, as TransformerLM (SINUSOIDAL_SCALE)
            return x + SINUSOIDAL_SCALE * sinusoidal(pos, self.width, dtype=x.dtype)
        return x

    # -- the two stacks ----------------------------------------------------------------------
    def run_encoder(self, x: Tensor, pad: Tensor | None = None) -> Tensor:
        """Embedded source x (B, S, width) -> memory (B, S, width) (final norm included)."""
        for b in self.encoder:
            x = b(x, pad)
        return self.ln_enc(x)

    def run_decoder(self, y: Tensor, memory: Tensor, pad: Tensor | None = None,
                    cache: list | None = None) -> Tensor:
        """Embedded target y (B, T, width) -> states (B, T, width) (final norm included)."""
        for i, b in enumerate(self.decoder):
            y = b(y, memory, pad, None if cache is None else cache[i])
        return self.ln_dec(y)

    def encode(self, src) -> tuple[Tensor, Tensor]:
        """src (B, S) ids -> (memory (B, S, width), pad (B, S) bool, True at padding)."""
        src = self.check_ids(src, self.src_vocab, "src")
        pad = src == self.pad_id
        x = self.drop(self._positions(self.src_tok(src), self.src_pos, 0))
        return self.run_encoder(x, pad), pad

    def decode(self, tgt, memory: Tensor, pad: Tensor | None = None,
               cache: list | None = None) -> Tensor:
        """tgt (B, T) ids (continuing the cache's prefix when one is given) -> logits."""
        tgt = self.check_ids(tgt, self.tgt_vocab, "tgt")
        if tgt.shape[0] != memory.shape[0]:
            raise ValueError(f"Seq2Seq: the source has {memory.shape[0]} rows but tgt has "
                             f"{tgt.shape[0]} (shape {tuple(tgt.shape)})")
        check_cache(cache, len(self.decoder), "Seq2Seq")
        start = 0 if not cache or "k" not in cache[0] else cache[0]["k"].shape[2]
        y = self.drop(self._positions(self.tgt_tok(tgt), self.tgt_pos, start))
        return self.head(self.run_decoder(y, memory, pad, cache))

    def forward(self, src, tgt) -> Tensor:
        """src (B, S), tgt (B, T) ids (tgt starting with ``bos_id``) -> logits (B, T, V)."""
        memory, pad = self.encode(src)
        return self.decode(tgt, memory, pad)

    @torch.no_grad()
    def cross_attention_maps(self, src, tgt) -> list[Tensor]:
        """Every decoder layer's cross-attention weights (the alignment): a list of
        (B, heads, T, S) in SDPA orientation (target position, source position), in eval
        mode."""
        was = self.training
        self.eval()
        try:
            memory, pad = self.encode(src)
            tgt = self.check_ids(tgt, self.tgt_vocab, "tgt")
            y = self._positions(self.tgt_tok(tgt), self.tgt_pos, 0)
            maps = []
            for b in self.decoder:
                h = y + b.self_attn(b.self_attention_input(y))
                maps.append(b.cross_attn.basis(b.ln2(h), memory, pad).weights())
                y = b(y, memory, pad)
            return maps
        finally:
            self.train(was)

    # -- decoding ------------------------------------------------------------------------------
    def new_cache(self) -> list[dict]:
        """An empty decoding cache: one dict per decoder layer (self-attention keys/values,
        shift heads' and Canon layers' last inputs, the source keys/values)."""
        return [{} for _ in self.decoder]

    def decoding_state(self, src, use_cache: bool = True) -> _Decoding:
        """A decoding state over src (B, S) for ``structconv.nn.decoding`` (encodes once)."""
        memory, pad = self.encode(src)
        return _Decoding(self, memory, pad, use_cache)

    @torch.no_grad()
    def generate(self, src, max_len: int | None = None, *, beam: int = 1,
                 use_cache: bool = True, length_penalty: float = 0.0) -> Tensor:
        """Decode src (B, S) -> tokens (B, L) (no start token; ``eos_id`` ends a row, padding
        follows): greedy for ``beam = 1``, else beam search. ``max_len`` defaults to
        2·S + 8 tokens. ``use_cache=False`` recomputes the whole prefix at every step."""
        return generate(self, src, max_len, beam=beam, use_cache=use_cache,
                        length_penalty=length_penalty)

    # -- torch.nn.Transformer's weights --------------------------------------------------------
    @torch.no_grad()
    def load_torch_transformer(self, t: nn.Transformer) -> Seq2Seq:
        """Copy the weights of a ``torch.nn.Transformer`` (``norm_first=True``, ``batch_first``,
        gelu, the same width, heads, ffn and layer counts) into the encoder and decoder stacks
        (embeddings and positions are not in torch's module). Returns self."""
        enc, dec = t.encoder.layers, t.decoder.layers
        if len(enc) != len(self.encoder) or len(dec) != len(self.decoder):
            raise ValueError(f"torch Transformer has {len(enc)}/{len(dec)} layers, this model "
                             f"{len(self.encoder)}/{len(self.decoder)}")
        for ours, theirs in zip(self.encoder, enc):
            _copy_mha(ours.attn, theirs.self_attn, packed=True)
            ours.ln.load_state_dict(theirs.norm1.state_dict())
            _copy_feed_forward(ours, theirs.norm2, theirs)
        for ours, theirs in zip(self.decoder, dec):
            _copy_mha(ours.self_attn, theirs.self_attn, packed=True)
            _copy_mha(ours.cross_attn, theirs.multihead_attn, packed=False)
            ours.ln1.load_state_dict(theirs.norm1.state_dict())
            ours.ln2.load_state_dict(theirs.norm2.state_dict())
            _copy_feed_forward(ours, theirs.norm3, theirs)
        self.ln_enc.load_state_dict(t.encoder.norm.state_dict())
        self.ln_dec.load_state_dict(t.decoder.norm.state_dict())
        return self


def _copy_mha(ours: nn.Module, theirs: nn.MultiheadAttention, packed: bool) -> None:
    """torch's packed [q; k; v] in-projection and out-projection into one of our layers."""
    E = theirs.embed_dim
    if getattr(ours, "S", 0):
        raise ValueError("a layer with shift heads has no torch counterpart")
    W, b = theirs.in_proj_weight, theirs.in_proj_bias
    if packed:
        ours.in_proj.weight.copy_(W)
        if b is not None:
            ours.in_proj.bias.copy_(b)
    else:
        ours.q_proj.weight.copy_(W[:E])
        ours.kv_proj.weight.copy_(W[E:])
        if b is not None:
            ours.q_proj.bias.copy_(b[:E])
            ours.kv_proj.bias.copy_(b[E:])
    ours.out_proj.load_state_dict(theirs.out_proj.state_dict())


def _copy_feed_forward(ours: nn.Module, norm: nn.LayerNorm, theirs) -> None:
    """torch's feed-forward norm and maps (``linear1``, ``linear2``) into one of our blocks."""
    ours.ln_ff.load_state_dict(norm.state_dict())
    ours.ff.fc.load_state_dict(theirs.linear1.state_dict())
    ours.ff.proj.load_state_dict(theirs.linear2.state_dict())


class _Decoding:
    """A ``Seq2Seq`` decoding state (``structconv.nn.decoding``'s protocol): the encoded source,
    and either a KV cache or the target prefix (recomputed at every step without a cache)."""

    def __init__(self, model: Seq2Seq, memory: Tensor, pad: Tensor, use_cache: bool):
        self.model, self.memory, self.pad = model, memory, pad
        self.cache = model.new_cache() if use_cache else None
        self.prefix: Tensor | None = None

    def step(self, last: Tensor) -> Tensor:
        last = last[:, None]
        if self.cache is not None:
            return self.model.decode(last, self.memory, self.pad, self.cache)[:, -1]
        self.prefix = last if self.prefix is None else torch.cat([self.prefix, last], 1)
        return self.model.decode(self.prefix, self.memory, self.pad)[:, -1]

    def select(self, index: Tensor) -> None:
        self.memory, self.pad = self.memory[index], self.pad[index]
        if self.prefix is not None:
            self.prefix = self.prefix[index]
        if self.cache is not None:
            for layer in self.cache:
                for k, v in layer.items():
                    layer[k] = v[index]

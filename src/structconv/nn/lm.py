"""Sequence models: causal self-attention with shift heads, and ``TransformerLM``.

``CausalSelfAttention`` is one structured convolution y = Σ_k A_kᵀ x Θ_k over the basis
``Stack([DotProductAttention(q, k, causal), CausalShift(L, shifts)])``: H content-based heads
(softmax of query·key, SDPA) and S index-based causal shift heads, with a LowRank theta
Θ_k = V_k O_k of rank D per head (``value_out``). The value maps V_k of every head are packed
with the query/key maps into one input GEMM (as nanoGPT packs q, k, v), the heads are
propagated by their bases, and one GEMM applies every O_k.

``TransformerLM`` is a decoder-only language model of such layers; ``position`` picks how it
knows where a token is: nothing, sinusoidal or learned encodings, rotary q/k, ALiBi's mask,
a learned T5-style relative bias, the paper's shift heads, or shift heads plus ALiBi.
``canon`` adds Canon layers (Allen-Zhu 2025, ``structconv.nn.canon``): residual causal
depthwise convolutions over the sequence at the places A (before attention), B (on q/k/v),
C (before the feed-forward), D (inside it).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import floating, token_ids
from ..attention.basis import CausalShift, DotProductAttention
from ..attention.index import RelativeBias, index_bias
from ..attention.positions import alibi_mask, alibi_slopes, rotary, rotary_angles, sinusoidal
from ..basis.base import Stack
from ..params import LowRank, reset_children
from .blocks import FeedForward, PreNormBlock, former_keys
from .canon import CANON_PLACES, Canon

__all__ = ["CausalSelfAttention", "TransformerLM", "POSITIONS", "CANON_TAG", "equalised_ffn",
           "check_canon", "canon_places", "split_kind", "kind_name", "RELATIVE_BUCKETS",
           "RELATIVE_MAX_DISTANCE", "gpt2_init", "GPT2_STD"]

#: the amplitude of the sinusoidal encoding: the token embeddings' initial standard deviation
SINUSOIDAL_SCALE = 0.02

#: the position kinds of ``TransformerLM``
POSITIONS = ("none", "sinusoidal", "learned", "rotary", "alibi", "relative", "shift",
             "shift+alibi")

#: the ``"relative"`` kind's T5 buckets (T5's defaults, unidirectional: 16 exact offsets
#: 0..15, 16 logarithmic buckets up to 128, then one bucket for every longer offset)
RELATIVE_BUCKETS = 32
RELATIVE_MAX_DISTANCE = 128

#: GPT-2's initial standard deviation of every weight
GPT2_STD = 0.02

#: how a model kind names its Canon places: "<position>+Canon-<places>", e.g. "none+Canon-ABCD"
CANON_TAG = "+Canon-"


def _shift_list(shifts) -> list[int]:
    if isinstance(shifts, bool):
        raise ValueError(f"shifts must be an int >= 0 or a list of offsets, got {shifts!r}")
    if isinstance(shifts, int):
        if shifts < 0:
            raise ValueError(f"shifts must be >= 0, got {shifts}")
        return list(range(shifts))
    if not isinstance(shifts, Sequence) or any(isinstance(s, bool) or not isinstance(
            s, numbers.Integral) for s in shifts):
        raise ValueError(f"shifts must be an int >= 0 or a list of int offsets, got {shifts!r}")
    out = [int(s) for s in shifts]
    if any(s < 0 for s in out):
        raise ValueError(f"shift offsets must be >= 0 (causal), got {out}")
    return out


def check_cache(cache, layers: int, who: str) -> None:
    """``cache`` is None or a generation cache: a list of one dict per layer (``new_cache``)."""
    if cache is not None and (not isinstance(cache, list) or len(cache) != layers or
                              not all(isinstance(c, dict) for c in cache)):
        got = f"a list of {len(cache)}" if isinstance(cache, list) else type(cache).__name__
        raise ValueError(f"{who}: cache must be a list of {layers} dicts, one per layer (from "
                         f"new_cache()), got {got}")


def check_ffn(who: str, ffn, width: int) -> int:
    """The feed-forward width: ``ffn``, or 4·width when it is None (or 0, a config's default);
    ``ValueError`` naming ``ffn`` for anything but an int >= 1."""
    if ffn is None or (isinstance(ffn, numbers.Integral) and not isinstance(ffn, bool)
                       and ffn == 0):
        return 4 * width
    if isinstance(ffn, bool) or not isinstance(ffn, numbers.Integral) or ffn < 1:
        raise ValueError(f"{who}: ffn must be an int >= 1 (or None: 4 x width), got {ffn!r}")
    return int(ffn)


def check_canon(canon, canon_kernel) -> str:
    """The Canon places ``canon`` (a subset of "ABCD", each letter once) in A-D order; raises
    ``ValueError`` for anything else or for ``canon_kernel`` not an int >= 1."""
    if isinstance(canon_kernel, bool) or not isinstance(canon_kernel, int) or canon_kernel < 1:
        raise ValueError(f"canon_kernel must be an int >= 1, got {canon_kernel!r}")
    return canon_places(canon)


def canon_places(canon) -> str:
    """``canon`` (a subset of "ABCD", each letter once, any order) in A-D order, else
    ``ValueError`` naming the offending letters."""
    if not isinstance(canon, str):
        raise ValueError(f"canon must be a string of Canon places from 'ABCD', got {canon!r}")
    bad = sorted({c for c in canon if c not in CANON_PLACES})
    if bad:
        raise ValueError(f"canon={canon!r}: unknown Canon place(s) {', '.join(map(repr, bad))};"
                         f" the places are A, B, C, D")
    if len(set(canon)) != len(canon):
        raise ValueError(f"canon={canon!r} names a place twice")
    return "".join(c for c in CANON_PLACES if c in canon)


def split_kind(kind: str) -> tuple[str, str]:
    """A model kind -> (position, canon places): "rotary" -> ("rotary", ""),
    "shift+alibi+Canon-AC" -> ("shift+alibi", "AC") (the tag is matched in any case).
    ``ValueError`` for an unknown position kind or Canon place."""
    if not isinstance(kind, str):
        raise ValueError(f"a model kind is a string such as 'none+Canon-ABCD', got {kind!r}")
    i = kind.lower().rfind(CANON_TAG.lower())
    position, canon = (kind, "") if i < 0 else (kind[:i], kind[i + len(CANON_TAG):])
    if position not in POSITIONS:
        raise ValueError(f"unknown position kind {position!r} in {kind!r}: choose one of "
                         f"{', '.join(POSITIONS)}, optionally followed by {CANON_TAG}<places>")
    if i >= 0 and not canon:
        raise ValueError(f"{kind!r} names no Canon place after {CANON_TAG!r} (places A-D)")
    return position, canon_places(canon)


def kind_name(position: str, canon: str = "") -> str:
    """The model kind of a position kind and Canon places (``split_kind``'s inverse)."""
    return f"{position}{CANON_TAG}{canon}" if canon else position


def gpt2_init(model: nn.Module, extra=(), residual=()) -> None:
    """GPT-2's initialisation in place: every ``Linear`` and ``Embedding`` weight of ``model``
    N(0, 0.02²) with zero biases, then each of ``extra`` (tensors) N(0, 0.02²), then each
    ``(weight, n)`` of ``residual`` (the projections onto the residual stream) N(0, 0.02²/n)
    (GPT-2: n = 2·layers, two residual branches per layer), drawn in that order."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, GPT2_STD)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
        for p in extra:
            if p is not None:
                p.normal_(0.0, GPT2_STD)
        for w, n in residual:
            w.normal_(0.0, GPT2_STD / math.sqrt(n))


def size_cached(store: dict, key, make):
    """``store[key]``, made by ``make()`` on its first use: for masks, angles and bias tables
    that depend only on sizes (a model meets few, so past 32 entries the store starts over)."""
    v = store.get(key)
    if v is None:
        if len(store) > 32:
            store.clear()
        v = store[key] = make()
    return v


class CausalSelfAttention(nn.Module):
    """Causal self-attention with ``heads`` attention heads and one head per causal shift.

    x (B, L, E) -> (B, L, E). ``shifts``: an int S (offsets 0..S-1) or a list of offsets >= 0;
    each shift head brings the input ``offset`` steps before (the paper's index-based heads).
    ``rotary`` rotates queries and keys by position; ``alibi`` adds ALiBi's −m_h·(i − j) to
    the attention heads' scores (a fixed log-domain mask, the framework's H term);
    ``relative`` adds a learned T5-style bias per head and bucket of i − j
    (``sc.attention.RelativeBias``, ``RELATIVE_BUCKETS`` x heads parameters, ``rel_bias``),
    through the same additive mask of SDPA's fused path. ``canon`` > 0 puts a Canon-B layer
    of that many taps (``structconv.nn.canon.Canon``) on the packed q/k/v projections of the
    attention heads (3 x embed_dim channels), before rotary.
    """

    def __init__(self, embed_dim: int, heads: int, shifts: int | Sequence[int] = 0, *,
                 rotary: bool = False, alibi: bool = False, relative: bool = False,
                 dropout: float = 0.0, bias: bool = True, canon: int = 0, device=None,
                 dtype=None):
        super().__init__()
        if embed_dim < 1 or heads < 1 or embed_dim % heads:
            raise ValueError(f"embed_dim={embed_dim} must be a positive multiple of heads="
                             f"{heads}")
        if alibi and relative:
            raise ValueError("CausalSelfAttention: give alibi or relative, not both")
        self.shifts = _shift_list(shifts)
        self.E, self.H, self.S = embed_dim, heads, len(self.shifts)
        self.D = D = embed_dim // heads
        if rotary and D % 2:
            raise ValueError(f"rotary needs an even head size, got {D} (embed_dim/heads)")
        self.rotary, self.alibi, self.dropout = bool(rotary), bool(alibi), float(dropout)
        fk = {"device": device, "dtype": dtype}
        # rows: queries, keys, values of the H attention heads, values of the S shift heads
        self.in_proj = nn.Linear(embed_dim, (3 * heads + self.S) * D, bias=bias, **fk)
        self.out_proj = nn.Linear((heads + self.S) * D, embed_dim, bias=bias, **fk)
        # ALiBi's slopes stay float64 (not a buffer: casting the model must not round them)
        self.slopes = alibi_slopes(heads) if self.alibi else None
        # unidirectional buckets: the causal mask hides every later key
        self.rel_bias = RelativeBias(heads, RELATIVE_BUCKETS, RELATIVE_MAX_DISTANCE,
                                     bidirectional=False).to(device=device, dtype=dtype) \
            if relative else None
        self.canon = Canon(3 * embed_dim, canon).to(device=device, dtype=dtype) if canon \
            else None
        self._masks: dict = {}

    def reset_parameters(self) -> None:
        """Re-draw the projections (torch's ``Linear`` init), the relative bias (zero) and the
        Canon-B taps, as the constructor does."""
        reset_children(self)

    def extra_repr(self):
        return (f"embed_dim={self.E}, heads={self.H}, shifts={self.shifts}, "
                f"rotary={self.rotary}, alibi={self.alibi}, "
                f"relative={self.rel_bias is not None}")

    def _project(self, x: Tensor, cache: dict | None) -> tuple[Tensor, ...]:
        """q, k, v (B, L, H*D each) and the shift heads' values (B, L, S*D): one GEMM, and
        Canon-B on the q/k/v part (its cache entry "canon_B")."""
        H, S, D = self.H, self.S, self.D
        y = self.in_proj(x)
        if self.canon is None:
            # ``split`` (not slicing) so that the backward pass joins the four gradients in one
            # copy instead of zero-filling four
            return y.split([H * D, H * D, H * D, S * D], -1)
        qkv, zs = y.split([3 * H * D, S * D], -1) if S else (y, y[..., :0])
        return (*self.canon(qkv, cache, "canon_B").split(H * D, -1), zs)

    @property
    def reach(self) -> int:
        """How many past inputs the shift heads read (the generation cache keeps that many)."""
        return max(self.shifts, default=0)

    # -- the paper's view ------------------------------------------------------------------------
    def value_out(self) -> LowRank:
        """theta_k = V_k O_k for the H + S heads as ``sc.params.LowRank`` (copied, no biases)."""
        H, S, D, E = self.H, self.S, self.D, self.E
        W = self.in_proj.weight
        lr = LowRank(H + S, E, E, D).to(W)
        with torch.no_grad():
            V = torch.cat([W[2 * H * D: 3 * H * D], W[3 * H * D:]], 0)  # ((H+S)D, E)
            lr.value.copy_(V.reshape(H + S, D, E).transpose(1, 2))
            lr.out.copy_(self.out_proj.weight.reshape(E, H + S, D).permute(1, 2, 0))
        return lr

    def basis(self, x: Tensor):
        """The layer's basis on x (B, L, E): ``DotProductAttention`` (H heads), stacked with
        ``CausalShift`` (S heads) when the layer has shift heads."""
        parts = [b for b, _ in self._parts(x, None)]
        return parts[0] if len(parts) == 1 else Stack(parts)

    def _mask(self, L: int, T: int, dtype, device):
        """The attention mask for L queries after T cached keys: None with SDPA's causal flag,
        else in SDPA orientation (H|1, L, T + L); ALiBi masks are kept per size, the relative
        bias (learned: differentiable) is built on every call from its O(T + L) table."""
        if self.rel_bias is not None:
            return index_bias([self.rel_bias], T + L, L, dtype=dtype, device=device,
                              causal=True, output_start=T)
        if not self.alibi:
            if T == 0:
                return None
            if L == 1:
                return None  # one query sees every key
            i = torch.arange(T, T + L, device=device)[:, None]
            return (torch.arange(T + L, device=device)[None, :] <= i).unsqueeze(0)
        return self._cached(("alibi", L, T, dtype, device), lambda: alibi_mask(
            self.slopes, L, T + L, T, dtype=dtype, device=device))

    def _cached(self, key, make):
        return size_cached(self._masks, key, make)

    def _parts(self, x: Tensor, cache: dict | None) -> list:
        """[(basis, value heads (B, M, K, D))] of the attention heads and of the shift heads;
        updates ``cache`` in place. (With a cache the two read different entries, past keys
        against the shift heads' last inputs, so they are not one Stack.)"""
        B, L, _ = x.shape
        H, S, D = self.H, self.S, self.D
        q, k, v, zs = self._project(x, cache)
        q, k, v = (t.view(B, L, H, D).transpose(1, 2) for t in (q, k, v))
        T = 0 if cache is None or "k" not in cache else cache["k"].shape[2]
        if self.rotary:
            ang = self._cached(("rot", L, T, q.dtype, q.device), lambda: rotary_angles(
                L, D, T, dtype=q.dtype, device=q.device))
            q, k = rotary(q, angles=ang), rotary(k, angles=ang)
        if T:
            k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
        if cache is not None:
            cache["k"], cache["v"] = k, v
        mask = self._mask(L, T, q.dtype, q.device)
        # every mask here is causal over the cache and the new keys, so each query keeps at
        # least its own key: no dead rows to look for (the look is a data-dependent branch
        # that would break a compiled graph)
        att = DotProductAttention(q, k, sdpa_mask=mask, causal=T == 0 and mask is None,
                                  dropout_p=self.dropout if self.training else 0.0,
                                  check_dead=False)
        out = [(att, v.transpose(1, 2))]
        if S:
            zs = zs.view(B, L, S, D)
            R = self.reach
            if cache is None or not R:
                out.append((CausalShift(L, self.shifts), zs))
            else:
                past = cache.get("z")
                zs = torch.cat([zs.new_zeros(B, R, S, D) if past is None else past, zs], 1)
                cache["z"] = zs[:, zs.shape[1] - R:]
                out.append((CausalShift(L, self.shifts, past=R), zs))
        return out

    def forward(self, x: Tensor, cache: dict | None = None) -> Tensor:
        """(B, L, E) -> (B, L, E); ``cache`` (a dict, filled on the first call) holds past
        keys/values and the shift heads' last inputs, for step-by-step generation."""
        floating(x, "CausalSelfAttention: x")
        if x.dim() != 3 or x.shape[-1] != self.E:
            raise ValueError(f"CausalSelfAttention expects x (B, L, E={self.E}), got "
                             f"{tuple(x.shape)}")
        # each part propagates its heads (SDPA; one shifted copy), then one GEMM applies O_k
        hs = [basis.propagate_heads(z) for basis, z in self._parts(x, cache)]
        h = hs[0] if len(hs) == 1 else torch.cat(hs, 2)  # (B, L, H + S, D)
        B, L = x.shape[:2]
        return self.out_proj(h.reshape(B, L, (self.H + self.S) * self.D))


class _Block(PreNormBlock):
    """Pre-norm decoder block: x + attn(A(ln x)), then x + proj(gelu(D(fc(C(ln x))))), where
    A, C, D are Canon layers where ``canon`` names them (else the identity) and B sits in the
    attention; (B, L, E) -> (B, L, E). Checkpoints keep the feed-forward's maps under their
    names from before ``mlp`` held them, ``fc`` and ``proj`` (``former_keys``)."""

    def __init__(self, E: int, heads: int, shifts, ffn: int, dropout: float, bias: bool,
                 position: str, canon: str = "", canon_kernel: int = 4):
        super().__init__(dropout)
        self.ln1, self.ln2 = nn.LayerNorm(E, bias=bias), nn.LayerNorm(E, bias=bias)
        self.attn = CausalSelfAttention(E, heads, shifts, rotary=position == "rotary",
                                        alibi=position in ("alibi", "shift+alibi"),
                                        relative=position == "relative",
                                        dropout=dropout, bias=bias,
                                        canon=canon_kernel if "B" in canon else 0)
        self.mlp = FeedForward(E, ffn, F.gelu, bias=bias)
        width = {"A": E, "C": E, "D": ffn}
        self.canon = nn.ModuleDict({p: Canon(width[p], canon_kernel) for p in canon if p != "B"})
        former_keys(self, fc="mlp.fc", proj="mlp.proj")

    def _canon(self, place: str, h: Tensor, cache: dict | None) -> Tensor:
        return self.canon[place](h, cache, f"canon_{place}") if place in self.canon else h

    def attention_input(self, x: Tensor, cache: dict | None = None) -> Tensor:
        """What the attention reads: Canon-A of the normalised input."""
        return self._canon("A", self.ln1(x), cache)

    def branches(self, cache: dict | None = None):
        def canon(place, h):
            return self._canon(place, h, cache)

        return ((self.ln1, lambda h: self.attn(canon("A", h), cache)),
                (self.ln2, lambda h: self.mlp(h, canon)))


class TransformerLM(nn.Module):
    """A causal decoder-only language model whose attention layers are structured convolutions.

    ids (B, L) long -> logits (B, L, vocab_size); the logits at position i depend only on
    tokens 0..i. ``position``: one of ``POSITIONS``; ``"shift"`` and ``"shift+alibi"`` add
    ``shifts`` causal shift heads (int S: offsets 0..S-1, or a list of offsets) to the
    ``heads`` attention heads of every layer; ``"relative"`` gives every layer a learned
    T5-style bias per head and bucket of the offset (``RELATIVE_BUCKETS`` x heads
    parameters per layer, starting at zero). Every kind but ``"learned"`` takes any length;
    ``"learned"`` needs ``context`` and raises ``ValueError`` for longer inputs.
    ``ffn`` is the feed-forward width (default 4·width); the output map is tied to the token
    embedding (``tie_weights``), as in GPT-2 and nanoGPT. ``canon``: the places of Canon layers
    of ``canon_kernel`` taps in every block, a subset of "ABCD" (see ``structconv.nn.canon``):
    A on the attention's normalised input (width channels), B on its q/k/v (3·width), C on the
    feed-forward's normalised input (width), D on its hidden layer before the activation (ffn);
    each adds canon_kernel x channels parameters per layer.
    """

    def __init__(self, vocab_size: int, width: int, layers: int, heads: int,
                 position: str = "shift", shifts: int | Sequence[int] = 4,
                 ffn: int | None = None, dropout: float = 0.0, *, context: int | None = None,
                 bias: bool = True, tie_weights: bool = True, canon: str = "",
                 canon_kernel: int = 4):
        super().__init__()
        if position not in POSITIONS:
            raise ValueError(f"unknown position {position!r}: choose one of "
                             f"{', '.join(POSITIONS)}")
        for name, v in (("vocab_size", vocab_size), ("width", width), ("layers", layers),
                        ("heads", heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TransformerLM: {name} must be an int >= 1, got {v!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"TransformerLM: dropout must be in [0, 1), got {dropout}")
        if position == "learned":
            if not isinstance(context, int) or isinstance(context, bool) or context < 1:
                raise ValueError(f"position='learned' needs context=int >= 1, got {context!r}")
        self.canon, self.canon_kernel = check_canon(canon, canon_kernel), canon_kernel
        self.vocab_size, self.width, self.position = vocab_size, width, position
        self.context = context if position == "learned" else None
        self.ffn = check_ffn("TransformerLM", ffn, width)
        use_shifts = _shift_list(shifts) if position.startswith("shift") else []
        if position.startswith("shift") and not use_shifts:
            raise ValueError(f"position={position!r} needs at least one shift head (shifts >= 1)")
        self.shifts = use_shifts
        self.tok = nn.Embedding(vocab_size, width)
        self.pos = nn.Parameter(torch.zeros(context, width)) if position == "learned" else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            _Block(width, heads, use_shifts, self.ffn, dropout, bias, position, self.canon,
                   canon_kernel)
            for _ in range(layers))
        self.ln = nn.LayerNorm(width, bias=bias)
        self.head = nn.Linear(width, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok.weight
        self._init()

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does: the layers' own inits, then GPT-2's
        (``gpt2_init``) over them."""
        reset_children(self)
        self._init()

    def _init(self) -> None:
        # GPT-2's: N(0, 0.02), the residual projections scaled by 1/sqrt(2·layers)
        n = 2 * len(self.blocks)
        gpt2_init(self, [self.pos], [(w, n) for b in self.blocks
                                     for w in (b.attn.out_proj.weight, b.mlp.proj.weight)])

    def extra_repr(self):
        return (f"position={self.position!r}, shifts={self.shifts}, context={self.context}, "
                f"canon={self.canon!r}, canon_kernel={self.canon_kernel}")

    def _embed(self, ids: Tensor, start: int) -> Tensor:
        L = ids.shape[1]
        x = self.tok(ids)
        if self.position == "learned":
            if start + L > self.context:
                raise ValueError(f"sequence length {start + L} exceeds the learned context "
                                 f"{self.context} (position='learned' cannot extrapolate)")
            x = x + self.pos[start:start + L]
        elif self.position == "sinusoidal":
            pos = torch.arange(start, start + L, device=ids.device)
            # at the token embeddings' initial scale (N(0, 0.02), as a learned table starts):
            # at amplitude 1 the fixed encoding swamps them (validation loss 2.39 against
            # 2.03 without any encoding, nanoGPT's CPU configuration, 2,000 steps)
            x = x + SINUSOIDAL_SCALE * sinusoidal(pos, self.width, dtype=x.dtype)
        return self.drop(x)

    def check_ids(self, ids) -> Tensor:
        """Token ids (B, L) of any integer dtype with 0 <= id < vocab_size, L >= 1, as the
        embedding takes them (int64 unless int32); ``ValueError`` naming what is wrong."""
        return token_ids(ids, self.vocab_size, "TransformerLM", keep_int32=True,
                         name_vocab=True)

    def forward(self, ids: Tensor, cache: list | None = None) -> Tensor:
        """ids (B, L) -> logits (B, L, vocab_size). ``cache`` (from ``new_cache``) continues a
        sequence: the ids follow the ones it has seen, and it is updated in place."""
        ids = self.check_ids(ids)
        check_cache(cache, len(self.blocks), "TransformerLM")
        start = 0 if not cache or "k" not in cache[0] else cache[0]["k"].shape[2]
        x = self._embed(ids, start)
        for i, b in enumerate(self.blocks):
            x = b(x, None if cache is None else cache[i])
        return self.head(self.ln(x))

    @torch.no_grad()
    def attention_maps(self, ids: Tensor) -> list[Tensor]:
        """The attention heads' weights of every layer on ids (B, L): a list of (B, H, L, L)
        in SDPA orientation (query, key); shift heads are not included (they are shifts)."""
        x = self._embed(self.check_ids(ids), 0)
        maps = []
        for b in self.blocks:
            att = b.attn._parts(b.attention_input(x), None)[0][0]
            maps.append(att.weights())
            x = b(x)
        return maps

    def new_cache(self) -> list[dict]:
        """An empty generation cache: one dict per layer (keys, values, the shift heads' last
        inputs, and each Canon place's last canon_kernel - 1 inputs)."""
        return [{} for _ in self.blocks]

    @torch.no_grad()
    def generate(self, tokens: Tensor, steps: int, *, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 stop_token: int | None = None, generator: torch.Generator | None = None,
                 use_cache: bool = True) -> Tensor:
        """Extend tokens (B, T) by up to ``steps`` sampled tokens -> (B, T + n), n <= steps.

        ``temperature`` divides the logits (0 picks the most likely token; a temperature too
        small for the compute dtype gives that limit too, never NaN); ``top_k`` (an int >= 1)
        samples among the k most likely tokens, ``top_p`` (in (0, 1]) among the fewest most
        likely whose probabilities sum to at least p (nucleus sampling; both may be given: top-k
        first). ``stop_token``: a row that produces it is finished (filled with it after), and
        generation ends once every row is. ``generator`` makes the draws reproducible. With
        ``use_cache`` each step feeds only the new token, reading past keys/values (and the
        shift heads' and Canon layers' last inputs) from a cache; a ``"learned"`` model
        recomputes on its last ``context`` tokens once the sequence outgrows them, as nanoGPT
        does.
        """
        tokens = self.check_ids(tokens).long()
        _check_sampling(steps, temperature, top_k, top_p, stop_token, self.vocab_size)
        was = self.training
        self.eval()
        out, cache, feed = tokens, None, tokens
        done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        for _ in range(steps):
            if self.context is not None and out.shape[1] > self.context:
                cache, feed = None, out[:, -self.context:]
            elif use_cache and cache is None:
                cache, feed = self.new_cache(), out
            elif not use_cache:
                feed = out
            logits = self(feed, cache)[:, -1]
            nxt = _sample(logits, temperature, top_k, top_p, generator)
            if stop_token is not None:
                nxt = nxt.masked_fill(done[:, None], stop_token)
                done |= nxt[:, 0] == stop_token
            out = torch.cat([out, nxt], 1)
            if cache is not None:
                feed = nxt
            if stop_token is not None and done.numel() and bool(done.all()):
                break
        self.train(was)
        return out


def _check_sampling(steps, temperature, top_k, top_p=None, stop_token=None,
                    vocab_size=None) -> None:
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise ValueError(f"generate: steps must be an int >= 0, got {steps!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or \
            not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"generate: temperature must be a finite number >= 0 (0 picks the "
                         f"most likely token), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
                              or top_k < 1):
        raise ValueError(f"generate: top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)
                              or not 0 < top_p <= 1):
        raise ValueError(f"generate: top_p must be None or a number in (0, 1] (the probability "
                         f"mass sampled from), got {top_p!r}")
    if stop_token is not None and (isinstance(stop_token, bool) or not isinstance(
            stop_token, numbers.Integral) or not 0 <= stop_token < (vocab_size or 0)):
        raise ValueError(f"generate: stop_token must be None or a token id in "
                         f"0..{(vocab_size or 1) - 1}, got {stop_token!r}")


def _sample(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None,
            generator) -> Tensor:
    """One token per row of logits (B, V) -> (B, 1)."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    # shifted so that each row's maximum is 0 before dividing: a temperature that rounds to 0
    # in float32 then sends every other logit to -inf (the greedy limit), never 0 / 0
    z = logits.float()
    z = z - z.amax(-1, keepdim=True)
    z = torch.where(z == 0, z, z / temperature)
    if top_k is not None:
        kth = torch.topk(z, min(top_k, z.shape[-1]), -1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    probs = torch.softmax(z, -1)
    if top_p is not None and top_p < 1:
        # the nucleus: the most likely tokens until their mass reaches top_p (at least one)
        p, order = probs.sort(dim=-1, descending=True, stable=True)
        drop = (p.cumsum(-1) - p) >= top_p
        probs = probs.scatter(-1, order, p.masked_fill(drop, 0.0))
    return torch.multinomial(probs, 1, generator=generator)


def equalised_ffn(vocab_size: int, width: int, layers: int, heads: int, position: str,
                  shifts, budget: int, context: int | None = None, *, canon: str = "",
                  canon_kernel: int = 4) -> int:
    """The feed-forward width whose ``TransformerLM`` has the parameter count closest to
    ``budget`` (one unit of width costs 2·width + 1 parameters per layer, plus canon_kernel
    with a Canon-D layer); Canon layers, shift heads and relative-bias tables are counted
    like any other parameter (the model is built and counted)."""
    base = 4 * width
    m = TransformerLM(vocab_size, width, layers, heads, position, shifts, base, context=context,
                      canon=canon, canon_kernel=canon_kernel)
    p0 = sum(p.numel() for p in m.parameters())
    unit = 2 * width + 1 + (canon_kernel if "D" in m.canon else 0)
    return max(1, base + round((budget - p0) / (layers * unit)))

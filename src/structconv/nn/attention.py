"""Attention layers built from structconv parts, and converters from torch.nn and PyG.

* ``MultiheadAttention``: torch's layer (same constructor, call, parameter names) as an
  attention convolution: in-projections give the mechanism's Λ_key / Λ_query, the basis is a
  ``DotProductAttention`` (SDPA), the value/out projections are the LowRank theta.
* ``GATConv``, ``GATv2Conv``, ``TransformerConv``: PyG's graph-attention layers (in
  ``graph_attention``, re-exported here).
* ``TransformerEncoderLayer`` / ``TransformerDecoderLayer``: torch's layers on these parts.
* ``MixedAttention``: attention heads and index-based shift heads in one ``sc.basis.Stack``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import count, floating, number_in
from ..attention.basis import DotProductAttention, shift_basis
from ..attention.build import attention_basis
from ..attention.mechanisms import DotProduct, Masked, Softmax
from ..basis.base import Stack
from ..engine import convolve
from ..params import LowRank, reset_children
from .blocks import feed_forward, post_norm, pre_norm
from .convert import register_torch
from .graph_attention import GATConv, GATv2Conv, TransformerConv  # re-exported (converters)

__all__ = ["MultiheadAttention", "GATConv", "GATv2Conv", "TransformerConv",
           "TransformerEncoderLayer", "TransformerDecoderLayer", "MixedAttention"]


def _float_mask(mask: Tensor | None, dtype: torch.dtype, what: str) -> Tensor | None:
    """torch's mask convention (bool True = masked, or additive float) -> additive float."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            mask, float("-inf"))
    if not mask.is_floating_point():
        raise TypeError(f"{what} must be bool or floating, got dtype {mask.dtype}")
    return mask.to(dtype)


class MultiheadAttention(nn.Module):
    """torch.nn.MultiheadAttention as an attention convolution (same arguments and outputs).

    Differences from torch: a query whose keys are all masked gets a zero attention column
    (finite output, zero weights) where torch gives NaN; ``is_causal=True`` without
    ``attn_mask`` builds the causal mask instead of raising; dropout (training) draws its own
    random numbers.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: int | None = None, vdim: int | None = None, batch_first: bool = False,
                 device=None, dtype=None):
        super().__init__()
        _sizes("MultiheadAttention", embed_dim=embed_dim, num_heads=num_heads, kdim=kdim,
               vdim=vdim)
        _check_dropout("MultiheadAttention", dropout)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        fk = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        self.head_dim = embed_dim // num_heads
        E = embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * E, E, **fk))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(E, E, **fk))
            self.k_proj_weight = nn.Parameter(torch.empty(E, self.kdim, **fk))
            self.v_proj_weight = nn.Parameter(torch.empty(E, self.vdim, **fk))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * E, **fk))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(E, E, bias=bias, **fk)
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, E, **fk))
            self.bias_v = nn.Parameter(torch.empty(1, 1, E, **fk))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = bool(add_zero_attn)
        self._reset_in_proj()

    def reset_parameters(self) -> None:
        """Re-draw the weights as the constructor does (torch's init): ``out_proj`` as a
        ``Linear``, the in-projections Glorot, biases zero, ``bias_k`` / ``bias_v`` Glorot
        normal. (torch's own ``_reset_parameters`` leaves ``out_proj.weight`` as it is.)"""
        self.out_proj.reset_parameters()
        self._reset_in_proj()

    def _reset_in_proj(self):
        for w in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight,
                  self.v_proj_weight):
            if w is not None:
                nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)
        for b in (self.bias_k, self.bias_v):
            if b is not None:
                nn.init.xavier_normal_(b)

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"batch_first={self.batch_first}")

    # -- the paper's view --------------------------------------------------------------------
    def _weights(self) -> tuple[Tensor, Tensor, Tensor]:
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            return self.in_proj_weight[:E], self.in_proj_weight[E:2 * E], \
                self.in_proj_weight[2 * E:]
        return self.q_proj_weight, self.k_proj_weight, self.v_proj_weight

    def _biases(self):
        if self.in_proj_bias is None:
            return None, None, None
        return self.in_proj_bias.chunk(3)

    def mechanism(self) -> DotProduct:
        """The scores as a ``DotProduct`` mechanism (copied weights): x1 = key, x2 = query."""
        Wq, Wk, _ = self._weights()
        bq, bk, _ = self._biases()
        K, D = self.num_heads, self.head_dim
        mech = DotProduct(K, self.kdim, self.embed_dim, D, bias=bq is not None).to(Wq)
        with torch.no_grad():
            mech.key.copy_(Wk.reshape(K, D, self.kdim).transpose(1, 2))
            mech.query.copy_(Wq.reshape(K, D, self.embed_dim).transpose(1, 2))
            if bq is not None:
                mech.key_bias.copy_(bk.reshape(K, D))
                mech.query_bias.copy_(bq.reshape(K, D))
        return mech

    def value_out(self) -> LowRank:
        """theta_k = Θ_value,k Θ_O,kᵀ as ``sc.params.LowRank`` (copied; biases excluded)."""
        _, _, Wv = self._weights()
        K, D, E = self.num_heads, self.head_dim, self.embed_dim
        lr = LowRank(K, self.vdim, E, D).to(Wv)
        with torch.no_grad():
            lr.value.copy_(Wv.reshape(K, D, self.vdim).transpose(1, 2))
            lr.out.copy_(self.out_proj.weight.reshape(E, K, D).permute(1, 2, 0))
        return lr

    # -- forward -----------------------------------------------------------------------------
    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Tensor | None = None, need_weights: bool = True,
                attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        """(out, weights) exactly as torch: (L, B, E) or (B, L, E) (batch_first) or (L, E)."""
        batched = query.dim() == 3
        same_qkv, same_kv = query is key and key is value, key is value
        query, key, value, key_padding_mask = self._batch_first(query, key, value,
                                                                key_padding_mask)
        q, k, v = self._project(query, key, value, same_qkv, same_kv)
        mask, causal = self._mask(query, key.shape[1], key_padding_mask, attn_mask, is_causal,
                                  need_weights)
        p = self.dropout if self.training else 0.0
        # the basis A_k = softmax(k_k q_kᵀ / √D + H) of head k, applied to the value heads by
        # SDPA; the output map Θ_O closes the LowRank theta (the paper's eq. transformer-theta)
        basis = DotProductAttention(q, k, sdpa_mask=mask, causal=causal, dropout_p=p)
        # the weights, when asked for, are built block by block beside SDPA's output (torch
        # builds B x K x N x M scores, probabilities and their copies)
        if need_weights:
            out, weights = basis.propagate_heads_and_weights(v, average_attn_weights)
        else:
            out, weights = basis.propagate_heads(v), None  # (B, N, K, D)
        B, L = query.shape[:2]
        out = F.linear(out.reshape(B, L, self.embed_dim), self.out_proj.weight,
                       self.out_proj.bias)
        if not batched:
            return out[0], (None if weights is None else weights[0])
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights

    def _batch_first(self, query, key, value, key_padding_mask):
        """The inputs as (B, L, E) / (B, S, kdim) / (B, S, vdim), shapes checked."""
        _features("MultiheadAttention", query=query, key=key, value=value)
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(f"query, key, value must all be 2-d (unbatched) or 3-d, got "
                             f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
        if query.dim() == 2:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        E, B = self.embed_dim, query.shape[0]
        if query.shape[2] != E or key.shape[2] != self.kdim or value.shape[2] != self.vdim \
                or value.shape[:2] != key.shape[:2] or key.shape[0] != B:
            raise ValueError(
                f"expected query (.., L, {E}), key (.., S, {self.kdim}), value (.., S, "
                f"{self.vdim}) with one batch size, got {tuple(query.shape)}, "
                f"{tuple(key.shape)}, {tuple(value.shape)} (batch first)")
        return query, key, value, key_padding_mask

    def _project(self, query, key, value, same_qkv: bool, same_kv: bool):
        """Head-major q (B, K, L, D), k (B, K, S', D) and the value heads z (B, S', K, D)."""
        E, H, D = self.embed_dim, self.num_heads, self.head_dim
        B, dtype = query.shape[0], query.dtype
        Wq, Wk, Wv = self._weights()
        bq, bk, bv = self._biases()
        # in-projections: one GEMM for self-attention with packed weights
        if same_qkv and self._qkv_same_embed_dim:
            q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, -1)
        elif same_kv and self._qkv_same_embed_dim:
            q = F.linear(query, Wq, bq)
            b2 = None if self.in_proj_bias is None else self.in_proj_bias[E:]
            k, v = F.linear(key, self.in_proj_weight[E:], b2).chunk(2, -1)
        else:
            q, k, v = F.linear(query, Wq, bq), F.linear(key, Wk, bk), F.linear(value, Wv, bv)
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.to(dtype).expand(B, 1, E)], 1)
            v = torch.cat([v, self.bias_v.to(dtype).expand(B, 1, E)], 1)
        # head-major copies: the attention kernels run ~15% faster on dense (B, K, L, D) inputs
        # than on strided slices of the packed projection, for a copy of B*L*E elements
        q = q.reshape(B, q.shape[1], H, D).transpose(1, 2).contiguous()
        k = k.reshape(B, k.shape[1], H, D).transpose(1, 2).contiguous()
        v = v.reshape(B, v.shape[1], H, D).transpose(1, 2).contiguous()
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(B, H, 1, D)], 2)
            v = torch.cat([v, v.new_zeros(B, H, 1, D)], 2)
        return q, k, v.transpose(1, 2)  # the bundle's heads z (B, M, K, C), as a view

    def _mask(self, query, S: int, key_padding_mask, attn_mask, is_causal: bool,
              need_weights: bool):
        """One additive (B|1, K|1, L, S') float mask (or None) and whether SDPA's causal flag
        replaces it, in torch's (query, key) orientation and rules."""
        B, L = query.shape[:2]
        H, dtype = self.num_heads, query.dtype
        kpm = _float_mask(key_padding_mask, dtype, "key_padding_mask")
        causal = False
        if is_causal and kpm is None and not need_weights:
            attn_mask, causal = None, True  # as torch: the hint replaces attn_mask
        elif is_causal and attn_mask is None:
            attn_mask = torch.ones(L, S, dtype=torch.bool, device=query.device).triu(1)
        am = _float_mask(attn_mask, dtype, "attn_mask")
        if am is not None:
            if am.dim() == 2 and tuple(am.shape) == (L, S):
                am = am.reshape(1, 1, L, S)
            elif am.dim() == 3 and tuple(am.shape) == (B * H, L, S):
                am = am.reshape(B, H, L, S)
            else:
                raise ValueError(f"attn_mask must be (L, S)=({L}, {S}) or (B*num_heads, L, S)="
                                 f"({B * H}, {L}, {S}), got {tuple(attn_mask.shape)}")
        if kpm is not None:
            if tuple(kpm.shape) != (B, S):
                raise ValueError(f"key_padding_mask must be (B, S)=({B}, {S}) (or (S,) "
                                 f"unbatched), got {tuple(key_padding_mask.shape)}")
            kpm = kpm.reshape(B, 1, 1, S)
        extra = int(self.bias_k is not None) + int(self.add_zero_attn)
        if extra:  # the appended keys are never masked
            am = None if am is None else F.pad(am, (0, extra))
            kpm = None if kpm is None else F.pad(kpm, (0, extra))
        return (am if kpm is None else (kpm if am is None else am + kpm)), causal


@register_torch(nn.MultiheadAttention)
def _from_mha(m: nn.MultiheadAttention) -> MultiheadAttention:
    w = m.out_proj.weight
    out = MultiheadAttention(m.embed_dim, m.num_heads, m.dropout, m.in_proj_bias is not None,
                             m.bias_k is not None, m.add_zero_attn, m.kdim, m.vdim,
                             m.batch_first, device=w.device, dtype=w.dtype)
    out.load_state_dict(m.state_dict())
    return out.train(m.training)


def _sizes(who: str, **sizes) -> None:
    """Each size an int >= 1 (None: not given)."""
    for name, v in sizes.items():
        if v is not None:
            count(v, f"{who}: {name}")


def _check_dropout(who: str, p) -> None:
    if not number_in(p, 0.0, 1.0):
        raise ValueError(f"{who}: dropout must be a probability in [0, 1], got {p!r}")


def _features(who: str, **tensors) -> None:
    """Floating tensors of one dtype (``TypeError`` naming the one that is not)."""
    for name, t in tensors.items():
        floating(t, f"{who}: {name}")
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        got = ", ".join(f"{n} {d}" for n, d in dtypes.items())
        raise TypeError(f"{who}: the inputs must share a dtype, got {got}")


# ------------------------------------------------------------------------------------------------
def _activation(act):
    if isinstance(act, str):
        if act == "relu":
            return F.relu
        if act == "gelu":
            return F.gelu
        raise ValueError(f"activation must be 'relu', 'gelu' or a callable, got {act!r}")
    return act


class _TorchLayer(nn.Module):
    """What torch's Transformer layers share: the self-attention and feed-forward branches
    (``feed_forward`` on torch's ``linear1`` / ``linear2``, names kept for ``from_torch``)."""

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(feed_forward(x, self.linear1, self.linear2, self.activation,
                                          dropout=self.dropout))


class TransformerEncoderLayer(_TorchLayer):
    """torch.nn.TransformerEncoderLayer on structconv's ``MultiheadAttention`` (same args).

    ``shift_heads`` (a sequence of shifts) adds index-based causal shift heads to the
    self-attention (``MixedAttention``), the paper's alternative to positional encodings.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device=None, dtype=None, shift_heads: Sequence[int] = ()):
        super().__init__()
        _sizes("TransformerEncoderLayer", dim_feedforward=dim_feedforward)
        fk = {"device": device, "dtype": dtype}
        if shift_heads:
            self.self_attn = MixedAttention(d_model, nhead, shifts=shift_heads, dropout=dropout,
                                            bias=bias, batch_first=batch_first, **fk)
        else:
            self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                batch_first=batch_first, **fk)
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias, **fk)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias, **fk)
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = _activation(activation)
        self.batch_first = batch_first

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each sub-layer's own init)."""
        reset_children(self)

    def forward(self, src: Tensor, src_mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        _features("TransformerEncoderLayer", src=src)
        wire = pre_norm if self.norm_first else post_norm
        x = wire(src, self.norm1, lambda h: self._sa_block(h, src_mask, src_key_padding_mask,
                                                           is_causal))
        return wire(x, self.norm2, self._ff_block)


class TransformerDecoderLayer(_TorchLayer):
    """torch.nn.TransformerDecoderLayer on structconv's ``MultiheadAttention`` (same args)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        _sizes("TransformerDecoderLayer", dim_feedforward=dim_feedforward)
        fk = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, **fk)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, **fk)
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias, **fk)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias, **fk)
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.activation = _activation(activation)
        self.batch_first = batch_first

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each sub-layer's own init)."""
        reset_children(self)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, need_weights=False,
                                is_causal=is_causal)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(feed_forward(x, self.linear1, self.linear2, self.activation,
                                          dropout=self.dropout))

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False) -> Tensor:
        _features("TransformerDecoderLayer", tgt=tgt, memory=memory)
        wire = pre_norm if self.norm_first else post_norm
        x = wire(tgt, self.norm1, lambda h: self._sa_block(h, tgt_mask, tgt_key_padding_mask,
                                                           tgt_is_causal))
        x = wire(x, self.norm2, lambda h: self._mha_block(h, memory, memory_mask,
                                                          memory_key_padding_mask,
                                                          memory_is_causal))
        return wire(x, self.norm3, self._ff_block)


def _act_name(fn):
    if fn is F.relu:
        return "relu"
    if fn is F.gelu:
        return "gelu"
    return fn


@register_torch(nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
def _from_transformer_layer(m: nn.Module) -> nn.Module:
    # both layers share torch's constructor arguments and state_dict names
    cls = TransformerEncoderLayer if isinstance(m, nn.TransformerEncoderLayer) else \
        TransformerDecoderLayer
    w = m.linear1.weight
    out = cls(
        m.self_attn.embed_dim, m.self_attn.num_heads, m.linear1.out_features,
        m.dropout.p, _act_name(m.activation), m.norm1.eps, m.self_attn.batch_first,
        m.norm_first, m.linear1.bias is not None, device=w.device, dtype=w.dtype)
    out.load_state_dict(m.state_dict())
    return out.train(m.training)


# ------------------------------------------------------------------------------------------------
class MixedAttention(nn.Module):
    """Self-attention with ``num_heads`` attention heads and one index-based head per shift.

    The basis is ``sc.basis.Stack([DotProductAttention, shift_basis(L, shifts)])`` and theta a
    ``sc.params.LowRank`` over all K = num_heads + len(shifts) heads, so ``sc.convolve`` runs
    each part on its own fast path (SDPA, sparse shifts). Called like ``MultiheadAttention``
    for self-attention: ``(x, x, x, key_padding_mask=None, need_weights=False, attn_mask=None,
    average_attn_weights=True, is_causal=False)``; ``causal=True`` always masks the future.
    """

    def __init__(self, embed_dim: int, num_heads: int, shifts: Sequence[int] = (1, 2),
                 *, causal: bool = True, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = True, device=None, dtype=None):
        super().__init__()
        _sizes("MixedAttention", embed_dim=embed_dim, num_heads=num_heads)
        _check_dropout("MixedAttention", dropout)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        if not isinstance(shifts, Sequence) or any(isinstance(s, bool) or not isinstance(s, int)
                                                   for s in shifts):
            raise ValueError(f"MixedAttention: shifts must be a list of int offsets, got "
                             f"{shifts!r}")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.shifts = tuple(int(s) for s in shifts)
        self.head_dim = D = embed_dim // num_heads
        self.causal, self.dropout, self.batch_first = causal, float(dropout), batch_first
        K = num_heads + len(self.shifts)
        self.qk = DotProduct(num_heads, embed_dim, embed_dim, D, bias=bias)
        self.theta = LowRank(K, embed_dim, embed_dim, D)
        self.bias = nn.Parameter(torch.zeros(embed_dim)) if bias else None
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)
        self._shift_cache: dict = {}

    def reset_parameters(self) -> None:
        """Re-draw the scores' and theta's weights (their own inits); the bias is zero."""
        self.qk.reset_parameters()
        self.theta.reset_parameters()
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"shifts={self.shifts}, causal={self.causal}")

    def _shifts(self, L: int, x: Tensor):
        key = (L, x.dtype, x.device)
        if key not in self._shift_cache:
            self._shift_cache[key] = shift_basis(L, self.shifts, dtype=x.dtype, device=x.device)
        return self._shift_cache[key]

    def basis(self, x: Tensor, attn_mask: Tensor | None = None,
              key_padding_mask: Tensor | None = None) -> Stack:
        """The layer's basis on x (B, L, E): attention heads then shift heads."""
        B, L, _ = x.shape
        mask = None
        am = _float_mask(attn_mask, x.dtype, "attn_mask")
        if am is not None:
            mask = am.transpose(-1, -2)  # torch (L, S) -> paper (M, N)
        kpm = _float_mask(key_padding_mask, x.dtype, "key_padding_mask")
        if kpm is not None:
            kpm = kpm.reshape(B, 1, L, 1)
            mask = kpm if mask is None else mask + kpm
        mech = Masked(self.qk, mask, causal=self.causal) if (mask is not None or self.causal) \
            else self.qk
        att = attention_basis(Softmax(mech), x, x)
        if isinstance(att, DotProductAttention) and self.training:
            att.dropout_p = self.dropout
        return Stack([att, self._shifts(L, x)])

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                key_padding_mask: Tensor | None = None, need_weights: bool = False,
                attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False):
        """(out, None): self-attention output (B, L, E) (or (L, B, E) without batch_first)."""
        x = query
        for other in (key, value):
            if other is not None and other is not query:
                raise ValueError("MixedAttention is a self-attention layer: key and value must "
                                 "be the query tensor (or None)")
        if need_weights:
            raise ValueError("MixedAttention does not return weights (need_weights=False)")
        _features("MixedAttention", query=x)
        if x.dim() not in (2, 3) or x.shape[-1] != self.embed_dim:
            raise ValueError(f"MixedAttention expects query (B, L, E={self.embed_dim}) (or (L, "
                             f"B, E) without batch_first, (L, E) unbatched), got "
                             f"{tuple(x.shape)}")
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            x = x.transpose(0, 1)
        if key_padding_mask is not None and (not isinstance(key_padding_mask, Tensor) or tuple(
                key_padding_mask.shape) != tuple(x.shape[:2])):
            got = tuple(key_padding_mask.shape) if isinstance(key_padding_mask, Tensor) else \
                type(key_padding_mask).__name__
            raise ValueError(f"MixedAttention: key_padding_mask must be (B, L)="
                             f"{tuple(x.shape[:2])} (or (L,) unbatched), got {got}")
        if is_causal and not self.causal and attn_mask is None:
            L = x.shape[1]
            attn_mask = torch.ones(L, L, dtype=torch.bool, device=x.device).triu(1)
        y = convolve(x, self.basis(x, attn_mask, key_padding_mask), self.theta,
                     route="lowrank_heads")
        if self.bias is not None:
            y = y + self.bias
        if unbatched:
            return y[0], None
        return (y if self.batch_first else y.transpose(0, 1)), None

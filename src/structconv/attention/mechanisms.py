"""Attention mechanisms as modules, the sum that adds them, and the transforms that wrap them.

A mechanism maps auxiliary inputs x1 (M entries) and x2 (N entries) (a leading batch dim
allowed) to scores (K, M, N) (or (B, K, M, N)); ``edge_scores`` gives the same values on a
graph's edges only, (E, K) (or (B, E, K)), without building M x N. Both take optional edge
features: per edge (E, D) in ``edge_scores``, dense (M, N, D) in ``forward``; a mechanism that
does not read them ignores them.

Mechanisms add term-wise (``a + b`` is a ``Sum``: the paper's "added term-wise"), and
transforms wrap any mechanism or sum: ``Softmax(LeakyReLU(GraphMasked(GATScores(K, C),
edge_index)))`` is GAT's, ``Softmax(Masked(DotProduct(K, P, P, D) + RelativeBias(K),
causal=True))`` a decoder's self-attention with T5's relative bias. ``sc.attention.
attention_basis`` turns a mechanism and its inputs into the fastest matching basis.

Terms that read no content (index terms, edge terms: ``reads_inputs = False``) take the entry
counts M, N in place of x1, x2 and a ``dtype`` keyword (the sum's compute dtype).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_index_tensor, count, floating, number_in
from ..params import reset_children
from .biaffine import biaffine
from .masks import edge_softmax, graph_mask, masked_softmax

__all__ = ["Mechanism", "Sum", "Biaffine", "DotProduct", "PerHead", "GATScores", "QueryDot",
           "query_dot", "HeadDot", "Masked", "GraphMasked", "LeakyReLU", "Softmax", "chain",
           "edges", "heads", "unbatch_heads"]


def _b(x: Tensor, what: str, who: str = "", width: int | None = None) -> Tensor:
    """Features (M, P') or (B, M, P') of ``width`` channels, floating, as (B, M, P')."""
    name = f"{who}: {what}" if who else what
    if not isinstance(x, Tensor) or x.dim() not in (2, 3):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must be (M, P') or (B, M, P'), got {got}")
    floating(x, name)
    if width is not None and x.shape[-1] != width:
        raise ValueError(f"{name} must have {width} features (the mechanism's width), got "
                         f"shape {tuple(x.shape)}")
    return x if x.dim() == 3 else x.unsqueeze(0)


def check_sizes(who: str, **sizes) -> None:
    for name, v in sizes.items():
        count(v, f"{who}: {name}")


def check_scale(scale, default: float, who: str) -> float:
    """The scores' scale: ``default`` when None, else a finite number (``ValueError``)."""
    if scale is None:
        return default
    if not number_in(scale, -math.inf, math.inf):
        raise ValueError(f"{who}: scale must be a finite number (None: 1/sqrt of the head size), "
                         f"got {scale!r}")
    return float(scale)


def _unbatch(out: Tensor, *inputs: Tensor) -> Tensor:
    return out[0] if all(t.dim() == 2 for t in inputs) else out


def edges(edge_index: Tensor) -> tuple[Tensor, Tensor]:
    """(sources, targets) of a (2, E) integer ``edge_index``, as long tensors (checked)."""
    check_index_tensor(edge_index, 2, "edge_index")
    return edge_index[0].long(), edge_index[1].long()


class Mechanism(nn.Module):
    """Base class: ``forward(x1, x2, edge_attr=None)`` -> scores (K, M, N) / (B, K, M, N);
    ``edge_scores(x1, x2, edge_index, edge_attr=None)`` -> their values on edges (E, K) /
    (B, E, K); ``a + b`` adds two mechanisms term-wise, ``a + H`` masks by a tensor H (M, N).
    """

    K: int
    #: False for terms that depend only on positions or edge features (they take M, N)
    reads_inputs: bool = True

    def reset_parameters(self) -> None:
        """Re-draw the weights from their initial distribution (here: those of the terms and
        wrapped mechanisms; a mechanism with weights of its own overrides this)."""
        reset_children(self)

    def edge_scores(self, x1, x2, edge_index: Tensor, edge_attr: Tensor | None = None) -> Tensor:
        """The mechanism's values on the edges m -> n of ``edge_index``: (E, K) or (B, E, K)."""
        # generic fallback: gather from the dense scores (subclasses avoid building M x N; a
        # mechanism that reads edge features overrides this)
        src, dst = edges(edge_index)
        s = self(x1, x2)
        s = s if s.dim() == 4 else s.unsqueeze(0)
        return _unbatch(s[:, :, src, dst].transpose(1, 2), x1, x2)

    def base(self) -> Mechanism:
        """The innermost mechanism under the transforms."""
        return self

    def entries(self, x) -> int:
        """Number of entries (M or N) of an auxiliary input (an int is taken as the count)."""
        return int(x) if isinstance(x, int) else x.shape[-2]

    def __add__(self, other):
        if isinstance(other, Mechanism):
            return Sum([self, other])
        if isinstance(other, Tensor):
            return Masked(self, other)  # the paper's a + H
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, int) and other == 0:  # sum([a, b, c]) starts from 0
            return self
        if isinstance(other, Tensor):
            return Masked(self, other)
        return NotImplemented


def _check_K(terms: list[Mechanism]) -> int:
    K = max(t.K for t in terms)
    bad = [f"{type(t).__name__}(K={t.K})" for t in terms if t.K not in (1, K)]
    if bad:
        raise ValueError(f"Sum: every term needs K={K} heads (or K=1, shared by all heads), "
                         f"got {', '.join(bad)}")
    return K


def _check_widths(terms: list[Mechanism]) -> None:
    """The content terms of a sum read the same inputs: features of one width (in1, in2), or
    per-head inputs of one head size C, not both."""
    bases = [(t, t.base()) for t in terms if t.reads_inputs]
    flat = [(t, b) for t, b in bases if hasattr(b, "in1")]
    per_head = [(t, b) for t, b in bases if isinstance(b, PerHead) and hasattr(b, "C")]
    if flat and per_head:
        raise ValueError(f"Sum: {type(flat[0][1]).__name__} reads features (M, P') but "
                         f"{type(per_head[0][1]).__name__} per-head inputs (M, K, C): the terms "
                         "of a sum read the same inputs")
    for name, group in (("in1", flat), ("in2", flat), ("C", per_head)):
        if len({getattr(b, name) for _, b in group}) > 1:
            got = ", ".join(f"{type(b).__name__}({name}={getattr(b, name)})" for _, b in group)
            raise ValueError(f"Sum: every term must read inputs of the same width {name}, got "
                             f"{got}")


class Sum(Mechanism):
    """Mechanisms added term-wise: scores (K, M, N) = Σ_t term_t's scores, densely and on edges.

    Terms share the inputs x1, x2 and the edge features; terms that read no content (index
    and edge terms) get the entry counts and the compute dtype of the content terms' scores.
    A term with K = 1 is shared by all K heads. ``a + b`` builds one (nested sums flatten).
    """

    def __init__(self, terms):
        super().__init__()
        flat: list[Mechanism] = []
        for t in terms:
            if not isinstance(t, Mechanism):
                raise TypeError(f"Sum adds Mechanisms, got {type(t).__name__}")
            flat.extend(t.parts if isinstance(t, Sum) else [t])
        if not flat:
            raise ValueError("Sum needs at least one term")
        self.K = _check_K(flat)
        _check_widths(flat)
        self.parts = nn.ModuleList(flat)
        self.reads_inputs = any(t.reads_inputs for t in flat)

    def entries(self, x):
        for t in self.parts:
            if t.reads_inputs:
                return t.entries(x)
        return Mechanism.entries(self, x)

    def _run(self, calls):
        # content terms first: their dtype and device are those the position and edge terms
        # compute in. ``calls``: [(reads_inputs, fn(like kwargs) -> scores)]
        out, like = None, None
        for reads, call in sorted(calls, key=lambda c: not c[0]):
            s = call({} if like is None else {"dtype": like.dtype, "device": like.device})
            if like is None and reads:
                like = s
            out = s if out is None else out + s
        return out

    def forward(self, x1, x2, edge_attr=None, **kw):
        M, N = self.entries(x1), self.entries(x2)
        return self._run([
            (t.reads_inputs, (lambda like, t=t: t(x1, x2, edge_attr)) if t.reads_inputs else
             (lambda like, t=t: t(M, N, edge_attr, **{**kw, **like}))) for t in self.parts])

    def edge_scores(self, x1, x2, edge_index, edge_attr=None, **kw):
        M, N = self.entries(x1), self.entries(x2)
        calls, grouped = [], {}
        for t in self.parts:
            if isinstance(t, QueryDot):  # bilinear in h2[n]: one product per group (below)
                grouped.setdefault((t.scale, t.K, t.C), []).append(t)
            elif t.reads_inputs:
                calls.append((True, lambda like, t=t: t.edge_scores(x1, x2, edge_index,
                                                                    edge_attr)))
            else:
                calls.append((False, lambda like, t=t: t.edge_scores(
                    M, N, edge_index, edge_attr, **{**kw, **like})))
        for group in grouped.values():
            calls.append((True, lambda like, g=group: query_dot(g, x1, x2, edge_index,
                                                                edge_attr)))
        return self._run(calls)


# ------------------------------------------------------------------------------------------------
class Biaffine(Mechanism):
    """The full bi-affine mechanism Ξ_k = (ξ_k, μ_k, ν_k, Λ_k) (eq. "biaffine-attention").

    Parameters ``Lambda`` (K, P', Q'), ``mu`` (K, P'), ``nu`` (K, Q'), ``xi`` (K,); any term can
    be switched off (then it is None).
    """

    def __init__(self, K: int, in1: int, in2: int, *, bilinear: bool = True, linear1: bool = True,
                 linear2: bool = True, bias: bool = True):
        super().__init__()
        if not any((bilinear, linear1, linear2, bias)):
            raise ValueError("Biaffine needs at least one term")
        check_sizes("Biaffine", K=K, in1=in1, in2=in2)
        self.K, self.in1, self.in2 = K, in1, in2
        self.Lambda = nn.Parameter(torch.empty(K, in1, in2)) if bilinear else None
        self.mu = nn.Parameter(torch.empty(K, in1)) if linear1 else None
        self.nu = nn.Parameter(torch.empty(K, in2)) if linear2 else None
        self.xi = nn.Parameter(torch.empty(K)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Λ, μ, ν ~ U(±1/√max(P', Q')), ξ = 0."""
        s = 1.0 / math.sqrt(max(self.in1, self.in2))
        with torch.no_grad():
            for w in (self.Lambda, self.mu, self.nu):
                if w is not None:
                    w.uniform_(-s, s)
            if self.xi is not None:
                self.xi.zero_()

    def extra_repr(self):
        return f"K={self.K}, in1={self.in1}, in2={self.in2}"

    def forward(self, x1, x2, edge_attr=None):
        return biaffine(x1, x2, self.Lambda, self.mu, self.nu, self.xi)

    def edge_scores(self, x1, x2, edge_index, edge_attr=None):
        src, dst = edges(edge_index)
        a, b = _b(x1, "x1", "Biaffine", self.in1), _b(x2, "x2", "Biaffine", self.in2)
        B = max(a.shape[0], b.shape[0])
        out = torch.zeros(B, src.shape[0], self.K, dtype=a.dtype, device=a.device)
        if self.Lambda is not None:
            left = torch.einsum("bmp,kpq->bmkq", a, self.Lambda.to(a.dtype))
            out = out + (left[:, src] * b[:, dst].unsqueeze(2)).sum(-1)
        if self.mu is not None:
            out = out + (a @ self.mu.to(a.dtype).t())[:, src]
        if self.nu is not None:
            out = out + (b @ self.nu.to(a.dtype).t())[:, dst]
        if self.xi is not None:
            out = out + self.xi.to(a.dtype)
        return _unbatch(out, x1, x2)


class DotProduct(Mechanism):
    """The Transformer's scores: Λ_k = Λ_key,k Λ_query,kᵀ · scale (eq. "transformer-lambda").

    ``key`` (K, P', D) projects the inputs x1, ``query`` (K, Q', D) the outputs x2; optional
    ``key_bias`` / ``query_bias`` (K, D) make it a full bi-affine mechanism (see
    ``as_biaffine``); ``scale`` defaults to 1/sqrt(D).
    """

    def __init__(self, K: int, in1: int, in2: int, D: int, *, bias: bool = False,
                 scale: float | None = None):
        super().__init__()
        check_sizes("DotProduct", K=K, in1=in1, in2=in2, D=D)
        self.K, self.in1, self.in2, self.D = K, in1, in2, D
        self.scale = check_scale(scale, 1.0 / math.sqrt(D), "DotProduct")
        self.key = nn.Parameter(torch.empty(K, in1, D))
        self.query = nn.Parameter(torch.empty(K, in2, D))
        self.key_bias = nn.Parameter(torch.empty(K, D)) if bias else None
        self.query_bias = nn.Parameter(torch.empty(K, D)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Λ_key ~ U(±1/√P'), Λ_query ~ U(±1/√Q'), biases 0."""
        with torch.no_grad():
            self.key.uniform_(-1, 1).div_(math.sqrt(self.in1))
            self.query.uniform_(-1, 1).div_(math.sqrt(self.in2))
            for b in (self.key_bias, self.query_bias):
                if b is not None:
                    b.zero_()

    def extra_repr(self):
        return f"K={self.K}, in1={self.in1}, in2={self.in2}, D={self.D}, scale={self.scale:.4g}"

    def project(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor]:
        """(query (B, K, N, D), key (B, K, M, D)): x2 Λ_query and x1 Λ_key (+ biases)."""
        a, b = _b(x1, "x1", "DotProduct", self.in1), _b(x2, "x2", "DotProduct", self.in2)
        k = torch.einsum("bmp,kpd->bkmd", a, self.key.to(a.dtype))
        q = torch.einsum("bnq,kqd->bknd", b, self.query.to(b.dtype))
        if self.key_bias is not None:
            k = k + self.key_bias.to(a.dtype).unsqueeze(1)
            q = q + self.query_bias.to(b.dtype).unsqueeze(1)
        return q, k

    def forward(self, x1, x2, edge_attr=None):
        q, k = self.project(x1, x2)
        return _unbatch((k * self.scale) @ q.transpose(-1, -2), x1, x2)

    def edge_scores(self, x1, x2, edge_index, edge_attr=None):
        src, dst = edges(edge_index)
        q, k = self.project(x1, x2)
        s = torch.linalg.vecdot(k[:, :, src], q[:, :, dst]) * self.scale  # (B, K, E)
        return _unbatch(s.transpose(1, 2), x1, x2)

    def as_biaffine(self) -> dict[str, Tensor | None]:
        """The equivalent bi-affine parameters {Lambda, mu, nu, xi} (scale folded in)."""
        s = self.scale
        out = {"Lambda": s * self.key @ self.query.transpose(1, 2), "mu": None, "nu": None,
               "xi": None}
        if self.key_bias is not None:
            out["mu"] = s * (self.key @ self.query_bias.unsqueeze(2)).squeeze(2)
            out["nu"] = s * (self.query @ self.key_bias.unsqueeze(2)).squeeze(2)
            out["xi"] = s * (self.key_bias * self.query_bias).sum(1)
        return out


# ------------------------------------------------------------------------------------------------
def heads(h, K: int, C: int, name: str, who: str) -> Tensor:
    """Per-head inputs (M, K, C) or (B, M, K, C), checked, as (B, M, K, C)."""
    if not isinstance(h, Tensor) or h.dim() not in (3, 4) or tuple(h.shape[-2:]) != (K, C):
        got = tuple(h.shape) if isinstance(h, Tensor) else type(h).__name__
        raise ValueError(f"{who}: {name} must be per-head inputs (M, K={K}, C={C}) or "
                         f"(B, M, K, C), got {got}")
    floating(h, f"{who}: {name}")
    return h if h.dim() == 4 else h.unsqueeze(0)


def unbatch_heads(out: Tensor, *inputs) -> Tensor:
    """Drop the batch dim added by ``heads`` when no per-head input had one."""
    batched = any(isinstance(t, Tensor) and t.dim() == 4 for t in inputs)
    return out if batched else out[0]


class PerHead(Mechanism):
    """Base of mechanisms on per-head inputs h = xΘ_k, (M, K, C) or (B, M, K, C) (the paper's
    GAT variant: the inputs are projected per head before the mechanism); entries are counted
    along dim -3."""

    def entries(self, x):
        return int(x) if isinstance(x, int) else x.shape[-3]


class GATScores(PerHead):
    """GAT's mechanism: bi-affine with Λ = 0 on per-head inputs h = xΘ_k.

    Inputs h1 (M, K, C), h2 (N, K, C) (a leading batch dim allowed); score[k, m, n] =
    h1[m, k]·mu[k] + h2[n, k]·nu[k] (``mu`` = PyG's att_src, ``nu`` = att_dst, both (K, C)).
    h2 given as an int N (the outputs' count) leaves out the ν term (PyG's bipartite call
    without target features). ``mu``/``nu`` may be given (e.g. a layer's own parameters,
    (K, C) or (1, K, C)); they are then used as they are, not copied.
    """

    def __init__(self, K: int, C: int, *, mu: Tensor | None = None, nu: Tensor | None = None):
        super().__init__()
        check_sizes("GATScores", K=K, C=C)
        self.K, self.C = K, C
        # given weights belong to the caller (a layer resets its own)
        self._own = [n for n, w in (("mu", mu), ("nu", nu)) if w is None]
        self.mu = nn.Parameter(torch.empty(K, C)) if mu is None else mu
        self.nu = nn.Parameter(torch.empty(K, C)) if nu is None else nu
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """μ, ν (those not given) ~ Glorot U(±√(6 / (K + C)))."""
        s = math.sqrt(6.0 / (self.K + self.C))
        with torch.no_grad():
            for n in self._own:
                getattr(self, n).uniform_(-s, s)

    def extra_repr(self):
        return f"K={self.K}, C={self.C}"

    def _parts(self, h1, h2):
        """(μ·h1 (.., M, K), ν·h2 (.., N, K) or None), on the inputs as given (batched or not)."""
        heads(h1, self.K, self.C, "h1", "GATScores")
        s1 = torch.linalg.vecdot(h1, self.mu.reshape(self.K, self.C).to(h1.dtype))
        if isinstance(h2, int):
            return s1, None
        heads(h2, self.K, self.C, "h2", "GATScores")
        return s1, torch.linalg.vecdot(h2, self.nu.reshape(self.K, self.C).to(h2.dtype))

    def forward(self, h1, h2, edge_attr=None):
        s1, s2 = self._parts(h1, h2)
        out = s1.transpose(-1, -2).unsqueeze(-1)  # (.., K, M, 1)
        if s2 is None:
            return out.expand(*out.shape[:-1], int(h2))
        return out + s2.transpose(-1, -2).unsqueeze(-2)

    def edge_scores(self, h1, h2, edge_index, edge_attr=None):
        src, dst = edges(edge_index)
        s1, s2 = self._parts(h1, h2)
        # gathered along the entries dim as given: an unbatched (E, K) gather's backward is a
        # dim-0 index_add, ~30% faster than on a leading batch dim of 1
        out = s1.index_select(-2, src)
        return out if s2 is None else out + s2.index_select(-2, dst)


class QueryDot(PerHead):
    """Base of terms bilinear in the outputs' per-head inputs: score_k(m, n) = scale ·
    κ_mn,k · h2[n, k], with per-edge keys κ given by ``edge_keys``.

    A ``Sum`` evaluates its terms of this form that share a scale with one product,
    scale · (Σ_t κ_t) · h2[n] (distributivity: one gather of h2 and one reduction per edge).
    """

    K: int
    C: int
    scale: float

    def edge_keys(self, h1, h2, edge_index: Tensor, edge_attr=None) -> Tensor:
        """The keys of the edges, (E, K, C) or (B, E, K, C) (batched inputs)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement edge_keys")

    def edge_scores(self, h1, h2, edge_index, edge_attr=None):
        return query_dot([self], h1, h2, edge_index, edge_attr)


def query_dot(terms: list[QueryDot], h1, h2, edge_index: Tensor, edge_attr=None) -> Tensor:
    """Σ_t scale · κ_t[e] · h2[target(e)] for ``QueryDot`` terms sharing scale, K and C:
    (E, K), or (B, E, K) when an input is batched."""
    _, dst = edges(edge_index)
    t0 = terms[0]
    heads(h2, t0.K, t0.C, "h2", type(t0).__name__)
    keys = None
    for t in terms:
        k = t.edge_keys(h1, h2, edge_index, edge_attr)
        keys = k if keys is None else keys + k
    # gathers along the entries dim of the tensors as given (an unbatched (E, K, C) gather's
    # backward, a dim-0 index_add, is ~30% faster than on a leading batch dim of 1); one fused
    # multiply-reduce per edge and head (a product then a sum is ~3x slower)
    return torch.linalg.vecdot(keys, h2.index_select(-3, dst).to(keys.dtype)) * t0.scale


class HeadDot(QueryDot):
    """Scaled dot product of per-head inputs: score[k, m, n] = scale · h1[m, k]·h2[n, k].

    The Transformer's mechanism (eq. "transformer-lambda") on inputs already projected per
    head (h1 = keys x1 Λ_key,k, h2 = queries x2 Λ_query,k, each (M, K, C) / (N, K, C)), as
    PyG's TransformerConv computes them; ``scale`` defaults to 1/sqrt(C).
    """

    def __init__(self, K: int, C: int, scale: float | None = None):
        super().__init__()
        check_sizes("HeadDot", K=K, C=C)
        self.K, self.C = K, C
        self.scale = check_scale(scale, 1.0 / math.sqrt(C), "HeadDot")

    def extra_repr(self):
        return f"K={self.K}, C={self.C}, scale={self.scale:.4g}"

    def forward(self, h1, h2, edge_attr=None):
        a = heads(h1, self.K, self.C, "h1", "HeadDot")
        b = heads(h2, self.K, self.C, "h2", "HeadDot")
        out = (a.transpose(1, 2) * self.scale) @ b.permute(0, 2, 3, 1)  # (B, K, M, N)
        return unbatch_heads(out, h1, h2)

    def edge_keys(self, h1, h2, edge_index, edge_attr=None):
        src, _ = edges(edge_index)
        heads(h1, self.K, self.C, "h1", "HeadDot")
        return h1.index_select(-3, src)


# ------------------------------------------------------------------------------------------------
class _Transform(Mechanism):
    def __init__(self, inner: Mechanism):
        super().__init__()
        if not isinstance(inner, Mechanism):
            raise TypeError(f"{type(self).__name__} wraps a Mechanism, got {type(inner).__name__}")
        self.inner = inner
        self.K = inner.K
        self.reads_inputs = inner.reads_inputs

    def base(self):
        return self.inner.base()

    def entries(self, x):
        return self.inner.entries(x)


class Masked(_Transform):
    """inner + H: a log-domain mask (M, N) (or broadcastable to (B, K, M, N)) and/or causal.

    ``mask`` may also be bool (True = allowed) or any additive float; ``causal`` allows input
    m on output n iff m <= n.
    """

    def __init__(self, inner: Mechanism, mask: Tensor | None = None, *, causal: bool = False):
        super().__init__(inner)
        if mask is not None:
            _check_mask(mask)
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
        self.mask, self.causal = mask, bool(causal)

    def _edge_mask(self, M: int, N: int, dtype) -> Tensor:
        """The mask as (B|1, K|1, M, N) in ``dtype``, its shape checked against (M, N)."""
        m = self.mask
        try:
            torch.broadcast_shapes(m.shape[-3:], (self.K, M, N))
        except RuntimeError:
            raise ValueError(f"Masked: mask of shape {tuple(m.shape)} does not broadcast to the "
                             f"scores' (K, M, N)=({self.K}, {M}, {N}) (paper orientation: "
                             "inputs x outputs)") from None
        m = m.to(dtype)
        m = m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))
        return m.expand(*m.shape[:2], M, N)

    def _full_mask(self, M, N, dtype, device):
        H = torch.zeros(M, N, dtype=dtype, device=device)
        if self.causal:
            H = H.masked_fill(~torch.ones(M, N, dtype=torch.bool, device=device).triu(),
                              float("-inf"))
        return H if self.mask is None else H + self.mask.to(dtype)

    def forward(self, x1, x2, edge_attr=None, **kw):
        s = self.inner(x1, x2, edge_attr, **kw)
        if self.mask is not None:
            try:
                torch.broadcast_shapes(self.mask.shape, s.shape)
            except RuntimeError:
                raise ValueError(f"Masked: mask of shape {tuple(self.mask.shape)} does not "
                                 f"broadcast to the scores {tuple(s.shape)} ((B,) K, M, N) "
                                 "(paper orientation: inputs x outputs)") from None
        return s + self._full_mask(s.shape[-2], s.shape[-1], s.dtype, s.device)

    def edge_scores(self, x1, x2, edge_index, edge_attr=None, **kw):
        src, dst = edges(edge_index)
        s = self.inner.edge_scores(x1, x2, edge_index, edge_attr, **kw)  # (.., E, K)
        if self.causal:
            s = s.masked_fill((src > dst).unsqueeze(1), float("-inf"))
        if self.mask is not None:
            m = self._edge_mask(self.entries(x1), self.entries(x2), s.dtype)
            m = m[:, :, src, dst].transpose(1, 2)  # (B|1, E, K|1)
            s = s + m.squeeze(0) if s.dim() == 2 else s + m
        return s


def _check_mask(mask) -> None:
    if not isinstance(mask, Tensor):
        raise TypeError(f"Masked: mask must be a tensor (M, N) or broadcastable to (B, K, M, "
                        f"N), got {type(mask).__name__}")
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise TypeError(f"Masked: mask must be bool (True = allowed) or a floating log mask "
                        f"(0 / -inf, or additive scores), got dtype {mask.dtype}")
    if not 1 <= mask.dim() <= 4:
        raise ValueError(f"Masked: mask must be (M, N) or broadcastable to (B, K, M, N), got "
                         f"shape {tuple(mask.shape)}")


class GraphMasked(_Transform):
    """inner masked by a graph: only edges m -> n of ``edge_index`` (2, E) keep their score.

    With ``attention_basis`` this runs per edge (O(E)); duplicate edges then count once each,
    as in PyG, whereas the dense ``forward`` (small graphs) sees each pair once. Edge features
    given to ``edge_scores`` / ``attention_basis`` are those of these edges, (E, D).
    """

    def __init__(self, inner: Mechanism, edge_index: Tensor):
        super().__init__(inner)
        check_index_tensor(edge_index, 2, "GraphMasked edge_index")
        self.edge_index = edge_index.long()

    def forward(self, x1, x2, edge_attr=None, **kw):
        s = self.inner(x1, x2, edge_attr, **kw)
        M, N = s.shape[-2:]
        return s + graph_mask(self.edge_index, M, N, dtype=s.dtype)

    def edge_scores(self, x1, x2, edge_index=None, edge_attr=None, **kw):
        return self.inner.edge_scores(x1, x2, self.edge_index, edge_attr, **kw)


class LeakyReLU(_Transform):
    """Term-wise leaky ReLU (keeps -inf masks: a plain ReLU would unmask them)."""

    def __init__(self, inner: Mechanism, negative_slope: float = 0.2):
        super().__init__(inner)
        if not number_in(negative_slope, -math.inf, math.inf):
            raise ValueError(f"LeakyReLU: negative_slope must be a finite number, got "
                             f"{negative_slope!r}")
        self.negative_slope = float(negative_slope)

    def forward(self, x1, x2, edge_attr=None, **kw):
        return F.leaky_relu(self.inner(x1, x2, edge_attr, **kw), self.negative_slope)

    def edge_scores(self, x1, x2, edge_index, edge_attr=None, **kw):
        return F.leaky_relu(self.inner.edge_scores(x1, x2, edge_index, edge_attr, **kw),
                            self.negative_slope)


class Softmax(_Transform):
    """Softmax over ``"inputs"`` (each column A[k, :, n]) or ``"outputs"`` (each row).

    An entirely masked column (row) gives zeros, never NaN.
    """

    def __init__(self, inner: Mechanism, over: str = "inputs"):
        super().__init__(inner)
        if over not in ("inputs", "outputs"):
            raise ValueError(f"Softmax over must be 'inputs' or 'outputs', got {over!r}")
        self.over = over

    def forward(self, x1, x2, edge_attr=None, **kw):
        return masked_softmax(self.inner(x1, x2, edge_attr, **kw),
                              -2 if self.over == "inputs" else -1)

    def edge_scores(self, x1, x2, edge_index, edge_attr=None, **kw):
        src, dst = edges(edge_index)
        s = self.inner.edge_scores(x1, x2, edge_index, edge_attr, **kw)
        if self.over == "inputs":
            return edge_softmax(s, dst, self.entries(x2))
        return edge_softmax(s, src, self.entries(x1))


def chain(mech: Mechanism) -> list[Mechanism]:
    """The transforms of ``mech`` from the outside in, ending with its base mechanism."""
    out = [mech]
    while isinstance(out[-1], _Transform):
        out.append(out[-1].inner)
    return out

"""Attention mechanisms as modules, and the transforms that compose them.

A mechanism maps auxiliary inputs x1 (M, P') and x2 (N, Q') (a leading batch dim allowed) to
scores (K, M, N) (or (B, K, M, N)); ``edge_scores`` gives the same values on a graph's edges only,
(E, K) (or (B, E, K)), without building M x N. Transforms wrap a mechanism:
``Softmax(LeakyReLU(GraphMasked(GATScores(K, C), edge_index)))`` is GAT's, and
``Softmax(Masked(DotProduct(K, P, P, D), causal=True))`` a Transformer decoder's self-attention.
``attention_basis`` turns a mechanism and its inputs into the fastest matching basis.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_index_tensor
from .basis import AttentionBasis, DotProductAttention, GraphAttention
from .biaffine import biaffine
from .masks import edge_softmax, graph_mask, masked_softmax

__all__ = ["Mechanism", "Biaffine", "DotProduct", "GATScores", "Masked", "GraphMasked",
           "LeakyReLU", "Softmax", "attention_basis"]


def _b(x: Tensor, what: str) -> Tensor:
    if not isinstance(x, Tensor) or x.dim() not in (2, 3):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{what} must be (M, P') or (B, M, P'), got {got}")
    return x if x.dim() == 3 else x.unsqueeze(0)


def _unbatch(out: Tensor, *inputs: Tensor) -> Tensor:
    return out[0] if all(t.dim() == 2 for t in inputs) else out


def _edges(edge_index: Tensor) -> tuple[Tensor, Tensor]:
    check_index_tensor(edge_index, 2, "edge_index")
    return edge_index[0].long(), edge_index[1].long()


class Mechanism(nn.Module):
    """Base class: ``forward(x1, x2)`` -> (K, M, N) / (B, K, M, N); ``edge_scores`` on edges."""

    K: int

    def edge_scores(self, x1: Tensor, x2: Tensor, edge_index: Tensor) -> Tensor:
        """The mechanism's values on the edges m -> n of ``edge_index``: (E, K) or (B, E, K)."""
        # generic fallback: gather from the dense scores (subclasses avoid building M x N)
        src, dst = _edges(edge_index)
        s = self(x1, x2)
        s = s if s.dim() == 4 else s.unsqueeze(0)
        return _unbatch(s[:, :, src, dst].transpose(1, 2), x1, x2)

    def base(self) -> Mechanism:
        """The innermost mechanism under the transforms."""
        return self

    def entries(self, x: Tensor) -> int:
        """Number of entries (M or N) of an auxiliary input."""
        return x.shape[-2]


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
        self.K, self.in1, self.in2 = K, in1, in2
        s = 1.0 / math.sqrt(max(in1, in2))
        self.Lambda = nn.Parameter(torch.empty(K, in1, in2).uniform_(-s, s)) if bilinear else None
        self.mu = nn.Parameter(torch.empty(K, in1).uniform_(-s, s)) if linear1 else None
        self.nu = nn.Parameter(torch.empty(K, in2).uniform_(-s, s)) if linear2 else None
        self.xi = nn.Parameter(torch.zeros(K)) if bias else None

    def extra_repr(self):
        return f"K={self.K}, in1={self.in1}, in2={self.in2}"

    def forward(self, x1, x2):
        return biaffine(x1, x2, self.Lambda, self.mu, self.nu, self.xi)

    def edge_scores(self, x1, x2, edge_index):
        src, dst = _edges(edge_index)
        a, b = _b(x1, "x1"), _b(x2, "x2")
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
        self.K, self.in1, self.in2, self.D = K, in1, in2, D
        self.scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
        self.key = nn.Parameter(torch.empty(K, in1, D).uniform_(-1, 1) / math.sqrt(in1))
        self.query = nn.Parameter(torch.empty(K, in2, D).uniform_(-1, 1) / math.sqrt(in2))
        self.key_bias = nn.Parameter(torch.zeros(K, D)) if bias else None
        self.query_bias = nn.Parameter(torch.zeros(K, D)) if bias else None

    def extra_repr(self):
        return f"K={self.K}, in1={self.in1}, in2={self.in2}, D={self.D}, scale={self.scale:.4g}"

    def project(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor]:
        """(query (B, K, N, D), key (B, K, M, D)): x2 Λ_query and x1 Λ_key (+ biases)."""
        a, b = _b(x1, "x1"), _b(x2, "x2")
        k = torch.einsum("bmp,kpd->bkmd", a, self.key.to(a.dtype))
        q = torch.einsum("bnq,kqd->bknd", b, self.query.to(b.dtype))
        if self.key_bias is not None:
            k = k + self.key_bias.to(a.dtype).unsqueeze(1)
            q = q + self.query_bias.to(b.dtype).unsqueeze(1)
        return q, k

    def forward(self, x1, x2):
        q, k = self.project(x1, x2)
        return _unbatch((k * self.scale) @ q.transpose(-1, -2), x1, x2)

    def edge_scores(self, x1, x2, edge_index):
        src, dst = _edges(edge_index)
        q, k = self.project(x1, x2)
        s = (k[:, :, src] * q[:, :, dst]).sum(-1) * self.scale  # (B, K, E)
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


class GATScores(Mechanism):
    """GAT's mechanism: bi-affine with Λ = 0 on per-head inputs h = xΘ_k.

    Inputs h1 (M, K, C), h2 (N, K, C) (a leading batch dim allowed); score[k, m, n] =
    h1[m, k]·mu[k] + h2[n, k]·nu[k] (``mu`` = PyG's att_src, ``nu`` = att_dst, both (K, C)).
    """

    def __init__(self, K: int, C: int):
        super().__init__()
        self.K, self.C = K, C
        s = math.sqrt(6.0 / (K + C))
        self.mu = nn.Parameter(torch.empty(K, C).uniform_(-s, s))
        self.nu = nn.Parameter(torch.empty(K, C).uniform_(-s, s))

    def extra_repr(self):
        return f"K={self.K}, C={self.C}"

    def entries(self, x):
        return x.shape[-3]

    def _parts(self, h1, h2):
        for name, h in (("h1", h1), ("h2", h2)):
            if not isinstance(h, Tensor) or h.dim() not in (3, 4) or \
                    tuple(h.shape[-2:]) != (self.K, self.C):
                got = tuple(h.shape) if isinstance(h, Tensor) else type(h).__name__
                raise ValueError(f"GATScores: {name} must be (M, K={self.K}, C={self.C}) or "
                                 f"(B, M, K, C), got {got}")
        a = h1 if h1.dim() == 4 else h1.unsqueeze(0)
        b = h2 if h2.dim() == 4 else h2.unsqueeze(0)
        return (a * self.mu.to(a.dtype)).sum(-1), (b * self.nu.to(b.dtype)).sum(-1)  # (B, *, K)

    def forward(self, h1, h2):
        s1, s2 = self._parts(h1, h2)
        out = s1.transpose(1, 2).unsqueeze(3) + s2.transpose(1, 2).unsqueeze(2)
        return out[0] if h1.dim() == 3 and h2.dim() == 3 else out

    def edge_scores(self, h1, h2, edge_index):
        src, dst = _edges(edge_index)
        s1, s2 = self._parts(h1, h2)
        out = s1[:, src] + s2[:, dst]
        return out[0] if h1.dim() == 3 and h2.dim() == 3 else out


# ------------------------------------------------------------------------------------------------
class _Transform(Mechanism):
    def __init__(self, inner: Mechanism):
        super().__init__()
        if not isinstance(inner, Mechanism):
            raise TypeError(f"{type(self).__name__} wraps a Mechanism, got {type(inner).__name__}")
        self.inner = inner
        self.K = inner.K

    def base(self):
        return self.inner.base()

    def entries(self, x):
        return self.inner.entries(x)


class Masked(_Transform):
    """inner + H: a log-domain mask (M, N) (or broadcastable to (B, K, M, N)) and/or causal.

    ``mask`` may also be bool (True = allowed); ``causal`` allows input m on output n iff m <= n.
    """

    def __init__(self, inner: Mechanism, mask: Tensor | None = None, *, causal: bool = False):
        super().__init__(inner)
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
        self.mask, self.causal = mask, bool(causal)

    def _full_mask(self, M, N, dtype, device):
        H = torch.zeros(M, N, dtype=dtype, device=device)
        if self.causal:
            H = H.masked_fill(~torch.ones(M, N, dtype=torch.bool, device=device).triu(),
                              float("-inf"))
        return H if self.mask is None else H + self.mask.to(dtype)

    def forward(self, x1, x2):
        s = self.inner(x1, x2)
        return s + self._full_mask(s.shape[-2], s.shape[-1], s.dtype, s.device)

    def edge_scores(self, x1, x2, edge_index):
        src, dst = _edges(edge_index)
        s = self.inner.edge_scores(x1, x2, edge_index)  # (.., E, K)
        if self.causal:
            s = s.masked_fill((src > dst).unsqueeze(1), float("-inf"))
        if self.mask is not None:
            m = self.mask.to(s.dtype)
            m = m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))  # (B|1, K|1, M, N)
            s = s + m[:, :, src, dst].transpose(1, 2).squeeze(0) if s.dim() == 2 else \
                s + m[:, :, src, dst].transpose(1, 2)
        return s


class GraphMasked(_Transform):
    """inner masked by a graph: only edges m -> n of ``edge_index`` (2, E) keep their score.

    With ``attention_basis`` this runs per edge (O(E)); duplicate edges then count once each,
    as in PyG, whereas the dense ``forward`` (small graphs) sees each pair once.
    """

    def __init__(self, inner: Mechanism, edge_index: Tensor):
        super().__init__(inner)
        check_index_tensor(edge_index, 2, "GraphMasked edge_index")
        self.edge_index = edge_index.long()

    def forward(self, x1, x2):
        s = self.inner(x1, x2)
        M, N = s.shape[-2:]
        return s + graph_mask(self.edge_index, M, N, dtype=s.dtype)

    def edge_scores(self, x1, x2, edge_index=None):
        return self.inner.edge_scores(x1, x2, self.edge_index)


class LeakyReLU(_Transform):
    """Term-wise leaky ReLU (keeps -inf masks: a plain ReLU would unmask them)."""

    def __init__(self, inner: Mechanism, negative_slope: float = 0.2):
        super().__init__(inner)
        self.negative_slope = float(negative_slope)

    def forward(self, x1, x2):
        return F.leaky_relu(self.inner(x1, x2), self.negative_slope)

    def edge_scores(self, x1, x2, edge_index):
        return F.leaky_relu(self.inner.edge_scores(x1, x2, edge_index), self.negative_slope)


class Softmax(_Transform):
    """Softmax over ``"inputs"`` (each column A[k, :, n]) or ``"outputs"`` (each row).

    An entirely masked column (row) gives zeros, never NaN.
    """

    def __init__(self, inner: Mechanism, over: str = "inputs"):
        super().__init__(inner)
        if over not in ("inputs", "outputs"):
            raise ValueError(f"Softmax over must be 'inputs' or 'outputs', got {over!r}")
        self.over = over

    def forward(self, x1, x2):
        return masked_softmax(self.inner(x1, x2), -2 if self.over == "inputs" else -1)

    def edge_scores(self, x1, x2, edge_index):
        src, dst = _edges(edge_index)
        s = self.inner.edge_scores(x1, x2, edge_index)
        if self.over == "inputs":
            return edge_softmax(s, dst, self.entries(x2))
        return edge_softmax(s, src, self.entries(x1))


def _chain(mech: Mechanism) -> list[Mechanism]:
    out = [mech]
    while isinstance(out[-1], _Transform):
        out.append(out[-1].inner)
    return out


def attention_basis(mechanism: Mechanism, x1: Tensor, x2: Tensor):
    """The basis A_k = mechanism(x1, x2; Ξ_k) on its fastest path.

    Softmax over a graph-masked mechanism -> ``GraphAttention`` (per edge, O(E));
    softmax over inputs of a (masked, causal) ``DotProduct`` -> ``DotProductAttention`` (SDPA);
    anything else -> dense ``AttentionBasis``. For self-attention pass x as both inputs.
    """
    chain = _chain(mechanism)
    graphs = [t for t in chain if isinstance(t, GraphMasked)]
    M, N = mechanism.entries(x1), mechanism.entries(x2)
    if isinstance(mechanism, Softmax) and len(graphs) == 1:
        ei = graphs[0].edge_index
        s = mechanism.inner.edge_scores(x1, x2, ei)
        if mechanism.over == "inputs":
            return GraphAttention.from_scores(ei, s, M, N)
        return GraphAttention(ei, edge_softmax(s, ei[0], M), M, N)
    if isinstance(mechanism, Softmax) and mechanism.over == "inputs" and \
            isinstance(chain[-1], DotProduct) and all(isinstance(t, Masked) for t in chain[1:-1]):
        base = chain[-1]
        q, k = base.project(x1, x2)
        masks = [t.mask for t in chain[1:-1] if t.mask is not None]
        mask = None
        for m in masks:
            m = m.to(q.dtype)
            mask = m if mask is None else mask + m
        causal = any(t.causal for t in chain[1:-1])
        return DotProductAttention(q, k, mask, causal=causal, scale=base.scale)
    return AttentionBasis(mechanism(x1, x2))

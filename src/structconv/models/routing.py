"""The attention model for routing (Kool, van Hoof & Welling, ICLR 2019) as structconv layers.

A TSP instance is n cities (B, n, 2) in the unit square; a tour is a permutation of them.

* Encoder: a linear embedding of the coordinates, then ``layers`` blocks
  h' = BN(h + MHA(h)), h = BN(h' + FF(h')). MHA is a self-attention convolution over the
  cities, y = Σ_k A_kᵀ h Θ_k with A_k = softmax over inputs of the scaled dot product
  (``sc.attention.DotProduct``, applied with SDPA) and Θ_k = V_k O_k (``sc.params.LowRank``):
  every city attends to every city (no mask: the graph is complete), content-based only.
* Decoder, one city per step: the context query (the graph embedding, mean of the city
  embeddings, plus a projection of the first and the last city of the partial tour, learned
  placeholders at the first step) attends to the cities not yet visited (a glimpse: an
  attention convolution whose mask is the dynamic set of visited cities), and its output
  points at the next city: a one-head attention column, C · tanh(q·k / sqrt(W)) clipped
  (``sc.attention.TanhClip``, C = 10), masked, normalised over the cities. The pointer's
  distribution *is* that attention column: A_1[:, 0] of a basis with M = n inputs and one
  output.

The decoder's keys and values are projected once per instance (the ``input_param`` order of
the convolution, x Θ first), not at every step: the glimpse is a ``DotProductAttention``
basis of the step's query against those keys, masked by the unvisited cities (SDPA), applied
to the projected values; the pointer's scores are the mechanism
``Masked(TanhClip(KeyDot(), C), unvisited)`` on the prepared keys.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..attention.basis import DotProductAttention
from ..attention.build import attention_basis
from ..attention.clip import TanhClip
from ..attention.mechanisms import DotProduct, Masked, Mechanism, Softmax
from ..data.tsp import check_tours, tour_length
from ..engine import convolve
from ..nn.blocks import FeedForward, former_keys, post_norm
from ..params import LowRank, reset_children, reset_module

__all__ = ["EncoderLayer", "KeyDot", "PointerDecoder", "AttentionModel", "tour_length",
           "check_tours"]


class EncoderLayer(nn.Module):
    """One encoder block: h' = BN(h + MHA(h)), out = BN(h' + FF(h')); (B, n, W) -> (B, n, W).

    MHA is the self-attention convolution Σ_k softmax(h Λ_key,k (h Λ_query,k)ᵀ / sqrt(D))ᵀ
    h V_k O_k with K = ``heads`` heads of D = W / K channels, no biases (as the paper);
    batch norm over all cities of the batch, FF = Linear(W, ffn), ReLU, Linear(ffn, W) (a
    ``sc.nn.FeedForward``); both branches post-norm (``sc.nn.blocks.post_norm``), as the
    paper. Checkpoints keep the feed-forward's former names ``ff.0`` / ``ff.2``."""

    def __init__(self, width: int, heads: int, ffn: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"EncoderLayer: width={width} must be divisible by heads={heads}")
        D = width // heads
        self.mechanism = Softmax(DotProduct(heads, width, width, D))
        self.param = LowRank(heads, width, width, D)
        self.bn1, self.bn2 = nn.BatchNorm1d(width), nn.BatchNorm1d(width)
        self.ff = FeedForward(width, ffn, F.relu)
        # the feed-forward was an nn.Sequential (Linear, ReLU, Linear): its checkpoint names
        former_keys(self, **{"ff.0": "ff.fc", "ff.2": "ff.proj"})

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init; the batch
        norms' running statistics start over)."""
        reset_children(self)

    def attention(self, h: Tensor) -> Tensor:
        """The attention convolution alone: (B, n, W) -> (B, n, W)."""
        return convolve(h, attention_basis(self.mechanism, h, h), self.param)

    @staticmethod
    def _norm(bn: nn.BatchNorm1d, h: Tensor) -> Tensor:
        return bn(h.reshape(-1, h.shape[-1])).view_as(h)

    def forward(self, h: Tensor) -> Tensor:
        h = post_norm(h, partial(self._norm, self.bn1), self.attention)
        return post_norm(h, partial(self._norm, self.bn2), self.ff)


class KeyDot(Mechanism):
    """One head of dot-product scores on inputs already projected (and scaled):
    score[m, n] = x1[m]·x2[n]; x1 (B, M, C), x2 (B, N, C) -> (B, 1, M, N).

    The decoder's keys are projected once per instance and its query once per step, so the
    mechanism takes them as they are (``DotProduct`` would project both on every call)."""

    K = 1

    def forward(self, x1, x2, edge_attr=None):
        if x1.dim() != 3 or x2.dim() != 3 or x1.shape[0] != x2.shape[0] or \
                x1.shape[2] != x2.shape[2]:
            raise ValueError(f"KeyDot expects x1 (B, M, C) and x2 (B, N, C), got "
                             f"{tuple(x1.shape)} and {tuple(x2.shape)}")
        return (x1 @ x2.transpose(1, 2)).unsqueeze(1)


class PointerDecoder(nn.Module):
    """The context query, the masked glimpse and the clipped pointer (see the module doc).

    ``prepare(h)`` projects the city embeddings (B, n, W) once; ``step(prep, first, last,
    visited)`` gives the log-probabilities (B, n) of the next city (−inf on visited ones)."""

    def __init__(self, width: int, heads: int, clip: float = 10.0):
        super().__init__()
        if width % heads:
            raise ValueError(f"PointerDecoder: width={width} must be divisible by heads={heads}")
        self.width, self.heads, self.D = width, heads, width // heads
        # glimpse keys, glimpse values (x V_k) and pointer keys of every city, at once
        self.project_nodes = nn.Linear(width, 3 * width, bias=False)
        self.project_graph = nn.Linear(width, width, bias=False)
        self.project_step = nn.Linear(2 * width, width, bias=False)
        self.placeholder = nn.Parameter(torch.empty(2 * width).uniform_(-1, 1))
        self.project_out = nn.Linear(width, width, bias=False)  # O_k, heads side by side
        self.pointer = TanhClip(KeyDot(), clip)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does, in its order: the projections
        (torch's ``Linear`` init) and the first step's placeholder U(-1, 1)."""
        for lin in (self.project_nodes, self.project_graph, self.project_step):
            lin.reset_parameters()
        with torch.no_grad():
            self.placeholder.uniform_(-1, 1)
        self.project_out.reset_parameters()
        reset_module(self.pointer)

    def prepare(self, h: Tensor) -> dict:
        """Per-instance projections of the city embeddings h (B, n, W): glimpse keys and
        values per head (B, K, n, D), pointer keys (B, n, W) scaled by 1/sqrt(W)."""
        B, n, W = h.shape
        gk, gv, pk = self.project_nodes(h).chunk(3, -1)
        gk, gv = (t.reshape(B, n, self.heads, self.D).transpose(1, 2).contiguous()
                  for t in (gk, gv))
        return {"h": h, "glimpse_keys": gk, "glimpse_values": gv,
                "pointer_keys": pk / math.sqrt(W), "graph": self.project_graph(h.mean(1))}

    def query(self, prep: dict, first: Tensor | None, last: Tensor | None) -> Tensor:
        """The context query (B, W): graph part plus the projected [h_last, h_first]."""
        h = prep["h"]
        if first is None:
            ends = self.placeholder.expand(h.shape[0], -1)
        else:
            idx = torch.arange(h.shape[0], device=h.device)
            ends = torch.cat([h[idx, last], h[idx, first]], -1)
        return prep["graph"] + self.project_step(ends)

    def glimpse(self, prep: dict, q: Tensor, allowed: Tensor) -> Tensor:
        """The glimpse, an attention convolution of the context query over the allowed
        cities: Σ_k A_kᵀ (h V_k) O_k with A_k = softmax over cities of the scaled dot product,
        masked by ``allowed`` (B, 1, n, 1); (B, W)."""
        B = q.shape[0]
        basis = DotProductAttention(q.view(B, self.heads, 1, self.D), prep["glimpse_keys"],
                                    mask=allowed, check_dead=False)
        heads = basis.propagate_heads(prep["glimpse_values"].transpose(1, 2))  # (B, 1, K, D)
        return self.project_out(heads.reshape(B, self.width))

    def step(self, prep: dict, first: Tensor | None, last: Tensor | None,
             visited: Tensor) -> Tensor:
        """Log-probabilities (B, n) of the next city given the tour so far (``visited`` (B, n)
        bool; ``first``/``last`` (B,) city ids, None at the first step)."""
        B, n, _ = prep["h"].shape
        allowed = (~visited).view(B, 1, n, 1)  # a mask over inputs (cities), one output
        g = self.glimpse(prep, self.query(prep, first, last), allowed)
        scores = Masked(self.pointer, allowed)(prep["pointer_keys"], g.unsqueeze(1))
        return torch.log_softmax(scores.view(B, n), -1)


class AttentionModel(nn.Module):
    """Kool et al.'s attention model: ``forward(coords, decode)`` with coords (B, n, 2) ->
    (tours (B, n) long, log-likelihood of each tour (B,)); ``decode`` "greedy" (argmax at
    every step) or "sample" (from the policy, with ``generator``)."""

    def __init__(self, width: int = 128, heads: int = 8, layers: int = 3, ffn: int = 512,
                 clip: float = 10.0):
        super().__init__()
        for what, v in (("width", width), ("heads", heads), ("layers", layers), ("ffn", ffn)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"AttentionModel: {what} must be an int >= 1, got {v!r}")
        self.embed = nn.Linear(2, width)
        self.encoder = nn.Sequential(*[EncoderLayer(width, heads, ffn) for _ in range(layers)])
        self.decoder = PointerDecoder(width, heads, clip)

    def reset_parameters(self) -> None:
        """Re-draw every weight as the constructor does (each layer's own init)."""
        reset_children(self)

    def encode(self, coords: Tensor) -> Tensor:
        if coords.dim() != 3 or coords.shape[-1] != 2 or coords.shape[1] < 2:
            raise ValueError(f"AttentionModel expects coordinates (B, n >= 2, 2), got "
                             f"{tuple(coords.shape)}")
        return self.encoder(self.embed(coords.to(self.embed.weight.dtype)))

    def forward(self, coords: Tensor, decode: str = "sample",
                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        if decode not in ("greedy", "sample"):
            raise ValueError(f"decode must be 'greedy' or 'sample', got {decode!r}")
        return self.decode(self.decoder.prepare(self.encode(coords)), decode, generator)

    def decode(self, prep: dict, decode: str, generator=None) -> tuple[Tensor, Tensor]:
        """Build tours from prepared embeddings (see ``forward``)."""
        B, n, _ = prep["h"].shape
        visited = torch.zeros(B, n, dtype=torch.bool, device=prep["h"].device)
        rows = torch.arange(B, device=visited.device)
        first = last = None
        tour, ll = [], prep["h"].new_zeros(B)
        for _ in range(n):
            logp = self.decoder.step(prep, first, last, visited)
            if decode == "greedy":
                city = logp.argmax(-1)
            else:
                city = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
            ll = ll + logp[rows, city]
            visited[rows, city] = True
            first = city if first is None else first
            last = city
            tour.append(city)
        return torch.stack(tour, 1), ll

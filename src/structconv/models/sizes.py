"""Parameter counts of the sequence models of a config, computed from their sizes alone.

``lm_parameters`` and ``seq2seq_parameters`` give exactly ``sum(p.numel() for p in
model.parameters())`` of the ``sc.nn.TransformerLM``, ``sc.nn.Seq2Seq`` or
``sc.nn.PervasiveAttention`` that ``structconv.models.build`` would build (tied weights counted
once), in O(1) arithmetic: the memory estimate refuses a model of a million layers before
anything is built (building it first would fill the memory the estimate is there to protect).
"""

from __future__ import annotations

from ..nn.lm import RELATIVE_BUCKETS

__all__ = ["lm_parameters", "seq2seq_parameters", "pervasive_parameters", "ffn_at_budget"]


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _norm(width: int, bias: bool) -> int:
    return width * (2 if bias else 1)


def _attention(W: int, H: int, S: int, bias: bool, canon_b: int) -> int:
    """A self-attention of H attention heads and S shift heads of size W / H (packed q/k/v
    and the shift heads' values in one map, then the output map), Canon-B of ``canon_b`` taps
    on the 3·W q/k/v channels."""
    D = W // H
    return _linear(W, (3 * H + S) * D, bias) + _linear((H + S) * D, W, bias) + canon_b * 3 * W


def _feed_forward(W: int, ffn: int, bias: bool, canon: str, k: int) -> int:
    """Pre-norm feed-forward (W -> ffn -> W) with Canon C (W channels) and D (ffn)."""
    places = {"C": W, "D": ffn}
    return _norm(W, bias) + _linear(W, ffn, bias) + _linear(ffn, W, bias) + \
        k * sum(places[p] for p in canon if p in places)


def lm_parameters(spec: dict, vocab: int, context: int) -> int:
    """Parameters of the ``TransformerLM`` of a complete ``[model.lm]`` spec over ``vocab``
    tokens (``context``: the learned position table's length)."""
    W, H, L, pos = spec["width"], spec["heads"], spec["layers"], spec["position"]
    ffn, bias, canon, k = spec["ffn"] or 4 * W, spec["bias"], spec["canon"], spec["canon_kernel"]
    S = spec["shifts"] if pos.startswith("shift") else 0
    block = _norm(W, bias) + _attention(W, H, S, bias, k if "B" in canon else 0) + \
        _feed_forward(W, ffn, bias, canon, k) + (k * W if "A" in canon else 0) + \
        (RELATIVE_BUCKETS * H if pos == "relative" else 0)
    embed = vocab * W * (1 if spec["tie_weights"] else 2)
    return embed + (context * W if pos == "learned" else 0) + L * block + _norm(W, bias)


def ffn_at_budget(spec: dict, budget: int, vocab: int, context: int) -> int:
    """The feed-forward width at which the ``TransformerLM`` of a complete ``[model.lm]`` spec
    (its ``ffn`` aside) has the parameter count closest to ``budget``: one unit of width costs
    2·width (+1 with biases) parameters per layer, plus canon_kernel with a Canon-D layer."""
    W = spec["width"]
    p0 = lm_parameters({**spec, "ffn": 4 * W}, vocab, context)
    unit = 2 * W + int(spec["bias"]) + (spec["canon_kernel"] if "D" in spec["canon"] else 0)
    return max(1, 4 * W + round((budget - p0) / (spec["layers"] * unit)))


def seq2seq_parameters(spec: dict, src_vocab: int, tgt_vocab: int, context: int) -> int:
    """Parameters of the model of a complete ``[model.seq2seq]`` spec for these vocabularies
    (``context``: a learned position table's length, per side)."""
    if spec["kind"] == "pervasive":
        return pervasive_parameters(spec, src_vocab, tgt_vocab)
    W, H, L, pos = spec["width"], spec["heads"], spec["layers"], spec["position"]
    ffn, canon, k = spec["ffn"] or 4 * W, spec["canon"], spec["canon_kernel"]
    shift = pos.startswith("shift")
    S_dec = spec["shifts"] if shift else 0
    S_enc = (spec["src_shifts"] or spec["shifts"]) if shift else 0
    canon_b, canon_a = (k if "B" in canon else 0), (k * W if "A" in canon else 0)
    ff = _feed_forward(W, ffn, True, canon, k)
    enc = _norm(W, True) + _attention(W, H, S_enc, True, canon_b) + ff + canon_a
    cross = _linear(W, W, True) + _linear(W, 2 * W, True) + _linear(W, W, True)
    dec = 2 * _norm(W, True) + _attention(W, H, S_dec, True, canon_b) + cross + ff + canon_a
    embed = (src_vocab + tgt_vocab) * W + (2 * context * W if pos == "learned" else 0)
    return embed + L * (enc + dec) + 2 * _norm(W, True)


def pervasive_parameters(spec: dict, src_vocab: int, tgt_vocab: int) -> int:
    """Parameters of the ``PervasiveAttention`` of a complete ``[model.seq2seq]`` spec: layer l
    reads C_l = 2·embed + l·growth channels (norm, 1 x 1 map to the bottleneck, norm, k x k
    convolution to ``growth``), summed in closed form over the layers."""
    E, L, G, kk = spec["embed"], spec["layers"], spec["growth"], spec["kernel"] ** 2
    bn = spec["bottleneck"] or 4 * G
    C_sum = L * 2 * E + G * L * (L - 1) // 2  # Σ_l C_l
    # per layer: 2·C_l (norm) + C_l·bn + bn (1 x 1) + 2·bn (norm) + kk·bn·G + G (conv, bias)
    layers = C_sum * (2 + bn) + L * (3 * bn + kk * bn * G + G)
    C = 2 * E + L * G
    width = 2 * E
    if spec["pooling"] == "attention":
        pool = spec["heads"] * C + spec["heads"] * C * width + width
    else:
        pool = _linear(C, width, True)
    return (src_vocab + tgt_vocab) * E + layers + _norm(C, True) + pool + \
        _linear(width, tgt_vocab, True)

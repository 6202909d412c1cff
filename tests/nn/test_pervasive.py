"""Pervasive attention (``sc.nn.PervasiveAttention``): the pooling basis against the library's
general attention path, the grid convolution against F.conv2d, causality along the target,
masking, cache = no cache, beam 1 = greedy, and a tiny overfit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import structconv as sc
from structconv.attention import GraphMasked, Masked, Softmax, attention_basis
from structconv.nn.decoding import beam_search, greedy, strip
from structconv.nn.pervasive import (
    AttentionPooling,
    DenseGridLayer,
    PervasiveAttention,
    SourcePooling,
)

F64 = torch.float64
POOLS = ["max", "attention"]


def _model(pooling="attention", seed=0, **kw):
    torch.manual_seed(seed)
    kw = {"heads": 2, **kw}
    m = PervasiveAttention(13, 11, 6, 3, 5, 3, bottleneck=7, pooling=pooling, **kw).double()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    return m.eval()


def _batch(seed=1, B=4, S=7, T=6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 13, (B, S), generator=g)
    src[1, 5:] = 0
    src[2, 2:] = 0
    tgt = torch.randint(3, 11, (B, T), generator=g)
    tgt[:, 0] = 1
    return src, tgt


# -- the pooling basis ---------------------------------------------------------------------------
def _row_graph(T, S):
    """Edges (i, j) -> i of the grid rows: every cell acts on its own target row only."""
    i, j = torch.meshgrid(torch.arange(T), torch.arange(S), indexing="ij")
    return torch.stack([(i * S + j).flatten(), i.flatten()])


@pytest.mark.parametrize("B,T,S,C,K", [(1, 1, 1, 1, 1), (2, 3, 5, 4, 2), (3, 4, 2, 3, 3)])
def test_attention_pooling_is_the_librarys_attention_basis(B, T, S, C, K):
    torch.manual_seed(T * S)
    pool = AttentionPooling(C, 5, heads=K).double()
    h = torch.randn(B, T, S, C, dtype=F64)
    pad = torch.zeros(B, S, dtype=torch.bool)
    if S > 1:
        pad[-1, -1] = True
    x1, x2 = h.reshape(B, T * S, C), torch.randn(B, T, C, dtype=F64)
    ours = pool.basis(h, pad).to_dense()
    ours = ours if ours.dim() == 4 else ours[None]
    # dense path: Softmax(Masked(Biaffine μ, row mask + padding)), the general attention basis
    allowed = torch.zeros(T * S, T, dtype=torch.bool)
    allowed[_row_graph(T, S)[0], _row_graph(T, S)[1]] = True
    mask = torch.zeros(B, 1, T * S, T, dtype=F64).masked_fill(~allowed, float("-inf"))
    mask = mask.masked_fill(pad.repeat(1, T)[:, None, :, None], float("-inf"))
    dense = attention_basis(Softmax(Masked(pool.mechanism, mask)), x1, x2).to_dense()
    torch.testing.assert_close(ours, dense if dense.dim() == 4 else dense[None],
                               rtol=1e-12, atol=1e-12)
    # graph path (per edge) without padding: the same weights
    if not bool(pad.any()):
        g = attention_basis(Softmax(GraphMasked(pool.mechanism, _row_graph(T, S))), x1, x2)
        gd = g.to_dense()
        torch.testing.assert_close(ours, gd if gd.dim() == 4 else gd[None], rtol=1e-12,
                                   atol=1e-12)
    # the layer is the convolution over that basis: y = Σ_k A_kᵀ x Θ_k + bias
    ref = torch.einsum("bkmn,bmp,kpq->bnq", ours, x1, pool.param()) + pool.bias
    torch.testing.assert_close(pool(h, pad), ref, rtol=1e-12, atol=1e-12)


def test_source_pooling_propagates_as_its_dense_matrices():
    torch.manual_seed(0)
    alpha = torch.softmax(torch.randn(2, 3, 4, 5, dtype=F64), -1)
    b = SourcePooling(alpha)
    assert (b.K, b.M, b.N, b.batch) == (3, 20, 4, 2)
    z = torch.randn(2, 20, 3, 6, dtype=F64)
    torch.testing.assert_close(b.propagate_heads(z),
                               torch.einsum("bkmn,bmkc->bnkc", b.to_dense(), z))
    with pytest.raises(ValueError, match=r"expects z \(B=2, M=20, K=3, C\)"):
        b.propagate_heads(torch.randn(2, 19, 3, 6, dtype=F64))


def test_grid_layer_is_a_causal_conv2d():
    torch.manual_seed(0)
    layer = DenseGridLayer(5, 4, 6, kernel=3).double()
    h = torch.randn(2, 6, 7, 5, dtype=F64)
    u = layer.conv_input(h, None).permute(0, 3, 1, 2)
    theta = layer.conv.param()  # (9, P, Q), k = row-major (target tap, source tap)
    W = theta.permute(2, 1, 0).reshape(4, 6, 3, 3)
    ref = F.conv2d(F.pad(u, (1, 1, 2, 0)), W, layer.conv.bias)  # (k-1, 0) on the target
    torch.testing.assert_close(layer(h), ref.permute(0, 2, 3, 1), rtol=1e-12, atol=1e-12)


# -- masking and causality -----------------------------------------------------------------------
@pytest.mark.parametrize("pooling", POOLS)
def test_logits_are_causal_along_the_target(pooling):
    m = _model(pooling)
    src, tgt = _batch(T=7)
    with torch.no_grad():
        ref = m(src, tgt)
        for t in range(1, 7):
            other = tgt.clone()
            other[:, t:] = torch.randint(3, 11, other[:, t:].shape)
            out = m(src, other)
            torch.testing.assert_close(out[:, :t], ref[:, :t], rtol=1e-12, atol=1e-12)
            assert float((out[:, t:] - ref[:, t:]).abs().max()) > 0


@pytest.mark.parametrize("pooling", POOLS)
def test_source_padding_is_masked(pooling):
    m = _model(pooling)
    src, tgt = _batch()
    logits = m(src, tgt)
    for b, n in ((1, 5), (2, 2)):
        torch.testing.assert_close(logits[b:b + 1], m(src[b:b + 1, :n], tgt[b:b + 1]),
                                   rtol=1e-10, atol=1e-10)
    src[3] = 0  # a fully padded source: finite, and its gradients too
    out = m(src, tgt)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


@pytest.mark.parametrize("pooling", POOLS)
def test_pooling_maps_are_distributions_over_the_unpadded_source(pooling):
    m = _model(pooling)
    src, tgt = _batch()
    w = m.pooling_maps(src, tgt)
    assert w.shape == (4, tgt.shape[1], src.shape[1])
    torch.testing.assert_close(w.sum(-1), torch.ones(4, tgt.shape[1], dtype=F64))
    assert float(w[2, :, 2:].abs().max()) == 0.0 and float(w[1, :, 5:].abs().max()) == 0.0


# -- decoding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("pooling", POOLS)
def test_decoding_with_the_cache_equals_without(pooling):
    m = _model(pooling)
    src, tgt = _batch()
    state = m.decoding_state(src)
    steps = torch.stack([state.step(tgt[:, t]) for t in range(tgt.shape[1])], 1)
    torch.testing.assert_close(steps, m(src, tgt), rtol=1e-10, atol=1e-10)
    for beam in (1, 3):
        assert torch.equal(m.generate(src, 9, beam=beam),
                           m.generate(src, 9, beam=beam, use_cache=False))


@pytest.mark.parametrize("pooling", POOLS)
def test_beam_width_one_is_greedy(pooling):
    m = _model(pooling)
    src, _ = _batch()
    g_tok, g_score = greedy(m.decoding_state(src), 4, 1, 2, 0, 10)
    b_tok, b_score = beam_search(m.decoding_state(src), 4, 1, 2, 0, 10, beam=1)
    assert torch.equal(g_tok, b_tok)
    torch.testing.assert_close(g_score, b_score, rtol=0, atol=0)


@pytest.mark.parametrize("pooling", POOLS)
def test_a_tiny_model_overfits_a_tiny_dictionary(pooling):
    g = torch.Generator().manual_seed(0)
    words = [torch.randint(1, 9, (int(n),), generator=g)
             for n in torch.randint(2, 6, (10,), generator=g)]
    prons = [torch.randint(3, 10, (int(n),), generator=g)
             for n in torch.randint(1, 5, (10,), generator=g)]
    src = nn.utils.rnn.pad_sequence(words, batch_first=True)
    tin = nn.utils.rnn.pad_sequence([torch.cat([torch.tensor([1]), p]) for p in prons], True)
    tout = nn.utils.rnn.pad_sequence([torch.cat([p, torch.tensor([2])]) for p in prons], True)
    torch.manual_seed(0)
    m = PervasiveAttention(9, 10, 16, 3, 8, 3, pooling=pooling)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    for _ in range(250):
        loss = F.cross_entropy(m(src, tin).flatten(0, 1), tout.flatten(), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert strip(m.generate(src, 8), 2, 0) == [p.tolist() for p in prons]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="pooling must be one of"):
        PervasiveAttention(5, 5, pooling="mean")
    with pytest.raises(ValueError, match="kernel must be an odd int"):
        PervasiveAttention(5, 5, kernel=2)
    with pytest.raises(ValueError, match="layers must be an int >= 1"):
        PervasiveAttention(5, 5, layers=0)
    with pytest.raises(ValueError, match="must be distinct target ids"):
        PervasiveAttention(5, 5, bos_id=0)
    m = PervasiveAttention(5, 6, 4, 1, 4)
    with pytest.raises(ValueError, match=r"src ids must be in 0..4, got \[9\]"):
        m(torch.tensor([[1, 9]]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="src has 1 rows, tgt 2"):
        m(torch.tensor([[1, 2]]), torch.tensor([[1], [1]]))
    with pytest.raises(ValueError, match="AttentionPooling expects h"):
        AttentionPooling(4, 3)(torch.randn(2, 3, 4))
    assert isinstance(sc.nn.PervasiveAttention(5, 5), PervasiveAttention)

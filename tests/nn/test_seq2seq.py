"""The encoder-decoder Transformer (``sc.nn.Seq2Seq``) and its attention convolutions: equal to
torch's layers, masking, causality along the target, cache = no cache, beam 1 = greedy, beam
search = exhaustive search where it can hold every hypothesis, and a tiny overfit."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import structconv as sc
from structconv.attention import shift_basis
from structconv.nn.decoding import beam_search, greedy, strip
from structconv.nn.seq2seq import SEQ2SEQ_POSITIONS as POSITIONS
from structconv.nn.seq2seq import (
    CentredCanon,
    CrossAttention,
    SelfAttention,
    Seq2Seq,
    SignedShift,
    encoder_shifts,
)

KINDS = [(p, c) for p in POSITIONS for c in ("", "ABCD")]
# torch's Transformer says it cannot use nested tensors with norm_first (irrelevant here)
pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
F64 = torch.float64


def _model(position="none", canon="", seed=0, **kw):
    torch.manual_seed(seed)
    kw = {"shifts": 3, "context": 32, "ffn": 24, **kw}
    m = Seq2Seq(13, 11, 16, 2, 2, position, canon=canon, **kw).double()
    with torch.no_grad():  # weights large enough that every term matters in the comparisons
        for p in m.parameters():
            p.normal_(0, 0.3)
    return m.eval()


def _batch(seed=1, B=4, S=7, T=6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 13, (B, S), generator=g)
    src[1, 5:] = 0
    src[2, 2:] = 0
    tgt = torch.randint(3, 11, (B, T), generator=g)
    tgt[:, 0] = 1
    return src, tgt


# -- equal to torch ------------------------------------------------------------------------------
@pytest.mark.parametrize("layers,heads,bias", [(1, 1, True), (2, 3, True), (3, 2, False)])
def test_stacks_equal_torch_transformer_values_and_gradients(layers, heads, bias):
    torch.manual_seed(layers)
    E, Fw, B, S, T = 6 * heads, 10, 3, 7, 5
    t = nn.Transformer(E, heads, layers, layers, Fw, dropout=0.0, activation="gelu",
                       batch_first=True, norm_first=True, bias=bias).double().eval()
    for p in t.parameters():
        nn.init.normal_(p, 0, 0.3)
    m = Seq2Seq(5, 5, E, layers, heads, "none", ffn=Fw, bias=bias).double().eval()
    m.load_torch_transformer(t)
    x = torch.randn(B, S, E, dtype=F64, requires_grad=True)
    y = torch.randn(B, T, E, dtype=F64, requires_grad=True)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, 4:] = True
    pad[2, 1:] = True
    mem_ref = t.encoder(x, src_key_padding_mask=pad)
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=F64)
    out_ref = t.decoder(y, mem_ref, tgt_mask=causal, tgt_is_causal=True,
                        memory_key_padding_mask=pad)
    mem = m.run_encoder(x, pad)
    out = m.run_decoder(y, mem, pad)
    ok = ~pad
    torch.testing.assert_close(mem[ok], mem_ref[ok], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(out)
    gx, gy = torch.autograd.grad((out * g).sum(), (x, y))
    gx_ref, gy_ref = torch.autograd.grad((out_ref * g).sum(), (x, y))
    torch.testing.assert_close(gx, gx_ref, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(gy, gy_ref, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("B,S,T,H", [(1, 1, 1, 1), (3, 5, 4, 2), (2, 9, 3, 3)])
def test_cross_attention_equals_torch_multihead_attention(B, S, T, H):
    torch.manual_seed(S)
    E = 4 * H
    mha = nn.MultiheadAttention(E, H, batch_first=True).double().eval()
    for p in mha.parameters():
        nn.init.normal_(p, 0, 0.4)
    ours = CrossAttention(E, H).double().eval()
    with torch.no_grad():
        ours.q_proj.weight.copy_(mha.in_proj_weight[:E])
        ours.q_proj.bias.copy_(mha.in_proj_bias[:E])
        ours.kv_proj.weight.copy_(mha.in_proj_weight[E:])
        ours.kv_proj.bias.copy_(mha.in_proj_bias[E:])
        ours.out_proj.load_state_dict(mha.out_proj.state_dict())
    y, mem = torch.randn(B, T, E, dtype=F64), torch.randn(B, S, E, dtype=F64)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, S // 2 + 1:] = True
    ref, w_ref = mha(y, mem, mem, key_padding_mask=pad, average_attn_weights=False)
    torch.testing.assert_close(ours(y, mem, pad), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.basis(y, mem, pad).weights(), w_ref, rtol=1e-12,
                               atol=1e-12)


def test_cross_attention_is_the_papers_convolution_with_the_source_as_main_input():
    # y = Σ_k A_kᵀ x Θ_k with x = the source (M entries), A_k computed from x' = x and
    # y' = the target states (N entries)
    torch.manual_seed(0)
    E, H, B, S, T = 8, 2, 2, 6, 4
    layer = CrossAttention(E, H, bias=False).double()
    x, y = torch.randn(B, S, E, dtype=F64), torch.randn(B, T, E, dtype=F64)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, 3:] = True
    basis = layer.basis(y, x, pad)
    assert (basis.K, basis.M, basis.N) == (H, S, T)
    A = basis.to_dense().detach()  # (B, K, M, N)
    torch.testing.assert_close(A.sum(2), torch.ones(B, H, T, dtype=F64))
    assert float(A[1, :, 3:].abs().max()) == 0.0  # padded source entries act on nothing
    th = layer.value_out()()
    ref = torch.einsum("bkmn,bmp,kpq->bnq", A, x, th)
    torch.testing.assert_close(layer(y, x, pad), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sc.convolve(x, basis, layer.value_out()), ref, rtol=1e-12,
                               atol=1e-12)


def test_encoder_self_attention_with_shift_heads_is_one_structured_convolution():
    torch.manual_seed(0)
    E, H, L = 12, 3, 7
    layer = SelfAttention(E, H, shifts=[-2, 0, 1], bias=False).double()
    x = torch.randn(2, L, E, dtype=F64)
    pad = torch.zeros(2, L, dtype=torch.bool)
    pad[1, 5:] = True
    basis = layer.basis(x, pad)
    assert isinstance(basis, sc.basis.Stack) and basis.K == H + 3
    th = layer.value_out()()
    w = basis.parts[0].weights()  # (B, H, N, M)
    xz = x.masked_fill(pad[..., None], 0.0)  # the shift heads read padding as zeros
    ref = torch.einsum("bhnm,bmp,hpq->bnq", w, x, th[:H])
    ref = ref + torch.einsum("kmn,bmp,kpq->bnq", basis.parts[1].to_dense().double(), xz, th[H:])
    torch.testing.assert_close(layer(x, pad), ref, rtol=1e-12, atol=1e-12)
    assert float(w[1, :, :, 5:].detach().abs().max()) == 0.0


def test_encoder_self_attention_without_padding_equals_torch():
    torch.manual_seed(3)
    E, H = 9, 3
    mha = nn.MultiheadAttention(E, H, batch_first=True).double()
    ours = SelfAttention(E, H).double()
    with torch.no_grad():
        ours.in_proj.weight.copy_(mha.in_proj_weight)
        ours.in_proj.bias.copy_(mha.in_proj_bias)
        ours.out_proj.load_state_dict(mha.out_proj.state_dict())
    x = torch.randn(2, 5, E, dtype=F64)
    torch.testing.assert_close(ours(x), mha(x, x, x)[0], rtol=1e-12, atol=1e-12)


def test_encoder_alibi_is_the_symmetric_formula():
    torch.manual_seed(0)
    E, H, L = 8, 2, 6
    layer = SelfAttention(E, H, alibi=True, bias=False).double()
    x = torch.randn(1, L, E, dtype=F64)
    q, k, _ = layer.in_proj(x).split(E, -1)
    q, k = (t.reshape(1, L, H, E // H).transpose(1, 2) for t in (q, k))
    slopes = sc.attention.positions.alibi_slopes(H).to(F64)
    i = torch.arange(L)
    bias = -slopes[:, None, None] * (i[:, None] - i[None, :]).abs()
    ref = torch.softmax(q @ k.transpose(-1, -2) / (E // H) ** 0.5 + bias, -1)
    torch.testing.assert_close(layer.basis(x).weights(), ref, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(L=st.integers(1, 9), shifts=st.lists(st.integers(-10, 10), min_size=1, max_size=4),
       C=st.integers(1, 3))
def test_signed_shifts_equal_their_shift_matrices(L, shifts, C):
    b = SignedShift(L, shifts)
    ref = shift_basis(L, shifts).to_dense()
    torch.testing.assert_close(b.to_dense(), ref)
    z = torch.randn(2, L, len(shifts), C, dtype=F64)
    torch.testing.assert_close(b.propagate_heads(z),
                               torch.einsum("kmn,bmkc->bnkc", ref.double(), z))


def test_encoder_shift_offsets_are_centred():
    assert encoder_shifts(3) == [-1, 0, 1] and encoder_shifts(4) == [-2, -1, 0, 1]
    assert encoder_shifts([2, -3]) == [2, -3] and encoder_shifts(0) == []
    with pytest.raises(ValueError, match="shifts must be >= 0"):
        encoder_shifts(-1)


@pytest.mark.parametrize("kernel", [1, 2, 3, 4, 5])
def test_centred_canon_is_h_plus_a_centred_depthwise_conv1d(kernel):
    torch.manual_seed(kernel)
    C, L = 5, 7
    layer = CentredCanon(C, kernel).double()
    with torch.no_grad():
        layer.param.weight.normal_()
    h = torch.randn(3, L, C, dtype=F64)
    w = layer.param.weight.t()[:, None, :]  # (C, 1, kernel): tap t reads offset t - (k-1)//2
    before, after = (kernel - 1) // 2, kernel // 2
    ref = h + F.conv1d(F.pad(h.transpose(1, 2), (before, after)), w, groups=C).transpose(1, 2)
    torch.testing.assert_close(layer(h), ref, rtol=1e-12, atol=1e-12)
    pad = torch.zeros(3, L, dtype=torch.bool)
    pad[0, 4:] = True
    alone = layer(h[:1, :4])
    torch.testing.assert_close(layer(h, pad)[0, :4], alone[0], rtol=1e-12, atol=1e-12)


# -- masking and causality -----------------------------------------------------------------------
@pytest.mark.parametrize("position,canon", KINDS)
def test_padding_is_masked_an_item_gives_what_it_would_alone(position, canon):
    m = _model(position, canon)
    src, tgt = _batch()
    logits = m(src, tgt)
    for b, n in ((1, 5), (2, 2)):
        alone = m(src[b:b + 1, :n], tgt[b:b + 1])
        torch.testing.assert_close(logits[b:b + 1], alone, rtol=1e-10, atol=1e-10)
    # target padding after the sequence changes nothing before it
    longer = torch.cat([tgt, torch.zeros(4, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(m(src, longer)[:, :tgt.shape[1]], logits, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("position,canon", [("none", ""), ("shift", "ABCD"), ("alibi", "B")])
def test_a_fully_padded_source_stays_finite(position, canon):
    m = _model(position, canon)
    src, tgt = _batch()
    src[3] = 0
    logits = m(src, tgt)
    assert torch.isfinite(logits).all()
    maps = m.cross_attention_maps(src, tgt)
    assert all(float(w[3].abs().max()) == 0.0 for w in maps)
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    assert m.generate(src, 6).shape[0] == 4


@pytest.mark.parametrize("position,canon", KINDS)
def test_logits_are_causal_along_the_target(position, canon):
    m = _model(position, canon)
    src, tgt = _batch(T=7)
    ref = m(src, tgt)
    for t in range(1, 7):
        other = tgt.clone()
        other[:, t:] = torch.randint(3, 11, other[:, t:].shape)
        torch.testing.assert_close(m(src, other)[:, :t], ref[:, :t], rtol=1e-12, atol=1e-12)
    # and every target position reads the source
    src2 = src.clone()
    src2[0, 0] = (src2[0, 0] % 12) + 1
    assert float((m(src2, tgt)[0] - ref[0]).abs().amin(-1).max()) > 0


def test_cross_attention_maps_are_distributions_over_the_unpadded_source():
    m = _model("sinusoidal")
    src, tgt = _batch()
    maps = m.cross_attention_maps(src, tgt)
    assert len(maps) == 2 and maps[0].shape == (4, 2, tgt.shape[1], src.shape[1])
    for w in maps:
        torch.testing.assert_close(w.sum(-1), torch.ones(4, 2, tgt.shape[1], dtype=F64))
        assert float(w[2, :, :, 2:].abs().max()) == 0.0
    assert m.training is False


# -- decoding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("position,canon", KINDS)
def test_decoding_with_the_cache_equals_without(position, canon):
    m = _model(position, canon)
    src, tgt = _batch()
    # teacher-forced: step-by-step logits with the cache are the full forward's
    state = m.decoding_state(src)
    steps = torch.stack([state.step(tgt[:, t]) for t in range(tgt.shape[1])], 1)
    torch.testing.assert_close(steps, m(src, tgt), rtol=1e-10, atol=1e-10)
    for beam in (1, 3):
        a = m.generate(src, 9, beam=beam)
        b = m.generate(src, 9, beam=beam, use_cache=False)
        assert torch.equal(a, b)


@pytest.mark.parametrize("position", ["none", "shift", "rotary"])
def test_beam_width_one_is_greedy(position):
    m = _model(position)
    src, _ = _batch()
    g_tok, g_score = greedy(m.decoding_state(src), 4, 1, 2, 0, 10)
    b_tok, b_score = beam_search(m.decoding_state(src), 4, 1, 2, 0, 10, beam=1)
    assert torch.equal(g_tok, b_tok)
    torch.testing.assert_close(g_score, b_score, rtol=0, atol=0)
    assert torch.equal(m.generate(src, 10), g_tok)


def _sequence_logprob(m, src, seq):
    tgt = torch.tensor([[1, *seq[:-1]]])
    logits = m(src, tgt).double()
    logits[..., [0, 1]] = float("-inf")  # the searches never emit padding or the start
    logp = torch.log_softmax(logits, -1)[0]
    return float(logp[torch.arange(len(seq)), torch.tensor(seq)].sum())


def test_a_beam_that_holds_every_hypothesis_finds_the_most_probable_sequence():
    torch.manual_seed(0)
    m = Seq2Seq(6, 5, 8, 1, 2, "sinusoidal").double().eval()  # target tokens 3, 4 and </s>
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 1.0)
    L = 4
    for row in range(3):
        src = torch.randint(1, 6, (1, 5), generator=torch.Generator().manual_seed(row))
        cands = [list(p) + [2] for n in range(L) for p in itertools.product([3, 4], repeat=n)]
        cands += [list(p) for p in itertools.product([3, 4], repeat=L)]  # cut at max_len
        best = max(cands, key=lambda s: _sequence_logprob(m, src, s))
        tok, score = beam_search(m.decoding_state(src), 1, 1, 2, 0, L, beam=3 ** L)
        assert strip(tok, 2, 0)[0] == [t for t in best if t != 2]
        assert score.item() == pytest.approx(_sequence_logprob(m, src, best), abs=1e-9)


def test_decoded_rows_end_at_eos_then_padding():
    m = _model("shift")
    src, _ = _batch()
    for beam in (1, 2):
        out = m.generate(src, 8, beam=beam)
        for row in out.tolist():
            if 2 in row:
                i = row.index(2)
                assert all(t == 0 for t in row[i + 1:]) and 0 not in row[:i] and 1 not in row


# -- training ------------------------------------------------------------------------------------
def test_a_tiny_model_overfits_a_tiny_dictionary():
    # 12 "words" of 2-5 letters, each with a made-up 1-5 phoneme pronunciation
    g = torch.Generator().manual_seed(0)
    words = [torch.randint(1, 9, (int(n),), generator=g)
             for n in torch.randint(2, 6, (12,), generator=g)]
    prons = [torch.randint(3, 10, (int(n),), generator=g)
             for n in torch.randint(1, 6, (12,), generator=g)]
    src = nn.utils.rnn.pad_sequence(words, batch_first=True)
    tin = nn.utils.rnn.pad_sequence([torch.cat([torch.tensor([1]), p]) for p in prons], True)
    tout = nn.utils.rnn.pad_sequence([torch.cat([p, torch.tensor([2])]) for p in prons], True)
    torch.manual_seed(0)
    m = Seq2Seq(9, 10, 32, 1, 2, "shift", shifts=3)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    for _ in range(300):
        loss = F.cross_entropy(m(src, tin).flatten(0, 1), tout.flatten(), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert strip(m.generate(src, 8), 2, 0) == [p.tolist() for p in prons]
    assert strip(m.generate(src, 8, beam=3), 2, 0) == [p.tolist() for p in prons]


# -- errors --------------------------------------------------------------------------------------
def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown position 'relative'"):
        Seq2Seq(5, 5, 8, 1, 2, "relative")
    with pytest.raises(ValueError, match="width=10 must be a multiple of heads=4"):
        Seq2Seq(5, 5, 10, 1, 4)
    with pytest.raises(ValueError, match="needs context"):
        Seq2Seq(5, 5, 8, 1, 2, "learned")
    with pytest.raises(ValueError, match="must differ"):
        Seq2Seq(5, 5, 8, 1, 2, pad_id=0, bos_id=0)
    with pytest.raises(ValueError, match="needs at least one shift head"):
        Seq2Seq(5, 5, 8, 1, 2, "shift", shifts=0)
    with pytest.raises(ValueError, match="unknown Canon place"):
        Seq2Seq(5, 5, 8, 1, 2, canon="AQ")
    m = Seq2Seq(5, 6, 8, 1, 2, "learned", context=4)
    with pytest.raises(ValueError, match=r"src ids must be in 0..4, got \[7\]"):
        m(torch.tensor([[1, 7]]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="integer token ids"):
        m(torch.ones(1, 2), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="source has 1 rows but tgt has 2"):
        m(torch.tensor([[1, 2]]), torch.tensor([[1], [1]]))
    with pytest.raises(ValueError, match="exceeds the learned context 4"):
        m(torch.tensor([[1, 2]]), torch.ones(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len must be an int >= 1"):
        m.generate(torch.tensor([[1, 2]]), 0)
    with pytest.raises(ValueError, match="beam must be an int >= 1"):
        m.generate(torch.tensor([[1, 2]]), 3, beam=0)
    with pytest.raises(ValueError, match="no torch counterpart"):
        Seq2Seq(5, 5, 8, 1, 2, "shift").load_torch_transformer(
            nn.Transformer(8, 2, 1, 1, 32, batch_first=True, norm_first=True))
    with pytest.raises(ValueError, match=r"pad must be a \(B, L\)=\(1, 3\) bool"):
        CrossAttention(8, 2)(torch.randn(1, 2, 8), torch.randn(1, 3, 8), torch.zeros(1, 3))

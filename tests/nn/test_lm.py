"""sc.nn.TransformerLM and its parts: causality, any length, ALiBi, shift heads, parameter
counts, generation with a cache, configs, and the lm bench / shift-heads recipe at tiny sizes."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv.attention.basis import CausalShift, shift_basis
from structconv.attention.index import RelativeBias
from structconv.attention.positions import (
    alibi_mask,
    alibi_slopes,
    causal_shift,
    gather_shifts,
    rotary,
)
from structconv.nn.lm import (
    POSITIONS,
    RELATIVE_BUCKETS,
    CausalSelfAttention,
    TransformerLM,
    equalised_ffn,
)

V = 13


def randomise_relative(model: torch.nn.Module, scale: float = 0.5, seed: int = 5) -> None:
    """Give every relative-bias table random entries (they start at zero, where a "relative"
    model is the "none" model and a test of the bias could not fail)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, RelativeBias):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * scale)


def _model(kind, dtype=torch.float64, **kw):
    torch.manual_seed(0)
    kw.setdefault("context", 16)
    m = TransformerLM(V, 16, 2, 2, kind, shifts=3, **kw).to(dtype).eval()
    randomise_relative(m)
    return m


@pytest.mark.parametrize("kind", POSITIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_for_every_kind_exactly(kind, dtype):
    m = _model(kind, dtype)
    ids = torch.randint(0, V, (3, 16))
    y = m(ids)
    for j in (0, 5, 15):
        ids2 = ids.clone()
        ids2[:, j] = (ids2[:, j] + 1) % V
        y2 = m(ids2)
        assert torch.equal(y[:, :j], y2[:, :j]), f"{kind}: a change at {j} leaked backwards"
        assert not torch.equal(y[:, j], y2[:, j])


@pytest.mark.parametrize("kind", [k for k in POSITIONS if k != "learned"])
def test_any_length(kind):
    m = _model(kind, torch.float32)  # "trained" at 16
    y = m(torch.randint(0, V, (2, 256)))
    assert y.shape == (2, 256, V) and torch.isfinite(y).all()


def test_learned_raises_beyond_its_context():
    m = _model("learned")
    m(torch.randint(0, V, (1, 16)))
    with pytest.raises(ValueError, match="exceeds the learned context 16"):
        m(torch.randint(0, V, (1, 17)))
    with pytest.raises(ValueError, match="needs context"):
        TransformerLM(V, 16, 1, 2, "learned")


def test_alibi_slopes_are_press_et_al():
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)],
                                                     dtype=torch.float64))
    assert torch.equal(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (i + 1)) for i in range(4)],
                                                     dtype=torch.float64))
    # not a power of two: the 4-head slopes, then every other slope of 8 heads
    want = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    assert alibi_slopes(6).tolist() == want


def test_alibi_mask_equals_its_formula():
    m = alibi_slopes(3)
    got = alibi_mask(m, 5, 9, 4, dtype=torch.float64)  # 5 queries after 4 cached keys
    for h in range(3):
        for i in range(5):
            for j in range(9):
                want = -m[h] * (i + 4 - j) if j <= i + 4 else -math.inf
                assert got[h, i, j] == want


def test_alibi_layer_equals_the_dense_formula():
    torch.manual_seed(1)
    E, H, L = 12, 3, 7
    layer = CausalSelfAttention(E, H, alibi=True, bias=False).double()
    x = torch.randn(2, L, E, dtype=torch.float64)
    D = E // H
    q, k, v = layer.in_proj(x).split(E, -1)
    q, k, v = (t.reshape(2, L, H, D).transpose(1, 2) for t in (q, k, v))
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    s = q @ k.transpose(-1, -2) / math.sqrt(D) - alibi_slopes(H)[:, None, None] * (i - j)
    s = s.masked_fill(j > i, -math.inf)
    want = layer.out_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(2, L, E))
    torch.testing.assert_close(layer(x), want, rtol=1e-12, atol=1e-12)


def _relative_dense(layer, x, start=0):
    """CausalSelfAttention(relative=True) by its definition: scores q·k/√D plus the learned
    bias of the bucket of i − j (T5's, checked in test_attention_algebra), causal softmax."""
    B, L, E = x.shape
    H = layer.H
    D = E // H
    q, k, v = layer.in_proj(x).split(E, -1)
    q, k, v = (t.reshape(B, L, H, D).transpose(1, 2) for t in (q, k, v))
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    bias = layer.rel_bias.weight[layer.rel_bias.bucket(i - j)].permute(2, 0, 1)  # (H, L, L)
    s = (q @ k.transpose(-1, -2) / math.sqrt(D) + bias).masked_fill(j > i, -math.inf)
    return layer.out_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, E))


@pytest.mark.parametrize("L", [7, 40, 300])  # exact buckets only; log buckets; beyond 128
def test_relative_layer_equals_the_dense_formula_values_and_gradients(L):
    torch.manual_seed(2)
    E, H = 12, 3
    layer = CausalSelfAttention(E, H, relative=True, bias=False).double()
    randomise_relative(layer)
    x = torch.randn(2, L, E, dtype=torch.float64)
    y, want = layer(x), _relative_dense(layer, x)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(y)
    w = layer.rel_bias.weight
    (gw,) = torch.autograd.grad(y, w, g)
    (rw,) = torch.autograd.grad(_relative_dense(layer, x), w, g)
    torch.testing.assert_close(gw, rw, rtol=1e-12, atol=1e-12)
    # only the buckets of offsets 0..L-1 get a gradient (later keys are masked)
    used = layer.rel_bias.bucket(torch.arange(L)).unique()
    assert gw[used].abs().amin(1).gt(0).all()
    assert torch.equal(gw[[b for b in range(RELATIVE_BUCKETS) if b not in used.tolist()]],
                       torch.zeros(RELATIVE_BUCKETS - used.numel(), H, dtype=torch.float64))


def test_relative_at_zero_is_the_none_model_and_its_bias_counts():
    torch.manual_seed(0)
    none = TransformerLM(V, 16, 2, 2, "none").double().eval()
    torch.manual_seed(0)
    rel = TransformerLM(V, 16, 2, 2, "relative").double().eval()
    ids = torch.randint(0, V, (2, 30))
    # the bias starts at zero: the same weights, the same function (a mask of zeros and -inf
    # against SDPA's causal flag)
    torch.testing.assert_close(rel(ids), none(ids), rtol=1e-12, atol=1e-12)
    randomise_relative(rel)
    assert not torch.allclose(rel(ids), none(ids))
    assert rel.blocks[0].attn.rel_bias.weight.shape == (RELATIVE_BUCKETS, 2)


def test_relative_and_alibi_are_exclusive():
    with pytest.raises(ValueError, match="alibi or relative, not both"):
        CausalSelfAttention(8, 2, alibi=True, relative=True)


def test_rotary_scores_depend_only_on_the_offset():
    q = torch.randn(1, 1, 1, 6, dtype=torch.float64).expand(1, 1, 9, 6)
    k = torch.randn(1, 1, 1, 6, dtype=torch.float64).expand(1, 1, 9, 6)
    s = rotary(q) @ rotary(k).transpose(-1, -2)
    d = torch.diagonal(s[0, 0], 2)
    torch.testing.assert_close(d, d[:1].expand(7))
    torch.testing.assert_close(rotary(q, 5)[..., :4, :], rotary(q)[..., 5:, :])


@settings(max_examples=60, deadline=None)
@given(L=st.integers(1, 9), shifts=st.lists(st.integers(0, 5), min_size=1, max_size=4),
       past=st.booleans(), extra=st.integers(0, 2), C=st.integers(1, 3))
def test_shift_heads_equal_their_dense_shift_matrices(L, shifts, past, extra, C):
    R = max(shifts) + extra if past and max(shifts) + extra else 0
    basis = CausalShift(L, shifts, past=R)
    z = torch.randn(2, R + L, len(shifts), C, dtype=torch.float64, requires_grad=True)
    A = basis.to_dense().double()  # (S, M, N): A_s[m, n] = 1 iff m = n + R - s
    want = torch.einsum("kmn,bmkc->bnkc", A, z)
    got = basis.propagate_heads(z)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the gather's backward is the adjoint: gradient = A g
    g = torch.randn_like(got)
    (gz,) = torch.autograd.grad(got, z, g)
    torch.testing.assert_close(gz, torch.einsum("kmn,bnkc->bmkc", A, g), rtol=0, atol=0)
    if R:  # the cache form: the last R entries before the outputs
        torch.testing.assert_close(causal_shift(z[:, R:], shifts, past=z[:, :R]), want)
    else:  # the same matrices as shift_basis (the Sparse definition)
        torch.testing.assert_close(A, shift_basis(L, shifts, dtype=torch.float64).to_dense())
        torch.testing.assert_close(causal_shift(z, shifts), want)


def test_gather_shifts_refuses_shifts_it_cannot_give():
    ext = torch.randn(2, 7, 3, 4)
    assert gather_shifts(ext, [0, 2, 2], 5).shape == (2, 5, 3, 4)
    for shifts, length in (([0, 3, 1], 5), ([0, 1], 5), ([0, -1, 1], 5)):
        with pytest.raises(ValueError, match=r"gather_shifts: ext \(2, 7, 3, 4\)"):
            gather_shifts(ext, shifts, length)


def test_attention_with_shift_heads_is_one_structured_convolution():
    torch.manual_seed(2)
    E, H, L = 12, 3, 6
    layer = CausalSelfAttention(E, H, shifts=[0, 1, 3], bias=False).double()
    x = torch.randn(2, L, E, dtype=torch.float64)
    basis = layer.basis(x)
    assert isinstance(basis, sc.basis.Stack) and basis.K == H + 3
    y = sc.convolve(x, basis, layer.value_out())
    torch.testing.assert_close(layer(x), y, rtol=1e-12, atol=1e-12)
    # and the dense definition: attention heads' weights, then the shift matrices
    th = layer.value_out()()  # (K, E, E)
    w = basis.parts[0].weights()  # (B, H, N, M)
    ref = torch.einsum("bhnm,bmp,hpq->bnq", w, x, th[:H])
    ref = ref + torch.einsum("kmn,bmp,kpq->bnq", basis.parts[1].to_dense().double(), x, th[H:])
    torch.testing.assert_close(layer(x), ref, rtol=1e-12, atol=1e-12)


def _expected_params(V, E, n, H, ffn, S, learned_ctx=0, buckets=0):
    D = E // H
    attn = E * (3 * H + S) * D + (3 * H + S) * D + (H + S) * D * E + E + buckets * H
    mlp = E * ffn + ffn + ffn * E + E
    return V * E + learned_ctx * E + n * (attn + mlp + 4 * E) + 2 * E


@pytest.mark.parametrize("kind", POSITIONS)
def test_parameter_counts(kind):
    m = TransformerLM(65, 128, 4, 4, kind, shifts=4, context=64)
    S = 4 if kind.startswith("shift") else 0
    n = sum(p.numel() for p in m.parameters())
    buckets = RELATIVE_BUCKETS if kind == "relative" else 0  # a bias per head and bucket
    assert n == _expected_params(65, 128, 4, 4, 512, S, 64 if kind == "learned" else 0,
                                 buckets)
    budget = _expected_params(65, 128, 4, 4, 512, 0)
    ffn = equalised_ffn(65, 128, 4, 4, kind, 4, budget, 64)
    n = sum(p.numel() for p in TransformerLM(65, 128, 4, 4, kind, 4, ffn, context=64)
            .parameters())
    assert abs(n - budget) <= 4 * (2 * 128 + 1) // 2 + 1
    if kind == "shift":
        assert ffn == 384  # S·D = 128 units of feed-forward width pay for the shift heads
    if kind == "relative":
        # 4 layers x 32 buckets x 4 heads = 512 parameters, under half a unit of width
        # (4 x 257): the closest count keeps 512
        assert ffn == 512


@pytest.mark.parametrize("kind", POSITIONS)
def test_generation_with_a_cache_equals_without(kind):
    m = _model(kind, context=12)
    prompt = torch.randint(0, V, (2, 5))
    a = m.generate(prompt, 14, temperature=0)  # learned: runs past its context (crops)
    b = m.generate(prompt, 14, temperature=0, use_cache=False)
    assert torch.equal(a, b)
    # step by step through the cache, the logits equal the full forward's
    seq = a[:, :12]
    cache = m.new_cache()
    steps = [m(seq[:, :4], cache)] + [m(seq[:, t:t + 1], cache) for t in range(4, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), m(seq), rtol=1e-10, atol=1e-10)
    g = torch.Generator().manual_seed(3)
    s1 = m.generate(prompt, 6, top_k=5, generator=g)
    g = torch.Generator().manual_seed(3)
    s2 = m.generate(prompt, 6, top_k=5, generator=g, use_cache=False)
    assert torch.equal(s1, s2)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="unknown position 't5'"):
        TransformerLM(V, 16, 1, 2, "t5")
    with pytest.raises(ValueError, match="heads must be an int >= 1"):
        TransformerLM(V, 16, 1, 0)
    with pytest.raises(ValueError, match="needs at least one shift"):
        TransformerLM(V, 16, 1, 2, "shift", shifts=0)
    with pytest.raises(ValueError, match="multiple of heads"):
        CausalSelfAttention(10, 3)
    with pytest.raises(ValueError, match="integer token ids"):
        _model("none")(torch.randn(2, 3))
    with pytest.raises(ValueError, match=">= 0"):
        CausalShift(4, [-1])


def test_out_of_range_tokens_name_the_values_and_the_vocabulary():
    m = _model("shift")
    for bad, vals in ((torch.tensor([[1, V, 2]]), f"[{V}]"),
                      (torch.tensor([[-1, 3, -7]]), "[-7, -1]"),
                      (torch.tensor([[0, 200, -3, 40, 40]]), "[-3, 40, 200]")):
        with pytest.raises(ValueError, match=rf"0\.\.{V - 1} \(vocab_size {V}\), got "
                                             + vals.replace("[", r"\[").replace("]", r"\]")):
            m(bad)
    with pytest.raises(ValueError, match="vocab_size 13"):
        m.generate(torch.tensor([[V + 1]]), 2)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_any_integer_token_dtype_gives_the_long_models_logits(dtype):
    m = _model("rotary")
    ids = torch.randint(0, V, (2, 7))
    torch.testing.assert_close(m(ids.to(dtype)), m(ids), rtol=0, atol=0)
    out = m.generate(ids.to(dtype), 3, temperature=0)
    assert out.dtype == torch.int64 and torch.equal(out, m.generate(ids, 3, temperature=0))


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.float64, torch.complex64])
def test_bool_float_and_complex_tokens_are_refused_clearly(dtype):
    m = _model("none")
    with pytest.raises(ValueError, match=f"integer token ids.*got dtype {dtype}"):
        m(torch.ones(2, 3, dtype=dtype))


def test_empty_sequences_are_refused_with_the_shape():
    m = _model("shift")
    with pytest.raises(ValueError, match=r"at least one token per sequence, got ids of shape "
                                         r"\(3, 0\)"):
        m(torch.zeros(3, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(1, 0\)"):
        m.generate(torch.zeros(1, 0, dtype=torch.long), 4)
    with pytest.raises(ValueError, match=r"integer token ids \(B, L\), got shape \(5,\)"):
        m(torch.zeros(5, dtype=torch.long))
    assert m(torch.zeros(0, 4, dtype=torch.long)).shape == (0, 4, V)  # an empty batch is fine


def test_generate_validates_sampling_arguments():
    m = _model("none")
    p = torch.randint(0, V, (1, 3))
    for kw, msg in ((dict(top_k=0), "top_k must be None or an int >= 1, got 0"),
                    (dict(top_k=-2), "top_k must be None or an int >= 1, got -2"),
                    (dict(top_k=True), "top_k must be None or an int >= 1, got True"),
                    (dict(top_k=2.5), "top_k must be None or an int >= 1, got 2.5"),
                    (dict(temperature=-1), "temperature must be a finite number >= 0"),
                    (dict(temperature=float("nan")), "got nan"),
                    (dict(temperature=float("inf")), "got inf")):
        with pytest.raises(ValueError, match=msg):
            m.generate(p, 2, **kw)
    for steps in (-1, 1.5, True):
        with pytest.raises(ValueError, match="steps must be an int >= 0"):
            m.generate(p, steps)
    # the edges that are valid: top_k = 1 is greedy, top_k above the vocabulary keeps all
    g = torch.Generator().manual_seed(0)
    assert torch.equal(m.generate(p, 4, top_k=1, generator=g), m.generate(p, 4, temperature=0))
    assert m.generate(p, 4, top_k=10 * V, generator=g).shape == (1, 7)


def test_config_builds_a_transformer_lm(tmp_path):
    from structconv.config import ConfigError, load_config
    from structconv.data.text import encode_text
    from structconv.models import build_model

    data = encode_text("t", "the quick brown fox jumps over the lazy dog " * 20)
    data.task = "text"
    cfg = load_config("transformer_python", ["model.lm.position=alibi", "model.lm.layers=1"])
    m = build_model(cfg, data)
    assert isinstance(m, TransformerLM) and m.position == "alibi" and len(m.blocks) == 1
    m = build_model(load_config("transformer_python", ["model.lm.position=relative"]), data)
    assert m.position == "relative" and m.blocks[0].attn.rel_bias is not None
    for bad, msg in (("model.lm.position=t5", "model.lm.position must be one of"),
                     ("model.lm.width=10", "divisible by heads"),
                     ("model.lm.depth=3", "unknown key 'depth'"),
                     ("model.lm.dropout=1.5", "dropout must be in")):
        with pytest.raises(ConfigError, match=msg):
            load_config("transformer_python", [bad])


def test_lm_bench_and_shift_heads_recipe_run(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "structconv.cli", "bench", "lm", "--quick",
                        "--repeats", "1", "--kinds", "shift,alibi,none+Canon-ABCD",
                        "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "lm.json").read_text())
    case = res["cases"][0]
    assert case["params"]["plain"] == case["params"]["learned"]
    assert {"learned_over_plain", "shift_over_none", "alibi_over_none",
            "none+Canon-ABCD_over_none"} <= set(case["ratios"])
    # equal parameters: every equalised kind within half a feed-forward unit of none's
    unit = case["layers"] * (2 * case["width"] + 1 + case["canon_kernel"])
    for k in ("shift", "alibi", "none+Canon-ABCD"):
        assert abs(case["params"][k] - case["params"]["none"]) <= unit // 2 + 1
    assert set(case["generation_tokens_per_s"]) == {"none", "learned", "shift", "alibi",
                                                    "none+Canon-ABCD"}
    assert all(v > 0 for v in case["generation_tokens_per_s"].values())
    bad = subprocess.run([sys.executable, "-m", "structconv.cli", "bench", "lm", "--quick",
                          "--kinds", "none+Canon-X", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "unknown Canon place" in bad.stderr

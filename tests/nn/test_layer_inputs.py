"""The sc.nn layers outside the graph layers refuse bad input by name before computing.

Integer features where floats are needed, features of the wrong width, masks and paddings of
the wrong shape, sizes that are not positive ints: each is a ``ValueError`` / ``TypeError``
naming the argument, the expected and the given, never a raw torch error (``mat1 and mat2``,
"negative dimension") or a silently wrong answer.
"""

import pytest
import torch

import structconv as sc

S = torch.randn(2, 10, 16)
IMG = torch.randn(2, 3, 7, 9)
SRC, TGT = torch.randint(3, 11, (2, 7)), torch.randint(3, 13, (2, 6))


def _mha():
    return sc.nn.MultiheadAttention(16, 4, batch_first=True)


def _s2s(**kw):
    return sc.nn.Seq2Seq(11, 13, width=16, layers=1, heads=2, **kw)


def _perv(**kw):
    return sc.nn.PervasiveAttention(11, 13, embed=4, layers=1, growth=4, **kw)


CASES = [
    ("MultiheadAttention: integer features", lambda: _mha()(S.long(), S.long(), S.long()),
     TypeError, "MultiheadAttention: query must be a floating tensor.*int64"),
    ("MultiheadAttention: inputs of two dtypes", lambda: _mha()(S, S.double(), S.double()),
     TypeError, "inputs must share a dtype, got query torch.float32, key torch.float64"),
    ("MultiheadAttention: a dropout above 1", lambda: sc.nn.MultiheadAttention(
        16, 4, dropout=1.5), ValueError, r"dropout must be a probability in \[0, 1\], got 1.5"),
    ("MultiheadAttention: a fractional width", lambda: sc.nn.MultiheadAttention(16.0, 4),
     ValueError, "embed_dim must be an int >= 1, got 16.0"),
    ("TransformerEncoderLayer: integer features", lambda: sc.nn.TransformerEncoderLayer(
        16, 4, 32, batch_first=True)(S.long()), TypeError,
     "TransformerEncoderLayer: src must be a floating tensor"),
    ("TransformerEncoderLayer: a negative feed-forward width", lambda:
     sc.nn.TransformerEncoderLayer(16, 4, -3), ValueError,
     "dim_feedforward must be an int >= 1, got -3"),
    ("TransformerDecoderLayer: integer memory", lambda: sc.nn.TransformerDecoderLayer(
        16, 4, 32, batch_first=True)(S, S.long()), TypeError,
     "TransformerDecoderLayer: memory must be a floating tensor"),
    ("MixedAttention: integer features", lambda: sc.nn.MixedAttention(16, 4)(S.long()),
     TypeError, "MixedAttention: query must be a floating tensor"),
    ("MixedAttention: features of the wrong width", lambda: sc.nn.MixedAttention(16, 4)(
        torch.randn(2, 10, 8)), ValueError, r"MixedAttention expects query \(B, L, E=16\)"),
    ("MixedAttention: a padding mask of the wrong shape", lambda: sc.nn.MixedAttention(16, 4)(
        S, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool)), ValueError,
     r"key_padding_mask must be \(B, L\)=\(2, 10\).*got \(2, 3\)"),
    ("MixedAttention: a fractional shift", lambda: sc.nn.MixedAttention(16, 4, shifts=(1.5,)),
     ValueError, "shifts must be a list of int offsets"),
    ("CausalSelfAttention: integer features", lambda: sc.nn.CausalSelfAttention(16, 2, 2)(
        S.long()), TypeError, "CausalSelfAttention: x must be a floating tensor"),
    ("CausalSelfAttention: fractional shifts", lambda: sc.nn.CausalSelfAttention(16, 2, 2.5),
     ValueError, "shifts must be an int >= 0 or a list of int offsets, got 2.5"),
    ("Canon: integer features", lambda: sc.nn.Canon(16, 3)(S.long()), TypeError,
     "Canon: h must be a floating tensor"),
    ("Canon: a cache that is not a dict", lambda: sc.nn.Canon(16, 3)(S, cache=[1]), TypeError,
     "Canon: cache must be a dict.*list"),
    ("Canon: a cache of another batch", lambda: sc.nn.Canon(16, 3)(
        S, cache={"canon": torch.randn(3, 2, 16)}), ValueError,
     r"cache\['canon'\] must hold .*\(2, 2, 16\).*got \(3, 2, 16\)"),
    ("TransformerLM: a negative feed-forward width", lambda: sc.nn.TransformerLM(
        11, 16, 2, 2, ffn=-3), ValueError, "TransformerLM: ffn must be an int >= 1.*-3"),
    ("TransformerLM: a fractional feed-forward width", lambda: sc.nn.TransformerLM(
        11, 16, 2, 2, ffn=2.5), ValueError, "TransformerLM: ffn must be an int >= 1.*2.5"),
    ("TransformerLM: a cache of too few layers", lambda: sc.nn.TransformerLM(11, 16, 2, 2)(
        torch.ones(1, 3, dtype=torch.long), [{}]), ValueError,
     r"TransformerLM: cache must be a list of 2 dicts, one per layer \(from new_cache\(\)\), "
     "got a list of 1"),
    ("Seq2Seq: a cache that is not a list", lambda: _s2s().decode(
        TGT, _s2s().encode(SRC)[0], cache={}), ValueError,
     "Seq2Seq: cache must be a list of 1 dicts.*got dict"),
    ("SelfAttention: integer features", lambda: sc.nn.SelfAttention(16, 2, (-1, 1))(S.long()),
     TypeError, "SelfAttention: x must be a floating tensor"),
    ("SelfAttention: a padding list", lambda: sc.nn.SelfAttention(16, 2)(S, [[False] * 10] * 2),
     ValueError, r"pad must be a \(B, L\)=\(2, 10\) bool tensor.*got list"),
    ("CrossAttention: integer target states", lambda: sc.nn.CrossAttention(16, 2)(
        S.long(), S), TypeError, "CrossAttention: y must be a floating tensor"),
    ("Seq2Seq: a negative feed-forward width", lambda: _s2s(ffn=-4), ValueError,
     "Seq2Seq: ffn must be an int >= 1.*-4"),
    ("PervasiveAttention: a negative bottleneck", lambda: _perv(bottleneck=-2), ValueError,
     "PervasiveAttention: bottleneck must be an int >= 1, got -2"),
    ("PervasiveAttention: a fractional kernel", lambda: _perv(kernel=3.0), ValueError,
     "PervasiveAttention: kernel must be an int >= 1, got 3.0"),
    ("PervasiveAttention: a dropout of 2", lambda: _perv(dropout=2.0), ValueError,
     r"PervasiveAttention: dropout must be in \[0, 1\), got 2.0"),
    ("AttentionPooling: integer features", lambda: sc.nn.AttentionPooling(8, 5, heads=2)(
        torch.ones(2, 3, 4, 8, dtype=torch.long)), TypeError,
     "AttentionPooling: h must be a floating tensor"),
    ("AttentionPooling: a padding of the wrong shape", lambda: sc.nn.AttentionPooling(8, 5)(
        torch.randn(2, 3, 4, 8), torch.zeros(2, 3, dtype=torch.bool)), ValueError,
     r"AttentionPooling: pad must be a \(B, S\)=\(2, 4\) bool tensor"),
    ("AttentionPooling: no heads", lambda: sc.nn.AttentionPooling(8, 5, heads=0), ValueError,
     "AttentionPooling: heads must be an int >= 1, got 0"),
    ("GridConv: an integer image", lambda: sc.nn.GridConv(3, 4, 3, dim=2)(IMG.long()),
     TypeError, "GridConv: x must be a floating tensor.*int64"),
    ("GridAvgPool: an integer image", lambda: sc.nn.GridAvgPool(2, dim=2)(IMG.long()),
     TypeError, "GridAvgPool: x must be a floating tensor"),
    ("SparseDropout: integer features", lambda: sc.nn.SparseDropout(0.5)(
        torch.ones(3, 3, dtype=torch.long)), TypeError, "SparseDropout: x must be a floating"),
    ("Convolution: integer features", lambda: sc.nn.Convolution(torch.randn(3, 10, 7), 4, 5)(
        torch.ones(2, 10, 4, dtype=torch.long)), TypeError, "x must be a floating tensor"),
]


@pytest.mark.parametrize("label, call, exc, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_layer_input_is_refused_by_name(label, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_the_defaults_a_config_writes_as_zero_still_apply():
    # a config's 0 means "the default" for these widths (4 x width, 4 x growth, 2 x embed)
    assert sc.nn.TransformerLM(11, 16, 1, 2, ffn=0).ffn == 64
    assert _s2s(ffn=0).ffn == 64
    m = _perv(bottleneck=0, width=0)
    assert m.layers[0].reduce.out_features == 16 and m.head.in_features == 8


def test_sequence_models_infer_shapes_on_meta():
    # the token-range check reads the ids: skipped on meta, as inside a compiled graph
    ids = torch.ones(2, 5, dtype=torch.long, device="meta")
    for pos in ("shift", "alibi", "relative"):
        lm = sc.nn.TransformerLM(11, 16, 2, 2, position=pos).to("meta")
        assert lm(ids).shape == (2, 5, 11)
    assert _s2s().to("meta")(ids, ids[:, :4]).shape == (2, 4, 13)
    s = S.to("meta")
    pad = torch.zeros(2, 10, dtype=torch.bool, device="meta")
    assert sc.nn.SelfAttention(16, 2, (-1, 1)).to("meta")(s, pad).shape == (2, 10, 16)
    assert _mha().to("meta")(s, s, s, key_padding_mask=pad)[0].shape == (2, 10, 16)

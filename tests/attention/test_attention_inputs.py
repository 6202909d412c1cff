"""Every public entry of ``sc.attention`` refuses bad input by name before computing.

Each case is a call with one bad argument; the error must be a ``ValueError`` / ``TypeError``
whose message names the argument (and says what was expected and what was given), never a raw
torch error from deep inside (einsum subscripts, "negative dimension", index errors) or a
silent wrong answer. Then: shape inference on the ``meta`` device, and the edge cases that
must keep working.
"""

import pytest
import torch

import structconv as sc

A = sc.attention
X, Y = torch.randn(5, 4), torch.randn(6, 4)
H = torch.randn(5, 2, 3)  # per-head inputs (M, K, C)
EI = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
LONG = torch.ones(5, 4, dtype=torch.long)


def _dot():
    return A.DotProduct(2, 4, 4, 3)


#: (public name, label, call, exception, a pattern the message must hold)
CASES = [
    ("biaffine", "integer x1", lambda: A.biaffine(LONG, Y, mu=torch.randn(2, 4)), TypeError,
     "x1 must be floating.*int64"),
    ("biaffine", "Lambda of another width", lambda: A.biaffine(X, torch.randn(6, 3),
                                                               torch.randn(2, 4, 4)),
     ValueError, r"Lambda must be \(K, 4, 3\).*got \(2, 4, 4\)"),
    ("Mechanism", "a mechanism plus a number", lambda: A.GATScores(2, 3) + 3, TypeError,
     "unsupported operand"),
    ("Sum", "terms of different input widths", lambda: A.DotProduct(2, 4, 4, 3)
     + A.Biaffine(2, 5, 5), ValueError, r"width in1.*DotProduct\(in1=4\).*Biaffine\(in1=5\)"),
    ("Sum", "terms of different heads", lambda: A.DotProduct(2, 4, 4, 3) + A.Biaffine(3, 4, 4),
     ValueError, r"K=3 heads.*DotProduct\(K=2\)"),
    ("Sum", "features and per-head inputs", lambda: A.GATScores(2, 3) + A.DotProduct(2, 4, 4, 3),
     ValueError, "DotProduct reads features.*GATScores per-head"),
    ("Biaffine", "zero heads", lambda: A.Biaffine(0, 4, 4), ValueError, "Biaffine: K must be"),
    ("Biaffine", "edge scores of the wrong width", lambda: A.Biaffine(2, 4, 4).edge_scores(
        torch.randn(5, 3), Y, EI), ValueError, r"Biaffine: x1 must have 4 features.*\(5, 3\)"),
    ("DotProduct", "features of the wrong width", lambda: _dot()(torch.randn(5, 3), Y),
     ValueError, r"DotProduct: x1 must have 4 features.*\(5, 3\)"),
    ("DotProduct", "integer features", lambda: _dot()(LONG, Y), TypeError,
     "DotProduct: x1 must be a floating tensor.*int64"),
    ("DotProduct", "a negative head count", lambda: A.DotProduct(-2, 4, 4, 3), ValueError,
     "DotProduct: K must be an int >= 1, got -2"),
    ("PerHead", "integer per-head inputs", lambda: A.GATScores(2, 3)(H.long(), H), TypeError,
     "GATScores: h1 must be a floating tensor"),
    ("GATScores", "per-head inputs of another width", lambda: A.GATScores(2, 3)(
        torch.randn(5, 2, 4), H), ValueError, r"h1 must be per-head inputs \(M, K=2, C=3\)"),
    ("HeadDot", "integer per-head inputs", lambda: A.HeadDot(2, 3)(H.long(), H.long()),
     TypeError, "HeadDot: h1 must be a floating tensor"),
    ("GATv2Scores", "integer per-head inputs", lambda: A.GATv2Scores(2, 3)(H.long(), H),
     TypeError, "GATv2Scores: h1 must be a floating tensor"),
    ("EdgeTerm", "integer edge features", lambda: A.EdgeTerm(2, 3).edge_scores(
        5, 5, EI, torch.ones(4, 3, dtype=torch.long)), TypeError, "edge_attr must be a floating"),
    ("EdgeTerm", "a negative edge_dim", lambda: A.EdgeTerm(2, -3), ValueError,
     "EdgeTerm: edge_dim must be an int >= 1, got -3"),
    ("EdgeDot", "edge features of the wrong count", lambda: A.EdgeDot(2, 3, 4).edge_scores(
        H, H, EI, torch.randn(3, 4)), ValueError, r"edge_attr must be \(4, 4\).*got \(3, 4\)"),
    ("IndexTerm", "a negative entry count", lambda: A.ALiBi(2)(-2, 3), ValueError,
     "ALiBi: M .* must be an int >= 0, got -2"),
    ("RelativeBias", "a fractional head count", lambda: A.RelativeBias(2.5), ValueError,
     "K must be an int >= 1, got 2.5"),
    ("PeriodicBias", "a zero period", lambda: A.PeriodicBias(2, 0), ValueError,
     "period must be an int >= 1, got 0"),
    ("ALiBi", "slopes of the wrong count", lambda: A.ALiBi(2, [0.5]), ValueError,
     r"slopes must be \(2,\)"),
    ("index_bias", "a negative size", lambda: A.index_bias([A.ALiBi(2)], -1, 3,
                                                           dtype=torch.float32),
     ValueError, "index_bias: M .* must be an int >= 0, got -1"),
    ("index_bias", "terms of different heads", lambda: A.index_bias(
        [A.ALiBi(2), A.RelativeBias(3)], 4, 3, dtype=torch.float32), ValueError,
     r"share K heads.*ALiBi\(K=2\), RelativeBias\(K=3\)"),
    ("index_bias", "a content term", lambda: A.index_bias([_dot()], 4, 3, dtype=torch.float32),
     TypeError, "terms must be index terms.*DotProduct"),
    ("index_bias", "an integer dtype", lambda: A.index_bias([A.ALiBi(2)], 4, 3,
                                                            dtype=torch.long),
     TypeError, "dtype must be a floating torch.dtype"),
    ("Masked", "a mask of the wrong shape", lambda: A.Masked(_dot(), torch.zeros(3, 3))(X, Y),
     ValueError, r"Masked: mask of shape \(3, 3\) does not broadcast.*\(2, 5, 6\)"),
    ("Masked", "a mask of the wrong shape, on edges", lambda: A.Masked(
        _dot(), torch.zeros(3, 3)).edge_scores(X, Y, EI), ValueError,
     r"Masked: mask of shape \(3, 3\) does not broadcast.*\(2, 5, 6\)"),
    ("Masked", "a mask of other heads", lambda: A.Masked(_dot(), torch.zeros(3, 5, 6))(X, Y),
     ValueError, r"mask of shape \(3, 5, 6\)"),
    ("Masked", "an integer mask", lambda: A.Masked(_dot(), torch.zeros(5, 6, dtype=torch.long)),
     TypeError, "Masked: mask must be bool .* or a floating log mask.*int64"),
    ("Masked", "a list mask", lambda: A.Masked(_dot(), [[0.0]]), TypeError,
     "Masked: mask must be a tensor.*list"),
    ("GraphMasked", "a bool edge_index", lambda: A.GraphMasked(A.GATScores(2, 3), EI.bool()),
     TypeError, "edge_index must be an integer tensor.*bool"),
    ("LeakyReLU", "a text slope", lambda: A.LeakyReLU(A.GATScores(2, 3), "a"), ValueError,
     "LeakyReLU: negative_slope must be a finite number, got 'a'"),
    ("Softmax", "an unknown side", lambda: A.Softmax(A.GATScores(2, 3), over="x"), ValueError,
     "over must be 'inputs' or 'outputs'"),
    ("attention_basis", "integer features", lambda: A.attention_basis(
        A.Softmax(_dot()), LONG, Y), TypeError, "x1 must be a floating tensor"),
    ("attention_basis", "features of the wrong width", lambda: A.attention_basis(
        A.Softmax(_dot()), torch.randn(5, 3), Y), ValueError, "x1 must have 4 features"),
    ("attention_basis", "graph node ids out of range", lambda: A.attention_basis(
        A.Softmax(A.GraphMasked(A.GATScores(2, 3), torch.tensor([[0, 9], [1, 2]]))), H, H),
     ValueError, r"node ids outside \[0, 5\)"),
    ("attention_basis", "a dropout above 1", lambda: A.attention_basis(
        A.Softmax(_dot()), X, Y, dropout=2.0), ValueError, "dropout must be a probability"),
    ("add_self_loops", "a fill tensor of the wrong width", lambda: A.add_self_loops(
        EI, 5, torch.randn(4, 3), fill_value=torch.randn(2)), ValueError,
     r"fill_value: .*shape \(3,\) .*got shape \(2,\)"),
    ("add_self_loops", "a fill tensor of one row per node", lambda: A.add_self_loops(
        EI, 5, torch.randn(4, 3), fill_value=torch.randn(2, 3)), ValueError,
     r"fill_value: .*got shape \(2, 3\)"),
    ("add_self_loops", "a bool edge_index", lambda: A.add_self_loops(EI.bool(), 5), TypeError,
     "edge_index must be an integer tensor"),
    ("self_loop_attr", "a fill tensor of the wrong width", lambda: A.self_loop_attr(
        torch.randn(4, 3), EI[1], 5, torch.randn(2)), ValueError, r"fill_value: .*\(2,\)"),
    ("AttentionBasis", "integer weights", lambda: A.AttentionBasis(
        torch.ones(2, 3, 3, dtype=torch.long)), TypeError, "weights must be a floating"),
    ("DotProductAttention", "integer queries", lambda: A.DotProductAttention(
        torch.ones(1, 2, 3, 4, dtype=torch.long), torch.ones(1, 2, 3, 4)), TypeError,
     "query must be a floating tensor"),
    ("DotProductAttention", "queries and keys of two dtypes", lambda: A.DotProductAttention(
        torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4, dtype=torch.float64)), TypeError,
     "query and key must share a dtype"),
    ("DotProductAttention", "an integer mask", lambda: A.DotProductAttention(
        torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), mask=torch.ones(3, 3, dtype=torch.long)),
     TypeError, "mask must be a bool .* or floating"),
    ("DotProductAttention", "a mask of the wrong shape", lambda: A.DotProductAttention(
        torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), mask=torch.ones(4, 3)), ValueError,
     r"mask of shape \(1, 1, 4, 3\).*does not broadcast"),
    ("DotProductAttention", "a dropout above 1", lambda: A.DotProductAttention(
        torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), dropout_p=2.0), ValueError,
     "dropout_p must be a probability in \\[0, 1\\), got 2.0"),
    ("GraphAttention", "integer weights", lambda: A.GraphAttention(
        EI, torch.ones(4, 2, dtype=torch.long), 5), TypeError, "alpha must be a floating"),
    ("GraphAttention", "weights of another edge count", lambda: A.GraphAttention(
        EI, torch.ones(3, 2), 5), ValueError, r"alpha \(3, 2\) needs E=4"),
    ("GraphStructure", "node ids out of range", lambda: A.GraphStructure(EI, 3, 3, 2),
     ValueError, r"node ids outside \[0, 3\)"),
    ("GraphStructure", "a zero head count", lambda: A.GraphStructure(EI, 5, 5, 0), ValueError,
     "GraphStructure: K must be an int >= 1, got 0"),
    ("shift_basis", "a fractional shift", lambda: A.shift_basis(3, (1.5,)), ValueError,
     r"list of int shifts.*shifts=\(1.5,\)"),
    ("shift_basis", "a negative length", lambda: A.shift_basis(-3), ValueError,
     "int length >= 1.*length=-3"),
    ("CausalShift", "a negative shift", lambda: A.CausalShift(3, (-1,)), ValueError,
     "at least one shift, all >= 0"),
    ("log_mask", "a float tensor", lambda: A.log_mask(torch.zeros(3)), TypeError,
     "log_mask expects a bool tensor"),
    ("log_mask", "an integer dtype", lambda: A.log_mask(torch.ones(3, dtype=torch.bool),
                                                        torch.long), TypeError,
     "log_mask: dtype must be a floating"),
    ("causal_mask", "a fractional size", lambda: A.causal_mask(2.5), ValueError,
     "causal_mask needs ints M, N >= 1, got M=2.5"),
    ("padding_mask", "a float tensor", lambda: A.padding_mask(torch.zeros(2, 3)), ValueError,
     r"padding_mask expects a \(B, M\) bool tensor"),
    ("graph_mask", "a negative size", lambda: A.graph_mask(EI, -5), ValueError,
     "graph_mask needs ints M, N >= 0 .* got M=-5"),
    ("from_torch_mask", "a vector", lambda: A.from_torch_mask(torch.ones(3, dtype=torch.bool)),
     ValueError, r"from_torch_mask: mask must be a tensor \(.., L, S\), got \(3,\)"),
    ("from_torch_mask", "an integer mask", lambda: A.from_torch_mask(torch.ones(3, 3).long()),
     TypeError, "from_torch_mask: mask must be bool .*int64"),
    ("masked_softmax", "integer scores", lambda: A.masked_softmax(torch.ones(3, 3).long(), -1),
     TypeError, "masked_softmax: scores must be a floating tensor"),
    ("masked_softmax", "a dim the scores lack", lambda: A.masked_softmax(torch.randn(3, 3), 5),
     ValueError, r"masked_softmax: dim=5 is not a dim of the scores \(shape \(3, 3\)\)"),
    ("softmax_inputs", "a vector", lambda: A.softmax_inputs(torch.randn(3)), ValueError,
     "softmax_inputs: dim=-2 is not a dim"),
    ("softmax_outputs", "integer scores", lambda: A.softmax_outputs(torch.ones(2, 2).long()),
     TypeError, "softmax_outputs: scores must be a floating"),
    ("edge_softmax", "a float index", lambda: A.edge_softmax(torch.randn(4, 2),
                                                             torch.tensor([0., 1, 2, 3]), 5),
     TypeError, r"edge_softmax: index must be an integer tensor \(E,\)"),
    ("edge_softmax", "integer scores", lambda: A.edge_softmax(
        torch.ones(4, 2, dtype=torch.long), torch.arange(4), 5), TypeError,
     "edge_softmax: scores must be a floating tensor"),
    ("edge_softmax", "a negative node count", lambda: A.edge_softmax(
        torch.randn(4, 2), torch.arange(4), -1), ValueError,
     "edge_softmax: num_nodes must be an int >= 0, got -1"),
    ("edge_softmax", "index and scores on two devices", lambda: A.edge_softmax(
        torch.randn(4, 2, device="meta"), torch.arange(4), 5), ValueError,
     "index is on cpu but scores on meta"),
    ("dead_columns", "a list", lambda: A.dead_columns([1.0]), TypeError,
     "dead_columns: mask must be a bool or floating log mask, got list"),
    ("TanhClip", "a negative range", lambda: A.TanhClip(A.GATScores(2, 3), -1), ValueError,
     "C .* must be a finite number > 0, got -1"),
    ("tanh_clip", "a NaN range", lambda: A.tanh_clip(torch.ones(3), float("nan")), ValueError,
     "C .* must be a finite number > 0, got nan"),
    ("tanh_clip", "integer scores", lambda: A.tanh_clip(torch.ones(3).long(), 2.0), TypeError,
     "tanh_clip: scores must be a floating tensor"),
    ("ALiBi", "a NaN slope", lambda: A.ALiBi(2, [float("nan"), 0.5]), ValueError,
     "ALiBi slopes must be finite"),
    ("DotProduct", "a NaN scale", lambda: A.DotProduct(2, 4, 4, 3, scale=float("nan")),
     ValueError, "DotProduct: scale must be a finite number"),
    ("HeadDot", "an infinite scale", lambda: A.HeadDot(2, 3, scale=float("inf")), ValueError,
     "HeadDot: scale must be a finite number"),
    ("EdgeDot", "a NaN scale", lambda: A.EdgeDot(2, 3, scale=float("nan")), ValueError,
     "EdgeDot: scale must be a finite number"),
    ("attention_basis", "a structure that is not one", lambda: A.attention_basis(
        A.Softmax(A.GraphMasked(A.GATScores(2, 3), EI)), H, H, structure="x"), TypeError,
     "structure must be a GraphStructure"),
    ("positions", "causal_shift of fractional shifts", lambda: A.positions.causal_shift(
        torch.randn(1, 3, 2, 4), [1.5, 2]), ValueError, r"shifts must be ints, got \[1.5, 2\]"),
    ("positions", "sinusoidal of a negative width", lambda: A.positions.sinusoidal(
        torch.arange(3), -2), ValueError, "sinusoidal: E .* must be an int >= 1, got -2"),
    ("positions", "rotary of an odd head size", lambda: A.positions.rotary(
        torch.randn(1, 2, 3, 5)), ValueError, "even head size, got D=5"),
    ("positions", "alibi_slopes of no heads", lambda: A.positions.alibi_slopes(0), ValueError,
     "alibi_slopes needs heads >= 1, got 0"),
]


@pytest.mark.parametrize("name, label, call, exc, pattern", CASES,
                         ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_bad_input_is_refused_by_name(name, label, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_every_public_entry_has_a_bad_input_case():
    covered = {c[0] for c in CASES}
    assert set(A.__all__) <= covered, sorted(set(A.__all__) - covered)


# -- shape inference on the meta device ---------------------------------------------------------
def _meta(*shape):
    return torch.empty(*shape, device="meta")


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bool])
def test_dense_masked_attention_infers_shapes_on_meta(mask_dtype):
    # the dead-query test reads the mask's values: on meta the fix is kept (a no-op there)
    x = _meta(2, 5, 4)
    mask = torch.ones(5, 5, dtype=mask_dtype, device="meta")
    for mech in (A.DotProduct(2, 4, 4, 3), A.Biaffine(2, 4, 4)):
        b = A.attention_basis(A.Softmax(A.Masked(mech.to("meta"), mask)), x, x)
        assert b.propagate(_meta(2, 5, 4)).shape == (2, 5, 2, 4)
    assert A.masked_softmax(_meta(3, 4), -1).shape == (3, 4)


def test_graph_attention_infers_shapes_on_meta():
    ei, h = EI.to("meta"), _meta(5, 2, 3)
    for mech in (A.GATScores(2, 3), A.GATv2Scores(2, 3)):
        b = A.attention_basis(A.Softmax(A.GraphMasked(mech.to("meta"), ei)), h, h)
        assert b.propagate(_meta(1, 5, 4)).shape == (1, 5, 2, 4)
        assert b.to_dense().shape == (2, 5, 5)
    assert A.graph_mask(ei, 5).shape == (5, 5)
    # which edges are loops is unknown on meta: every edge is kept, one loop per node added
    ei2, attr = A.add_self_loops(ei, 5, _meta(4, 3))
    assert ei2.shape == (2, 9) and attr.shape == (9, 3)


# -- what must keep working ---------------------------------------------------------------------
def test_a_broadcast_mask_on_edges_equals_the_dense_scores():
    # a mask (1, N) (one value per output) used to index its size-1 input dim by edge sources
    mask = torch.randn(1, 6)
    mech = A.Masked(_dot(), mask)
    src, dst = torch.tensor([[0, 4, 2, 3], [1, 5, 0, 5]])
    dense = mech(X, Y)  # (K, M, N)
    torch.testing.assert_close(mech.edge_scores(X, Y, torch.stack([src, dst])),
                               dense[:, src, dst].t())


def test_fill_values_that_broadcast_to_a_loop_keep_working():
    attr = torch.randn(4, 3)
    for fill in (torch.tensor(2.0), torch.full((3,), 2.0), torch.full((1, 3), 2.0), 2.0):
        _, out = A.add_self_loops(EI, 5, attr, fill_value=fill)
        torch.testing.assert_close(out[4:], torch.full((5, 3), 2.0))


def test_an_empty_index_block_is_an_answer():
    assert A.index_bias([A.ALiBi(2)], 0, 3, dtype=torch.float32).shape == (2, 3, 0)

"""The mechanism algebra: sums of terms, index terms, edge terms, GATv2's mechanism (float64).

Identities checked: a + b scores are a's plus b's; the dense (K, M, N) and edge (E, K) forms of
any sum agree; transforms wrap sums; index terms on SDPA's fused path equal the dense path.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv import attention as at
from structconv.attention.positions import alibi_mask, alibi_slopes, toeplitz

DT = torch.float64


def _rand(*shape):
    return torch.randn(*shape, dtype=DT)


def _randomise(module, scale=0.5):
    # index and edge weights start at zero or small: make every parameter count
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn_like(p))
    return module


def _pairs(M, N):
    m, n = torch.meshgrid(torch.arange(M), torch.arange(N), indexing="ij")
    return torch.stack([m.reshape(-1), n.reshape(-1)])  # every pair m -> n


def _graph(M, N, E, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, M, (E,), generator=g),
                        torch.randint(0, N, (E,), generator=g)])


# -- sums of terms on raw inputs -----------------------------------------------------------------
def _flat_terms(K, P, Q, D):
    """Terms on x1 (M, P), x2 (N, Q), dense edge features (M, N, D)."""
    return {
        "biaffine": at.Biaffine(K, P, Q),
        "dot": at.DotProduct(K, P, Q, 3, bias=True),
        "relative": at.RelativeBias(K, 8, 12),
        "relative_causal_shared": at.RelativeBias(1, 6, 9, bidirectional=False),
        "periodic": at.PeriodicBias(K, 3, num_periods=2, bidirectional=True),
        "phase": at.PeriodicBias(K, 4, mode="phase"),
        "alibi": at.ALiBi(K),
        "edge": at.EdgeTerm(K, D),
        "edge_shared": at.EdgeTerm(1, D),
    }


@settings(max_examples=25, deadline=None)
@given(K=st.integers(1, 3), M=st.integers(1, 6), N=st.integers(1, 7), P=st.integers(1, 3),
       Q=st.integers(1, 3), D=st.integers(1, 3),
       names=st.lists(st.sampled_from(sorted(_flat_terms(1, 1, 1, 1))), min_size=1,
                      max_size=4),
       batched=st.booleans(), seed=st.integers(0, 2**16))
def test_sum_is_termwise_and_its_dense_and_edge_forms_agree(K, M, N, P, Q, D, names, batched,
                                                            seed):
    torch.manual_seed(seed)
    pool = _flat_terms(K, P, Q, D)
    terms = [_randomise(pool[n].to(DT)) for n in names]
    mech = sum(terms) if len(terms) > 1 else terms[0] + at.RelativeBias(K, 4, 5)
    parts = list(mech.parts)
    lead = (2,) if batched else ()
    x1, x2 = _rand(*lead, M, P), _rand(*lead, N, Q)
    Ed = _rand(M, N, D)  # every pair's edge features
    dense = mech(x1, x2, edge_attr=Ed)
    want = None
    for t in parts:
        s = t(x1, x2, edge_attr=Ed)
        want = s if want is None else want + s
    content = any(t.reads_inputs for t in parts)  # index and edge terms carry no batch dim
    heads = max(t.K for t in parts)  # K = 1 terms are shared: a sum of them only is K = 1
    assert dense.shape == ((2,) if batched and content else ()) + (heads, M, N)
    torch.testing.assert_close(dense, want)
    # the edge form on every pair and on a random multigraph: the dense values, gathered
    for ei in (_pairs(M, N), _graph(M, N, 11, seed)):
        got = mech.edge_scores(x1, x2, ei, Ed[ei[0], ei[1]])
        torch.testing.assert_close(got, dense[..., ei[0], ei[1]].transpose(-1, -2))


def test_sum_builds_flattens_broadcasts_and_refuses():
    a, b, c = at.ALiBi(2), at.RelativeBias(2), at.RelativeBias(1)
    s = a + b + c
    assert isinstance(s, at.Sum) and len(s.parts) == 3 and s.K == 2
    assert len((s + (a + b)).parts) == 5
    assert sum([a, b, c]).K == 2 and sum([a]) is a
    H = torch.zeros(3, 4, dtype=DT)
    H[0, 1] = -math.inf
    masked = a + H  # the paper's a + H: a mask
    assert isinstance(masked, at.Masked)
    assert torch.isneginf(masked(3, 4)[:, 0, 1]).all() and torch.isfinite(masked(3, 4)[:, 1]).all()
    with pytest.raises(ValueError, match="K=3"):
        a + at.ALiBi(3)
    with pytest.raises(TypeError, match="Mechanism"):
        at.Sum([a, torch.nn.Linear(2, 2)])
    for other in (1.5, "x"):
        with pytest.raises(TypeError):
            a + other


def test_transforms_wrap_sums_on_every_path():
    torch.manual_seed(1)
    K, M, D = 2, 7, 3
    x = _rand(M, 4)
    # a graph with a self loop and isolated nodes 5, 6 (unique edges: the dense form sees each
    # pair once, the edge form each edge)
    eu = torch.unique(torch.cat([_graph(M - 2, M - 2, 16, 1), torch.tensor([[2], [2]])], 1),
                      dim=1)
    Ed = _rand(M, M, D)
    terms = _randomise(at.Biaffine(K, 4, 4).to(DT)) + _randomise(at.EdgeTerm(K, D).to(DT)) + \
        _randomise(at.RelativeBias(K, 6, 10).to(DT))
    mech = at.Softmax(at.LeakyReLU(at.GraphMasked(terms, eu), 0.3))
    dense = mech(x, x, edge_attr=Ed)
    basis = at.attention_basis(mech, x, x, edge_attr=Ed[eu[0], eu[1]])
    assert isinstance(basis, at.GraphAttention)
    torch.testing.assert_close(basis.to_dense(), dense)
    assert (dense[:, :, M - 2:] == 0).all() and not dense.isnan().any()  # isolated targets
    # the graph's columns sum to one; softmax over outputs normalises rows instead
    torch.testing.assert_close(dense.sum(1)[:, eu[1].unique()], torch.ones(K, len(eu[1].unique()),
                                                                           dtype=DT))
    rows = at.Softmax(at.GraphMasked(terms, eu), over="outputs")
    torch.testing.assert_close(at.attention_basis(rows, x, x, edge_attr=Ed[eu[0], eu[1]])
                               .to_dense(), rows(x, x, edge_attr=Ed))
    # without a graph the sum runs dense; the dense basis equals the mechanism
    plain = at.Softmax(terms)
    b2 = at.attention_basis(plain, x, x, edge_attr=Ed)
    assert isinstance(b2, at.AttentionBasis)
    torch.testing.assert_close(b2.to_dense(), plain(x, x, edge_attr=Ed))


# -- per-head terms (inputs projected per head, h = xΘ_k) ----------------------------------------
def _gatv2_ref(h1, h2, att, ek, slope):
    # score_k(m, n) = att_k · LeakyReLU(h1[m, k] + h2[n, k] + ê[m, n, k]), one pair at a time
    M, N, K, _ = h1.shape[0], h2.shape[0], h1.shape[1], h1.shape[2]
    out = torch.zeros(K, M, N, dtype=DT)
    for k in range(K):
        for m in range(M):
            for n in range(N):
                z = h1[m, k] + h2[n, k] + (0 if ek is None else ek[m, n, k])
                out[k, m, n] = att[k] @ F.leaky_relu(z, slope)
    return out


@settings(max_examples=15, deadline=None)
@given(K=st.integers(1, 3), C=st.integers(1, 3), M=st.integers(1, 5), N=st.integers(1, 5),
       D=st.integers(1, 3), edges=st.booleans(), seed=st.integers(0, 2**16))
def test_gatv2_mechanism_is_the_attention_vector_after_the_nonlinearity(K, C, M, N, D, edges,
                                                                       seed):
    torch.manual_seed(seed)
    mech = _randomise(at.GATv2Scores(K, C, edge_dim=D if edges else None,
                                     negative_slope=0.3).to(DT))
    h1, h2 = _rand(M, K, C), _rand(N, K, C)
    Ed = _rand(M, N, D) if edges else None
    ek = None if Ed is None else (Ed @ mech.edge_weight.t()).view(M, N, K, C)
    dense = mech(h1, h2, edge_attr=Ed)
    torch.testing.assert_close(dense, _gatv2_ref(h1, h2, mech.att, ek, 0.3))
    ei = _pairs(M, N)
    got = mech.edge_scores(h1, h2, ei, None if Ed is None else Ed[ei[0], ei[1]])
    torch.testing.assert_close(got, dense[:, ei[0], ei[1]].t())
    if not edges:
        with pytest.raises(ValueError, match="edge_dim"):
            mech.edge_scores(h1, h2, ei, _rand(ei.shape[1], 2))
    # batched inputs: per item
    hb = torch.stack([h1, -h1])
    torch.testing.assert_close(mech(hb, h2, edge_attr=Ed)[1], mech(-h1, h2, edge_attr=Ed))


@settings(max_examples=15, deadline=None)
@given(K=st.integers(1, 3), C=st.integers(1, 3), M=st.integers(1, 5), N=st.integers(1, 5),
       D=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_per_head_sums_dense_edge_and_fused_query_products_agree(K, C, M, N, D, seed):
    torch.manual_seed(seed)
    W = _rand(K * C, D)
    raw = at.EdgeDot(K, C, D, weight=W)
    keyed = at.EdgeDot(K, C)  # the same term on projected edge keys
    gat = _randomise(at.GATScores(K, C).to(DT))
    h1, h2, Ed = _rand(M, K, C), _rand(N, K, C), _rand(M, N, D)
    keys = (Ed @ W.t()).view(M, N, K, C)
    s = 1 / math.sqrt(C)
    # TransformerConv's scores: q_n · (k_m + ê_mn) / sqrt(C)
    ref = torch.einsum("nkc,mnkc->kmn", h2, h1.unsqueeze(1) + keys) * s
    mech = at.HeadDot(K, C) + raw
    torch.testing.assert_close(mech(h1, h2, edge_attr=Ed), ref)
    torch.testing.assert_close((at.HeadDot(K, C) + keyed)(h1, h2, edge_attr=keys), ref)
    ei = _graph(M, N, 13, seed)
    e_raw, e_keys = Ed[ei[0], ei[1]], keys[ei[0], ei[1]]
    want = ref[:, ei[0], ei[1]].t()
    # the Sum evaluates both QueryDot terms as one product; each alone gives its part
    torch.testing.assert_close(mech.edge_scores(h1, h2, ei, e_raw), want)
    torch.testing.assert_close((at.HeadDot(K, C) + keyed).edge_scores(h1, h2, ei, e_keys), want)
    torch.testing.assert_close(at.HeadDot(K, C).edge_scores(h1, h2, ei) +
                               raw.edge_scores(h1, h2, ei, e_raw), want)
    # per-head content + index + edge terms in one sum: dense and edge forms agree
    mixed = gat + _randomise(at.ALiBi(K) + at.PeriodicBias(K, 2).to(DT)) + \
        _randomise(at.EdgeTerm(K, D).to(DT))
    d = mixed(h1, h2, edge_attr=Ed)
    torch.testing.assert_close(mixed.edge_scores(h1, h2, ei, e_raw),
                               d[:, ei[0], ei[1]].t())
    # GATScores without target features (an int N): only the source term
    torch.testing.assert_close(gat(h1, N), (h1 * gat.mu).sum(-1).t()[:, :, None].expand(K, M, N))


# -- index terms ---------------------------------------------------------------------------------
def _t5_bucket(relative_position, bidirectional, num_buckets, max_distance):
    # Mesh TensorFlow's / T5's _relative_position_bucket, one integer at a time
    ret, n = 0, -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0) * num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                          * (num_buckets - max_exact))
    return ret + min(val, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 40), (5, 9), (64, 1000)])
def test_relative_bias_buckets_are_t5s(bidirectional, num_buckets, max_distance):
    rb = at.RelativeBias(3, num_buckets, max_distance, bidirectional=bidirectional)
    d = torch.arange(-2500, 2500)
    # d = n - m (output minus input); T5's relative position is memory - query = m - n
    want = torch.tensor([_t5_bucket(-int(v), bidirectional, num_buckets, max_distance)
                         for v in d])
    assert torch.equal(rb.bucket(d), want)
    _randomise(rb.to(DT))
    torch.testing.assert_close(rb(5, 7), rb.weight[want[2500 + torch.arange(7) - torch.arange(5)
                                                       [:, None]]].permute(2, 0, 1))


def test_periodic_bias_buckets_and_alibi_values():
    d = torch.arange(-20, 21)
    ph = at.PeriodicBias(2, 7, mode="phase")
    assert torch.equal(ph.bucket(d), torch.tensor([v % 7 for v in d.tolist()]))
    mu = at.PeriodicBias(2, 3, num_periods=4)
    assert torch.equal(mu.bucket(d), torch.tensor([min(max(v // 3, 0), 3) for v in d.tolist()]))
    bi = at.PeriodicBias(2, 3, num_periods=2, bidirectional=True)
    assert bi.weight.shape == (4, 2)
    assert torch.equal(bi.bucket(d), torch.tensor([min(max(v // 3, -2), 1) + 2
                                                  for v in d.tolist()]))
    al = at.ALiBi(4)
    m, n = torch.arange(5)[:, None], torch.arange(6)[None, :]
    want = -alibi_slopes(4)[:, None, None] * (n - m).abs()
    torch.testing.assert_close(al(5, 6, dtype=DT), want)
    assert al(5, 6).dtype == torch.get_default_dtype()
    assert not list(al.parameters())
    for bad in (dict(K=0), dict(K=2, num_buckets=3), dict(K=2, num_buckets=8, max_distance=2)):
        with pytest.raises(ValueError):
            at.RelativeBias(**bad)
    with pytest.raises(ValueError, match="mode"):
        at.PeriodicBias(2, 3, mode="week")
    with pytest.raises(ValueError, match="slopes"):
        at.ALiBi(3, slopes=[0.5, 0.25])


def test_index_bias_sums_tables_in_the_compute_dtype():
    torch.manual_seed(2)
    terms = [_randomise(at.RelativeBias(3, 8, 20)), _randomise(at.PeriodicBias(1, 4)),
             at.ALiBi(3)]
    M, N = 9, 6
    got = at.index_bias(terms, M, N, dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == (3, N, M) and got.is_contiguous()
    want = sum(t(M, N, dtype=DT) for t in terms).transpose(-1, -2)
    torch.testing.assert_close(got, want.float())
    causal = at.index_bias(terms, M, N, dtype=DT, causal=True)
    future = torch.arange(M)[None, :] > torch.arange(N)[:, None]
    assert torch.isneginf(causal[:, future]).all()
    torch.testing.assert_close(causal[:, ~future], want[:, ~future])
    # the toeplitz expansion itself, on odd shapes
    for K, R, C in ((1, 1, 1), (2, 3, 7), (3, 8, 2)):
        t = torch.randn(K, R + C - 1)
        i, j = torch.arange(R)[:, None], torch.arange(C)[None, :]
        assert torch.equal(toeplitz(t, R, C), t[:, i - j + C - 1])


@settings(max_examples=15, deadline=None)
@given(K=st.integers(1, 3), L=st.integers(1, 9), S=st.integers(1, 9), causal=st.booleans(),
       masked=st.booleans(), batched=st.booleans(), seed=st.integers(0, 2**16))
def test_index_terms_keep_sdpa_and_equal_the_dense_path(K, L, S, causal, masked, batched, seed):
    torch.manual_seed(seed)
    dot = at.DotProduct(K, 4, 5, 3, bias=True).to(DT)
    terms = dot + _randomise(at.RelativeBias(K, 8, 16).to(DT)) + at.ALiBi(K) + \
        _randomise(at.PeriodicBias(1, 2).to(DT))
    lead = (2,) if batched else ()
    x1, x2 = _rand(*lead, S, 4), _rand(*lead, L, 5)
    mask = None
    if masked:
        mask = torch.zeros(S, L, dtype=DT).masked_fill(torch.rand(S, L) < 0.3, -math.inf)
    mech = at.Softmax(at.Masked(terms, mask, causal=causal))
    basis = at.attention_basis(mech, x1, x2)
    assert isinstance(basis, at.DotProductAttention)
    assert basis.sdpa_mask.dtype == DT and basis.sdpa_mask.shape[-2:] == (L, S)
    torch.testing.assert_close(basis.to_dense(), mech(x1, x2))
    assert not basis.to_dense().isnan().any()
    z = _rand(2, S, K, 3)
    dense = mech(x1, x2)
    dense = dense if dense.dim() == 4 else dense.unsqueeze(0)
    torch.testing.assert_close(basis.propagate_heads(z), torch.einsum("bkmn,bmkc->bnkc",
                                                                      dense, z))


def test_fused_index_mask_is_the_index_scores_in_the_compute_dtype():
    torch.manual_seed(3)
    x = torch.randn(2, 7, 8)
    dot = at.DotProduct(4, 8, 8, 2)
    basis = at.attention_basis(at.Softmax(at.Masked(dot + at.ALiBi(4), causal=True)), x, x)
    m = basis.sdpa_mask
    assert m.dtype == torch.float32 and m.shape == (1, 4, 7, 7)
    assert torch.equal(m[0], alibi_mask(alibi_slopes(4), 7, 7))
    # 5 queries after 4 cached keys: ALiBi's generation mask, as the index term
    cached = at.index_bias([at.ALiBi(3)], 9, 5, dtype=torch.float32, causal=True,
                           output_start=4)
    assert torch.equal(cached, alibi_mask(alibi_slopes(3), 5, 9, 4))
    assert basis.dead is None and not basis.causal  # the causal mask is in the table
    bare = at.attention_basis(at.Softmax(at.Masked(dot, causal=True)), x, x)
    assert bare.sdpa_mask is None and bare.causal  # no index term: SDPA's own causal flag


def test_alibi_mask_builds_no_float64_square_temporaries():
    # ALiBi's mask at L = 2048, 8 heads, float32 is 128 MiB; the old build made a float64
    # (H, L, L) tensor and (L, L) distances beside it (>= 3x the mask)
    from structconv.bench._util import peak_memory

    H, L = 8, 2048
    mask_bytes = H * L * L * 4

    def make():
        s = alibi_slopes(H)
        return lambda: alibi_mask(s, L, L)

    peak = peak_memory(make)
    if peak is None:
        pytest.skip("peak memory is not measurable on this platform")
    assert peak < 1.4 * mask_bytes, (peak / 2**20, mask_bytes / 2**20)
    got = alibi_mask(alibi_slopes(3), 5, 9, 4, dtype=torch.bfloat16)
    i, j = torch.arange(4, 9)[:, None], torch.arange(9)[None, :]
    want = (-alibi_slopes(3)[:, None, None] * (i - j)).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want.masked_fill(j > i, -math.inf))


# -- edge features and self loops ----------------------------------------------------------------
FILLS = ["mean", "add", "sum", "max", "min", "mul", 0.5, 2, None, "tensor"]


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("dims", [(), (3,)])
def test_add_self_loops_is_pygs(fill, dims):
    utils = pytest.importorskip("torch_geometric.utils")
    torch.manual_seed(4)
    ei = torch.cat([_graph(6, 6, 14, 4), torch.tensor([[1, 1, 4], [1, 1, 4]])], 1)
    ea = _rand(ei.shape[1], *dims)
    fv = torch.randn(dims, dtype=DT) if fill == "tensor" else fill
    ea1, ea2 = ea.clone().requires_grad_(), ea.clone().requires_grad_()
    e1, a1 = utils.remove_self_loops(ei, ea1)
    e1, a1 = utils.add_self_loops(e1, a1, fill_value=fv, num_nodes=8)  # nodes 6, 7: no edges
    e2, a2 = at.add_self_loops(ei, 8, ea2, fill_value=fv)
    assert torch.equal(e1, e2)
    torch.testing.assert_close(a2, a1)
    w = _rand(*a1.shape)
    (a1 * w).sum().backward()
    (a2 * w).sum().backward()
    torch.testing.assert_close(ea2.grad, ea1.grad)  # the loops' features depend on the edges'
    e3, a3 = at.add_self_loops(ei, 8)
    assert torch.equal(e3, e1) and a3 is None


def test_self_loop_features_carry_gradients_and_bipartite_blocks():
    utils = pytest.importorskip("torch_geometric.utils")
    ei = torch.tensor([[0, 2, 2, 3, 3], [1, 1, 0, 2, 5]])  # target 5: no loop (min(M, N) = 4)
    ea = _rand(5, 2).requires_grad_()
    e2, a2 = at.add_self_loops(ei, (4, 6), ea, "mean")
    assert e2.shape[1] == 5 + 4 and torch.equal(e2[:, 5:], torch.arange(4).repeat(2, 1))
    torch.testing.assert_close(a2[5 + 1], (ea[0] + ea[1]) / 2)
    torch.testing.assert_close(a2[5 + 3], torch.zeros(2, dtype=DT))
    (a2 ** 2).sum().backward()
    ref = ea.detach().clone().requires_grad_()
    e1, a1 = utils.add_self_loops(ei[:, :4], ref[:4], fill_value="mean", num_nodes=4)
    (torch.cat([a1, ref[4:]]) ** 2).sum().backward()  # PyG: the same without the 5th target
    torch.testing.assert_close(ea.grad, ref.grad)
    with pytest.raises(ValueError, match="fill_value"):
        at.add_self_loops(ei, 6, ea, "median")
    with pytest.raises(ValueError, match="one row per edge"):
        at.add_self_loops(ei, 6, ea[:3])
    with pytest.raises(ValueError, match="num_nodes"):
        at.add_self_loops(ei, -1)


def test_edge_term_inputs_are_checked():
    t = at.EdgeTerm(2, 3)
    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="edge_attr"):
        t.edge_scores(2, 2, ei)
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        t.edge_scores(2, 2, ei, torch.randn(3, 3))
    with pytest.raises(TypeError, match="floating"):
        t.edge_scores(2, 2, ei, torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="every pair"):
        t(2, 2, edge_attr=torch.randn(2, 3))
    one = at.EdgeTerm(2, 1)
    torch.testing.assert_close(one.edge_scores(2, 2, ei, torch.tensor([1.0, 2.0])),
                               torch.tensor([[1.0], [2.0]]) @ one.weight.detach().t())
    with pytest.raises(ValueError, match="per-head edge keys"):
        at.EdgeDot(2, 3).edge_scores(torch.randn(2, 2, 3), torch.randn(2, 2, 3), ei,
                                     torch.randn(2, 3))


# -- the graph-attention basis: edge messages, weights before dropout ----------------------------
def test_graph_attention_edge_messages_and_dropout():
    torch.manual_seed(5)
    M, N, K, C = 6, 5, 2, 3
    ei = _graph(M, N, 15, 5)
    alpha = torch.rand(ei.shape[1], K, dtype=DT)
    b = at.GraphAttention(ei, alpha, M, N)
    vals, nodes = _rand(ei.shape[1], K, C), _rand(M, K, C)
    want = torch.zeros(N, K, C, dtype=DT)
    for e in range(ei.shape[1]):
        want[ei[1, e]] += alpha[e].unsqueeze(-1) * (vals[e] + nodes[ei[0, e]])
    torch.testing.assert_close(b.propagate_edges(vals, nodes=nodes)[0], want)
    torch.testing.assert_close(b.propagate_edges(vals)[0] + b.propagate_heads(nodes[None])[0],
                               want)
    bb = at.GraphAttention(ei, torch.stack([alpha, 2 * alpha]), M, N)
    torch.testing.assert_close(bb.propagate_edges(vals)[1], 2 * b.propagate_edges(vals)[0])
    with pytest.raises(ValueError, match="values"):
        b.propagate_edges(_rand(3, K, C))
    with pytest.raises(ValueError, match="nodes"):
        b.propagate_edges(vals, nodes=_rand(M + 1, K, C))
    mech = at.Softmax(at.LeakyReLU(at.GraphMasked(at.GATScores(K, C).to(DT), ei)))
    h1, h2 = _rand(M, K, C), _rand(N, K, C)
    dropped = at.attention_basis(mech, h1, h2, dropout=0.5)
    kept = dropped.probabilities
    torch.testing.assert_close(kept[0], at.attention_basis(mech, h1, h2).alpha[0])
    zeroed = dropped.alpha == 0
    assert zeroed.any() and torch.allclose(dropped.alpha[~zeroed], 2 * kept[~zeroed])
    with pytest.raises(ValueError, match="dropout"):
        at.attention_basis(mech, h1, h2, dropout=1.0)
    with pytest.raises(TypeError, match="Mechanism"):
        at.attention_basis(torch.nn.Linear(2, 2), h1, h2)


# -- issue 25: a batched attention basis beside index heads, densified ---------------------------
@pytest.mark.parametrize("B", [1, 3])
def test_batched_attention_stack_materialises_and_runs_basis_param(B):
    torch.manual_seed(6)
    x = _rand(B, 5, 4)
    att = at.attention_basis(at.Softmax(at.Masked(at.DotProduct(2, 4, 4, 2).to(DT),
                                                  causal=True)), x, x)
    stack = sc.basis.Stack([att, at.CausalShift(5, [1, 2])])
    theta = _rand(4, 4, 3)
    ref = sc.convolve(x, stack, theta)
    phi = sc.materialize(stack, theta)
    assert phi.shape == ((B,) if B > 1 else ()) + (5, 5, 4, 3)
    y = torch.einsum("bmp,bmnpq->bnq", x, phi if B > 1 else phi.expand(1, *phi.shape))
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(sc.convolve(x, stack, theta, route="basis_param"), ref)
    # a batched attention basis alone: one map per item
    phi_att = sc.materialize(att, theta[:2])
    dense = att.to_dense()
    assert dense.shape == ((B,) if B > 1 else ()) + (2, 5, 5)
    torch.testing.assert_close(sc.convolve(x, att, theta[:2], route="basis_param"),
                               torch.einsum("bmp,bmnpq->bnq", x, phi_att if B > 1 else
                                            phi_att.expand(1, *phi_att.shape)))


def test_batched_attention_stack_densifies_to_b_k_m_n():
    x = _rand(3, 5, 4)
    att = at.attention_basis(at.Softmax(at.DotProduct(2, 4, 4, 2).to(DT)), x, x)
    stack = sc.basis.Stack([att, at.CausalShift(5, [1, 2])])
    dense = stack.to_dense()
    assert dense.shape == (3, 4, 5, 5)
    torch.testing.assert_close(dense[:, :2], att.to_dense())
    torch.testing.assert_close(dense[1, 2:], at.CausalShift(5, [1, 2]).to_dense().to(DT))

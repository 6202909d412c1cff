"""Attention mechanisms, masks and bases against their dense formulas (float64)."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv import attention as at
from structconv.attention.basis import _EdgeSpMM

DT = torch.float64


def _rand(*shape):
    return torch.randn(*shape, dtype=DT)


def _biaffine_ref(x1, x2, Lambda, mu, nu, xi):
    # the paper's element-wise definition, one term at a time
    M, N = x1.shape[0], x2.shape[0]
    K = next(t.shape[0] for t in (Lambda, mu, nu, xi) if t is not None)
    out = torch.zeros(K, M, N, dtype=DT)
    for k in range(K):
        for m in range(M):
            for n in range(N):
                v = 0.0
                if Lambda is not None:
                    v += (x1[m] @ Lambda[k] @ x2[n]).item()
                if mu is not None:
                    v += (mu[k] @ x1[m]).item()
                if nu is not None:
                    v += (nu[k] @ x2[n]).item()
                if xi is not None:
                    v += xi[k].item()
                out[k, m, n] = v
    return out


@settings(max_examples=12, deadline=None)
@given(K=st.integers(1, 3), M=st.integers(1, 4), N=st.integers(1, 5), P=st.integers(1, 3),
       Q=st.integers(1, 4), terms=st.lists(st.booleans(), min_size=4, max_size=4)
       .filter(any), seed=st.integers(0, 2**16))
def test_biaffine_matches_elementwise_definition(K, M, N, P, Q, terms, seed):
    torch.manual_seed(seed)
    x1, x2 = _rand(M, P), _rand(N, Q)
    parts = [_rand(K, P, Q), _rand(K, P), _rand(K, Q), _rand(K)]
    args = [p if t else None for p, t in zip(parts, terms)]
    out = at.biaffine(x1, x2, *args)
    assert out.shape == (K, M, N)
    torch.testing.assert_close(out, _biaffine_ref(x1, x2, *args))
    # a leading batch dim gives the same per item
    xb1, xb2 = torch.stack([x1, 2 * x1]), torch.stack([x2, -x2])
    outb = at.biaffine(xb1, xb2, *args)
    assert outb.shape == (2, K, M, N)
    torch.testing.assert_close(outb[1], _biaffine_ref(2 * x1, -x2, *args))


def test_biaffine_errors_name_shapes():
    x1, x2 = _rand(3, 4), _rand(5, 2)
    with pytest.raises(ValueError, match="Lambda"):
        at.biaffine(x1, x2, Lambda=_rand(2, 4, 3))
    with pytest.raises(ValueError, match="at least one"):
        at.biaffine(x1, x2)
    with pytest.raises(ValueError, match="disagree on K"):
        at.biaffine(x1, x2, mu=_rand(2, 4), nu=_rand(3, 2))
    with pytest.raises(ValueError, match="x1"):
        at.biaffine(_rand(3), x2, xi=_rand(1))


def test_transformer_lambda_factorisation_is_the_qk_scores():
    # eq. "transformer-lambda": biaffine with Λ_k = Λ_key Λ_queryᵀ (scaled) equals q·k / sqrt(D)
    torch.manual_seed(0)
    mech = at.DotProduct(3, 5, 4, 2, bias=True).to(DT)
    with torch.no_grad():
        mech.key_bias.normal_()
        mech.query_bias.normal_()
    x1, x2 = _rand(6, 5), _rand(7, 4)
    k = torch.einsum("mp,kpd->kmd", x1, mech.key) + mech.key_bias[:, None]
    q = torch.einsum("nq,kqd->knd", x2, mech.query) + mech.query_bias[:, None]
    ref = k @ q.transpose(1, 2) / math.sqrt(2)
    torch.testing.assert_close(mech(x1, x2), ref)
    torch.testing.assert_close(at.biaffine(x1, x2, **mech.as_biaffine()), ref)
    ei = torch.tensor([[0, 5, 2, 2], [6, 0, 3, 3]])
    torch.testing.assert_close(mech.edge_scores(x1, x2, ei), ref[:, ei[0], ei[1]].t())


def test_biaffine_module_edge_scores_match_dense():
    torch.manual_seed(1)
    mech = at.Biaffine(2, 3, 4).to(DT)
    with torch.no_grad():
        mech.xi.normal_()
    x1, x2 = _rand(2, 5, 3), _rand(2, 6, 4)
    ei = torch.randint(0, 5, (2, 9))
    dense = mech(x1, x2)
    torch.testing.assert_close(dense, at.biaffine(x1, x2, mech.Lambda, mech.mu, mech.nu, mech.xi))
    torch.testing.assert_close(mech.edge_scores(x1, x2, ei), dense[:, :, ei[0], ei[1]]
                               .transpose(1, 2))


def test_masks_and_nan_free_softmax():
    H = at.causal_mask(3, 4)
    assert H.shape == (3, 4) and H[0, 0] == 0 and H[2, 1] == float("-inf") and H[2, 2] == 0
    assert at.causal_mask(3, 3, offset=1)[1, 0] == 0
    pm = at.padding_mask(torch.tensor([[False, True, False]]))
    assert pm.shape == (1, 1, 3, 1) and torch.isneginf(pm[0, 0, 1, 0])
    gm = at.graph_mask(torch.tensor([[0, 2], [1, 1]]), 3, 2)
    assert gm.shape == (3, 2) and (gm == 0).sum() == 2 and gm[2, 1] == 0
    tm = at.from_torch_mask(torch.tensor([[True, False, False]]))  # (L=1, S=3) -> (M=3, N=1)
    assert tm.shape == (3, 1) and torch.isneginf(tm[0, 0]) and tm[1, 0] == 0
    with pytest.raises(TypeError):
        at.log_mask(torch.zeros(2))
    with pytest.raises(ValueError, match="outside"):
        at.graph_mask(torch.tensor([[0], [5]]), 3, 3)
    s = _rand(2, 4, 3).requires_grad_()
    mask = torch.zeros(4, 3, dtype=DT)
    mask[:, 1] = float("-inf")  # column 1 entirely masked
    mask[0, 2] = float("-inf")
    p = at.softmax_inputs(s + mask)
    assert not p.isnan().any()
    assert (p[:, :, 1] == 0).all()
    torch.testing.assert_close(p[:, :, 0], torch.softmax(s[:, :, 0], -1))
    torch.testing.assert_close(p[:, 1:, 2], torch.softmax(s[:, 1:, 2], -1))
    torch.testing.assert_close(p.sum(1)[:, [0, 2]], torch.ones(2, 2, dtype=DT))
    (p * _rand(2, 4, 3)).sum().backward()
    assert torch.isfinite(s.grad).all() and (s.grad[:, :, 1] == 0).all()
    q = at.softmax_outputs(s.detach() + mask)
    torch.testing.assert_close(q[:, 1], torch.softmax(s.detach()[:, 1] + mask[1], -1))


def test_edge_softmax_equals_dense_softmax_and_isolated_nodes_are_zero():
    torch.manual_seed(2)
    ei = torch.unique(torch.randint(0, 5, (2, 12)), dim=1)  # nodes 5, 6 receive nothing
    s = _rand(ei.shape[1], 3)
    alpha = at.edge_softmax(s, ei[1], 7)
    dense = torch.full((3, 7, 7), float("-inf"), dtype=DT)
    dense[:, ei[0], ei[1]] = s.t()
    ref = at.softmax_inputs(dense)[:, ei[0], ei[1]].t()
    torch.testing.assert_close(alpha, ref)
    # an edge scored -inf everywhere at a node gives zeros, not NaN
    s2 = s.clone()
    s2[ei[1] == ei[1][0]] = float("-inf")
    assert not at.edge_softmax(s2, ei[1], 7).isnan().any()


def _dot_case(B=2, K=3, M=6, N=5, D=4, C=2, seed=0):
    torch.manual_seed(seed)
    return _rand(B, K, N, D), _rand(B, K, M, D), _rand(B, M, K, C)


def _dense_dot(q, k, mask_mn=None, causal=False, scale=None):
    s = (k @ q.transpose(-1, -2)) * (scale or 1 / math.sqrt(q.shape[-1]))  # (B, K, M, N)
    if causal:
        s = s + at.causal_mask(s.shape[-2], s.shape[-1], dtype=DT)
    if mask_mn is not None:
        s = s + mask_mn
    return at.softmax_inputs(s)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["none", "float", "bool", "dead"])
def test_dot_product_basis_densified_equals_dense_formula(kind, causal):
    q, k, z = _dot_case()
    M, N = k.shape[2], q.shape[2]
    mask = None
    if kind == "float":
        mask = _rand(1, 1, M, N)
    elif kind == "bool":
        mask = torch.rand(2, 1, M, N) < 0.6
    elif kind == "dead":
        mask = torch.zeros(2, 3, M, N, dtype=DT)
        mask[0, 1, :, 2] = float("-inf")  # output 2 of head 1, item 0: no input allowed
        mask[1, :, 1:, 0] = float("-inf")
    basis = at.DotProductAttention(q, k, mask, causal=causal)
    fm = at.log_mask(mask, DT) if kind == "bool" else mask
    ref = _dense_dot(q, k, fm, causal)
    A = basis.to_dense()
    assert A.shape == (2, 3, M, N) and not A.isnan().any()
    torch.testing.assert_close(A, ref)
    out = basis.propagate_heads(z)
    assert not out.isnan().any()
    torch.testing.assert_close(out, torch.einsum("bkmn,bmkc->bnkc", ref, z))
    if kind == "dead":
        assert (out[0, 2, 1] == 0).all() and (A[0, 1, :, 2] == 0).all()


def test_dot_product_basis_gradients_and_dead_columns():
    q, k, z = _dot_case(B=1, K=2, M=4, N=3, D=2, C=2, seed=3)
    mask = torch.zeros(1, 1, 4, 3, dtype=DT)
    mask[..., 1] = float("-inf")
    q.requires_grad_()
    k.requires_grad_()
    z.requires_grad_()

    def f(q, k, z):
        return at.DotProductAttention(q, k, mask).propagate_heads(z)

    assert torch.autograd.gradcheck(f, (q, k, z))
    f(q, k, z).sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[:, :, 1] == 0).all()


def test_convolve_with_attention_basis_all_routes_and_lowrank():
    torch.manual_seed(4)
    x = _rand(2, 6, 5)
    mech = at.Softmax(at.Masked(at.DotProduct(3, 5, 5, 2).to(DT), causal=True))
    basis = at.attention_basis(mech, x, x)  # self-attention
    assert isinstance(basis, at.DotProductAttention)
    A = mech(x, x)
    th = sc.params.LowRank(3, 5, 4, 2).to(DT)
    ref = torch.einsum("bkmn,bmp,kpq->bnq", A, x, th())
    for route in ("input_param", "basis_input", "lowrank_heads", "auto"):
        torch.testing.assert_close(sc.convolve(x, basis, th, route=route), ref)
    # a per-item basis is a (B, K, M, N) tensor; item 0 alone through a dense basis
    torch.testing.assert_close(sc.convolve(x[:1], A[0].detach(), th().detach()),
                               ref[:1].detach())
    with pytest.raises(ValueError, match="batch"):
        basis.propagate_heads(_rand(3, 6, 3, 2))


def test_attention_basis_dispatch_and_generic_dense():
    torch.manual_seed(5)
    x1, x2 = _rand(4, 3), _rand(5, 2)
    bi = at.Biaffine(2, 3, 2).to(DT)
    mech = at.Softmax(at.LeakyReLU(bi, 0.1), over="outputs")
    basis = at.attention_basis(mech, x1, x2)
    assert isinstance(basis, at.AttentionBasis)
    torch.testing.assert_close(basis.to_dense(), mech(x1, x2))
    z = _rand(1, 4, 2, 3)
    torch.testing.assert_close(basis.propagate_heads(z),
                               torch.einsum("kmn,bmkc->bnkc", mech(x1, x2), z))
    torch.testing.assert_close(basis.propagate_sum(z),
                               torch.einsum("kmn,bmkc->bnc", mech(x1, x2), z))
    # cross-attention through the SDPA path: x1 the main input, x2 the outputs' content
    dp = at.Softmax(at.DotProduct(2, 3, 2, 4).to(DT))
    b2 = at.attention_basis(dp, x1, x2)
    assert isinstance(b2, at.DotProductAttention)
    torch.testing.assert_close(b2.to_dense(), dp(x1, x2))


def _graph(seed, M=7, E=14):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, M - 2, (2, E), generator=g)  # the last two nodes are isolated


def test_graph_attention_basis_densified_equals_dense_gat_formula():
    torch.manual_seed(6)
    ei = torch.unique(_graph(6), dim=1)
    gat = at.GATScores(3, 4).to(DT)
    mech = at.Softmax(at.LeakyReLU(at.GraphMasked(gat, ei), 0.2))
    h = _rand(7, 3, 4)
    basis = at.attention_basis(mech, h, h)
    assert isinstance(basis, at.GraphAttention)
    dense = mech(h, h)
    # dense GAT: per head, biaffine with Λ = 0, μ = att_src, ν = att_dst on h_k = xΘ_k
    for kk in range(3):
        s = at.biaffine(h[:, kk], h[:, kk], mu=gat.mu[kk:kk + 1], nu=gat.nu[kk:kk + 1])[0]
        ref = at.softmax_inputs(torch.nn.functional.leaky_relu(s, 0.2) + at.graph_mask(ei, 7))
        torch.testing.assert_close(dense[kk], ref)
    torch.testing.assert_close(basis.to_dense(), dense)
    assert (dense[:, :, 5:] == 0).all() and not dense.isnan().any()
    z = _rand(2, 7, 3, 5)
    torch.testing.assert_close(basis.propagate_heads(z), torch.einsum("kmn,bmkc->bnkc", dense, z))
    torch.testing.assert_close(basis.propagate(z[:, :, 0]),
                               torch.einsum("kmn,bmc->bnkc", dense, z[:, :, 0]))
    th = _rand(3, 5, 2)
    torch.testing.assert_close(sc.convolve(z[:, :, 0], basis, th),
                               torch.einsum("kmn,bmp,kpq->bnq", dense, z[:, :, 0], th))


def test_graph_attention_duplicates_bipartite_and_batched_alpha():
    ei = torch.tensor([[0, 0, 2, 1], [1, 1, 0, 2]])  # edge 0 -> 1 twice; M = 3, N = 4
    alpha = _rand(2, 4, 2)  # per-item weights (B, E, K)
    b = at.GraphAttention(ei, alpha, 3, 4)
    A = b.to_dense()
    assert A.shape == (2, 2, 3, 4)
    torch.testing.assert_close(A[1, 0, 0, 1], alpha[1, 0, 0] + alpha[1, 1, 0])
    z = _rand(2, 3, 2, 3)
    torch.testing.assert_close(b.propagate_heads(z), torch.einsum("bkmn,bmkc->bnkc", A, z))
    with pytest.raises(ValueError, match="outside"):
        at.GraphAttention(torch.tensor([[0], [4]]), _rand(1, 1), 3, 4)
    with pytest.raises(ValueError, match="E=4"):
        at.GraphAttention(ei, _rand(3, 2), 3, 4)
    empty = at.GraphAttention(torch.zeros(2, 0, dtype=torch.long), _rand(0, 2), 3, 4)
    assert (empty.propagate_heads(_rand(1, 3, 2, 2)) == 0).all()


def test_edge_spmm_gradcheck_and_graph_basis_gradients():
    ei = _graph(7)
    st_ = at.GraphStructure(ei, 7, 7, 2)
    alpha = torch.rand(ei.shape[1] * 2, dtype=DT, requires_grad=True)
    Z = _rand(14, 3).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, Z: _EdgeSpMM.apply(a, Z, st_), (alpha, Z))
    s = _rand(ei.shape[1], 2).requires_grad_()
    z = _rand(2, 7, 2, 3).requires_grad_()

    def f(s, z):
        return at.GraphAttention.from_scores(ei, s, 7).propagate_heads(z)

    assert torch.autograd.gradcheck(f, (s, z))


def test_shift_basis_and_mixed_stack():
    S = at.shift_basis(5, (0, 1, -2))
    A = S.to_dense()
    assert A.shape == (3, 5, 5)
    torch.testing.assert_close(A[0], torch.eye(5))
    assert A[1, 2, 3] == 1 and A[1, 3, 2] == 0 and A[1].sum() == 4  # m = n - 1
    assert A[2, 3, 1] == 1 and A[2].sum() == 3  # m = n + 2
    torch.manual_seed(8)
    x = _rand(2, 5, 4)
    mech = at.Softmax(at.Masked(at.DotProduct(2, 4, 4, 2).to(DT), causal=True))
    att = at.attention_basis(mech, x, x)
    stack = sc.basis.Stack([att, at.shift_basis(5, (1, 2), dtype=DT)])
    th = sc.params.LowRank(4, 4, 3, 2).to(DT)
    dense = torch.cat([mech(x, x), stack.parts[1].to_dense().expand(2, 2, 5, 5)], 1)
    ref = torch.einsum("bkmn,bmp,kpq->bnq", dense, x, th())
    torch.testing.assert_close(sc.convolve(x, stack, th, route="lowrank_heads"), ref)
    torch.testing.assert_close(sc.convolve(x, stack, th), ref)
    with pytest.raises(ValueError):
        at.shift_basis(0, (1,))


def test_bad_inputs_raise_clear_errors():
    q, k, _ = _dot_case()
    with pytest.raises(ValueError, match="disagree"):
        at.DotProductAttention(q, k[..., :3])
    with pytest.raises(ValueError, match="broadcast"):
        at.DotProductAttention(q, k, torch.zeros(4, 4, dtype=DT))
    with pytest.raises(ValueError, match="z"):
        at.DotProductAttention(q, k).propagate_heads(_rand(2, 6, 2, 2))
    with pytest.raises(ValueError, match="over"):
        at.Softmax(at.Biaffine(1, 2, 2), over="rows")
    with pytest.raises(TypeError):
        at.Masked(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="AttentionBasis"):
        at.AttentionBasis(_rand(3, 3))


@pytest.mark.parametrize("average", [False, True])
def test_block_weights_equal_dense_and_gradcheck(monkeypatch, average):
    # tiny blocks so that every item spans several row blocks
    monkeypatch.setattr(at.basis, "BLOCK_ELEMENTS", 5)
    q, k, _ = _dot_case(B=2, K=2, M=5, N=4, D=3, seed=9)
    mask = torch.zeros(2, 1, 5, 4, dtype=DT)
    mask[1, 0, :, 2] = float("-inf")  # a dead query
    mask[0, 0, 3, 1] = float("-inf")
    for causal in (False, True):
        basis = at.DotProductAttention(q, k, mask, causal=causal)
        ref = _dense_dot(q, k, mask, causal).transpose(-1, -2)  # (B, K, N, M)
        w = basis.weights(average=average)
        torch.testing.assert_close(w, ref.mean(1) if average else ref)
    qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()

    def f(q, k):
        return at.DotProductAttention(q, k, mask, causal=True).weights(average=average)

    assert torch.autograd.gradcheck(f, (qq, kk))
    # a basis shared by the batch (B = 1 key) accumulates its gradient
    k1 = k[:1].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k: at.DotProductAttention(q, k).weights(average),
                                    (qq, k1))


def test_block_attention_output_and_weights_together(monkeypatch):
    monkeypatch.setattr(at.basis, "BLOCK_ELEMENTS", 7)
    q, k, z = _dot_case(B=2, K=2, M=5, N=4, D=3, C=2, seed=10)
    mask = torch.zeros(2, 1, 5, 4, dtype=DT)
    mask[0, 0, :, 3] = float("-inf")  # a dead query
    # a float mask takes the fused kernel + log-sum-exp path, a bool one the block path
    for causal, average, as_bool in itertools.product((False, True), (False, True),
                                                      (False, True)):
        m = torch.isfinite(mask) if as_bool else mask
        basis = at.DotProductAttention(q, k, m, causal=causal)
        out, w = basis.propagate_heads_and_weights(z, average)
        ref = _dense_dot(q, k, mask, causal)
        torch.testing.assert_close(out, torch.einsum("bkmn,bmkc->bnkc", ref, z))
        rw = ref.transpose(-1, -2)
        torch.testing.assert_close(w, rw.mean(1) if average else rw)
    args = [t.clone().requires_grad_() for t in (q, k, z)]

    def f(q, k, z):
        out, w = at.DotProductAttention(q, k, mask, causal=True).propagate_heads_and_weights(
            z, True)
        return out, w

    assert torch.autograd.gradcheck(f, args)


def test_block_attention_function_gradcheck_with_values(monkeypatch):
    # the fused block path (used without autograd) still has an exact backward pass
    monkeypatch.setattr(at.basis, "BLOCK_ELEMENTS", 6)
    q, k, z = _dot_case(B=1, K=2, M=4, N=3, D=2, C=2, seed=11)
    mask = torch.zeros(1, 1, 3, 4, dtype=DT)
    mask[..., 1, :] = float("-inf")  # a dead query (SDPA orientation: row n = 1)
    dead = at.dead_columns(mask, -1)
    args = [q.requires_grad_(), k.requires_grad_(), z.transpose(1, 2).contiguous()
            .requires_grad_()]
    fn = at.basis._BlockAttention.apply
    assert torch.autograd.gradcheck(
        lambda q, k, v: fn(q, k, v, mask.masked_fill(dead, 0.0), dead, True, 0.7, True), args)


def test_attention_heads_stacked_with_a_causal_grid_basis():
    # the paper's proposal: index-based heads (a 1-d causal grid: A_k[m, n] = 1 iff
    # m = n - 2 + k) beside content-based heads, each part on its own kernel
    torch.manual_seed(12)
    x = _rand(2, 6, 4)
    mech = at.Softmax(at.Masked(at.DotProduct(2, 4, 4, 2).to(DT), causal=True))
    grid = sc.basis.Grid((6,), 3, padding=((2, 0),))
    stack = sc.basis.Stack([at.attention_basis(mech, x, x), grid])
    th = sc.params.LowRank(5, 4, 3, 2).to(DT)
    dense = torch.cat([mech(x, x), grid.to_dense().to(DT).expand(2, 3, 6, 6)], 1)
    assert (grid.to_dense()[0] == torch.diag(torch.ones(4), 2)).all()
    ref = torch.einsum("bkmn,bmp,kpq->bnq", dense, x, th())
    torch.testing.assert_close(sc.convolve(x, stack, th, route="lowrank_heads"), ref)
    torch.testing.assert_close(sc.convolve(x, stack, th()), ref)

"""Attention layers against torch.nn and PyG (float64, eval), and the paper's factorisations."""

import itertools
import math

import pytest
import torch
from torch import nn

import structconv as sc
from structconv import attention as at

DT = torch.float64


def _rand(*shape):
    return torch.randn(*shape, dtype=DT)


def _perturb(module, scale=0.2):
    # torch zero-initialises the biases: make every parameter count in the comparison
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))
    return module


def _close_or_nan(ref, out):
    finite = ~ref.isnan()
    torch.testing.assert_close(out[finite], ref[finite], rtol=1e-10, atol=1e-12)
    assert not out.isnan().any()


MHA_OPTIONS = list(itertools.product([True, False], [False, True], [False, True],
                                     [None, (5, 7)], [False, True]))


@pytest.mark.parametrize("bias,add_bias_kv,add_zero_attn,kvdim,batch_first", MHA_OPTIONS)
def test_multihead_attention_matches_torch_for_every_option(bias, add_bias_kv, add_zero_attn,
                                                            kvdim, batch_first):
    torch.manual_seed(hash((bias, add_bias_kv, add_zero_attn, kvdim, batch_first)) % 1000)
    kdim, vdim = kvdim or (None, None)
    ref = nn.MultiheadAttention(12, 3, dropout=0.3, bias=bias, add_bias_kv=add_bias_kv,
                                add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim,
                                batch_first=batch_first, dtype=DT)
    ref = _perturb(ref).eval()
    mine = sc.nn.from_torch(ref)
    assert isinstance(mine, sc.nn.MultiheadAttention) and not mine.training
    B, L, S = 2, 4, 5
    q, k, v = _rand(B, L, 12), _rand(B, S, kdim or 12), _rand(B, S, vdim or 12)
    if not batch_first:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    kpm = torch.rand(B, S) < 0.4
    am = torch.rand(L, S) < 0.4
    masks = [{}, {"key_padding_mask": kpm}, {"attn_mask": am},
             {"attn_mask": am, "key_padding_mask": kpm},
             {"attn_mask": _rand(L, S)},
             {"attn_mask": torch.rand(B * 3, L, S) < 0.3},
             {"key_padding_mask": torch.zeros(B, S, dtype=DT).masked_fill(kpm, -math.inf)}]
    # average_attn_weights only matters with need_weights
    for mask, (need_weights, average) in itertools.product(
            masks, [(True, True), (True, False), (False, True)]):
        o1, w1 = ref(q, k, v, need_weights=need_weights, average_attn_weights=average, **mask)
        o2, w2 = mine(q, k, v, need_weights=need_weights, average_attn_weights=average, **mask)
        _close_or_nan(o1, o2)
        if need_weights:
            assert w2.shape == w1.shape
            _close_or_nan(w1, w2)
        else:
            assert w1 is None and w2 is None
    # unbatched call
    u = (q[:, 0], k[:, 0], v[:, 0]) if not batch_first else (q[0], k[0], v[0])
    for need_weights in (True, False):
        o1, w1 = ref(*u, key_padding_mask=kpm[0], need_weights=need_weights)
        o2, w2 = mine(*u, key_padding_mask=kpm[0], need_weights=need_weights)
        _close_or_nan(o1, o2)


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_self_attention_causal_and_fast_path(need_weights):
    torch.manual_seed(1)
    ref = _perturb(nn.MultiheadAttention(8, 2, batch_first=True, dtype=DT)).eval()
    mine = sc.nn.from_torch(ref)
    x = _rand(3, 6, 8)
    cm = nn.Transformer.generate_square_subsequent_mask(6, dtype=DT)
    kpm = torch.zeros(3, 6, dtype=DT)
    kpm[:, -1] = -math.inf  # a float padding mask, like the float causal mask
    for kw in ({"attn_mask": cm, "is_causal": True},
               {"attn_mask": cm, "is_causal": True, "key_padding_mask": kpm}):
        _close_or_nan(ref(x, x, x, need_weights=need_weights, **kw)[0],
                      mine(x, x, x, need_weights=need_weights, **kw)[0])
    with torch.no_grad():  # torch's inference fast path
        _close_or_nan(ref(x, x, x, need_weights=need_weights)[0],
                      mine(x, x, x, need_weights=need_weights)[0])
    # is_causal without a mask: torch refuses, structconv builds the causal mask
    torch.testing.assert_close(mine(x, x, x, is_causal=True, need_weights=need_weights)[0],
                               ref(x, x, x, attn_mask=cm, need_weights=need_weights)[0])


def test_fully_masked_queries_are_finite_zero_attention_columns():
    torch.manual_seed(2)
    ref = _perturb(nn.MultiheadAttention(8, 2, batch_first=True, dtype=DT)).eval()
    mine = sc.nn.from_torch(ref)
    x = _rand(2, 5, 8).requires_grad_()
    am = torch.zeros(5, 5, dtype=torch.bool)
    am[1] = True  # query 1 may attend nothing
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1] = True  # item 1: every key is padding
    for need_weights in (True, False):
        o1, _ = ref(x, x, x, attn_mask=am, key_padding_mask=kpm, need_weights=need_weights)
        o2, w2 = mine(x, x, x, attn_mask=am, key_padding_mask=kpm, need_weights=need_weights)
        # torch gives NaN at least where it builds the weights (CPU SDPA happens to give 0)
        assert o1.isnan().any() or not need_weights
        assert not o2.isnan().any()
        bias = ref.out_proj.bias  # zero attention: the heads give 0, only the out bias is left
        torch.testing.assert_close(o2[0, 1], bias)
        torch.testing.assert_close(o2[1], bias.expand(5, 8))
        _close_or_nan(o1, o2)
        if need_weights:
            assert (w2[1] == 0).all() and (w2[0, 1] == 0).all()
        x.grad = None
        o2.sum().backward()
        assert torch.isfinite(x.grad).all()


def test_multihead_attention_gradients_match_torch():
    torch.manual_seed(3)
    ref = _perturb(nn.MultiheadAttention(8, 2, kdim=6, vdim=5, dtype=DT))
    mine = sc.nn.from_torch(ref)
    q, k, v = _rand(4, 2, 8), _rand(3, 2, 6), _rand(3, 2, 5)
    kpm = torch.tensor([[False, False, True], [False, False, False]])
    for need_weights in (True, False):
        ref.zero_grad()
        mine.zero_grad()
        ins = [t.clone().requires_grad_() for t in (q, k, v)]
        ins2 = [t.clone().requires_grad_() for t in (q, k, v)]
        for module, args in ((ref, ins), (mine, ins2)):
            torch.manual_seed(0)
            out, w = module(*args, key_padding_mask=kpm, need_weights=need_weights)
            loss = (out ** 2).sum()
            if need_weights:  # the weights' own backward pass
                loss = loss + (w * torch.randn_like(w)).sum()
            loss.backward()
        for a, b in zip(ins, ins2):
            torch.testing.assert_close(a.grad, b.grad)
        for (n1, p1), (n2, p2) in zip(ref.named_parameters(), mine.named_parameters()):
            assert n1 == n2
            torch.testing.assert_close(p1.grad, p2.grad)


def test_transformer_factorisations_lambda_and_theta():
    # eq. "transformer-lambda": the MHA scores are bi-affine in (key, query); eq.
    # "transformer-theta": materialize(A, LowRank(value, out)) is out-proj ∘ value-proj
    torch.manual_seed(4)
    ref = _perturb(nn.MultiheadAttention(6, 2, batch_first=True, dtype=DT)).eval()
    mine = sc.nn.from_torch(ref)
    x = _rand(5, 6)
    mech = mine.mechanism()
    scores = at.biaffine(x, x, **mech.as_biaffine())  # (K, M, N): key m, query n
    _, w = ref(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(at.softmax_inputs(scores).transpose(1, 2), w)
    basis = at.attention_basis(at.Softmax(mech), x, x)
    theta = mine.value_out()
    assert sum(p.numel() for p in theta.parameters()) == 2 * 3 * (6 + 6)
    Wv = ref.in_proj_weight[12:]
    torch.testing.assert_close(theta(), torch.stack(
        [Wv[3 * h:3 * h + 3].t() @ ref.out_proj.weight[:, 3 * h:3 * h + 3].t()
         for h in range(2)]))
    phi = sc.materialize(basis, theta)  # (M, N, P, Q)
    # softmax columns sum to one: the value bias passes through as a constant
    const = ref.out_proj.weight @ ref.in_proj_bias[12:] + ref.out_proj.bias
    y = torch.einsum("mp,mnpq->nq", x, phi) + const
    torch.testing.assert_close(y, ref(x, x, x)[0])
    torch.testing.assert_close(sc.convolve(x, basis, theta, route="lowrank_heads") + const, y)


def test_multihead_attention_training_dropout_and_errors():
    torch.manual_seed(5)
    mine = sc.nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True)
    x = torch.randn(2, 4, 8)
    o, w = mine(x, x, x)
    assert o.shape == (2, 4, 8) and w.shape == (2, 4, 4)
    o.sum().backward()
    assert mine.in_proj_weight.grad is not None
    o2, _ = mine(x, x, x, need_weights=False)
    assert torch.isfinite(o2).all()
    with pytest.raises(ValueError, match="divisible"):
        sc.nn.MultiheadAttention(7, 2)
    with pytest.raises(ValueError, match="attn_mask"):
        mine(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask"):
        mine(x, x, x, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="query"):
        mine(x, x[..., :4], x)


# ------------------------------------------------------------------------------------------------
pyg = pytest.importorskip("torch_geometric", reason="PyG is needed for the GATConv comparison")
from torch_geometric.nn import GATConv  # noqa: E402


def _random_graph(seed, n=9, e=20):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 2, (2, e), generator=g)  # nodes n-2, n-1 isolated
    loops = torch.tensor([[3, 3], [3, 3]])  # existing self loops, duplicated
    return torch.cat([ei, loops, ei[:, :2]], 1)  # and duplicate edges


GAT_OPTIONS = list(itertools.product([1, 3], [True, False], [0.2, 0.6], [True, False],
                                     [True, False], [False, True], ["single", "pair"]))


@pytest.mark.parametrize("heads,concat,slope,loops,bias,residual,inputs", GAT_OPTIONS)
def test_gatconv_matches_pyg_for_every_option(heads, concat, slope, loops, bias, residual,
                                              inputs):
    torch.manual_seed(heads * 7 + concat + int(slope * 10))
    inch = 5 if inputs == "single" else (5, 4)
    ref = GATConv(inch, 4, heads=heads, concat=concat, negative_slope=slope, dropout=0.4,
                  add_self_loops=loops, bias=bias, residual=residual).to(DT)
    ref = _perturb(ref, 0.3).eval()
    mine = sc.nn.from_pyg(ref)
    ei = _random_graph(heads + int(loops))
    x = _rand(9, 5)
    xin = x if inputs == "single" else (x, _rand(9, 4))
    o1, (e1, a1) = ref(xin, ei, return_attention_weights=True)
    o2, (e2, a2) = mine(xin, ei, return_attention_weights=True)
    torch.testing.assert_close(o2, o1)
    assert torch.equal(e1, e2)
    torch.testing.assert_close(a2, a1)
    torch.testing.assert_close(mine(xin, ei), o1)  # cached graph structure, second call


def test_gatconv_gradients_and_paper_view():
    torch.manual_seed(6)
    ref = _perturb(GATConv(5, 3, heads=2, residual=True).to(DT), 0.3)
    mine = sc.nn.from_pyg(ref).eval()
    ref.eval()
    ei = _random_graph(1)
    x = _rand(9, 5)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    (ref(xa, ei) ** 2).sum().backward()
    (mine(xb, ei) ** 2).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad)
    for (n1, p1), (n2, p2) in zip(ref.named_parameters(), mine.named_parameters()):
        assert n1 == n2
        torch.testing.assert_close(p2.grad, p1.grad)
    # the paper's view: A_k = softmax_in(leaky(graph mask + biaffine(xΘ_k, xΘ_k; μ_k, ν_k)))
    eu = torch.unique(ei, dim=1)
    eu = eu[:, eu[0] != eu[1]]
    loops = torch.arange(9).repeat(2, 1)
    eu = torch.cat([eu, loops], 1)
    h = mine.lin(x).view(9, 2, 3)
    mech = mine.mechanism(eu)
    basis = at.attention_basis(mech, h, h)
    y = basis.propagate_heads(h.unsqueeze(0))[0].reshape(9, 6) + mine.res(x) + mine.bias
    torch.testing.assert_close(basis.to_dense(), mech(h, h))
    torch.testing.assert_close(y, ref(x, eu))


def test_gatconv_training_dropout_and_unsupported_options():
    ref = GATConv(4, 2, heads=2, dropout=0.5)
    mine = sc.nn.from_pyg(ref)
    assert mine.training
    out = mine(torch.randn(6, 4), _random_graph(0, n=6, e=8))
    out.sum().backward()
    assert mine.lin.weight.grad is not None
    # edge features convert (tests/attention/test_graph_attention.py); an option that cannot be
    # reproduced is refused by name, and features given to a layer without edge_dim too
    with pytest.raises(ValueError, match="flow"):
        sc.nn.from_pyg(GATConv(4, 2, flow="target_to_source"))
    with pytest.raises(ValueError, match="edge_dim"):
        mine(torch.randn(6, 4), _random_graph(0, n=6, e=8), torch.randn(12, 3))


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first,activation,batch_first",
                         [(False, "relu", False), (True, "gelu", True)])
def test_transformer_layers_match_torch(norm_first, activation, batch_first):
    torch.manual_seed(7)
    kw = dict(dim_feedforward=16, dropout=0.1, activation=activation, batch_first=batch_first,
              norm_first=norm_first, dtype=DT)
    enc = _perturb(nn.TransformerEncoderLayer(8, 2, **kw)).eval()
    dec = _perturb(nn.TransformerDecoderLayer(8, 2, **kw)).eval()
    senc, sdec = sc.nn.from_torch(enc), sc.nn.from_torch(dec)
    assert isinstance(senc, sc.nn.TransformerEncoderLayer)
    assert isinstance(sdec, sc.nn.TransformerDecoderLayer)
    src, tgt = _rand(2, 5, 8), _rand(2, 4, 8)
    if not batch_first:
        src, tgt = src.transpose(0, 1), tgt.transpose(0, 1)
    kpm = torch.tensor([[False] * 4 + [True], [False] * 5])
    cm = nn.Transformer.generate_square_subsequent_mask(4, dtype=DT)
    with torch.no_grad():  # torch's encoder has its own inference fast path too
        torch.testing.assert_close(senc(src, src_key_padding_mask=kpm),
                                   enc(src, src_key_padding_mask=kpm))
    torch.testing.assert_close(senc(src), enc(src))
    a = sdec(tgt, src, tgt_mask=cm, tgt_is_causal=True, memory_key_padding_mask=kpm)
    b = dec(tgt, src, tgt_mask=cm, tgt_is_causal=True, memory_key_padding_mask=kpm)
    torch.testing.assert_close(a, b)


def test_mixed_attention_equals_dense_formula_and_encoder_with_shift_heads():
    torch.manual_seed(8)
    layer = sc.nn.MixedAttention(8, 2, shifts=(1, 2)).to(DT)
    x = _rand(2, 6, 8)
    out, w = layer(x, x, x)
    assert w is None
    basis = layer.basis(x)
    assert isinstance(basis.parts[0], at.DotProductAttention)
    assert isinstance(basis.parts[1], sc.basis.Shift)  # (shift_basis: the one shift basis)
    A_att = at.Softmax(at.Masked(layer.qk, causal=True))(x, x)  # (B, 2, M, N)
    A_shift = at.shift_basis(6, (1, 2), dtype=DT).to_dense().expand(2, 2, 6, 6)
    A = torch.cat([A_att, A_shift], 1)
    ref = torch.einsum("bkmn,bmp,kpq->bnq", A, x, layer.theta()) + layer.bias
    torch.testing.assert_close(out, ref)
    # the future never leaks: changing the last position leaves the others unchanged
    x2 = x.clone()
    x2[:, -1] += 1
    torch.testing.assert_close(layer(x2)[0][:, :-1], out[:, :-1])
    out.sum().backward()
    assert layer.theta.value.grad is not None and layer.qk.key.grad is not None
    enc = sc.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                        batch_first=True, shift_heads=(1,)).to(DT)
    assert isinstance(enc.self_attn, sc.nn.MixedAttention)
    assert enc(x).shape == x.shape
    with pytest.raises(ValueError, match="self-attention"):
        layer(x, _rand(2, 6, 8))

"""The graph-attention functionals (``sc.nn.gat_conv``, ``gatv2_conv``, ``transformer_conv``) on
projected features, against a dense hand computation, heads kept or summed; and the declared
``graph_attention`` layer against the ``sc.nn`` layer whose functional it calls (same weights,
heads summed by hand): edge features, featureless inputs, a sampled block (float64)."""

import pytest
import torch
import torch.nn.functional as F

import structconv as sc
from structconv import attention as att
from structconv import basis as B
from structconv.models.declared import GraphAttentionConv
from structconv.sampling import Block

pytestmark = pytest.mark.usefixtures("float64")  # every test here runs in float64

N, P, Q, D = 9, 5, 3, 4


def _graph(seed: int):
    """A random simple directed graph over N nodes with one self loop per node (the loops the
    layers add), node N-1 reached by its loop only; edge features (E, D), x (N, P)."""
    g = torch.Generator().manual_seed(seed)
    adj = torch.rand(N, N, generator=g) < 0.35
    adj.fill_diagonal_(True)
    adj[:, N - 1] = False
    adj[N - 1, N - 1] = True
    ei = adj.nonzero().t()  # (2, E): row = source m, column = target n
    return ei, torch.randn(ei.shape[1], D, generator=g), torch.randn(N, P, generator=g)


def _dense(ei, values):
    """(N, N, K) of per-edge values (E, K) at [m, n]; -inf where no edge."""
    out = torch.full((N, N, values.shape[-1]), float("-inf"))
    out[ei[0], ei[1]] = values
    return out


def _hand(ei, logits, messages):
    """Σ_m softmax over incoming edges of logits (E, K), times messages (E, K, C): (N, K, C)."""
    alpha = torch.softmax(_dense(ei, logits), dim=0).nan_to_num(0.0)  # (M, N, K)
    msg = torch.zeros(N, N, *messages.shape[1:])
    msg[ei[0], ei[1]] = messages
    return torch.einsum("mnk,mnkc->nkc", alpha, msg)


def _check(out, basis, ref, ei):
    """The output (N, K, C) and the weights the basis holds, one per edge and head."""
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert basis.alpha.shape == (1, ei.shape[1], ref.shape[1])


@pytest.mark.parametrize("H", [1, 3])
@pytest.mark.parametrize("edges", [False, True])
def test_gat_conv_equals_the_hand_computation(H, edges):
    ei, ea, _ = _graph(1)
    g = torch.Generator().manual_seed(2)
    h_src, h_dst = torch.randn(N, H, Q, generator=g), torch.randn(N, H, Q, generator=g)
    scores = att.GATScores(H, Q)
    logits = (h_src[ei[0]] * scores.mu).sum(-1) + (h_dst[ei[1]] * scores.nu).sum(-1)
    if edges:
        term = att.EdgeTerm(H, D)
        scores, logits = scores + term, logits + ea @ term.weight.t()
    ref = _hand(ei, F.leaky_relu(logits, 0.3), h_src[ei[0]])
    kw = dict(edge_attr=ea if edges else None, negative_slope=0.3)
    out, basis = sc.nn.gat_conv(h_src, h_dst, ei, scores, **kw)
    _check(out, basis, ref, ei)
    # the paper's sum of heads, in one product
    summed, _ = sc.nn.gat_conv(h_src, h_dst, ei, scores, sum_heads=True, **kw)
    torch.testing.assert_close(summed, ref.sum(1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("edges", [False, True])
def test_gatv2_conv_equals_the_hand_computation(edges):
    ei, ea, _ = _graph(3)
    H = 2
    g = torch.Generator().manual_seed(4)
    h_src, h_dst = torch.randn(N, H, Q, generator=g), torch.randn(N, H, Q, generator=g)
    scores = att.GATv2Scores(H, Q, edge_dim=D if edges else None, negative_slope=0.1)
    s = h_src[ei[0]] + h_dst[ei[1]]
    if edges:
        s = s + (ea @ scores.edge_weight.t()).view(-1, H, Q)
    logits = (F.leaky_relu(s, 0.1) * scores.att).sum(-1)
    ref = _hand(ei, logits, h_src[ei[0]])
    out, basis = sc.nn.gatv2_conv(h_src, h_dst, ei, scores, edge_attr=ea if edges else None)
    _check(out, basis, ref, ei)
    summed, _ = sc.nn.gatv2_conv(h_src, h_dst, ei, scores, edge_attr=ea if edges else None,
                                 sum_heads=True)
    torch.testing.assert_close(summed, ref.sum(1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("edges", [False, True])
def test_transformer_conv_equals_the_hand_computation(edges):
    ei, _, _ = _graph(5)
    H = 2
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(N, H, Q, generator=g) for _ in range(3))
    ek = torch.randn(ei.shape[1], H, Q, generator=g) if edges else None
    keys = k[ei[0]] + (ek if edges else 0)
    logits = (q[ei[1]] * keys).sum(-1) / Q ** 0.5
    ref = _hand(ei, logits, v[ei[0]] + (ek if edges else 0))
    out, basis = sc.nn.transformer_conv(q, k, v, ei, edge_keys=ek)
    _check(out, basis, ref, ei)
    summed, _ = sc.nn.transformer_conv(q, k, v, ei, edge_keys=ek, sum_heads=True)
    torch.testing.assert_close(summed, ref.sum(1), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"transformer_conv expects query \(N, K, C\), key and "
                                         r"value \(M, K, C\), got \(9, 2, 3\), \(9, 6\)"):
        sc.nn.transformer_conv(q, k.flatten(1), v, ei)


# -- the declared layer = the sc.nn layer it is built from ----------------------------------------
def _declared(spec: dict, ei, ea, Pin=P):
    ctx = B.Structure(edge_index=ei, num_nodes=N, edge_attr=ea)
    torch.manual_seed(0)
    return GraphAttentionConv({"kind": "graph_attention", **spec}, ctx, Pin, Q,
                              {"bias": True}, "model.layers.0.basis")


def _theta(w, H):
    """A projection weight (H*Q, P) as a theta (H, P, Q)."""
    return w.view(H, Q, -1).transpose(1, 2)


def _pair(mode: str, H: int, Pin: int = P, fill="mean"):
    """(declared layer, sc.nn layer) holding the same weights; the declared one sums heads."""
    ei, ea, _ = _graph(7)
    torch.manual_seed(1)
    if mode == "gat":
        ref = sc.nn.GATConv(Pin, Q, heads=H, edge_dim=D, fill_value=fill, bias=False)
        m = _declared({"heads": H, "edge_dim": D, "fill_value": fill}, ei, ea, Pin)
        with torch.no_grad():
            m.param.weight.copy_(_theta(ref.lin.weight, H))
            m.scores.mu.copy_(ref.att_src.view(H, Q))
            m.scores.nu.copy_(ref.att_dst.view(H, Q))
            m.edge_term.weight.copy_(ref.scores(True).parts[1].weight)  # att_edge·W_edge
    elif mode == "v2":
        ref = sc.nn.GATv2Conv(Pin, Q, heads=H, edge_dim=D, fill_value=fill, bias=False)
        m = _declared({"heads": H, "edge_dim": D, "fill_value": fill, "v2": True}, ei, ea, Pin)
        with torch.no_grad():
            m.param.weight.copy_(_theta(ref.lin_l.weight, H))
            m.target.weight.copy_(_theta(ref.lin_r.weight, H))
            m.scores.att.copy_(ref.att.view(H, Q))
            m.scores.edge_weight.copy_(ref.lin_edge.weight)
    else:
        ref = sc.nn.TransformerConv(Pin, Q, heads=H, edge_dim=D, root_weight=False, bias=False)
        m = _declared({"heads": H, "edge_dim": D, "transformer": True, "root_weight": False},
                      ei, ea, Pin)
        with torch.no_grad():
            m.param.weight.copy_(_theta(ref.lin_value.weight, H))
            m.key.weight.copy_(ref.lin_key.weight)
            m.query.weight.copy_(ref.lin_query.weight)
            m.lin_edge.weight.copy_(ref.lin_edge.weight)
            m.key.bias.zero_()  # the declared bias is the layer's: the sc.nn one has none
            m.query.bias.zero_()
    with torch.no_grad():
        m.bias.normal_()
    return m, ref, ei, ea


def _summed(ref, x, ei, ea, H, bias):
    return ref(x, ei, ea).view(-1, H, Q).sum(1) + bias


@pytest.mark.parametrize("mode", ["gat", "v2", "transformer"])
@pytest.mark.parametrize("H", [1, 3])
def test_declared_layer_equals_the_sc_nn_layer_heads_summed(mode, H):
    m, ref, ei, ea = _pair(mode, H, fill="max")
    x = torch.randn(N, P, generator=torch.Generator().manual_seed(8))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = m(x1[None])[0], _summed(ref, x2, ei, ea, H, m.bias)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(a)
    (a * w).sum().backward()
    (b * w).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["gat", "v2", "transformer"])
def test_declared_featureless_and_sampled_equal_the_sc_nn_layer(mode):
    H = 2
    m, ref, ei, ea = _pair(mode, H, Pin=N)
    eye = torch.eye(N)
    torch.testing.assert_close(m.featureless(), _summed(ref, eye, ei, ea, H, m.bias),
                               rtol=1e-12, atol=1e-12)
    # a sampled block: its 3 targets are the first of its 6 inputs, its edges' features
    # gathered by edge_ids; the sc.nn layer on the same block (its loops added the same way)
    rows = torch.tensor([4, 0, 7, 2, 8, 1])
    keep = torch.isin(ei[1], rows[:3]) & torch.isin(ei[0], rows) & (ei[0] != ei[1])
    local = torch.full((N,), -1, dtype=torch.long)
    local[rows] = torch.arange(rows.numel())
    blk = Block(local[ei[:, keep]], rows.numel(), 3, keep.nonzero().squeeze(1))
    x_blk = eye[rows]
    if mode == "transformer":  # no loops: the block's edges as they are
        want = _summed(ref, (x_blk, x_blk[:3]), blk.edge_index, ea[keep], H, m.bias)
    else:
        ref.add_self_loops = False
        bi, be = att.add_self_loops(blk.edge_index, 3, ea[keep], ref.fill_value)
        want = _summed(ref, (x_blk, x_blk[:3]), bi, be, H, m.bias)
    torch.testing.assert_close(m.featureless(blk, rows), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m(x_blk[None], blk)[0], want, rtol=1e-12, atol=1e-12)

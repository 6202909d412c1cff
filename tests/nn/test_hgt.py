"""HGTConv against PyG's in float64 (values and gradients), with odd graphs."""

import pytest
import torch

import structconv as sc
from structconv.basis.cache import graph_cache_info

pnn = pytest.importorskip("torch_geometric.nn")

NUM = {"a": 5, "b": 7, "c": 3, "d": 2}
EDGES = [("a", "r", "b"), ("b", "s", "a"), ("a", "t", "a"), ("c", "u", "b"), ("b", "w", "c")]
META = (list(NUM), EDGES)  # d is no relation's target: absent from the output, as PyG


def _inputs(widths, E=9, empty=(), missing=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = {t: torch.randn(n, widths[t], generator=g, dtype=torch.float64, requires_grad=True)
         for t, n in NUM.items()}
    ei = {}
    for e in EDGES:
        if e in missing:
            continue
        n = 0 if e in empty else E
        ei[e] = torch.stack([torch.randint(0, NUM[e[0]], (n,), generator=g),
                             torch.randint(0, NUM[e[2]], (n,), generator=g)])
    return x, ei


def _perturb(ref):
    # away from PyG's init (skip and priors all ones): every parameter matters
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.3 * torch.randn_like(p))


@pytest.mark.parametrize("widths,out,heads,kw", [
    ({"a": 6, "b": 6, "c": 6, "d": 6}, 6, 2, {}),
    ({"a": 4, "b": 9, "c": 6, "d": 3}, 6, 3, {}),               # per-type widths, skip on c
    ({"a": 5, "b": 5, "c": 5, "d": 5}, 8, 1, {"empty": [("a", "r", "b")]}),
    ({"a": 8, "b": 8, "c": 8, "d": 8}, 8, 4, {"missing": [("c", "u", "b"), ("b", "w", "c")]}),
])
def test_hgt_equals_pyg(widths, out, heads, kw):
    torch.manual_seed(0)
    ref = pnn.HGTConv(widths, out, META, heads=heads).double()
    _perturb(ref)
    ours = sc.nn.from_pyg(ref)
    assert isinstance(ours, sc.nn.HGTConv)
    x, ei = _inputs(widths, **kw)
    want, got = ref(x, ei), ours(x, ei)
    assert list(got) == list(want) and "d" not in got
    for t in want:
        torch.testing.assert_close(got[t], want[t], rtol=1e-12, atol=1e-12)
    g = {t: torch.randn_like(v) for t, v in want.items()}
    leaves = list(x.values())
    gw = torch.autograd.grad([want[t] for t in g], leaves + [ref.k_rel.weight],
                             [g[t] for t in g], allow_unused=True)
    gg = torch.autograd.grad([got[t] for t in g], leaves + [ours.k_rel], [g[t] for t in g],
                             allow_unused=True)
    for a, b in zip(gw, gg):
        if a is None:
            assert b is None or not b.abs().any()
        else:
            torch.testing.assert_close(b, a, rtol=1e-11, atol=1e-11)


def test_hgt_errors_and_reset():
    with pytest.raises(ValueError, match="divisible"):
        sc.nn.HGTConv(4, 6, META, heads=4)
    m = sc.nn.HGTConv(4, 4, META, heads=2)
    w = m.k_rel.detach().clone()
    m.reset_parameters()
    assert not torch.equal(w, m.k_rel)
    x = {t: torch.randn(n, 4) for t, n in NUM.items()}
    with pytest.raises(ValueError, match="not in its metadata"):
        m(x, {("a", "zz", "b"): torch.zeros(2, 0, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"x_dict\['a'\]"):
        m({**x, "a": torch.randn(5, 3)}, {})


def test_hgt_lazy_pyg_converts_once_run():
    torch.manual_seed(0)
    widths = {"a": 4, "b": 9, "c": 6, "d": 3}
    ref = pnn.HGTConv(-1, 6, META, heads=2).double()
    x, ei = _inputs(widths)
    with pytest.raises(ValueError, match="lazy"):
        sc.nn.from_pyg(ref)
    want = ref(x, ei)
    ours = sc.nn.from_pyg(ref)
    assert ours.in_channels == widths
    for t, v in ours(x, ei).items():
        torch.testing.assert_close(v, want[t], rtol=1e-12, atol=1e-12)


def _big(seed=1, E=60, heads=2, dtype=torch.float64):
    """A graph with many edges per target, repeated edges and targets without edges."""
    torch.manual_seed(seed)
    widths = {"a": 6, "b": 6, "c": 6, "d": 6}
    ref = pnn.HGTConv(widths, 6, META, heads=heads).to(dtype)
    _perturb(ref)
    x, ei = _inputs(widths, E=E, seed=seed)
    x = {t: v.detach().to(dtype).requires_grad_() for t, v in x.items()}
    ei[("a", "r", "b")] = torch.cat([ei[("a", "r", "b")], ei[("a", "r", "b")][:, :7]], 1)
    ei[("b", "w", "c")] = ei[("b", "w", "c")][:, ei[("b", "w", "c")][1] > 0]  # c0: no edge
    return ref, x, ei


def _grads(out, leaves):
    outs = [out[t] for t in sorted(out)]
    g = [torch.ones_like(o) * (i + 1) + o.detach() for i, o in enumerate(outs)]
    return torch.autograd.grad(outs, leaves, g, allow_unused=True, materialize_grads=True)


def test_hgt_sparse_products_equal_the_torch_ops_and_pyg(monkeypatch):
    # CPU float64 runs the attention as products on the graph's pattern; the traceable path
    # (compiled graphs, other devices) and PyG must give the same values and gradients
    from structconv.nn import hgt

    ref, x, ei = _big()
    ours = sc.nn.from_pyg(ref)
    leaves = [*x.values(), *ours.parameters()]
    fused = ours(x, ei)
    gf = _grads(fused, leaves)
    monkeypatch.setattr(hgt, "_fused", lambda q: False)
    plain = ours(x, ei)
    gp = _grads(plain, leaves)
    want = ref(x, ei)
    for t in want:
        torch.testing.assert_close(fused[t], want[t], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(plain[t], want[t], rtol=1e-12, atol=1e-12)
    for a, b in zip(gf, gp):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
    assert any(g.abs().sum() > 0 for g in gf[len(x):])  # the weights get gradients


def test_hgt_float32_matches_pyg():
    ref, x, ei = _big(seed=2, heads=3, dtype=torch.float32)
    ours = sc.nn.from_pyg(ref)
    want, got = ref(x, ei), ours(x, ei)
    for t in want:
        torch.testing.assert_close(got[t], want[t], rtol=1e-5, atol=1e-5)


def test_hgt_dot_attention_gradcheck():
    from structconv.nn.hgt import _DotAttention, _Layout

    g = torch.Generator().manual_seed(0)
    K, M, N, D = 2, 5, 4, 3
    ei = torch.stack([torch.randint(0, M, (11,), generator=g),
                      torch.randint(0, N - 1, (11,), generator=g)])  # node N-1: no edge
    lay = _Layout(ei, M, N, K)
    q, k, v = (torch.randn(r * K, D, generator=g, dtype=torch.float64, requires_grad=True)
               for r in (N, M, M))
    assert torch.autograd.gradcheck(lambda q, k, v: _DotAttention.apply(q, k, v, lay, 0.7),
                                    (q, k, v))
    out = _DotAttention.apply(q, k, v, lay, 0.7)
    assert not out.view(N, K, D)[N - 1].any()  # a node without edges gets zero messages


def test_hgt_caches_its_graph_and_sees_an_edit():
    ref, x, ei = _big(seed=3)
    ours = sc.nn.from_pyg(ref)
    ours(x, ei)
    before = graph_cache_info()["hits"]
    first = ours(x, ei)
    assert graph_cache_info()["hits"] > before
    et = ("a", "r", "b")
    with torch.no_grad():
        ei[et][1].copy_(ei[et][1].flip(0))  # the same tensor, edited in place
    got, want = ours(x, ei), ref(x, ei)
    assert not torch.allclose(got["b"], first["b"])
    for t in want:
        torch.testing.assert_close(got[t], want[t], rtol=1e-12, atol=1e-12)


def test_hgt_without_any_edge_and_with_bad_ids():
    torch.manual_seed(0)
    widths = {t: 5 for t in NUM}
    ref = pnn.HGTConv(widths, 4, META, heads=2).double()
    ours = sc.nn.from_pyg(ref)
    x, ei = _inputs(widths, empty=EDGES)
    want, got = ref(x, ei), ours(x, ei)
    for t in want:
        torch.testing.assert_close(got[t], want[t], rtol=1e-12, atol=1e-12)
    x, ei = _inputs(widths)
    ei[("c", "u", "b")][0, 0] = NUM["c"]
    with pytest.raises(ValueError, match=r"edge_index_dict\[\('c', 'u', 'b'\)\].*outside"):
        ours(x, ei)

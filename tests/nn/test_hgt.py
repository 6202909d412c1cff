"""HGTConv against PyG's in float64 (values and gradients), with odd graphs."""

import pytest
import torch

import structconv as sc

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

"""HANConv against PyG's in float64; metapath edges as its input."""

import pytest
import torch

import structconv as sc

pnn = pytest.importorskip("torch_geometric.nn")

NUM = {"a": 6, "b": 8, "c": 3}
META = (list(NUM), [("a", "p0", "a"), ("a", "p1", "a"), ("b", "p2", "a"), ("a", "p3", "b")])


def _inputs(widths, empty=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = {t: torch.randn(n, widths[t], generator=g, dtype=torch.float64, requires_grad=True)
         for t, n in NUM.items()}
    ei = {}
    for e in META[1]:
        n = 0 if e in empty else 12
        ei[e] = torch.stack([torch.randint(0, NUM[e[0]], (n,), generator=g),
                             torch.randint(0, NUM[e[2]], (n,), generator=g)])
    return x, ei


@pytest.mark.parametrize("widths,heads,empty", [
    ({"a": 5, "b": 7, "c": 2}, 2, ()),
    ({"a": 4, "b": 4, "c": 4}, 1, (("a", "p1", "a"),)),
    ({"a": 3, "b": 9, "c": 2}, 4, (("a", "p3", "b"),)),
])
def test_han_equals_pyg(widths, heads, empty):
    torch.manual_seed(0)
    ref = pnn.HANConv(widths, 8, META, heads=heads).double()
    ours = sc.nn.from_pyg(ref)
    assert isinstance(ours, sc.nn.HANConv)
    x, ei = _inputs(widths, empty)
    want, wb = ref(x, ei, return_semantic_attention_weights=True)
    got, gb = ours(x, ei, return_semantic_attention_weights=True)
    assert want["c"] is None and "c" not in got  # no metapath reaches c: absent, not None
    for t in got:
        torch.testing.assert_close(got[t], want[t], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gb[t], wb[t], rtol=1e-12, atol=1e-12)
    g = torch.randn_like(want["a"])
    leaves = [x["a"], x["b"], ref.q]
    gw = torch.autograd.grad(want["a"], leaves, g)
    gg = torch.autograd.grad(got["a"], [x["a"], x["b"], ours.q], g)
    for a, b in zip(gw, gg):
        torch.testing.assert_close(b, a, rtol=1e-11, atol=1e-11)


def test_han_on_metapath_edges():
    from structconv.data.hetero import HeteroGraph

    w = torch.tensor([[0, 1, 1, 2, 3], [0, 0, 2, 1, 2]])
    g = HeteroGraph({"author": 4, "paper": 3}, {("author", "writes", "paper"): w,
                                                 ("paper", "written_by", "author"): w.flip(0)})
    ei = sc.basis.metapath_edges(g, "writes.written_by")
    dense = torch.zeros(4, 3)
    dense[w[0], w[1]] = 1
    co = (dense @ dense.t()) > 0
    assert torch.equal(ei, co.nonzero().t())
    m = sc.nn.HANConv(5, 4, (["author"], [("author", "co", "author")]), heads=2)
    y = m({"author": torch.randn(4, 5)}, {("author", "co", "author"): ei})
    assert y["author"].shape == (4, 4)

"""SAGEConv's aggregations beyond mean/sum/max (nn.aggregation): against a per-target loop
(no PyG), and against PyG's SAGEConv in float64 (weights carried, checkpoints both ways)."""

import copy
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv.nn.aggregation import MultiReadout, Readout
from tests.conftest import SRC

D = torch.float64


def _graph(M, N, E, seed=0, sort=False):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, M, (E,), generator=g)
    dst = torch.randint(0, max(N - 2, 1), (E,), generator=g)  # the last targets isolated
    if sort:
        dst, order = dst.sort(stable=True)
        src = src[order]
    return torch.stack([src, dst])


def _per_target(msg, dst, N, f, width):
    """The reference: ``f`` applied to each target's messages (E_n, P) in edge order."""
    rows = [f(msg[dst == n]) if (dst == n).any() else None for n in range(N)]
    return torch.stack([r if r is not None else msg.new_zeros(width) for r in rows]) \
        if N else msg.new_zeros(0, width)


LOOPS = {
    "sum": lambda m: m.sum(0), "mean": lambda m: m.mean(0), "max": lambda m: m.amax(0),
    "min": lambda m: m.amin(0),
    "var": lambda m: m.var(0, unbiased=False),
    "softmax": lambda m: (torch.softmax(m * 0.7, 0) * m).sum(0),
    "powermean": lambda m: m.clamp(1e-4, 100).pow(2.5).mean(0).clamp(1e-4, 100).pow(1 / 2.5),
}
OPTS = {"softmax": {"t": 0.7}, "powermean": {"p": 2.5}}


@pytest.mark.parametrize("kind", sorted(LOOPS))
def test_readout_equals_a_loop_over_targets(kind):
    torch.manual_seed(0)
    msg, dst = torch.randn(23, 5, dtype=D), torch.randint(0, 6, (23,))
    if kind == "powermean":
        msg = msg.abs()
    got = Readout(kind, **OPTS.get(kind, {}))(msg, dst, 8)
    torch.testing.assert_close(got[:6], _per_target(msg, dst, 6, LOOPS[kind], 5))
    # targets 6, 7 have no messages: 0 (a power mean clamps that 0 to 1e-4 first, as PyG's)
    empty = 1e-4 ** (1 / 2.5) if kind == "powermean" else 0.0
    torch.testing.assert_close(got[6:], torch.full((2, 5), empty, dtype=D))
    mul = Readout("mul")(msg, dst, 8)  # a product: empty targets read 1
    torch.testing.assert_close(mul[6:], torch.ones(2, 5, dtype=D))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(LOOPS)), st.integers(0, 30), st.integers(1, 9), st.integers(1, 4),
       st.integers(0, 2**16))
def test_readouts_equal_the_loop_on_any_graph(kind, E, N, P, seed):
    g = torch.Generator().manual_seed(seed)
    msg = torch.randn(E, P, dtype=D, generator=g).abs()
    dst = torch.randint(0, N, (E,), generator=g)
    got = Readout(kind, **OPTS.get(kind, {}))(msg, dst, N)
    want = _per_target(msg, dst, N, LOOPS[kind], P)
    has = torch.zeros(N, dtype=torch.bool)
    has[dst] = True
    assert got.shape == (N, P)
    torch.testing.assert_close(got[has], want[has])


def test_lstm_readout_reads_each_target_as_a_sequence_padded_with_zeros():
    torch.manual_seed(0)
    r = Readout("lstm", in_channels=4, out_channels=3).double()
    dst = torch.tensor([0, 0, 0, 2, 3, 3])
    msg = torch.randn(6, 4, dtype=D)
    got = r(msg, dst, 5)
    for n in range(5):  # PyG's reading: every sequence padded at its end to the longest (3)
        seq = torch.zeros(1, 3, 4, dtype=D)
        rows = msg[dst == n]
        seq[0, :len(rows)] = rows
        torch.testing.assert_close(got[n], r.lstm(seq)[0][0, -1])
    assert r(msg[:0], dst[:0], 4).abs().sum() == 0  # no messages: the state after no step
    with pytest.raises(ValueError, match="'index' tensor is not sorted"):
        r(msg, dst.flip(0), 5)


def test_multi_readout_modes_without_pyg():
    torch.manual_seed(0)
    msg, dst = torch.randn(15, 4, dtype=D), torch.randint(0, 5, (15,))
    one = [Readout(k)(msg, dst, 5) for k in ("mean", "max")]
    cat = MultiReadout(["mean", "max"])
    torch.testing.assert_close(cat(msg, dst, 5), torch.cat(one, 1))
    assert cat.width(4) == 8
    torch.testing.assert_close(MultiReadout(["mean", "max"], mode="min")(msg, dst, 5),
                               torch.minimum(*one))
    proj = MultiReadout(["mean", "max"], mode="proj",
                        mode_kwargs={"in_channels": 4, "out_channels": 3}).double()
    torch.testing.assert_close(proj(msg, dst, 5), proj.lin(torch.cat(one, 1)))
    attn = MultiReadout(["mean", "max"], mode="attn",
                        mode_kwargs={"in_channels": 4, "out_channels": 6, "num_heads": 2})
    assert attn.double()(msg, dst, 5).shape == (5, 6) and attn.width(4) == 6
    assert attn(msg, dst, 0).shape == (0, 6)


def test_sage_without_pyg_objects_takes_names_and_lists():
    torch.manual_seed(0)
    ei = _graph(9, 7, 20, sort=True)
    for aggr, kw, W in (("lstm", None, 5), (["mean", "std"], {"mode": "cat"}, 10),
                        (["sum", "min"], {"mode": "proj", "mode_kwargs":
                                          {"in_channels": 5, "out_channels": 2}}, 2)):
        m = sc.nn.SAGEConv(5, 3, aggr=aggr, aggr_kwargs=kw)
        assert m.param.weight.shape == (1, W, 3)
        assert m(torch.randn(9, 5), ei).shape == (9, 3)


def test_sage_aggregations_need_no_pyg():
    code = ("import sys; sys.modules['torch_geometric'] = None\n"  # an import of it fails
            "import torch, structconv as sc\n"
            "ei = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])\n"
            "for aggr, kw in (('lstm', None), (['mean', 'max', 'softmax'], {'mode': 'attn',"
            " 'mode_kwargs': {'in_channels': 8, 'out_channels': 4, 'num_heads': 2}})):\n"
            "    assert sc.nn.SAGEConv(8, 3, aggr=aggr, aggr_kwargs=kw)(torch.randn(4, 8),"
            " ei).shape == (4, 3)\n"
            "assert 'torch_geometric' not in [m.split('.')[0] for m in sys.modules"
            " if sys.modules[m] is not None]\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(SRC.parent)})
    assert r.returncode == 0, r.stderr


def test_sage_aggregation_errors():
    with pytest.raises(ValueError, match="aggr must be one of"):
        sc.nn.SAGEConv(4, 3, aggr="median-ish")
    with pytest.raises(TypeError, match="unknown \\['tau'\\]"):
        sc.nn.SAGEConv(4, 3, aggr="softmax", aggr_kwargs={"tau": 2})
    with pytest.raises(ValueError, match="needs mode_kwargs in_channels and out_channels"):
        sc.nn.SAGEConv(4, 3, aggr=["mean", "max"], aggr_kwargs={"mode": "proj"})
    with pytest.raises(ValueError, match="mode must be one of"):
        sc.nn.SAGEConv(4, 3, aggr=["mean", "max"], aggr_kwargs={"mode": "concat"})
    with pytest.raises(ValueError, match="lazy -1 is not supported"):
        sc.nn.SAGEConv(-1, 3, aggr="lstm")
    with pytest.raises(TypeError, match="aggr_kwargs must be a dict"):
        sc.nn.SAGEConv(4, 3, aggr="mean", aggr_kwargs=[1])
    with pytest.raises(TypeError, match="aggr must be a name"):
        sc.nn.SAGEConv(4, 3, aggr=3)


# --- against PyG -------------------------------------------------------------------------------

CASES = [
    # (aggr, aggr_kwargs)
    ("min", None), ("mul", None), ("var", None), ("std", None),
    ("softmax", {"t": 0.5, "learn": True}), ("softmax", {"learn": True, "channels": 6}),
    ("powermean", {"p": 1.5, "learn": True}), ("lstm", None),
    ("lstm", {"num_layers": 2}),
    (["mean", "max"], {"mode": "cat"}),
    (["mean", "max", "sum", "softmax"],
     {"mode": "proj", "mode_kwargs": {"in_channels": 6, "out_channels": 5},
      "aggrs_kwargs": [{}, {}, {}, {"learn": True, "t": 1}]}),
    (["mean", "max", "std"],
     {"mode": "attn", "mode_kwargs": {"in_channels": 6, "out_channels": 8, "num_heads": 2}}),
    (["mean", "sum", "min", "max", "std"], {"mode": "sum"}),
    (["max", "var"], {"mode": "std"}),
    (["mean", "min"], {"mode": "logsumexp"}),
]


def _pyg_sage(pyg, cin, aggr, kw):
    """PyG's SAGEConv (its ``aggr_kwargs=None`` fails with lstm, and it edits the dict)."""
    extra = {} if kw is None else {"aggr_kwargs": copy.deepcopy(kw)}
    return pyg.SAGEConv(cin, 3, aggr=aggr, **extra).double()


def _inputs(bipartite, M=11, N=7, E=30):
    g = torch.Generator().manual_seed(3)
    xs = torch.randn(M, 6, dtype=D, generator=g).abs_().requires_grad_()
    xd = torch.randn(N, 4, dtype=D, generator=g).requires_grad_()
    ei = _graph(M, N if bipartite else M, E, sort=True)
    return ((xs, xd) if bipartite else xs), ei, [xs, xd] if bipartite else [xs]


@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("aggr,kw", CASES)
def test_sage_aggregations_equal_pyg(aggr, kw, bipartite):
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(1)
    cin = (6, 4) if bipartite else 6
    ref = _pyg_sage(pyg, cin, aggr, kw)
    with torch.no_grad():  # learnt temperatures / powers away from their initial value
        for n, p in ref.aggr_module.named_parameters():
            if n.endswith(("t", "p")) and p.dim() == 1:
                p.add_(torch.rand_like(p))
    ours = sc.nn.from_pyg(ref)
    x, ei, leaves = _inputs(bipartite)
    want, got = ref(x, ei), ours(x, ei)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(want)
    a = torch.autograd.grad(want, leaves + list(ref.aggr_module.parameters()), g,
                            allow_unused=True)
    b = torch.autograd.grad(got, leaves + list(ours.aggr_module.parameters()), g,
                            allow_unused=True)
    for u, v in zip(a, b):
        if u is None or v is None:
            assert (u if v is None else v) is None or not (u if v is None else v).abs().any()
        else:
            torch.testing.assert_close(v, u, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("aggr,kw", [CASES[7], CASES[10], CASES[11]])
def test_sage_aggregation_checkpoints_both_ways(aggr, kw):
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(2)
    ref = _pyg_sage(pyg, 6, aggr, kw)
    ours = sc.nn.SAGEConv(6, 3, aggr=aggr, aggr_kwargs=kw).double()
    ours.load_state_dict(ref.state_dict())  # PyG's names, strict
    x, ei, _ = _inputs(False)
    torch.testing.assert_close(ours(x, ei), ref(x, ei), rtol=1e-10, atol=1e-10)
    torch.manual_seed(5)
    back = _pyg_sage(pyg, 6, aggr, kw)
    ours.reset_parameters()
    back.load_state_dict(sc.nn.pyg_state_dict(ours))
    torch.testing.assert_close(back(x, ei), ours(x, ei), rtol=1e-10, atol=1e-10)


def test_sage_lazy_multi_aggregation_and_pyg_module():
    pyg = pytest.importorskip("torch_geometric.nn")
    x, ei, _ = _inputs(False)
    lazy = sc.nn.SAGEConv(-1, 3, aggr=["mean", "max", "std"]).double()
    assert lazy(x, ei).shape == (11, 3) and lazy.param.weight.shape == (1, 18, 3)
    ref = pyg.SAGEConv(6, 3, aggr=["mean", "max", "std"]).double()
    fresh = sc.nn.SAGEConv(-1, 3, aggr=["mean", "max", "std"]).double()
    fresh.load_state_dict(ref.state_dict())  # a checkpoint sizes the lazy layer
    torch.testing.assert_close(fresh(x, ei), ref(x, ei), rtol=1e-10, atol=1e-10)
    # an aggregation module of PyG's: called on structconv's gathered messages
    torch.manual_seed(4)
    ref = pyg.SAGEConv(6, 3, aggr=pyg.MLPAggregation(6, 6, max_num_elements=30, hidden_channels=5,
                                                     num_layers=2)).double()
    ours = sc.nn.from_pyg(ref)
    torch.testing.assert_close(ours(x, ei), ref(x, ei), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("aggr,kw", [CASES[7], CASES[11], CASES[12]])
def test_sage_aggregations_on_empty_node_sets(aggr, kw):
    m = sc.nn.SAGEConv((6, 4), 3, aggr=aggr, aggr_kwargs=kw).double()
    none = torch.zeros(2, 0, dtype=torch.long)
    xs, xd = torch.randn(5, 6, dtype=D), torch.randn(4, 4, dtype=D)
    assert m((xs, xd[:0]), none).shape == (0, 3)
    y = m((xs[:0], xd), none)  # no sources: the aggregation reads 0, the root term stays
    if kw is None or kw["mode"] != "attn":
        torch.testing.assert_close(y, xd @ m.root + m.bias)
    else:  # attention mixes the readouts' projections, biases included: not 0
        assert y.shape == (4, 3) and torch.isfinite(y).all()


def test_sage_multi_aggregation_compiles_cold():
    torch.manual_seed(0)
    m = sc.nn.SAGEConv(6, 3, aggr=["mean", "min", "std"])
    x, ei = torch.randn(11, 6), _graph(11, 11, 30)
    torch._dynamo.reset()
    got = torch.compile(m, fullgraph=True)(x, ei)
    torch.testing.assert_close(got, m(x, ei), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("aggr,kw", [CASES[7], CASES[10]])
def test_sage_aggregations_honour_explain_masks_as_pyg(aggr, kw):
    pyg = pytest.importorskip("torch_geometric.nn")
    from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

    torch.manual_seed(6)
    ref = _pyg_sage(pyg, 6, aggr, kw)
    ours = sc.nn.from_pyg(ref)
    x, ei, _ = _inputs(False)
    mask = torch.randn(ei.shape[1], dtype=D, requires_grad=True)
    for m in (ref, ours):
        set_masks(m, mask, ei, apply_sigmoid=True)
    want, got = ref(x, ei), ours(x, ei)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, mask, g)[0],
                               torch.autograd.grad(want, mask, g)[0], rtol=1e-10, atol=1e-10)
    for m in (ref, ours):
        clear_masks(m)
    torch.testing.assert_close(ours(x, ei), ref(x, ei), rtol=1e-10, atol=1e-10)

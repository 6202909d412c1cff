"""Every option combination of every converted layer: reproduced exactly or refused.

A converter that silently drops an option (``GATConv(flow="target_to_source")``,
``aggr="mean"``, a padding mode) gives a wrong model with no error; these sweeps convert the
cross product of each layer's constructor and call options and demand, case by case, either
float64 equality with the original or a ``ValueError``/``TypeError`` at conversion.
"""

# The lambdas below are called inside Sweep.check before the loop moves on, so binding the loop
# variables late is what is wanted (B023 is a false alarm here).
# ruff: noqa: B023

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import structconv as sc

B2 = (True, False)
FLOWS = ("source_to_target", "target_to_source")


class Sweep:
    """Outcome counts of converting ``make()`` and comparing ``call`` on both models."""

    def __init__(self, convert):
        self.convert = convert
        self.equal = self.refused = self.skipped = 0
        self.wrong: list[str] = []

    def check(self, name: str, make, call) -> None:
        try:  # a combination the original itself rejects is no test of the converter
            ref = make().double().eval()
            want = call(ref)
        except Exception:
            self.skipped += 1
            return
        try:
            ours = self.convert(ref).eval()
        except (ValueError, TypeError):
            self.refused += 1
            return
        except Exception as e:  # noqa: BLE001 - any other failure is a defect to list
            self.wrong.append(f"{name}: conversion raised {e!r:.120}")
            return
        try:
            got = call(ours)
            want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
            for w, g in zip(want, got):
                if w is not None:
                    torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
            self.equal += 1
        except AssertionError as e:
            self.wrong.append(f"{name}: differs ({str(e).splitlines()[-1][:100]})")
        except Exception as e:  # noqa: BLE001
            self.wrong.append(f"{name}: converted layer raised {e!r:.120}")

    def verdict(self, min_equal: int) -> None:
        """No silent difference or crash, and at least the combinations that convert today."""
        assert not self.wrong, f"{len(self.wrong)} silent differences or crashes:\n" + \
            "\n".join(self.wrong[:20])
        assert self.equal >= min_equal, (self.equal, self.refused, self.skipped)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# -- PyG ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph():
    g = torch.Generator().manual_seed(0)
    N = 9
    ei = torch.randint(0, N, (2, 30), generator=g)
    # a self loop and a duplicated edge: both change what the normalisations count
    ei = torch.cat([ei, torch.tensor([[1, 2, 2], [1, 3, 3]])], 1)
    E = ei.shape[1]
    return dict(N=N, ei=ei, ew=torch.rand(E, generator=g, dtype=torch.float64) + 0.1,
                et=torch.randint(0, 3, (E,), generator=g),
                x=torch.randn(N, 5, generator=g, dtype=torch.float64),
                x6=torch.randn(N, 6, generator=g, dtype=torch.float64),
                ea=torch.randn(E, 2, generator=g, dtype=torch.float64))


def test_pyg_spectral_and_polynomial_layers(graph):
    pyg = pytest.importorskip("torch_geometric.nn")
    s, x, ei, ew = Sweep(sc.nn.from_pyg), graph["x"], graph["ei"], graph["ew"]
    for imp, loops, norm, bias, flow, aggr, w in itertools.product(
            B2, B2, B2, B2, FLOWS, ("add", "mean", "max"), B2):
        kw = dict(improved=imp, add_self_loops=loops, normalize=norm, bias=bias, flow=flow,
                  aggr=aggr)
        s.check(f"GCNConv {kw} weighted={w}", lambda: pyg.GCNConv(5, 4, **kw),
                lambda m: m(x, ei, ew if w else None))
    for K, norm, bias, flow, aggr, w, lmax in itertools.product(
            (1, 3), (None, "sym", "rw"), B2, FLOWS, ("add", "mean"), B2, (None, 1.5)):
        kw = dict(normalization=norm, bias=bias, flow=flow, aggr=aggr)
        extra = {} if lmax is None else {"lambda_max": lmax}
        s.check(f"ChebConv K={K} {kw} weighted={w} {extra}", lambda: pyg.ChebConv(5, 4, K, **kw),
                lambda m: m(x, ei, ew if w else None, **extra))
    for K, bias, norm, flow, aggr, w in itertools.product(
            (0, 1, 3), B2, B2, FLOWS, ("add", "mean"), B2):
        kw = dict(bias=bias, normalize=norm, flow=flow, aggr=aggr)
        s.check(f"TAGConv K={K} {kw} weighted={w}", lambda: pyg.TAGConv(5, 4, K, **kw),
                lambda m: m(x, ei, ew if w else None))
    for K, loops, bias, flow, aggr, w in itertools.product(
            (1, 2), B2, B2, FLOWS, ("add", "mean"), B2):
        kw = dict(add_self_loops=loops, bias=bias, flow=flow, aggr=aggr)
        s.check(f"SGConv K={K} {kw} weighted={w}", lambda: pyg.SGConv(5, 4, K, **kw),
                lambda m: m(x, ei, ew if w else None))
    s.verdict(min_equal=224)


def test_pyg_attention_layers(graph):
    pyg = pytest.importorskip("torch_geometric.nn")
    s, x, ei = Sweep(sc.nn.from_pyg), graph["x"], graph["ei"]
    for heads, concat, loops, bias, fill, resid, slope, flow, aggr in itertools.product(
            (1, 3), B2, B2, B2, ("mean", 0.5), B2, (0.2, 0.0), FLOWS, ("add", "mean")):
        kw = dict(heads=heads, concat=concat, add_self_loops=loops, bias=bias, fill_value=fill,
                  residual=resid, negative_slope=slope, flow=flow, aggr=aggr)
        s.check(f"GATConv {kw}", lambda: pyg.GATConv(5, 4, **kw), lambda m: m(x, ei))
    s.verdict(min_equal=128)
    assert s.refused > 0  # flow / aggr are refused, not dropped


def test_pyg_attention_layers_with_edge_features(graph):
    pyg = pytest.importorskip("torch_geometric.nn")
    s, x, ei, ea = Sweep(sc.nn.from_pyg), graph["x"], graph["ei"], graph["ea"]
    call = {True: lambda m: m(x, ei, ea, return_attention_weights=True),
            False: lambda m: m(x, ei, return_attention_weights=True)}
    for heads, concat, loops, fill, edim, resid, flow, aggr in itertools.product(
            (1, 3), B2, B2, ("mean", "max", 0.5), (None, 2), B2, FLOWS, ("add", "mean")):
        kw = dict(heads=heads, concat=concat, add_self_loops=loops, fill_value=fill,
                  edge_dim=edim, residual=resid, flow=flow, aggr=aggr)
        s.check(f"GATConv {kw}", lambda: pyg.GATConv(5, 4, **kw), call[edim is not None])
        for share, bias in itertools.product(B2, B2):
            s.check(f"GATv2Conv {kw} share={share} bias={bias}",
                    lambda: pyg.GATv2Conv(5, 4, share_weights=share, bias=bias, **kw),
                    call[edim is not None])
    for heads, concat, beta, root, edim, bias, flow, aggr in itertools.product(
            (1, 3), B2, B2, B2, (None, 2), B2, FLOWS, ("add", "mean")):
        kw = dict(heads=heads, concat=concat, beta=beta, root_weight=root, edge_dim=edim,
                  bias=bias, flow=flow, aggr=aggr)
        s.check(f"TransformerConv {kw}", lambda: pyg.TransformerConv(5, 4, **kw),
                call[edim is not None])
    # every source_to_target + add combination converts: GATConv 96, GATv2Conv 384,
    # TransformerConv 64; the other flows and aggregations are refused
    s.verdict(min_equal=544)
    assert s.refused == 3 * 544


def test_pyg_relational_layers(graph):
    pyg = pytest.importorskip("torch_geometric.nn")
    s, ei, et = Sweep(sc.nn.from_pyg), graph["ei"], graph["et"]
    order = torch.argsort(et)
    for cls, nb, nbl, aggr, root, bias, flow, srt in itertools.product(
            (pyg.RGCNConv, pyg.FastRGCNConv), (None, 2), (None, 2), ("mean", "add", "max"), B2,
            B2, FLOWS, B2):
        kw = dict(num_bases=nb, num_blocks=nbl, aggr=aggr, root_weight=root, bias=bias,
                  flow=flow, is_sorted=srt)
        e, t = (ei[:, order], et[order]) if srt else (ei, et)
        s.check(f"{cls.__name__} {kw}", lambda: cls(6, 6, 3, **kw),
                lambda m: m(graph["x6"], e, t))
    s.verdict(min_equal=192)


# -- torch ----------------------------------------------------------------------------------------
def test_torch_convolutions_and_pooling():
    s = Sweep(sc.nn.from_torch)
    g = torch.Generator().manual_seed(1)
    for d, k, st, pad, dil, groups, bias, mode in itertools.product(
            (1, 2, 3), (1, 2, 3), (1, 2), (0, 1, "same", "valid"), (1, 2), (1, 2, 4), B2,
            ("zeros", "reflect", "circular", "replicate")):
        x = torch.randn(2, 4, *(7,) * d, generator=g, dtype=torch.float64)
        conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[d - 1]
        s.check(f"Conv{d}d k={k} s={st} p={pad} dil={dil} g={groups} bias={bias} {mode}",
                lambda: conv(4, 4, k, st, pad, dil, groups, bias, mode), lambda m: m(x))
    for d, k, st, pad, ceil, cip, div in itertools.product(
            (1, 2, 3), (1, 2, 3), (None, 1, 2), (0, 1), B2, B2, (None, 2)):
        if d == 1 and div:
            continue
        x = torch.randn(2, 3, *(7,) * d, generator=g, dtype=torch.float64)
        pool = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)[d - 1]
        kw = dict(stride=st, padding=pad, ceil_mode=ceil, count_include_pad=cip)
        if d > 1:
            kw["divisor_override"] = div
        s.check(f"AvgPool{d}d k={k} {kw}", lambda: pool(k, **kw), lambda m: m(x))
    s.verdict(min_equal=1056)


def test_torch_attention_and_transformer_layers():
    s = Sweep(sc.nn.from_torch)
    g = torch.Generator().manual_seed(2)
    E = 8

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    for bias, kv, zero, kdim, bf, nw, avg in itertools.product(B2, B2, B2, (None, 6), B2, B2, B2):
        q = r(2, 5, E) if bf else r(5, 2, E)
        kk = r(2, 4, kdim or E) if bf else r(4, 2, kdim or E)
        kpm = torch.rand(2, 4, generator=g) < 0.3
        s.check(f"MHA bias={bias} kv={kv} zero={zero} kdim={kdim} bf={bf} nw={nw} avg={avg}",
                lambda: nn.MultiheadAttention(E, 2, bias=bias, add_bias_kv=kv,
                                              add_zero_attn=zero, kdim=kdim, vdim=kdim,
                                              batch_first=bf),
                lambda m: m(q, kk, kk, key_padding_mask=kpm, need_weights=nw,
                            average_attn_weights=avg))
        causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
        s.check(f"MHA causal bias={bias} kv={kv} zero={zero} bf={bf}",
                lambda: nn.MultiheadAttention(E, 2, bias=bias, add_bias_kv=kv,
                                              add_zero_attn=zero, batch_first=bf),
                lambda m: m(q, q, q, attn_mask=causal, is_causal=True, need_weights=nw))
    for first, act, bf, bias in itertools.product(B2, ("relu", "gelu", F.gelu, F.silu), B2, B2):
        src = r(2, 5, E) if bf else r(5, 2, E)
        mem = r(2, 3, E) if bf else r(3, 2, E)
        s.check(f"EncoderLayer norm_first={first} act={act} bf={bf} bias={bias}",
                lambda: nn.TransformerEncoderLayer(E, 2, 16, 0.0, act, 1e-5, bf, first, bias),
                lambda m: m(src))
        s.check(f"DecoderLayer norm_first={first} act={act} bf={bf} bias={bias}",
                lambda: nn.TransformerDecoderLayer(E, 2, 16, 0.0, act, 1e-5, bf, first, bias),
                lambda m: m(src, mem))
    s.verdict(min_equal=320)


def test_subclass_overriding_forward_is_refused():
    class Doubled(nn.Conv2d):
        def forward(self, x):
            return 2 * super().forward(x)

    with pytest.raises(ValueError, match="overrides forward"):
        sc.nn.from_torch(Doubled(3, 4, 3))

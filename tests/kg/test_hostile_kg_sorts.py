"""``structconv kg sorts`` and ``mine_sorts`` on hostile arguments and graphs.

Found by a probe: a 400 KB file with 20,000 relations made mining allocate a dense (2R, 2R)
float64 table (12.8 GB); ``--min-support 10**20`` overflowed; ``--rank confidence
--max-length 3`` on FB15k-237 ran over 300 s without a word; the default list held only
``r . r^-1`` backtracking paths. Each case below ends in a correct result or one clear line.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from structconv.basis import mining
from structconv.basis.mining import MAX_SUPPORT, mine_sorts, mining_memory, walk_pairs
from structconv.cli import _Progress, main
from structconv.data.kg import load_kg
from structconv.kg import training_graph
from tests.conftest import run_cli


def _kg(root: Path, lines: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.txt").write_text("".join(lines))
    for split in ("valid", "test"):
        (root / f"{split}.txt").write_text(lines[0])
    return root


@pytest.fixture(scope="module")
def many_relations(tmp_path_factory) -> Path:
    """The probe's file: 20,000 triples over 100 entities, each with a relation of its own."""
    rng = random.Random(0)
    lines = [f"e{rng.randrange(100)}\tr{i}\te{rng.randrange(100)}\n" for i in range(20_000)]
    return _kg(tmp_path_factory.mktemp("kg") / "many", lines)


def _one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and r.stdout == "", (r.returncode, r.stderr)
    return lines[0]


def test_twenty_thousand_relations_mine_in_bounded_memory(many_relations):
    data = load_kg(many_relations)
    ei, et, n, names = training_graph(data)
    # the estimate made before allocating: a bounded block, not the (2R)^2 table
    est = mining_memory(n, ei.shape[1], len(names), 2)
    assert est < 2**29 and (2 * 20_000) ** 2 * 8 > 12e9
    mined = mine_sorts(ei, et, n, relations=names, backtrack=False, top=5)
    # the definition, from the dense per-relation matrices of the few relations involved
    for m in mined:
        P = torch.eye(n, dtype=torch.float64)
        for r in m.sort:
            A = torch.zeros(n, n, dtype=torch.float64)
            A.index_put_((ei[0][et == r], ei[1][et == r]), torch.ones(int((et == r).sum()),
                         dtype=torch.float64), accumulate=True)
            P = P @ A
        assert m.support == int(P.sum()) and m.pairs == int((P > 0).sum())
    assert [m.support for m in mined] == [1] * 5


def test_the_command_line_lists_them_too(many_relations):
    r = run_cli("kg", "sorts", "fb15k-237", "--root", many_relations, "--top", "3", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "40000 edge types" in r.stdout and len(r.stdout.strip().splitlines()) == 2 + 3


def test_what_does_not_fit_is_refused_before_allocating(monkeypatch, many_relations):
    data = load_kg(many_relations)
    ei, et, n, names = training_graph(data)
    monkeypatch.setattr(mining, "available_memory", lambda device="cpu": 50 * 2**20)
    with pytest.raises(ValueError, match=r"mine_sorts: mining 40,000 edges of 40,000 "
                                         r"relations over 100 nodes needs about [\d.,]+ [MG]iB, "
                                         r"more than the 50 MiB available on this machine: mine "
                                         r"a graph with fewer edges or relations"):
        mine_sorts(ei, et, n, relations=names)


def test_the_beam_and_pair_stages_check_their_memory_too(monkeypatch):
    g = torch.Generator().manual_seed(0)
    N, R = 200, 4
    ei = torch.randint(0, N, (2, 3000), generator=g)
    et = torch.randint(0, R, (3000,), generator=g)
    need = mining_memory(N, 3000, R, 2)
    # enough for the 2-path stage, not for 50 extended paths over 200 nodes (or their pairs)
    monkeypatch.setattr(mining, "available_memory", lambda device="cpu": need + 1000)
    with pytest.raises(ValueError, match=r"extending 16 paths over 200 nodes needs about .*: "
                                         r"lower beam"):
        mine_sorts(ei, et, N, num_relations=R, max_length=3, confidence=False)
    with pytest.raises(ValueError, match=r"the confidences of 16 paths \(up to [\d,]+ node "
                                         r"pairs joined\) needs about .*: lower max_pairs"):
        mine_sorts(ei, et, N, num_relations=R)
    assert mine_sorts(ei, et, N, num_relations=R, confidence=False)  # what fits runs


def test_blocks_give_the_same_paths_as_one_block(monkeypatch):
    # tiny blocks: the 2-path supports and the pair products are taken in many row blocks
    g = torch.Generator().manual_seed(4)
    N, R, E = 12, 4, 70
    ei = torch.randint(0, N, (2, E), generator=g)
    et = torch.randint(0, R, (E,), generator=g)
    kw = dict(num_relations=R, max_length=3, top=10**6, beam=10**6, inverse={0: 1, 1: 0},
              backtrack=False)
    whole = [m.as_dict() for m in mine_sorts(ei, et, N, **kw)]
    seen = []
    monkeypatch.setattr(mining, "BLOCK", 3)
    blocked = [m.as_dict() for m in mine_sorts(ei, et, N, progress=seen.append, **kw)]
    assert blocked == whole and len(whole) > 20
    assert any("block 2 of" in s for s in seen) and any("confidence of path" in s for s in seen)
    # and both match the definition
    A = torch.zeros(R, N, N, dtype=torch.float64)
    A.index_put_((et, ei[0], ei[1]), torch.ones(E, dtype=torch.float64), accumulate=True)
    for m in whole:
        P = A[m["sort"][0]]
        for r in m["sort"][1:]:
            P = P @ A[r]
        assert m["support"] == int(P.sum()) and m["pairs"] == int((P > 0).sum())
        keys = (P > 0).nonzero()
        assert torch.equal(walk_pairs(ei, et, N, m["sort"]), keys[:, 0] * N + keys[:, 1])
        assert walk_pairs(ei, et, N, m["sort"], max_pairs=m["pairs"] - 1) is None
        assert not any((a, b) in ((0, 1), (1, 0)) for a, b in zip(m["sort"], m["sort"][1:]))


@pytest.mark.parametrize("kw,match", [
    (dict(min_support=10**20), r"min_support must be <= 9007199254740992 \(supports are "
                               r"counted exactly up to 2\^53\), got 10{20}"),
    (dict(min_support=2.5), r"min_support must be an int >= 1, got 2\.5"),
    (dict(min_support=True), r"min_support must be an int >= 1, got True"),
    (dict(max_length=5), r"max_length must be <= 4 \(the number of paths grows as R\^L\)"),
    (dict(min_length=0), r"min_length must be an int >= 1, got 0"),
    (dict(top=0), r"top must be an int >= 1"),
    (dict(beam=-1), r"beam must be an int >= 1"),
    (dict(max_pairs=0), r"max_pairs must be an int >= 1"),
    (dict(rank="walks"), r"rank must be 'support' or 'confidence'"),
    (dict(num_relations=0), r"num_relations must be an int >= 1, got 0"),
])
def test_bad_arguments_are_named(kw, match):
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match=match):
        mine_sorts(ei, torch.tensor([0, 1]), 3, **kw)


def test_min_support_at_its_limit_is_a_correct_empty_result():
    ei = torch.tensor([[0, 1], [1, 2]])
    assert mine_sorts(ei, torch.tensor([0, 1]), 3, min_support=MAX_SUPPORT) == []
    assert [m.name for m in mine_sorts(ei, torch.tensor([0, 1]), 3, min_support=1)] == ["0.1"]


@pytest.mark.parametrize("args,match", [
    (["--min-support", "100000000000000000000"], r"--min-support must be an int in "
                                                  r"1\.\.9007199254740992, got 10{20}"),
    (["--min-support", "1e20"], r"argument --min-support: invalid int value: '1e20'"),
    (["--max-length", "5"], r"--max-length must be an int in 1\.\.4, got 5"),
    (["--min-length", "3"], r"--min-length must be an int in 1\.\.2, got 3"),
    (["--top", "0"], r"--top must be an int >= 1, got 0"),
    (["--beam", "-4"], r"--beam must be an int >= 1, got -4"),
    (["--max-pairs", "0"], r"--max-pairs must be an int >= 1, got 0"),
    (["--rank", "walks"], r"argument --rank: invalid choice: 'walks'"),
])
def test_bad_command_line_arguments_are_one_line(tmp_path, capsys, args, match):
    import re

    root = _kg(tmp_path / "kg", ["a\tr\tb\n", "b\ts\tc\n"])
    rc = main(["kg", "sorts", "fb15k-237", "--root", str(root), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and re.search(match, err[0]), err


def test_datasets_without_relations_or_files_are_one_line(tmp_path):
    assert "has no relation types" in _one_line(run_cli("kg", "sorts", "karate", timeout=120))
    assert "unknown dataset 'nope'" in _one_line(run_cli("kg", "sorts", "nope", timeout=120))
    assert "missing file(s) train.txt, valid.txt, test.txt" in _one_line(
        run_cli("kg", "sorts", "wn18rr", "--root", tmp_path, timeout=120))


def test_backtracking_paths_are_left_out_by_default(tmp_path, capsys):
    # a star: every walk there and back outnumbers the one real 2-path a.r.b.s.c
    lines = [f"hub\tr\tleaf{i}\n" for i in range(30)] + ["leaf0\ts\tc\n"]
    root = _kg(tmp_path / "star", lines)
    assert main(["kg", "sorts", "fb15k-237", "--root", str(root), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "r.s" in out and "r.r^-1" not in out and "--backtrack lists them" in out
    assert main(["kg", "sorts", "fb15k-237", "--root", str(root), "--top", "3",
                 "--backtrack"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].split()[-3] == "r^-1.r"  # 900 walks there and back
    assert "r.r^-1" in out


def test_progress_lines_come_every_few_seconds(capsys):
    p = _Progress("kg sorts", every=0.0)
    p("confidence of path 3 of 200")
    err = capsys.readouterr().err
    assert err.startswith("structconv kg sorts: confidence of path 3 of 200 (") and err.endswith(
        " s)\n")
    quiet = _Progress("kg sorts")  # the default: nothing during the first five seconds
    quiet("block 1 of 9")
    assert capsys.readouterr().err == ""


def test_a_doubled_edge_counts_twice_as_walks_but_links_its_pair_once():
    ei = torch.tensor([[0, 0, 1, 0], [1, 1, 2, 2]])  # 0 -p-> 1 twice, 1 -q-> 2, 0 -r-> 2
    et = torch.tensor([0, 0, 1, 2])
    (m,) = mine_sorts(ei, et, 3, relations=["p", "q", "r"])
    assert (m.name, m.support, m.pairs, m.head_name, m.hits, m.confidence) == \
        ("p.q", 2, 1, "r", 1, 1.0)
    doubled = mine_sorts(torch.cat([ei, ei[:, 3:]], 1), torch.cat([et, et[3:]]), 3,
                         relations=["p", "q", "r"])
    assert doubled[0].confidence == 1.0  # the pair is linked by r, however often it is listed

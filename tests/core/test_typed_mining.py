"""Mined metapaths on typed graphs: exactly the brute force's paths and supports (Hypothesis),
never a path that breaks the node types, and names that round-trip into metapath_edges and
HANConv."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv.basis import metapath_edges, metapath_name, mine_metapaths, parse_metapath
from structconv.data.hetero import HeteroGraph


@st.composite
def typed_graphs(draw):
    """A small typed graph: 1-3 node types of 0-4 nodes, 0-2 relations per ordered pair of
    types, 0-6 edges each (repeats allowed)."""
    T = draw(st.integers(1, 3))
    num = {f"t{i}": draw(st.integers(0, 4)) for i in range(T)}
    edges = {}
    for s, d in itertools.product(num, num):
        for k in range(draw(st.integers(0, 2 if len(edges) < 6 else 0))):
            E = draw(st.integers(0, 6)) if num[s] and num[d] else 0
            src = draw(st.lists(st.integers(0, max(num[s] - 1, 0)), min_size=E, max_size=E))
            dst = draw(st.lists(st.integers(0, max(num[d] - 1, 0)), min_size=E, max_size=E))
            edges[(s, f"r{k}", d)] = torch.tensor([src, dst], dtype=torch.long).reshape(2, E)
    return HeteroGraph(num, edges)


def _dense(g, et):
    A = torch.zeros(g.num_nodes[et[0]], g.num_nodes[et[2]], dtype=torch.float64)
    ei = g.edge_index[et]
    A.index_put_((ei[0], ei[1]), torch.ones(ei.shape[1], dtype=torch.float64), accumulate=True)
    return A


def _brute(g, start, end, max_length, min_length, min_support, top, back=()):
    """Every typed path by enumeration, its support 1ᵀ A_r1 ... A_rL 1 by dense products,
    ranked by support, then length, then the edge types' order."""
    ets = g.edge_types
    rows = []
    for L in range(min_length, max_length + 1):
        for p in itertools.product(range(len(ets)), repeat=L):
            steps = list(zip(p, p[1:]))
            if any(ets[a][2] != ets[b][0] for a, b in steps) or any(s in back for s in steps):
                continue
            if (start and ets[p[0]][0] != start) or (end and ets[p[-1]][2] != end):
                continue
            M = _dense(g, ets[p[0]])
            for r in p[1:]:
                M = M @ _dense(g, ets[r])
            if M.sum() >= min_support:
                rows.append((-int(M.sum()), L, p, int((M != 0).sum())))
    rows.sort()
    return [(tuple(ets[r] for r in p), -s, pairs) for s, _, p, pairs in rows[:top]]


@settings(max_examples=60, deadline=None)
@given(g=typed_graphs(), data=st.data())
def test_mined_metapaths_are_the_brute_forces(g, data):
    types = [None, *g.node_types]
    start, end = data.draw(st.sampled_from(types)), data.draw(st.sampled_from(types))
    max_length = data.draw(st.integers(1, 3))
    min_length = data.draw(st.integers(1, max_length))
    min_support, top = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 40))
    got = mine_metapaths(g, start, end, max_length=max_length, min_length=min_length,
                         top=top, min_support=min_support, beam=10_000, pairs=True)
    want = _brute(g, start, end, max_length, min_length, min_support, top)
    assert [(m.path, m.support, m.pairs) for m in got] == want
    for m in got:  # typed-valid, named as metapaths are, and the name reads back
        assert all(a[2] == b[0] for a, b in zip(m.path, m.path[1:]))
        assert m.name == metapath_name(m.path)
        assert tuple(parse_metapath(m.name, g.edge_types)) == m.path


@settings(max_examples=30, deadline=None)
@given(g=typed_graphs())
def test_default_beam_is_exact_when_every_length_fits_in_it(g):
    got = mine_metapaths(g, max_length=2, top=1000, beam=200)
    assert [(m.path, m.support) for m in got] == \
        [(p, s) for p, s, _ in _brute(g, None, None, 2, 1, 1, 1000)]


def _typed():
    w = torch.tensor([[0, 1, 1, 2, 3, 3], [0, 0, 1, 2, 2, 3]])
    p = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    return HeteroGraph({"author": 4, "paper": 4, "venue": 2},
                       {("author", "writes", "paper"): w,
                        ("paper", "written_by", "author"): w.flip(0),
                        ("paper", "in", "venue"): p,
                        ("venue", "has", "paper"): p.flip(0)})


def test_mined_names_round_trip_into_metapath_edges_and_han():
    g = _typed()
    mined = mine_metapaths(g, "author", "author", max_length=4, top=3)
    # walks: APAPA 26, APVPA 18, APA 10 (by hand from the edges above)
    assert [(m.name, m.support) for m in mined] == [
        ("author.writes.paper.written_by.author.writes.paper.written_by.author", 26),
        ("author.writes.paper.in.venue.has.paper.written_by.author", 18),
        ("author.writes.paper.written_by.author", 10)]
    for m in mined:
        assert torch.equal(metapath_edges(g, m.name), metapath_edges(g, m.path))
    ets = [(m.start, m.name, m.end) for m in mined]
    han = sc.nn.HANConv({"author": 5}, 8, (["author"], ets), heads=2)
    out = han({"author": torch.randn(4, 5)}, {et: metapath_edges(g, et[1]) for et in ets})
    assert out["author"].shape == (4, 8)


def test_backtrack_false_drops_a_step_straight_back():
    g = _typed()
    ets = g.edge_types
    back = {(0, 1), (1, 0), (2, 3), (3, 2)}  # writes / written_by, in / has: each other's flip
    got = mine_metapaths(g, max_length=3, top=100, backtrack=False)
    assert [(m.path, m.support) for m in got] == \
        [(p, s) for p, s, _ in _brute(g, None, None, 3, 1, 1, 100, back)]
    assert all((ets.index(a), ets.index(b)) not in back
               for m in got for a, b in zip(m.path, m.path[1:]))
    # a relation between the same types whose edges are not the flip is no inverse
    g2 = HeteroGraph(g.num_nodes, {**g.edge_index, ("paper", "cites", "author"):
                                   torch.tensor([[0], [3]])})
    names = [m.name for m in mine_metapaths(g2, "author", max_length=2, backtrack=False)]
    assert "author.writes.paper.cites.author" in names
    assert "author.writes.paper.written_by.author" not in names


def test_start_and_end_filter_and_pairs_past_the_bound():
    g = _typed()
    got = mine_metapaths(g, "paper", "venue", max_length=3, top=50, pairs=True, max_pairs=4)
    assert got and all(m.start == "paper" and m.end == "venue" for m in got)
    # walks bound pairs: a path any of whose prefixes has more walks than max_pairs gets None
    assert any(m.pairs is None for m in got) and any(m.pairs is not None for m in got)


@pytest.mark.parametrize("kw,match", [
    ({"start": "user"}, "start must be a node type"),
    ({"end": "user"}, "end must be a node type"),
    ({"max_length": 5}, "max_length"),
    ({"max_length": 2, "min_length": 3}, "min_length"),
    ({"top": 0}, "top"),
    ({"min_support": True}, "min_support"),
])
def test_bad_arguments_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        mine_metapaths(_typed(), **kw)


def test_not_a_typed_graph_is_refused():
    with pytest.raises(TypeError, match="typed graph"):
        mine_metapaths(object())
    with pytest.raises(ValueError, match="edge type"):
        mine_metapaths(({"a": 2}, {("a", "r", "b"): torch.zeros(2, 0, dtype=torch.long)}))

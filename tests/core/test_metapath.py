"""Metapath sorts are products of the relations' rectangular bases (Proposition 2)."""

import pytest
import torch

import structconv as sc
from structconv.basis import metapath_basis, parse_metapath
from structconv.data.hetero import HeteroGraph

NUM = {"author": 6, "paper": 9, "venue": 3}


def _graph(seed=0):
    g = torch.Generator().manual_seed(seed)

    def rand(s, d, E):
        return torch.stack([torch.randint(0, NUM[s], (E,), generator=g),
                            torch.randint(0, NUM[d], (E,), generator=g)])
    w = rand("author", "paper", 14)
    p = rand("paper", "venue", 9)
    return HeteroGraph(dict(NUM), {("author", "writes", "paper"): w,
                                   ("paper", "written_by", "author"): w.flip(0),
                                   ("paper", "in", "venue"): p,
                                   ("venue", "has", "paper"): p.flip(0)})


def _dense(g, et, norm):
    A = torch.zeros(NUM[et[0]], NUM[et[2]], dtype=torch.float64)
    ei = g.edge_index[et]
    A.index_put_((ei[0], ei[1]), torch.ones(ei.shape[1], dtype=torch.float64), accumulate=True)
    if norm == "mean":
        A = A / A.sum(0, keepdim=True).clamp_min(1)
    return A


@pytest.mark.parametrize("norm", ["mean", None])
@pytest.mark.parametrize("materialize", [True, False])
def test_metapath_is_the_product(norm, materialize):
    g = _graph()
    sorts = ["author.writes.paper.written_by.author",
             "writes.in.has.written_by"]  # relation names alone, when unique
    b = metapath_basis(g, sorts, norm, materialize=materialize, dtype=torch.float64)
    assert b.shape == (2, 6, 6)
    want = torch.stack([
        _dense(g, ("author", "writes", "paper"), norm)
        @ _dense(g, ("paper", "written_by", "author"), norm),
        _dense(g, ("author", "writes", "paper"), norm) @ _dense(g, ("paper", "in", "venue"), norm)
        @ _dense(g, ("venue", "has", "paper"), norm)
        @ _dense(g, ("paper", "written_by", "author"), norm)])
    torch.testing.assert_close(b.to_dense(), want, rtol=1e-12, atol=1e-12)
    if materialize:
        assert isinstance(b, sc.basis.Sparse)  # sparse-sparse products, never dense
    # a convolution on the metapath basis: authors to authors through their papers
    x = torch.randn(6, 4, dtype=torch.float64)
    th = torch.randn(2, 4, 3, dtype=torch.float64)
    torch.testing.assert_close(sc.convolve(x, b, th),
                               torch.einsum("kmn,mp,kpq->nq", want, x, th))


def test_metapath_names_and_errors():
    g = _graph()
    ets = g.edge_types
    assert parse_metapath("author.writes.paper.in.venue", ets) == [
        ("author", "writes", "paper"), ("paper", "in", "venue")]
    assert parse_metapath(["author__writes__paper", ("paper", "in", "venue")], ets)[1] == \
        ("paper", "in", "venue")
    with pytest.raises(ValueError, match="ends at 'paper'"):
        parse_metapath([("author", "writes", "paper"), ("venue", "has", "paper")], ets)
    with pytest.raises(ValueError, match="no edge type"):
        parse_metapath("author.reads.paper", ets)
    with pytest.raises(ValueError, match="share their start and end"):
        metapath_basis(g, ["author.writes.paper", "author.writes.paper.in.venue"])
    with pytest.raises(TypeError, match="typed graph"):
        metapath_basis(object(), ["writes"])

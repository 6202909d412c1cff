"""Knowledge graphs: filtered ranking, decoders, named and mined sorts, link-prediction training."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv.basis.mining import mine_sorts
from structconv.basis.sorts import parse_sorts
from tests.conftest import need


# -- sc.kg.evaluate against a brute-force reference -------------------------------------------
def _reference(score_tails, triples, known, E, R, ks):
    """Rank by rank, one query at a time, with Python sets: the definition, slowly."""
    truth = {tuple(t) for t in known.tolist()}
    filt, raw = [], []
    for h, r, t in triples.tolist():
        for q_h, q_r, target, is_true in (
                (h, r, t, lambda c, h=h, r=r: (h, r, c) in truth),
                (t, r + R, h, lambda c, t=t, r=r: (c, r, t) in truth)):
            s = score_tails(torch.tensor([q_h]), torch.tensor([q_r]))[0].tolist()
            for out, filtered in ((filt, True), (raw, False)):
                cands = [c for c in range(E) if c == target or not (filtered and is_true(c))]
                above = sum(s[c] > s[target] for c in cands)
                tied = sum(s[c] == s[target] for c in cands) - 1
                out.append(above + 1 + tied / 2)
    res = {}
    for p, ranks in (("", filt), ("raw_", raw)):
        res[p + "mrr"] = sum(1 / x for x in ranks) / len(ranks)
        res[p + "mr"] = sum(ranks) / len(ranks)
        for k in ks:
            res[f"{p}hits@{k}"] = sum(x <= k for x in ranks) / len(ranks)
    return res


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 9), st.integers(1, 3), st.integers(1, 25), st.integers(0, 10**6),
       st.integers(1, 4), st.integers(1, 7))
def test_evaluate_equals_the_brute_force_definition(E, R, U, seed, levels, batch):
    g = torch.Generator().manual_seed(seed)
    known = torch.stack([torch.randint(0, E, (U,), generator=g),
                         torch.randint(0, R, (U,), generator=g),
                         torch.randint(0, E, (U,), generator=g)], 1)
    test = known[torch.randint(0, U, (max(1, U // 2),), generator=g)]
    # few score levels: many ties, including ties with filtered candidates
    table = torch.randint(0, levels, (E, 2 * R, E), generator=g).double()

    def score(h, r):
        return table[h, r]
    ks = (1, 2, 3)
    got = sc.kg.evaluate(score, test, known, E, R, ks=ks, batch_size=batch)
    want = _reference(score, test, known, E, R, ks)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-12), k


def test_evaluate_constant_scorer_gets_the_middle_rank():
    E = 11
    test = torch.tensor([[0, 0, 1], [2, 0, 3]])
    known = torch.cat([test, torch.tensor([[0, 0, 2], [4, 0, 3]])])
    m = sc.kg.evaluate(lambda h, r: torch.zeros(h.numel(), E), test, known, E, 1)
    # raw: 10 tied others, rank 1 + 10/2; filtered: (0, 0, ?) and (?, 0, 3) lose one candidate
    assert m["raw_mr"] == pytest.approx(6.0)
    assert m["mr"] == pytest.approx((5.5 + 6 + 6 + 5.5) / 4)


@pytest.mark.parametrize("bad,match", [
    (dict(triples=torch.tensor([[0, 0, 5]])), r"tail id 5 is out of range \[0, 4\]"),
    (dict(triples=torch.tensor([[0, 2, 1]])), r"relation id 2 is out of range \[0, 1\]"),
    (dict(triples=torch.tensor([0, 0, 1])), r"must be \(T, 3\)"),
    (dict(triples=torch.tensor([[0.0, 0, 1]])), "integer ids"),
    (dict(known=torch.tensor([[-1, 0, 1]])), r"known: head id -1 is out of range"),
    (dict(score=lambda h, r: torch.zeros(h.numel(), 4)), r"must return \(2, 5\) scores"),
    (dict(score=lambda h, r: torch.full((h.numel(), 5), float("nan"))), "NaN"),
    (dict(batch_size=0), "batch_size must be an int >= 1"),
    (dict(triples=torch.zeros(0, 3, dtype=torch.long)), "no triples"),
])
def test_evaluate_refuses_bad_input(bad, match):
    args = dict(score=lambda h, r: torch.zeros(h.numel(), 5), triples=torch.tensor([[0, 0, 1]]),
                known=torch.tensor([[0, 0, 1]]), batch_size=8)
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        sc.kg.evaluate(args["score"], args["triples"], args["known"], 5, 2,
                       batch_size=args["batch_size"])


# -- decoders against their formulas ----------------------------------------------------------
def test_distmult_and_complex_scores_equal_their_formulas():
    torch.manual_seed(0)
    E, R, D = 7, 3, 6
    ent = torch.randn(E, D, dtype=torch.float64)
    trip = torch.tensor([[0, 1, 2], [3, 2, 4], [5, 0, 6]])
    for reciprocal in (True, False):
        dm = sc.kg.DistMult(R, D, reciprocal).double()
        with torch.no_grad():
            dm.relation.normal_()
        h, r, t = ent[trip[:, 0]], trip[:, 1], ent[trip[:, 2]]
        want = (h * dm.relation[r] * t).sum(1)
        torch.testing.assert_close(dm(h, r, t), want)
        torch.testing.assert_close(dm.score_all(h, r, ent)[torch.arange(3), trip[:, 2]], want)
        cx = sc.kg.ComplEx(R, D, reciprocal).double()
        with torch.no_grad():
            cx.relation.normal_()
        c = torch.complex(ent[:, :3], ent[:, 3:])
        w = torch.complex(cx.relation[:, :3], cx.relation[:, 3:])
        want = (c[trip[:, 0]] * w[r] * c[trip[:, 2]].conj()).sum(1).real
        torch.testing.assert_close(cx(h, r, t), want)
        torch.testing.assert_close(cx.score_all(h, r, ent)[torch.arange(3), trip[:, 2]], want)
        if not reciprocal:  # the inverse query scores the reversed triple exactly
            for dec in (dm, cx):
                torch.testing.assert_close(dec(t, r + R, h), dec(h, r, t))
    with pytest.raises(ValueError, match=r"relation ids must be in \[0, 5\]"):
        sc.kg.DistMult(3, 4).relation_vectors(torch.tensor([6]))
    with pytest.raises(ValueError, match="dim must be even"):
        sc.kg.ComplEx(3, 5)


# -- named sorts ------------------------------------------------------------------------------
def _toy():
    # a -p-> b -q-> c with a -r-> c, twice; g -p-> h
    ei = torch.tensor([[0, 1, 0, 3, 4, 3, 6], [1, 2, 2, 4, 5, 5, 7]])
    et = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    return ei, et, ["p", "q", "r"]


@pytest.mark.parametrize("decoder", ["distmult", "complex"])
def test_score_triples_equals_scoring_gathered_vectors(decoder):
    torch.manual_seed(0)
    dec = sc.kg.DECODERS[decoder](3, 6, init_std=0.5).double()
    ent = torch.randn(9, 6, dtype=torch.float64, requires_grad=True)
    tri = torch.tensor([[0, 1, 8], [8, 4, 0], [3, 2, 3], [5, 0, 1]])
    got = sc.kg.score_triples(dec, ent, tri)
    want = dec(ent[tri[:, 0]], tri[:, 1], ent[tri[:, 2]])
    torch.testing.assert_close(got, want)
    g1, = torch.autograd.grad(got.square().sum(), ent)
    g2, = torch.autograd.grad(want.square().sum(), ent)
    torch.testing.assert_close(g1, g2)


def test_named_sorts_equal_id_sorts():
    ei, et, names = _toy()
    ids = sc.basis.relational(ei, et, 8, [(0,), (1,), (0, 1), (0, 1, 2)], num_relations=3)
    for sorts in (["p", "q", "p.q", "p.q.r"], [("p",), ("q",), ("p", "q"), ("p", "q", "r")],
                  ["p", 1, ("p", 1), "p.q.r"]):
        named = sc.basis.relational(ei, et, 8, sorts, relations=names)
        torch.testing.assert_close(named.to_dense(), ids.to_dense(), rtol=0, atol=0)
    x = torch.randn(8, 4)
    a = sc.nn.RGCNConv(4, 3, 3, sorts=[(0,), (0, 1)])
    b = sc.nn.RGCNConv(4, 3, 3, sorts=["p", "p.q"], relations=names)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(x, ei, et), b(x, ei, et))
    assert "sorts=[p, p.q]" in repr(b)


def test_unknown_relation_names_list_the_closest():
    ei, et, names = _toy()
    with pytest.raises(ValueError, match=r"unknown relation 'qq'; closest: 'q'"):
        sc.basis.relational(ei, et, 8, ["p.qq"], relations=names)
    with pytest.raises(ValueError, match="no relation names were given"):
        sc.basis.relational(ei, et, 8, ["p.q"])
    with pytest.raises(ValueError, match="names contain dots"):
        parse_sorts(["a.b.c"], ["a.b", "c"], 2)
    assert parse_sorts(["a.b", ("a.b", "c")], ["a.b", "c"], 2) == [(0,), (0, 1)]
    with pytest.raises(ValueError, match=r"relation id 7 is out of range \[0, 2\]"):
        parse_sorts([(0, 7)], names, 3)


@pytest.mark.parametrize("decomposition", ["num_blocks", "num_bases"])
def test_rgcn_decompositions_take_sorts_of_any_length(decomposition):
    ei, et, names = _toy()
    torch.manual_seed(0)
    conv = sc.nn.RGCNConv(4, 4, 3, sorts=["p", "q", "p.q", "p.q.r"], relations=names,
                          **{decomposition: 2}).double()
    x = torch.randn(8, 4, dtype=torch.float64)
    y = conv(x, ei, et)
    # the definition: Σ_k A_kᵀ x Θ_k with the dense sort matrices
    A = sc.basis.relational(ei, et, 8, ["p", "q", "p.q", "p.q.r"], relations=names,
                            dtype=torch.float64).to_dense()
    want = torch.einsum("kmn,mp,kpq->nq", A, x, conv.param()) + conv.bias
    if conv.root is not None:
        want = want + x @ conv.root
    torch.testing.assert_close(y, want)


# -- sort mining ------------------------------------------------------------------------------
def test_mining_finds_the_known_paths_with_support_and_confidence():
    ei, et, names = _toy()
    mined = mine_sorts(ei, et, 8, relations=names, max_length=3, top=10)
    got = {m.name: m for m in mined}
    assert list(got) == ["p.q"]  # the only path of length 2..3 in this graph
    m = got["p.q"]
    assert (m.support, m.pairs, m.head_name, m.confidence, m.hits) == (2, 2, "r", 1.0, 2)
    ones = {m.name: m.support for m in mine_sorts(ei, et, 8, relations=names, min_length=1)}
    assert ones == {"p": 3, "q": 2, "r": 2, "p.q": 2}


def test_mining_counts_walks_as_the_dense_product_does():
    g = torch.Generator().manual_seed(3)
    N, R, E = 9, 3, 40
    ei = torch.randint(0, N, (2, E), generator=g)
    et = torch.randint(0, R, (E,), generator=g)
    A = torch.zeros(R, N, N, dtype=torch.float64)
    A.index_put_((et, ei[0], ei[1]), torch.ones(E, dtype=torch.float64), accumulate=True)
    mined = mine_sorts(ei, et, N, num_relations=R, max_length=3, top=10**6, beam=10**6)
    assert len(mined) == R ** 2 + R ** 3 - sum(
        int((A[a] @ A[b]).sum() == 0) for a in range(R) for b in range(R)) - sum(
        int((A[a] @ A[b] @ A[c]).sum() == 0) for a in range(R) for b in range(R)
        for c in range(R))
    for m in mined:
        P = A[m.sort[0]]
        for r in m.sort[1:]:
            P = P @ A[r]
        assert m.support == int(P.sum())
        assert m.pairs == int((P > 0).sum())
        direct = (A > 0).double()  # which relation links each joined pair
        hits = [(direct[r] * (P > 0)).sum() for r in range(R)]
        assert m.hits == int(max(hits))


def test_mining_drops_backtracking_paths_on_request():
    ei = torch.tensor([[0, 1, 2, 1], [1, 0, 1, 2]])
    et = torch.tensor([0, 1, 2, 3])
    names = ["p", "p^-1", "q", "q^-1"]
    with_bt = {m.name for m in mine_sorts(ei, et, 3, relations=names)}
    without = {m.name for m in mine_sorts(ei, et, 3, relations=names, backtrack=False)}
    assert "p.p^-1" in with_bt and "p.p^-1" not in without
    assert without and all(not any(a + "." + a + "^-1" in n for a in "pq") for n in without)


def test_mining_refuses_bad_arguments():
    ei, et, names = _toy()
    with pytest.raises(ValueError, match="max_length must be <= 4"):
        mine_sorts(ei, et, 8, max_length=9)
    with pytest.raises(ValueError, match="top must be an int >= 1"):
        mine_sorts(ei, et, 8, top=0)
    with pytest.raises(ValueError, match=r"source ids must lie in \[0, 2\] for 3 nodes"):
        mine_sorts(ei, et, 3)


def test_mining_sees_only_the_graph_it_is_given():
    # the mined sorts and their support come from the training triples alone: adding test
    # triples changes them, so the caller's split is what the model sees
    ei, et, names = _toy()
    train = mine_sorts(ei, et, 8, relations=names, min_length=1)
    more = mine_sorts(torch.cat([ei, torch.tensor([[2], [0]])], 1), torch.cat([et, torch.tensor(
        [1])]), 8, relations=names, min_length=1)
    assert {m.name: m.support for m in train} != {m.name: m.support for m in more}


# -- link prediction end to end ---------------------------------------------------------------
def _tiny_kg(seed=0, groups=8, size=5, R=3):
    """A graph with learnable structure: relation r links every entity of group g to every
    entity of group g XOR (r + 1) (symmetric, so DistMult can express it); 20 % held out."""
    ent = torch.arange(groups * size)
    g = ent // size
    rows = []
    for r in range(R):
        partner = g ^ (r + 1)
        for a in ent.tolist():
            for b in ent[g == partner[a]].tolist():
                rows.append((a, r, b))
    trip = torch.tensor(rows)
    trip = trip[torch.randperm(trip.shape[0], generator=torch.Generator().manual_seed(seed))]
    n = int(0.8 * trip.shape[0])
    return trip[:n], trip[n:], groups * size, R


@pytest.mark.parametrize("decoder,mode,layers", [("distmult", "1vsall", 0),
                                                 ("complex", "1vsall", 0),
                                                 ("complex", "negative", 0),
                                                 ("distmult", "negative", 1)])
def test_tiny_training_beats_a_random_scorer_by_far(decoder, mode, layers):
    train, test, E, R = _tiny_kg()
    known = torch.cat([train, test])
    torch.manual_seed(0)
    model = sc.kg.LinkPredictor(E, R, 32, decoder, init_std=0.1, encoder_layers=layers,
                                graph=sc.kg.inverse_graph(train, R), block=4,
                                edge_dropout=0.0, self_dropout=0.0)
    sc.training.train_link(model, train, mode=mode, epochs=30, batch_size=64, lr=0.05, negatives=8,
                     reg="n3", reg_weight=1e-3)
    m = sc.kg.link_metrics(model, test, known)
    torch.manual_seed(1)
    rnd = sc.kg.evaluate(lambda h, r: torch.randn(h.numel(), E), test, known, E, R)
    assert rnd["mrr"] < 0.2
    assert m["mrr"] > max(0.8, 5 * rnd["mrr"]), (m, rnd)


def test_encoder_graph_holds_training_edges_only():
    train, test, E, R = _tiny_kg()
    ei, et = sc.kg.inverse_graph(train, R)
    model = sc.kg.LinkPredictor(E, R, 8, encoder_layers=1, graph=(ei, et), block=4)
    have = set(zip(model.edge_index[0].tolist(), model.edge_type.tolist(),
                   model.edge_index[1].tolist()))
    for h, r, t in test.tolist():
        assert (h, r, t) not in have and (t, r + R, h) not in have
    assert len(have) == 2 * len({tuple(x) for x in train.tolist()})


def test_sort_contributions_are_the_norms_of_each_sorts_term():
    train, _, E, R = _tiny_kg()
    ei, et = sc.kg.inverse_graph(train, R)
    sorts = [(r,) for r in range(2 * R)] + [(0, 1), (R, 2)]
    torch.manual_seed(1)
    model = sc.kg.LinkPredictor(E, R, 8, encoder_layers=2, graph=(ei, et), block=4, sorts=sorts,
                                init_std=0.3)
    model.train()
    got = model.sort_contributions(chunk=3)  # chunks split sorts unevenly: 3 + 3 + ... + 2
    assert got.shape == (2, len(sorts)) and model.training
    model.eval()
    with torch.no_grad():
        x = model.entity
        for i, (layer, root) in enumerate(zip(model.layers, model.roots)):
            theta = layer.param()
            terms = []
            for k, s in enumerate(sorts):
                a = sc.basis.relational(ei, et, E, [s], normalization="mean",
                                        num_relations=2 * R).to_dense()[0]
                terms.append(a.T @ x @ theta[k])
            want = torch.stack([t.norm() for t in terms])
            torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-6)
            y = layer(x, ei, et)
            # the terms are the layer's output, split by sort
            torch.testing.assert_close(sum(terms) + layer.bias, y, rtol=1e-5, atol=1e-5)
            x = y + x @ root
            x = torch.relu(x) if i == 0 else x


def test_sort_contributions_need_an_encoder():
    with pytest.raises(ValueError, match="encoder_layers > 0"):
        sc.kg.LinkPredictor(5, 2, 4).sort_contributions()


# -- real data --------------------------------------------------------------------------------
def test_kg_loader_names_relations_and_inverses():
    from structconv.data.kg import load_kg

    d = load_kg(need("wn18rr"))
    assert d.num_relations == 11
    names = d.relation_names
    assert len(names) == 22 and names[11] == names[0] + "^-1"
    mined = mine_sorts(*d.graph(), d.num_entities, relations=names, top=5, backtrack=False)
    assert len(mined) == 5 and all("." in m.name for m in mined)


def test_training_resumes_from_its_checkpoint_exactly(tmp_path):
    train, test, E, R = _tiny_kg()

    def fresh():
        torch.manual_seed(0)
        return sc.kg.LinkPredictor(E, R, 8, "complex", init_std=0.1)

    kw = dict(mode="negative", batch_size=64, lr=0.05, negatives=2, seed=3)
    whole = fresh()
    h_whole = sc.training.train_link(whole, train, epochs=4, **kw)
    part = fresh()
    sc.training.train_link(part, train, epochs=2, checkpoint_dir=tmp_path, **kw)
    resumed = fresh()  # a new process: the checkpoint carries model, optimizer and RNG
    h_res = sc.training.train_link(resumed, train, epochs=4, checkpoint_dir=tmp_path, **kw)
    assert [h["loss"] for h in h_res] == [h["loss"] for h in h_whole]
    for k, v in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v, rtol=0, atol=0)


# -- command line -----------------------------------------------------------------------------
def _write_kg(folder, train, valid, test, names=("p", "q", "r")):
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("valid", valid), ("test", test)):
        (folder / f"{split}.txt").write_text(
            "".join(f"e{h}\t{names[r]}\te{t}\n" for h, r, t in rows.tolist()))
    return folder


def test_cli_kg_sorts_kg_link_and_bench(tmp_path, capsys):
    from structconv.cli import main

    train, test, E, R = _tiny_kg()
    root = _write_kg(tmp_path / "kg" / "WN18RR", train, test[:20], test[20:])
    assert main(["kg", "sorts", "wn18rr", "--root", str(root), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 paths by support" in out and " => " in out.replace("=>", " => ")
    assert main(["reproduce", "kg-link", "--dataset", "wn18rr", "--data", str(root), "--quick",
                 "--dim", "8", "--batch", "64", "--mode", "1vsall", "--epochs", "2",
                 "--out", str(tmp_path / "runs")]) == 0
    import json

    res = json.loads((tmp_path / "runs" / "kg_link" / "wn18rr-distmult-1vsall-d8-enc0" /
                      "result.json").read_text())
    assert res["epochs_done"] == 2 and 0 < res["test"]["mrr"] <= 1
    assert main(["bench", "kg", "--quick", "--repeats", "1", "--out", str(tmp_path / "b")]) == 0
    b = json.loads((tmp_path / "b" / "kg.json").read_text())
    assert b["eval"]["eval_seconds"] > 0 and b["sorts"]["ratio_2sorts_over_single"] > 0
    # an R-GCN encoder with mined sorts reports which sorts it used, by name
    assert main(["reproduce", "kg-link", "--dataset", "wn18rr", "--data", str(root), "--quick",
                 "--dim", "10", "--mode", "negative", "--encoder-layers", "1", "--sorts", "mined",
                 "--top", "2", "--out", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "most used sorts" in out and "mined 2-sorts' ranks among" in out
    res = json.loads((tmp_path / "runs" / "kg_link" / "wn18rr-distmult-negative-d10-enc1-mined" /
                      "result.json").read_text())
    use = res["sort_usage"]
    assert len(use["mined"]) == 2 and all(1 <= m[1] <= use["sorts"] for m in use["mined"])
    assert use["mined"][0][0] == res["mined"][0]["name"]


@pytest.mark.parametrize("lines,match", [
    ("e1\tp\n", r"line 1 is 'e1\\tp'; expected head<TAB>relation<TAB>tail"),
    ("", "no triples"),
    ("e1\tp\te2\n\xff", "not UTF-8 text"),
])
def test_cli_kg_bad_files_exit_2_with_one_line(tmp_path, capsys, lines, match):
    import re

    from structconv.cli import main

    root = _write_kg(tmp_path / "kg", torch.tensor([[0, 0, 1]]), torch.tensor([[0, 0, 1]]),
                     torch.tensor([[0, 0, 1]]))
    (root / "test.txt").write_bytes(lines.encode("latin-1"))
    assert main(["kg", "sorts", "fb15k-237", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(match, err[0]), err


def test_cli_kg_sorts_refuses_a_graph_without_relations(capsys):
    from structconv.cli import main

    assert main(["kg", "sorts", "karate"]) == 2
    assert "has no relation types" in capsys.readouterr().err


@pytest.mark.parametrize("identity", [False, True])
@pytest.mark.parametrize("form", ["full", "blocks", "big_blocks"])
def test_per_sort_route_equals_the_definition_values_and_gradients(identity, form):
    from structconv.params import Full, Grouped

    g = torch.Generator().manual_seed(1)
    N, E, R = 40, 400, 20
    ei = torch.randint(0, N, (2, E), generator=g)
    et = torch.randint(0, R, (E,), generator=g)
    sorts = [(r,) for r in range(R)] + [(0, 1), (2, 3, 4)]
    b = sc.basis.relational(ei, et, N, sorts, identity=identity, dtype=torch.float64)
    torch.manual_seed(0)
    th = {"full": lambda: Full(b.K, 10, 15), "blocks": lambda: Grouped(b.K, 10, 15, 5),
          "big_blocks": lambda: Grouped(b.K, 40, 40, 40)}[form]().double()
    x = torch.randn(2, N, th.P, dtype=torch.float64, requires_grad=True)
    assert "per_sort" in [r.name for r in b.routes(x, th)]
    want = torch.einsum("kmn,bmp,kpq->bnq", b.to_dense(), x, th())
    got = sc.convolve(x, b, th, route="per_sort")
    torch.testing.assert_close(got, want)
    g1 = torch.autograd.grad(want.square().sum(), [x, *th.parameters()])
    g2 = torch.autograd.grad(got.square().sum(), [x, *th.parameters()])
    for a, c in zip(g1, g2):
        torch.testing.assert_close(c, a)

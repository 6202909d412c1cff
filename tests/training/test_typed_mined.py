"""``metapaths = "mined:K"``: HAN over the metapaths mined from the target type back to it,
trained from a config exactly as over the same sorts named; bad values refused by name."""

from __future__ import annotations

import pytest

import structconv as sc
from structconv.basis import mine_metapaths
from structconv.config import ConfigError, apply_overrides, load_config, mined_metapaths
from structconv.models.hetero import typed_metadata
from tests.conftest import tiny_imdb

FAST = ["train.epochs=2", "model.hetero.hidden=8", "train.checkpoint_seconds=1e9"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tiny_imdb(tmp_path_factory.mktemp("imdb"))


def _cfg(root, metapaths) -> dict:
    cfg = apply_overrides(load_config("hetero_han_imdb"), [*FAST, f"data.root='{root}'"])
    cfg["model"]["hetero"]["metapaths"] = metapaths
    return cfg


def test_mined_sorts_train_as_the_same_sorts_named(tmp_path, root):
    graph = sc.data.load_dataset("imdb", root=root)
    mined = [m.name for m in mine_metapaths(graph, "movie", "movie", max_length=2, top=2)]
    # on IMDB's schema the two best supported movie-to-movie sorts are HAN's named ones
    assert sorted(mined) == ["movie.to.actor.to.movie", "movie.to.director.to.movie"]
    spec = {**load_config("hetero_han_imdb")["model"]["hetero"], "metapaths": "mined:2"}
    assert [e[1] for e in typed_metadata(spec, graph)[1]] == mined
    a = sc.train(_cfg(root, "mined:2"), tmp_path / "mined")
    b = sc.train(_cfg(root, mined), tmp_path / "named")
    for k in ("test_macro_f1", "test_micro_f1", "val_loss", "best_epoch"):
        assert a[k] == b[k], k


def test_longer_mined_sorts_reach_length_four(root):
    graph = sc.data.load_dataset("imdb", root=root)
    spec = {**load_config("hetero_han_imdb")["model"]["hetero"], "metapaths": "mined:6:4"}
    names = [e[1] for e in typed_metadata(spec, graph)[1]]
    want = [m.name for m in mine_metapaths(graph, "movie", "movie", max_length=4, top=6)]
    assert names == want and max(n.count(".") for n in names) == 8  # four relations


@pytest.mark.parametrize("value,want", [("mined:3", (3, 2)), ("mined:2:4", (2, 4)),
                                        (["movie.to.actor.to.movie"], None)])
def test_mined_values_parse(value, want):
    assert mined_metapaths(value) == want


@pytest.mark.parametrize("kind,value", [
    ("han", "mined"), ("han", "mined:0"), ("han", "mined:2:5"), ("han", "mined:two"),
    ("han", "mine:2"), ("han", "mined:2:0"), ("sage", "mined:2"),
])
def test_bad_mined_values_are_named(kind, value):
    cfg = {"data": {"name": "imdb"}, "model": {"hetero": {"kind": kind, "metapaths": value}}}
    with pytest.raises(ConfigError, match=r"model\.hetero\.metapaths"):
        sc.train(cfg, "unused")


def test_a_target_with_no_way_back_is_refused(tmp_path):
    # a graph whose labelled type no relation leaves: nothing to mine
    import torch

    g = sc.data.HeteroGraph({"m": 3, "a": 2}, {("a", "r", "m"): torch.tensor([[0, 1], [0, 2]])},
                            x={"m": torch.randn(3, 2), "a": torch.randn(2, 2)},
                            y={"m": torch.tensor([0, 1, 0])},
                            masks={"m": {"train": torch.tensor([True, True, False])}})
    spec = {**load_config("hetero_han_imdb")["model"]["hetero"], "metapaths": "mined:2"}
    with pytest.raises(ConfigError, match="no metapath from 'm'"):
        typed_metadata(spec, g)

"""Model configs: every basis kind and parameter form is built through the registries."""

import sys

import pytest
import torch

import structconv as sc
from structconv.config import ConfigError, parse_config, validate
from structconv.models import build_model


class _Data:
    """The smallest image dataset build_model accepts: 1 channel on a 6x6 grid, 3 classes."""

    task, num_classes, shape = "image", 3, (1, 6, 6)


def _cfg(basis: str, extra: str = "") -> dict:
    text = f'''
name = "t"
[data]
name = "digits"
[[model.layers]]
basis = {basis}
channels = 4
{extra}
'''
    return validate(parse_config(text))


def test_shipped_kind_and_form():
    m = build_model(_cfg('{ kind = "grid", kernel_size = 3, padding = 1 }', 'param = "separable"'
                         '\nH = 2'), _Data())
    conv = m.blocks[0].conv
    assert isinstance(conv.basis, sc.basis.Grid) and isinstance(conv.param,
                                                                 sc.params.ControlledSeparable)
    assert m(torch.randn(2, 1, 6, 6)).shape == (2, 3)


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown basis kind 'gird' \(did you mean grid\?\); "
                                          r"known: .*gcn.*grid"):
        _cfg('"gird"')
    with pytest.raises(ConfigError, match="unknown param 'diag'.*lowrank"):
        _cfg('"grid"', 'param = "diag"')


def test_user_registered_kind_in_a_config():
    calls = []

    def build(spec, structure):
        calls.append((spec, structure.grid))
        return sc.basis.Grid(structure.grid, spec.get("size", 3), padding=1)

    sc.basis.register("my_grid_test", build)
    try:
        m = build_model(_cfg('{ kind = "my_grid_test", size = 3 }'), _Data())
        assert calls == [({"kind": "my_grid_test", "size": 3}, (6, 6))]
        assert m(torch.randn(1, 1, 6, 6)).shape == (1, 3)
    finally:
        sc.basis.BASES._builders.pop("my_grid_test")


def test_a_kinds_check_trait_runs_when_the_config_is_validated():
    def check(spec, where):
        if spec.get("size", 3) % 2 == 0:
            raise sc.basis.KindError(f"{where}.size must be odd, got {spec['size']!r}")

    sc.basis.register("odd_grid_test", lambda spec, s: sc.basis.Grid(s.grid, 3, padding=1),
                      check=check)
    try:
        _cfg('{ kind = "odd_grid_test", size = 5 }')
        with pytest.raises(ConfigError, match=r"model.layers.0.basis.size must be odd, got 4"):
            _cfg('{ kind = "odd_grid_test", size = 4 }')
        with pytest.raises(ConfigError, match=r"model.layers.0.basis.parts.1.size must be odd"):
            _cfg('{ kind = "stack", parts = ["grid", { kind = "odd_grid_test", size = 2 }] }')
    finally:
        sc.basis.BASES.unregister("odd_grid_test")


def test_import_path_kind(tmp_path, monkeypatch):
    (tmp_path / "my_bases_test.py").write_text(
        "import structconv as sc\n"
        "def ring(spec, s):\n"
        "    n = s.entries\n"
        "    idx = __import__('torch').arange(n)\n"
        "    k = idx * 0\n"
        "    return sc.basis.Sparse(__import__('torch').stack([k, idx, (idx + 1) % n]), None,"
        " (1, n, n))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = _cfg('{ kind = "my_bases_test:ring" }')  # validation does not import it
    assert "my_bases_test" not in sys.modules
    m = build_model(cfg, _Data())
    assert m.blocks[0].conv.basis.shape == (1, 36, 36)
    with pytest.raises(ConfigError, match="model.layers.0.basis: basis kind 'no_such_mod_xyz:f':"
                                          " cannot import 'no_such_mod_xyz'"):
        build_model(_cfg('{ kind = "no_such_mod_xyz:f" }'), _Data())
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        build_model(_cfg('{ kind = "my_bases_test:nope" }'), _Data())


def test_builder_returning_no_basis_is_refused():
    sc.basis.register("bad_test", lambda spec, s: torch.zeros(3))
    try:
        with pytest.raises(ConfigError, match="returned Tensor, not a sc.basis.Basis"):
            build_model(_cfg('"bad_test"'), _Data())
    finally:
        sc.basis.BASES._builders.pop("bad_test")


def test_content_kinds_are_built_by_their_layer():
    assert sc.basis.BASES.trait("attention", "content") is True
    assert not sc.basis.BASES.trait("grid", "content", False)
    with pytest.raises(sc.basis.KindError, match="computed from content"):
        sc.basis.build("attention", sc.basis.Structure(grid=(4,)))


def test_lm_config_takes_canon_layers():
    """[model.lm] canon / canon_kernel reach TransformerLM; bad places are one ConfigError."""
    from structconv.models import build_model
    from structconv.training import load_data

    base = ('[data]\nname = "python-text"\noptions = { limit = 4000 }\nseq_len = 16\n'
            '[model.lm]\nwidth = 16\nlayers = 1\nheads = 2\nposition = "none"\n')
    plain = parse_config(base)
    cfg = parse_config(base + 'canon = "ABCD"\ncanon_kernel = 3\n')
    data = load_data(cfg)
    extra = sum(p.numel() for p in build_model(cfg, data).parameters()) - \
        sum(p.numel() for p in build_model(plain, data).parameters())
    # kernel x channels per place: A 16, B 3 x 16, C 16, D the feed-forward width 4 x 16
    assert extra == 3 * (16 + 48 + 16 + 64)
    cases = (('canon = "AX"', "unknown Canon place"), ("canon_kernel = 0", "canon_kernel"),
             ('canon = "AA"', "names a place twice"))
    for bad, match in cases:
        with pytest.raises(ConfigError, match=match):
            parse_config(base + bad + "\n")


@pytest.mark.parametrize("key", ["link", "seq2seq", "gin", "hetero", "graph", "twin"])
def test_a_config_written_before_a_model_table_existed_still_validates(key):
    # a run directory's config.json from before [model.<key>] was added has no such key:
    # resuming it must read it as "not that kind", not fail on the missing key
    from structconv.config import load_config

    cfg = load_config("gcn_karate")
    cfg["model"].pop(key, None)
    assert validate(cfg, "old run")["model"].get(key) is None

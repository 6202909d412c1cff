"""``[model.lm]`` and ``[model.seq2seq]`` configs: keys that do not apply are refused by name,
and the memory estimate sizes the model from the config alone (exact parameter counts, no
build), so an absurd model is refused at once.
"""

import itertools
import time
from types import SimpleNamespace

import pytest

from structconv.config import LM_KEYS, SEQ2SEQ_KEYS, ConfigError, load_config
from structconv.models.build import check_memory, memory_estimate
from structconv.models.sizes import lm_parameters, seq2seq_parameters
from structconv.nn import PervasiveAttention, Seq2Seq, TransformerLM


def _count(m):
    return sum(p.numel() for p in m.parameters())


LM_CASES = [dict(position=p, canon=c, bias=b, tie_weights=t, ffn=f)
            for p, c, (b, t, f) in itertools.product(
                ("none", "learned", "rotary", "alibi", "relative", "shift", "shift+alibi"),
                ("", "ABCD", "BD"), ((True, True, 0), (False, False, 20)))]


@pytest.mark.parametrize("kw", LM_CASES, ids=lambda kw: "-".join(map(str, kw.values())))
def test_lm_parameter_count_from_the_config_is_exact(kw):
    s = {**LM_KEYS, "width": 8, "layers": 2, "heads": 2, "shifts": 3, "canon_kernel": 3, **kw}
    m = TransformerLM(17, s["width"], s["layers"], s["heads"], s["position"], s["shifts"],
                      s["ffn"] or None, context=11, bias=s["bias"], tie_weights=s["tie_weights"],
                      canon=s["canon"], canon_kernel=s["canon_kernel"])
    assert lm_parameters(s, 17, 11) == _count(m)


S2S_CASES = [dict(position=p, canon=c, ffn=f, src_shifts=ss)
             for p, c, (f, ss) in itertools.product(
                 ("sinusoidal", "learned", "rotary", "alibi", "shift", "shift+alibi"),
                 ("", "ABCD", "AC"), ((0, 0), (24, 5)))]


@pytest.mark.parametrize("kw", S2S_CASES, ids=lambda kw: "-".join(map(str, kw.values())))
def test_seq2seq_parameter_count_from_the_config_is_exact(kw):
    s = {**SEQ2SEQ_KEYS, "width": 8, "layers": 2, "heads": 2, "shifts": 3, "canon_kernel": 3,
         **kw}
    m = Seq2Seq(11, 13, s["width"], s["layers"], s["heads"], s["position"], s["shifts"],
                s["ffn"] or None, src_shifts=s["src_shifts"] or None, context=9,
                canon=s["canon"], canon_kernel=s["canon_kernel"])
    assert seq2seq_parameters(s, 11, 13, 9) == _count(m)


@pytest.mark.parametrize("pooling, bottleneck, layers, heads, kernel",
                         [("attention", 0, 1, 1, 3), ("attention", 6, 3, 2, 5),
                          ("max", 0, 2, 1, 1), ("max", 5, 4, 3, 3)])
def test_pervasive_parameter_count_from_the_config_is_exact(pooling, bottleneck, layers, heads,
                                                            kernel):
    s = {**SEQ2SEQ_KEYS, "kind": "pervasive", "embed": 4, "growth": 3, "layers": layers,
         "bottleneck": bottleneck, "pooling": pooling, "heads": heads, "kernel": kernel}
    m = PervasiveAttention(11, 13, s["embed"], layers, s["growth"], kernel,
                           bottleneck=bottleneck or None, pooling=pooling, heads=heads)
    assert seq2seq_parameters(s, 11, 13, 0) == _count(m)


TEXT = SimpleNamespace(task="text", vocab=list(range(65)))
G2P = SimpleNamespace(task="g2p", graphemes=list(range(30)), phonemes=list(range(44)),
                      longest=lambda: (12, 11))


@pytest.mark.parametrize("name, data, override", [
    ("transformer_python", TEXT, "model.lm.layers=1000000"),
    ("transformer_python", TEXT, "model.lm.width=1000000"),
    ("g2p_transformer", G2P, "model.seq2seq.layers=1000000"),
    ("g2p_pervasive", G2P, "model.seq2seq.layers=1000000"),
])
def test_an_absurd_sequence_model_is_refused_at_once_without_building_it(name, data, override):
    # the estimate used to build the model first: a million layers grew until memory ran out
    cfg = load_config(name, [override])
    t = time.perf_counter()
    with pytest.raises(ConfigError, match="parameters.*more than the .* available"):
        check_memory(cfg, data, "cpu")
    assert time.perf_counter() - t < 1.0


@pytest.mark.parametrize("name, data, override", [
    ("transformer_python", TEXT, 'model.lm.canon="AD"'),
    ("g2p_transformer", G2P, 'model.seq2seq.position="shift"'),
    ("g2p_pervasive", G2P, "model.seq2seq.layers=2"),
])
def test_the_estimate_without_a_model_equals_the_one_of_the_built_model(name, data, override):
    from structconv.models import build_model

    cfg = load_config(name, [override])
    built = build_model(cfg, SimpleNamespace(**vars(data)))
    assert memory_estimate(cfg, data) == memory_estimate(cfg, data, built)


@pytest.mark.parametrize("name, override, pattern", [
    ("g2p_pervasive", 'model.seq2seq.canon="A"',
     r"model.seq2seq.canon does not apply to kind = 'pervasive': it is a key of kind "
     r"'transformer'"),
    ("g2p_pervasive", "model.seq2seq.width=64", "model.seq2seq.width does not apply to kind"),
    ("g2p_pervasive", "model.seq2seq.position=alibi", "position does not apply to kind"),
    ("g2p_transformer", "model.seq2seq.growth=8",
     "model.seq2seq.growth does not apply to kind = 'transformer': it is a key of kind "
     "'pervasive'"),
    ("g2p_transformer", "model.seq2seq.pooling=max", "pooling does not apply to kind"),
    ("g2p_transformer", "model.seq2seq.context=40",
     "model.seq2seq.context sizes the learned position table: it does not apply to position "
     "= 'sinusoidal'"),
    ("g2p_transformer", "model.seq2seq.canon_kernel=3",
     "canon_kernel sizes the Canon layers: it does not apply without canon"),
    ("transformer_python", "model.lm.context=64",
     "model.lm.context sizes the learned position table: it does not apply to position = "
     "'shift'"),
    ("transformer_python", "model.lm.canon_kernel=2", "model.lm.canon_kernel sizes the Canon"),
])
def test_keys_that_do_not_apply_are_refused_by_name(name, override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(name, [override])


@pytest.mark.parametrize("name, overrides", [
    ("g2p_transformer", ['model.seq2seq.position="learned"', "model.seq2seq.context=40"]),
    ("g2p_transformer", ['model.seq2seq.canon="AB"', "model.seq2seq.canon_kernel=3"]),
    ("transformer_python", ["model.lm.position=alibi"]),  # the file's shifts stay allowed
    ("g2p_pervasive", ["model.seq2seq.pooling=max", "model.seq2seq.beam=2"]),
])
def test_keys_that_apply_are_accepted(name, overrides):
    load_config(name, overrides)


def test_structconv_train_refuses_an_absurd_language_model_before_building_it(tmp_path):
    # through the trainer: the estimate runs before the model is built, so a million layers
    # are refused in well under a second instead of growing until memory runs out
    import structconv as sc

    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="the model needs about"):
        sc.train("transformer_python", out=tmp_path / "run",
                 overrides=["model.lm.layers=1000000"])
    assert time.perf_counter() - t0 < 30
    assert not (tmp_path / "run" / "best.safetensors").exists()

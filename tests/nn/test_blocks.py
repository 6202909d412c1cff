"""The one feed-forward and pre-norm block (structconv.nn.blocks): ``FeedForward`` against its
two maps written out, ``PreNormBlock`` against its branches written out, and the models built
on them (TransformerLM, Seq2Seq, a declared ``mlp`` layer) keeping their checkpoints: the same
state_dict names in the same order as before the blocks were shared, loadable under either
name, and fixed-seed outputs as the models gave before."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import structconv as sc
from structconv.config import parse_config, validate
from structconv.models import build_model
from structconv.nn.blocks import FeedForward, PreNormBlock, former_keys
from structconv.training.checkpoint import check_fits
from tests.conftest import TinyImages


def test_feed_forward_is_its_two_maps():
    torch.manual_seed(0)
    ff = FeedForward(5, 7, F.relu, out_width=3)
    x = torch.randn(2, 4, 5)
    want = ff.proj(F.relu(ff.fc(x)))
    assert torch.equal(ff(x), want)
    assert ff.fc.weight.shape == (7, 5) and ff.proj.weight.shape == (3, 7)
    # the Canon places C (the input) and D (the hidden layer, before the activation)
    marks = []

    def canon(place, h):
        marks.append((place, h.shape[-1]))
        return 2 * h

    got = ff(x, canon)
    assert marks == [("C", 5), ("D", 7)]
    torch.testing.assert_close(got, ff.proj(F.relu(2 * ff.fc(2 * x))), rtol=0, atol=1e-14)


def test_feed_forward_without_activation_and_with_dropout():
    torch.manual_seed(0)
    lin = FeedForward(4, 6, None)
    x = torch.randn(3, 4)
    assert torch.equal(lin(x), lin.proj(lin.fc(x)))
    drop = FeedForward(4, 6, dropout=0.5).train()
    assert isinstance(drop.drop, nn.Dropout) and FeedForward(4, 6).drop is None
    torch.manual_seed(1)
    a = drop(x)
    torch.manual_seed(1)
    b = drop.proj(F.dropout(F.gelu(drop.fc(x)), 0.5, True))
    assert torch.equal(a, b)
    assert torch.equal(drop.eval()(x), drop.proj(F.gelu(drop.fc(x))))


@pytest.mark.parametrize("kw, match", [
    (dict(width=0, hidden=3), "width must be an int >= 1, got 0"),
    (dict(width=2, hidden=True), "hidden must be an int >= 1, got True"),
    (dict(width=2, hidden=3, out_width=2.5), "out_width must be an int >= 1, got 2.5"),
    (dict(width=2, hidden=3, dropout=1.0), r"dropout must be a number in \[0, 1\), got 1.0"),
])
def test_feed_forward_bad_sizes_are_named(kw, match):
    with pytest.raises(ValueError, match=f"FeedForward: {match}"):
        FeedForward(**kw)


def test_feed_forward_activation_must_be_callable():
    with pytest.raises(TypeError, match="FeedForward: activation must be a function or None, "
                                        "got 'relu'"):
        FeedForward(2, 3, "relu")


class _Two(PreNormBlock):
    def __init__(self):
        super().__init__(0.0)
        self.n1, self.n2 = nn.LayerNorm(4), nn.LayerNorm(4)
        self.a, self.ff = nn.Linear(4, 4), FeedForward(4, 5)

    def branches(self, scale):
        return ((self.n1, lambda h: scale * self.a(h)), (self.n2, self.ff))


def test_pre_norm_block_runs_its_branches_in_order():
    torch.manual_seed(0)
    b = _Two()
    with torch.no_grad():
        for n in (b.n1, b.n2):
            n.weight.uniform_(0.5, 1.5)
            n.bias.normal_()
    x = torch.randn(2, 3, 4)
    h = x + 3 * b.a(b.n1(x))
    want = h + b.ff(b.n2(h))
    assert torch.equal(b(x, 3), want)
    # the other order is another function: the test can tell
    h = x + b.ff(b.n2(x))
    assert not torch.allclose(b(x, 3), h + 3 * b.a(b.n1(h)))


def test_pre_norm_block_dropout_on_each_branch():
    b = _Two()
    b.drop.p = 0.5
    b.train()
    x = torch.randn(2, 3, 4)
    torch.manual_seed(4)
    got = b(x, 1)
    torch.manual_seed(4)
    h = x + F.dropout(b.a(b.n1(x)), 0.5, True)
    assert torch.equal(got, h + F.dropout(b.ff(b.n2(h)), 0.5, True))


def test_pre_norm_block_without_residual_and_with_a_skip():
    torch.manual_seed(0)
    b = _Two()
    x = torch.randn(2, 3, 4)
    plain = _Two()
    plain.load_state_dict(b.state_dict())
    plain.residual = False
    h = 3 * b.a(b.n1(x))
    assert torch.equal(plain(x, 3), b.ff(b.n2(h)))
    assert not torch.allclose(plain(x, 3), b(x, 3))

    class _Rows(_Two):
        def branches(self, scale):  # a sublayer that keeps the first 2 rows
            return ((self.n1, lambda h: scale * self.a(h)[:, :2]),)

        def skip(self, x, h):
            return x[:, :h.shape[1]]

    r = _Rows()
    r.load_state_dict(b.state_dict())
    assert torch.equal(r(x, 3), x[:, :2] + 3 * b.a(b.n1(x))[:, :2])
    with pytest.raises(TypeError, match="residual must be True or False, got 1"):
        PreNormBlock(residual=1)


def test_declared_block_is_a_pre_norm_branch_written_out():
    from structconv.models.declared import Block

    net = build_model(validate(parse_config(CFG)), TinyImages())
    blocks = list(net.blocks)
    assert all(isinstance(b, PreNormBlock) for b in blocks)
    conv1, mlp, attn = blocks
    assert (conv1.residual, mlp.residual, attn.residual) == (False, True, True)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 4, generator=g)
    with torch.no_grad():
        for b in (mlp, attn):
            b.norm.weight.uniform_(0.5, 1.5)
            b.norm.bias.normal_()
    mlp.dropout = attn.dropout = 0.3
    net.train()
    for b in (mlp, attn):
        torch.manual_seed(5)
        got = b(x)
        torch.manual_seed(5)
        h = b.conv(F.dropout(b.norm(x), 0.3, True))
        assert torch.equal(got, x + (h if b.act is None else b.act(h)))
    # no residual, no norm: the convolution and activation of the dropped input alone
    x1 = torch.randn(2, 16, 1, generator=g)
    assert torch.equal(conv1.eval()(x1), conv1.act(conv1.conv(x1)))
    assert isinstance(conv1, Block) and conv1.norm is None


# -- the models' checkpoints ---------------------------------------------------------------------
CFG = '''
name = "t"
[data]
name = "digits"
[[model.layers]]
basis = { kind = "grid", kernel_size = 3, padding = 1 }
channels = 4
activation = "relu"
[[model.layers]]
type = "mlp"
hidden = 6
norm = "layer"
[[model.layers]]
basis = { kind = "attention", heads = 2 }
channels = 4
norm = "layer"
residual = true
'''


def _models():
    """A language model, a seq2seq model and a declared net, each built under seed 0."""
    torch.manual_seed(0)
    lm = sc.nn.TransformerLM(11, 8, 2, 2, "shift", 2, 12, canon="ABCD")
    torch.manual_seed(0)
    s2s = sc.nn.Seq2Seq(7, 9, width=8, layers=1, dec_layers=2, heads=2, position="shift",
                        shifts=2, ffn=12, canon="ABCD")
    torch.manual_seed(0)
    net = build_model(validate(parse_config(CFG)), TinyImages())
    return {"lm": lm, "seq2seq": s2s, "declared": net}


def _outputs(models):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 11, (2, 6), generator=g)
    src = torch.randint(3, 7, (2, 5), generator=g)
    src[1, 3:] = 0
    tgt = torch.randint(3, 9, (2, 4), generator=g)
    tgt[:, 0] = 1
    img = torch.randn(2, 1, 4, 4, generator=g)
    with torch.no_grad():
        return {"lm": models["lm"](ids), "seq2seq": models["seq2seq"](src, tgt),
                "declared": models["declared"](img)}


def _block_keys(prefix: str, names: str) -> list[str]:
    return [f"{prefix}{n}" for n in names.split()]


#: the state_dict names (in order) the models had before the blocks were shared
LM_BLOCK = ("ln1.weight ln1.bias ln2.weight ln2.bias attn.in_proj.weight attn.in_proj.bias "
            "attn.out_proj.weight attn.out_proj.bias attn.canon.param.weight fc.weight fc.bias "
            "proj.weight proj.bias canon.A.param.weight canon.C.param.weight "
            "canon.D.param.weight")
ENC_BLOCK = ("ln.weight ln.bias attn.in_proj.weight attn.in_proj.bias attn.out_proj.weight "
             "attn.out_proj.bias attn.canon.param.weight ff.ln.weight ff.ln.bias ff.fc.weight "
             "ff.fc.bias ff.proj.weight ff.proj.bias ff.canon.C.param.weight "
             "ff.canon.D.param.weight canon_a.param.weight")
DEC_BLOCK = ("ln1.weight ln1.bias ln2.weight ln2.bias self_attn.in_proj.weight "
             "self_attn.in_proj.bias self_attn.out_proj.weight self_attn.out_proj.bias "
             "self_attn.canon.param.weight cross_attn.q_proj.weight cross_attn.q_proj.bias "
             "cross_attn.kv_proj.weight cross_attn.kv_proj.bias cross_attn.out_proj.weight "
             "cross_attn.out_proj.bias ff.ln.weight ff.ln.bias ff.fc.weight ff.fc.bias "
             "ff.proj.weight ff.proj.bias ff.canon.C.param.weight ff.canon.D.param.weight "
             "canon_a.param.weight")
FORMER = {
    "lm": ["tok.weight", *_block_keys("blocks.0.", LM_BLOCK), *_block_keys("blocks.1.", LM_BLOCK),
           "ln.weight", "ln.bias", "head.weight"],
    "seq2seq": ["src_tok.weight", "tgt_tok.weight", *_block_keys("encoder.0.", ENC_BLOCK),
                *_block_keys("decoder.0.", DEC_BLOCK), *_block_keys("decoder.1.", DEC_BLOCK),
                "ln_enc.weight", "ln_enc.bias", "ln_dec.weight", "ln_dec.bias", "head.weight"],
    "declared": ["blocks.0.conv.bias", "blocks.0.conv.param.weight", "blocks.1.conv.inner.weight",
                 "blocks.1.conv.inner.bias", "blocks.1.conv.outer.weight",
                 "blocks.1.conv.outer.bias", "blocks.1.norm.weight", "blocks.1.norm.bias",
                 "blocks.2.conv.bias", "blocks.2.conv.scores.key", "blocks.2.conv.scores.query",
                 "blocks.2.conv.param.weight",
                 "blocks.2.norm.weight", "blocks.2.norm.bias", "classifier.weight",
                 "classifier.bias"],
}

#: each model's outputs on ``_outputs``'s inputs before the blocks were shared (the sum of every
#: output and the first four; recorded with the models as they were: the same to the bit)
BEFORE = {
    "lm": (0.473333477973938, [0.24237559735774994, 0.009021032601594925,
                               -0.010890704579651356, -0.05104522034525871]),
    "seq2seq": (0.8121387958526611, [-0.03851299732923508, 0.11111874878406525,
                                     0.04120755195617676, -0.07045963406562805]),
    "declared": (1.1585296392440796, [0.28835970163345337, 0.23667456209659576,
                                      0.29916295409202576, 0.24948620796203613]),
}


@pytest.mark.parametrize("name", list(FORMER))
def test_checkpoint_names_are_the_ones_from_before(name):
    m = _models()[name]
    assert list(m.state_dict()) == FORMER[name]


@pytest.mark.parametrize("name", list(FORMER))
def test_fixed_seed_outputs_are_the_ones_from_before(name):
    out = _outputs(_models())[name]
    total, first = BEFORE[name]
    torch.testing.assert_close(out.sum().item(), total, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.flatten()[:4].tolist(), first, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(FORMER))
def test_checkpoints_load_under_former_and_present_names(name):
    models, fresh = _models(), _models()
    with torch.no_grad():
        for p in fresh[name].parameters():
            p.add_(1.0)
    want = _outputs(fresh)[name]
    former = fresh[name].state_dict()
    present = dict(fresh[name].named_parameters(remove_duplicate=False))  # no saved buffers
    assert set(former) != set(present) and len(former) == len(present)
    for state in (former, present):
        m = models[name]
        check_fits(m, former, "here")
        m.load_state_dict(state)
        assert torch.equal(_outputs(models)[name], want)
        with torch.no_grad():
            for p in m.parameters():
                p.zero_()
    # a name that is neither is still refused
    bad = dict(former)
    k = next(k for k in bad if ".fc." in k or ".inner." in k)
    bad[k.replace(".fc.", ".fcx.").replace(".inner.", ".innerx.")] = bad.pop(k)
    with pytest.raises(RuntimeError, match=r"(?s)Missing key.*Unexpected key"):
        models[name].load_state_dict(bad)


def test_models_with_former_names_copy_and_pickle():
    m = _models()["lm"]
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert list(other.state_dict()) == FORMER["lm"]
        other.load_state_dict(m.state_dict())


def test_former_keys_renames_only_its_own_entries():
    class _Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp, self.fcx = FeedForward(2, 3), nn.Linear(2, 2)
            former_keys(self, fc="mlp.fc")

    outer = nn.Sequential(_Net(), _Net())
    keys = list(outer.state_dict())
    assert keys == [f"{i}.{k}" for i in (0, 1) for k in (
        "fc.weight", "fc.bias", "mlp.proj.weight", "mlp.proj.bias", "fcx.weight", "fcx.bias")]
    outer.load_state_dict(outer.state_dict())

"""GridConv / GridAvgPool layers and the torch.nn converters: same outputs and gradients."""

import pytest
import torch
from torch import nn

import structconv as sc
from structconv.basis import Grid
from structconv.nn import GridAvgPool, GridConv, from_torch, to_torch
from structconv.params import ControlledSeparable, DepthwiseSeparable, LowRank

DT = torch.float64
CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}

# (dim, in_ch, out_ch, kernel, stride, padding, dilation, groups, bias, spatial)
CONV_CASES = [
    (1, 3, 5, 3, 1, 0, 1, 1, True, (9,)),
    (1, 4, 6, 4, 1, "same", 2, 2, False, (11,)),  # even kernel: asymmetric "same"
    (1, 4, 8, 5, 3, 2, 1, 4, True, (13,)),  # depthwise with multiplier 2
    (2, 3, 4, (3, 2), (2, 1), (1, 0), (1, 2), 1, True, (7, 8)),
    (2, 4, 4, 3, 1, "same", 1, 4, True, (6, 5)),  # depthwise
    (2, 4, 6, (2, 4), 1, "same", (2, 1), 2, True, (7, 6)),
    (2, 6, 3, 3, 2, "valid", 1, 3, False, (9, 8)),
    (3, 2, 3, (2, 3, 1), (1, 2, 1), (1, 0, 2), 1, 1, True, (4, 5, 3)),
    (3, 3, 3, 3, 1, "same", (1, 2, 1), 3, False, (5, 6, 4)),
]


def make_conv(case, seed=0):
    dim, P, Q, k, s, p, dl, g, bias, spatial = case
    torch.manual_seed(seed)
    m = CONVS[dim](P, Q, k, s, p, dl, g, bias).to(DT)
    x = torch.randn(2, P, *spatial, dtype=DT)
    return m, x


def grads(module, x, gy):
    """y and the gradients of (x, weight, bias if any)."""
    x = x.detach().requires_grad_(True)
    y = module(x)
    named = dict(module.named_parameters())
    params = [named["param.weight" if "param.weight" in named else "weight"]]
    if named.get("bias") is not None:
        params.append(named["bias"])
    return y, torch.autograd.grad(y, [x, *params], gy)


# torch's own warning for its even-kernel "same" padding (the reference side)
@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("path", ["auto", "native", "input_param", "basis_input", "shift",
                                  "tap_gemm", "tap_im2col"])
def test_from_torch_conv_same_outputs_and_grads(case, path):
    m, x = make_conv(case)
    layer = from_torch(m)
    if path == "shift":
        layer.native = False  # the planner's best shift-and-accumulate route
    elif path != "auto":
        layer.route = path
    ref = m(x)
    gy = torch.randn_like(ref)
    y, (gx, gw, *gb) = grads(layer, x, gy)
    assert y.shape == ref.shape and y.is_contiguous()
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    _, (rgx, rgw, *rgb) = grads(m, x, gy)
    torch.testing.assert_close(gx, rgx, rtol=1e-12, atol=1e-12)
    # the torch weight gradient, mapped through the same reshape as the weights
    W_grad_ours = sc.nn.to_torch(_with_weight(layer, gw)).weight
    torch.testing.assert_close(W_grad_ours, rgw, rtol=1e-12, atol=1e-12)
    if m.bias is not None:
        torch.testing.assert_close(gb[0], rgb[0], rtol=1e-12, atol=1e-12)
    # unbatched input, as torch accepts
    torch.testing.assert_close(layer(x[0]), m(x[0]), rtol=1e-12, atol=1e-12)


def _with_weight(layer, w):
    """A copy of ``layer`` whose param weight is ``w`` (to map a gradient like a weight)."""
    import copy

    other = copy.deepcopy(layer)
    other.param.weight = nn.Parameter(w.detach().clone())
    return other


@pytest.mark.parametrize("case", [CONV_CASES[1], CONV_CASES[3], CONV_CASES[7]])
def test_basis_and_param_reproduce_through_convolve(case):
    m, x = make_conv(case, seed=1)
    layer = from_torch(m)
    y = layer(x)
    grid = layer.basis
    assert isinstance(grid, Grid) and grid.in_shape == tuple(x.shape[2:])
    assert grid.out_shape == tuple(y.shape[2:])
    A = grid.to(dtype=DT).to_dense()
    xb = x.movedim(1, -1).reshape(x.shape[0], grid.M, x.shape[1])
    yb = sc.convolve(xb, A, layer.param())
    if layer.bias is not None:
        yb = yb + layer.bias
    torch.testing.assert_close(yb, y.movedim(1, -1).reshape(yb.shape), rtol=1e-12, atol=1e-12)


def test_basis_follows_the_input_size():
    m = nn.Conv2d(2, 3, 3, padding=1).to(DT)
    layer = from_torch(m)
    assert layer.basis is None
    for size in [(5, 6), (7, 4), (5, 6)]:
        x = torch.randn(1, 2, *size, dtype=DT)
        torch.testing.assert_close(layer(x), m(x))
        assert layer.basis.in_shape == size
    assert len(layer._bases) == 2


def test_bundle_layout():
    torch.manual_seed(2)
    layer = GridConv(3, 4, (3, 3), stride=2, padding=((1, 0), (0, 1)), in_shape=(7, 6)).to(DT)
    img = torch.randn(2, 3, 7, 6, dtype=DT)
    y_img = layer(img)
    xb = img.movedim(1, -1).reshape(2, 42, 3)
    y_b = layer(xb)
    assert y_b.shape == (2, layer.basis.N, 4)
    torch.testing.assert_close(y_b, y_img.movedim(1, -1).reshape(y_b.shape))
    torch.testing.assert_close(layer(xb[0]), y_b[0])
    torch.testing.assert_close(layer(img[0]), y_img[0])


def test_layout_ambiguity_and_errors():
    # a 1-d layer over 4 positions with 4 channels: (2, 4, 4) reads both ways
    layer = GridConv(4, 2, 3, padding=1, in_shape=(4,))
    with pytest.raises(ValueError, match="both as an image and as a bundle"):
        layer(torch.randn(2, 4, 4))
    forced = GridConv(4, 2, 3, padding=1, in_shape=(4,), layout="bundle")
    assert forced(torch.randn(2, 4, 4)).shape == (2, 4, 2)
    with pytest.raises(ValueError, match=r"expects an image \(N, 3"):
        GridConv(3, 2, 3, dim=2)(torch.randn(1, 4, 8, 8))
    with pytest.raises(ValueError, match="dim="):
        GridConv(3, 2, 3)
    with pytest.raises(ValueError, match="needs in_shape"):
        GridConv(3, 2, 3, dim=1, layout="bundle")
    with pytest.raises(ValueError, match="groups=2 must divide"):
        GridConv(3, 4, 3, dim=1, groups=2)
    with pytest.raises(ValueError, match="padding_mode='reflect'"):
        from_torch(nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"))
    with pytest.raises(ValueError, match="layout must be"):
        GridConv(3, 2, 3, dim=1, layout="nchw")


@pytest.mark.parametrize("param", ["full", "depthwise", "grouped", "separable", "lowrank"])
def test_to_torch_round_trip(param):
    torch.manual_seed(3)
    K = 6
    forms = {"full": "full", "depthwise": DepthwiseSeparable(K, 4, 6),
             "grouped": "full", "separable": ControlledSeparable(K, 4, 6, 2),
             "lowrank": LowRank(K, 4, 6, 2)}
    groups = 2 if param == "grouped" else 1
    layer = GridConv(4, 6, (2, 3), stride=(1, 2), padding=((1, 0), (1, 1)), groups=groups,
                     param=forms[param]).to(DT)
    x = torch.randn(2, 4, 5, 7, dtype=DT)
    t = to_torch(layer)
    torch.testing.assert_close(t(x), layer(x), rtol=1e-12, atol=1e-12)
    if param == "depthwise":  # two torch layers keep the factor structure (K*P + P*Q)
        assert sum(p.numel() for p in t.parameters()) == K * 4 + 4 * 6 + 6
    back = from_torch(t if isinstance(t, nn.Conv2d) else _only_conv(t))
    if isinstance(t, nn.Conv2d):
        torch.testing.assert_close(back(x), layer(x), rtol=1e-12, atol=1e-12)


def _only_conv(seq):
    return next(m for m in seq if isinstance(m, nn.Conv2d))


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("case", CONV_CASES)
def test_from_torch_to_torch_identity(case):
    m, x = make_conv(case, seed=4)
    t = to_torch(from_torch(m))
    torch.testing.assert_close(t(x), m(x), rtol=1e-12, atol=1e-12)
    if isinstance(t, type(m)):
        assert torch.equal(t.weight, m.weight)


def test_same_padding_uses_torch_same():
    m = nn.Conv1d(2, 2, 4, padding="same", dilation=1)
    t = to_torch(from_torch(m))
    assert isinstance(t, nn.Conv1d) and t.padding == "same"


def test_controlled_separable_layer_trains():
    """H < K: fewer parameters than the torch layer of the same K, and gradients flow."""
    torch.manual_seed(5)
    K, P, Q, H = 25, 8, 8, 3
    layer = GridConv(P, Q, (5, 5), padding=2, param=ControlledSeparable(K, P, Q, H))
    ref = nn.Conv2d(P, Q, 5, padding=2)
    n_ours = sum(p.numel() for p in layer.parameters())
    assert n_ours == H * (K + P * Q) + Q < sum(p.numel() for p in ref.parameters())
    x = torch.randn(2, P, 6, 6)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    target = torch.randn(2, Q, 6, 6)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = ((layer(x) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    assert layer.param.basis_coef.grad is not None


# ------------------------------------------------------------------------------------------------
POOL_MODULES = [
    lambda: nn.AvgPool1d(3),
    lambda: nn.AvgPool1d(4, 3, 2, ceil_mode=True, count_include_pad=False),
    lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
    lambda: nn.AvgPool2d((3, 2), (2, 3), (1, 1), ceil_mode=True, divisor_override=5),
    lambda: nn.AvgPool2d(2),
    lambda: nn.AvgPool3d(2, 1, 1, divisor_override=3),
    lambda: nn.AvgPool3d((2, 3, 2), (1, 2, 3), (1, 1, 0), ceil_mode=True),
]
POOL_INPUTS = [(10,), (11,), (8, 7), (8, 7), (6, 5), (4, 5, 3), (5, 4, 6)]


@pytest.mark.parametrize("i", range(len(POOL_MODULES)))
@pytest.mark.parametrize("route", ["auto", "basis"])
def test_from_torch_avgpool(i, route):
    torch.manual_seed(6)
    m = POOL_MODULES[i]()
    x = torch.randn(2, 3, *POOL_INPUTS[i], dtype=DT, requires_grad=True)
    layer = from_torch(m)
    layer.route = route
    ref = m(x)
    y = layer(x)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    gy = torch.randn_like(ref)
    torch.testing.assert_close(torch.autograd.grad(y, x, gy)[0],
                               torch.autograd.grad(ref, x, gy)[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer(x[0]), m(x[0]), rtol=1e-12, atol=1e-12)
    # .basis and .param (the identity channel map) reproduce it through sc.convolve
    xb = x.detach().movedim(1, -1).reshape(2, -1, 3)
    yb = sc.convolve(xb, layer.basis.to(dtype=DT).to_dense(), layer.param().to(DT))
    torch.testing.assert_close(yb, ref.detach().movedim(1, -1).reshape(yb.shape), rtol=1e-12,
                               atol=1e-12)
    t = to_torch(layer)
    assert type(t) is type(m)
    torch.testing.assert_close(t(x), ref)


def test_avgpool_bundle_and_errors():
    pool = GridAvgPool(2, in_shape=(4, 6))
    x = torch.randn(3, 24, 5)
    img = x.reshape(3, 4, 6, 5).movedim(-1, 1)
    torch.testing.assert_close(pool(x), nn.AvgPool2d(2)(img).movedim(1, -1).reshape(3, 6, 5))
    with pytest.raises(ValueError, match="route must be"):
        GridAvgPool(2, dim=1, route="fast")
    asym = GridAvgPool(3, 2, ((1, 0),), dim=1)
    asym(torch.randn(1, 2, 7))
    with pytest.raises(TypeError, match="symmetric padding"):
        to_torch(asym)
    with pytest.raises(TypeError, match="divisor_override"):
        to_torch(GridAvgPool(3, divisor_override=2, dim=1))

"""Grid and AvgPool bases: exact equality with torch (float64), adjoints, equivariance, errors."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv.basis import AvgPool, Dense, Grid, Sparse, Stack
from structconv.params import (
    ControlledSeparable,
    DepthwiseSeparable,
    Full,
    Grouped,
    LowRank,
)

DT = torch.float64
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
ROUTES = ["native", "input_param", "basis_input", "basis_param", "tap_gemm", "tap_im2col"]
TAP_ROUTES = ["tap_gemm", "tap_im2col"]

# (in_shape, kernel, stride, padding, dilation): 1/2/3-d, odd sizes, every padding form
GEOMETRIES = [
    ((7,), 3, 1, 0, 1),
    ((11,), 4, 2, ((1, 2),), 1),
    ((9,), 3, 1, "same", 2),
    ((10,), 2, 1, "same", 1),  # even kernel: torch's asymmetric "same"
    ((5, 7), (3, 2), (2, 1), (1, 0), (1, 2)),
    ((6, 5), 3, 1, "valid", 1),
    ((5, 6), (2, 3), (1, 2), ((0, 1), (2, 1)), (2, 1)),
    ((4, 5, 3), (2, 1, 3), 1, 1, 1),
    ((5, 4, 6), 3, (2, 1, 2), ((1, 0), 2, (0, 1)), (1, 2, 1)),
]


def torch_conv(img, W, grid, groups=1, bias=None):
    """The reference: zero padding by F.pad, then torch's own convolution."""
    spec = []
    for b, a in reversed(grid.padding):
        spec += [b, a]
    return CONV[grid.ndim](F.pad(img, spec), W, bias, grid.stride, 0, grid.dilation, groups)


def to_img(x, grid):
    return x.reshape(x.shape[0], *grid.in_shape, x.shape[-1]).movedim(-1, 1)


def to_bundle(y):
    return y.movedim(1, -1).reshape(y.shape[0], -1, y.shape[1])


def weight_of(theta, grid):
    K, P, Q = theta.shape
    return theta.permute(2, 1, 0).reshape(Q, P, *grid.kernel_size)


def brute_dense(grid):
    """A[k, m, n] from the definition, by loops over every (k, n) and dimension."""
    A = torch.zeros(grid.K, grid.M, grid.N, dtype=DT)
    kern = list(itertools.product(*[range(k) for k in grid.kernel_size]))
    outs = list(itertools.product(*[range(n) for n in grid.out_shape]))
    for k, off in enumerate(kern):
        for n, pos in enumerate(outs):
            m_pos = [p * s - b + o * dl for p, s, (b, _), o, dl in
                     zip(pos, grid.stride, grid.padding, off, grid.dilation)]
            if all(0 <= v < size for v, size in zip(m_pos, grid.in_shape)):
                m = 0
                for v, size in zip(m_pos, grid.in_shape):
                    m = m * size + v
                A[k, m, n] = 1
    return A


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("geom", GEOMETRIES)
def test_dense_matches_definition(geom):
    g = Grid(*geom)
    A = g.to(dtype=DT).to_dense()
    assert A.shape == (g.K, g.M, g.N) and A.dtype == DT
    assert torch.equal(A, brute_dense(g))
    assert torch.equal(g.to_sparse().to_dense().to(DT), A)
    assert g.K == math.prod(g.kernel_size) and g.N == math.prod(g.out_shape)


@pytest.mark.parametrize("geom", GEOMETRIES)
@pytest.mark.parametrize("route", ROUTES)
def test_convolve_equals_torch_values_and_grads(geom, route):
    torch.manual_seed(0)
    g = Grid(*geom)
    B, P, Q = 2, 3, 4
    x = torch.randn(B, g.M, P, dtype=DT, requires_grad=True)
    th = torch.randn(g.K, P, Q, dtype=DT, requires_grad=True)
    y = sc.convolve(x, g, th, route=route)
    ref = to_bundle(torch_conv(to_img(x, g), weight_of(th, g), g))
    assert y.shape == (B, g.N, Q)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    gy = torch.randn_like(y)
    gx, gt = torch.autograd.grad(y, (x, th), gy)
    rx, rt = torch.autograd.grad(ref, (x, th), gy)
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gt, rt, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("geom", GEOMETRIES)
@pytest.mark.parametrize("route", TAP_ROUTES)
def test_tap_routes_on_channels_first_views(geom, route):
    """An image's channels-first view goes through the tap routes without a layout copy and
    comes back as a (B, N, Q) view of a channels-first tensor; values and gradients exact."""
    torch.manual_seed(1)
    g = Grid(*geom)
    B, P, Q = 2, 3, 5
    img = torch.randn(B, P, *g.in_shape, dtype=DT, requires_grad=True)
    th = torch.randn(g.K, P, Q, dtype=DT, requires_grad=True)
    x = img.flatten(2).transpose(1, 2)  # (B, M, P), stride 1 along M
    y = sc.convolve(x, g, th, route=route)
    ref_img = torch_conv(img, weight_of(th, g), g)
    assert y.shape == (B, g.N, Q) and y.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(y, to_bundle(ref_img), rtol=1e-12, atol=1e-12)
    gy = torch.randn_like(y)
    gi, gt = torch.autograd.grad(y, (img, th), gy)
    ri, rt = torch.autograd.grad(to_bundle(ref_img), (img, th), gy)
    torch.testing.assert_close(gi, ri, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gt, rt, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("channels_first", [False, True])
@pytest.mark.parametrize("route", TAP_ROUTES)
def test_tap_routes_gradcheck(route, channels_first):
    """The tap kernels' custom autograd (both memory orders) against finite differences, to
    second order."""
    g = Grid((5, 6), (2, 3), (2, 1), ((1, 0), (2, 1)), (1, 2))
    torch.manual_seed(2)
    img = torch.randn(2, 3, *g.in_shape, dtype=DT, requires_grad=True)
    th = torch.randn(g.K, 3, 2, dtype=DT, requires_grad=True)

    def f(img, th):
        x = img.flatten(2).transpose(1, 2)
        return sc.convolve(x if channels_first else x.contiguous(), g, th, route=route)

    assert torch.autograd.gradcheck(f, (img, th))
    assert torch.autograd.gradgradcheck(f, (img, th))  # e.g. a gradient penalty


def test_tap_layout_reads_only_phases_in_use():
    """A 1x1 kernel at stride 2 reads one stride phase: the others are never copied."""
    g = Grid((8, 6), 1, 2)
    assert len(g.tap_layout.phases) == 1 and g.tap_layout.phase_shape == (4, 3)
    g3 = Grid((9, 9), 3, 2, 1)
    assert len(g3.tap_layout.phases) == 4
    # taps that read only padding are left out altogether
    gp = Grid((2, 2), 5, 1, 4)
    assert len(g.tap_layout.taps) == 1 and len(gp.tap_layout.taps) == len(gp.taps)
    x = torch.randn(1, gp.M, 2, dtype=DT)
    th = torch.randn(gp.K, 2, 3, dtype=DT)
    torch.testing.assert_close(sc.convolve(x, gp, th, route="tap_gemm"),
                               sc.convolve(x, gp, th, route="input_param"))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.data())
def test_tap_routes_property(d, data):
    """Random geometries and layouts: both tap routes equal the dense contraction."""
    ints = st.integers
    shape = tuple(data.draw(ints(1, 6)) for _ in range(d))
    kernel = tuple(data.draw(ints(1, 3)) for _ in range(d))
    stride = tuple(data.draw(ints(1, 3)) for _ in range(d))
    dil = tuple(data.draw(ints(1, 2)) for _ in range(d))
    pad = tuple((data.draw(ints(0, 2)), data.draw(ints(0, 2))) for _ in range(d))
    try:
        g = Grid(shape, kernel, stride, pad, dil)
    except ValueError:
        return  # the kernel does not fit
    B, P, Q = data.draw(ints(1, 3)), data.draw(ints(1, 4)), data.draw(ints(1, 4))
    x = torch.randn(B, P, g.M, dtype=DT).transpose(1, 2)
    if data.draw(st.booleans()):
        x = x.contiguous()
    th = torch.randn(g.K, P, Q, dtype=DT)
    ref = torch.einsum("kmn,bmp,kpq->bnq", g.to(dtype=DT).to_dense(), x, th)
    for route in TAP_ROUTES:
        torch.testing.assert_close(sc.convolve(x, g, th, route=route), ref, rtol=1e-12,
                                   atol=1e-12)


def test_auto_route_and_unbatched():
    torch.manual_seed(1)
    g = Grid((6, 7), 3, padding=1)
    x = torch.randn(g.M, 5, dtype=DT)
    th = torch.randn(g.K, 5, 2, dtype=DT)
    assert sc.plan(x, g, th).route == "native"
    y = sc.convolve(x, g, th)
    ref = to_bundle(torch_conv(to_img(x[None], g), weight_of(th, g), g))[0]
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g2 = Grid((6, 7), 3, padding=1, native=False)
    assert sc.plan(x, g2, th).route != "native"
    torch.testing.assert_close(sc.convolve(x, g2, th), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("geom", [GEOMETRIES[1], GEOMETRIES[4], GEOMETRIES[8]])
def test_param_forms_every_route(geom):
    """Grouped/Depthwise map to F.convNd; ControlledSeparable/LowRank run their own routes."""
    torch.manual_seed(2)
    g = Grid(*geom)
    B, P, Q = 2, 4, 6
    forms = [Full(g.K, P, Q), Grouped(g.K, P, Q, 2), DepthwiseSeparable(g.K, P, Q),
             ControlledSeparable(g.K, P, Q, 2), LowRank(g.K, P, Q, 2)]
    x = torch.randn(B, g.M, P, dtype=DT)
    for form in forms:
        form = form.to(DT)
        ref = to_bundle(torch_conv(to_img(x, g), weight_of(form(), g), g))
        names = [r.name for r in sc.plan(x, g, form).routes]
        assert "native" in names
        for r in names:
            y = sc.convolve(x, g, form, route=r)
            torch.testing.assert_close(y, ref, rtol=1e-11, atol=1e-11, msg=f"{form} {r}")
        # the gradient of every parameter agrees between the fused kernel and a shift route
        gy = torch.randn_like(ref)
        ga = torch.autograd.grad(sc.convolve(x, g, form, route="native"), list(form.parameters()),
                                 gy)
        gb = torch.autograd.grad(sc.convolve(x, g, form, route="basis_input"),
                                 list(form.parameters()), gy)
        for a, b in zip(ga, gb):
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_grouped_native_uses_torch_groups():
    torch.manual_seed(3)
    g = Grid((5, 6), 3, padding=1)
    form = Grouped(g.K, 6, 9, 3).to(DT)
    W, groups = g.conv_weight(form)
    assert groups == 3 and W.shape == (9, 2, 3, 3)
    x = torch.randn(2, g.M, 6, dtype=DT)
    ref = to_bundle(torch_conv(to_img(x, g), W, g, groups=3))
    torch.testing.assert_close(sc.convolve(x, g, form, route="native"), ref)
    torch.testing.assert_close(sc.convolve(x, g, form(), route="input_param"), ref)


# ------------------------------------------------------------------------------------------------
geometry = st.integers(1, 3).flatmap(lambda d: st.tuples(
    st.lists(st.integers(1, 6), min_size=d, max_size=d),   # in_shape
    st.lists(st.integers(1, 3), min_size=d, max_size=d),   # kernel
    st.lists(st.integers(1, 3), min_size=d, max_size=d),   # stride
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=d, max_size=d),
    st.lists(st.integers(1, 2), min_size=d, max_size=d),   # dilation
))


def _make(geom):
    in_shape, k, s, p, dl = geom
    # grow the grid until the kernel fits (keeps every drawn geometry valid)
    in_shape = [max(n, dd * (kk - 1) + 1) for n, kk, dd in zip(in_shape, k, dl)]
    return Grid(in_shape, k, s, p, dl)


@settings(max_examples=40, deadline=None)
@given(geometry, st.integers(1, 2), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_primitives_equal_dense(geom, B, C, seed):
    g = _make(geom)
    gen = torch.Generator().manual_seed(seed)
    D = Dense(g.to(dtype=DT).to_dense())
    x = torch.randn(B, g.M, C, generator=gen, dtype=DT)
    z = torch.randn(B, g.M, g.K, C, generator=gen, dtype=DT)
    torch.testing.assert_close(g.propagate(x), D.propagate(x), rtol=0, atol=1e-13)
    torch.testing.assert_close(g.propagate_heads(z), D.propagate_heads(z), rtol=0, atol=1e-13)
    torch.testing.assert_close(g.propagate_sum(z), D.propagate_sum(z), rtol=1e-13, atol=1e-13)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 2), st.integers(1, 2),
       st.integers(-2, 2), st.integers(0, 2**31 - 1))
def test_translation_equivariance(d, k, s, dl, u, seed):
    """Shifting the input by t = s*u grid steps shifts the output by u (supports kept inside)."""
    span = dl * (k - 1) + 1
    margin = s * abs(u) + span + s
    size = 2 * margin + 3
    g = Grid((size,) * d, k, s, span // 2, dl)
    gen = torch.Generator().manual_seed(seed)
    core = torch.zeros(1, *(size,) * d, 2, dtype=DT)
    inner = tuple(slice(margin, size - margin) for _ in range(d))
    core[(slice(None), *inner)] = torch.randn(1, *(3,) * d, 2, generator=gen, dtype=DT)
    th = torch.randn(g.K, 2, 3, generator=gen, dtype=DT)
    dims = tuple(range(1, d + 1))
    shifted = torch.roll(core, (s * u,) * d, dims)
    y = sc.convolve(core.reshape(1, g.M, 2), g, th, route="input_param")
    y2 = sc.convolve(shifted.reshape(1, g.M, 2), g, th, route="basis_input")
    expect = torch.roll(y.reshape(1, *g.out_shape, 3), (u,) * d, dims)
    torch.testing.assert_close(y2.reshape(1, *g.out_shape, 3), expect, rtol=1e-12, atol=1e-12)


def test_shifts_are_the_papers_shift_matrices():
    """At stride 1, A_k = the shift matrix of Δ_k: A[m, n] = 1 iff coords(n) - coords(m) = Δ_k."""
    g = Grid((4, 5), (3, 2), 1, ((1, 1), (2, 0)), (1, 2))
    assert g.out_shape == g.in_shape
    A = g.to(dtype=DT).to_dense()
    coords = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(5), indexing="ij"),
                         -1).reshape(-1, 2)
    diff = coords.unsqueeze(0) - coords.unsqueeze(1)  # [m, n] = coords(n) - coords(m)
    assert g.shifts.shape == (g.K, 2)
    for k in range(g.K):
        expect = (diff == g.shifts[k]).all(-1).to(DT)
        assert torch.equal(A[k], expect)
    # Δ_k = ε + offset_k δ: offsets ε = padding_before, strides δ = -dilation (eq. cnn-shift)
    assert g.shifts[0].tolist() == [1, 2] and g.shifts[1].tolist() == [1, 0]


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("geom", [
    ((6,), 3, 2, ((1, 2),), 1),
    ((4, 3), (2, 3), (1, 2), ((0, 1), (2, 1)), (2, 1)),
    ((3, 2, 3), (2, 1, 2), (2, 1, 1), 1, (1, 1, 2)),
])
def test_gradcheck_shift_kernels(geom):
    """The custom autograd (each kernel's backward is its adjoint kernel), twice differentiable."""
    g = Grid(*geom)
    torch.manual_seed(4)
    x = torch.randn(1, g.M, 2, dtype=DT, requires_grad=True)
    z = torch.randn(1, g.M, g.K, 1, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(g.propagate, (x,))
    assert torch.autograd.gradcheck(g.propagate_heads, (z,))
    assert torch.autograd.gradcheck(g.propagate_sum, (z,))
    if g.ndim == 1:
        assert torch.autograd.gradgradcheck(g.propagate_sum, (z,))
        assert torch.autograd.gradgradcheck(g.propagate, (x,))
        assert torch.autograd.gradgradcheck(g.propagate_heads, (z,))


def test_stack_with_other_bases():
    """A Grid beside a dense and a sparse basis: each part on its own path, exact overall."""
    torch.manual_seed(5)
    g = Grid((5, 4), 3, padding=1)
    dense = Dense(torch.randn(2, g.M, g.N, dtype=DT))
    idx = torch.stack([torch.zeros(30, dtype=torch.long), torch.randint(0, g.M, (30,)),
                       torch.randint(0, g.N, (30,))])
    sparse = Sparse(idx, torch.randn(30, dtype=DT), (1, g.M, g.N))
    stack = Stack([g, dense, sparse])
    x = torch.randn(3, g.M, 4, dtype=DT, requires_grad=True)
    th = torch.randn(stack.K, 4, 5, dtype=DT, requires_grad=True)
    ref = torch.einsum("kmn,bmp,kpq->bnq", stack.to_dense().to(DT), x, th)
    for route in ("auto", "input_param", "basis_input"):
        y = sc.convolve(x, stack, th, route=route)
        torch.testing.assert_close(y, ref, rtol=1e-11, atol=1e-11)
    gy = torch.randn_like(ref)
    torch.testing.assert_close(torch.autograd.grad(sc.convolve(x, stack, th), (x, th), gy),
                               torch.autograd.grad(ref, (x, th), gy), rtol=1e-11, atol=1e-11)
    assert sc.plan(x, stack, th).parts[0].route == "native"


def test_float32_and_compose():
    torch.manual_seed(6)
    g = Grid((6,), 3, padding=1)
    x = torch.randn(2, 6, 3)
    th = torch.randn(3, 3, 2)
    y = sc.convolve(x, g, th, route="basis_input")
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, sc.convolve(x, g, th, route="native"))
    # two stacked grid convolutions compose into a Product basis (Proposition 2)
    th2 = torch.randn(3, 2, 4)
    basis, theta = sc.compose((g, th), (g, th2))
    torch.testing.assert_close(sc.convolve(x, basis, theta),
                               sc.convolve(sc.convolve(x, g, th), g, th2), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------
POOLS = [
    ((9,), 3, None, 1, False, True, None),
    ((10,), 4, 3, 2, True, False, None),
    ((10,), 3, 2, 1, True, True, 2),
    ((7, 8), 3, 2, 1, True, False, None),
    ((7, 8), (3, 2), (2, 3), (1, 1), True, True, 5),
    ((6, 5), 2, None, 0, False, True, None),
    ((5, 4, 6), (2, 3, 2), (1, 2, 3), (1, 1, 0), True, False, None),
    ((5, 4, 6), 2, 2, 1, False, True, 3),
]


def torch_pool(img, pool_args):
    _, k, s, p, ceil, cip, div = pool_args
    d = img.dim() - 2
    if d == 1:
        if div is not None:  # avg_pool1d has no divisor_override: pool a unit 2nd dim
            return F.avg_pool2d(img[:, :, None], (1, k), (1, s or k), (0, p), ceil, cip,
                                div)[:, :, 0]
        return F.avg_pool1d(img, k, s, p, ceil, cip)
    return (F.avg_pool2d if d == 2 else F.avg_pool3d)(img, k, s, p, ceil, cip, div)


@pytest.mark.parametrize("args", POOLS)
def test_avgpool_equals_torch(args):
    torch.manual_seed(7)
    in_shape, k, s, p, ceil, cip, div = args
    pool = AvgPool(in_shape, k, s, p, ceil_mode=ceil, count_include_pad=cip,
                   divisor_override=div)
    B, C = 2, 3
    x = torch.randn(B, pool.M, C, dtype=DT, requires_grad=True)
    img = x.reshape(B, *pool.in_shape, C).movedim(-1, 1)
    ref = torch_pool(img, args)
    assert tuple(ref.shape[2:]) == pool.out_shape
    ref = to_bundle(ref)
    y = pool.propagate(x)[:, :, 0]
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    A = pool.to(dtype=DT).to_dense()
    torch.testing.assert_close(torch.einsum("mn,bmc->bnc", A[0], x), ref, rtol=1e-12,
                               atol=1e-12)
    th = torch.randn(1, C, 2, dtype=DT)
    full = ref @ th[0]
    for route in ("native", "input_param", "basis_input"):
        torch.testing.assert_close(sc.convolve(x, pool, th, route=route), full, rtol=1e-12,
                                   atol=1e-12)
    gy = torch.randn_like(ref)
    torch.testing.assert_close(torch.autograd.grad(y, x, gy)[0],
                               torch.autograd.grad(ref, x, gy)[0], rtol=1e-12, atol=1e-12)


def test_avgpool_defaults_and_asymmetric_padding():
    pool = AvgPool((8,), 2)
    assert pool.stride == (2,) and pool.out_shape == (4,) and pool.K == 1
    # asymmetric padding has no F.avg_pool kernel: the basis path still computes it
    asym = AvgPool((7,), 3, 2, ((2, 0),))
    assert "native" not in [r.name for r in sc.plan((1, 7, 2), asym, (1, 2, 2)).routes]
    x = torch.randn(1, 7, 2, dtype=DT)
    ref = F.avg_pool1d(F.pad(x.movedim(-1, 1), (2, 0)), 3, 2).movedim(1, -1)
    torch.testing.assert_close(asym.propagate(x)[:, :, 0], ref)


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, match", [
    (((8, 8), 10), "kernel spans"),
    (((8, 8), 3, 1, -1), "padding must be >= 0"),
    (((8, 8), (3, 3, 3)), "grid has 2 dims"),
    (((8, 8), 3, 0), "stride entries must be >= 1"),
    (((8, 8), 3, 2, "same"), "same.*stride 1"),
    (((8, 8), 3, 1, "full"), "'same' or 'valid'"),
    (((8, 8), 3, 1, ((1, 2, 3), 1)), r"\(before, after\)"),
    (((0, 8), 3), "in_shape entries must be >= 1"),
])
def test_grid_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        Grid(*args)


def test_bad_types_and_shapes():
    with pytest.raises(TypeError, match="bool"):
        Grid((5,), True)
    with pytest.raises(TypeError, match="int"):
        Grid((5,), 2.5)
    g = Grid((4, 4), 3)
    with pytest.raises(ValueError, match=r"M=16"):
        g.propagate(torch.randn(1, 15, 2))
    with pytest.raises(ValueError, match=r"K=9"):
        g.propagate_sum(torch.randn(1, 16, 8, 2))
    with pytest.raises(ValueError, match="K disagrees"):
        sc.convolve(torch.randn(1, 16, 2), g, torch.randn(4, 2, 2))
    with pytest.raises(ValueError, match="divisor_override"):
        AvgPool((4,), 2, divisor_override=0)


def test_channelwise_sum_depthwise_kernel():
    """The fused depthwise tap loop: equal to the dense basis, gradcheck in x and w."""
    g = Grid((4, 5), (2, 3), (1, 2), ((0, 1), (2, 1)), (2, 1))
    torch.manual_seed(8)
    x = torch.randn(2, g.M, 3, dtype=DT, requires_grad=True)
    w = torch.randn(g.K, 3, dtype=DT, requires_grad=True)
    ref = Dense(g.to(dtype=DT).to_dense()).propagate_sum(x[:, :, None, :] * w)
    torch.testing.assert_close(g.channelwise_sum(x, w), ref, rtol=1e-13, atol=1e-13)
    assert torch.autograd.gradcheck(g.channelwise_sum, (x, w))
    with pytest.raises(ValueError, match=r"w \(K, C\)"):
        g.channelwise_sum(x, torch.randn(g.K, 2, dtype=DT))
    # the channels-first view of an image takes the tap layout: same values and gradients
    img = x.detach().transpose(1, 2).contiguous().requires_grad_(True)
    torch.testing.assert_close(g.channelwise_sum(img.transpose(1, 2), w), ref, rtol=1e-13,
                               atol=1e-13)
    assert torch.autograd.gradcheck(lambda i, w: g.channelwise_sum(i.transpose(1, 2), w),
                                    (img, w))
    for layout in (lambda i: i.transpose(1, 2), lambda i: i.transpose(1, 2).contiguous()):
        assert torch.autograd.gradgradcheck(
            lambda i, w, layout=layout: g.channelwise_sum(layout(i), w), (img, w))
    # the planner takes it for depthwise forms of realistic width when F.convNd is off (with
    # a handful of channels a dense per-tap GEMM is as cheap)
    off = Grid((12, 10), 3, padding=1, native=False)
    xw = torch.randn(2, off.M, 32)
    assert sc.plan(xw, off, Grouped(9, 32, 32, 32)).route == "grouped_taps"
    assert sc.plan(xw, off, DepthwiseSeparable(9, 32, 64)).route == "depthwise_taps"
    # the same on an image's channels-first view, which the kernel reads without a copy
    xcf = xw.transpose(1, 2).contiguous().transpose(1, 2)
    assert sc.plan(xcf, off, Grouped(9, 32, 32, 32)).route == "grouped_taps"


# stride-1 grids whose output has the input's shape: channels-first depthwise on flat offsets
FLAT_GEOMETRIES = [
    ((9,), 5, 1, "same", 1),
    ((10,), 2, 1, "same", 1),  # even kernel: asymmetric padding, no centre tap
    ((7, 9), 3, 1, "same", 1),
    ((8, 7), (3, 5), 1, "same", 2),
    ((6, 6), 2, 1, "same", 1),
    ((3, 3), 5, 1, "same", 1),  # taps reading only padding along a dim
    ((9, 4), (3, 1), 1, "same", 3),
    ((4, 5, 6), 3, 1, 1, 1),
    ((3, 4, 5), (3, 2, 3), 1, "same", (1, 2, 1)),
]


def _depthwise_ref(g: Grid, img, w, bias=None):
    """torch's depthwise convolution of (B, C, *in_shape) with w (K, C): (B, C, *out_shape)."""
    C = img.shape[1]
    pads = [p for b, a in reversed(g.padding) for p in (b, a)]
    wt = w.t().reshape(C, 1, *g.kernel_size)
    return CONV[g.ndim](F.pad(img, pads), wt, bias, stride=g.stride, dilation=g.dilation,
                        groups=C)


@pytest.mark.parametrize("geom", FLAT_GEOMETRIES, ids=str)
def test_flat_depthwise_taps(geom):
    """The flat-offset depthwise kernel (channels-first, stride 1, same shape): equal to
    torch's depthwise convolution in values and gradients, with and without a bias."""
    in_shape, k, s, p, d = geom
    g = Grid(in_shape, k, s, p, d)
    assert g.flat_taps is not None
    torch.manual_seed(3)
    img = torch.randn(3, 4, *in_shape, dtype=DT, requires_grad=True)
    w = torch.randn(g.K, 4, dtype=DT, requires_grad=True)
    b = torch.randn(4, dtype=DT, requires_grad=True)
    for bias in (None, b):
        y = g.channelwise_sum(img.flatten(2).transpose(1, 2), w, bias)
        assert y.stride(1) == 1  # returned channels-first
        ref = _depthwise_ref(g, img, w, bias)
        torch.testing.assert_close(y.transpose(1, 2).reshape(ref.shape), ref, rtol=1e-13,
                                   atol=1e-13)
        gy = torch.randn_like(ref)
        wanted = (img, w) if bias is None else (img, w, b)
        got = torch.autograd.grad(y, wanted, gy.flatten(2).transpose(1, 2))
        exp = torch.autograd.grad(ref, wanted, gy)
        for u, v in zip(got, exp):
            torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", [3, 2], ids=["centre-tap", "no-centre-tap"])
def test_flat_depthwise_taps_gradchecks_and_chunks(monkeypatch, kernel):
    """gradcheck and gradgradcheck (x, w, bias), and every way of chunking the planes:
    whole images per chunk, channel blocks of every image, one plane at a time (an even
    kernel has no centre tap: columns its first tap leaves unwritten must stay set across
    channel blocks)."""
    import structconv.kernels.flat as grid_mod

    g = Grid((5, 6), kernel, padding="same", dilation=(1, 2))
    torch.manual_seed(4)
    img = torch.randn(2, 6, 5, 6, dtype=DT, requires_grad=True)
    w = torch.randn(g.K, 6, dtype=DT, requires_grad=True)
    b = torch.randn(6, dtype=DT, requires_grad=True)

    def f(i, w, b):
        return g.channelwise_sum(i.flatten(2).transpose(1, 2), w, b)

    assert torch.autograd.gradcheck(f, (img, w, b))
    assert torch.autograd.gradgradcheck(f, (img, w, b))
    ref = _depthwise_ref(g, img, w, b)
    gy = torch.randn_like(ref)
    exp = torch.autograd.grad(ref, (img, w, b), gy)
    plane = g.M * 8
    # chunk sizes: 1 plane, 2 and 3 channels (blocks of every image), 1 and 2 whole images
    for size, u, groups in ((plane, 1, 6), (2 * plane, 2, 3), (3 * plane, 3, 2),
                            (7 * plane, 6, 1), (12 * plane, 12, 1)):
        monkeypatch.setattr(grid_mod, "_FLAT_CHUNK_BYTES", size)
        got_u, got_groups = g.flat_taps.chunks(2, 6, 8)
        assert (got_u, len(got_groups)) == (u, groups)
        y = f(img, w, b)
        torch.testing.assert_close(y.transpose(1, 2).reshape(ref.shape), ref, rtol=1e-13,
                                   atol=1e-13)
        for a, e in zip(torch.autograd.grad(y, (img, w, b), gy.flatten(2).transpose(1, 2)),
                        exp):
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


def test_flat_taps_apply_only_where_they_hold():
    """Strided or shape-changing grids keep the phase-buffer layout (no flat offsets)."""
    assert Grid((8, 8), 3, padding=1).flat_taps is not None
    assert Grid((8, 8), 3, stride=2, padding=1).flat_taps is None
    assert Grid((8, 8), 3).flat_taps is None  # "valid": the output is smaller
    g = Grid((6, 7), 3, 2, 1)
    torch.manual_seed(5)
    img = torch.randn(2, 3, 6, 7, dtype=DT)
    w, b = torch.randn(g.K, 3, dtype=DT), torch.randn(3, dtype=DT)
    for x in (img.flatten(2).transpose(1, 2), img.flatten(2).transpose(1, 2).contiguous()):
        y = g.channelwise_sum(x, w, b)
        ref = _depthwise_ref(g, img, w, b)
        torch.testing.assert_close(y.transpose(1, 2).reshape(ref.shape), ref, rtol=1e-13,
                                   atol=1e-13)
    with pytest.raises(ValueError, match=r"bias \(C,\)"):
        g.channelwise_sum(img.flatten(2).transpose(1, 2), w, torch.zeros(4, dtype=DT))


@pytest.mark.parametrize("route", ["auto", "input_param", "grouped_taps", "native",
                                   "tap_gemm", "tap_im2col"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("cf", [False, True], ids=["bundle", "planes"])
def test_convolve_bias(route, stride, cf):
    """``convolve(..., bias=)`` adds a (Q,) bias on every route, fused into the kernel or
    not, on bundles and on an image's channels-first view; gradients reach it; a bias of the
    wrong shape is refused naming Q."""
    g = Grid((6, 5), 3, stride, padding=1)
    torch.manual_seed(6)
    x = torch.randn(2, g.M, 4, dtype=DT)
    if cf:
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    x.requires_grad_(True)
    th = Grouped(g.K, 4, 4, 4).to(DT)
    b = torch.randn(4, dtype=DT, requires_grad=True)
    y = sc.convolve(x, g, th, route=route, bias=b)
    ref = sc.convolve(x, g, th, route="input_param") + b
    torch.testing.assert_close(y, ref, rtol=1e-13, atol=1e-13)
    gy = torch.randn_like(ref)
    for u, v in zip(torch.autograd.grad(y, (x, b), gy), torch.autograd.grad(ref, (x, b), gy)):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"bias must be a \(4,\) tensor"):
        sc.convolve(x, g, th, route=route, bias=torch.zeros(3, dtype=DT))


@pytest.mark.parametrize("route", ["tap_gemm", "tap_im2col", "grouped_taps"])
def test_fused_bias_gradchecks(route):
    """The kernels that take the bias inside: gradcheck and gradgradcheck in x, theta, bias."""
    g = Grid((4, 5), 3, (1, 2), padding=1)
    torch.manual_seed(7)
    x = torch.randn(2, 3, g.M, dtype=DT).transpose(1, 2).requires_grad_(True)
    b = torch.randn(2 if route != "grouped_taps" else 3, dtype=DT, requires_grad=True)
    if route == "grouped_taps":  # the depthwise kernel, on the tap layout (stride 2)
        th = torch.randn(g.K, 3, dtype=DT, requires_grad=True)

        def f(x, th, b):
            return g.channelwise_sum(x, th, b)
    else:
        th = torch.randn(g.K, 3, 2, dtype=DT, requires_grad=True)

        def f(x, th, b):
            return sc.convolve(x, g, th, route=route, bias=b)

    assert torch.autograd.gradcheck(f, (x, th, b))
    assert torch.autograd.gradgradcheck(f, (x, th, b))


same_geometry = st.integers(1, 3).flatmap(lambda d: st.tuples(
    st.lists(st.integers(1, 6), min_size=d, max_size=d),   # in_shape
    st.lists(st.integers(1, 4), min_size=d, max_size=d),   # kernel
    st.lists(st.integers(1, 2), min_size=d, max_size=d),   # dilation
    st.lists(st.floats(0, 1), min_size=d, max_size=d),     # share of the padding before
))


@settings(max_examples=40, deadline=None)
@given(same_geometry, st.integers(1, 3), st.integers(1, 4), st.integers(1, 9),
       st.integers(0, 2**31 - 1))
def test_flat_taps_equal_dense(geom, B, C, planes, seed):
    """Property: on any stride-1 grid whose output has the input's shape (any N-d kernel,
    dilation and split of the padding), the flat-offset depthwise kernel on channels-first
    planes equals the dense basis, in values and in both gradients, for any chunk size."""
    import structconv.kernels.flat as grid_mod

    in_shape, k, dl, share = geom
    pads = []
    for kk, dd, f in zip(k, dl, share):
        total = dd * (kk - 1)
        before = round(f * total)
        pads.append((before, total - before))
    g = Grid(in_shape, k, 1, pads, dl)
    assert g.flat_taps is not None
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(B, C, g.M, generator=gen, dtype=DT, requires_grad=True)
    w = torch.randn(g.K, C, generator=gen, dtype=DT, requires_grad=True)
    gy = torch.randn(B, g.N, C, generator=gen, dtype=DT)
    x = img.transpose(1, 2)
    ref = Dense(g.to(dtype=DT).to_dense()).propagate_sum(x[:, :, None, :] * w)
    old = grid_mod._FLAT_CHUNK_BYTES
    grid_mod._FLAT_CHUNK_BYTES = planes * g.M * 8  # chunks of `planes` planes
    try:
        y = g.channelwise_sum(x, w)
        got = torch.autograd.grad(y, (img, w), gy)
    finally:
        grid_mod._FLAT_CHUNK_BYTES = old
    torch.testing.assert_close(y, ref, rtol=1e-13, atol=1e-13)
    for a, e in zip(got, torch.autograd.grad(ref, (img, w), gy)):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)

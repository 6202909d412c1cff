"""Parameter forms: modules whose call returns theta (K, P, Q), with their parameter counts fixed.

Each form may also offer *factored routes*: ways to compute the convolution that never build the
full theta (e.g. the Transformer's x·Θ_value → attention → ·Θ_outᵀ). The engine's planner weighs
them against the three classic routes on the materialised theta.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from . import costs
from .costs import Route
from .registry import KindError, Registry

__all__ = [
    "Parameterization", "Full", "Grouped", "DepthwiseSeparable", "ControlledSeparable",
    "LowRank", "Fixed", "as_theta", "make_param", "register", "build", "PARAMS", "glorot_",
    "reset_module", "reset_children",
]


def glorot_(t: Tensor, fan_in: int | None = None, fan_out: int | None = None) -> Tensor:
    """Glorot / Xavier uniform init in place, as PyG's ``glorot``: U(-a, a) with
    a = sqrt(6 / (fan_in + fan_out)), the fans read off the last two dims unless given;
    returns ``t``."""
    fan_in = t.size(-2) if fan_in is None else fan_in
    fan_out = t.size(-1) if fan_out is None else fan_out
    a = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        return t.uniform_(-a, a)


def reset_module(module) -> None:
    """``module.reset_parameters()``, or that of each child where it has none (PyG's
    ``reset``: the way a layer re-initialises an ``nn`` it was given)."""
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
    else:
        reset_children(module)


def reset_children(module) -> None:
    """``reset_module`` of each child of ``module`` in registration order: the
    ``reset_parameters`` of a layer made of layers (each draws as its constructor did, so a
    seed gives the values a fresh layer had)."""
    for child in module.children() if hasattr(module, "children") else []:
        reset_module(child)


def _check_sizes(**kw):
    for k, v in kw.items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be a positive int, got {v!r}")


class Parameterization(nn.Module):
    """Base class of parameter forms: ``module()`` returns theta of shape (K, P, Q)."""

    def __init__(self, K: int, P: int, Q: int):
        super().__init__()
        _check_sizes(K=K, P=P, Q=Q)
        self.K, self.P, self.Q = K, P, Q

    def extra_repr(self) -> str:
        return f"K={self.K}, P={self.P}, Q={self.Q}"

    def reset_parameters(self) -> None:
        """Draw the weights afresh from the form's initial distribution."""
        raise NotImplementedError(f"{type(self).__name__} has no reset_parameters")

    @property
    def fan_in(self) -> int:
        """Inputs feeding one output channel of one entry (as torch's conv: K * P / groups)."""
        return self.K * self.P

    #: blocks of a block-diagonal theta (``Grouped``); 1 for every other form
    groups: int = 1

    def factored_routes(self, x: Tensor, basis) -> list[Route]:
        """Routes that use this form's factors instead of the full theta (default: none).

        Each route's runner is called as ``run(x, theta, bias)`` with the form itself as
        ``theta`` (a plan is reused across modules of the same form and sizes).
        """
        return []

    def plan_key(self) -> tuple:
        """What the planner's choice depends on besides the shapes: the form and its sizes."""
        return (type(self), self.extra_repr())

    def blocks(self) -> Tensor | None:
        """The (K, groups, P/groups, Q/groups) blocks of a block-diagonal theta, or None."""
        return None

    def separable_factors(self) -> tuple[Tensor, Tensor] | None:
        """(depth (K, P), point (P, Q)) when theta[k, p, q] = depth[k, p] point[p, q], or None."""
        return None


class Fixed:
    """A given theta tensor (K, P, Q) seen as a parameter form: no factored routes.

    How the engine adapts a plain tensor theta once per call (``as_theta``); not a module, so
    the tensor keeps its own autograd history.
    """

    __slots__ = ("tensor", "K", "P", "Q")
    groups = 1

    def __init__(self, tensor: Tensor):
        if not isinstance(tensor, Tensor) or tensor.dim() != 3:
            got = tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
            raise ValueError(f"theta must be a (K, P, Q) tensor or a sc.params module, got {got}")
        self.tensor = tensor
        self.K, self.P, self.Q = (int(v) for v in tensor.shape)

    def __call__(self) -> Tensor:
        return self.tensor

    def factored_routes(self, x: Tensor, basis) -> list[Route]:
        return []

    def plan_key(self) -> tuple:
        return (Fixed,)

    def blocks(self) -> None:
        return None

    def separable_factors(self) -> None:
        return None


def as_theta(theta) -> Parameterization | Fixed:
    """A parameter form from a ``sc.params`` module (itself) or a (K, P, Q) tensor (``Fixed``)."""
    if isinstance(theta, (Parameterization, Fixed)):
        return theta
    return Fixed(theta)


class Full(Parameterization):
    """An unconstrained theta (K, P, Q): ``K*P*Q`` parameters."""

    def __init__(self, K: int, P: int, Q: int):
        super().__init__(K, P, Q)
        b = 1.0 / math.sqrt(self.fan_in)
        self.weight = nn.Parameter(torch.empty(K, P, Q).uniform_(-b, b))

    def reset_parameters(self) -> None:
        b = 1.0 / math.sqrt(self.fan_in)
        with torch.no_grad():
            self.weight.uniform_(-b, b)

    def forward(self) -> Tensor:
        return self.weight


class Grouped(Parameterization):
    """Block-diagonal theta_k with ``groups`` blocks of (P/groups, Q/groups): ``K*P*Q/groups``."""

    def __init__(self, K: int, P: int, Q: int, groups: int):
        super().__init__(K, P, Q)
        _check_sizes(groups=groups)
        if P % groups or Q % groups:
            raise ValueError(f"groups={groups} must divide both P={P} and Q={Q}")
        self.groups = groups
        b = 1.0 / math.sqrt(self.fan_in)
        self.weight = nn.Parameter(
            torch.empty(K, groups, P // groups, Q // groups).uniform_(-b, b))

    @property
    def fan_in(self):
        return self.K * self.P // self.groups

    def reset_parameters(self) -> None:
        b = 1.0 / math.sqrt(self.fan_in)
        with torch.no_grad():
            self.weight.uniform_(-b, b)

    def extra_repr(self):
        return super().extra_repr() + f", groups={self.groups}"

    def forward(self) -> Tensor:
        g = self.groups
        eye = torch.eye(g, dtype=self.weight.dtype, device=self.weight.device)
        return torch.einsum("kgpq,gh->kgphq", self.weight, eye).reshape(self.K, self.P, self.Q)

    def blocks(self) -> Tensor:
        return self.weight

    def factored_routes(self, x, basis):
        # the blocks alone: `groups` times fewer multiply-adds than the block-diagonal theta
        B, M, P = x.shape
        K, N, Q, g = basis.K, basis.N, self.Q, self.groups
        if g == 1:
            return []
        dev = basis.device.type

        def input_side(x, th, bias):
            W, b = th.weight.to(x.dtype), x.shape[0]  # (K, g, P/g, Q/g)
            if P == g:  # depthwise: one input channel per group, a broadcast product
                z = x[:, :, None, :, None] * W[:, :, 0][None, None]  # (B, M, K, g, Q/g)
            else:
                z = torch.einsum("bmgp,kgpq->bmkgq", x.reshape(b, M, g, P // g), W)
            return basis.propagate_sum(z.reshape(b, M, K, Q))

        def basis_side(x, th, bias):
            b = x.shape[0]
            u = basis.propagate(x).reshape(b, N, K, g, P // g)
            return torch.einsum("bnkgp,kgpq->bngq", u, th.weight.to(x.dtype)).reshape(b, N, Q)

        # a block einsum with small blocks runs far below the GEMM rate (batched (n, b) x
        # (b, b) products): charge blocks narrower than the full-rate inner size accordingly
        # (measured: 5x5 blocks ~25x slower per multiply-add than a large GEMM)
        slow = 1.0 if P == g else max(1.0, costs.weight("tap_full_rate_p", dev) / (P // g))
        routes = [
            Route("grouped_input", B * (slow * M * K * P * Q / g + basis.propagate_sum_flops(Q)),
                  B * M * K * Q, input_side, device_type=dev),
            Route("grouped_basis", B * (basis.propagate_flops(P) + slow * N * K * P * Q / g),
                  B * N * K * P, basis_side, device_type=dev),
        ]
        if P == g:
            # one input channel per group: the basis's channelwise kernel (a Grid's fused
            # tap-by-tap pass builds no (B, M, K, Q) temporary)
            def taps(x, th, bias):
                r = Q // g  # channel p feeds outputs p*r .. p*r + r-1
                xr = x if r == 1 else x.repeat_interleave(r, dim=2)
                return basis.channelwise_sum(xr, th.weight.to(x.dtype)[:, :, 0].reshape(K, Q),
                                             bias)

            routes.append(Route("grouped_taps", basis.channelwise_flops(Q, B), B * N * Q,
                                taps, fuses_bias=True, device_type=dev,
                                reads="channels_first"))
        return routes


class DepthwiseSeparable(Parameterization):
    """theta[k, p, q] = depth[k, p] * point[p, q] (Xception): ``K*P + P*Q`` parameters."""

    def __init__(self, K: int, P: int, Q: int):
        super().__init__(K, P, Q)
        self.depth = nn.Parameter(torch.empty(K, P).uniform_(-1, 1) / math.sqrt(K))
        self.point = nn.Parameter(torch.empty(P, Q).uniform_(-1, 1) / math.sqrt(P))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.depth.uniform_(-1, 1).div_(math.sqrt(self.K))
            self.point.uniform_(-1, 1).div_(math.sqrt(self.P))

    def forward(self) -> Tensor:
        return self.depth.unsqueeze(2) * self.point.unsqueeze(0)

    def separable_factors(self) -> tuple[Tensor, Tensor]:
        return self.depth, self.point

    def factored_routes(self, x, basis):
        B, M, P = x.shape
        K, N, Q = basis.K, basis.N, self.Q
        dev = basis.device.type

        def input_side(x, th, bias):
            z = x.unsqueeze(2) * th.depth.to(x.dtype)  # (B, M, K, P)
            return basis.propagate_sum(z) @ th.point.to(x.dtype)

        def basis_side(x, th, bias):
            u = basis.propagate(x)  # (B, N, K, P)
            return (u * th.depth.to(x.dtype)).sum(2) @ th.point.to(x.dtype)

        def taps(x, th, bias):
            # the basis's channelwise kernel: a Grid's fused taps build no (B, M, K, P) temporary
            return basis.channelwise_sum(x, th.depth) @ th.point.to(x.dtype)

        return [
            Route("depthwise_input", B * (M * K * P + basis.propagate_sum_flops(P) + N * P * Q),
                  B * M * K * P, input_side, device_type=dev),
            Route("depthwise_basis", B * (basis.propagate_flops(P) + N * K * P + N * P * Q),
                  B * N * K * P, basis_side, device_type=dev),
            Route("depthwise_taps", basis.channelwise_flops(P, B) + B * N * P * Q,
                  B * N * P, taps, device_type=dev, reads="channels_first"),
        ]


class ControlledSeparable(Parameterization):
    """The paper's controlled separability, theta = basis_coef ∘ channel (eq. "separable").

    ``basis_coef`` (H, K) mixes the K basis matrices into H, ``channel`` (H, P, Q):
    ``H*(K + P*Q)`` parameters, so K can grow without growing the channel maps.
    """

    def __init__(self, K: int, P: int, Q: int, H: int):
        super().__init__(K, P, Q)
        _check_sizes(H=H)
        self.H = H
        self.basis_coef = nn.Parameter(torch.empty(H, K).uniform_(-1, 1) / math.sqrt(H))
        # var(theta) = H var(coef) var(channel) = 1 / (3 K P), as a Full theta's
        b = math.sqrt(3.0 / self.fan_in)
        self.channel = nn.Parameter(torch.empty(H, P, Q).uniform_(-b, b))

    def reset_parameters(self) -> None:
        b = math.sqrt(3.0 / self.fan_in)
        with torch.no_grad():
            self.basis_coef.uniform_(-1, 1).div_(math.sqrt(self.H))
            self.channel.uniform_(-b, b)

    def extra_repr(self):
        return super().extra_repr() + f", H={self.H}"

    def forward(self) -> Tensor:
        return torch.einsum("hk,hpq->kpq", self.basis_coef, self.channel)

    def factored_routes(self, x, basis):
        B, M, P = x.shape
        K, N, Q, H = basis.K, basis.N, self.Q, self.H
        dev = basis.device.type
        copy = costs.weight("copy", dev)

        def input_side(x, th, bias):
            b = x.shape[0]
            chan = th.channel.to(x.dtype)
            z = (x.reshape(b * M, P) @ chan.permute(1, 0, 2).reshape(P, H * Q))
            z = torch.einsum("bmhq,hk->bmkq", z.reshape(b, M, H, Q), th.basis_coef.to(x.dtype))
            return basis.propagate_sum(z)

        def basis_side(x, th, bias):
            u = torch.einsum("bnkp,hk->bnhp", basis.propagate(x), th.basis_coef.to(x.dtype))
            return u.reshape(x.shape[0], N, H * P) @ th.channel.to(x.dtype).reshape(H * P, Q)

        # each einsum mixes over a dimension that is not innermost: torch permutes the larger
        # operand into a copy first, charged per element at the cost table's "copy" weight
        return [
            Route("separable_input",
                  B * (M * P * H * Q + M * K * Q * (H + copy) + basis.propagate_sum_flops(Q)),
                  B * M * (H + K) * Q, input_side, device_type=dev),
            Route("separable_basis",
                  B * (basis.propagate_flops(P) + N * K * P * (H + copy) + N * H * P * Q),
                  B * N * (K + H) * P, basis_side, device_type=dev),
        ]


class LowRank(Parameterization):
    """theta_k = value_k @ out_k (the Transformer's value/output form): ``K*rank*(P+Q)``.

    ``value`` is (K, P, rank) and ``out`` is (K, rank, Q): head k projects to ``rank`` channels,
    is propagated by A_k alone, and is projected back, as multi-head attention does.
    """

    def __init__(self, K: int, P: int, Q: int, rank: int):
        super().__init__(K, P, Q)
        _check_sizes(rank=rank)
        self.rank = rank
        self.value = nn.Parameter(torch.empty(K, P, rank).uniform_(-1, 1) / math.sqrt(P))
        b = math.sqrt(3.0 / (K * rank))
        self.out = nn.Parameter(torch.empty(K, rank, Q).uniform_(-b, b))

    def reset_parameters(self) -> None:
        b = math.sqrt(3.0 / (self.K * self.rank))
        with torch.no_grad():
            self.value.uniform_(-1, 1).div_(math.sqrt(self.P))
            self.out.uniform_(-b, b)

    def extra_repr(self):
        return super().extra_repr() + f", rank={self.rank}"

    def forward(self) -> Tensor:
        return self.value @ self.out

    def factored_routes(self, x, basis):
        B, M, P = x.shape
        K, N, Q, r = basis.K, basis.N, self.Q, self.rank

        def heads(x, th, bias):
            V, O = th.value.to(x.dtype), th.out.to(x.dtype)
            b = x.shape[0]
            z = (x.reshape(b * M, P) @ V.permute(1, 0, 2).reshape(P, K * r)).reshape(b, M, K, r)
            h = basis.propagate_heads(z)  # (B, N, K, r)
            return h.reshape(b, N, K * r) @ O.reshape(K * r, Q)

        # propagate_heads costs the same per channel as propagate
        return [Route("lowrank_heads",
                      B * (M * P * K * r + basis.propagate_flops(r) + N * K * r * Q),
                      B * (M + N) * K * r, heads, device_type=basis.device.type)]


PARAMS = Registry("param", group="structconv.params")
"""The parameter forms usable as ``param = "NAME"`` in a model config: the shipped ones, those
registered from Python, and installed packages' entry points of ``structconv.params``."""


def register(name: str, build=None, **traits):
    """Make ``name`` usable as ``param = "NAME"`` in a model config (and in ``make_param``).

    ``build(spec, K, P, Q) -> Parameterization``: ``spec`` is the layer's table (a dict: the
    form's extra sizes such as ``groups``, ``H`` or ``rank``). Usable as a decorator. An
    installed package's entry point ``NAME = "module:build"`` in group ``structconv.params``
    makes a form of every process, the command line included.
    """
    return PARAMS.register(name, build, **traits)


register("full", lambda spec, K, P, Q: Full(K, P, Q))
register("grouped", lambda spec, K, P, Q: Grouped(K, P, Q, int(spec.get("groups", 1))))
register("depthwise", lambda spec, K, P, Q: DepthwiseSeparable(K, P, Q))
register("depthwise_separable", lambda spec, K, P, Q: DepthwiseSeparable(K, P, Q))
register("separable", lambda spec, K, P, Q: ControlledSeparable(K, P, Q, int(spec.get("H", 1))))
register("lowrank", lambda spec, K, P, Q: LowRank(K, P, Q, int(spec.get("rank", 1))))


def build(spec, K: int, P: int, Q: int) -> Parameterization:
    """The parameter form a layer table (or a form's name) describes, for theta (K, P, Q)."""
    spec = {"param": spec} if isinstance(spec, str) else dict(spec)
    name = spec.get("param", "full")
    out = PARAMS.get(name)(spec, K, P, Q)
    if not isinstance(out, Parameterization) or (out.K, out.P, out.Q) != (K, P, Q):
        got = (getattr(out, "K", None), getattr(out, "P", None), getattr(out, "Q", None))
        raise KindError(f"param {name!r}: the builder must return a sc.params module with "
                        f"(K, P, Q)=({K}, {P}, {Q}), got {type(out).__name__} {got}")
    return out


def make_param(spec, K: int, P: int, Q: int) -> Parameterization:
    """A parameter form from a name (``"full"``, ``"depthwise"``) or a ready module."""
    if isinstance(spec, Parameterization):
        if (spec.K, spec.P, spec.Q) != (K, P, Q):
            raise ValueError(
                f"param module has (K, P, Q)=({spec.K}, {spec.P}, {spec.Q}) but the layer needs "
                f"(K, P, Q)=({K}, {P}, {Q})"
            )
        return spec
    if spec in ("grouped", "separable", "lowrank"):
        raise ValueError(f"param {spec!r} needs its extra size: pass a module from sc.params "
                         "(Grouped, ControlledSeparable, LowRank)")
    return build(spec, K, P, Q)

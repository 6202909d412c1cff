"""The convolution y = Σ_k A_kᵀ x Θ_k: the planner picks how to contract it, the plan runs it.

The paper's figure "computing" gives three orders, each starting from one side of the triangle
(input X, basis A, parameter Θ):

* ``input_param``  R = X·Θ first (bkmq), then Σ_k A_kᵀ R_k
* ``basis_input``  U = Aᵀ·X first (bknp), then Σ_k U_k Θ_k
* ``basis_param``  Φ = A∘Θ first (mnpq), then X·Φ

A basis may add its own whole-convolution kernels (``Basis.routes``: a grid's ``F.convNd`` and
tap routes), a parameter form its *factored* routes that never build theta, and a ``Stack`` the
route that runs each part's own sub-plan on its slice of theta. Each candidate is a costed
``Route`` (weights from ``sc.costs``); ``plan`` returns the ``Plan`` (like opt_einsum's
``contract_path``), the ``Plan`` runs itself, and ``convolve`` is ``plan`` executed. Plans are
cached on the basis by the shapes, strides, dtypes and devices of the call (as einops caches its
recipes), so planning costs nothing on the second call; while ``torch.compile`` traces, planning
runs on the static shapes and is folded away.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ._checks import as_batched
from .algebra import materialize
from .basis.base import Basis, Stack, as_basis
from .costs import Route
from .params import as_theta

__all__ = ["convolve", "plan", "explain", "featureless", "ROUTES", "Plan", "Route"]

ROUTES = ("input_param", "basis_input", "basis_param")
"""The paper's three contraction orders (the sides of the triangle), names ``route`` takes."""

#: a materialised Φ (M, N, P, Q) larger than this many elements is never planned automatically
PHI_LIMIT = 2**26
#: plans kept per basis (one per call shape, dtype, device and parameter form)
_MAX_PLANS = 64


@dataclass
class Plan:
    """The planner's decision for one call shape: the chosen route and every candidate's cost.

    ``plan(x, theta, bias=None)`` runs it: x (B, M, P) or (M, P) of the planned shape, theta a
    (K, P, Q) tensor or a ``sc.params`` module of the planned form. A ``Stack``'s plan holds its
    parts' plans (``parts``).
    """

    route: str
    routes: list[Route] = field(default_factory=list)
    parts: list[Plan] = field(default_factory=list)
    x_shape: tuple[int, ...] = ()
    basis: Basis | None = field(default=None, repr=False)

    @property
    def chosen(self) -> Route:
        return next(r for r in self.routes if r.name == self.route)

    def table(self) -> list[dict]:
        """Rows ``{route, flops, elements, cost, chosen}``, cheapest first."""
        rows = [dict(route=r.name, flops=r.flops, elements=r.elements, cost=r.cost,
                     chosen=r.name == self.route) for r in self.routes]
        return sorted(rows, key=lambda r: r["cost"])

    def __str__(self) -> str:
        lines = [f"route: {self.route}"]
        for r in self.table():
            mark = "*" if r["chosen"] else " "
            lines.append(f" {mark} {r['route']:<18} flops={r['flops']:.3e} "
                         f"temp={r['elements']:.3e} cost={r['cost']:.3e}")
        for i, p in enumerate(self.parts):
            lines.append(f" part {i}: " + str(p).replace("\n", "\n   "))
        return "\n".join(lines)

    def __call__(self, x: Tensor, theta, bias: Tensor | None = None) -> Tensor:
        basis = self.basis
        if basis is None:
            raise ValueError("this plan was made without a basis and cannot run")
        th = as_theta(theta)
        xb, added = _check(x, basis, th)
        if tuple(xb.shape) != self.x_shape:
            raise ValueError(f"this plan was made for x of shape {self.x_shape}, got "
                             f"{tuple(xb.shape)}: make a plan for the new shape")
        y = self.run(xb, th, _check_bias(bias, th.Q, xb.dtype))
        return y.squeeze(0) if added else y

    def run(self, x: Tensor, theta, bias: Tensor | None = None) -> Tensor:
        """The chosen route on checked inputs: x (B, M, P), an adapted theta, a (Q,) bias."""
        r = self.chosen
        if r.run is None:
            raise ValueError(f"route {r.name!r} of this plan has no runner (made from shapes)")
        if bias is None or r.fuses_bias:
            return r.run(x, theta, bias)
        return r.run(x, theta, None) + bias


# -- checks --------------------------------------------------------------------------------------
def _check(x: Tensor, basis: Basis, theta) -> tuple[Tensor, bool]:
    xb, added = as_batched(x, basis.M)
    K, P, Q = theta.K, theta.P, theta.Q
    if K != basis.K:
        raise ValueError(
            f"basis has K={basis.K} matrices (shape (K, M, N)={basis.shape}) but theta has "
            f"K={K} (shape (K, P, Q)=({K}, {P}, {Q})): dimension K disagrees"
        )
    if xb.shape[2] != P:
        raise ValueError(
            f"x has P={xb.shape[2]} channels (shape {tuple(x.shape)}) but theta expects P={P} "
            f"(shape (K, P, Q)=({K}, {P}, {Q})): dimension P disagrees"
        )
    return xb, added


def _check_bias(bias, Q: int, dtype: torch.dtype) -> Tensor | None:
    if bias is None:
        return None
    if not isinstance(bias, Tensor) or tuple(bias.shape) != (Q,):
        raise ValueError(f"bias must be a ({Q},) tensor (Q={Q} output channels), got "
                         f"{tuple(bias.shape) if isinstance(bias, Tensor) else type(bias)}")
    return bias.to(dtype)


# -- candidates ----------------------------------------------------------------------------------
def _full_routes(x: Tensor, basis: Basis, theta) -> list[Route]:
    """The paper's three orders on the full theta (K, P, Q)."""
    B, M, P = x.shape
    K, N, Q = basis.K, basis.N, theta.Q
    dev = basis.device.type
    # a basis computed per batch item (attention) materialises one map per item
    parts = basis.parts if isinstance(basis, Stack) else [basis]
    items = max(getattr(b, "batch", 1) for b in parts)

    def input_param(x, th, bias):
        t = th().to(x.dtype)
        b = x.shape[0]
        z = (x.reshape(b * M, P) @ t.permute(1, 0, 2).reshape(P, K * Q)).reshape(b, M, K, Q)
        return basis.propagate_sum(z) if bias is None else basis.propagate_sum_bias(z, bias)

    def basis_input(x, th, bias):
        u = basis.propagate(x)  # (B, N, K, P)
        return u.reshape(x.shape[0], N, K * P) @ th().to(x.dtype).reshape(K * P, Q)

    def basis_param(x, th, bias):
        phi = materialize(basis, th().to(x.dtype))  # (M, N, P, Q), or (B, ...) per item
        if phi.dim() == 5:
            return torch.einsum("bmp,bmnpq->bnq", x, phi.expand(x.shape[0], *phi.shape[1:]))
        return torch.einsum("bmp,mnpq->bnq", x, phi)

    return [
        Route("input_param", B * (M * P * K * Q + basis.propagate_sum_flops(Q)),
              B * M * K * Q, input_param, fuses_bias=True, device_type=dev),
        Route("basis_input", B * (basis.propagate_flops(P) + N * K * P * Q),
              B * N * K * P, basis_input, device_type=dev),
        Route("basis_param", items * K * M * N * P * Q + B * M * N * P * Q,
              items * M * N * P * Q + K * M * N, basis_param, device_type=dev),
    ]


def _stack_route(x: Tensor, basis: Stack, theta) -> tuple[Route, list[Plan]]:
    """Each part on its own slice of theta, by its own best route (sub-plans inside)."""
    P, Q = theta.P, theta.Q
    parts = []
    for b, s in zip(basis.parts, basis.slices()):
        shape = torch.empty(s.stop - s.start, P, Q, device="meta")
        parts.append(_cached_plan(x, b, as_theta(shape), "auto"))
    slices = basis.slices()

    def run(x, th, bias):
        t = th()
        y = None
        for p, s in zip(parts, slices):
            part = p.run(x, as_theta(t[s]))
            y = part if y is None else y + part
        return y

    cost = sum(p.chosen.cost for p in parts)
    return Route("stack", cost, 0.0, run, device_type=basis.device.type), parts


def _make_plan(x: Tensor, basis: Basis, theta, route: str) -> Plan:
    routes = _full_routes(x, basis, theta) + list(basis.routes(x, theta))
    factored = list(theta.factored_routes(x, basis))
    parts: list[Plan] = []
    auto = routes + factored
    if isinstance(basis, Stack):
        stack, parts = _stack_route(x, basis, theta)
        routes = [stack] + routes
        # automatically, a Stack runs its parts' own paths, unless a factored route of the
        # whole theta beats them (e.g. LowRank heads, which slicing theta would lose)
        auto = [stack] + factored
        if route == "native":
            route = "stack"
    routes += factored
    if route == "auto":
        route = _cheapest(auto, basis.M * basis.N * x.shape[2] * theta.Q > PHI_LIMIT)
    elif route not in {r.name for r in routes}:
        raise ValueError(f"unknown route {route!r} for this basis/theta: choose 'auto' or one of "
                         f"{sorted({r.name for r in routes})}")
    return Plan(route, routes, parts, tuple(x.shape), basis)


def _cheapest(routes: list[Route], phi_too_big: bool) -> str:
    # a plain loop (not min(key=)): torch.compile traces the planner
    best, name = float("inf"), ""
    for r in routes:
        c = r.cost
        if c < best and not (phi_too_big and r.name == "basis_param"):
            best, name = c, r.name
    return name


def _cached_plan(x: Tensor, basis: Basis, theta, route: str) -> Plan:
    if torch.compiler.is_compiling() or x.device.type == "meta":
        return _make_plan(x, basis, theta, route)
    key = ("plan", route, tuple(x.shape), x.stride(), x.dtype, x.device, theta.plan_key())
    memo = basis.memo
    p = memo.get(key)
    if p is None:
        # (a snapshot of the keys: other threads may plan on the same basis meanwhile)
        plans = [k for k in memo.copy() if k[0] == "plan"]
        if len(plans) >= _MAX_PLANS:
            # a basis called on ever new shapes (varying batch sizes) keeps a bounded cache
            for k in plans:
                memo.pop(k, None)
        p = memo[key] = _make_plan(x, basis, theta, route)
    return p


# -- public --------------------------------------------------------------------------------------
def plan(x, basis, theta, *, route: str = "auto") -> Plan:
    """The planner's choice for ``convolve(x, basis, theta)`` with every route's estimated cost.

    ``x`` may be a tensor or just its shape ``(B, M, P)``; ``theta`` a tensor, a shape
    ``(K, P, Q)`` or a ``sc.params`` module. The returned ``Plan`` runs itself on inputs of the
    planned shape (``plan(x, theta)``).
    """
    basis = as_basis(basis)
    if not isinstance(x, Tensor):
        x = torch.empty(tuple(x), device="meta", dtype=basis.dtype)
    if not isinstance(theta, Tensor) and isinstance(theta, (tuple, list, torch.Size)):
        theta = torch.empty(tuple(theta), device="meta")
    th = as_theta(theta)
    xb, _ = _check(x, basis, th)
    if xb.device.type != "meta":
        basis = basis.cast_like(xb)
    return _cached_plan(xb, basis, th, route)


def explain(x, basis, theta) -> str:
    """A readable table of the planner's estimates and choice (see ``plan``)."""
    return str(plan(x, basis, theta))


def convolve(x: Tensor, basis, theta, *, route: str = "auto",
             bias: Tensor | None = None) -> Tensor:
    """The structured convolution ``y[b,n,q] = Σ_{k,m,p} A[k,m,n] x[b,m,p] θ[k,p,q]`` (+ bias).

    x: (B, M, P) or (M, P); basis: a ``sc.basis.Basis`` or dense (K, M, N) tensor;
    theta: (K, P, Q) tensor or ``sc.params`` module. Returns (B, N, Q) or (N, Q).
    ``route`` is ``"auto"`` (the planner), one of ``ROUTES``, ``"native"`` for a basis's fused
    kernel, or the name of any other candidate in ``explain``'s table. ``bias``: an optional
    (Q,) tensor added to every output row, inside the route's kernel where it can.
    """
    basis = as_basis(basis)
    th = as_theta(theta)
    xb, added = _check(x, basis, th)
    if not xb.is_floating_point():
        raise TypeError(f"x must be a floating tensor, got dtype {xb.dtype}")
    bias = _check_bias(bias, th.Q, xb.dtype)
    basis = basis.cast_like(xb)
    y = _cached_plan(xb, basis, th, route).run(xb, th, bias)
    return y.squeeze(0) if added else y


def featureless(basis, theta, *, bias: Tensor | None = None, rows: Tensor | None = None) -> Tensor:
    """``convolve(I, basis, theta)`` for featureless entries (one-hot inputs) without forming I.

    With x = I the input-side product x·Θ_k is Θ_k itself, so only the propagation remains:
    y = Σ_k A_kᵀ Θ_k, one ``propagate_sum``. theta (K, M, Q) -> y (N, Q) (+ bias). ``rows``
    (M,) names which entries' one-hot rows the basis's M inputs are (a basis restricted to a
    sample of the P entries theta (K, P, Q) has rows for): x·Θ_k is then Θ_k[rows].
    """
    basis = as_basis(basis)
    th = as_theta(theta)
    M = basis.M if rows is None else rows.shape[0]
    if th.K != basis.K or (rows is None and th.P != basis.M) or M != basis.M:
        raise ValueError(f"featureless input needs theta (K, M, Q) with K={basis.K} and "
                         f"M={basis.M} (basis (K, M, N)={basis.shape}"
                         + ("" if rows is None else f", {M} rows") + f"), got (K, P, Q)="
                         f"({th.K}, {th.P}, {th.Q})")
    t = th()
    if rows is not None:
        t = t[:, rows.to(t.device)]
    y = basis.cast_like(t).propagate_sum(t.permute(1, 0, 2).unsqueeze(0))[0]
    return y if bias is None else y + _check_bias(bias, th.Q, y.dtype)

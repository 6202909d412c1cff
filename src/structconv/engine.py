"""The convolution y = Σ_k A_kᵀ x Θ_k and the planner that picks how to contract it.

The paper's figure "computing" gives three orders, each starting from one side of the triangle
(input X, basis A, parameter Θ):

* ``input_param``  R = X·Θ first (bkmq), then Σ_k A_kᵀ R_k
* ``basis_input``  U = Aᵀ·X first (bknp), then Σ_k U_k Θ_k
* ``basis_param``  Φ = A∘Θ first (mnpq), then X·Φ

Bases may add a fused ``native`` kernel (a grid dispatches to ``F.conv2d``) and parameter forms may
add *factored* routes that never build theta. The planner estimates each candidate's cost as
weighted multiply-adds plus the traffic of its largest temporary, like opt_einsum's greedy path
search, and ``explain`` shows the whole table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ._checks import as_batched
from .basis.base import Basis, Stack, as_basis
from .params import Parameterization, Route

__all__ = ["convolve", "plan", "explain", "ROUTES", "Plan"]

ROUTES = ("input_param", "basis_input", "basis_param")

#: a materialised Φ (M, N, P, Q) larger than this many elements is never planned automatically
PHI_LIMIT = 2**26


@dataclass
class Plan:
    """The planner's decision: the chosen route and every candidate's estimated cost."""

    route: str
    routes: list[Route] = field(default_factory=list)
    parts: list[Plan] = field(default_factory=list)  # for a Stack: one plan per part

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


def _theta_tensor(theta) -> Tensor:
    return theta() if isinstance(theta, Parameterization) else theta


def _check(x: Tensor, basis: Basis, theta) -> tuple[Tensor, bool, int, int]:
    xb, added = as_batched(x, basis.M)
    if isinstance(theta, Parameterization):
        K, P, Q = theta.K, theta.P, theta.Q
    else:
        if not isinstance(theta, Tensor) or theta.dim() != 3:
            got = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
            raise ValueError(f"theta must be a (K, P, Q) tensor or a sc.params module, got {got}")
        K, P, Q = theta.shape
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
    return xb, added, P, Q


def _full_routes(x: Tensor, basis: Basis, theta) -> list[Route]:
    """The paper's three orders on the full theta, plus the basis's fused kernel if any."""
    B, M, P = x.shape
    K, N = basis.K, basis.N
    Q = theta.Q if isinstance(theta, Parameterization) else theta.shape[2]

    def input_param():
        th = _theta_tensor(theta).to(x.dtype)
        z = (x.reshape(B * M, P) @ th.permute(1, 0, 2).reshape(P, K * Q)).reshape(B, M, K, Q)
        return basis.propagate_sum(z)

    def basis_input():
        th = _theta_tensor(theta).to(x.dtype)
        u = basis.propagate(x)  # (B, N, K, P)
        return u.reshape(B, N, K * P) @ th.reshape(K * P, Q)

    def basis_param():
        from .algebra import materialize

        phi = materialize(basis, _theta_tensor(theta).to(x.dtype))  # (M, N, P, Q)
        return torch.einsum("bmp,mnpq->bnq", x, phi)

    routes = [
        Route("input_param", B * (M * P * K * Q + basis.propagate_sum_flops(Q)),
              B * M * K * Q, input_param),
        Route("basis_input", B * (basis.propagate_flops(P) + N * K * P * Q),
              B * N * K * P, basis_input),
    ]
    phi_el = M * N * P * Q
    routes.append(Route("basis_param", K * M * N * P * Q + B * M * N * P * Q,
                        phi_el + K * M * N, basis_param))
    nf = basis.native_flops(B, P, Q, theta)
    if nf is not None:
        routes.append(Route("native", nf, 0.0,
                            lambda: basis.native_convolve(x, theta)))
    return routes + basis.routes(x, theta)


def _candidates(x: Tensor, basis: Basis, theta) -> list[Route]:
    routes = _full_routes(x, basis, theta)
    if isinstance(theta, Parameterization):
        routes += theta.factored_routes(x, basis)
    return routes


def _choose(routes: list[Route], x: Tensor, basis: Basis, theta) -> str:
    B, M, P = x.shape
    Q = theta.Q if isinstance(theta, Parameterization) else theta.shape[2]
    ok = [r for r in routes
          if not (r.name == "basis_param" and basis.M * basis.N * P * Q > PHI_LIMIT)]
    return min(ok, key=lambda r: r.cost).name


def plan(x: Tensor, basis, theta) -> Plan:
    """The planner's choice for ``convolve(x, basis, theta)`` with every route's estimated cost.

    ``x`` may be a tensor or just its shape ``(B, M, P)``; ``theta`` a tensor, a shape
    ``(K, P, Q)`` or a ``sc.params`` module.
    """
    basis = as_basis(basis)
    if not isinstance(x, Tensor):
        x = torch.empty(tuple(x), device="meta")
    if not isinstance(theta, (Tensor, Parameterization)):
        theta = torch.empty(tuple(theta), device="meta")
    xb, _, P, Q = _check(x, basis, theta)
    if isinstance(basis, Stack):
        parts = [plan(xb, b, _slice_theta(theta, s)) for b, s in zip(basis.parts, basis._slices())]
        total = Route("stack", sum(min(r.cost for r in p.routes) for p in parts), 0.0)
        # slicing theta per part loses a form's factored routes (e.g. LowRank heads, which
        # never build theta): take the whole basis's factored route where it is cheaper
        whole = theta.factored_routes(xb, basis) if isinstance(theta, Parameterization) else []
        best = min(whole, key=lambda r: r.cost, default=None)
        if best is not None and best.cost < total.cost:
            return Plan(best.name, [total] + whole, parts)
        return Plan("stack", [total], parts)
    routes = _candidates(xb, basis, theta)
    return Plan(_choose(routes, xb, basis, theta), routes)


def explain(x, basis, theta) -> str:
    """A readable table of the planner's estimates and choice (see ``plan``)."""
    return str(plan(x, basis, theta))


def _slice_theta(theta, s: slice):
    if isinstance(theta, Parameterization):
        return _theta_tensor(theta)[s]
    return theta[s]


def convolve(x: Tensor, basis, theta, *, route: str = "auto",
             bias: Tensor | None = None) -> Tensor:
    """The structured convolution ``y[b,n,q] = Σ_{k,m,p} A[k,m,n] x[b,m,p] θ[k,p,q]`` (+ bias).

    x: (B, M, P) or (M, P); basis: a ``sc.basis.Basis`` or dense (K, M, N) tensor;
    theta: (K, P, Q) tensor or ``sc.params`` module. Returns (B, N, Q) or (N, Q).
    ``route`` is ``"auto"`` (the planner), one of ``ROUTES``, ``"native"`` for a basis's fused
    kernel, or the name of a parameter form's factored route. ``bias``: an optional (Q,)
    tensor added to every output row, inside the route's kernel where it can (as F.convNd's).
    """
    basis = as_basis(basis)
    xb, added, P, Q = _check(x, basis, theta)
    if not xb.is_floating_point():
        raise TypeError(f"x must be a floating tensor, got dtype {xb.dtype}")
    if bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) != (Q,)):
        raise ValueError(f"bias must be a ({Q},) tensor (Q={Q} output channels), got "
                         f"{tuple(bias.shape) if isinstance(bias, Tensor) else type(bias)}")
    bias = None if bias is None else bias.to(xb.dtype)
    basis = basis._matching(xb)
    if isinstance(basis, Stack) and route == "auto" and isinstance(theta, Parameterization):
        chosen = plan(xb, basis, theta).route
        if chosen != "stack":
            route = chosen  # a factored route of the whole theta beats the parts' paths
    if isinstance(basis, Stack) and route in ("auto", "native"):
        # each part takes its own best path on its slice of theta
        th = _theta_tensor(theta)
        ys = [convolve(xb, b, th[s], route="auto") for b, s in zip(basis.parts, basis._slices())]
        y = ys[0]
        for t in ys[1:]:
            y = y + t
        if bias is not None:
            y = y + bias
    else:
        routes = _candidates(xb, basis, theta)
        name = _choose(routes, xb, basis, theta) if route == "auto" else route
        by_name = {r.name: r for r in routes}
        if name not in by_name:
            raise ValueError(
                f"unknown route {route!r} for this basis/theta: choose 'auto' or one of "
                f"{sorted(by_name)}"
            )
        r = by_name[name]
        if bias is None:
            y = r.run()
        elif r.run_bias is not None:
            y = r.run_bias(bias)
        else:
            y = r.run() + bias
    return y.squeeze(0) if added else y


"""``structconv verify``: the paper's propositions and the torch / PyG equivalences, on random data.

Each check compares structconv against an independent reference in float64 (an explicit einsum of
the definition, torch.nn, or PyG) on random inputs and weights with odd sizes, and reports the
largest absolute error against a tolerance. Checks whose optional dependency is missing are
reported as ``skip`` with the reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Check", "CHECKS", "run_checks", "run_verify"]

TOL = 1e-9


@dataclass
class Check:
    """One verification result."""

    name: str
    status: str  # pass, FAIL, skip
    error: float | None
    detail: str = ""


def _err(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(_err(x, y) for x, y in zip(a, b))
    if a.shape != b.shape:
        raise AssertionError(f"shape {tuple(a.shape)} != reference {tuple(b.shape)}")
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _rand_basis(g, K, M, N, density=0.4):
    A = torch.randn(K, M, N, generator=g, dtype=torch.float64)
    return A * (torch.rand(K, M, N, generator=g, dtype=torch.float64) < density)


def _ref_conv(x, A, theta):
    # the definition: y[b, n, q] = Σ_{k, m, p} A[k, m, n] x[b, m, p] theta[k, p, q]
    return torch.einsum("kmn,bmp,kpq->bnq", A, x, theta)


# -- the paper -------------------------------------------------------------------------------------
def check_routes(g):
    """The three contraction orders (and auto) equal the definition, dense and sparse bases."""
    import structconv as sc

    K, M, N, P, Q, B = 3, 7, 5, 4, 6, 2
    A = _rand_basis(g, K, M, N)
    x = torch.randn(B, M, P, generator=g, dtype=torch.float64)
    th = torch.randn(K, P, Q, generator=g, dtype=torch.float64)
    ref = _ref_conv(x, A, th)
    idx = A.nonzero().T
    bases = [sc.basis.Dense(A), sc.basis.Sparse(idx, A[tuple(idx)], (K, M, N))]
    return max(_err(sc.convolve(x, b, th, route=r), ref) for b in bases
               for r in ("auto", *sc.ROUTES))


def check_mixed_product(g):
    """x·Φ with Φ = materialize(A, Θ) = A ∘ Θ (eq. "factorisation") equals the convolution."""
    import structconv as sc

    K, M, N, P, Q = 4, 5, 3, 2, 3
    A = _rand_basis(g, K, M, N, 0.7)
    th = torch.randn(K, P, Q, generator=g, dtype=torch.float64)
    x = torch.randn(2, M, P, generator=g, dtype=torch.float64)
    phi = sc.materialize(A, th)
    y = torch.einsum("bmp,mnpq->bnq", x, phi)
    e1 = _err(sc.mixed_product(A, th), torch.einsum("kmn,kpq->mnpq", A, th))
    return max(e1, _err(y, _ref_conv(x, A, th)))


def check_prop1(g):
    """Proposition 1: a spanning basis recovers Θ from Φ; otherwise Θ is the least-squares fit."""
    import structconv as sc

    M, N, P, Q = 3, 2, 2, 3
    K = M * N
    A = torch.randn(K, M, N, generator=g, dtype=torch.float64)  # spans R^{M x N} a.s.
    th = torch.randn(K, P, Q, generator=g, dtype=torch.float64)
    e = _err(sc.invert(A, sc.materialize(A, th)), th)
    # a non-spanning basis: the residual is orthogonal to every basis matrix
    A2 = A[:3]
    phi = torch.randn(M, N, P, Q, generator=g, dtype=torch.float64)
    res = phi - sc.materialize(A2, sc.invert(A2, phi))
    return max(e, float(torch.einsum("kmn,mnpq->kpq", A2, res).abs().max()))


def check_prop2(g):
    """Proposition 2: a composition of convolutions is one convolution with K = K'K''."""
    import structconv as sc

    A1, A2 = _rand_basis(g, 2, 6, 5), _rand_basis(g, 3, 5, 4)
    t1 = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    t2 = torch.randn(3, 4, 2, generator=g, dtype=torch.float64)
    x = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    basis, theta = sc.compose((A1, t1), (A2, t2))
    ref = _ref_conv(_ref_conv(x, A1, t1), A2, t2)
    return max(_err(sc.convolve(x, basis, theta), ref),
               _err(basis.to_dense(), torch.einsum("imn,jnr->ijmr", A1, A2).reshape(6, 6, 4)))


def check_stack(g):
    """A stack of bases convolves as the sum of its parts with the matching slices of Θ."""
    import structconv as sc

    A1, A2 = _rand_basis(g, 2, 5, 4), _rand_basis(g, 3, 5, 4)
    th = torch.randn(5, 3, 2, generator=g, dtype=torch.float64)
    x = torch.randn(3, 5, 3, generator=g, dtype=torch.float64)
    y = sc.convolve(x, sc.basis.Stack([A1, A2]), th)
    return _err(y, _ref_conv(x, A1, th[:2]) + _ref_conv(x, A2, th[2:]))


def check_param_counts(g):
    """Parameter forms: the contract's counts, and each theta's structure."""
    from . import params as P

    K, Pn, Q = 3, 4, 6
    forms = [(P.Full(K, Pn, Q), K * Pn * Q), (P.Grouped(K, Pn, Q, 2), K * Pn * Q // 2),
             (P.DepthwiseSeparable(K, Pn, Q), K * Pn + Pn * Q),
             (P.ControlledSeparable(K, Pn, Q, 2), 2 * (K + Pn * Q)),
             (P.LowRank(K, Pn, Q, 2), K * 2 * (Pn + Q))]
    for m, n in forms:
        got = sum(p.numel() for p in m.parameters())
        if got != n or tuple(m().shape) != (K, Pn, Q):
            raise AssertionError(f"{type(m).__name__}: {got} parameters, expected {n}")
    lr = P.LowRank(K, Pn, Q, 2).double()
    rank = max(int(torch.linalg.matrix_rank(t)) for t in lr())
    if rank > 2:
        raise AssertionError(f"LowRank(rank=2) gave a theta_k of rank {rank}")
    return 0.0


def check_biaffine(g):
    """Bi-affine attention scores x1 Λ x2ᵀ + (x1 μ)⊗1 + 1⊗(x2 ν) + ξ (eq. biaffine-attention)."""
    from .attention import biaffine

    x1 = torch.randn(5, 3, generator=g, dtype=torch.float64)
    x2 = torch.randn(4, 2, generator=g, dtype=torch.float64)
    L = torch.randn(2, 3, 2, generator=g, dtype=torch.float64)
    mu, nu = torch.randn(2, 3, generator=g, dtype=torch.float64), \
        torch.randn(2, 2, generator=g, dtype=torch.float64)
    xi = torch.randn(2, generator=g, dtype=torch.float64)
    ref = torch.einsum("mp,kpq,nq->kmn", x1, L, x2) + (x1 @ mu.T).T[:, :, None] + \
        (x2 @ nu.T).T[:, None, :] + xi[:, None, None]
    return _err(biaffine(x1, x2, L, mu, nu, xi), ref)


# -- torch.nn --------------------------------------------------------------------------------------
def _torch_pair(module, *inputs):
    import structconv as sc

    module = module.double().eval()
    ours = sc.nn.from_torch(module).double().eval()
    with torch.no_grad():
        return ours(*inputs), module(*inputs)


def check_conv1d(g):
    """from_torch(Conv1d): stride, dilation, groups, 'same' padding."""
    nn = torch.nn
    x = torch.randn(2, 4, 11, generator=g, dtype=torch.float64)
    e = 0.0
    for m in (nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2),
              nn.Conv1d(4, 3, 4, padding="same")):
        e = max(e, _err(*_torch_pair(m, x)))
    return e


def check_conv2d(g):
    """from_torch(Conv2d) on odd images, with stride, padding, dilation, groups, bias."""
    nn = torch.nn
    x = torch.randn(2, 4, 7, 9, generator=g, dtype=torch.float64)
    e = 0.0
    for m in (nn.Conv2d(4, 6, 3, padding=1), nn.Conv2d(4, 4, (2, 3), stride=(2, 1), groups=4),
              nn.Conv2d(4, 2, 3, dilation=2, padding=(1, 2), bias=False)):
        e = max(e, _err(*_torch_pair(m, x)))
    return e


def check_conv3d(g):
    """from_torch(Conv3d)."""
    x = torch.randn(1, 2, 4, 5, 3, generator=g, dtype=torch.float64)
    return _err(*_torch_pair(torch.nn.Conv3d(2, 3, (2, 3, 2), padding=(0, 1, 1)), x))


def check_avgpool(g):
    """from_torch(AvgPool2d): the K = 1 average-pooling basis (padding counted)."""
    x = torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64)
    return _err(*_torch_pair(torch.nn.AvgPool2d(3, stride=2, padding=1), x))


def check_mha(g):
    """from_torch(MultiheadAttention), batch_first, with a causal mask."""
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    ours, ref = _torch_pair(m, x, x, x, None, True, mask)
    return _err(ours, ref)


# -- PyG -------------------------------------------------------------------------------------------
def _graph(g, n=9, e=24):
    ei = torch.randint(0, n, (2, e), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    return ei, torch.randn(n, 5, generator=g, dtype=torch.float64)


def _pyg_pair(module, *inputs):
    import structconv as sc

    module = module.double().eval()
    ours = sc.nn.from_pyg(module).double().eval()
    with torch.no_grad():
        return _err(ours(*inputs), module(*inputs))


def _pyg():
    import torch_geometric.nn as pygnn

    return pygnn


def check_pyg_gcn(g):
    """from_pyg(GCNConv) on a random directed graph with edge weights."""
    ei, x = _graph(g)
    w = torch.rand(ei.shape[1], generator=g, dtype=torch.float64)
    return _pyg_pair(_pyg().GCNConv(5, 4), x, ei, w)


def check_pyg_cheb(g):
    """from_pyg(ChebConv), K = 3, sym normalisation."""
    ei, x = _graph(g)
    ei = torch.cat([ei, ei.flip(0)], 1)
    return _pyg_pair(_pyg().ChebConv(5, 3, K=3), x, ei)


def check_pyg_tag(g):
    """from_pyg(TAGConv), K = 2."""
    ei, x = _graph(g)
    return _pyg_pair(_pyg().TAGConv(5, 3, K=2), x, ei)


def check_pyg_sgc(g):
    """from_pyg(SGConv), K = 2."""
    ei, x = _graph(g)
    return _pyg_pair(_pyg().SGConv(5, 3, K=2), x, ei)


def check_pyg_gat(g):
    """from_pyg(GATConv), 3 heads, concatenated."""
    ei, x = _graph(g)
    return _pyg_pair(_pyg().GATConv(5, 2, heads=3), x, ei)


def check_pyg_rgcn(g):
    """from_pyg(RGCNConv), 3 relations, basis decomposition."""
    ei, x = _graph(g)
    et = torch.randint(0, 3, (ei.shape[1],), generator=g)
    return _pyg_pair(_pyg().RGCNConv(5, 4, num_relations=3, num_bases=2), x, ei, et)


CHECKS = [
    ("routes = definition", check_routes, "core"),
    ("mixed product / materialize", check_mixed_product, "core"),
    ("Proposition 1 (invert)", check_prop1, "core"),
    ("Proposition 2 (compose)", check_prop2, "core"),
    ("stack of bases", check_stack, "core"),
    ("parameter forms", check_param_counts, "core"),
    ("biaffine attention", check_biaffine, "attention"),
    ("Conv1d", check_conv1d, "torch"),
    ("Conv2d", check_conv2d, "torch"),
    ("Conv3d", check_conv3d, "torch"),
    ("AvgPool2d", check_avgpool, "torch"),
    ("MultiheadAttention", check_mha, "torch"),
    ("GCNConv", check_pyg_gcn, "pyg"),
    ("ChebConv", check_pyg_cheb, "pyg"),
    ("TAGConv", check_pyg_tag, "pyg"),
    ("SGConv", check_pyg_sgc, "pyg"),
    ("GATConv", check_pyg_gat, "pyg"),
    ("RGCNConv", check_pyg_rgcn, "pyg"),
]


def run_checks(seed: int = 0, trials: int = 3, device: str = "cpu") -> list[Check]:
    """Run every check ``trials`` times (fresh random data each time); the worst error counts."""
    import warnings

    results = []
    for name, fn, _ in CHECKS:
        worst, status, detail = 0.0, "pass", (fn.__doc__ or "").strip().splitlines()[0]
        for t in range(trials):
            g = torch.Generator().manual_seed(seed * 1000 + t)
            torch.manual_seed(seed * 1000 + t)  # module initialisation
            try:
                with warnings.catch_warnings():
                    # torch warns about its own 'same' padding copies; not a verification issue
                    warnings.simplefilter("ignore", UserWarning)
                    worst = max(worst, fn(g))
            except ModuleNotFoundError as e:
                status, detail, worst = "skip", f"needs {e.name}", None
                break
            except (TypeError, NotImplementedError) as e:
                if "does not know" in str(e) or "not implemented" in str(e).lower():
                    status, detail, worst = "skip", str(e).splitlines()[0], None
                    break
                status, detail, worst = "FAIL", f"{type(e).__name__}: {e}".splitlines()[0], None
                break
            except Exception as e:  # a failing check is a result, not a crash
                status, detail, worst = "FAIL", f"{type(e).__name__}: {e}".splitlines()[0], None
                break
        if status == "pass" and not worst <= TOL:
            status = "FAIL"
        results.append(Check(name, status, worst, detail))
    return results


def run_verify(seed: int = 0, quick: bool = False, device: str = "cpu", out=None) -> int:
    """Print the pass/fail table; exit status 0 when nothing failed, 1 otherwise."""
    from .training import resolve_device

    resolve_device(device)
    t0 = time.perf_counter()
    results = run_checks(seed, 1 if quick else 3, device)
    w = max(len(r.name) for r in results)
    print(f"{'check':<{w}}  status  max |error|  (float64, tol {TOL:g})")
    print(f"{'-' * w}  ------  -----------")
    for r in results:
        err = "-" if r.error is None else f"{r.error:.2e}"
        print(f"{r.name:<{w}}  {r.status:<6}  {err:>11}  {r.detail}")
    n_fail = sum(r.status == "FAIL" for r in results)
    n_pass = sum(r.status == "pass" for r in results)
    n_skip = len(results) - n_fail - n_pass
    print(f"\n{n_pass} passed, {n_fail} failed, {n_skip} skipped in "
          f"{time.perf_counter() - t0:.1f} s")
    if out:
        from .io import atomic_write_json

        atomic_write_json(Path(out) / "verify.json", [r.__dict__ for r in results])
    return 1 if n_fail else 0

"""The bi-affine attention mechanism (paper eq. "biaffine-attention") as a plain function."""

from __future__ import annotations

from torch import Tensor

__all__ = ["biaffine"]


def _batched(x: Tensor, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"biaffine: {name} must be a tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"biaffine: {name} must be floating features, got dtype {x.dtype} "
                        f"(shape {tuple(x.shape)})")
    if x.dim() == 2:
        return x.unsqueeze(0)
    if x.dim() == 3:
        return x
    raise ValueError(f"biaffine: {name} must be (M, P') or (B, M, P'), got shape {tuple(x.shape)}")


def biaffine(x1: Tensor, x2: Tensor, Lambda: Tensor | None = None, mu: Tensor | None = None,
             nu: Tensor | None = None, xi: Tensor | None = None) -> Tensor:
    """Scores (K, M, N) (or (B, K, M, N)) = x1 Λ_k x2ᵀ + (x1 μ_k)⊗1 + 1⊗(x2 ν_k) + ξ_k.

    x1 (M, P') or (B, M, P'), x2 (N, Q') or (B, N, Q'); Lambda (K, P', Q'), mu (K, P'),
    nu (K, Q'), xi (K,); a term given as None is absent (at least one must be given).
    """
    batched = (isinstance(x1, Tensor) and x1.dim() == 3) or (isinstance(x2, Tensor)
                                                            and x2.dim() == 3)
    a, b = _batched(x1, "x1"), _batched(x2, "x2")
    if a.shape[0] != b.shape[0] and 1 not in (a.shape[0], b.shape[0]):
        raise ValueError(f"biaffine: batch sizes of x1 {tuple(x1.shape)} and x2 "
                         f"{tuple(x2.shape)} disagree")
    B = max(a.shape[0], b.shape[0])
    M, P1 = a.shape[1:]
    N, Q1 = b.shape[1:]
    Ks = {}
    for name, t, shp in (("Lambda", Lambda, (P1, Q1)), ("mu", mu, (P1,)), ("nu", nu, (Q1,)),
                         ("xi", xi, ())):
        if t is None:
            continue
        if not isinstance(t, Tensor) or t.dim() != 1 + len(shp) or tuple(t.shape[1:]) != shp:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            want = "(K, " + ", ".join(map(str, shp)) + ")" if shp else "(K,)"
            raise ValueError(f"biaffine: {name} must be {want} for x1 (.., {M}, {P1}) and "
                             f"x2 (.., {N}, {Q1}), got {got}")
        if not t.is_floating_point():
            raise TypeError(f"biaffine: {name} must be a floating tensor, got dtype {t.dtype}")
        Ks[name] = t.shape[0]
    if not Ks:
        raise ValueError("biaffine: give at least one of Lambda, mu, nu, xi")
    if len(set(Ks.values())) > 1:
        raise ValueError(f"biaffine: terms disagree on K: {Ks}")
    K = next(iter(Ks.values()))
    dt = a.dtype
    out = None
    if Lambda is not None:
        # (B, 1, M, P') @ (K, P', Q') -> (B, K, M, Q'), then against x2ᵀ: one batched GEMM each
        left = a.unsqueeze(1) @ Lambda.to(dt)
        out = left @ b.to(dt).transpose(1, 2).unsqueeze(1)
    terms = []
    if mu is not None:
        terms.append((a @ mu.to(dt).t()).transpose(1, 2).unsqueeze(3))  # (B, K, M, 1)
    if nu is not None:
        terms.append((b.to(dt) @ nu.to(dt).t()).transpose(1, 2).unsqueeze(2))  # (B, K, 1, N)
    if xi is not None:
        terms.append(xi.to(dt).reshape(1, K, 1, 1))
    for t in terms:
        out = t if out is None else out + t
    if tuple(out.shape) != (B, K, M, N):
        out = out.expand(B, K, M, N).contiguous()
    return out if batched else out[0]

"""Graph bases: dense definitions, sparse primitives, recurrences, planner, cache and errors."""

import gc

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import structconv as sc
from structconv.basis import Dense, graph
from structconv.basis.graph import ChebyshevBasis, PowerBasis, RelationalBasis, SparseOperator

D = torch.float64


def random_graph(n=11, E=30, seed=0, isolated=2, num_relations=3):
    """A directed graph with duplicate edges, self loops, ``isolated`` untouched last nodes."""
    g = torch.Generator().manual_seed(seed)
    m = n - isolated
    ei = torch.randint(0, m, (2, E), generator=g)
    ei = torch.cat([ei, ei[:, :3], torch.tensor([[1, 2, 2], [1, 2, 2]])], 1)  # dups, loops
    w = torch.rand(ei.shape[1], generator=g, dtype=D) + 0.1
    et = torch.randint(0, num_relations, (ei.shape[1],), generator=g)
    return ei, w, et


def dense_adj(ei, w, n, keep_loops=True):
    A = torch.zeros(n, n, dtype=D)
    for (s, d), v in zip(ei.T.tolist(), w.tolist()):
        if keep_loops or s != d:
            A[s, d] += v
    return A


def inv_sqrt(d):
    out = d.pow(-0.5)
    out[torch.isinf(out)] = 0
    return out


def dense_gcn(ei, w, n, improved=False, loops=True, normalize=True):
    A = dense_adj(ei, w, n, keep_loops=not loops)
    if loops:
        fill = 2.0 if improved and w is not None else 1.0
        diag = torch.full((n,), fill, dtype=D)
        for (s, d), v in zip(ei.T.tolist(), w.tolist()):
            if s == d:
                diag[s] = v  # an existing loop keeps its (last) weight
        A = A + torch.diag(diag)
    if not normalize:
        return A
    dis = inv_sqrt(A.sum(0))  # degree on targets
    return dis[:, None] * A * dis[None, :]


def dense_cheb(ei, w, n, K, normalization="sym", lambda_max=None):
    A = dense_adj(ei, w, n, keep_loops=False)
    deg = A.sum(1)  # degree on sources
    eye = torch.eye(n, dtype=D)
    if normalization is None:
        L = torch.diag(deg) - A
    elif normalization == "sym":
        dis = inv_sqrt(deg)
        L = eye - dis[:, None] * A * dis[None, :]
    else:
        dinv = 1 / deg
        dinv[torch.isinf(dinv)] = 0
        L = eye - dinv[:, None] * A
    lam = 2 * L.max() if lambda_max is None else lambda_max
    Lh = 2 * L / lam - eye
    T = [eye, Lh]
    while len(T) < K:
        T.append(2 * Lh @ T[-1] - T[-2])
    return torch.stack(T[:K])


def dense_rw(ei, w, n):
    A = dense_adj(ei, w, n)
    dinv = 1 / A.sum(1)
    dinv[torch.isinf(dinv)] = 0
    return dinv[:, None] * A


def powers(S, ps):
    return torch.stack([torch.linalg.matrix_power(S, p) for p in ps])


def dense_relation(ei, w, et, r, n, normalization="mean"):
    keep = et == r
    A = dense_adj(ei[:, keep], w[keep], n)
    if normalization == "mean":
        d = A.sum(0)
        d[d == 0] = 1
        return A / d[None, :]
    if normalization == "sym":
        return inv_sqrt(A.sum(1))[:, None] * A * inv_sqrt(A.sum(0))[None, :]
    return A


N = 11


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("loops", [False, True])
def test_gcn_dense_definition(weighted, improved, loops):
    ei, w, _ = random_graph()
    ew = w if weighted else None
    b = sc.basis.gcn(ei, N, ew, add_self_loops=loops, improved=improved, dtype=D)
    ref = dense_gcn(ei, w if weighted else torch.ones_like(w), N, improved and weighted, loops)
    assert b.shape == (1, N, N)
    torch.testing.assert_close(b.to_dense()[0], ref, rtol=1e-12, atol=1e-12)


def test_gcn_unnormalized_is_adjacency():
    ei, w, _ = random_graph()
    b = sc.basis.gcn(ei, N, w, add_self_loops=False, normalize=False)
    torch.testing.assert_close(b.to_dense()[0], dense_adj(ei, w, N))


@pytest.mark.parametrize("normalization", ["sym", "rw", None])
@pytest.mark.parametrize("K", [1, 2, 4])
def test_chebyshev_dense_definition(normalization, K):
    ei, w, _ = random_graph(seed=K)
    b = sc.basis.chebyshev(ei, N, K, w, normalization)
    torch.testing.assert_close(b.to_dense(), dense_cheb(ei, w, N, K, normalization),
                               rtol=1e-11, atol=1e-11)
    b = sc.basis.chebyshev(ei, N, K, None, normalization, lambda_max=3.0, dtype=D)
    ref = dense_cheb(ei, torch.ones_like(w), N, K, normalization, lambda_max=3.0)
    torch.testing.assert_close(b.to_dense(), ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("normalization", ["sym", "rw", None])
def test_diffusion_dense_definition(normalization):
    ei, w, _ = random_graph(seed=3)
    b = sc.basis.diffusion(ei, N, 3, w, normalization)
    if normalization == "sym":
        S = dense_gcn(ei, w, N, loops=False)
    elif normalization == "rw":
        S = dense_rw(ei, w, N)
        # the contract's definition: S[m, n] = w(m->n) / Σ_n' w(m->n'), empty rows stay zero
        rows = S.sum(1)
        assert torch.allclose(rows[rows > 0], torch.ones_like(rows[rows > 0]))
        assert (S[N - 1] == 0).all()
    else:
        S = dense_adj(ei, w, N)
    assert b.K == 4
    torch.testing.assert_close(b.to_dense(), powers(S, range(4)), rtol=1e-12, atol=1e-12)


def test_sgc_is_a_power_of_gcn():
    ei, w, _ = random_graph(seed=4)
    b = sc.basis.sgc(ei, N, 3, w)
    assert b.K == 1
    torch.testing.assert_close(b.to_dense()[0],
                               torch.linalg.matrix_power(dense_gcn(ei, w, N), 3))


@pytest.mark.parametrize("normalization", ["mean", "sym", None])
def test_relational_dense_definition(normalization):
    ei, w, et = random_graph(seed=5)
    sorts = [(0,), (2,), (0, 1), (1, 2, 0), 1]
    b = sc.basis.relational(ei, et, N, sorts, edge_weight=w, normalization=normalization,
                            identity=True)
    R = [dense_relation(ei, w, et, r, N, normalization) for r in range(3)]
    ref = torch.stack([torch.eye(N, dtype=D), R[0], R[2], R[0] @ R[1], R[1] @ R[2] @ R[0],
                       R[1]])
    assert b.K == 6
    torch.testing.assert_close(b.to_dense(), ref, rtol=1e-12, atol=1e-12)


def test_relational_mean_single_relations_is_rgcn():
    ei, _, et = random_graph(seed=6, num_relations=4)
    b = sc.basis.relational(ei, et, N, identity=True, num_relations=5, dtype=D)
    assert b.K == 6  # identity + 5 relations (relation 4 has no edge: a zero matrix)
    A = b.to_dense()
    ones = torch.ones(ei.shape[1], dtype=D)
    for r in range(4):
        torch.testing.assert_close(A[r + 1], dense_relation(ei, ones, et, r, N))
    assert (A[5] == 0).all()


def test_relational_bipartite():
    g = torch.Generator().manual_seed(0)
    ei = torch.stack([torch.randint(0, 5, (12,), generator=g),
                      torch.randint(0, 8, (12,), generator=g)])
    et = torch.randint(0, 2, (12,), generator=g)
    b = sc.basis.relational(ei, et, (5, 8), dtype=D)
    assert b.shape == (2, 5, 8)
    ones = torch.ones(12, dtype=D)
    for r in range(2):
        keep = et == r
        A = torch.zeros(5, 8, dtype=D).index_put_((ei[0, keep], ei[1, keep]), ones[keep],
                                                  accumulate=True)
        d = A.sum(0)
        d[d == 0] = 1
        torch.testing.assert_close(b.to_dense()[r], A / d)


def all_bases():
    ei, w, et = random_graph(seed=7)
    return {
        "gcn": sc.basis.gcn(ei, N, w),
        "sgc": sc.basis.sgc(ei, N, 2, w),
        "cheb1": sc.basis.chebyshev(ei, N, 1, w),
        "cheb4": sc.basis.chebyshev(ei, N, 4, w, "rw"),
        "diff": sc.basis.diffusion(ei, N, 3, w, "rw"),
        "rel": sc.basis.relational(ei, et, N, [(0,), (1, 2), (2, 2)], identity=True,
                                   edge_weight=w),
        "rel1": sc.basis.relational(ei, et, N, identity=True, edge_weight=w),
    }


@pytest.mark.parametrize("name", list(all_bases()))
@pytest.mark.parametrize("B", [1, 3])
def test_primitives_match_dense(name, B):
    b = all_bases()[name]
    ref = Dense(b.to_dense())
    g = torch.Generator().manual_seed(B)
    x = torch.randn(B, N, 5, generator=g, dtype=D)
    z = torch.randn(B, N, b.K, 5, generator=g, dtype=D)
    torch.testing.assert_close(b.propagate(x), ref.propagate(x))
    torch.testing.assert_close(b.propagate_sum(z), ref.propagate_sum(z))
    torch.testing.assert_close(b.propagate_heads(z), ref.propagate_heads(z))
    # non-contiguous slices, as the engine passes them
    zt = torch.randn(B, N, 5, b.K, generator=g, dtype=D).transpose(2, 3)
    torch.testing.assert_close(b.propagate_sum(zt), ref.propagate_sum(zt))


@pytest.mark.parametrize("name", list(all_bases()))
def test_routes_agree_with_definition(name):
    b = all_bases()[name]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, N, 4, generator=g, dtype=D)
    theta = torch.randn(b.K, 4, 3, generator=g, dtype=D)
    ref = torch.einsum("kmn,bmp,kpq->bnq", b.to_dense(), x, theta)
    for route in sc.ROUTES:
        torch.testing.assert_close(sc.convolve(x, b, theta, route=route), ref)
    torch.testing.assert_close(sc.convolve(x[0].float(), b, theta.float()), ref[0].float(),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(all_bases()))
@pytest.mark.parametrize("B", [1, 3])
def test_bias_joins_the_sum_exactly(name, B):
    # input_param hands the bias to propagate_sum_bias (a power basis adds it in its last
    # sparse product): the same values and gradients as adding it after
    b = all_bases()[name]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, N, 4, generator=g, dtype=D, requires_grad=True)
    theta = torch.randn(b.K, 4, 3, generator=g, dtype=D, requires_grad=True)
    bias = torch.randn(3, generator=g, dtype=D, requires_grad=True)
    ref = torch.einsum("kmn,bmp,kpq->bnq", b.to_dense(), x, theta) + bias
    got = sc.convolve(x, b, theta, route="input_param", bias=bias)
    torch.testing.assert_close(got, ref)
    gy = torch.randn_like(ref)
    torch.testing.assert_close(torch.autograd.grad(got, (x, theta, bias), gy),
                               torch.autograd.grad(ref, (x, theta, bias), gy))
    assert torch.autograd.gradcheck(
        lambda x, t, c: sc.convolve(x, b, t, route="input_param", bias=c), (x, theta, bias),
        fast_mode=True)


@pytest.mark.parametrize("name", ["gcn", "cheb4", "diff", "rel"])
def test_gradcheck_x_and_theta(name):
    b = all_bases()[name]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, N, 3, generator=g, dtype=D, requires_grad=True)
    theta = torch.randn(b.K, 3, 2, generator=g, dtype=D, requires_grad=True)
    for route in ("input_param", "basis_input"):
        assert torch.autograd.gradcheck(
            lambda x, t, r=route: sc.convolve(x, b, t, route=r), (x, theta), fast_mode=True)
    z = torch.randn(1, N, b.K, 2, generator=g, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(b.propagate_heads, (z,), fast_mode=True)


@pytest.mark.parametrize("ctor", ["gcn", "cheb", "diff", "rel"])
def test_gradient_reaches_edge_weights(ctor):
    ei, w, et = random_graph(n=7, E=12, seed=8)
    # a duplicated self loop keeps only one weight in gcn_norm (PyG's indexed assignment), where
    # autograd would credit both copies: keep a single copy of each loop here
    keep = ei[0] != ei[1]
    keep[-2] = True  # one loop on node 2
    ei, w, et = ei[:, keep], w[keep], et[keep]
    x = torch.randn(7, 3, dtype=D)
    theta = torch.randn(3, 3, 2, dtype=D)

    def f(w):
        if ctor == "gcn":
            b = sc.basis.gcn(ei, 7, w, cache=True)
        elif ctor == "cheb":
            b = sc.basis.chebyshev(ei, 7, 3, w, lambda_max=2.0, cache=True)
        elif ctor == "diff":
            b = sc.basis.diffusion(ei, 7, 2, w, "rw", cache=True)
        else:
            b = sc.basis.relational(ei, et, 7, identity=False, edge_weight=w, cache=True)
        return sc.convolve(x, b, theta[: b.K])

    assert torch.autograd.gradcheck(f, (w.clone().requires_grad_(),))


class CountingOperator(SparseOperator):
    calls = 0

    def apply_t(self, X):
        CountingOperator.calls += 1
        return super().apply_t(X)


@pytest.mark.parametrize("K", [1, 2, 3, 6])
def test_recurrences_cost_one_spmm_per_order(K):
    ei, w, _ = random_graph(seed=9)
    src, dst = ei
    op = CountingOperator(src, dst, w, N, N)
    z = torch.randn(1, N, K, 4, dtype=D)
    x = torch.randn(1, N, 4, dtype=D)
    for b, n_spmm in ((ChebyshevBasis(op, K), K - 1), (PowerBasis(op, range(K)), K - 1)):
        for fn, arg in ((b.propagate, x), (b.propagate_sum, z)):
            CountingOperator.calls = 0
            fn(arg)
            assert CountingOperator.calls == n_spmm
    CountingOperator.calls = 0
    PowerBasis(op, (K,)).propagate_sum(z[:, :, :1])
    assert CountingOperator.calls == K


@pytest.mark.parametrize("ctor", ["gcn", "cheb", "diff", "sgc", "rel"])
def test_planner_applies_theta_first_when_q_below_p(ctor):
    g = torch.Generator().manual_seed(0)
    n, E = 3000, 12000
    ei = torch.randint(0, n, (2, E), generator=g)
    et = torch.randint(0, 4, (E,), generator=g)
    b = {"gcn": lambda: sc.basis.gcn(ei, n), "cheb": lambda: sc.basis.chebyshev(ei, n, 3),
         "diff": lambda: sc.basis.diffusion(ei, n, 3), "sgc": lambda: sc.basis.sgc(ei, n, 2),
         "rel": lambda: sc.basis.relational(ei, et, n, identity=True)}[ctor]()
    assert sc.plan((1, n, 500), b, (b.K, 500, 16)).route == "input_param"
    assert sc.plan((1, n, 16), b, (b.K, 16, 500)).route == "basis_input"


def _relabel(ei, perm):
    return perm[ei]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 9), E=st.integers(0, 20),
       kind=st.sampled_from(["gcn", "cheb", "diff", "rel", "sgc"]))
def test_permutation_equivariance(seed, n, E, kind):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, E), generator=g)
    w = torch.rand(E, generator=g, dtype=D) + 0.1
    et = torch.randint(0, 2, (E,), generator=g)
    perm = torch.randperm(n, generator=g)  # node i becomes node perm[i]

    def build(ei):
        if kind == "gcn":
            return sc.basis.gcn(ei, n, w)
        if kind == "cheb":
            return sc.basis.chebyshev(ei, n, 3, w)
        if kind == "diff":
            return sc.basis.diffusion(ei, n, 2, w, "rw")
        if kind == "sgc":
            return sc.basis.sgc(ei, n, 2, w)
        return sc.basis.relational(ei, et, n, [(0,), (1, 0)], edge_weight=w, identity=True,
                                   num_relations=2)

    b, bp = build(ei), build(perm[ei])
    x = torch.randn(n, 3, generator=g, dtype=D)
    theta = torch.randn(b.K, 3, 2, generator=g, dtype=D)
    xp = torch.empty_like(x)
    xp[perm] = x
    y, yp = sc.convolve(x, b, theta), sc.convolve(xp, bp, theta)
    torch.testing.assert_close(yp[perm], y)


# -- cache -----------------------------------------------------------------------------------
def test_cache_reuses_only_the_same_graph():
    graph.clear_graph_cache()
    ei, w, _ = random_graph(seed=10)
    b1 = sc.basis.gcn(ei, N, w, cache=True)
    assert sc.basis.gcn(ei, N, w, cache=True) is b1
    assert graph.graph_cache_info()["hits"] == 1
    # same content, another tensor: built anew (keyed on identity), equal values
    b2 = sc.basis.gcn(ei.clone(), N, w, cache=True)
    assert b2 is not b1
    # other options never share
    assert sc.basis.gcn(ei, N, w, improved=True, cache=True) is not b1
    assert sc.basis.gcn(ei, N, None, cache=True) is not b1
    # an in-place edit of the graph invalidates
    dense_before = b1.to_dense()
    ei[1, 0] = (ei[1, 0] + 1) % (N - 2)
    b3 = sc.basis.gcn(ei, N, w, cache=True)
    assert b3 is not b1
    torch.testing.assert_close(b3.to_dense()[0], dense_gcn(ei, w, N))
    assert not torch.equal(b3.to_dense(), dense_before)
    w.mul_(2)
    assert sc.basis.gcn(ei, N, w, cache=True) is not b3


def test_cache_forgets_dead_graphs_and_grad_weights():
    graph.clear_graph_cache()
    ei, w, _ = random_graph(seed=11)
    sc.basis.gcn(ei, N, w, cache=True)
    assert graph.graph_cache_info()["entries"] == 1
    del ei
    gc.collect()
    assert graph.graph_cache_info()["entries"] == 0
    ei, w, _ = random_graph(seed=11)
    wg = w.clone().requires_grad_()
    assert sc.basis.gcn(ei, N, wg, cache=True) is not sc.basis.gcn(ei, N, wg, cache=True)
    assert graph.graph_cache_info()["entries"] == 0


# -- errors ----------------------------------------------------------------------------------
def test_bad_inputs():
    ei, w, et = random_graph()
    with pytest.raises(ValueError, match=r"source ids must lie in \[0, 4\]"):
        sc.basis.gcn(ei, 5)
    with pytest.raises(ValueError, match="source ids"):
        sc.basis.gcn(torch.tensor([[-1], [0]]), 3)
    with pytest.raises(ValueError, match=r"\(2, E\)"):
        sc.basis.gcn(ei[:1], N)
    with pytest.raises(TypeError, match="integer"):
        sc.basis.gcn(ei.double(), N)
    with pytest.raises(ValueError, match=r"edge_weight must be \(36,\)"):
        sc.basis.gcn(ei, N, w[:-1])
    with pytest.raises(ValueError, match="num_nodes"):
        sc.basis.gcn(ei, 0)
    with pytest.raises(ValueError, match="K must be an int >= 1"):
        sc.basis.chebyshev(ei, N, 0)
    with pytest.raises(ValueError, match="K must be an int >= 1"):
        sc.basis.sgc(ei, N, 0)
    with pytest.raises(ValueError, match="K must be an int >= 0"):
        sc.basis.diffusion(ei, N, -1)
    with pytest.raises(ValueError, match="unknown Chebyshev normalization 'lap'"):
        sc.basis.chebyshev(ei, N, 2, normalization="lap")
    with pytest.raises(ValueError, match="unknown diffusion normalization"):
        sc.basis.diffusion(ei, N, 2, normalization="mean")
    with pytest.raises(ValueError, match="unknown relational normalization"):
        sc.basis.relational(ei, et, N, normalization="rw")
    with pytest.raises(ValueError, match="edge_type must be"):
        sc.basis.relational(ei, et[:-1], N)
    with pytest.raises(ValueError, match="relation ids"):
        sc.basis.relational(ei, et, N, sorts=[(0,), ()])
    with pytest.raises(ValueError, match="num_relations=2"):
        sc.basis.relational(ei, et, N, num_relations=2)
    with pytest.raises(ValueError, match="needs M == N"):
        sc.basis.relational(ei, et, (N, N + 1), sorts=[(0, 1)])
    with pytest.raises(ValueError, match="one per graph"):
        sc.basis.chebyshev(ei, N, 2, lambda_max=torch.tensor([2.0, 3.0]))
    with pytest.raises(ValueError, match="powers"):
        PowerBasis(SparseOperator(ei[0], ei[1], w, N, N), (2, 1))
    assert isinstance(sc.basis.relational(ei, et, N), RelationalBasis)


# -- the graph family's public edge forms, and defects fixed with them (issue 23, issue 25) -----
@pytest.mark.parametrize("kind", ["cheb", "sgc", "diffusion"])
def test_basis_param_route_keeps_float64_accuracy(kind):
    """A float32-built polynomial basis runs its dense form in the call's dtype: the
    basis_param route agrees with the others to float64 rounding (it was 1e-8)."""
    import structconv as sc
    g = torch.Generator().manual_seed(3)
    ei = torch.randint(0, 30, (2, 120), generator=g)
    b = {"cheb": lambda: sc.basis.chebyshev(ei, 30, 5), "sgc": lambda: sc.basis.sgc(ei, 30, 3),
         "diffusion": lambda: sc.basis.diffusion(ei, 30, 4)}[kind]()
    assert b.dtype == torch.float32
    x = torch.randn(2, 30, 4, dtype=torch.float64, generator=g)
    th = torch.randn(b.K, 4, 3, dtype=torch.float64, generator=g)
    ref = sc.convolve(x, b, th, route="input_param")
    for route in ("basis_input", "basis_param"):
        y = sc.convolve(x, b, th, route=route)
        assert float((y - ref).abs().max() / ref.abs().max()) < 1e-13, route


def test_relational_sort_naming_a_missing_relation_is_an_error():
    """sorts=[(0,), (99,)] on a graph of 3 relations was an all-zero matrix, silently."""
    import structconv as sc
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    et = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"relation ids in \[0, 2\].*num_relations="):
        sc.basis.relational(ei, et, 3, sorts=[(0,), (99,)])
    # a relation without edges is fine when the caller says how many there are
    b = sc.basis.relational(ei, et, 3, sorts=[(0,), (4,)], num_relations=5)
    assert b.to_dense()[1].abs().sum() == 0


def test_edge_forms_name_their_self_loop_entries():
    """gcn_norm / laplacian give a value per input edge (zero on a replaced self loop) and the
    diagonal per node, and their COO entries build the same operator as the basis."""
    from structconv.basis import edges as E
    from structconv.basis.graph import chebyshev, gcn
    ei = torch.tensor([[0, 1, 1, 2, 3], [1, 0, 1, 3, 2]])  # (1, 1) is a loop; node 4 isolated
    w = torch.tensor([1.0, 2.0, 5.0, 0.5, 1.5], dtype=torch.float64)
    f = E.gcn_norm(ei, 5, w)
    assert f.keep.tolist() == [True, True, False, True, True]
    assert f.value[2] == 0 and f.diag.shape == (5,)
    # node 1 keeps its existing loop's weight 5 (PyG's add_remaining_self_loops)
    deg1 = 1.0 + 5.0
    assert torch.isclose(f.diag[1], torch.tensor(5.0 / deg1, dtype=torch.float64))
    src, dst, v = f.coo()
    dense = torch.zeros(5, 5, dtype=torch.float64).index_put_((src, dst), v, accumulate=True)
    assert torch.allclose(dense, gcn(ei, 5, w).to_dense()[0])
    lap = E.laplacian(ei, 5, w)
    src, dst, v = lap.coo()
    dense = torch.zeros(5, 5, dtype=torch.float64).index_put_((src, dst), v, accumulate=True)
    assert torch.allclose(dense, chebyshev(ei, 5, 2, w).to_dense()[1])
    assert lap.value[2] == 0 and not lap.keep[2]

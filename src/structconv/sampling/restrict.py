"""Restriction of graph bases to sampled node sets: one bipartite basis per layer.

A graph basis is a polynomial in one sparse operator S (n, n) (GCN: S; SGC: S^K; TAG: S^0..S^K;
Chebyshev: T_k(L̂)) or a family of relation operators S_r (R-GCN, random-walk sorts). Its
*restriction* to a sample with nested node sets U_0 ⊆ U_1 ⊆ ... (seeds first, see
``sampler.Sample``) keeps, for each hop h, the bipartite operator R_h = S[U_h, U_{h-1}] over the
sampled edges (plus S's diagonal on U_{h-1}: GCN's self loops, the Laplacian's diagonal), and
applies the polynomial by the same recurrence as the full basis but on shrinking sets: input on
U_H, output on U_0. A k-hop term needs k hops, so one K-hop layer consumes K hops of the sample.
When every node's sampled edges are all its incoming edges (fanout "all"), a restricted layer's
output on its targets equals the full layer's on them.

The operator's values are the full graph's: GCN's symmetric normalisation, the Laplacian's
degrees and lambda_max, R-GCN's per-relation means are computed once over the whole graph and
gathered by edge id (``degrees="full"``), not recomputed from the sample, unless
``degrees="sample"`` asks for the normalisation of the sampled subgraph (PyG's behaviour, which
applies the layer to the sampled subgraph as if it were the graph).

Because the per-hop blocks of a ``Sample`` are nested (hop h's block restricted to U_{h-2} is hop
h-1's block), every way of evaluating the polynomial (recurrence from the input side, Horner or
Clenshaw from the output side, per head) gives the same restricted basis.

On CPU with ``degrees="full"`` the compiled kernel (``kernels/sampler.cpp``: ``restrict``) builds
the sample's operator in one pass: a coalesced CSR over every target row per relation, values
gathered by edge id, the diagonal added; each hop's operator is a row prefix of it (the blocks
are nested), built once per sample and restriction and handed to the sparse product ready made.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from ..basis import graph as G
from ..basis.base import Basis
from ..basis.edges import (
    EdgeForm,
    check_edge_type,
    check_edges,
    check_K,
    check_norm,
    check_num_nodes,
    check_sorts,
    gcn_norm,
    graph_hops,
    infer_num_relations,
    laplacian,
    relation_values,
    value_dtype,
)
from ..basis.graph import OperatorBasis, SparseOperator
from ..basis.layout import cols, heads, uncols, uncols_heads
from .sampler import Block, Sample

__all__ = ["GraphRestriction", "BlockRestriction", "RestrictedPower", "RestrictedChebyshev",
           "RestrictedRelational", "KINDS"]


def _defaults(build, names: Sequence[str]) -> dict:
    """The options ``names`` of a ``sc.basis`` constructor with its own defaults (None for a
    required one): a restriction takes the options the full basis takes, defaulted alike."""
    params = inspect.signature(build).parameters
    return {n: None if params[n].default is inspect.Parameter.empty else params[n].default
            for n in names}


KINDS = {
    "gcn": _defaults(G.gcn, ("add_self_loops", "normalize", "improved")),
    "sgc": _defaults(G.sgc, ("K", "add_self_loops")),
    "chebyshev": _defaults(G.chebyshev, ("K", "normalization", "lambda_max", "batch")),
    "diffusion": _defaults(G.diffusion, ("K", "normalization")),
    "relational": _defaults(G.relational, ("sorts", "normalization", "identity",
                                           "num_relations")),
}
"""The graph basis kinds that can be restricted, with their options and defaults: those of the
``sc.basis`` constructor of the same name."""
_DEGREES = ("full", "sample")


# ------------------------------------------------------------------------------------------------
# restricted bases
def _check_chain(ops: Sequence[SparseOperator], sizes: Sequence[int], H: int, what: str):
    if len(ops) < H or len(sizes) < H + 1:
        raise ValueError(f"{what} needs {H} hop operators and {H + 1} set sizes, got "
                         f"{len(ops)} and {len(sizes)}")
    for h in range(H):
        if (ops[h].M, ops[h].N) != (sizes[h + 1], sizes[h]):
            raise ValueError(f"{what}: hop operator {h} must map U_{h + 1} -> U_{h} "
                             f"(M, N)=({sizes[h + 1]}, {sizes[h]}), got ({ops[h].M}, "
                             f"{ops[h].N})")


class _Restricted(OperatorBasis):
    """Common part: hop operators ``ops[h]`` U_{h+1} -> U_h (inner first), ``sizes`` |U_h|."""

    def __init__(self, K: int, ops: Sequence[SparseOperator], sizes: Sequence[int], H: int,
                 M: int | None = None):
        _check_chain(ops, sizes, H, type(self).__name__)
        self.ops, self.sizes, self.hops = list(ops[:H]), [int(s) for s in sizes[:H + 1]], H
        M = self.sizes[H] if M is None else int(M)
        if M < self.sizes[H]:
            raise ValueError(f"{type(self).__name__}: M={M} is smaller than the input set "
                             f"|U_{H}|={self.sizes[H]}")
        super().__init__(K, M, self.sizes[0])

    def _nnz(self) -> int:
        return sum(max(op.nnz, 1) for op in self.ops)

    def apply_flops(self):
        return float(self._nnz() + self.K * self.N)


class RestrictedPower(_Restricted):
    """A_k = S^{powers[k]} restricted: (K, |U_H| or M, |U_0|) with H = max(powers).

    ``A_kᵀ x = R_1ᵀ ... R_pᵀ x[U_p]`` for p = powers[k]; ``ops[h]`` is R_{h+1} (U_{h+1} -> U_h).
    Rows of x beyond |U_p| are not read (``M`` may exceed |U_H|: a relational walk shorter than
    its layer).
    """

    def __init__(self, ops: Sequence[SparseOperator], sizes: Sequence[int],
                 powers: Sequence[int], M: int | None = None):
        powers = tuple(int(p) for p in powers)
        if not powers or any(p < 0 for p in powers) or list(powers) != sorted(set(powers)):
            raise ValueError(f"powers must be distinct non-negative ints in increasing order, "
                             f"got {powers}")
        super().__init__(len(powers), ops, sizes, powers[-1], M)
        self.powers = powers
        self._pos = {p: k for k, p in enumerate(powers)}

    def __repr__(self):
        return f"RestrictedPower(powers={self.powers}, sizes={self.sizes}, M={self.M})"

    def propagate(self, x):
        # from the input side, all powers share the recurrence: after s steps the iterate is
        # S^s x on U_{H-s}, whose first |U_0| rows are the output (blocks are nested)
        B, H, n0 = x.shape[0], self.hops, self.sizes[0]
        cur = cols(x)[:self.sizes[H]]
        outs = [cur[:n0]] if 0 in self._pos else []
        for s in range(1, H + 1):
            cur = self.ops[H - s].apply_t(cur)
            if s in self._pos:
                outs.append(cur[:n0])
        return uncols_heads(outs, B)

    def propagate_sum(self, z):
        # Horner from the input side: acc on U_h, z_p read on U_p
        B, zs, acc = z.shape[0], heads(z), None
        for h in range(self.hops, 0, -1):
            if h in self._pos:
                zp = zs[self._pos[h]][:self.sizes[h]]
                acc = zp if acc is None else acc + zp
            if acc is not None:
                acc = self.ops[h - 1].apply_t(acc)
        if 0 in self._pos:
            z0 = zs[0][:self.sizes[0]]
            acc = z0.clone() if acc is None else acc + z0
        return uncols(acc, B)

    def propagate_heads(self, z):
        # heads enter at their own hop and step inwards together (one SpMM per hop)
        B, zs = z.shape[0], heads(z)
        cur: dict[int, Tensor] = {}
        for h in range(self.hops, 0, -1):
            for k, p in enumerate(self.powers):
                if p == h:
                    cur[k] = zs[k][:self.sizes[h]]
            act = sorted(cur)
            out = self.ops[h - 1].apply_t(torch.cat([cur[k] for k in act], 1))
            for k, blk in zip(act, out.split([cur[k].shape[1] for k in act], 1)):
                cur[k] = blk
        if 0 in self._pos:
            cur[0] = zs[0][:self.sizes[0]]
        return uncols_heads([cur[k] for k in range(self.K)], B)


class RestrictedChebyshev(_Restricted):
    """A_k = T_k(L̂), k < K, restricted: (K, |U_{K-1}|, |U_0|); ``ops[h]`` L̂ on U_{h+1} -> U_h."""

    def __init__(self, ops: Sequence[SparseOperator], sizes: Sequence[int], K: int):
        K = check_K(K)
        super().__init__(K, ops, sizes, K - 1)

    def __repr__(self):
        return f"RestrictedChebyshev(K={self.K}, sizes={self.sizes})"

    def propagate(self, x):
        # T_k x on U_{H-k}: X_k = 2 L̂ᵀ X_{k-1} - X_{k-2}, each iterate one hop further in
        B, H, n0 = x.shape[0], self.hops, self.sizes[0]
        X = [cols(x)[:self.sizes[H]]]
        for k in range(1, self.K):
            y = self.ops[H - k].apply_t(X[-1])
            X.append(y if k == 1 else 2.0 * y - X[-2][:self.sizes[H - k]])
        return uncols_heads([t[:n0] for t in X], B)

    def propagate_sum(self, z):
        # Clenshaw from the input side: b_k on U_k; b_k = z_k + 2 L̂ᵀ b_{k+1} - b_{k+2}
        B, K, zs, s = z.shape[0], self.K, heads(z), self.sizes
        if K == 1:
            return uncols(zs[0][:s[0]].clone(), B)
        b1, b2 = zs[K - 1][:s[K - 1]], None
        for k in range(K - 2, 0, -1):
            t = 2.0 * self.ops[k].apply_t(b1) + zs[k][:s[k]]
            if b2 is not None:
                t = t - b2[:s[k]]
            b1, b2 = t, b1
        y = self.ops[0].apply_t(b1) + zs[0][:s[0]]
        if b2 is not None:
            y = y - b2[:s[0]]
        return uncols(y, B)

    def propagate_heads(self, z):
        # head k starts at hop k; all heads step inwards together (one SpMM per hop).
        # state per head: (current iterate, previous iterate) of its own recurrence
        B, zs, s = z.shape[0], heads(z), self.sizes
        cur: dict[int, tuple[Tensor, Tensor | None]] = {}
        for h in range(self.hops, 0, -1):
            if h < self.K:
                cur[h] = (zs[h][:s[h]], None)
            act = sorted(cur)
            out = self.ops[h - 1].apply_t(torch.cat([cur[k][0] for k in act], 1))
            for k, y in zip(act, out.split([cur[k][0].shape[1] for k in act], 1)):
                prev = cur[k][0]
                cur[k] = (y, prev) if cur[k][1] is None else \
                    (2.0 * y - cur[k][1][:s[h - 1]], prev)
        out = [zs[0][:s[0]]] + [cur[k][0] for k in range(1, self.K)]
        return uncols_heads(out, B)


class RestrictedRelational(Basis):
    """Random-walk sorts restricted: K = len(sorts) + identity, (K, |U_H|, |U_0|), H the longest
    sort. ``ops[h][r]`` is relation r's operator U_{h+1} -> U_h; a sort (r1, ..., rL) walks r1
    first (on U_L) and rL last (into U_0). The identity is the embedding of U_0 in U_H (targets
    first); identity and 1-sorts form one flat sparse basis, as in ``RelationalBasis``.
    """

    cost_kernel = "graph"

    def __init__(self, ops: Sequence[dict[int, SparseOperator]], sizes: Sequence[int],
                 sorts: Sequence[tuple[int, ...]], identity: bool):
        self.sorts = [tuple(s) for s in sorts]
        self.identity = bool(identity)
        if not self.sorts and not self.identity:
            raise ValueError("RestrictedRelational needs at least one sort or identity=True")
        H = max((len(s) for s in self.sorts), default=0)
        if len(ops) < H or len(sizes) < H + 1:
            raise ValueError(f"RestrictedRelational with sorts up to length {H} needs {H} hops "
                             f"of operators and {H + 1} sizes, got {len(ops)} and {len(sizes)}")
        sizes = [int(v) for v in sizes[:H + 1]]
        M, N = sizes[H], sizes[0]
        super().__init__(len(self.sorts) + int(self.identity), M, N)
        self.sizes, self.hops = sizes, H
        anyop = next((o for hop in ops for o in hop.values()), None)
        dev = anyop.device if anyop is not None else torch.device("cpu")
        dtype = anyop.dtype if anyop is not None else torch.get_default_dtype()
        # the targets are the first N sources: the identity sits on them
        self._flat, flat_k, longer = G.stack_single_sorts(
            self.sorts, lambda r: ops[0][r], self.identity, N, M, N, dev, dtype)
        self._flat_k = flat_k
        # each longer sort: a chain of restricted one-hop operators, inner first: rL ... r1
        self._walks = [(k, RestrictedPower([ops[h][s[len(s) - 1 - h]] for h in range(len(s))],
                                           sizes, (len(s),), M=M)) for k, s in longer]
        self._flat_is_all = flat_k == list(range(self.K))

    def __repr__(self):
        return (f"RestrictedRelational(K={self.K}, sorts={self.sorts}, identity="
                f"{self.identity}, sizes={self.sizes})")

    def apply_flops(self):
        flat = self._flat.nnz if self._flat is not None else 0
        return float(max(flat + sum(w.apply_flops() for _, w in self._walks), 1))

    def to_dense(self):
        eye = torch.eye(self.M, dtype=self.dtype, device=self.device).unsqueeze(0)
        return self.propagate(eye)[0].permute(1, 2, 0).contiguous()

    def _assemble(self, flat: Tensor | None, walks: list[Tensor]) -> Tensor:
        parts = {}
        if flat is not None:
            for j, k in enumerate(self._flat_k):
                parts[k] = flat[:, :, j:j + 1]
        for (k, _), w in zip(self._walks, walks):
            parts[k] = w
        return torch.cat([parts[k] for k in range(self.K)], 2)

    def propagate(self, x):
        if self._flat_is_all:
            return self._flat.propagate(x)
        flat = self._flat.propagate(x) if self._flat is not None else None
        return self._assemble(flat, [w.propagate(x) for _, w in self._walks])

    def propagate_sum(self, z):
        if self._flat_is_all:
            return self._flat.propagate_sum(z)
        y = None if self._flat is None else self._flat.propagate_sum(z[:, :, self._flat_k])
        for k, w in self._walks:
            t = w.propagate_sum(z[:, :, k:k + 1])
            y = t if y is None else y + t
        return y

    def propagate_heads(self, z):
        if self._flat_is_all:
            return self._flat.propagate_heads(z)
        flat = None if self._flat is None else self._flat.propagate_heads(z[:, :, self._flat_k])
        return self._assemble(flat, [w.propagate_heads(z[:, :, k:k + 1])
                                     for k, w in self._walks])


# ------------------------------------------------------------------------------------------------
def _edge_form(kind: str, edge_index: Tensor, n: int, w: Tensor | None, et: Tensor | None,
               opts: dict, dtype) -> EdgeForm:
    """The one-hop operator of ``kind`` on a graph of n nodes in edge form (values per input
    edge, the diagonal per node), by the full basis's own normalisation, so that a restricted
    layer's values agree with the full layer's. Relational: each relation normalised alone."""
    if kind in ("gcn", "sgc"):
        return gcn_norm(edge_index, n, w, add_self_loops=opts["add_self_loops"],
                        normalize=opts.get("normalize", True),
                        improved=opts.get("improved", False), dtype=dtype)
    if kind == "chebyshev":
        return laplacian(edge_index, n, w, normalization=opts["normalization"],
                         lambda_max=opts["lambda_max"], batch=opts["batch"], dtype=dtype)
    if kind == "diffusion":
        return G.diffusion_form(edge_index, n, w, opts["normalization"], dtype)
    src, dst = edge_index[0].long(), edge_index[1].long()
    w = w if w is not None else torch.ones(src.shape[0], dtype=value_dtype(None, dtype),
                                           device=src.device)
    value = torch.zeros(src.shape[0], dtype=w.dtype, device=w.device)
    for r in sorted({r for s in opts["sorts"] for r in s}):  # a loop over relations, not edges
        m = et == r
        value[m] = relation_values(src[m], dst[m], w[m], n, n, opts["normalization"])
    return EdgeForm(src, dst, value, None, None, n)


def _prefix_op(csr: list, N: int, M: int, hand: bool) -> SparseOperator:
    """The operator U_h -> U_{h-1} (M sources, N targets) of the first N rows of a sample's
    compiled CSR (crow, row, col, value), its CSR handed to the sparse product's cache when
    ``hand`` (not in a loader worker: the batch is pickled, and the product builds it there)."""
    crow, row, col, val = csr
    k = int(crow[N])
    op = SparseOperator(col[:k], row[:k], val[:k], M, N)
    if not hand:
        return op
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch flags CSR as beta; SpMM is stable
        t = torch.sparse_csr_tensor(crow[:N + 1], col[:k], val[:k], (N, M),
                                    check_invariants=False)
    op.t._csr[(val.dtype, val.device, False)] = t  # what SparseMatrix.csr would build
    return op


class GraphRestriction:
    """A graph basis kind over a full graph, ready to be restricted to samples.

    ``kind`` is one of ``KINDS`` (gcn, sgc, chebyshev, diffusion, relational) with the options
    of the matching ``sc.basis`` constructor (and its defaults); ``edge_type`` (E,) for
    relational. The full graph's operator values are computed once here
    (``degrees="full"``); with ``degrees="sample"`` they are recomputed on each sampled
    subgraph. ``hops`` is the number of sample hops one restricted basis consumes. Edge
    weights are constants here (detached): the values are computed once, not on every call
    as a full-batch layer does.
    """

    #: the compiled restriction on CPU (None: where it can be built; False: torch ops)
    native: bool | None = None

    def __init__(self, kind: str, edge_index: Tensor, num_nodes: int, *,
                 edge_weight: Tensor | None = None, edge_type: Tensor | None = None,
                 degrees: str = "full", dtype: torch.dtype | None = None, **options):
        if kind not in KINDS:
            raise ValueError(f"unknown graph basis kind {kind!r}: use one of {list(KINDS)}")
        unknown = sorted(set(options) - set(KINDS[kind]))
        if unknown:
            raise TypeError(f"{kind} restriction got unknown options {unknown}: it takes "
                            f"{sorted(KINDS[kind])}")
        if degrees not in _DEGREES:
            raise ValueError(f"degrees must be one of {list(_DEGREES)}, got {degrees!r}")
        n = check_num_nodes(num_nodes)
        check_edges(edge_index, n, edge_weight=edge_weight)
        self.kind, self.num_nodes, self.degrees, self.dtype = kind, n, degrees, dtype
        self.edge_weight = None if edge_weight is None else edge_weight.detach()
        self.edge_type = edge_type.long() if kind == "relational" and edge_type is not None \
            else None
        self.options = self._checked({**KINDS[kind], **options}, edge_index, edge_type, n)
        o = self.options
        self.hops = graph_hops(kind, o.get("K"), o.get("sorts"))
        self._full = None
        if degrees == "full":
            self._full = _edge_form(kind, edge_index, n, self.edge_weight, self.edge_type, o,
                                    dtype)

    def _checked(self, opts: dict, edge_index: Tensor, edge_type, n: int) -> dict:
        """The options with the full basis constructor's checks (K, normalisation, sorts)."""
        kind = self.kind
        if kind in ("sgc", "chebyshev", "diffusion"):
            if opts["K"] is None:
                raise TypeError(f"{kind} restriction needs the option K")
            opts["K"] = check_K(opts["K"], low=0 if kind == "diffusion" else 1)
        if kind in ("chebyshev", "diffusion"):
            check_norm(opts["normalization"], (None, "sym", "rw"), kind)
        if kind == "relational":
            if edge_type is None:
                raise ValueError("the relational restriction needs edge_type (E,)")
            check_edge_type(edge_type, edge_index.shape[1])
            check_norm(opts["normalization"], (None, "mean", "sym"), "relational")
            R = infer_num_relations(edge_type, opts["num_relations"])
            opts["sorts"] = check_sorts(opts["sorts"], R, opts["identity"], n, n)
            opts["num_relations"] = R
        return opts

    def __repr__(self):
        return f"GraphRestriction({self.kind!r}, hops={self.hops}, degrees={self.degrees!r})"

    def _form(self, sample: Sample) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """(value, keep, diag, rel) aligned with the sample's edges and nodes."""
        rel = None if self.edge_type is None else self.edge_type[sample.edge_ids]
        if self._full is not None:
            f, e, v = self._full, sample.edge_ids, sample.node_ids
            return (f.value[e], None if f.keep is None else f.keep[e],
                    None if f.diag is None else f.diag[v], rel)
        # the sampled subgraph as a graph of its own (every sampled node and edge)
        opts = dict(self.options)
        if self.kind == "chebyshev" and opts["batch"] is not None:
            opts["batch"] = opts["batch"][sample.node_ids]
        w = None if self.edge_weight is None else self.edge_weight[sample.edge_ids]
        f = _edge_form(self.kind, sample.edge_index, sample.node_counts[-1], w, rel, opts,
                       self.dtype)
        return f.value, f.keep, f.diag, rel

    def _hop_ops(self, sample: Sample, hop: int, value, keep, diag, rel) -> list:
        """Per hop of this layer (inner first) the operator U_{h+1} -> U_h: a SparseOperator,
        or for relational a dict relation -> SparseOperator."""
        ops = []
        nc, ei = sample.node_counts, sample.edge_index
        rels = sorted({r for s in self.options.get("sorts") or () for r in s})
        for j in range(self.hops):
            h = hop + j + 1  # the sample's hop h block: U_h -> U_{h-1}
            e = sample.edge_counts[h - 1]
            src, dst, v = ei[0, :e], ei[1, :e], value[:e]
            if keep is not None:
                k = keep[:e]
                src, dst, v = src[k], dst[k], v[k]
            if rel is not None:
                r_e = rel[:e] if keep is None else rel[:e][keep[:e]]
                ops.append({r: SparseOperator(src[r_e == r], dst[r_e == r], v[r_e == r],
                                              nc[h], nc[h - 1]) for r in rels})
                continue
            if diag is not None:
                loop = torch.arange(nc[h - 1], device=src.device)
                src, dst = torch.cat([src, loop]), torch.cat([dst, loop])
                v = torch.cat([v, diag[:nc[h - 1]]])
            ops.append(SparseOperator(src, dst, v, nc[h], nc[h - 1]))
        return ops

    def _compiled(self, sample: Sample):
        """The compiled module where this restriction can use it on ``sample``, else None."""
        f = self._full
        if self.native is False or f is None or self.hops == 0 or \
                f.value.dtype not in (torch.float32, torch.float64) or \
                sample.edge_index.device.type != "cpu" or f.value.device.type != "cpu":
            return None
        from ..kernels import native

        return native.sampler()

    def _native_csr(self, sample: Sample, ext) -> list:
        """Per relation (one for the other kinds) the sample's (crow, row, col, value) over all
        its target rows, built once per sample."""
        got = sample.cache.get(self)
        if got is not None:
            return got
        f, none = self._full, torch.empty(0)
        rels = sorted({r for s in self.options.get("sorts") or () for r in s})
        group = gmap = none
        if self.edge_type is not None:
            group = self.edge_type
            gmap = torch.full((self.options["num_relations"],), -1, dtype=torch.long)
            gmap[torch.tensor(rels, dtype=torch.long)] = torch.arange(len(rels))
        out = ext.restrict(sample.edge_index, sample.edge_ids, sample.node_ids,
                           sample.node_counts[-2], f.value.detach(),
                           none if f.keep is None else f.keep, group, gmap,
                           max(len(rels), 1) if self.edge_type is not None else 1,
                           none if f.diag is None else f.diag.detach())
        got = sample.cache[self] = [out[i:i + 4] for i in range(0, len(out), 4)]
        return got

    def _native_ops(self, sample: Sample, hop: int, ext) -> list:
        """``_hop_ops`` from the compiled CSR: each hop's operator a row prefix of it."""
        csr, nc = self._native_csr(sample, ext), sample.node_counts
        rels = sorted({r for s in self.options.get("sorts") or () for r in s})
        hand = torch.utils.data.get_worker_info() is None
        ops = []
        for j in range(self.hops):  # O(1) work a hop: views of the one CSR
            N, M = nc[hop + j], nc[hop + j + 1]
            made = [_prefix_op(c, N, M, hand) for c in csr]
            ops.append(dict(zip(rels, made)) if self.edge_type is not None else made[0])
        return ops

    def restrict(self, sample: Sample, hop: int = 0) -> Basis:
        """The restricted basis of this kind with outputs on U_hop and inputs on U_{hop+hops}:
        (K, node_counts[hop + hops], node_counts[hop])."""
        if not 0 <= hop <= sample.num_hops - self.hops:
            raise ValueError(f"a {self.kind} restriction consumes {self.hops} hops: from hop "
                             f"{hop} it needs a sample of at least {hop + self.hops} hops, got "
                             f"{sample.num_hops}")
        ext = self._compiled(sample)
        ops = self._native_ops(sample, hop, ext) if ext is not None else \
            self._hop_ops(sample, hop, *self._form(sample))
        sizes = sample.node_counts[hop:hop + self.hops + 1]
        o = self.options
        if self.kind == "gcn":
            return RestrictedPower(ops, sizes, (1,))
        if self.kind == "sgc":
            return RestrictedPower(ops, sizes, (o["K"],))
        if self.kind == "diffusion":
            return RestrictedPower(ops, sizes, tuple(range(o["K"] + 1)))
        if self.kind == "chebyshev":
            return RestrictedChebyshev(ops, sizes, o["K"])
        return RestrictedRelational(ops, sizes, o["sorts"], o["identity"])


class BlockRestriction:
    """Content-based layers (graph attention): only the edge set is restricted, one hop.

    ``restrict(sample, hop)`` is the ``Block`` of hop ``hop + 1`` (edges into U_hop)."""

    hops = 1

    def restrict(self, sample: Sample, hop: int = 0) -> Block:
        if not 0 <= hop < sample.num_hops:
            raise ValueError(f"an attention block consumes 1 hop: from hop {hop} it needs a "
                             f"sample of at least {hop + 1} hops, got {sample.num_hops}")
        return sample.block(hop + 1)

    def __repr__(self):
        return "BlockRestriction(hops=1)"

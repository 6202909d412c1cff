"""The Heterogeneous Graph Transformer (Hu et al., WWW 2020) with PyG's signature: ``HGTConv``.

Per node type t: keys, queries, values k, q, v = x_t W_t (H heads of D = Q/H channels). Per
relation e = (s, rel, d) and head h, the keys and values of s's nodes are mapped by D x D
matrices K_{e,h}, V_{e,h}; every edge m -e-> n scores

    score = (q_n,h · k_m,h K_{e,h}) · p_{e,h} / sqrt(D)

and each target's scores are softmaxed over ALL its incoming edges, whatever their relation. The
attention is a basis on the typed graph: the relations' edges joined into one bipartite graph
from (relation, source) rows to the concatenated node sets (built once per graph: the graph
family's structure cache). The keys and values are mapped per (relation, source) row, not per
edge, by one segment product each (a relation's heads as one block-diagonal map, its priors
p_{e,h} folded into the keys' map). On CPU the scores, their softmax over each target's edges
and the weighted sum of values are values on the graph's CSR pattern: a sampled product, a
segment softmax and a sparse product, forward and backward, never an (edges, heads, D) tensor;
compiled graphs and other devices take the traceable path of ``HeadDot`` scores,
``edge_softmax`` and ``GraphAttention``, with the same numbers. Then gelu, a linear map per
type, and a gated skip sigmoid(s_t) y + (1 - sigmoid(s_t)) x_t where the widths agree. As PyG,
a node type that is the target of no relation in ``metadata`` is absent from the output, and
one that is, but receives no edge in this call, gets its value from zero messages (never
None).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..attention.basis import GraphAttention, GraphStructure
from ..attention.masks import edge_softmax
from ..attention.mechanisms import HeadDot
from ..basis.cache import cached
from ..basis.edges import as_edge_index
from .convert import register_pyg
from .pyg import PyGCompatible, is_lazy, lazy_parameter
from .typed import check_metadata, known_relations

__all__ = ["HGTConv"]


def _key(et) -> str:
    return "__".join(et)


def _uniform_(t: Tensor, fan: int) -> None:
    b = 1.0 / math.sqrt(fan)
    with torch.no_grad():
        t.uniform_(-b, b)


class _TypeWeights(nn.ParameterDict):
    """The per-type input maps; its repr reads no lazy (not yet sized) map's data, which
    torch's ParameterDict repr would, raising."""

    def extra_repr(self) -> str:
        return "\n".join(f"({k}): {'uninitialized' if is_lazy(p) else tuple(p.shape)}"
                         for k, p in self.items())


def _fused(q: Tensor) -> bool:
    """Whether the attention runs as sparse products on the graph's pattern (CPU float32 /
    float64, eager): torch's CSR kernels; else the traceable torch ops."""
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and \
        not torch.compiler.is_compiling()


def _csr(crow: Tensor, col: Tensor, values: Tensor, shape) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # CSR is flagged beta; its kernels are not
        return torch.sparse_csr_tensor(crow, col, values, shape)


class _Layout:
    """The K-head operator S (N*K, M*K) of a bipartite graph M -> N in CSR: row (n, k) holds
    head k of n's incoming edges (``GraphStructure``'s layout), and the same entries in the
    transpose's order; values live in S's CSR order throughout."""

    def __init__(self, edge_index: Tensor, M: int, N: int, K: int):
        st = GraphStructure(edge_index, M, N, K)
        # the operators with the entries' own (edge-major) positions as values: their layouts,
        # and where each CSR entry comes from
        ids = torch.arange(st.E * K, device=edge_index.device)
        S, St = st.csr(ids), st.csr(ids, transpose=True)
        self.crow, self.col, gather = S.crow_indices(), S.col_indices(), S.values()
        self.crow_t, self.col_t, gather_t = St.crow_indices(), St.col_indices(), St.values()
        inv = torch.empty_like(gather)
        inv[gather] = torch.arange(gather.shape[0], device=gather.device)
        self.perm_t = inv[gather_t]  # S^T's entries as positions in S's order
        self.row = torch.repeat_interleave(torch.arange(N * K, device=ids.device),
                                           self.crow.diff())  # each entry's row of S
        self.shape = (N * K, M * K)

    def sddmm(self, a: Tensor, b: Tensor, scale: float) -> Tensor:
        """scale · a[r] · b[c] on S's entries (r, c): (nnz,), from a (N*K, D), b (M*K, D)."""
        pattern = _csr(self.crow, self.col, a.new_zeros(self.col.shape[0]), self.shape)
        return torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0.0, alpha=scale).values()

    def mm(self, values: Tensor, z: Tensor) -> Tensor:
        """S(values) z: (N*K, C) from z (M*K, C)."""
        return _csr(self.crow, self.col, values, self.shape) @ z

    def mm_t(self, values: Tensor, g: Tensor) -> Tensor:
        """S(values)^T g: (M*K, C) from g (N*K, C)."""
        return _csr(self.crow_t, self.col_t, values[self.perm_t], self.shape[::-1]) @ g

    def softmax(self, s: Tensor) -> Tensor:
        """The softmax of S's entries over each row (a node's incoming edges, per head)."""
        mx = torch.segment_reduce(s, "max", offsets=self.crow, unsafe=True)
        e = (s - mx.index_select(0, self.row)).exp_()
        den = torch.segment_reduce(e, "sum", offsets=self.crow, unsafe=True)
        return e.div_(den.index_select(0, self.row))

    def softmax_backward(self, a: Tensor, ga: Tensor) -> Tensor:
        """The gradient of the scores from that of their row softmax a: a (ga - Σ_row a ga)."""
        dot = torch.segment_reduce(a * ga, "sum", offsets=self.crow, unsafe=True)
        return ga.sub_(dot.index_select(0, self.row)).mul_(a)


class _DotAttention(torch.autograd.Function):
    """out = S(alpha) v with alpha the row softmax of scale · q_r · k_c on S's pattern: q
    (N*K, D), k, v (M*K, D) -> (N*K, D); the scores, weights and their gradients are values
    on the pattern (sampled products and sparse products), never per-edge vectors."""

    @staticmethod
    def forward(ctx, q, k, v, lay: _Layout, scale: float):
        a = lay.softmax(lay.sddmm(q, k, scale))
        ctx.lay, ctx.scale = lay, scale
        ctx.save_for_backward(q, k, v, a)
        return lay.mm(a, v)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        q, k, v, a = ctx.saved_tensors
        lay, need = ctx.lay, ctx.needs_input_grad
        g = g.contiguous()
        gq = gk = gv = None
        if need[2]:
            gv = lay.mm_t(a, g)
        if need[0] or need[1]:
            ds = lay.softmax_backward(a, lay.sddmm(g, v, 1.0)).mul_(ctx.scale)
            gq = lay.mm(ds, k) if need[0] else None
            gk = lay.mm_t(ds, q) if need[1] else None
        return gq, gk, gv, None, None


class _Joined:
    """A call's relations joined into one bipartite graph: rows (relation, source node) ->
    the concatenated nodes. A source type's rows are its nodes times its relations, node-major
    (row base_s + m * R_s + i for node m and the type's i-th relation), so that one product of
    its keys (n_s, Q) by its relations' maps side by side (Q, R_s * Q) gives them in place.
    ``rels`` (relation ids, in the call's order), ``groups`` ((source type, positions in
    ``rels``) per source type), ``edge_index`` (2, E) rows -> nodes; ``layout()`` its CSR
    layouts, built on first use (eager)."""

    def __init__(self, given, offs: dict, K: int):
        self.rels, by_src = [], {}
        for r, et, ei in given:
            c, cd = offs[et[0]][1], offs[et[2]][1]
            ei = ei.long()
            if ei.numel() and not torch.compiler.is_compiling() and ei.device.type != "meta" \
                    and (int(ei.min()) < 0 or int(ei[0].max()) >= c or int(ei[1].max()) >= cd):
                raise ValueError(f"HGTConv: edge_index_dict[{et}] has node ids outside [0, {c})"
                                 f" x [0, {cd}) (sources < n_{et[0]}, targets < n_{et[2]})")
            by_src.setdefault(et[0], []).append((len(self.rels), et[2], ei))
            self.rels.append(r)
        self.groups, src, dst, M = [], [], [], 0
        for s, items in by_src.items():
            R = len(items)
            self.groups.append((s, [i for i, _, _ in items]))
            for pos, (_, d, ei) in enumerate(items):
                src.append(ei[0] * R + (M + pos))
                dst.append(ei[1] + offs[d][0])
            M += offs[s][1] * R
        self.M, self.N, self.K = M, sum(c for _, c in offs.values()), K
        self.E = sum(int(t.shape[0]) for t in src)
        self.edge_index = torch.stack([torch.cat(src), torch.cat(dst)]) if src else None
        self._layout = None

    def layout(self) -> _Layout:
        if self._layout is None:
            self._layout = _Layout(self.edge_index, self.M, self.N, self.K)
        return self._layout


class HGTConv(PyGCompatible):
    """PyG's HGTConv: x_dict {type: (n_t, P_t)}, edge_index_dict -> {target type: (n_t, Q)}.
    ``in_channels`` -1 (for all types or one in a dict) sizes that type's map on its first
    call; an edge type's graph is a (2, E) tensor, an ``EdgeIndex`` or a sparse ``adj_t``."""

    def __init__(self, in_channels, out_channels: int, metadata, heads: int = 1):
        super().__init__()
        self.node_types, self.edge_types = check_metadata(metadata)
        if isinstance(out_channels, bool) or not isinstance(out_channels, int) or \
                out_channels < 1 or isinstance(heads, bool) or not isinstance(heads, int) or \
                heads < 1 or out_channels % heads:
            raise ValueError(f"HGTConv: out_channels ({out_channels!r}) must be a positive int "
                             f"divisible by heads ({heads!r})")
        if not isinstance(in_channels, dict):
            in_channels = {t: in_channels for t in self.node_types}
        bad = {t: in_channels.get(t) for t in self.node_types
               if isinstance(in_channels.get(t), bool) or not isinstance(in_channels.get(t), int)
               or not (in_channels.get(t) >= 1 or in_channels.get(t) == -1)}
        if bad:
            raise ValueError(f"HGTConv: in_channels must be a positive int or -1 (lazy) per "
                             f"node type, got {bad}")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        #: each type's input width (None until a lazy type's first call); a plain dict
        self._widths = {t: None if in_channels[t] == -1 else in_channels[t]
                        for t in self.node_types}
        Q, D, R = out_channels, out_channels // heads, len(self.edge_types)
        self.dst_types = {e[2] for e in self.edge_types}
        self.kqv_weight = _TypeWeights({
            t: lazy_parameter() if w is None else nn.Parameter(torch.empty(w, 3 * Q))
            for t, w in self._widths.items()})
        self.kqv_bias = nn.ParameterDict({t: nn.Parameter(torch.empty(3 * Q))
                                          for t in self.node_types})
        self.out_weight = nn.Parameter(torch.empty(len(self.node_types), Q, Q))
        self.out_bias = nn.Parameter(torch.empty(len(self.node_types), Q))
        # (head, relation) -> D x D, PyG's HeteroLinear order: index h * R + r
        self.k_rel = nn.Parameter(torch.empty(heads * R, D, D))
        self.v_rel = nn.Parameter(torch.empty(heads * R, D, D))
        self.skip = nn.Parameter(torch.empty(len(self.node_types)))
        self.p_rel = nn.Parameter(torch.empty(R, heads))
        self.score = HeadDot(heads, D)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.Linear's uniform bounds for the maps (a lazy type's once it is sized),
        ones for the skips and priors."""
        for t, w in self._widths.items():
            if w is not None:
                _uniform_(self.kqv_weight[t], w)
                _uniform_(self.kqv_bias[t], w)
        for p in (self.out_weight, self.out_bias):
            _uniform_(p, self.out_channels)
        for p in (self.k_rel, self.v_rel):
            _uniform_(p, p.shape[1])
        with torch.no_grad():
            self.skip.fill_(1.0)
            self.p_rel.fill_(1.0)

    def _materialize(self, t: str, P: int) -> None:
        """Size a lazy type's map for P input features (its first call), drawn as at
        construction."""
        self.kqv_weight[t].materialize((P, 3 * self.out_channels))
        self._widths[t] = P
        _uniform_(self.kqv_weight[t], P)
        _uniform_(self.kqv_bias[t], P)

    def _sized_from(self, name: str, t: Tensor) -> None:
        if name.startswith("kqv_weight."):
            self._widths[name[len("kqv_weight."):]] = t.shape[0]

    # PyG's names: kqv_lin.lins.<type>, out_lin.lins.<type> (Linear: weight (out, in), bias),
    # k_rel.weight, v_rel.weight, skip.<type> (1,), p_rel.<s__rel__d> (1, H)
    def _load_from_state_dict(self, state_dict, prefix, *args):
        sd, p = state_dict, prefix
        if p + "k_rel.weight" in sd and p + "k_rel" not in sd:
            for t in self.node_types:
                for ours, pyg, f in (("kqv_weight.", "kqv_lin.lins.", "weight"),
                                     ("kqv_bias.", "kqv_lin.lins.", "bias")):
                    if p + pyg + t + "." + f in sd:
                        v = sd.pop(p + pyg + t + "." + f)
                        sd[p + ours + t] = v.t() if f == "weight" else v
            for ours, pyg in (("k_rel", "k_rel.weight"), ("v_rel", "v_rel.weight")):
                sd[p + ours] = sd.pop(p + pyg)
            ol = [p + f"out_lin.lins.{t}." for t in self.node_types]
            if all(k + "weight" in sd for k in ol):
                sd[p + "out_weight"] = torch.stack([sd.pop(k + "weight").t() for k in ol])
                sd[p + "out_bias"] = torch.stack([sd.pop(k + "bias") for k in ol])
            sk = [p + f"skip.{t}" for t in self.node_types]
            if all(k in sd for k in sk):
                sd[p + "skip"] = torch.cat([sd.pop(k).reshape(1) for k in sk])
            pr = [p + f"p_rel.{_key(e)}" for e in self.edge_types]
            if all(k in sd for k in pr):
                sd[p + "p_rel"] = torch.cat([sd.pop(k).reshape(1, -1) for k in pr])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _to_pyg_tensors(self, sd: dict, prefix: str) -> None:
        p = prefix
        for t in self.node_types:
            sd[p + f"kqv_lin.lins.{t}.weight"] = sd.pop(p + f"kqv_weight.{t}").t().contiguous()
            sd[p + f"kqv_lin.lins.{t}.bias"] = sd.pop(p + f"kqv_bias.{t}")
        ow, ob, sk = sd.pop(p + "out_weight"), sd.pop(p + "out_bias"), sd.pop(p + "skip")
        for i, t in enumerate(self.node_types):
            sd[p + f"out_lin.lins.{t}.weight"] = ow[i].t().contiguous()
            sd[p + f"out_lin.lins.{t}.bias"] = ob[i].clone()
        for k in ("k_rel", "v_rel"):
            sd[p + k + ".weight"] = sd.pop(p + k)
        for i, t in enumerate(self.node_types):
            sd[p + f"skip.{t}"] = sk[i].reshape(1).clone()
        pr = sd.pop(p + "p_rel")
        for r, e in enumerate(self.edge_types):
            sd[p + f"p_rel.{_key(e)}"] = pr[r].reshape(1, -1).clone()

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, heads={self.heads}, "
                f"types={len(self.node_types)}, relations={len(self.edge_types)}")

    def _kqv(self, x_dict):
        """{type: (k, q, v)}, each (n_t, Q), for the node types of x_dict, one product
        per type (a few large GEMMs beat a tiled segment product's gathers here); their
        (offset, count) in the concatenated nodes."""
        types = [t for t in x_dict if t in self.kqv_weight]
        self._check_x(x_dict, types)
        kqv, offs, acc = {}, {}, 0
        for t in types:
            x = x_dict[t]
            y = torch.addmm(self.kqv_bias[t].to(x.dtype), x, self.kqv_weight[t].to(x.dtype))
            # one split (its backward is one concatenation; a slice's would fill a zero
            # (n_t, 3Q) gradient per slice)
            kqv[t] = y.split(self.out_channels, dim=1)
            offs[t], acc = (acc, x.shape[0]), acc + x.shape[0]
        return kqv, offs

    def _check_x(self, x_dict, types) -> dict:
        """The input widths of ``types`` (sizing lazy ones), each x checked by name."""
        widths = self._widths
        for t in types:
            x = x_dict[t]
            if isinstance(x, Tensor) and not x.is_floating_point():
                raise TypeError(f"HGTConv: x_dict[{t!r}] must be floating node features, got "
                                f"dtype {x.dtype}")
            if isinstance(x, Tensor) and x.dim() == 2 and widths[t] is None:
                self._materialize(t, x.shape[1])
            if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != widths[t]:
                got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"HGTConv: x_dict[{t!r}] must be (n, {widths[t]}), got {got}")
        if not types:
            raise ValueError(f"HGTConv: x_dict holds none of the node types "
                             f"{self.node_types}")
        return widths

    @staticmethod
    def _edge_list(ei, et, n_src: int, n_dst: int) -> Tensor:
        """The (2, E) edge list of edge_index_dict[et] (any input ``as_edge_index`` reads)."""
        if type(ei) is Tensor and ei.layout == torch.strided:  # the common path
            if ei.dtype == torch.bool or ei.is_floating_point():
                raise TypeError(f"HGTConv: edge_index_dict[{et}] must be an integer (2, E) "
                                f"tensor, got dtype {ei.dtype}")
            return ei
        e = as_edge_index(ei, f"HGTConv: edge_index_dict[{et}]")
        if e.size is not None and any(a is not None and a != b
                                      for a, b in zip(e.size, (n_src, n_dst))):
            raise ValueError(f"HGTConv: the adjacency of {et} is {e.size[1]} x {e.size[0]} "
                             f"(num_dst x num_src) but x_dict gives {n_dst} x {n_src}")
        return e.index

    def _joined(self, edge_index_dict, offs) -> _Joined:
        """The relations given, joined (``_Joined``), built once per graph: cached on the
        identity of the edge tensors (``sc.basis.cache``) and the node counts."""
        given = [(r, et, self._edge_list(ei, et, offs[et[0]][1], offs[et[2]][1]))
                 for r, et, ei in known_relations("HGTConv", edge_index_dict, self.edge_types,
                                                  offs)]
        opts = ("hgt", tuple((r, et) for r, et, _ in given), tuple(offs.items()), self.heads)
        return cached(True, tuple(ei for *_, ei in given), opts,
                      lambda: _Joined(given, offs, self.heads))

    def _rel_weights(self, weight: Tensor, rels: list[int], dtype, prior=None) -> Tensor:
        """(len(rels), Q, Q): each given relation's D x D maps of the heads (``weight[h * R +
        r]``, times ``prior[r, h]`` where given) as one block-diagonal Q x Q matrix, so that a
        relation's rows are mapped by one product of their (rows, Q) features, all heads at
        once, without moving heads to the front."""
        H, R, D = self.heads, len(self.edge_types), self.out_channels // self.heads
        w = weight.to(dtype).view(H, R, D, D)[:, rels]
        if prior is not None:
            w = w * prior.to(dtype)[rels].t().reshape(H, len(rels), 1, 1)
        eye = torch.eye(H, dtype=dtype, device=w.device)
        return torch.einsum("hrij,hg->rhigj", w, eye).reshape(len(rels), H * D, H * D)

    def forward(self, x_dict: dict, edge_index_dict: dict) -> dict[str, Tensor]:
        """{type: (n_t, P_t)}, {(s, rel, d): (2, E)} -> {type: (n_t, Q)} for each node type
        of x_dict that is a relation's target in ``metadata``."""
        if self._explain_mask() is not None:
            # an explanation that ignored its mask would be wrong without a word
            raise NotImplementedError("HGTConv does not apply PyG's explain edge masks: "
                                      "Explainer cannot explain a model through it")
        kqv, offs = self._kqv(x_dict)
        j = self._joined(edge_index_dict, offs)
        q = torch.cat([v[1] for v in kqv.values()])
        if not j.E:  # no edge: every target gets zero messages
            return self._outputs(torch.zeros_like(q), x_dict, offs)
        # keys and values of the (relation, source) rows: one product per source type, not
        # per edge; the priors p_rel scale the keys' maps (a score is linear in its key)
        kr = self._rows(kqv, j, self._rel_weights(self.k_rel, j.rels, q.dtype, self.p_rel), 0)
        vr = self._rows(kqv, j, self._rel_weights(self.v_rel, j.rels, q.dtype), 2)
        return self._outputs(self._attend(q, kr, vr, j), x_dict, offs)

    def _rows(self, kqv: dict, j: _Joined, w: Tensor, part: int) -> Tensor:
        """(M, Q): the keys (``part`` 0) or values (2) of each source type times its
        relations' maps ``w`` (one (Q, Q) per entry of ``j.rels``), side by side in one
        product per source type, in the joined graph's row order."""
        Q = self.out_channels
        out = []
        for s, idx in j.groups:
            ws = w[idx].permute(1, 0, 2).reshape(Q, len(idx) * Q)
            out.append((kqv[s][part] @ ws).view(-1, Q))
        return torch.cat(out) if len(out) > 1 else out[0]

    def _attend(self, q: Tensor, kr: Tensor, vr: Tensor, j: _Joined) -> Tensor:
        """Each node's softmax over all its incoming edges of q_n · kr_m / sqrt(D), applied
        to vr: (N, Q) from q (N, Q) and the rows' kr, vr (M, Q)."""
        N, H = q.shape[0], self.heads
        D = self.out_channels // H
        if _fused(q):
            # the scores, weights and messages as values on the graph's pattern: no per-edge
            # vector is ever built
            out = _DotAttention.apply(q.reshape(N * H, D), kr.reshape(-1, D),
                                      vr.reshape(-1, D), j.layout(), self.score.scale)
            return out.view(N, H * D)
        # traceable torch ops (compiled graphs, other devices and dtypes): the same numbers
        ei = j.edge_index
        scores = self.score.edge_scores(kr.view(-1, H, D), q.reshape(N, H, D), ei)
        alpha = edge_softmax(scores, ei[1], N)
        out = GraphAttention(ei, alpha, j.M, N).propagate_heads(vr.view(1, -1, H, D))[0]
        return out.reshape(N, H * D)

    def _outputs(self, out: Tensor, x_dict, offs) -> dict[str, Tensor]:
        """gelu, each target type's linear map (one product per type) and its gated skip
        where the widths agree: {type: (n_t, Q)}."""
        res = {}
        for t, (o, c) in offs.items():
            if t not in self.dst_types:
                continue
            i, x = self.node_types.index(t), x_dict[t]
            y = torch.addmm(self.out_bias[i].to(out.dtype), F.gelu(out[o:o + c]),
                            self.out_weight[i].to(out.dtype))
            if y.shape[-1] == x.shape[-1]:
                g = self.skip[i].sigmoid().to(y.dtype)
                y = g * y + (1 - g) * x
            res[t] = y
        return res


@register_pyg("HGTConv")
def _from_hgt(m):
    meta = (list(m.node_types), [tuple(e) for e in m.edge_types])
    lins = {t: m.kqv_lin.lins[t] for t in m.node_types}
    if any(isinstance(lin.weight, nn.parameter.UninitializedParameter) for lin in lins.values()):
        raise ValueError("HGTConv has lazy (uninitialised) weights: run it once or give "
                         "in_channels before converting")
    widths = {t: int(lin.weight.shape[1]) for t, lin in lins.items()}  # lazy -1 resolved
    out = HGTConv(widths, m.out_channels, meta, heads=m.heads)
    p = m.k_rel.weight
    out = out.to(device=p.device, dtype=p.dtype).train(m.training)
    with torch.no_grad():
        for i, t in enumerate(out.node_types):
            lin = m.kqv_lin.lins[t]
            out.kqv_weight[t].copy_(lin.weight.t())
            out.kqv_bias[t].copy_(lin.bias)
            ol = m.out_lin.lins[t]
            out.out_weight[i].copy_(ol.weight.t())
            out.out_bias[i].copy_(ol.bias)
            out.skip[i].copy_(m.skip[t].reshape(()))
        out.k_rel.copy_(m.k_rel.weight)
        out.v_rel.copy_(m.v_rel.weight)
        for r, et in enumerate(out.edge_types):
            out.p_rel[r].copy_(m.p_rel[_key(et)].reshape(-1))
    return out

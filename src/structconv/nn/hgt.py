"""The Heterogeneous Graph Transformer (Hu et al., WWW 2020) with PyG's signature: ``HGTConv``.

Per node type t: keys, queries, values k, q, v = x_t W_t (H heads of D = Q/H channels). Per
relation e = (s, rel, d) and head h, the keys and values of s's nodes are mapped by D x D
matrices K_{e,h}, V_{e,h}; every edge m -e-> n scores

    score = (q_n,h · k_m,h K_{e,h}) · p_{e,h} / sqrt(D)

and each target's scores are softmaxed over ALL its incoming edges, whatever their relation. The
attention is a basis on the typed graph: the relations' edges joined into one bipartite graph
from (relation, source) rows to the concatenated node sets, scored by ``HeadDot`` (structconv's
attention algebra), normalised by ``edge_softmax`` and applied by ``GraphAttention``. Then
gelu, a linear map per type, and a gated skip sigmoid(s_t) y + (1 - sigmoid(s_t)) x_t where the
widths agree. As PyG, a node type that is the target of no relation in ``metadata`` is absent
from the output, and one that is, but receives no edge in this call, gets its value from zero
messages (never None). The per-type and per-relation products run as segment products
(``segment_matmul``), one call each, whatever the number of types.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.basis import GraphAttention
from ..attention.masks import edge_softmax
from ..attention.mechanisms import HeadDot
from ..basis.edges import as_edge_index
from ..basis.typed import segment_matmul
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
        """k, q, v (N, H, D) of the node types of x_dict, concatenated; their (type, offset,
        count)."""
        types = [t for t in x_dict if t in self.kqv_weight]
        widths = self._check_x(x_dict, types)
        P = max(widths[t] for t in types)
        xs, ws, counts = [], [], []
        for t in types:
            x = x_dict[t]
            xs.append(F.pad(x, (0, P - x.shape[1])))
            ws.append(F.pad(self.kqv_weight[t], (0, 0, 0, P - x.shape[1])))
            counts.append(x.shape[0])
        b = torch.stack([self.kqv_bias[t] for t in types]).to(xs[0].dtype)
        if len({widths[t] for t in types}) == 1:  # one width: one segment product
            reps = torch.tensor(counts, device=xs[0].device)
            kqv = segment_matmul(torch.cat(xs), counts, torch.stack(ws)) + \
                b.repeat_interleave(reps, 0)
        else:  # per-type widths: a product per type (padding to the widest would cost more)
            kqv = torch.cat([torch.addmm(b[i], x_dict[t], self.kqv_weight[t].to(b.dtype))
                             for i, t in enumerate(types)])
        H, D = self.heads, self.out_channels // self.heads
        k, q, v = (t.reshape(-1, H, D) for t in kqv.tensor_split(3, dim=1))
        offs, acc = {}, 0
        for t, c in zip(types, counts):
            offs[t], acc = (acc, c), acc + c
        return k, q, v, offs

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

    def _relations(self, edge_index_dict, offs):
        """The relations given, in edge_index_dict's order: their ids, source rows (into the
        concatenated nodes) and the joined bipartite edges ((relation, source) row -> node)."""
        rels, rows, src, dst, ids = [], [], [], [], []
        n_rows = 0
        for r, et, ei in known_relations("HGTConv", edge_index_dict, self.edge_types, offs):
            s, _, d = et
            o, c = offs[s]
            ei = self._edge_list(ei, et, c, offs[d][1])
            rels.append(r)
            rows.append(torch.arange(o, o + c, device=ei.device))
            src.append(ei[0].long() + n_rows)
            dst.append(ei[1].long() + offs[d][0])
            ids.append(torch.full_like(ei[0], r, dtype=torch.long))
            n_rows += c
        return rels, rows, src, dst, ids, n_rows

    def _rel_map(self, z: Tensor, weight: Tensor, rels, counts) -> Tensor:
        """z (rows, H, D) grouped by relation -> each (relation, head) block times its D x D
        matrix, as one segment product over (head, relation) groups."""
        H, R = self.heads, len(self.edge_types)
        idx = torch.tensor([h * R + r for h in range(H) for r in rels], device=z.device)
        zt = z.transpose(0, 1).reshape(-1, z.shape[-1])  # (H*rows, D), head-major
        out = segment_matmul(zt, counts * H, weight.index_select(0, idx))
        return out.reshape(H, -1, z.shape[-1]).transpose(0, 1)

    def forward(self, x_dict: dict, edge_index_dict: dict) -> dict[str, Tensor]:
        """{type: (n_t, P_t)}, {(s, rel, d): (2, E)} -> {type: (n_t, Q)} for each node type
        of x_dict that is a relation's target in ``metadata``."""
        if self._explain_mask() is not None:
            # an explanation that ignored its mask would be wrong without a word
            raise NotImplementedError("HGTConv does not apply PyG's explain edge masks: "
                                      "Explainer cannot explain a model through it")
        k, q, v, offs = self._kqv(x_dict)
        rels, rows, src, dst, ids, M = self._relations(edge_index_dict, offs)
        N, H, D = q.shape[0], self.heads, self.out_channels // self.heads
        if rels:
            row = torch.cat(rows)
            counts = [len(r) for r in rows]
            kr = self._rel_map(k.index_select(0, row), self.k_rel.to(k.dtype), rels, counts)
            vr = self._rel_map(v.index_select(0, row), self.v_rel.to(v.dtype), rels, counts)
            ei = torch.stack([torch.cat(src), torch.cat(dst)])
            scores = self.score.edge_scores(kr, q, ei) * self.p_rel.to(q.dtype)[torch.cat(ids)]
            alpha = edge_softmax(scores, ei[1], N)
            out = GraphAttention(ei, alpha, max(M, 1), N).propagate_heads(
                vr.unsqueeze(0) if M else vr.new_zeros(1, 1, H, D))[0]
        else:
            out = q.new_zeros(N, H, D)
        return self._outputs(out.reshape(N, H * D), x_dict, offs)

    def _outputs(self, out: Tensor, x_dict, offs) -> dict[str, Tensor]:
        keep = [t for t in offs if t in self.dst_types]
        if not keep:
            return {}
        parts = [out[offs[t][0]:offs[t][0] + offs[t][1]] for t in keep]
        counts = [offs[t][1] for t in keep]
        ti = [self.node_types.index(t) for t in keep]
        a = F.gelu(torch.cat(parts))
        w, b = self.out_weight[ti].to(a.dtype), self.out_bias[ti].to(a.dtype)
        y = segment_matmul(a, counts, w) + b.repeat_interleave(
            torch.tensor(counts, device=a.device), 0)
        res = {}
        for t, i, yt in zip(keep, ti, y.split(counts)):
            x = x_dict[t]
            if yt.shape[-1] == x.shape[-1]:
                g = self.skip[i].sigmoid().to(yt.dtype)
                yt = g * yt + (1 - g) * x
            res[t] = yt
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

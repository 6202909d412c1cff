"""Neighbourhood aggregations of gathered messages: the combination step of a graph layer when it
is not the linear mean/sum of a basis (``sc.nn.SAGEConv``'s ``aggr``).

A message is one row of ``x_src[edge_index[0]]`` (E, P); its target ``edge_index[1]`` (E,)
says which of the N outputs it joins. ``Readout`` is one aggregation (PyG's names: sum/add,
mean, max, min, mul, var, std, softmax, powermean, lstm; a target without messages reads 0, 1
for mul); ``MultiReadout`` runs several and combines them (mode ``cat``, ``proj``, ``attn`` or
a reduction over the readouts). Parameter names follow PyG's aggregations, so PyG checkpoints
load as they are. Nothing here imports PyG.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["Readout", "MultiReadout", "make_readout", "scatter_messages", "group_softmax",
           "neighbour_sequences", "READOUTS", "MODES"]

#: aggregation names and the options each takes (defaults as PyG's)
READOUTS = {
    "sum": {}, "add": {}, "mean": {}, "max": {}, "min": {}, "mul": {},
    "var": {"semi_grad": False}, "std": {"semi_grad": False},
    "softmax": {"t": 1.0, "learn": False, "semi_grad": False, "channels": 1},
    "powermean": {"p": 1.0, "learn": False, "channels": 1, "clamp_min": 1e-4,
                  "clamp_max": 100.0},
    "lstm": {"in_channels": None, "out_channels": None, "num_layers": 1, "bias": True,
             "dropout": 0.0},
}
#: how MultiReadout combines its readouts
MODES = ("cat", "proj", "attn", "sum", "mean", "max", "min", "logsumexp", "std", "var")


def scatter_messages(msg: Tensor, index: Tensor, N: int, reduce: str) -> Tensor:
    """(N, P) reduction ("sum", "mean", "max", "min", "mul") of the messages (E, P) by target
    ``index`` (E,); a target without messages gets 0 (1 for "mul")."""
    idx = index.long().unsqueeze(1).expand_as(msg)
    if reduce == "mul":  # a product starts from 1, empty targets keep it
        return msg.new_ones(N, msg.shape[1]).scatter_reduce(0, idx, msg, "prod")
    out = msg.new_zeros(N, msg.shape[1])
    if reduce in ("max", "min"):
        return out.scatter_reduce(0, idx, msg, "a" + reduce, include_self=False)
    out = out.scatter_add(0, idx, msg)
    if reduce == "mean":
        cnt = msg.new_zeros(N).index_add(0, index.long(), msg.new_ones(index.shape[0]))
        out = out / cnt.clamp_min(1).unsqueeze(1)
    return out


def group_softmax(s: Tensor, index: Tensor, N: int) -> Tensor:
    """Softmax of the scores ``s`` (E, P) over each target's messages, per channel."""
    idx = index.long().unsqueeze(1).expand_as(s)
    top = s.new_zeros(N, s.shape[1]).scatter_reduce(0, idx, s.detach(), "amax",
                                                    include_self=False)
    e = (s - top.index_select(0, index.long())).exp()
    den = s.new_zeros(N, s.shape[1]).scatter_add(0, idx, e)
    return e / den.index_select(0, index.long())


def check_sorted(index: Tensor, who: str) -> None:
    """Raise unless the targets are non-decreasing (each target's messages contiguous)."""
    if torch.compiler.is_compiling() or index.shape[0] < 2:
        return
    if bool((index[1:] < index[:-1]).any()):
        raise ValueError(f"{who}: aggr='lstm' reads each target's messages as a sequence in "
                         f"edge order, so edge_index must be sorted by target, but the 'index' "
                         f"tensor is not sorted (edge_index[1] must be non-decreasing: sort the "
                         f"edges by target first)")


def neighbour_sequences(msg: Tensor, index: Tensor, N: int) -> Tensor:
    """(N, D, P): each target's messages in edge order, zero-padded at the end to the largest
    in-degree D (``index`` sorted)."""
    index = index.long()
    count = torch.bincount(index, minlength=N)
    D = int(count.max()) if index.numel() else 0
    start = torch.cumsum(count, 0) - count
    pos = torch.arange(index.shape[0], device=index.device) - start.index_select(0, index)
    out = msg.new_zeros(N, D, msg.shape[1])
    return out.index_put((index, pos), msg)


def _options(kind: str, given: dict, who: str) -> dict:
    allowed = READOUTS[kind]
    bad = sorted(set(given) - set(allowed))
    if bad:
        raise TypeError(f"{who}: aggregation {kind!r} takes options {sorted(allowed)}, got "
                        f"unknown {bad}")
    return {**allowed, **given}


class Readout(nn.Module):
    """One aggregation of each target's messages: (E, P) messages, (E,) targets -> (N, P')
    (P' = P, or the LSTM's ``out_channels``). ``kind`` in ``READOUTS``; ``t`` / ``p`` are
    parameters when ``learn`` (one per channel with ``channels``)."""

    def __init__(self, kind: str, who: str = "Readout", **options):
        super().__init__()
        if not isinstance(kind, str) or kind not in READOUTS:
            raise ValueError(f"{who}: aggr must be one of {sorted(READOUTS)} (or a list of "
                             f"them), got {kind!r}")
        o = _options(kind, options, who)
        self.kind, self.who = "sum" if kind == "add" else kind, who
        self.semi_grad = bool(o.get("semi_grad", False))
        if kind in ("softmax", "powermean"):
            self._init_learn(kind, o)
        if kind == "lstm":
            cin, cout = o["in_channels"], o["out_channels"] or o["in_channels"]
            if isinstance(cin, bool) or not isinstance(cin, int) or cin < 1:
                raise ValueError(f"{who}: aggr='lstm' needs a positive in_channels (a lazy -1 "
                                 f"is not supported), got {cin!r}")
            self.in_channels, self.out_channels = cin, cout
            self.lstm = nn.LSTM(cin, cout, num_layers=o["num_layers"], bias=o["bias"],
                                dropout=o["dropout"], batch_first=True)

    def _init_learn(self, kind: str, o: dict) -> None:
        name, self.learn, self.channels = ("t" if kind == "softmax" else "p"), \
            bool(o["learn"]), int(o["channels"])
        if self.learn and self.semi_grad:
            raise ValueError(f"{self.who}: softmax with learn=True cannot take semi_grad=True")
        if not self.learn and self.channels != 1:
            raise ValueError(f"{self.who}: {kind} takes channels > 1 only with learn=True, got "
                             f"channels={self.channels}")
        self._init_value = float(o[name])
        self.clamp = (o.get("clamp_min"), o.get("clamp_max"))
        if self.learn:
            self.register_parameter(name, nn.Parameter(torch.empty(self.channels)))
        else:
            setattr(self, name, self._init_value)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The LSTM's torch initialisation; a learnt t or p back to its initial value."""
        if self.kind == "lstm":
            self.lstm.reset_parameters()
        for name in ("t", "p"):
            if isinstance(self._parameters.get(name), Tensor):
                with torch.no_grad():
                    self._parameters[name].fill_(self._init_value)

    def width(self, P: int) -> int:
        """Output width for messages of width P."""
        return self.out_channels if self.kind == "lstm" else P

    def forward(self, msg: Tensor, index: Tensor, N: int) -> Tensor:
        """(E, P) messages, (E,) targets -> (N, P')."""
        k = self.kind
        if k in ("sum", "mean", "max", "min", "mul"):
            return scatter_messages(msg, index, N, k)
        if k in ("var", "std"):
            return _variance(msg, index, N, k, self.semi_grad)
        if k == "softmax":
            return self._softmax(msg, index, N)
        if k == "powermean":
            return self._powermean(msg, index, N)
        check_sorted(index, self.who)
        seq = neighbour_sequences(msg, index, N)
        if seq.shape[1] == 0:  # no messages at all: the LSTM's state after no step, 0
            return msg.new_zeros(N, self.out_channels)
        return self.lstm(seq)[0][:, -1]

    def _softmax(self, msg, index, N):
        t = self.t
        if isinstance(t, Tensor) and self.channels != 1:
            t = t.view(1, self.channels)
        score = msg if (not isinstance(t, Tensor) and t == 1) else msg * t
        if self.semi_grad:
            with torch.no_grad():
                alpha = group_softmax(score, index, N)
        else:
            alpha = group_softmax(score, index, N)
        return scatter_messages(msg * alpha, index, N, "sum")

    def _powermean(self, msg, index, N):
        p, (lo, hi) = self.p, self.clamp
        if isinstance(p, Tensor) and self.channels != 1:
            p = p.view(1, self.channels)
        plain = not isinstance(p, Tensor) and p == 1
        if not plain:
            msg = msg.clamp(min=lo, max=hi).pow(p)
        out = scatter_messages(msg, index, N, "mean")
        return out if plain else out.clamp(min=lo, max=hi).pow(1.0 / p)

    def extra_repr(self) -> str:
        return self.kind


def _variance(msg: Tensor, index: Tensor, N: int, kind: str, semi_grad: bool) -> Tensor:
    """E[x^2] - E[x]^2 per target; for "std" its root, 0 where the variance is below 1e-5 (a
    root with a finite gradient, as PyG's)."""
    mean = scatter_messages(msg, index, N, "mean")
    if semi_grad:
        with torch.no_grad():
            mean2 = scatter_messages(msg * msg, index, N, "mean")
    else:
        mean2 = scatter_messages(msg * msg, index, N, "mean")
    var = mean2 - mean * mean
    if kind == "var":
        return var
    out = var.clamp(min=1e-5).sqrt()
    return out.masked_fill(out <= math.sqrt(1e-5), 0.0)


class _Heads(nn.Module):
    """One linear map per readout, to a common width (the ``attn`` mode's inputs)."""

    def __init__(self, widths: list[int], out: int):
        super().__init__()
        self.lins = nn.ModuleDict({str(i): nn.Linear(w, out) for i, w in enumerate(widths)})

    def reset_parameters(self) -> None:
        for lin in self.lins.values():
            lin.reset_parameters()


class MultiReadout(nn.Module):
    """Several readouts of the same messages, combined: ``cat`` (widths add up), ``proj`` (a
    linear map of the concatenation), ``attn`` (multi-head attention across the readouts, then
    their mean) or a reduction (sum, mean, max, min, logsumexp, std, var) across them."""

    def __init__(self, aggrs, aggrs_kwargs=None, mode: str = "cat", mode_kwargs=None,
                 who: str = "MultiReadout"):
        super().__init__()
        if not isinstance(aggrs, (list, tuple)) or not aggrs:
            raise ValueError(f"{who}: aggr as a list needs at least one name, got {aggrs!r}")
        kws = [{}] * len(aggrs) if aggrs_kwargs is None else list(aggrs_kwargs)
        if len(kws) != len(aggrs):
            raise ValueError(f"{who}: aggrs_kwargs must have one dict per aggregation "
                             f"({len(aggrs)}), got {len(kws)}")
        self.aggrs = nn.ModuleList(
            a if isinstance(a, Readout) else Readout(a, who=who, **dict(kw or {}))
            for a, kw in zip(aggrs, kws))
        if mode not in MODES:
            raise ValueError(f"{who}: aggr_kwargs mode must be one of {list(MODES)}, got "
                             f"{mode!r}")
        self.mode, self.who = mode, who
        mk = dict(mode_kwargs or {})
        self.in_channels, self.out_channels = mk.pop("in_channels", None), \
            mk.pop("out_channels", None)
        if mode in ("proj", "attn"):
            self._init_mixer(mode, mk)

    def _init_mixer(self, mode: str, mk: dict) -> None:
        if len(self.aggrs) == 1:
            raise ValueError(f"{self.who}: mode {mode!r} combines several aggregations, got one")
        if self.in_channels is None or self.out_channels is None:
            raise ValueError(f"{self.who}: mode {mode!r} needs mode_kwargs in_channels and "
                             f"out_channels, got {self.in_channels!r}, {self.out_channels!r}")
        if isinstance(self.in_channels, int):
            self.in_channels = [self.in_channels] * len(self.aggrs)
        if mode == "proj":
            self.lin = nn.Linear(sum(self.in_channels), self.out_channels, **mk)
        else:
            heads = mk.pop("num_heads", 1)
            self.lin_heads = _Heads(list(self.in_channels), self.out_channels)
            self.multihead_attn = nn.MultiheadAttention(self.out_channels, heads, **mk)

    def reset_parameters(self) -> None:
        for a in self.aggrs:
            a.reset_parameters()
        if self.mode == "proj":
            self.lin.reset_parameters()
        if self.mode == "attn":
            self.lin_heads.reset_parameters()
            self.multihead_attn._reset_parameters()

    def width(self, P: int) -> int:
        """Output width for messages of width P."""
        if self.out_channels is not None:
            return self.out_channels
        return P * len(self.aggrs) if self.mode == "cat" else P

    def forward(self, msg: Tensor, index: Tensor, N: int) -> Tensor:
        """(E, P) messages, (E,) targets -> (N, width(P))."""
        if N == 0:  # no targets: nothing to combine (attention needs a batch)
            return msg.new_zeros(0, self.width(msg.shape[1]))
        outs = [a(msg, index, N) for a in self.aggrs]
        if len(outs) == 1:
            return outs[0]
        if self.mode == "cat":
            return torch.cat(outs, dim=-1)
        if self.mode == "proj":
            return self.lin(torch.cat(outs, dim=-1))
        if self.mode == "attn":
            lins = self.lin_heads.lins
            h = torch.stack([lins[str(i)](o) for i, o in enumerate(outs)], dim=0)
            return self.multihead_attn(h, h, h, need_weights=False)[0].mean(dim=0)
        out = getattr(torch, self.mode)(torch.stack(outs, dim=0), dim=0)
        return out if isinstance(out, Tensor) else out[0]

    def extra_repr(self) -> str:
        return f"mode={self.mode}"


def make_readout(aggr, aggr_kwargs: dict | None, P: int, who: str):
    """The aggregation module of ``aggr`` (a name, a list of names, or a module called as
    ``module(msg, index, dim_size=N)``) with ``aggr_kwargs``; ``P`` the message width (-1 lazy)."""
    kw = dict(aggr_kwargs or {})
    if isinstance(aggr, (list, tuple)):
        return MultiReadout(list(aggr), kw.pop("aggrs_kwargs", None), kw.pop("mode", "cat"),
                            kw.pop("mode_kwargs", None), who=who, **_no_more(kw, who))
    if isinstance(aggr, nn.Module):
        if kw:
            raise TypeError(f"{who}: aggr_kwargs apply to an aggregation given by name, got "
                            f"{sorted(kw)} with a module")
        return aggr
    if aggr == "lstm":
        kw.setdefault("in_channels", P)
        kw.setdefault("out_channels", kw["in_channels"])
    return Readout(aggr, who=who, **kw)


def _no_more(kw: dict, who: str) -> dict:
    if kw:
        raise TypeError(f"{who}: aggr_kwargs of a list of aggregations are aggrs_kwargs, mode "
                        f"and mode_kwargs, got unknown {sorted(kw)}")
    return {}


_PYG_PLAIN = {"SumAggregation": "sum", "MeanAggregation": "mean", "MaxAggregation": "max",
              "MinAggregation": "min", "MulAggregation": "mul"}


def readout_of_pyg(agg) -> tuple | None:
    """(aggr, aggr_kwargs) that rebuild PyG's aggregation module ``agg`` here (its parameters
    then load by name), or None where it has no form here (read by class name: no PyG import)."""
    name = type(agg).__name__
    if name in _PYG_PLAIN:
        return _PYG_PLAIN[name], {}
    if name in ("VarAggregation", "StdAggregation"):
        var = agg if name == "VarAggregation" else agg.var_aggr
        return name[:3].lower(), {"semi_grad": bool(var.semi_grad)}
    if name == "SoftmaxAggregation":
        return "softmax", {"t": agg._init_t, "learn": agg.learn, "semi_grad": agg.semi_grad,
                           "channels": agg.channels}
    if name == "PowerMeanAggregation":
        return "powermean", {"p": agg._init_p, "learn": agg.learn, "channels": agg.channels,
                             "clamp_min": agg.min_value, "clamp_max": agg.max_value}
    if name == "LSTMAggregation":
        lstm = agg.lstm
        if lstm.bidirectional or lstm.proj_size or not lstm.batch_first:
            return None
        return "lstm", {"in_channels": agg.in_channels, "out_channels": agg.out_channels,
                        "num_layers": lstm.num_layers, "bias": lstm.bias,
                        "dropout": lstm.dropout}
    if name == "MultiAggregation":
        return _multi_of_pyg(agg)
    return None


def _multi_of_pyg(agg) -> tuple | None:
    subs = [readout_of_pyg(a) for a in agg.aggrs]
    if any(s is None for s in subs) or agg.mode not in MODES:
        return None
    mk = {}
    if agg.in_channels is not None:
        mk["in_channels"] = list(agg.in_channels)
    if agg.out_channels is not None:
        mk["out_channels"] = agg.out_channels
    if agg.mode == "proj":
        mk["bias"] = agg.lin.bias is not None
    if agg.mode == "attn":
        mha = agg.multihead_attn
        if mha.bias_k is not None or not mha._qkv_same_embed_dim or mha.batch_first:
            return None
        mk.update(num_heads=mha.num_heads, dropout=mha.dropout,
                  bias=mha.in_proj_bias is not None)
    return [s[0] for s in subs], {"aggrs_kwargs": [s[1] for s in subs], "mode": agg.mode,
                                  "mode_kwargs": mk}

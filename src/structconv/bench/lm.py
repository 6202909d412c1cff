"""``structconv bench lm``: a training step of ``sc.nn.TransformerLM`` against plain PyTorch.

The anchor is a nanoGPT-style model written directly in PyTorch (one fused q/k/v projection,
``F.scaled_dot_product_attention(is_causal=True)``, learned positions, GELU MLP, tied output
map) with exactly the parameter count of ``TransformerLM(position="learned")``. One training
step = forward, cross-entropy, backward, AdamW step. Measured in one run, medians over
interleaved repeats:

* ``learned_over_plain``: TransformerLM (learned positions) / the plain model (target <= 1.05);
* ``shift_over_none``: the shift-head model / the ``none`` model of the same width and depth,
  parameters equalised through the feed-forward width as in ``reproduce shift-heads``
  (target <= 1.10); ``shift_raw_over_none`` is the same with the default feed-forward width
  (S more heads of work, so not a like-for-like count);
* every other position kind / ``none`` for reference.
"""

from __future__ import annotations

import argparse
import platform
import sys

import torch
import torch.nn.functional as F
from torch import nn

from ..io import atomic_write_json
from ..nn.lm import POSITIONS, TransformerLM, equalised_ffn
from ._util import ALLOCATOR, interleaved_times, record

NAME = "lm"

TARGETS = {"learned_over_plain": ("<=", 1.05), "shift_over_none": ("<=", 1.10)}

#: (name, vocab, width, layers, heads, context, batch): nanoGPT's CPU configuration, and its
#: GPU model's shape at a CPU-sized batch
CASES = {"nanogpt-cpu": (65, 128, 4, 4, 64, 12), "nanogpt-gpu-shape": (65, 384, 6, 6, 256, 4)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", default="nanogpt-cpu,nanogpt-gpu-shape",
                   help=f"comma list of {', '.join(CASES)}")
    p.add_argument("--kinds", default=",".join(POSITIONS),
                   help="position kinds to time against 'none' (default all)")
    p.add_argument("--shifts", type=int, default=4, help="shift heads of the shift kinds")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")


class PlainGPT(nn.Module):
    """The anchor: a nanoGPT-style causal LM in plain PyTorch; ids (B, L) -> (B, L, V)."""

    def __init__(self, V: int, E: int, layers: int, heads: int, context: int):
        super().__init__()
        self.H = heads
        self.tok, self.pos = nn.Embedding(V, E), nn.Parameter(torch.zeros(context, E))
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            b = nn.Module()
            b.ln1, b.ln2 = nn.LayerNorm(E), nn.LayerNorm(E)
            b.qkv, b.out = nn.Linear(E, 3 * E), nn.Linear(E, E)
            b.fc, b.proj = nn.Linear(E, 4 * E), nn.Linear(4 * E, E)
            self.blocks.append(b)
        self.ln = nn.LayerNorm(E)
        self.head = nn.Linear(E, V, bias=False)
        self.head.weight = self.tok.weight
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, ids):
        B, L = ids.shape
        x = self.tok(ids) + self.pos[:L]
        for b in self.blocks:
            h = b.ln1(x)
            q, k, v = b.qkv(h).split(h.shape[-1], -1)
            q, k, v = (t.view(B, L, self.H, -1).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + b.out(a.transpose(1, 2).reshape(B, L, -1))
            x = x + b.proj(F.gelu(b.fc(b.ln2(x))))
        return self.head(self.ln(x))


def _count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _step(model, ids, tgt, opt):
    def run():
        logits = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return run


def bench_case(name: str, args) -> dict:
    V, E, nl, H, ctx, B = CASES[name]
    if args.quick:
        E, nl, ctx, B = 32, 2, 16, 2
    torch.manual_seed(args.seed)
    ids = torch.randint(0, V, (B, ctx))
    tgt = torch.randint(0, V, (B, ctx))
    budget = _count(TransformerLM(V, E, nl, H, "none", ffn=4 * E))
    models = {"plain": PlainGPT(V, E, nl, H, ctx)}
    ffns = {}
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for kind in dict.fromkeys(["none", "learned", *kinds]):
        ffns[kind] = equalised_ffn(V, E, nl, H, kind, args.shifts, budget, ctx) \
            if kind != "learned" else 4 * E
        models[kind] = TransformerLM(V, E, nl, H, kind, args.shifts, ffns[kind], context=ctx)
    if "shift" in kinds:
        models["shift_raw"] = TransformerLM(V, E, nl, H, "shift", args.shifts, 4 * E)
        ffns["shift_raw"] = 4 * E
    fns = {k: _step(m, ids, tgt, torch.optim.AdamW(m.parameters(), lr=1e-4))
           for k, m in models.items()}
    times = interleaved_times(fns, repeats=args.repeats, warmup=2, min_time=0.2)
    params = {k: _count(m) for k, m in models.items()}
    if params["plain"] != params["learned"]:
        raise RuntimeError(f"anchor and model differ in size: {params['plain']} vs "
                           f"{params['learned']}")
    ratios = {"learned_over_plain": times["learned"] / times["plain"]}
    for k in models:
        if k not in ("plain", "none", "learned"):
            ratios[f"{k}_over_none"] = times[k] / times["none"]
    ratios["learned_over_none"] = times["learned"] / times["none"]
    return dict(case=name, vocab=V, width=E, layers=nl, heads=H, context=ctx, batch=B,
                shifts=args.shifts, params=params, ffn=ffns,
                step_ms={k: v * 1e3 for k, v in times.items()}, ratios=ratios)


def _print(r: dict) -> None:
    print(f"\n{r['case']}: width {r['width']}, {r['layers']} layers, {r['heads']} heads, "
          f"context {r['context']}, batch {r['batch']} (one training step)")
    for k, ms in r["step_ms"].items():
        print(f"   {k:<12} {ms:8.2f} ms  params {r['params'][k]:>9,}  ffn {r['ffn'].get(k, '-')}")
    for k, v in r["ratios"].items():
        op, lim = TARGETS.get(k, ("", None))
        ok = "" if lim is None else (" ok" if v <= lim else " MISS")
        print(f"   {k:<24} {v:.3f}x" + (f" (target {op} {lim}){ok}" if lim else ""))


def run(args) -> int:
    from pathlib import Path

    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [c for c in cases if c not in CASES] + [k for k in kinds if k not in POSITIONS]
    if bad:
        print(f"lm bench: unknown cases/kinds {bad}: cases {', '.join(CASES)}; kinds "
              f"{', '.join(POSITIONS)}", file=sys.stderr)
        return 2
    if args.quick:
        cases = cases[:1]
    result = dict(suite=NAME, allocator=dict(ALLOCATOR), quick=bool(args.quick),
                  repeats=args.repeats, seed=args.seed, torch=torch.__version__,
                  threads=torch.get_num_threads(), machine=platform.machine(),
                  targets={k: list(v) for k, v in TARGETS.items()}, cases=[])
    for c in cases:
        r = bench_case(c, args)
        _print(r)
        result["cases"].append(r)
    result["conditions"] = record()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / f"{NAME}.json", result)
    print(f"\nwrote {out / f'{NAME}.json'}")
    return 0

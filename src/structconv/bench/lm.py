"""``structconv bench lm``: a training step of ``sc.nn.TransformerLM`` against plain PyTorch.

The anchor is a nanoGPT-style model written directly in PyTorch (one fused q/k/v projection,
``F.scaled_dot_product_attention(is_causal=True)``, learned positions, GELU MLP, tied output
map) with exactly the parameter count of ``TransformerLM(position="learned")``. One training
step = forward, cross-entropy, backward, AdamW step. Measured in one run, medians over
interleaved repeats:

* ``learned_over_plain``: TransformerLM (learned positions) / the plain model (target <= 1.05);
* ``KIND_over_none`` for every model kind of ``--kinds`` (a position kind, optionally with
  Canon layers, e.g. ``none+Canon-ABCD``): its step / the ``none`` model's, every model of the
  same width and depth with parameters equalised through the feed-forward width as in
  ``reproduce shift-heads`` (targets: shift <= 1.10, none+Canon-ABCD <= 1.10);
  ``shift_raw_over_none`` is the shift model with the default feed-forward width (S more heads
  of work, so not a like-for-like count);
* generation: tokens per second of ``generate`` with the key/value cache (batch 1, greedy,
  from an 8-token prompt to the context length) for every kind, and each / ``none``'s.

The cases run nanoGPT's CPU configuration at its context 64 and at 512, and its GPU model's
shape, all in one run.
"""

from __future__ import annotations

import argparse
import platform
import sys

import torch
import torch.nn.functional as F
from torch import nn

from ..io import atomic_write_json
from ..nn.lm import POSITIONS, TransformerLM, equalised_ffn, split_kind
from ._util import ALLOCATOR, interleaved_times, record

NAME = "lm"

TARGETS = {"learned_over_plain": ("<=", 1.05), "shift_over_none": ("<=", 1.10),
           "none+Canon-ABCD_over_none": ("<=", 1.10)}

#: (name, vocab, width, layers, heads, context, batch): nanoGPT's CPU configuration at its
#: context and at 512 (a batch of about as many tokens), and its GPU model's shape at a
#: CPU-sized batch
CASES = {"nanogpt-cpu": (65, 128, 4, 4, 64, 12), "nanogpt-cpu-L512": (65, 128, 4, 4, 512, 2),
         "nanogpt-gpu-shape": (65, 384, 6, 6, 256, 4)}

#: the model kinds timed by default: every position kind, and Canon-ABCD with none and shift
KINDS = (*POSITIONS, "none+Canon-ABCD", "shift+Canon-ABCD")

#: tokens of the prompt the generation timing starts from
PROMPT = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help="model kinds to time against 'none': position kinds, optionally with "
                        "Canon layers (e.g. none+Canon-ABCD); default: "
                        + ", ".join(KINDS))
    p.add_argument("--shifts", type=int, default=4, help="shift heads of the shift kinds")
    p.add_argument("--canon-kernel", type=int, default=4, help="taps of the Canon layers")
    p.add_argument("--no-generation", action="store_true",
                   help="skip the generation timings")
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


def _models(V, E, nl, H, ctx, kinds: list[str], args) -> tuple[dict, dict]:
    """{name: model} and {name: feed-forward width}: the plain anchor, ``learned`` at the
    default width, and every kind equalised to the ``none`` model's parameter count."""
    budget = _count(TransformerLM(V, E, nl, H, "none", ffn=4 * E))
    models, ffns = {"plain": PlainGPT(V, E, nl, H, ctx)}, {"plain": 4 * E}
    for kind in dict.fromkeys(["none", "learned", *kinds]):
        position, canon = split_kind(kind)
        ffns[kind] = 4 * E if kind == "learned" else equalised_ffn(
            V, E, nl, H, position, args.shifts, budget, ctx, canon=canon,
            canon_kernel=args.canon_kernel)
        models[kind] = TransformerLM(V, E, nl, H, position, args.shifts, ffns[kind],
                                     context=ctx, canon=canon, canon_kernel=args.canon_kernel)
    if "shift" in kinds:
        models["shift_raw"] = TransformerLM(V, E, nl, H, "shift", args.shifts, 4 * E)
        ffns["shift_raw"] = 4 * E
    return models, ffns


def _generation(models: dict, V: int, ctx: int, args) -> dict:
    """Tokens per second of cached greedy generation (batch 1) from a PROMPT-token prompt to
    the context length, for every TransformerLM of ``models``."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(0, V, (1, min(PROMPT, ctx - 1)), generator=gen)
    steps = ctx - prompt.shape[1]
    fns = {k: (lambda m=m: m.generate(prompt, steps, temperature=0))
           for k, m in models.items() if isinstance(m, TransformerLM) and k != "shift_raw"}
    times = interleaved_times(fns, repeats=args.repeats, warmup=1, min_time=0.2)
    return {k: steps / t for k, t in times.items()}


def bench_case(name: str, args) -> dict:
    V, E, nl, H, ctx, B = CASES[name]
    if args.quick:
        E, nl, ctx, B = 32, 2, 16, 2
    torch.manual_seed(args.seed)
    ids = torch.randint(0, V, (B, ctx))
    tgt = torch.randint(0, V, (B, ctx))
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    models, ffns = _models(V, E, nl, H, ctx, kinds, args)
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
    out = dict(case=name, vocab=V, width=E, layers=nl, heads=H, context=ctx, batch=B,
               shifts=args.shifts, canon_kernel=args.canon_kernel, params=params, ffn=ffns,
               step_ms={k: v * 1e3 for k, v in times.items()}, ratios=ratios)
    if not args.no_generation:
        tps = _generation(models, V, ctx, args)
        out["generation_tokens_per_s"] = tps
        out["generation_over_none"] = {k: v / tps["none"] for k, v in tps.items()
                                       if k != "none"}
    return out


def _print(r: dict) -> None:
    print(f"\n{r['case']}: width {r['width']}, {r['layers']} layers, {r['heads']} heads, "
          f"context {r['context']}, batch {r['batch']} (one training step)")
    for k, ms in r["step_ms"].items():
        print(f"   {k:<18} {ms:8.2f} ms  params {r['params'][k]:>9,}  ffn {r['ffn'].get(k, '-')}")
    for k, v in r["ratios"].items():
        op, lim = TARGETS.get(k, ("", None))
        ok = "" if lim is None else (" ok" if v <= lim else " MISS")
        print(f"   {k:<30} {v:.3f}x" + (f" (target {op} {lim}){ok}" if lim else ""))
    if "generation_tokens_per_s" in r:
        print(f"   generation with the cache (batch 1, greedy, to {r['context']} tokens):")
        for k, v in r["generation_tokens_per_s"].items():
            rel = r["generation_over_none"].get(k)
            print(f"   {k:<18} {v:9.1f} tokens/s" + ("" if rel is None else f"  {rel:.3f}x"))


def run(args) -> int:
    from pathlib import Path

    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        print(f"lm bench: unknown cases {bad}: choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    try:
        for k in args.kinds.split(","):
            if k.strip():
                split_kind(k.strip())
        if args.canon_kernel < 1:
            raise ValueError(f"--canon-kernel must be >= 1, got {args.canon_kernel}")
    except ValueError as e:
        print(f"lm bench: {e}", file=sys.stderr)
        return 2
    if args.quick:
        cases = cases[:1]
    result = dict(suite=NAME, allocator=dict(ALLOCATOR), quick=bool(args.quick),
                  repeats=args.repeats, seed=args.seed, torch=torch.__version__,
                  threads=torch.get_num_threads(), machine=platform.machine(),
                  targets={k: list(v) for k, v in TARGETS.items()}, cases=[],
                  note="timings on a shared machine are indicative only: compare the ratios "
                       "of one run, taken on a quiet machine")
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

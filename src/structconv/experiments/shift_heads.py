"""Shift-matrix heads instead of positional encoding: a character LM on Tiny Shakespeare.

``structconv reproduce shift-heads --steps 300 --seeds 3 --out runs``. Five variants of one
small causal Transformer (same depth, width, heads, steps, batches; parameter counts equalised
through the feed-forward width): no position information, sinusoidal encoding, learned encoding,
rotary embedding, and the paper's proposal (end of section "Attention in Transformer"):
attention heads plus causal shift-matrix heads in the same layer with no positional encoding.
Every layer is one structured convolution with a ``LowRank`` theta (value/out per head) over
the basis ``DotProductAttention`` (content-based heads), for the proposal
``sc.basis.Stack([DotProductAttention, Grid((L,), S, padding=(S-1, 0))])``: the causal 1-d grid
adds S index-based heads (shifts 0..S-1). Validation loss (90/10 split) mean ± std over seeds,
learning curves as PNG. Writes ``<out>/shift_heads.json``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.basis import DotProductAttention
from ..basis.base import Stack
from ..basis.grid import Grid
from ..data.registry import DatasetError, data_root
from ..data.text import encode_text, load_text_file
from ..engine import convolve
from ..params import LowRank
from ._common import (
    hardware,
    mean_std,
    param_count,
    pyplot,
    save_figure,
    set_threads,
    write_result,
)

__all__ = ["VARIANTS", "HeadAttention", "CharLM", "build", "add_arguments", "run"]

VARIANTS = ("none", "sinusoidal", "learned", "rotary", "shift")


def rotary(t: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary embedding of t (B, H, L, D), D even: pairs (i, i + D/2) rotated by position."""
    B, H, L, D = t.shape
    if D % 2:
        raise ValueError(f"rotary embedding needs an even head size, got D={D}")
    half = D // 2
    freq = base ** (-torch.arange(half, dtype=t.dtype, device=t.device) / half)
    ang = torch.arange(L, dtype=t.dtype, device=t.device)[:, None] * freq  # (L, D/2)
    cos, sin = ang.cos(), ang.sin()
    a, b = t[..., :half], t[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


def sinusoidal(L: int, E: int) -> Tensor:
    """The Transformer's fixed (L, E) sinusoidal position encoding."""
    pos = torch.arange(L, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, E, 2, dtype=torch.float32) * (-math.log(10000.0) / E))
    pe = torch.zeros(L, E)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)[:, : E // 2]
    return pe


class HeadAttention(nn.Module):
    """Causal self-attention as one convolution: x (B, L, E) -> (B, L, E).

    ``heads`` content-based heads (softmax(q kᵀ), SDPA) plus ``shift_heads`` index-based heads
    (the causal 1-d grid's shift matrices, shifts 0..S-1) stacked along k, with one LowRank
    theta of rank E/heads over all of them. ``use_rotary`` rotates q and k by position.
    """

    def __init__(self, E: int, heads: int, shift_heads: int = 0, use_rotary: bool = False):
        super().__init__()
        if E % heads:
            raise ValueError(f"width E={E} must be divisible by heads={heads}")
        self.E, self.H, self.S, self.D = E, heads, shift_heads, E // heads
        self.use_rotary = use_rotary
        self.q = nn.Linear(E, E)
        self.k = nn.Linear(E, E)
        self.theta = LowRank(heads + shift_heads, E, E, self.D)
        self.bias = nn.Parameter(torch.zeros(E))
        self._grids: dict[int, Grid] = {}

    def grid(self, L: int) -> Grid:
        """The causal 1-d grid on L positions: tap k reads position n - (S-1) + k."""
        if L not in self._grids:
            self._grids[L] = Grid((L,), (self.S,), padding=[(self.S - 1, 0)])
        return self._grids[L]

    def forward(self, x: Tensor) -> Tensor:
        B, L, E = x.shape
        q = self.q(x).reshape(B, L, self.H, self.D).transpose(1, 2)
        k = self.k(x).reshape(B, L, self.H, self.D).transpose(1, 2)
        if self.use_rotary:
            q, k = rotary(q), rotary(k)
        basis = DotProductAttention(q, k, causal=True)
        if self.S:
            basis = Stack([basis, self.grid(L)])
        return convolve(x, basis, self.theta, route="lowrank_heads") + self.bias


class Block(nn.Module):
    """Pre-norm Transformer block: x + attn(ln x), then x + ffn(ln x); (B, L, E) -> (B, L, E)."""

    def __init__(self, E: int, heads: int, ffn: int, shift_heads: int, use_rotary: bool):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(E), nn.LayerNorm(E)
        self.attn = HeadAttention(E, heads, shift_heads, use_rotary)
        self.ffn = nn.Sequential(nn.Linear(E, ffn), nn.GELU(), nn.Linear(ffn, E))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class CharLM(nn.Module):
    """Causal character LM: ids (B, L) -> logits (B, L, V); ``position`` picks the variant."""

    def __init__(self, vocab: int, context: int, E: int, layers: int, heads: int, ffn: int,
                 position: str, shift_kernel: int = 4):
        super().__init__()
        if position not in VARIANTS:
            raise ValueError(f"unknown variant {position!r}: choose one of {VARIANTS}")
        self.position, self.context = position, context
        self.tok = nn.Embedding(vocab, E)
        if position == "learned":
            self.pos = nn.Parameter(torch.randn(context, E) * 0.02)
        elif position == "sinusoidal":
            self.register_buffer("pos", sinusoidal(context, E), persistent=False)
        else:
            self.pos = None
        S = shift_kernel if position == "shift" else 0
        self.blocks = nn.ModuleList(Block(E, heads, ffn, S, position == "rotary")
                                    for _ in range(layers))
        self.ln = nn.LayerNorm(E)
        self.head = nn.Linear(E, vocab)

    def forward(self, ids: Tensor) -> Tensor:
        L = ids.shape[1]
        if L > self.context:
            raise ValueError(f"sequence length {L} exceeds the context {self.context}")
        x = self.tok(ids)
        if self.pos is not None:
            x = x + self.pos[:L]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def build(variant: str, vocab: int, args, ffn: int | None = None) -> CharLM:
    """The variant's model with feed-forward width ``ffn`` (default 4 E)."""
    return CharLM(vocab, args.context, args.width, args.layers, args.heads,
                  ffn or 4 * args.width, variant, args.shift_kernel)


def equalised_ffn(variant: str, vocab: int, args, budget: int) -> int:
    """The feed-forward width whose model's parameter count is closest to ``budget``."""
    E, n = args.width, args.layers
    base = 4 * E
    p0 = param_count(build(variant, vocab, args, base))
    # each unit of ffn width costs 2E + 1 parameters per layer
    ffn = max(1, base + round((budget - p0) / (n * (2 * E + 1))))
    return ffn


def _load(args):
    root = Path(args.data) if args.data else (data_root() or Path("/nonexistent")) / \
        "tinyshakespeare"
    path = root / "input.txt"
    if not path.is_file():
        raise DatasetError(f"no Tiny Shakespeare at {path}: pass --data DIR or set "
                           "STRUCTCONV_DATA")
    if args.quick:
        return encode_text("tinyshakespeare", path.read_text(encoding="utf-8")[:50000],
                           val=0.1, test=0.0)
    return load_text_file(path, "tinyshakespeare", val=0.1, test=0.0)


def _batch(ids: Tensor, B: int, L: int, gen: torch.Generator):
    start = torch.randint(0, ids.numel() - L - 1, (B,), generator=gen)
    off = torch.arange(L)
    return ids[start[:, None] + off], ids[start[:, None] + off + 1]


@torch.no_grad()
def evaluate(model: CharLM, batches) -> float:
    """Mean cross-entropy (nats / character) over fixed validation batches."""
    model.eval()
    tot = sum(float(F.cross_entropy(model(x).flatten(0, 1), y.flatten())) for x, y in batches)
    model.train()
    return tot / len(batches)


def train_one(variant: str, data, args, ffn: int, seed: int, val_batches) -> dict:
    """Train one variant/seed for ``args.steps`` AdamW steps (warmup + cosine); the curve."""
    torch.manual_seed(seed)
    model = build(variant, len(data.vocab), args, ffn)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                            betas=(0.9, 0.99))
    warm = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / args.steps))))
    # the same training batches for every variant of a seed
    gen = torch.Generator().manual_seed(10_000 + seed)
    train = data.splits["train"]
    curve, t0 = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = _batch(train, args.batch, args.context, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % args.eval_every == 0 or step == args.steps:
            curve.append(dict(step=step, train_loss=float(loss.detach()),
                              val_loss=evaluate(model, val_batches)))
    secs = time.perf_counter() - t0
    return dict(seed=seed, val_loss=curve[-1]["val_loss"], curve=curve, seconds=secs,
                params=param_count(model), ffn=ffn)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, help="folder with input.txt")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {VARIANTS}")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4, help="content-based heads per layer")
    parser.add_argument("--shift-kernel", type=int, default=4,
                        help="shift heads of the 'shift' variant (shifts 0..S-1)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--val-batches", type=int, default=24)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--plot", default=None, help="PNG path (default <out>/shift_heads.png)")


def run(args) -> int:
    """All variants × seeds; prints the table, writes JSON and the learning-curve PNG."""
    set_threads(args)
    if args.quick:
        args.steps, args.seeds, args.eval_every, args.val_batches = 6, 1, 3, 2
        args.width, args.context, args.batch = 32, 16, 4
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variants {bad}: choose from {VARIANTS}")
    t_all = time.perf_counter()
    data = _load(args)
    V = len(data.vocab)
    gen = torch.Generator().manual_seed(12345)
    val_batches = [_batch(data.splits["val"], args.batch, args.context, gen)
                   for _ in range(args.val_batches)]
    # the budget: the largest default-width model, so the others gain feed-forward width
    budget = max(param_count(build(v, V, args)) for v in variants)
    ffns = {v: equalised_ffn(v, V, args, budget) for v in variants}
    rows = {}
    for v in variants:
        runs = []
        for i in range(args.seeds):
            r = train_one(v, data, args, ffns[v], args.seed + i, val_batches)
            runs.append(r)
            print(f"  {v:<11} seed {r['seed']}: val {r['val_loss']:.4f}  params {r['params']}  "
                  f"ffn {r['ffn']}  {r['seconds']:.1f}s", flush=True)
        m, s = mean_std([r["val_loss"] for r in runs])
        rows[v] = dict(val_loss_mean=m, val_loss_std=s, params=runs[0]["params"],
                       ffn=ffns[v], seconds_per_run=mean_std([r["seconds"] for r in runs])[0],
                       runs=runs)
    wall = time.perf_counter() - t_all
    print(f"{'variant':<11} {'params':>7} {'ffn':>4} {'val loss (nats/char)':>22} {'s/run':>6}")
    for v, r in rows.items():
        print(f"{v:<11} {r['params']:>7} {r['ffn']:>4} {r['val_loss_mean']:>12.4f} ± "
              f"{r['val_loss_std']:.4f} {r['seconds_per_run']:>6.1f}")
    settings = {k: getattr(args, k) for k in ("steps", "batch", "context", "width", "layers",
                                              "heads", "shift_kernel", "lr", "seeds")}
    result = dict(experiment="shift_heads", settings=settings, vocab=V,
                  train_chars=int(data.splits["train"].numel()),
                  val_chars=int(data.splits["val"].numel()), budget=budget, variants=rows,
                  wall_seconds=wall, hardware=hardware())
    write_result(args, "shift_heads", result)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for v, r in rows.items():
        steps = [c["step"] for c in r["runs"][0]["curve"]]
        vals = torch.tensor([[c["val_loss"] for c in run["curve"]] for run in r["runs"]])
        mean = vals.mean(0)
        ax.plot(steps, mean, label=f"{v} ({r['val_loss_mean']:.3f})")
        if vals.shape[0] > 1:
            sd = vals.std(0)
            ax.fill_between(steps, mean - sd, mean + sd, alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats / char)")
    ax.set_title(f"Tiny Shakespeare, {args.layers}x{args.width}, context {args.context}, "
                 f"{args.seeds} seeds")
    ax.legend()
    save_figure(fig, args, "shift_heads")
    return 0

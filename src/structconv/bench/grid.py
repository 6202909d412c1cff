"""``structconv bench grid``: grid convolutions against torch.nn.ConvNd, forward and fwd+bwd.

Cases: ResNet-like 3x3 (B=32, 64->64, 32x32), ImageNet stem (B=8, 3->64, 224x224, 7x7 stride 2),
a 1-d sequence, a depthwise layer, and a ControlledSeparable layer with H < K. Each structconv
layer runs two ways: the dispatch path (the planner with F.convNd allowed) and the
shift-and-accumulate path (``native=False``: the planner's best route over the Grid's own
kernels). Times are medians over interleaved repeats; ratios are ours / torch in the same run.
Targets: dispatch <= 1.10x, shift-and-accumulate <= 3x.
"""

from __future__ import annotations

import argparse
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..io import atomic_write_json
from ..nn.grid import GridConv
from ..params import ControlledSeparable
from ._util import ALLOCATOR, interleaved_samples, record

NAME = "grid"
DISPATCH_TARGET = 1.10
SHIFT_TARGET = 3.0


@dataclass
class Case:
    name: str
    dim: int
    B: int
    P: int
    Q: int
    size: tuple
    kernel: int
    stride: int = 1
    padding: int = 0
    groups: int = 1
    H: int | None = None  # ControlledSeparable rank (H < K)
    input_grad: bool = True  # a first layer (the stem) needs no input gradient


def cases(quick: bool) -> list[Case]:
    """The benchmark cases (tiny ones with ``quick``)."""
    if quick:
        return [
            Case("resnet3x3", 2, 2, 8, 8, (8, 8), 3, padding=1),
            Case("stem7x7s2", 2, 2, 3, 8, (16, 16), 7, stride=2, padding=3, input_grad=False),
            Case("seq1d", 1, 2, 8, 8, (32,), 5, padding=2),
            Case("depthwise3x3", 2, 2, 8, 8, (8, 8), 3, padding=1, groups=8),
            Case("separable5x5_H4", 2, 2, 8, 8, (8, 8), 5, padding=2, H=4),
        ]
    return [
        Case("resnet3x3", 2, 32, 64, 64, (32, 32), 3, padding=1),
        Case("stem7x7s2", 2, 8, 3, 64, (224, 224), 7, stride=2, padding=3, input_grad=False),
        Case("seq1d", 1, 16, 128, 128, (2048,), 5, padding=2),
        Case("depthwise3x3", 2, 32, 64, 64, (56, 56), 3, padding=1, groups=64),
        Case("separable5x5_H4", 2, 32, 64, 64, (32, 32), 5, padding=2, H=4),
    ]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", default=None,
                   help="comma-separated subset of case names (default: all)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's; 1 steadies timings on a "
                        "loaded machine)")


def _count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def build(case: Case, seed: int, device: str = "cpu"):
    """(torch layer, dispatch layer, shift layer, input) for a case; all share the weights."""
    from ..nn import from_torch

    torch.manual_seed(seed)
    conv_cls = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[case.dim]
    ref = conv_cls(case.P, case.Q, case.kernel, case.stride, case.padding, groups=case.groups)
    ref = ref.to(device)
    ours = from_torch(ref)
    if case.H is not None:
        K = case.kernel ** case.dim
        ours.param = ControlledSeparable(K, case.P, case.Q, case.H).to(device)
    shift = from_torch(ref)
    shift.param = ours.param
    shift.bias = ours.bias
    shift.native = False
    x = torch.randn(case.B, case.P, *case.size, device=device, requires_grad=case.input_grad)
    return ref, ours, shift, x


def _sync(x):
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)


def _fwd(layer, x):
    def run():
        with torch.no_grad():
            layer(x)
        _sync(x)
    return run


def _fwd_bwd(layer, x):
    params = list(layer.parameters())

    def run():
        layer(x).sum().backward()
        for p in params:
            p.grad = None
        if x.grad is not None:
            x.grad = None
        _sync(x)
    return run


def interleaved(fns: dict, repeats: int, warmup: int = 1, min_time: float = 0.02) -> dict:
    """Per closure: (median, min) seconds per call, sampled in turn so drifts hit all alike."""
    samples = interleaved_samples(fns, repeats, warmup, min_time, warm_each=False)
    return {k: (statistics.median(v), min(v)) for k, v in samples.items()}


def time_case(case: Case, repeats: int, seed: int, device: str = "cpu") -> dict:
    ref, ours, shift, x = build(case, seed, device)
    with torch.no_grad():
        err = float((ours(x) - ref(x)).abs().max()) if case.H is None else None
    shift_route = shift.plan_for(shift.basis_for(case.size), x.flatten(2).transpose(1, 2)).route
    # the shift layer on the paper's bundle layout (B, M, P): no NCHW <-> channels-last copies
    bundle = GridConv(case.P, case.Q, shift.kernel_size, shift.stride, shift.padding,
                      shift.dilation, groups=shift.groups, param=shift.param,
                      in_shape=case.size, layout="bundle", native=False)
    bundle.bias = shift.bias
    xb = x.detach().movedim(1, -1).reshape(case.B, -1, case.P).contiguous()
    xb.requires_grad_(case.input_grad)
    fwd = interleaved({"torch": _fwd(ref, x), "dispatch": _fwd(ours, x),
                       "shift": _fwd(shift, x), "shift_bundle": _fwd(bundle, xb)}, repeats)
    bwd = interleaved({"torch": _fwd_bwd(ref, x), "dispatch": _fwd_bwd(ours, x),
                       "shift": _fwd_bwd(shift, x), "shift_bundle": _fwd_bwd(bundle, xb)},
                      repeats)
    paths = ("dispatch", "shift", "shift_bundle")
    return dict(
        case=case.name, dim=case.dim, B=case.B, P=case.P, Q=case.Q, size=list(case.size),
        kernel=case.kernel, stride=case.stride, padding=case.padding, groups=case.groups,
        H=case.H, params_torch=_count(ref), params_ours=_count(ours),
        dispatch_route=ours.plan_for(ours.basis_for(case.size), x.flatten(2).transpose(1, 2)).route,
        shift_route=shift_route, max_abs_diff_vs_torch=err,
        fwd_ms={k: v[0] * 1e3 for k, v in fwd.items()},
        fwd_bwd_ms={k: v[0] * 1e3 for k, v in bwd.items()},
        fwd_ratio={k: fwd[k][0] / fwd["torch"][0] for k in paths},
        fwd_bwd_ratio={k: bwd[k][0] / bwd["torch"][0] for k in paths},
        # ratios of the fastest samples: steadier when other jobs share the cores
        fwd_ratio_best={k: fwd[k][1] / fwd["torch"][1] for k in paths},
        fwd_bwd_ratio_best={k: bwd[k][1] / bwd["torch"][1] for k in paths},
    )


def run(args) -> int:
    repeats = max(3, int(args.repeats))
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    chosen = cases(args.quick)
    if getattr(args, "cases", None):
        want = [c.strip() for c in args.cases.split(",") if c.strip()]
        known = {c.name for c in chosen}
        bad = [w for w in want if w not in known]
        if bad:
            raise ValueError(f"unknown case(s) {bad}: choose from {sorted(known)}")
        chosen = [c for c in chosen if c.name in want]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, repeats {repeats}; "
          "ratios are ours / torch (median)")
    print(f"{'case':<16} {'params torch/ours':>18} {'shift route':>16} "
          f"{'fwd disp':>9} {'fwd shift':>9} {'f+b disp':>9} {'f+b shift':>9}  torch ms f / f+b"
          "   [best-of: fwd disp/shift, f+b disp/shift] {shift on bundles: fwd, f+b}")
    rows = []
    for c in chosen:
        r = time_case(c, repeats, args.seed, getattr(args, "device", "cpu") or "cpu")
        rows.append(r)
        print(f"{r['case']:<16} {r['params_torch']:>8}/{r['params_ours']:<9} "
              f"{r['shift_route']:>16} {r['fwd_ratio']['dispatch']:>8.2f}x "
              f"{r['fwd_ratio']['shift']:>8.2f}x {r['fwd_bwd_ratio']['dispatch']:>8.2f}x "
              f"{r['fwd_bwd_ratio']['shift']:>8.2f}x  {r['fwd_ms']['torch']:.2f} / "
              f"{r['fwd_bwd_ms']['torch']:.2f}   [{r['fwd_ratio_best']['dispatch']:.2f} "
              f"{r['fwd_ratio_best']['shift']:.2f} {r['fwd_bwd_ratio_best']['dispatch']:.2f} "
              f"{r['fwd_bwd_ratio_best']['shift']:.2f}] {{{r['fwd_ratio']['shift_bundle']:.2f} "
              f"{r['fwd_bwd_ratio']['shift_bundle']:.2f}}}", flush=True)

    def share(key, path, target):
        ok = sum(r[path][key] <= target for r in rows)
        return ok, len(rows)

    summary = {}
    for path in ("fwd_ratio", "fwd_bwd_ratio"):
        summary[f"dispatch_{path}_within_target"] = share("dispatch", path, DISPATCH_TARGET)
        summary[f"shift_{path}_within_target"] = share("shift", path, SHIFT_TARGET)
    for k, (ok, n) in summary.items():
        tgt = DISPATCH_TARGET if k.startswith("dispatch") else SHIFT_TARGET
        print(f"{k}: {ok}/{n} (target <= {tgt}x)")
    result = dict(suite=NAME, allocator=dict(ALLOCATOR), conditions=record(),
                  quick=bool(args.quick), repeats=repeats, seed=args.seed,
                  device=getattr(args, "device", "cpu") or "cpu",
                  torch=torch.__version__, threads=torch.get_num_threads(),
                  machine=platform.machine(), processor=platform.processor(),
                  targets=dict(dispatch=DISPATCH_TARGET, shift=SHIFT_TARGET),
                  summary=summary, rows=rows)
    out = Path(args.out) / f"{NAME}.json"
    atomic_write_json(out, result)
    print(f"wrote {out}")
    return 0

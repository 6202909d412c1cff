"""The ``structconv`` command line: demo, train, eval, bench, reproduce, plot-basis, verify.

Every command accepts ``--seed``, ``--device`` and ``--out``. Bad input (unknown name, missing or
corrupt file, wrong shape, bad override, NaN loss) exits with status 2 and one line on stderr;
``STRUCTCONV_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import textwrap
import time
from pathlib import Path

__all__ = ["main", "build_parser", "UsageError"]

PROG = "structconv"


class UsageError(ValueError):
    """Bad command-line input: reported as one line, exit status 2."""


class _Formatter(argparse.HelpFormatter):
    # names such as kg-link and shift-heads stay whole on a wrapped line
    def _split_lines(self, text, width):
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width,
                             break_on_hyphens=False)

    def _fill_text(self, text, width, indent):
        return textwrap.fill(self._whitespace_matcher.sub(" ", text).strip(), width,
                             initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", _Formatter)
        super().__init__(*a, **kw)

    # one line on stderr (no usage block), exit status 2, as for every other bad input
    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _common(p: argparse.ArgumentParser, top: bool = False) -> None:
    # on subcommands the defaults are SUPPRESS so that a value given before the command stays
    d = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=d(None), help="random seed (default: the "
                   "config's seed, 0 elsewhere)")
    p.add_argument("--device", default=d("cpu"),
                   help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--out", default=d(None), help="output directory (per command default)")


def _train_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--config", help="TOML file or the name of a shipped config "
                                    "(see `structconv configs`)")
    s.add_argument("overrides", nargs="*", metavar="key=value",
                   help="config overrides, e.g. train.epochs=3 model.layers.0.channels=8")
    s.add_argument("--resume", metavar="DIR", help="continue the interrupted run in DIR")
    s.add_argument("--nproc", type=int, default=1,
                   help="data-parallel processes on this machine (DDP; gloo on CPU)")
    s.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="per-epoch lines and progress (default on: a bar on a terminal, a "
                        "line every 30 s otherwise)")
    s.add_argument("--stop-after", type=int, default=0, metavar="N",
                   help="end this process after N epochs (continue later with --resume)")
    _allow_imports_argument(s, "--resume DIR")


def _allow_imports_argument(s: argparse.ArgumentParser, what: str) -> None:
    s.add_argument("--allow-imports", action="store_true",
                   help=f"let the config of {what} import the modules its import-path kinds "
                        "('package.module:function') name: a run directory is data, so only "
                        "shipped and installed kinds load unless you allow it (or set "
                        "STRUCTCONV_ALLOW_IMPORTS=1); a --config file is trusted as code")


def _kg_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=["sorts"], help="sorts: mine the relation paths")
    s.add_argument("dataset", help="a relational dataset (fb15k-237, wn18rr, aifb, mutag)")
    s.add_argument("--root", default=None, help="the dataset's folder (default: its folder in "
                                                "the data home, see `structconv datasets`)")
    s.add_argument("--max-length", type=int, default=2, help="longest path, 1..4 (default 2)")
    s.add_argument("--min-length", type=int, default=2, help="shortest path (default 2)")
    s.add_argument("--top", type=int, default=20, help="paths to list (default 20)")
    s.add_argument("--rank", choices=["support", "confidence"], default="support",
                   help="order by walk count or by rule confidence (default support)")
    s.add_argument("--backtrack", action=argparse.BooleanOptionalAction, default=False,
                   help="list paths that step straight back along an inverse (r . r^-1). "
                        "Left out by default: every edge can be walked there and back, so they "
                        "hold the most walks and would fill the list, yet they mostly return to "
                        "where they started and imply no relation (confidence ~0)")
    s.add_argument("--min-support", type=int, default=1,
                   help="fewest walks a path needs, 1..2^53 (default 1)")
    s.add_argument("--beam", type=int, default=200,
                   help="paths of each length extended to the next, and scored by "
                        "--rank confidence (default 200)")
    s.add_argument("--max-pairs", type=int, default=20_000_000,
                   help="most node pairs a path may join for its confidence (default "
                        "20000000; about 100 bytes each)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (subcommands with their own ``--help``)."""
    from . import __version__

    p = _Parser(prog=PROG, description="structconv: every convolution is y = Σ_k A_kᵀ x Θ_k. "
                "Train, evaluate, benchmark and verify structured convolutions.")
    p.add_argument("--version", action="version", version=f"structconv {__version__}")
    _common(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def cmd(name, help_):
        s = sub.add_parser(name, help=help_, description=help_)
        _common(s)
        return s

    s = cmd("demo", "the main job: a grid, a graph and an attention model on data that ships "
                    "with the dependencies; prints one table")
    s.add_argument("--quick", action="store_true", help="tiny settings (a smoke test)")
    s.add_argument("--only", default="grid,graph,attention",
                   help="comma-separated subset of grid, graph, attention")
    s.add_argument("--progress", action="store_true", help="show progress bars")

    _train_arguments(cmd("train", "train a model described by a TOML config (with key=value "
                                  "overrides)"))

    s = cmd("eval", "evaluate a trained run directory on a split")
    s.add_argument("run", help="run directory written by structconv train")
    s.add_argument("--split", default="test", help="train, val or test (default test)")
    _allow_imports_argument(s, "the run directory")
    s.add_argument("--weights", default="best",
                   help="best (default), last (the last checkpoint) or a safetensors file")

    s = cmd("bench", "run a benchmark suite (structconv.bench.NAME) or all of them")
    s.add_argument("name", nargs="?", metavar="NAME",
                   help=f"a suite or 'all': {', '.join(_known('bench'))}")
    s.add_argument("args", nargs=argparse.REMAINDER, metavar="...",
                   help="suite options (--quick, --repeats N, ... see bench NAME --help)")

    s = cmd("reproduce", "run an experiment recipe (structconv.experiments.NAME)")
    s.add_argument("name", nargs="?", metavar="NAME",
                   help=f"a recipe: {', '.join(_known('experiments'))}")
    s.add_argument("args", nargs=argparse.REMAINDER, metavar="...",
                   help="the recipe's options (see reproduce NAME --help)")

    s = cmd("plot-basis", "plot the matrices of a basis (structconv.plots)")
    s.add_argument("args", nargs=argparse.REMAINDER, help="plot options, e.g. grid ...")

    s = cmd("verify", "check the paper's propositions and the equivalences with torch/PyG on "
                      "random data; prints a pass/fail table")
    s.add_argument("--quick", action="store_true", help="fewer random trials")

    _kg_arguments(cmd("kg", "knowledge-graph tools: `kg sorts DATASET` lists the random-walk "
                            "sorts (relation paths) of a dataset's training graph by name"))
    cmd("configs", "list the example configs shipped with structconv")
    cmd("datasets", "list the registered datasets: present or missing in the data home "
                    "($STRUCTCONV_DATA, else ~/.cache/structconv/datasets) and where each "
                    "one's files go")
    return p


# -- commands ------------------------------------------------------------------------------------
def _seed(args, default=0) -> int:
    return default if args.seed is None else args.seed


def _cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def _train_worker(cfg, out, device, resume, progress, stop_after, allow_imports=False):
    # rank 0 writes result.json into the run directory, which the parent then reads; the parent
    # holds the run's lock
    from .training import train
    from .training.interrupt import TrainingInterrupted

    try:
        train(cfg, out, device=device, resume=resume, progress=progress, stop_after=stop_after,
              lock=False, allow_imports=allow_imports)
    except TrainingInterrupted:
        pass  # the checkpoint is written: a clean stop, which the parent reports


def _ranking_rows(prefix: str, m: dict) -> list[tuple[str, str]]:
    """Table rows of a filtered + raw ranking (``sc.kg.evaluate``'s dict)."""
    return [(f"{prefix}{'raw ' if raw else ''}{name}", f"{m[f'{raw}{key}']:.4f}")
            for raw in ("", "raw_") for key, name in
            (("mrr", "MRR"), ("hits@1", "Hits@1"), ("hits@3", "Hits@3"), ("hits@10", "Hits@10"))]


def _resume_hint(args, cfg, out) -> str:
    """The command that continues run ``out`` (``cfg`` None: a resumed run, whose
    imports, if any, this command was allowed)."""
    from .training import resume_command

    cmd = resume_command(out, cfg or {}, args.nproc)
    return cmd + (" --allow-imports" if args.allow_imports and cfg is None else "")


def _print_result(res: dict, out, hint: str) -> None:
    if res.get("interrupted"):
        print(f"stopped after epoch {res['epoch']}; resume with: {hint}")
        return
    rows = [("model", res["model"]), ("dataset", res["dataset"]),
            ("parameters", f"{res['parameters']:,}"), ("epochs", res["epochs"]),
            ("best epoch", res["best_epoch"])]
    if res.get("task") == "link":  # filtered ranking of the full valid and test sets
        rows += [("val MRR", f"{res['val_mrr']:.4f}")] + _ranking_rows("test ", res["test"])
    else:
        rows += [("val acc", f"{res['val_acc']:.4f}"), ("val loss", f"{res['val_loss']:.4f}")]
        if res["test_acc"] is not None:
            rows += [("test acc", f"{res['test_acc']:.4f}"),
                     ("test loss", f"{res['test_loss']:.4f}")]
        if "test_per" in res:  # a sequence-to-sequence model: its decoding of every word
            how = "greedy" if res["beam"] == 1 else f"beam {res['beam']}"
            rows += [(f"{s} PER / WER", f"{res[f'{s}_per']:.2f} / {res[f'{s}_wer']:.2f} % "
                                        f"({how})") for s in ("val", "test")]
    rows += [("train time", f"{res['train_time_s']:.1f} s"), ("run directory", str(out))]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")


def _train_target(args) -> tuple[dict | None, Path]:
    """The config (None when resuming) and run directory of ``structconv train``."""
    from .config import load_config

    if args.resume:
        if args.config or args.overrides:
            raise UsageError("train --resume DIR continues a run with its saved config; "
                             "do not pass --config or overrides")
        if args.out and Path(args.out) != Path(args.resume):
            raise UsageError("train --resume DIR writes into DIR; drop --out")
        out = Path(args.resume)
        if not out.is_dir():
            raise UsageError(f"--resume {out}: run directory not found")
        return None, out
    if not args.config:
        raise UsageError("train needs --config FILE (or --resume DIR)")
    cfg = load_config(args.config, args.overrides)
    if args.seed is not None:
        cfg["seed"] = args.seed
    name = cfg.get("name") or Path(args.config).stem
    cfg["name"] = name
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not args.out:
        # torchrun's processes would each pick their own timestamped directory
        raise UsageError("under torchrun, give the run directory with --out DIR")
    from .training import default_run_dir

    return cfg, Path(args.out) if args.out else default_run_dir(name)


def _check_nproc(args) -> None:
    if args.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {args.nproc}")
    if args.device.startswith("cuda"):
        import torch

        if args.nproc > 1 and torch.cuda.device_count() < args.nproc:
            raise UsageError(f"--nproc {args.nproc} on cuda needs {args.nproc} GPUs, found "
                             f"{torch.cuda.device_count()}")
    elif args.nproc > (os.cpu_count() or 1):
        raise UsageError(f"--nproc {args.nproc} exceeds the {os.cpu_count()} CPU cores of this "
                         "machine: each process needs a core of its own")


def _train_processes(args, cfg, out: Path, progress) -> dict:
    """``--nproc N``: N data-parallel worker processes; their result from the run directory.
    The parent holds the run's lock; on SIGINT / SIGTERM the workers stop at a batch boundary
    after a checkpoint and the parent raises ``TrainingInterrupted``."""
    from .io import RunLock
    from .training import prepare_run
    from .training.distributed import SpawnError, spawn
    from .training.interrupt import StopRequest, TrainingInterrupted

    with RunLock(out, f"structconv train --nproc {args.nproc}") as lock, \
            StopRequest() as stop:
        if cfg is not None:
            # the workers must not race to create the run; validate it once here
            prepare_run(out, cfg, False)
        lock.acquire()
        result_path = out / "result.json"
        # CUDA cannot be used in forked children once the driver is initialised: spawn there
        try:
            spawn(args.nproc, _train_worker, cfg, str(out), args.device, bool(args.resume),
                  progress, args.stop_after, args.allow_imports, stop=stop,
                  start_method="spawn" if args.device.startswith("cuda") else None)
        except SpawnError as e:
            # the last checkpoint is intact (atomic writes): say how to go on from it
            if (out / "checkpoint.json").is_file():
                raise SpawnError(f"{e}; resume from the last checkpoint with: "
                                 f"{_resume_hint(args, cfg, out)}") from None
            raise
        if result_path.is_file():
            return json.loads(result_path.read_text())
        if stop.requested:
            raise TrainingInterrupted(stop.signum, f"interrupted by "
                                      f"{StopRequest.name(stop.signum)}: checkpoint saved in "
                                      f"{out}; resume with: {_resume_hint(args, cfg, out)}")
        return {"interrupted": True, "epoch": "?"}


def _cmd_train(args) -> int:
    cfg, out = _train_target(args)
    _check_nproc(args)
    from .training import check_world_size, prepare_run, resolve_device

    resolve_device(args.device)
    if args.nproc > 1:  # refused here, before any worker starts
        check_world_size(cfg if cfg is not None else
                         prepare_run(out, None, True, args.allow_imports), args.nproc)
    # on by default: a bar on a terminal, a line every 30 s in a log or a pipe
    progress = True if args.progress is None else args.progress
    if args.nproc > 1:
        res = _train_processes(args, cfg, out, progress)
    else:
        from .training import train
        from .training.distributed import cleanup, world

        res = train(cfg, out, device=args.device, resume=bool(args.resume), progress=progress,
                    stop_after=args.stop_after, allow_imports=args.allow_imports)
        main_rank = world().main
        cleanup()
        if not main_rank:  # torchrun: one table, from rank 0
            return 0
    _print_result(res, out, _resume_hint(args, cfg, out))
    return 0


def _cmd_eval(args) -> int:
    from .config import is_link
    from .io import atomic_write_json
    from .training import count_parameters, decode_result, evaluate, load_run

    if args.split not in ("train", "val", "test"):
        raise UsageError(f"--split must be train, val or test, got {args.split!r}")
    cfg, data, model = load_run(args.run, args.weights, args.device, args.allow_imports)
    if is_link(cfg):
        return _eval_link(args, cfg, data, model)
    t0 = time.perf_counter()
    m = evaluate(model, data, cfg, args.split)
    if data.task == "g2p":  # and the error rates of decoding every word of the split
        m.update(decode_result(model, data, cfg, (args.split,)))
    dt = time.perf_counter() - t0
    res = {"run": str(args.run), "split": args.split, "weights": args.weights,
           "parameters": count_parameters(model), **m, "time_s": round(dt, 4)}
    print(f"{'run':<10}  {args.run}\n{'split':<10}  {args.split} ({m['n']} items)\n"
          f"{'parameters':<10}  {res['parameters']:,}\n{'loss':<10}  {m['loss']:.4f}\n"
          f"{'accuracy':<10}  {m['acc']:.4f}")
    if data.task == "g2p":
        how = "greedy" if m["beam"] == 1 else f"beam {m['beam']}"
        print(f"{'PER / WER':<10}  {m[f'{args.split}_per']:.2f} / {m[f'{args.split}_wer']:.2f} %"
              f" ({how})")
    out = Path(args.out) if args.out else Path(args.run)
    atomic_write_json(out / f"eval-{args.split}.json", res)
    return 0


def _eval_link(args, cfg: dict, data, model) -> int:
    """``eval`` of a link-prediction run: filtered and raw MRR / Hits@1/3/10 of the whole
    split, both directions, filtered by train + valid + test."""
    from .io import atomic_write_json
    from .training import count_parameters, evaluate_link

    t0 = time.perf_counter()
    m = evaluate_link(model, data, cfg, args.split)
    res = {"run": str(args.run), "split": args.split, "weights": args.weights,
           "parameters": count_parameters(model), **m,
           "time_s": round(time.perf_counter() - t0, 4)}
    rows = [("run", str(args.run)), ("split", f"{args.split} ({m['n']} rankings, both "
                                              "directions, filtered by train+valid+test)"),
            ("parameters", f"{res['parameters']:,}")] + _ranking_rows("", m) + \
        [("MR", f"{m['mr']:.1f}"), ("raw MR", f"{m['raw_mr']:.1f}")]
    w = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{w}}  {v}" for k, v in rows))
    out = Path(args.out) if args.out else Path(args.run)
    atomic_write_json(out / f"eval-{args.split}.json", res)
    return 0


def _suite_parser(prog: str, module, out_default: str) -> argparse.ArgumentParser:
    from .experiments._common import COUNT, SEED

    doc = (getattr(module, "__doc__", None) or "").strip()
    p = _Parser(prog=prog, conflict_handler="resolve",
                description=" ".join(doc.split("\n\n")[0].split()) or None)
    p.add_argument("--out", default=out_default, help=f"output directory (default {out_default})")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    p.add_argument("--repeats", type=COUNT, default=5, help="timing repeats (median)")
    p.add_argument("--seed", type=SEED, default=0, help="random seed")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    if hasattr(module, "add_arguments"):
        module.add_arguments(p)
    return p


def _import_suite(package: str, name: str, known) -> object:
    if not name.replace("_", "").replace("-", "").isalnum():
        raise UsageError(f"bad name {name!r}; known: {', '.join(known) or '(none installed)'}")
    mod = name.replace("-", "_")
    if name.replace("_", "-") not in known and mod in _shared(package):
        raise UsageError(f"{name!r} is a shared module, not a "
                         f"{'benchmark suite' if package == 'bench' else 'recipe'}; "
                         f"known: {', '.join(known)}")
    try:
        return importlib.import_module(f"structconv.{package}.{mod}")
    except ModuleNotFoundError as e:
        if e.name in (f"structconv.{package}.{mod}", f"structconv.{package}"):
            what = "benchmark suite" if package == "bench" else "experiment"
            raise UsageError(f"unknown {what} {name!r}; known: "
                             f"{', '.join(known) or '(none installed)'}") from None
        raise


def parse_suite(package: str, name: str, rest: list[str], args=None, check: bool = True):
    """(module, options) of ``structconv bench|reproduce NAME REST``, every option checked
    (exit 2 naming it) before anything runs; ``check`` runs the module's
    ``check_arguments`` too (the checks that join options). ``--quick`` changes defaults only
    (the module's ``QUICK``): a value given on the command line is kept."""
    module = _import_suite(package, name, _known(package))
    command = "bench" if package == "bench" else "reproduce"
    p = _suite_parser(f"{PROG} {command} {name}", module, "bench-results" if package == "bench"
                      else "runs")
    # options given before the suite name apply too, unless repeated after it (checked alike)
    front = [f"--{k}={v}" for k in ("seed", "device", "out")
             if (v := getattr(args, k, None)) is not None and f"--{k}" not in rest]
    argv = [*front, *rest]
    ns = p.parse_args(argv)
    if getattr(ns, "quick", False) and getattr(module, "QUICK", None):
        p.set_defaults(**module.QUICK)
        ns = p.parse_args(argv)
    if check and hasattr(module, "check_arguments"):
        try:
            module.check_arguments(ns)
        except ValueError as e:
            raise UsageError(f"{str(e).splitlines()[0]} (see {p.prog} --help)") from None
    return module, ns


def _run_suites(package: str, names, rest, args, out_default) -> int:
    status = 0
    for name in names:
        module, ns = parse_suite(package, name, rest, args)
        if getattr(ns, "device", "cpu") != "cpu":
            from .training import resolve_device

            resolve_device(ns.device)
        if package == "bench":
            from .bench._util import begin, steady_allocator

            begin()
            if steady_allocator():
                print("allocator: glibc mmap threshold 32 MiB, trim threshold 1 GiB "
                      "(steady timings; see structconv.bench._util.steady_allocator)")
        if package == "bench":
            rc = module.run(ns)
        else:  # a recipe says it is working at least every 10 s
            from .experiments._common import heartbeat

            with heartbeat(f"reproduce {name}"):
                rc = module.run(ns)
        status = status or int(rc or 0)
    return status


def suite_main(command: str, name: str, argv: list[str] | None = None) -> int:
    """Standalone entry point of a bench or experiment module (``python benchmarks/bench_X.py``):
    the same parser, defaults and error handling as ``structconv COMMAND NAME``."""
    return main([command, name, *(sys.argv[1:] if argv is None else argv)])


def _known(package: str) -> list[str]:
    """The names ``bench`` / ``reproduce`` take, spelt with hyphens (underscores work too)."""
    mod = importlib.import_module(f"structconv.{package}")
    for attr in ("SUITES", "EXPERIMENTS"):
        if hasattr(mod, attr):
            return [n.replace("_", "-") for n in getattr(mod, attr)]
    import pkgutil

    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(mod.__path__)
                  if not m.name.startswith("_") and m.name not in _shared(package))


def _shared(package: str) -> tuple:
    """The modules of ``package`` shared by its entries, not entries themselves."""
    return tuple(getattr(importlib.import_module(f"structconv.{package}"), "SHARED", ()))


def _need_name(command: str, name) -> None:
    if name is None:
        what = "a suite or 'all'" if command == "bench" else "a recipe"
        raise UsageError(f"{command} needs NAME, {what}: "
                         f"{', '.join(_known('bench' if command == 'bench' else 'experiments'))}"
                         f" (see {PROG} {command} --help)")


def _bench_all_help(names: list[str]) -> str:
    """``bench all --help``: the options every suite takes, then each suite and its own."""
    common = _suite_parser(f"{PROG} bench all", None, "bench-results")
    common.description = ("run every benchmark suite in turn with the options below; an "
                          "option of one suite is refused unless every suite takes it")
    parts = [common.format_help(), "suites (each also runs alone: "
                                   f"{PROG} bench NAME [options]):"]
    for name in names:
        module = _import_suite("bench", name, names)
        doc = (module.__doc__ or "").strip().splitlines()
        parts.append(f"\n  {name}: {doc[0].split(': ', 1)[-1] if doc else ''}")
        if hasattr(module, "add_arguments"):
            own = argparse.ArgumentParser(usage=argparse.SUPPRESS, add_help=False)
            module.add_arguments(own)
            text = own.format_help().replace("options:\n", "", 1).rstrip()
            parts.append("\n".join("  " + line for line in text.splitlines() if line.strip()))
    return "\n".join(parts) + "\n"


def _cmd_bench(args) -> int:
    _need_name("bench", args.name)
    names = _known("bench") if args.name == "all" else [args.name]
    if args.name == "all":
        names = [n for n in names if importlib.util.find_spec(f"structconv.bench.{n}")]
        if not names:
            raise UsageError("no benchmark suites are installed")
        if {"-h", "--help"} & set(args.args):
            print(_bench_all_help(names), end="")
            return 0
        for name in names:  # every suite's options checked before the first one runs
            module = _import_suite("bench", name, names)
            _suite_parser(f"{PROG} bench {name}", module, "bench-results").parse_args(args.args)
    return _run_suites("bench", names, args.args, args, "bench-results")


def _cmd_reproduce(args) -> int:
    _need_name("reproduce", args.name)
    return _run_suites("experiments", [args.name], args.args, args, "runs")


def _cmd_plot(args) -> int:
    from . import plots
    p = _Parser(prog=f"{PROG} plot-basis", conflict_handler="resolve",
                description="plot the matrices of a basis")
    p.add_argument("--out", default="plots", help="output directory (default plots)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    plots.add_plot_arguments(p)
    ns = p.parse_args(args.args)
    if args.out is not None and "--out" not in args.args:
        ns.out = args.out
    return int(plots.run_plot(ns) or 0)


def _cmd_verify(args) -> int:
    from .verify import run_verify

    return run_verify(seed=_seed(args), quick=args.quick, device=args.device, out=args.out)


class _Progress:
    """A status line on stderr at most every ``every`` seconds, once the work has run that
    long: long mining tells the user it is alive, short runs print nothing extra."""

    def __init__(self, what: str, every: float = 5.0):
        self.what, self.every = what, every
        self.t0 = self.last = time.monotonic()

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            print(f"{PROG} {self.what}: {message} ({now - self.t0:.0f} s)", file=sys.stderr,
                  flush=True)


def _check_kg_arguments(args) -> None:
    from .basis.mining import MAX_SUPPORT

    for flag, v, lo, hi in (("--max-length", args.max_length, 1, 4),
                            ("--min-length", args.min_length, 1, args.max_length),
                            ("--top", args.top, 1, None), ("--beam", args.beam, 1, None),
                            ("--min-support", args.min_support, 1, MAX_SUPPORT),
                            ("--max-pairs", args.max_pairs, 1, None)):
        if v < lo or (hi is not None and v > hi):
            want = f">= {lo}" if hi is None else f"in {lo}..{hi}"
            raise UsageError(f"{flag} must be an int {want}, got {v}")


def _cmd_kg(args) -> int:
    from .data.registry import load_dataset
    from .kg import mine_sorts, training_graph

    _check_kg_arguments(args)
    data = load_dataset(args.dataset.lower(), args.root)
    ei, et, n, names = training_graph(data)
    t0 = time.perf_counter()
    mined = mine_sorts(ei, et, n, relations=names, max_length=args.max_length,
                       min_length=args.min_length, top=args.top, rank=args.rank,
                       min_support=args.min_support, backtrack=args.backtrack,
                       beam=args.beam, max_pairs=args.max_pairs,
                       num_relations=len(names) if names else None,
                       progress=_Progress("kg sorts"))
    if args.json:
        print(json.dumps([m.as_dict() for m in mined], indent=1))
        return 0
    print(f"{data.name}: {n} nodes, {ei.shape[1]} training edges, "
          f"{len(names) if names else int(et.max()) + 1} edge types (inverses included); "
          f"{len(mined)} paths by {args.rank}"
          f"{'' if args.backtrack else ' (no r . r^-1 backtracking; --backtrack lists them)'}"
          f" in {time.perf_counter() - t0:.1f} s")
    print(f"{'support':>10} {'pairs':>9} {'conf':>6}  path  =>  most linked relation")
    for m in mined:
        conf = "-" if m.confidence is None else f"{m.confidence:.3f}"
        pairs = "-" if m.pairs is None else str(m.pairs)
        print(f"{m.support:>10} {pairs:>9} {conf:>6}  {m.name}  =>  {m.head_name or '-'}")
    return 0


def _cmd_configs(args) -> int:
    from .config import load_config, shipped_configs

    for name, path in shipped_configs().items():
        cfg = load_config(path)
        print(f"{name:<26} data={cfg['data']['name']:<16} {cfg.get('description', '')}")
    return 0


def _dataset_row(name: str) -> tuple[str, str, str]:
    """(status, where its files go, description) of one registered dataset."""
    from .data.registry import DATASETS, dataset_dir, missing_files

    _, folder, desc = DATASETS[name]
    if folder is None:
        return "ships", "with its Python dependencies", desc
    missing = missing_files(name)
    d = dataset_dir(name)
    where = f"{d}/" if d is not None else f"<data home>/{folder}/"
    if not missing:
        return "present", where, desc
    more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
    return "missing", f"{where}  needs {', '.join(missing[:3])}{more}", desc


def _cmd_datasets(args) -> int:
    from .data.registry import data_root, data_root_source, dataset_names

    root = data_root()
    print(f"data home: {root if root is not None else '(none: set STRUCTCONV_DATA)'} "
          f"({data_root_source()})")
    rows = [(name, *_dataset_row(name)) for name in dataset_names()]
    w = max(len(r[0]) for r in rows)
    for name, status, where, desc in rows:
        print(f"{name:<{w}}  {status:<7}  {desc}\n{'':<{w}}  {'':<7}  {where}")
    return 0


_COMMANDS = {"demo": _cmd_demo, "train": _cmd_train, "eval": _cmd_eval, "bench": _cmd_bench,
             "reproduce": _cmd_reproduce, "plot-basis": _cmd_plot, "verify": _cmd_verify,
             "configs": _cmd_configs, "datasets": _cmd_datasets, "kg": _cmd_kg}


def _user_errors() -> tuple:
    from ._extras import MissingExtra
    from .training.checkpoint import CheckpointError
    from .training.distributed import SpawnError

    # ValueError covers ConfigError, DatasetError, TrainingError, CheckpointError, UsageError
    # and KindError; MissingExtra names the extra to install
    return (ValueError, TypeError, OSError, CheckpointError, SpawnError, MissingExtra)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``structconv`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = os.environ.get("STRUCTCONV_DEBUG", "") not in ("", "0")
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return 0
        rc = _COMMANDS[args.command](args)
        return int(rc or 0)
    except SystemExit as e:  # --help / --version, and suites that call sys.exit
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt as e:
        from .training.interrupt import TrainingInterrupted

        if isinstance(e, TrainingInterrupted):  # stopped cleanly: what was saved, how to go on
            print(f"{PROG}: {e}", file=sys.stderr)
            return e.exit_code
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            raise
        user = isinstance(e, _user_errors())
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, (OSError,)) and getattr(e, "filename", None) and \
                str(e.filename) not in msg:
            msg = f"{msg}: {e.filename}"
        if user:
            print(f"{PROG}: error: {msg}", file=sys.stderr)
            return 2
        print(f"{PROG}: internal error: {type(e).__name__}: {msg} "
              "(set STRUCTCONV_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Data-parallel training on torch.distributed: gloo on CPU, nccl on GPU.

Processes come from ``torchrun`` (which sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_*) or from
``spawn(nproc, fn, ...)``, which starts ``nproc`` local processes on a free localhost port.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["World", "world", "init", "cleanup", "free_port", "spawn", "all_reduce_sum",
           "barrier", "SpawnError", "collective_timeout"]


class SpawnError(RuntimeError):
    """A spawned worker failed; the message is the worker's one-line error."""


@dataclass(frozen=True)
class World:
    """This process's place: ``rank`` of ``size`` processes, ``local_rank`` on its machine."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def world() -> World:
    """The current world: from an initialised process group, else the torchrun environment."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(),
                     int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return World(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                 int(os.environ.get("LOCAL_RANK", 0)))


def init(device: str = "cpu") -> World:
    """Join the process group described by the environment (no-op for a single process)."""
    w = world()
    if w.size > 1 and not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(w.local_rank)
        dist.init_process_group(backend, init_method="env://", rank=w.rank, world_size=w.size,
                                timeout=datetime.timedelta(seconds=collective_timeout()))
    return world()


def collective_timeout() -> float:
    """Seconds a collective waits for the other ranks before failing: ``STRUCTCONV_DDP_TIMEOUT``
    (default 120). A stopped or hung rank then ends the run with a message instead of holding
    the others forever (torch's default is 30 minutes)."""
    raw = os.environ.get("STRUCTCONV_DDP_TIMEOUT", "120")
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"STRUCTCONV_DDP_TIMEOUT must be a number of seconds, got {raw!r}") \
            from None
    if not 0 < v <= 86400:
        raise ValueError(f"STRUCTCONV_DDP_TIMEOUT must be in (0, 86400] seconds, got {raw!r}")
    return v


def cleanup() -> None:
    """Leave the process group if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over all processes (``t`` itself when alone)."""
    if dist.is_available() and dist.is_initialized():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier() -> None:
    """Wait for every process (no-op when alone)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def free_port() -> int:
    """A TCP port on localhost that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Ask Linux to send this worker SIGTERM when its parent dies (a SIGKILLed launcher would
    otherwise leave its workers training, holding the run's files and the terminal's pipes)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl: the worker outlives its parent as before
        pass


def _worker(rank, nproc, port, errors, fn, args):
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the request took effect
        raise SystemExit(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank))
    # share the cores instead of oversubscribing them nproc times
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    try:
        fn(*args)
    except BaseException as e:  # report one line to the parent, which raises it
        errors.put((rank, f"{type(e).__name__}: {e}" if not isinstance(e, ValueError)
                    else str(e)))
        # leave at once, running no destructor: a DDP reducer freed after its peer is lost
        # deadlocks (its gloo group joins a thread that waits for the GIL held by the join)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    cleanup()


def spawn(nproc: int, fn, *args, start_method: str | None = None, stop=None) -> None:
    """Run ``fn(*args)`` in ``nproc`` processes forming one gloo/nccl group on localhost.

    ``start_method`` defaults to ``fork`` on Linux when CUDA is not initialised (the workers
    inherit the imported modules instead of importing torch again) and ``spawn`` elsewhere.
    ``stop``: the parent's ``StopRequest``; a signal the parent alone receives (a scheduler's
    SIGTERM, a ``kill``) is passed on to the workers as SIGTERM, which stop cleanly.
    """
    import torch.multiprocessing as mp

    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if start_method is None:
        fork_ok = sys.platform.startswith("linux") and not torch.cuda.is_initialized()
        start_method = "fork" if fork_ok else "spawn"
    ctx = mp.get_context(start_method)
    errors = ctx.SimpleQueue()
    # torch logs each worker it terminates after a failure; the failure is reported in one line
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    try:
        procs = mp.start_processes(_worker, args=(nproc, free_port(), errors, fn, args),
                                   nprocs=nproc, start_method=start_method, join=False)
        # after a failure the others get SIGTERM, then SIGKILL after 5 s: a stopped (SIGSTOP)
        # worker cannot act on SIGTERM, and torch's default would wait 30 s for it
        forwarded = False
        while not procs.join(timeout=0.5, grace_period=5):
            if stop is not None and stop.requested and not forwarded:
                # SIGTERM, never a second SIGINT: a worker that already has the terminal's
                # SIGINT would take a second one as "stop now" and lose its step
                for proc in procs.processes:
                    if proc.is_alive():
                        os.kill(proc.pid, signal.SIGTERM)
                forwarded = True
    except mp.ProcessExitedException as e:
        raise SpawnError(_lost(e, errors)) from None


def _lost(e, errors) -> str:
    """One line on why a spawned group failed: a rank that died by a signal is named as the
    cause (the survivors' "connection reset" or timeout is only its consequence)."""
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    if getattr(e, "signal_name", None):
        return (f"rank {e.error_index} was lost (killed by {e.signal_name}); the other ranks "
                "stopped with it")
    timed_out = [(r, m) for r, m in msgs if "timed out" in m.lower() or "timeout" in m.lower()]
    if timed_out:
        r = timed_out[0][0]
        return (f"a rank stopped responding: rank {r} waited {collective_timeout():g} s for a "
                "collective (STRUCTCONV_DDP_TIMEOUT) and gave up")
    if msgs:
        rank, msg = sorted(msgs)[0]
        return f"{msg} (rank {rank})"
    return f"a worker process failed: {e}"

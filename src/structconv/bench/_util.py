"""Timing and peak-memory helpers shared by the benchmark suites."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable

import torch

#: what ``steady_allocator`` set, for the suites' reports
ALLOCATOR: dict = {}


def steady_allocator() -> dict:
    """Keep freed blocks of up to 32 MiB in the process (glibc ``mallopt``); returns what was set.

    glibc hands large blocks back to the kernel on free and raises its threshold only as it
    sees them, so a run's first, second and later calls page-fault their temporaries afresh
    or not depending on what ran before: ±2x swings of the same kernel measured here. Fixing
    the thresholds up front gives every contender the same, steady allocator (blocks over
    32 MiB are still mapped per call, for all alike). A no-op off glibc.
    """
    if not ALLOCATOR and _mallopt(32 << 20, 1 << 30):
        ALLOCATOR.update(mmap_threshold=32 << 20, trim_threshold=1 << 30)
    return ALLOCATOR


def _glibc():
    """The C library when it is glibc on Linux (its allocator knobs), else None."""
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def _trim() -> None:
    """Hand every free heap page back to the kernel (glibc ``malloc_trim``), so that what runs
    next faults in fresh pages instead of reusing resident free ones; a no-op elsewhere."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def _mallopt(mmap_threshold: int, trim_threshold: int) -> bool:
    """Set glibc's mmap and trim thresholds (fixed, no dynamic adjustment); False elsewhere."""
    libc = _glibc()
    if libc is None:
        return False
    m_trim, m_mmap = -1, -3  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
    return libc.mallopt(m_mmap, mmap_threshold) == 1 and libc.mallopt(m_trim, trim_threshold) == 1


def median_time(fn: Callable[[], object], repeats: int = 7, warmup: int = 2,
                min_time: float = 0.0) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs, in seconds.

    With ``min_time``, each sample loops ``fn`` until it has run for that long (short kernels).
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        samples.append(dt / n)
    return statistics.median(samples)


def interleaved_samples(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1,
                        min_time: float = 0.0, warm_each: bool = True) -> dict[str, list[float]]:
    """Seconds per call of each function, ``repeats`` samples each, taken in interleaved rounds.

    Alternating the candidates within each round keeps slow drifts of a shared, noisy machine
    from favouring whichever ran first; with ``warm_each`` one untimed call before each sample
    keeps the previous candidate's large temporaries (freed to the OS, re-faulted) out of the
    next one's time.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            samples[k].append(median_time(fn, repeats=1, warmup=int(warm_each),
                                          min_time=min_time))
    return samples


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1,
                      min_time: float = 0.0) -> dict[str, float]:
    """Median seconds per call of each function over interleaved samples (see above)."""
    samples = interleaved_samples(fns, repeats, warmup, min_time)
    return {k: statistics.median(v) for k, v in samples.items()}


def fwd_bwd(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """A closure running ``fn()`` forward and a backward pass of its sum."""
    def run():
        out = fn()
        if isinstance(out, tuple):
            out = out[0]
        out.sum().backward()
    return run


def _reset_peak() -> bool:
    """Reset this process's resident high-water mark to its current size (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status_kb("VmHWM") is not None
    except OSError:
        return False


def status_kb(field: str) -> int | None:
    """A kB field of this process's /proc/self/status (VmHWM, VmRSS, ...), None if absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def _child(conn, make: Callable[[], Callable[[], object]], warmup: int = 0):
    # the closure is built in the child so that its inputs count in its own baseline.
    # One thread: GNU OpenMP's pool does not survive fork (the child would hang on its first
    # parallel region), and peak memory does not depend on the thread count.
    try:
        torch.set_num_threads(1)
        # every block over 16 KiB mapped on its own and returned on free: the resident
        # high-water mark is then the computation's live peak, not heap left by earlier frees
        _mallopt(16 << 10, 0)
        fn = make()
        for _ in range(warmup):
            fn()
        gc.collect()
        # free heap pages inherited from the parent (or left by the setup) would otherwise
        # serve the measured call's blocks without raising the resident size
        _trim()
        if _reset_peak():
            base = status_kb("VmRSS")
            fn()
            peak = status_kb("VmHWM")
        else:  # no resettable high-water mark: the peak beyond everything before
            base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            fn()
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        conn.send(max(0, peak - base) * 1024)
    except BaseException as e:  # report, never hang the parent
        conn.send(repr(e))
    finally:
        conn.close()


def peak_memory(make: Callable[[], Callable[[], object]], timeout: float = 600,
                warmup: int = 0) -> float | None:
    """Peak extra resident memory (bytes) of one call of ``make()()`` in a forked process.

    ``make`` builds the inputs and returns the closure to measure; the baseline is taken after
    building them (and after ``warmup`` unmeasured calls, which take a new process's one-time
    costs, such as lazily loaded kernels), so the figure is the memory the computation itself
    adds. CPU only; None on failure.
    """
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(child, make, warmup))
    p.start()
    child.close()
    res = parent.recv() if parent.poll(timeout) else None
    p.join(5)
    if p.is_alive():
        p.kill()
    return res if isinstance(res, (int, float)) else None


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}x"


# -- the conditions a figure was measured under ------------------------------------------------
_START: dict | None = None


def conditions() -> dict:
    """The machine now: CPU model, cores, torch threads and version, 1-minute load average."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return dict(cpu=cpu, cores=os.cpu_count(), torch_threads=torch.get_num_threads(),
                torch=torch.__version__, python=platform.python_version(),
                load_average_1min=load)


def begin() -> dict:
    """Record the conditions before a suite runs; warn on stderr when the machine is loaded.

    Memory-bound kernels slow far more than GEMMs when other jobs share the cores, so ratios
    taken under load mislead: the warning says so with the figures.
    """
    global _START
    _START = c = conditions()
    load = c["load_average_1min"]
    print(f"conditions: {c['cpu']}, {c['cores']} cores, {c['torch_threads']} torch threads, "
          f"1-minute load {load if load is None else round(load, 2)}")
    if load is not None and load > c["torch_threads"]:
        print(f"warning: the 1-minute load {load:.2f} exceeds the {c['torch_threads']} threads "
              "in use: other jobs share the cores, and figures taken under load mislead "
              "(memory-bound kernels slow far more than GEMMs); measure on a quiet machine",
              file=sys.stderr)
    return c


def record() -> dict:
    """The conditions to store with a result: those at the start, and the load at the end."""
    out = dict(_START or conditions())
    out["load_average_1min_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return out

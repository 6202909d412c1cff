"""Compiled CPU kernels, built once per machine from the C++ sources beside this file.

``causal_taps()`` is the Canon layers' causal depthwise taps in one pass over memory
(``causal_taps.cpp``: ``apply`` with its C++ autograd node, and the bare ``forward`` /
``backward``); ``structconv.nn.canon.apply_taps`` calls it on CPU float32 / float64.
``sampler()`` is the graph samplers' nested neighbour sampling and restriction
(``sampler.cpp``: ``sample``, ``restrict``), used by ``structconv.sampling`` on CPU.
The module is compiled on first use by torch's extension builder (``torch.utils.cpp_extension``,
a C++ compiler and ninja; ~30-60 s once, then loaded from torch's extension cache) under a name
that carries a hash of the source, torch's version and the flags, from a copy of the source
kept in that build's folder: an edit or another torch builds anew under another name (a stale
build is never loaded), and checkouts holding the same source share one build instead of
rebuilding each other's (ninja would, for a source at another path). Where
it cannot be built (no compiler, ``STRUCTCONV_NATIVE=0``) the caller keeps its torch ops: the
results are the same to float rounding, only slower; a failed build is warned about once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import warnings
from pathlib import Path

import torch

__all__ = ["causal_taps", "sampler", "module", "enabled"]

_lock = threading.Lock()
_built: dict = {}


def enabled() -> bool:
    """False when ``STRUCTCONV_NATIVE`` is 0 / false / no / off (the torch ops are used)."""
    return os.environ.get("STRUCTCONV_NATIVE", "1").strip().lower() not in ("0", "false", "no",
                                                                            "off")


def causal_taps():
    """The compiled causal-taps module (``apply``, ``forward``, ``backward``), or None where it
    cannot be had (see the module's docstring)."""
    return module("causal_taps")


def sampler():
    """The compiled sampler module (``sample``, ``restrict``), or None where it cannot be had."""
    return module("sampler")


def module(stem: str):
    """The compiled module of ``<stem>.cpp`` beside this file, built on first use, or None
    where it cannot be had (see the module's docstring)."""
    mod = _built.get(stem, False)
    if mod is not False:
        return mod
    if not enabled():
        return None
    with _lock:  # one build per process; torch's builder locks its folder across processes
        if stem not in _built:
            _built[stem] = _build(stem)
    return _built[stem]


def _vector_flags() -> list[str]:
    """AVX2 and FMA where torch's own kernels use them on this processor (its runtime
    dispatch says so), else the compiler's baseline: a build is named by its flags, so a
    folder of builds shared by machines of several kinds never loads code a machine lacks."""
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - an older torch: the baseline
        return []
    return ["-mavx2", "-mfma"] if cap in ("AVX2", "AVX512") else []


def build_name(stem: str, source: bytes, flags: list[str]) -> str:
    """The extension's name: the stem and a hash of the source, torch's version and the
    flags (any change is a new name, so a build of other code is never loaded)."""
    digest = hashlib.sha256(source + b"\0" + torch.__version__.encode() + b"\0"
                            + " ".join(flags).encode()).hexdigest()[:12]
    return f"structconv_{stem}_{digest}"


def _shared_source(name: str, stem: str, source: bytes) -> Path:
    """The source as a file in the build's own folder (named by its hash, so the same path
    for every checkout holding it); written once, atomically (a rewrite would look newer to
    ninja and rebuild)."""
    from torch.utils.cpp_extension import _get_build_directory

    path = Path(_get_build_directory(name, False)) / f"{stem}.cpp"
    if not path.is_file() or path.read_bytes() != source:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(source)
        os.replace(tmp, path)
    return path


def _build(stem: str, folder: Path | None = None):
    source = (folder or Path(__file__).parent).joinpath(f"{stem}.cpp").read_bytes()
    flags = ["-O3", "-fopenmp"] + _vector_flags()
    name = build_name(stem, source, flags)
    try:
        from torch.utils.cpp_extension import load

        src = _shared_source(name, stem, source)
        with _build_lock(src.parent):
            _announce(name, src)
            return load(name=name, sources=[str(src)],
                        extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # noqa: BLE001 - any failure to build means: use the torch ops
        first = (str(e).strip().splitlines() or [""])[0][:200]
        warnings.warn(f"structconv: the compiled kernel {stem!r} could not be built "
                      f"({type(e).__name__}: {first}); using torch's ops instead (same "
                      "results, slower on CPU). STRUCTCONV_NATIVE=0 skips the build.",
                      RuntimeWarning, stacklevel=3)
        return None


@contextlib.contextmanager
def _build_lock(folder: Path):
    """Hold the build folder's OS lock while torch builds there. The OS releases it when its
    process dies, so while it is held no other structconv process is building: a ``lock``
    file of torch's builder found then was left by a build killed mid-way, and is removed
    (torch's builder would otherwise wait for it forever)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's own lock file only
        yield
        return
    with open(folder / ".structconv-build.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = folder / "lock"
            if stale.exists():
                print(f"structconv: removing {stale}, left by a kernel build that was "
                      "stopped mid-way", file=sys.stderr, flush=True)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _announce(name: str, src: Path) -> None:
    """One line on stderr before a build (not when torch's cache holds the module, built from
    this source file and newer than it): a first call would otherwise stall in silence while
    the compiler runs."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        folder = Path(_get_build_directory(name, False))
        built = next(iter(folder.glob(f"{name}*.so")), None)
        ninja = folder / "build.ninja"  # names the source it was built from (ninja rebuilds
        if built is not None and built.stat().st_mtime >= src.stat().st_mtime and \
                (not ninja.is_file() or str(src) in ninja.read_text(errors="replace")):
            return  # for another path, e.g. a build of before the shared copy)
    except Exception:  # noqa: BLE001 - a torch without the helper: say it anyway
        pass
    print(f"structconv: compiling the kernel {src.name} for this machine and torch (once, "
          "~30-60 s; STRUCTCONV_NATIVE=0 uses torch's ops instead)", file=sys.stderr,
          flush=True)

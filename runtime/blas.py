"""Process set-up that must happen before `mlx.core` is first imported.

MLX's Linux CPU wheel bundles the reference BLAS (~5 GFLOP/s for a 2048x2048 f32 matmul). Loading a
fast BLAS with RTLD_GLOBAL before `mlx.core` loads makes MLX resolve its BLAS and LAPACK symbols
(`cblas_sgemm`, `sgetrf_`, ...) there (~190 GFLOP/s on 2 cores; prefill 3 -> 55-90 tok/s on the 0.5B
model). See DESIGN.md, "Linux CPU speed". The search order (`setup_blas`): `COREAI_OPENBLAS`, a system
OpenBLAS, then the `scipy-openblas32` wheel, a dependency of the Linux install (x86-64 and aarch64), so
a machine with no system package (no root, no apt step) gets OpenBLAS on every core too.

Why `scipy-openblas32`: it is the OpenBLAS that NumPy and SciPy build their wheels with, for x86-64
and aarch64, and self-contained (no libgfortran needed), but it prefixes every symbol
(`scipy_cblas_sgemm`), which MLX cannot resolve. So the first start writes a copy whose symbols have
the plain names (`runtime.elf_symbols`, about 25 MB, in `$COREAI_HOME/blas` or `~/.cache/coreai/blas`)
and loads that. The others: `cmeel-openblas` and `ngsolve-openblas` ship a standard
`libopenblas.so.0` but need the system's `libgfortran.so.5`, absent on a fresh Debian (the loader
matches DT_NEEDED by SONAME, so the mangled copy in `mlx_cpu.libs` cannot stand in). Intel's `mkl`
wheel (the dependency before issue 60, ~700 MB, x86-64 only) runs its generic code path on AMD CPUs
(`MKL_VERBOSE` names `libmkl_def` on this EPYC: ~37 GFLOP/s a core against OpenBLAS's ~80), so it
prefilled at 0.62x the system OpenBLAS; it is no longer a dependency, but still loaded when installed
and asked for (`COREAI_OPENBLAS=mkl`), sequential unless `MKL_THREADING_LAYER` says otherwise (its
OpenMP layer, spin-waiting beside MLX's threads, made the demo 10x slower on a loaded machine). Its
decode on one core was the fastest measured (an M=1 matmul 2-3x quicker than OpenBLAS's).

aarch64 Linux: the same wheel (manylinux_2_28 aarch64) is renamed the same way (ELF64 little-endian;
the renaming was checked on that wheel's file here, but it has not been loaded on an aarch64 machine),
and `mlx-cpu` needs glibc 2.35 there. The Debian path of `libopenblas0-pthread` is listed too.

Threads: a system OpenBLAS uses every core; the wheel's all cores but one (`wheel_threads` says why:
its threads busy-wait). `OPENBLAS_NUM_THREADS` overrides both. `blas_in_use()` names the library and
its thread count; `coreai serve` prints it and `/health` reports it.

This module must not import mlx. It lives in the lowest package that imports MLX: `runtime/__init__.py`
calls `setup_blas()` before anything else, and `guided` and `recipes` import `runtime` first, so any
entry point (`import coreai`, `from runtime import load_model`, `import recipes`, the tests) gets it.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("coreai")

# Debian/Ubuntu package `libopenblas0-pthread` (and the alternatives link), then common locations.
OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

# The OpenBLAS wheel (distribution, library file name, symbol prefix) and Intel's `mkl` wheel,
# whose libraries install into the environment's `lib/`, beside `python3.X/`.
SCIPY_OPENBLAS = ("scipy-openblas32", "libscipy_openblas.so", b"scipy_")
MKL_WHEEL = ("mkl", "libmkl_rt.so")

_blas: str | None = None
_done = False


def _wheel_file(distribution: str, stem: str) -> Path | None:
    """The installed file of `distribution` whose name starts with `stem`, or None."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.startswith(stem):
            return Path(os.path.realpath(file.locate()))
    return None


def cache_dir() -> Path:
    """Where the unprefixed copy of the wheel's OpenBLAS is kept: `$COREAI_HOME/blas`, else
    `~/.cache/coreai/blas` (the model cache's root, as `coreai.store.cache_root`)."""
    root = os.environ.get("COREAI_HOME") or Path.home() / ".cache" / "coreai"
    return Path(root).expanduser() / "blas"


def unprefixed_copy(source: Path, prefix: bytes, directory: Path) -> Path:
    """A copy of the library `source` in `directory` whose exported `prefix`-ed symbols have their
    plain names (`runtime.elf_symbols.unprefix`), written once (atomically: a reader never sees half a
    file) and reused while `source` keeps its size and modification time.

    Raises OSError when the directory cannot be written, ElfError for a library that cannot be renamed.
    """
    from runtime.elf_symbols import unprefix

    stat = source.stat()
    target = directory / f"{source.stem}-{stat.st_size}-{int(stat.st_mtime)}.so"
    if target.is_file():
        return target
    data = bytearray(source.read_bytes())
    unprefix(data, prefix)
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".unprefix-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from other users of a shared cache
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def wheel_blas() -> str | None:
    """The path of the fast BLAS that pip installed: the `scipy-openblas32` wheel's library as a copy
    with plain symbol names (`unprefixed_copy`), or None (not installed, or the copy could not be
    written: logged)."""
    distribution, stem, prefix = SCIPY_OPENBLAS
    source = _wheel_file(distribution, stem)
    if source is None:
        return None
    try:
        return str(unprefixed_copy(source, prefix, cache_dir()))
    except (OSError, ValueError) as exc:
        log.warning("could not make a loadable copy of %s: %s", source, exc)
        return None


def mkl_blas() -> str | None:
    """The path of the `mkl` wheel's `libmkl_rt`, if that wheel is installed (it is not a dependency)."""
    path = _wheel_file(*MKL_WHEEL)
    return str(path) if path else None


def search_order(override: str | None, candidates: Sequence[str]) -> list[str | None]:
    """What `setup_blas` tries, in order, for `COREAI_OPENBLAS=override`: unset, the system paths
    `candidates` then the wheel; `wheel`, the wheel alone (what a machine with no system OpenBLAS
    gets); `mkl`, the mkl wheel; `0`, nothing; a path, that path then as unset. Wheel entries are
    resolved here (None when absent)."""
    if override == "0":
        return []
    if override == "wheel":
        return [wheel_blas()]
    if override == "mkl":
        return [mkl_blas()]
    return ([override] if override else []) + list(candidates) + [wheel_blas()]


def setup_blas(candidates: Sequence[str] = OPENBLAS_CANDIDATES) -> str | None:
    """Load a fast BLAS globally on Linux, once per process.

    Tries the paths of `search_order(COREAI_OPENBLAS, candidates)` in turn. Returns the path of the
    loaded library, or None (macOS uses Accelerate; or none was found, in which case one warning
    names the fix). `COREAI_OPENBLAS=0` disables loading (to measure the bundled BLAS).
    """
    global _blas, _done
    if _done:
        return _blas
    _done = True
    if not sys.platform.startswith("linux"):
        return None
    if "mlx.core" in sys.modules:
        warnings.warn(
            "mlx.core was imported before runtime/coreai: the system OpenBLAS cannot be used in this process",
            stacklevel=2,
        )
        return None
    override = os.environ.get("COREAI_OPENBLAS")
    order = search_order(override, candidates)
    wheel = order[-1] if order and override != "mkl" else None  # the wheel is always tried last
    for path in order:
        if path and os.path.exists(path):
            if "libmkl_rt" in os.path.basename(path):
                # MKL's default OpenMP threading, called from MLX's CPU stream thread, made the demo
                # 10x slower than sequential MKL here (TTFT 16.7 s vs 1.6 s, 2 cores, loaded machine).
                os.environ.setdefault("MKL_THREADING_LAYER", "SEQUENTIAL")
            try:
                lib = ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
            except OSError as exc:
                log.debug("could not load %s: %s", path, exc)
                continue
            if path == wheel and not os.environ.get("OPENBLAS_NUM_THREADS"):
                lib.openblas_get_num_threads()  # initializes its count first, or that would undo the set
                lib.openblas_set_num_threads(wheel_threads(len(os.sched_getaffinity(0))))
            _blas = path
            log.info("BLAS: %s", blas_in_use())
            return _blas
    if override == "0":
        return None
    warnings.warn(
        "no fast BLAS found (no system OpenBLAS, no scipy-openblas32 wheel): MLX falls back to its slow "
        "reference BLAS (about 10x slower). Fix: pip install scipy-openblas32 (or reinstall coreai-mlx), "
        "apt-get install libopenblas0-pthread (Debian/Ubuntu), or set COREAI_OPENBLAS=/path/libopenblas.so.0",
        stacklevel=2,
    )
    return None


def wheel_threads(cores: int) -> int:
    """The threads the wheel's OpenBLAS gets on `cores` cores: all but one, at least one.

    Its threads wait for each other in a busy loop (the wheel's library imports no `sched_yield`; the
    system's 0.3.21 yields), so when the cores are oversubscribed a waiting thread burns the slice its
    partner needs: on 2 loaded cores (load ~5) two threads made `coreai bench` prefill 6.8 tok/s against
    16.8 on one (docs/reports/performance.md, "The BLAS pip installs"). The spare core runs MLX's
    Python thread, the grammar's mask fill beside the forward pass, the server. `OPENBLAS_NUM_THREADS`
    overrides it."""
    return max(1, cores - 1)


def blas_threads(path: str) -> tuple[str, int | None]:
    """The name (with version, for OpenBLAS) and thread count of the loaded BLAS at `path`, asked of
    the library itself (`openblas_get_config`/`openblas_get_num_threads`, MKL's
    `MKL_Get_Max_Threads` and threading layer); the count is None when the library does not say."""
    lib = ctypes.CDLL(path, mode=os.RTLD_GLOBAL)  # already loaded: the same handle
    if hasattr(lib, "openblas_get_num_threads"):
        name = "OpenBLAS"
        if hasattr(lib, "openblas_get_config"):
            lib.openblas_get_config.restype = ctypes.c_char_p
            words = (lib.openblas_get_config() or b"").decode(errors="replace").split()
            name = " ".join(words[:2]) or name
        return name, int(lib.openblas_get_num_threads())
    if hasattr(lib, "MKL_Get_Max_Threads"):
        layer = os.environ.get("MKL_THREADING_LAYER", "INTEL").upper()
        threads = 1 if layer == "SEQUENTIAL" else int(lib.MKL_Get_Max_Threads())
        return f"MKL ({layer.lower()})", threads
    return os.path.basename(path), None


def blas_in_use() -> str:
    """A short label of the BLAS MLX uses in this process, e.g. 'OpenBLAS 0.3.34.481.3, 2 threads
    (/path/lib.so)', 'Accelerate' or 'bundled reference BLAS'."""
    if sys.platform == "darwin":
        return "Accelerate"
    if _blas is None:
        return "bundled reference BLAS"
    name, threads = blas_threads(_blas)
    count = f"{threads} thread{'s' if threads != 1 else ''}" if threads is not None else "threads unknown"
    source = " (scipy-openblas32 wheel)" if Path(_blas).parent == cache_dir() else ""
    return f"{name}, {count}{source} ({_blas})"

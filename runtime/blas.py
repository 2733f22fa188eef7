"""Process set-up that must happen before `mlx.core` is first imported.

MLX's Linux CPU wheel bundles the reference BLAS (~5 GFLOP/s for a 2048x2048 f32 matmul). Loading a
fast BLAS with RTLD_GLOBAL before `mlx.core` loads makes MLX resolve its BLAS and LAPACK symbols
(`cblas_sgemm`, `sgetrf_`, ...) there (~190 GFLOP/s; prefill 3 -> 55 tok/s on the 0.5B model). See
DESIGN.md, "Linux CPU speed". The search order: `COREAI_OPENBLAS`, a system OpenBLAS, then Intel's
`mkl` wheel, a dependency of the Linux x86-64 install, so a machine with no system package (no root,
no apt step) still runs at full speed.

Why MKL and not a smaller wheel: `cmeel-openblas` (20 MB) ships a standard `libopenblas.so.0` but
needs the system's `libgfortran.so.5`, absent on a fresh Debian (the loader matches DT_NEEDED by
SONAME, so the mangled copy in `mlx_cpu.libs` cannot stand in); `scipy-openblas32` is self-contained
but prefixes every symbol (`scipy_cblas_sgemm`), which MLX cannot resolve.

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
import warnings
from collections.abc import Sequence

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

# Intel's `mkl` wheel installs its libraries into the environment's `lib/`, beside `python3.X/`.
WHEEL_BLAS = ("mkl", "libmkl_rt.so")

_blas: str | None = None
_done = False


def wheel_blas() -> str | None:
    """The path of the BLAS shipped by an installed PyPI wheel (`WHEEL_BLAS`), or None."""
    distribution, stem = WHEEL_BLAS
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.startswith(stem):
            return os.path.realpath(file.locate())
    return None


def setup_blas(candidates: Sequence[str] = OPENBLAS_CANDIDATES) -> str | None:
    """Load a fast BLAS globally on Linux, once per process.

    Tries `COREAI_OPENBLAS`, then `candidates` (system OpenBLAS paths), then the wheel's (`wheel_blas`).
    Returns the path of the loaded library, or None (macOS uses Accelerate; or none was found, in
    which case one warning names the fix). `COREAI_OPENBLAS=0` disables loading (to measure the
    bundled BLAS).
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
    if override == "0":
        return None
    for path in ([override] if override else []) + list(candidates) + [wheel_blas() or ""]:
        if path and os.path.exists(path):
            if "libmkl_rt" in os.path.basename(path):
                # MKL's default OpenMP threading, called from MLX's CPU stream thread, made the demo
                # 10x slower than sequential MKL here (TTFT 16.7 s vs 1.6 s, 2 cores, loaded machine).
                os.environ.setdefault("MKL_THREADING_LAYER", "SEQUENTIAL")
            try:
                ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
            except OSError as exc:
                log.debug("could not load %s: %s", path, exc)
                continue
            _blas = path
            log.info("BLAS: %s", path)
            return _blas
    warnings.warn(
        "no fast BLAS found (no system OpenBLAS, no mkl wheel): MLX falls back to its slow reference BLAS "
        "(about 10x slower). Fix: apt-get install libopenblas0-pthread (Debian/Ubuntu), pip install mkl "
        "(x86-64), or set COREAI_OPENBLAS=/path/libopenblas.so.0",
        stacklevel=2,
    )
    return None


def blas_in_use() -> str:
    """A short label of the BLAS MLX uses in this process: a library path, 'Accelerate' or 'bundled reference BLAS'."""
    if sys.platform == "darwin":
        return "Accelerate"
    return _blas or "bundled reference BLAS"

"""Process set-up that must happen before `mlx.core` is first imported.

MLX's Linux CPU wheel bundles the reference BLAS (~5 GFLOP/s for a 2048x2048 f32 matmul). Loading a
system OpenBLAS with RTLD_GLOBAL before `mlx.core` loads makes MLX resolve its BLAS symbols there
(~190 GFLOP/s; prefill 3 -> 55 tok/s on the 0.5B model). See DESIGN.md, "Linux CPU speed".

This module must not import mlx. It lives in the lowest package that imports MLX: `runtime/__init__.py`
calls `setup_blas()` before anything else, and `guided` and `recipes` import `runtime` first, so any
entry point (`import coreai`, `from runtime import load_model`, `import recipes`, the tests) gets it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import warnings

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

_blas: str | None = None
_done = False


def setup_blas() -> str | None:
    """Load a system OpenBLAS globally on Linux, once per process.

    Returns the path of the loaded library, or None (macOS uses Accelerate; or none was found, in
    which case one warning names the fix). `COREAI_OPENBLAS` overrides the path; `COREAI_OPENBLAS=0`
    disables loading (to measure the bundled BLAS).
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
    for path in ([override] if override else []) + list(OPENBLAS_CANDIDATES):
        if path and os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
            except OSError as exc:
                log.debug("could not load %s: %s", path, exc)
                continue
            _blas = path
            log.info("BLAS: %s", path)
            return _blas
    warnings.warn(
        "no system OpenBLAS found: MLX falls back to its slow reference BLAS (about 10x slower). "
        "Fix: apt-get install libopenblas0-pthread (Debian/Ubuntu), or set COREAI_OPENBLAS=/path/libopenblas.so.0",
        stacklevel=2,
    )
    return None


def blas_in_use() -> str:
    """A short label of the BLAS MLX uses in this process: a library path, 'Accelerate' or 'bundled reference BLAS'."""
    if sys.platform == "darwin":
        return "Accelerate"
    return _blas or "bundled reference BLAS"

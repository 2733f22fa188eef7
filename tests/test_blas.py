"""The system BLAS is loaded whichever package a program imports first (runtime, guided, recipes,
coreai): each loads it before anything imports mlx.core."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the system OpenBLAS is a Linux set-up")
@pytest.mark.parametrize(
    "first", ["from runtime import load_model", "import guided", "import recipes", "import coreai"]
)
def test_fast_blas_whatever_is_imported_first(first):
    from runtime.blas import blas_in_use

    if blas_in_use() == "bundled reference BLAS":
        pytest.skip("no system OpenBLAS on this machine")
    code = f"{first}\nimport mlx.core\nfrom runtime.blas import blas_in_use\nprint(blas_in_use())"
    out = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "openblas" in out.stdout.lower()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the wheel BLAS is a Linux set-up")
def test_the_wheel_blas_when_no_system_openblas():
    """With no system OpenBLAS on the search path, the `mkl` wheel (a Linux x86-64 dependency) is
    loaded and MLX's matmul and LAPACK calls run through it, with no warning."""
    from runtime.blas import wheel_blas

    if wheel_blas() is None:
        pytest.fail("the mkl wheel is not installed: pyproject.toml lists it for Linux x86-64 (make install)")
    code = (
        "import importlib.util, os, sys\n"
        # runtime/blas.py alone, before the runtime package (whose import loads the system OpenBLAS)
        "spec = importlib.util.spec_from_file_location('blas', 'runtime/blas.py')\n"
        "blas = importlib.util.module_from_spec(spec); spec.loader.exec_module(blas)\n"
        "print(blas.setup_blas(candidates=()))\n"
        "import mlx.core as mx\n"
        "a = mx.random.normal((64, 64))\n"
        "mx.eval(mx.linalg.inv(a @ a.T + 64 * mx.eye(64), stream=mx.cpu))\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('openblas' in maps, 'libmkl_core' in maps, 'libmkl_sequential' in maps)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("COREAI_OPENBLAS", "MKL_THREADING_LAYER")}
    out = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    loaded, maps = out.stdout.splitlines()
    assert "libmkl_rt" in loaded
    # no OpenBLAS mapped; MKL's core was loaded by the calls, sequential (see runtime/blas.py)
    assert maps == "False True True"

"""The system BLAS is loaded whichever package a program imports first (runtime, guided, recipes,
coreai): each loads it before anything imports mlx.core."""

from __future__ import annotations

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

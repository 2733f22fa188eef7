"""The system BLAS is loaded whichever package a program imports first (runtime, guided, recipes,
coreai): each loads it before anything imports mlx.core."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the wheel BLAS is a Linux set-up")


def _wheel_library() -> Path:
    from runtime.blas import SCIPY_OPENBLAS, _wheel_file

    path = _wheel_file(*SCIPY_OPENBLAS[:2])
    if path is None:
        pytest.fail("scipy-openblas32 is not installed: pyproject.toml lists it for Linux (make install)")
    return path


@LINUX
def test_the_wheel_blas_when_no_system_openblas(tmp_path):
    """With no system OpenBLAS on the search path (`COREAI_OPENBLAS=wheel`), the `scipy-openblas32` wheel
    (a Linux dependency) is loaded from its unprefixed copy, MLX's matmul and LAPACK calls run through it
    (right answers, no other BLAS mapped), with no warning, and its label names OpenBLAS and its threads,
    after MLX has run (OpenBLAS's own start-up must not undo the count)."""
    code = (
        "import runtime.blas as blas\n"  # COREAI_OPENBLAS=wheel: the system paths are not tried
        "print(blas.setup_blas())\n"
        "import mlx.core as mx\n"
        "a = mx.random.normal((64, 64))\n"
        "eye = mx.linalg.inv(a @ a.T + 64 * mx.eye(64), stream=mx.cpu) @ (a @ a.T + 64 * mx.eye(64))\n"
        "print(bool(mx.allclose(eye, mx.eye(64), atol=1e-4)))\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('libopenblas.so' in maps, 'libmkl' in maps)\n"
        "print(blas.blas_in_use())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env |= {"COREAI_HOME": str(tmp_path), "COREAI_OPENBLAS": "wheel"}
    out = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    loaded, right, maps, label = out.stdout.splitlines()
    assert loaded.startswith(str(tmp_path / "blas" / "libscipy_openblas-"))
    assert right == "True"
    assert maps == "False False"  # neither the system OpenBLAS nor MKL
    threads = max(1, len(os.sched_getaffinity(0)) - 1)  # wheel_threads: all cores but one
    assert label.startswith("OpenBLAS 0.3.") and f", {threads} thread" in label, label
    assert "(scipy-openblas32 wheel)" in label
    cores = len(os.sched_getaffinity(0))
    env["OPENBLAS_NUM_THREADS"] = str(cores)  # the variable wins (OpenBLAS caps it at the cores)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert f", {cores} thread" in out.stdout.splitlines()[-1], out.stdout


def test_the_wheel_leaves_one_core():
    """The wheel's OpenBLAS busy-waits, so it gets all cores but one (at least one)."""
    from runtime.blas import wheel_threads

    assert [wheel_threads(n) for n in (1, 2, 4, 16)] == [1, 1, 3, 15]


@LINUX
def test_the_wheels_symbols_lose_their_prefix():
    """Every `scipy_` name the wheel exports is found under its plain name through the rewritten
    `.gnu.hash` (the loader's own walk), the prefixed names no longer, names it lacks not at all."""
    from runtime.elf_symbols import dynamic_symbols, lookup, unprefix

    data = bytearray(_wheel_library().read_bytes())
    before = [(name, defined) for name, defined in dynamic_symbols(data)]
    prefixed = [i for i, (name, defined) in enumerate(before) if defined and name.startswith(b"scipy_")]
    assert lookup(data, b"scipy_cblas_sgemm") is not None and lookup(data, b"cblas_sgemm") is None
    assert unprefix(data, b"scipy_") == len(prefixed) > 1000
    after = dynamic_symbols(data)
    for i in prefixed:
        assert after[i][0] == before[i][0][len(b"scipy_") :]
        assert lookup(data, after[i][0], after) == i, after[i][0]
    assert lookup(data, b"scipy_cblas_sgemm") is None
    assert lookup(data, b"cblas_sgemm") is not None and lookup(data, b"sgetrf_") is not None
    assert lookup(data, b"no_such_symbol_") is None
    # the other defined symbols (unprefixed in the wheel already) are still found
    others = [i for i, (name, defined) in enumerate(before) if defined and not name.startswith(b"scipy_")]
    assert all(lookup(data, after[i][0], after) == i for i in others if i >= 1 and after[i][0])


def test_unprefix_refuses_what_it_cannot_rename():
    from runtime.elf_symbols import ElfError, unprefix

    with pytest.raises(ElfError, match="not an ELF64"):
        unprefix(bytearray(b"MZ" + bytes(100)), b"scipy_")


@LINUX
def test_the_unprefixed_copy_is_written_once(tmp_path):
    """The copy is written on first use (readable by others: a shared cache) and reused after; a
    changed source (size or time) gets a copy of its own."""
    from runtime.blas import SCIPY_OPENBLAS, unprefixed_copy

    source = tmp_path / "libscipy_openblas.so"
    source.write_bytes(_wheel_library().read_bytes())
    first = unprefixed_copy(source, SCIPY_OPENBLAS[2], tmp_path / "blas")
    assert first.parent == tmp_path / "blas" and (first.stat().st_mode & 0o777) == 0o644
    written = first.stat().st_mtime_ns
    assert unprefixed_copy(source, SCIPY_OPENBLAS[2], tmp_path / "blas") == first
    assert first.stat().st_mtime_ns == written
    assert [p.name for p in (tmp_path / "blas").iterdir()] == [first.name]  # no temporary left
    os.utime(source, (1, 1))
    assert unprefixed_copy(source, SCIPY_OPENBLAS[2], tmp_path / "blas") != first


def test_the_search_order(monkeypatch):
    """COREAI_OPENBLAS: unset, the system paths then the wheel; `wheel`, the wheel alone (a machine
    with no system OpenBLAS); `mkl`, the mkl wheel; `0`, nothing; a path, it first."""
    from runtime import blas

    monkeypatch.setattr(blas, "wheel_blas", lambda: "/cache/wheel.so")
    monkeypatch.setattr(blas, "mkl_blas", lambda: "/env/lib/libmkl_rt.so.3")
    system = ("/usr/lib/a.so", "/usr/lib/b.so")
    assert blas.search_order(None, system) == [*system, "/cache/wheel.so"]
    assert blas.search_order("", system) == [*system, "/cache/wheel.so"]
    assert blas.search_order("wheel", system) == ["/cache/wheel.so"]
    assert blas.search_order("mkl", system) == ["/env/lib/libmkl_rt.so.3"]
    assert blas.search_order("0", system) == []
    assert blas.search_order("/opt/x.so", system) == ["/opt/x.so", *system, "/cache/wheel.so"]


def test_the_cache_dir_follows_coreai_home(monkeypatch, tmp_path):
    from runtime.blas import cache_dir

    monkeypatch.setenv("COREAI_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "blas"
    monkeypatch.delenv("COREAI_HOME")
    assert cache_dir() == Path.home() / ".cache" / "coreai" / "blas"

"""Export benchmark: wall time and peak memory of one export (printed, optionally written as JSON).

    python -m benchmarks.export ~/.cache/coreai/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python -m benchmarks.export MODEL.gguf --quantize 4bit --json bench_export.json

Target (issue 2): the default Qwen 0.5B GGUF -> float16 in at most 30 s wall and 3 GB peak memory on
a 2-core Linux machine. Peak memory is the process's maximum resident set size, which includes the
memory-mapped GGUF pages read and the interpreter with its libraries. The export does no matrix
products, so the BLAS set-up of `runtime.blas` is not needed here.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path


def peak_rss_bytes() -> int:
    """Maximum resident set size of this process so far, in bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.export", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="GGUF file or Hugging Face folder")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--quantize", default="none")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    from recipes import export  # imports (mlx, transformers) count: a user pays them too

    with tempfile.TemporaryDirectory(prefix="coreai-bench-") as tmp:
        report = export(args.source, Path(tmp) / "out", dtype=args.dtype, quantize=args.quantize, progress=False)
        wall = time.perf_counter() - start
    import mlx.core as mx

    figures = {
        "source": str(args.source),
        "dtype": args.dtype,
        "quantize": args.quantize,
        "parameters": report.parameters,
        "bytes_written": report.bytes_written,
        "export_seconds": round(report.seconds, 2),
        "wall_seconds_with_imports": round(wall, 2),
        "peak_rss_bytes": peak_rss_bytes(),
        "mlx_peak_bytes": mx.get_peak_memory(),
    }
    print(
        f"export {Path(args.source).name} -> {args.dtype}/{args.quantize}: {report.seconds:.1f} s export, "
        f"{wall:.1f} s wall with imports, peak RSS {figures['peak_rss_bytes'] / 1e9:.2f} GB, "
        f"MLX peak {figures['mlx_peak_bytes'] / 1e9:.2f} GB, {report.parameters / 1e6:.0f}M parameters, "
        f"{report.bytes_written / 1e6:.0f} MB written"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

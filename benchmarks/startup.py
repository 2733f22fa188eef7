"""Start-up time, warm cache: `coreai generate --max-tokens 1 --prompt hi` wall time, `import coreai`,
and mlx-lm's own `mlx_lm.load` of the same folder in the same run, each in a fresh process, median
of N (issue 12).

    python -m benchmarks.startup [-n 3] [--model qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def wall(args: list[str]) -> float:
    """Seconds for a fresh `python args...` to run to the end (raises if it fails)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    args = parser.parse_args(argv)
    from coreai import store  # the folder only; the timed runs import everything afresh

    folder = str(store.ensure(args.model))
    runs = {
        "import coreai": ["-c", "import coreai"],
        "coreai generate --max-tokens 1 --prompt hi": [
            "-m",
            "coreai.cli",
            "generate",
            args.model,
            "--max-tokens",
            "1",
            "--prompt",
            "hi",
        ],
        "mlx_lm.load (same folder)": ["-c", f"import mlx_lm; mlx_lm.load({folder!r})"],
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.n):  # interleaved, so machine noise hits every row alike
        for name, command in runs.items():
            times[name].append(wall(command))
    for name, values in times.items():
        print(f"{name:48s} median {statistics.median(values):6.2f} s   runs {', '.join(f'{v:.2f}' for v in values)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

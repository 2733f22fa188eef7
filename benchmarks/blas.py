"""The BLAS pip installs against the system OpenBLAS (issue 60): `coreai bench -p 2048 -g 32` once
per configuration, each in its own process, interleaved (the order alternates every repeat), medians
of the repeats, with `uptime` before and after every run.

    python -m benchmarks.blas [-n 3] [-p 2048] [-g 32] [--configs system,wheel] [--output FILE]

Configurations (`COREAI_OPENBLAS`, `runtime/blas.py`): `system` the system OpenBLAS, `wheel` the
`scipy-openblas32` wheel (what `pip install` alone gives: no system package; all cores but one),
`wheel-1t` / `wheel-all` the same on one thread / on every core, `mkl` the `mkl` wheel (sequential;
not a dependency: `pip install mkl` first), `mkl-omp` it on Intel's OpenMP layer with KMP_BLOCKTIME=0.
The goals (issue 60): wheel prefill >= 0.9x system, wheel decode >= 1.0x system.
Writes JSON to benchmarks/results/blas_<date>.json (or --output).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from runtime.blas import OPENBLAS_CANDIDATES

CONFIGS: dict[str, dict[str, str]] = {
    "system": {"COREAI_OPENBLAS": next((p for p in OPENBLAS_CANDIDATES if os.path.exists(p)), "")},
    "wheel": {"COREAI_OPENBLAS": "wheel"},
    "wheel-1t": {"COREAI_OPENBLAS": "wheel", "OPENBLAS_NUM_THREADS": "1"},
    "wheel-all": {"COREAI_OPENBLAS": "wheel", "OPENBLAS_NUM_THREADS": str(os.cpu_count() or 1)},
    "mkl": {"COREAI_OPENBLAS": "mkl", "MKL_THREADING_LAYER": "SEQUENTIAL"},
    "mkl-omp": {"COREAI_OPENBLAS": "mkl", "MKL_THREADING_LAYER": "INTEL", "KMP_BLOCKTIME": "0"},
}
METRICS = ("prefill_tps", "decode_tps", "ttft")
# Variables of the configurations, dropped from the inherited environment so each run sets its own.
CLEARED = ("COREAI_OPENBLAS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_THREADING_LAYER", "KMP_BLOCKTIME")


def uptime() -> str:
    """`uptime`'s line (the load averages over 1, 5 and 15 minutes)."""
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def bench_once(config: str, prompt_tokens: int, gen_tokens: int) -> dict:
    """One `coreai bench -p P -g G -n 1` in a fresh process under `config`'s environment: the BLAS
    it named, coreai's and mlx-lm's prefill/decode tok/s and TTFT, and the load before and after."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED} | CONFIGS[config]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        before = uptime()
        command = [sys.executable, "-m", "coreai", "bench", "-p", str(prompt_tokens), "-g", str(gen_tokens)]
        subprocess.run([*command, "-n", "1", "--output-json", str(out)], check=True, env=env, capture_output=True)
        after = uptime()
        report = json.loads(out.read_text())
    median = report["median"]
    return dict(
        config=config,
        blas=report["machine"]["blas"],
        coreai={k: median["coreai"][k] for k in METRICS},
        mlx_lm={k: median["mlx_lm"][k] for k in METRICS},
        uptime_before=before,
        uptime_after=after,
    )


def summarize(runs: list[dict], configs: list[str]) -> dict:
    """Per configuration: the median of each metric (coreai's), and the wheel's ratios to the system's."""
    medians = {
        c: {k: statistics.median(r["coreai"][k] for r in runs if r["config"] == c) for k in METRICS} for c in configs
    }
    ratios = {
        c: {k: medians[c][k] / medians["system"][k] for k in ("prefill_tps", "decode_tps")}
        for c in configs
        if c != "system" and "system" in medians
    }
    goals = {}
    if "wheel" in ratios:
        goals = dict(
            prefill_within_10pct=ratios["wheel"]["prefill_tps"] >= 0.9,
            decode_at_least_system=ratios["wheel"]["decode_tps"] >= 1.0,
        )
    return dict(median=medians, ratio_over_system=ratios, goals=goals)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--repeats", type=int, default=3)
    parser.add_argument("-p", "--prompt-tokens", type=int, default=2048)
    parser.add_argument("-g", "--gen-tokens", type=int, default=32)
    parser.add_argument("--configs", default="system,wheel", help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    if "system" in configs and not CONFIGS["system"]["COREAI_OPENBLAS"]:
        parser.error("no system OpenBLAS on this machine (apt-get install libopenblas0-pthread), drop 'system'")
    start = uptime()
    runs = []
    for repeat in range(args.repeats):
        for config in configs if repeat % 2 == 0 else configs[::-1]:
            run = bench_once(config, args.prompt_tokens, args.gen_tokens)
            runs.append(run)
            c = run["coreai"]
            print(
                f"{config:9s} prefill {c['prefill_tps']:6.1f} tok/s  decode {c['decode_tps']:5.2f} tok/s  "
                f"TTFT {c['ttft']:6.2f} s   [{run['uptime_before'].split('load average: ')[-1]}]",
                flush=True,
            )
    summary = summarize(runs, configs)
    report = dict(
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        command=f"python -m benchmarks.blas -n {args.repeats} -p {args.prompt_tokens} -g {args.gen_tokens} "
        f"--configs {args.configs}",
        each_run=f"coreai bench -p {args.prompt_tokens} -g {args.gen_tokens} -n 1 (a fresh process per run)",
        cpu_count=os.cpu_count(),
        configs={c: CONFIGS[c] for c in configs},
        uptime_start=start,
        uptime_end=uptime(),
        **summary,
        runs=runs,
    )
    for c, m in summary["median"].items():
        ratio = summary["ratio_over_system"].get(c)
        against = f"  ({ratio['prefill_tps']:.3f}x, {ratio['decode_tps']:.3f}x system)" if ratio else ""
        print(f"median {c:9s} prefill {m['prefill_tps']:6.1f}  decode {m['decode_tps']:5.2f}{against}")
    load = " -> ".join(line.split("load average: ")[-1] for line in (start, report["uptime_end"]))
    print(f"goals: {summary['goals']}; load average {load}")
    output = args.output or Path("benchmarks/results") / f"blas_{datetime.now(UTC):%Y-%m-%d}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

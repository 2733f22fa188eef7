"""Grammar compile time after a restart, without and with the grammar journal (`guided.journal`), on
the MaskBench sample (the real Qwen tokenizer).

Three fresh processes in a row, so no in-process cache survives between them:

1. cold: each schema compiled by a process that never saw it (what every restart paid before), with
   a journal recording the compiles;
2. warm-up: a new process compiles the journal's grammars again (`GrammarCache.warm`, what
   `coreai serve` does on a background thread at start-up), timed as a whole;
3. warm: in that same process, each schema requested again (`make_spec` + `GrammarCache.get`).

    python -m benchmarks.journal [--sample N]    # N schemas per MaskBench subset (default 10)

Prints p50/p99 per phase and writes benchmarks/results/journal.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def _schemas(sample: int) -> list:
    from conformance.suite import maskbench_files

    return [json.loads(p.read_text())["schema"] for p in maskbench_files(sample)]


def _phase(phase: str, folder: str, sample: int) -> dict:
    """One phase in this process: per-schema milliseconds of the schemas that compile."""
    from conformance.common import qwen
    from guided import GrammarCache, GrammarError, make_spec
    from guided.journal import GrammarJournal

    _, info = qwen()
    journal = GrammarJournal(folder, info)
    cache = GrammarCache(capacity=100_000)
    cache.persist(journal)
    out: dict = {}
    if phase == "warm":
        t0 = time.perf_counter()
        out["warmed"] = cache.warm(journal)
        out["warm_up_s"] = time.perf_counter() - t0
    times = []
    for schema in _schemas(sample):
        t0 = time.perf_counter()
        try:
            cache.get(make_spec(schema=schema), info)
        except (GrammarError, ValueError):
            continue
        times.append((time.perf_counter() - t0) * 1e3)
    out["ms"] = times
    return out


def _run_phase(phase: str, folder: str, sample: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.journal", "--phase", phase, "--dir", folder, "--sample", str(sample)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, default=10, help="schemas per MaskBench subset (default %(default)s)")
    ap.add_argument("--phase", choices=("cold", "warm"), help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--output-json", type=Path, default=RESULTS / "journal.json")
    args = ap.parse_args(argv)
    if args.phase:  # a child process
        print(json.dumps(_phase(args.phase, args.dir, args.sample)))
        return {}
    with tempfile.TemporaryDirectory() as folder:
        cold = _run_phase("cold", folder, args.sample)
        warm = _run_phase("warm", folder, args.sample)
    report = {"sample_per_subset": args.sample, "schemas": len(cold["ms"]), "warmed": warm["warmed"]}
    report["warm_up_s"] = round(warm["warm_up_s"], 2)
    for name, ms in (("cold", cold["ms"]), ("warm", warm["ms"])):
        a = np.array(ms)
        report[name] = {
            "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3),
        }
        report[name]["max_ms"] = round(float(a.max()), 3)
        report[name]["total_s"] = round(float(a.sum()) / 1e3, 2)
    print(f"MaskBench sample: {report['schemas']} schemas that compile ({args.sample} per subset)")
    for name, label in (("cold", "cold (a new process compiles): "), ("warm", "warm (journal, then requested):")):
        print(f"  {label} p50 {report[name]['p50_ms']:.2f} ms, p99 {report[name]['p99_ms']:.1f} ms")
    print(f"  warm-up after a restart: {report['warmed']} grammars in {report['warm_up_s']:.1f} s (background)")
    args.output_json.parent.mkdir(parents=True, exist_ok=True)
    args.output_json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()

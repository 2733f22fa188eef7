"""One model on 1 rank, then on 2 ranks (tensor and pipeline parallel) under `mlx.launch` on
loopback: greedy decode tok/s, each rank's share of the weights and its peak resident memory (issue 38).

    python -m benchmarks.distributed [--model qwen2.5-coder-0.5b-instruct] [--tokens 128]

Each setting runs in fresh processes (`--rank-run`: load this rank's shard, rank 0 generates and the
others follow), which print one `RESULT {json}` line each; the table goes to stdout and the figures
with the machine's load average to benchmarks/results/distributed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "distributed.json"
PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."
SETTINGS = {"1 rank": (1, []), "2 ranks, tensor": (2, []), "2 ranks, pipeline": (2, ["--pipeline"])}


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def rank_run(model_name: str, tokens: int, pipeline: bool) -> int:
    """One rank of a setting: load (this rank's shard), generate on rank 0, follow on the others;
    print this rank's RESULT line."""
    from mlx.utils import tree_flatten

    import coreai
    from runtime.distributed import follow, join

    cluster = join(pipeline)
    t0 = time.perf_counter()
    model = coreai.load(model_name, cluster=cluster)
    row: dict = {"rank": 0 if cluster is None else cluster.rank, "load_s": round(time.perf_counter() - t0, 2)}
    weights = sum(v.nbytes for _, v in tree_flatten(model.network.parameters()))
    row["weights_mib"] = round(weights / 2**20)  # this rank's share of the weights, as loaded (float32 on a CPU)
    if cluster is not None and cluster.rank != 0:
        follow(model.network, cluster)
    else:
        model.generate(PROMPT, max_tokens=8)  # warm-up: first-call costs out of the figures
        result = model.generate(PROMPT, max_tokens=tokens)
        if model.leader is not None:
            model.leader.close()
        row.update(tokens=result.usage.completion_tokens, decode_tps=round(result.timings.decode_tps, 2))
    row["peak_rss_mib"] = round(peak_rss_mib())
    print("RESULT " + json.dumps(row), flush=True)
    return 0


def run_setting(model_name: str, tokens: int, ranks: int, flags: list[str]) -> list[dict]:
    """The RESULT rows of one setting, by rank."""
    args = ["-m", "benchmarks.distributed", "--rank-run", "--model", model_name, "--tokens", str(tokens), *flags]
    if ranks == 1:
        cmd = [sys.executable, *args]
    else:
        launch = str(Path(sys.executable).parent / "mlx.launch")
        cmd = [launch, "--python", sys.executable, "--hosts", "127.0.0.1", "-n", str(ranks), "--", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800)
    rows = [json.loads(m) for m in re.findall(r"^RESULT (.*)$", done.stdout, re.M)]
    if len(rows) != ranks:
        raise RuntimeError(f"{len(rows)} of {ranks} ranks reported:\n{done.stderr[-2000:]}")
    return sorted(rows, key=lambda r: r["rank"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--pipeline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.rank_run:
        return rank_run(args.model, args.tokens, args.pipeline)
    from coreai.api import resolve

    resolve(args.model)  # a registry model is exported once, before any timed process
    report: dict = {"model": args.model, "tokens": args.tokens, "load_average": os.getloadavg(), "settings": {}}
    print(f"{'setting':20s} {'decode tok/s':>12s}   weights per rank (MiB)   peak RSS per rank (MiB)   load (s)")
    for name, (ranks, flags) in SETTINGS.items():
        rows = run_setting(args.model, args.tokens, ranks, flags)
        report["settings"][name] = rows
        rss = ", ".join(str(r["peak_rss_mib"]) for r in rows)
        load = ", ".join(str(r["load_s"]) for r in rows)
        weights = ", ".join(str(r["weights_mib"]) for r in rows)
        print(f"{name:20s} {rows[0]['decode_tps']:12.1f}   {weights:23s}  {rss:24s}  {load}", flush=True)
    report["load_average_after"] = os.getloadavg()
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"load average (1, 5, 15 min) before {report['load_average']}, after {report['load_average_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

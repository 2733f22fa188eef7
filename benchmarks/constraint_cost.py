"""What rebuilding a request's `Constraint` costs (issue 58: reuse it across requests or not): on the
default model, for each captured Claude Code request (`tests/data/claude_code/session.json`, 12-13
client tools), the median time of the whole prepare step (`Service.prepare`: markers, constraint,
chat template, tokenizing a ~20k-token prompt) and of building its `Constraint` alone with the
grammar cache warm (what a reuse would save), side by side in one run, and the share of one in the
other. The compiled grammar itself is already shared (`guided.GrammarCache`).

    python -m benchmarks.constraint_cost [--repeats 7] [--out benchmarks/results/constraint_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

SESSION = Path(__file__).resolve().parents[1] / "tests" / "data" / "claude_code" / "session.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    from coreai.api import load
    from coreai.server.anthropic import schemas as m
    from coreai.server.anthropic.request import generation_request
    from coreai.server.config import ServerConfig
    from coreai.service import Service
    from coreai.service.prepare import build_constraint
    from guided import GrammarCache

    model = load(args.model)
    config = ServerConfig(max_tokens=1024)
    cache = GrammarCache()
    service = Service(model, config.settings(), cache)
    bodies = [r["body"] for r in json.loads(SESSION.read_text())["requests"] if isinstance(r["body"], dict)]
    rows = []
    for i, body in enumerate(bodies):
        generation = generation_request(m.MessagesRequest.model_validate(body))
        service.prepare(generation)  # warm: grammar compiled, templates loaded
        prepare, constraint = [], []
        for _ in range(args.repeats):  # interleaved
            start = time.perf_counter()
            job = service.prepare(generation)
            prepare.append(time.perf_counter() - start)
            start = time.perf_counter()
            build_constraint(model, generation, cache, service.settings)
            constraint.append(time.perf_counter() - start)
        row = {
            "request": i,
            "tools": len(body.get("tools") or []),
            "prompt_tokens": len(job.prompt_ids),
            "prepare_ms": 1000 * statistics.median(prepare),
            "constraint_ms": 1000 * statistics.median(constraint),
        }
        row["share"] = row["constraint_ms"] / row["prepare_ms"]
        rows.append(row)
        print(
            f"request {i}: {row['tools']} tools, {row['prompt_tokens']} prompt tokens: prepare "
            f"{row['prepare_ms']:.1f} ms, constraint {row['constraint_ms']:.1f} ms ({row['share']:.1%})"
        )
    load_average = os.getloadavg()
    print(f"load average {load_average[0]:.2f} (1 min)")
    if args.out:
        Path(args.out).write_text(json.dumps({"load_average": load_average, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

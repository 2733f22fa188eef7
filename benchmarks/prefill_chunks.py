"""Prefill tok/s by chunk size (the `runtime.generate.default_prefill_step` choice): a prompt of
`--tokens` ids prefilled in chunks of each size (`network(chunk)`, then `mx.eval` of the KV state, as
`runtime.generate` does), the last token's logits evaluated; medians of `--runs`, the sizes
interleaved within each run. Prints and writes JSON; figures only, no assertions.

    python -m benchmarks.prefill_chunks [MODEL] [--tokens 256 1024] [--chunks 32 64 128 256 512 2048]
        [--runs 3] [--out benchmarks/results/prefill_chunks.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from coreai import store
from coreai.api import load


def prefill_tps(network, ids: list[int], chunk: int) -> float:
    """Prompt tokens per second of one prefill of `ids` in chunks of `chunk` into a fresh KV cache."""
    import mlx.core as mx  # after coreai: the BLAS set-up comes first (runtime.blas)
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(network)
    start = time.perf_counter()
    pending = ids
    while len(pending) > 1:
        n = min(chunk, len(pending) - 1)
        network(mx.array(pending[:n])[None], cache=cache)
        mx.eval([c.state for c in cache])
        pending = pending[n:]
    mx.eval(network(mx.array(pending)[None], cache=cache))
    return len(ids) / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=store.DEFAULT_MODEL)
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--chunks", type=int, nargs="+", default=[32, 64, 128, 256, 512, 2048])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/prefill_chunks.json"))
    args = parser.parse_args(argv)
    network = load(args.model).network
    prefill_tps(network, list(range(1000, 1064)), 64)  # warm-up
    table = {}
    for n in args.tokens:
        ids = [1000 + (i * 7919) % 50000 for i in range(n)]
        samples: dict[int, list[float]] = {c: [] for c in args.chunks}
        for _ in range(args.runs):
            for c in args.chunks:
                samples[c].append(prefill_tps(network, ids, c))
        table[n] = {c: round(statistics.median(v), 1) for c, v in samples.items()}
        print(f"{n} prompt tokens, prefill tok/s by chunk: {table[n]}", flush=True)
    report = {"model": args.model, "runs": args.runs, "tok_s_by_prompt_and_chunk": table}
    report["load_average"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

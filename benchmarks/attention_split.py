"""Where a prefill chunk's attention time goes at long context on this backend (issue 49): one layer of
the default model's attention (14 query heads, 2 KV heads, head size 64, float32) for one chunk of
queries against a context of keys, timed as MLX's fused `mx.fast.scaled_dot_product_attention`, as
its parts (the scores matmul, the softmax, the values matmul), and as the engine's own long-context
attention on the CPU (`runtime.attention.attention`: the softmax in NumPy over the cores).

    python -m benchmarks.attention_split [--chunk 128] [--contexts 4096 16384] [--repeats 5]

Prints ms per layer per chunk (median of --repeats) and writes JSON with the load average to
benchmarks/results/attention_split.json. Figures only; no assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import runtime  # noqa: F401 - the fast BLAS before mlx.core loads (runtime.blas)

RESULTS = Path(__file__).parent / "results" / "attention_split.json"
HEADS, KV_HEADS, HEAD_DIM = 14, 2, 64  # Qwen2.5-0.5B


def timed_ms(fn, repeats: int) -> float:
    import mlx.core as mx

    mx.eval(fn())  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 1)


def split(chunk: int, context: int, repeats: int) -> dict:
    """ms per layer for one chunk: fused SDPA, the engine's attention, and scores / softmax / values apart."""
    import mlx.core as mx

    from runtime.attention import attention

    group = HEADS // KV_HEADS
    q = mx.random.normal((1, HEADS, chunk, HEAD_DIM))
    k = mx.random.normal((1, KV_HEADS, context, HEAD_DIM))
    v = mx.random.normal((1, KV_HEADS, context, HEAD_DIM))
    grouped = q.reshape(1, KV_HEADS, group, chunk, HEAD_DIM)
    scores = mx.random.normal((1, KV_HEADS, group, chunk, context))
    mx.eval(q, k, v, grouped, scores)
    scale = HEAD_DIM**-0.5
    return {
        "fused_sdpa": timed_ms(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale), repeats),
        "engine_attention": timed_ms(lambda: attention(q, k, v, scale), repeats),
        "scores_matmul": timed_ms(lambda: (grouped * scale) @ k[:, :, None].swapaxes(-1, -2), repeats),
        "softmax": timed_ms(lambda: mx.softmax(scores, axis=-1, precise=True), repeats),
        "values_matmul": timed_ms(lambda: scores @ v[:, :, None], repeats),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=128, help="queries per chunk (our CPU prefill chunk)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    report: dict = {"chunk": args.chunk, "load_average": os.getloadavg(), "ms_per_layer": {}}
    print(f"chunk {args.chunk}, ms per layer: fused SDPA | engine's | scores matmul | softmax | values matmul")
    for context in args.contexts:
        row = split(args.chunk, context, args.repeats)
        report["ms_per_layer"][str(context)] = row
        print(f"context {context:6d}: " + " | ".join(f"{v:7.1f}" for v in row.values()), flush=True)
    report["load_average_after"] = os.getloadavg()
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"load average before {report['load_average']}, after {report['load_average_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

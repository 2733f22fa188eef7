"""Server benchmark (prints figures and writes JSON; not a test):

1. decode tok/s of the same greedy request through the server (streamed, measured by the client)
   and in process (`Model.generate`), both with a warm prompt cache; the target is a ratio >= 0.95;
2. TTFT of a request with a long shared system prompt, with the prefix cache warm (an earlier
   request had the same system prompt) and cold (the cache holds another prompt).

    python -m benchmarks.server [MODEL] [--max-tokens 64] [--repeats 3] [--out bench_server.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import coreai
from coreai import store
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from runtime import PromptCache, SamplingParams

QUESTION = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
# About 950 tokens of a plausible shared system prompt: policy text repeated with numbered rules.
SYSTEM = "You are a careful assistant for an engineering team. " + " ".join(
    f"Rule {i}: answer precisely, cite the relevant file and line when you refer to code, prefer short "
    f"examples, and say so when you are unsure about rule {i}."
    for i in range(1, 26)
)


def _stream(base: str, messages, max_tokens: int) -> dict:
    """One streamed greedy request: TTFT (s, to the first content), decode tok/s, usage."""
    import httpx

    body = {
        "model": "bench",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = None
    usage = None
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter()
                last = time.perf_counter()
    n = usage["completion_tokens"]
    return {
        "ttft": first - start,
        "decode_tps": (n - 1) / (last - first) if n > 1 and last > first else 0.0,
        "completion_tokens": n,
        "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
        "prompt_tokens": usage["prompt_tokens"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=store.DEFAULT_MODEL)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench_server.json")
    args = parser.parse_args(argv)
    model = coreai.load(args.model)
    greedy = SamplingParams(temperature=0)

    cache = PromptCache(model.network)
    model.generate(QUESTION, max_tokens=2, sampling=greedy, prompt_cache=cache)  # warm, like the server's
    local, served = [], []
    with serve_in_thread(model, ServerConfig(model_name="bench", max_tokens=max(args.max_tokens, 16))) as base:
        _stream(base, QUESTION, 2)  # warm the server's prompt cache the same way
        for _ in range(args.repeats):  # interleaved, so load changes on a shared machine hit both alike
            local.append(model.generate(QUESTION, max_tokens=args.max_tokens, sampling=greedy, prompt_cache=cache))
            served.append(_stream(base, QUESTION, args.max_tokens))
        shared = [{"role": "system", "content": SYSTEM}]
        other = [{"role": "system", "content": "You are terse."}]
        ask = [{"role": "user", "content": "Which rule is about examples?"}]
        _stream(base, shared + [{"role": "user", "content": "Hello."}], 8)
        warm = _stream(base, shared + ask, 8)
        _stream(base, other + ask, 8)  # the cache now holds another prompt
        cold = _stream(base, shared + ask, 8)

    results = {
        "model": model.name,
        "max_tokens": args.max_tokens,
        "in_process_decode_tps": statistics.median(r.timings.decode_tps for r in local),
        "server_decode_tps": statistics.median(r["decode_tps"] for r in served),
        "in_process_decode_tps_runs": [r.timings.decode_tps for r in local],
        "server_decode_tps_runs": [r["decode_tps"] for r in served],
        "completion_tokens": [r.usage.completion_tokens for r in local],
        "prefix_cache": {
            "prompt_tokens": cold["prompt_tokens"],
            "ttft_cold": cold["ttft"],
            "ttft_warm": warm["ttft"],
            "cached_tokens_warm": warm["cached_tokens"],
            "cached_tokens_cold": cold["cached_tokens"],
            "ttft_saved": cold["ttft"] - warm["ttft"],
        },
    }
    results["server_over_in_process"] = results["server_decode_tps"] / max(results["in_process_decode_tps"], 1e-9)
    pc = results["prefix_cache"]
    print(
        f"decode tok/s: in process {results['in_process_decode_tps']:.2f}, server {results['server_decode_tps']:.2f} "
        f"(ratio {results['server_over_in_process']:.3f}; target >= 0.95)"
    )
    print(
        f"TTFT, {pc['prompt_tokens']}-token prompt: cold {pc['ttft_cold']:.3f} s ({pc['cached_tokens_cold']} cached), "
        f"warm {pc['ttft_warm']:.3f} s ({pc['cached_tokens_warm']} cached), saved {pc['ttft_saved']:.3f} s"
    )
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Server benchmark (prints figures and writes JSON; not a test):

1. decode tok/s of the same greedy request through the server (streamed, measured by the client)
   and in process (`Model.generate`), both with a warm prompt cache; the target is a ratio >= 0.95;
2. TTFT of a request with a long shared system prompt, with the prefix cache warm (an earlier
   request had the same system prompt) and cold (a system prompt the cache never saw);
3. TTFT of the last choice of a request for n=4 sampled choices of an uncached long prompt, beside
   n=1 (the choices prefill the prompt once, so the two should be close).

    python -m benchmarks.server [MODEL] [--max-tokens 64] [--repeats 3] [--out bench_server.json]

With `--concurrency 1,2,4,8` it measures continuous batching instead: the same mixed workload (half
`json_schema`, half free text, `--max-tokens` 48 each, `--requests` of them) sent with that many in
flight to `coreai serve`, and the free half alone to coreai and to mlx-lm's server
(`mlx_lm.server`, which batches too), both started as subprocesses on the same float32 weights and
the same OpenBLAS; it reports aggregate tok/s (completion tokens / wall time of the whole set), the
steady-state aggregate tok/s (while all `concurrency` requests were in flight, i.e. without the set's
tail, where the last requests decode with fewer rows; see `steady_window`),
per-request decode tok/s (after the first token, median), TTFT p50/p95 and how many constrained
outputs were valid, and writes JSON (default `benchmarks/results/server_concurrency.json`). Both
servers stay up; each level runs `--repeats` rounds, each round on coreai then on mlx_lm, and the
figures are the medians over rounds (side by side, so a change of load hits both alike).

    python -m benchmarks.server --concurrency 1,2,4,8 [--requests 16] [--repeats 3] [--max-batch 8] [--speculative off]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
    body = {
        "model": "bench",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = _timed(base, body)
    return {
        "ttft": r["ttft"],
        "decode_tps": r["decode_tps"],
        "completion_tokens": r["completion_tokens"],
        "cached_tokens": r["usage"]["prompt_tokens_details"]["cached_tokens"],
        "prompt_tokens": r["usage"]["prompt_tokens"],
    }


def _choices_ttft(base: str, messages, n: int) -> float:
    """Seconds until every one of `n` sampled choices has streamed its first content."""
    import httpx

    body = {"model": "bench", "messages": messages, "max_tokens": 2, "n": n, "temperature": 0.8, "stream": True}
    start, first = time.perf_counter(), {}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=1800) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    if choice["delta"].get("content"):
                        first.setdefault(choice["index"], time.perf_counter() - start)
    return max(first.values())


RECORD = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["title", "year", "tags"],
    "additionalProperties": False,
}
TOPICS = ["the sea", "mountains", "a library", "trains", "bread", "the moon", "a garden", "rain", "chess", "bees"]


def workload(n: int, tag: str, max_tokens: int, model: str) -> list[dict]:
    """`n` request bodies for `model`, alternating json_schema and free text. `tag` starts every user
    message, so no level of the run reuses another level's prompts from a prefix cache."""
    bodies = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        body["stream_options"] = {"include_usage": True}
        if i % 2 == 0:
            content = f"[{tag}] Describe a book about {topic} as JSON with a title, a year and tags."
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "book", "schema": RECORD}}
        else:
            content = f"[{tag}] Write a long, detailed paragraph about {topic}."
        body["messages"] = [{"role": "user", "content": content}]
        bodies.append(body)
    return bodies


def _timed(base: str, body: dict) -> dict:
    """One streamed request: TTFT (s), decode tok/s after the first token, completion tokens (from
    usage, else one per content chunk), the usage, the text, its start/end times and the arrival time
    of each content chunk (perf_counter seconds)."""
    import httpx

    start = time.perf_counter()
    first = last = None
    times, usage, text = [], None, ""
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=1800) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
                times.append(last)
                text += chunk["choices"][0]["delta"]["content"]
    n = usage["completion_tokens"] if usage else len(times)
    return {
        "ttft": (first or last or start) - start,
        "decode_tps": (n - 1) / (last - first) if first and n > 1 and last > first else 0.0,
        "completion_tokens": n,
        "usage": usage,
        "text": text,
        "start": start,
        "end": time.perf_counter(),
        "chunk_times": times,
    }


def steady_window(results: list[dict], concurrency: int) -> tuple[float, float]:
    """The interval (perf_counter seconds) during which `concurrency` requests were in flight: from the
    start of the `concurrency`-th request to the first end after the last request started. Before it
    the client is still sending, after it the set's tail decodes with fewer rows."""
    starts = sorted(r["start"] for r in results)
    begin = starts[min(concurrency, len(starts)) - 1]
    return begin, min(r["end"] for r in results if r["end"] >= starts[-1])


def steady_tps(results: list[dict], concurrency: int) -> float:
    """Completion tokens per second inside `steady_window`: each request's tokens are shared out
    over its content chunks (one token per chunk for mlx_lm.server; coreai sends a jump-forward run
    as one chunk), and the chunks that arrived inside the window are counted."""
    begin, end = steady_window(results, concurrency)
    tokens = sum(
        r["completion_tokens"] * sum(begin <= t <= end for t in r["chunk_times"]) / len(r["chunk_times"])
        for r in results
        if r["chunk_times"]
    )
    return tokens / (end - begin) if end > begin else 0.0


def run_level(base: str, bodies: list[dict], concurrency: int) -> dict:
    """Send `bodies` with `concurrency` in flight; aggregate and per-request figures."""
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda b: _timed(base, b), bodies))
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    ttfts = sorted(r["ttft"] for r in results)
    valid = 0
    for body, r in zip(bodies, results, strict=False):
        if "response_format" in body:
            try:
                import jsonschema

                jsonschema.validate(json.loads(r["text"]), RECORD)
                valid += 1
            except ValueError:
                pass
    return {
        "concurrency": concurrency,
        "requests": len(bodies),
        "completion_tokens": sum(r["completion_tokens"] for r in results),
        "wall_seconds": wall,
        "aggregate_tps": sum(r["completion_tokens"] for r in results) / wall,
        "steady_tps": steady_tps(results, concurrency),
        "per_request_decode_tps": statistics.median(r["decode_tps"] for r in results),
        "ttft_p50": statistics.median(ttfts),
        "ttft_p95": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
        "constrained": sum("response_format" in b for b in bodies),
        "constrained_valid": valid,
    }


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _float32_copy(folder: Path, into: Path) -> Path:
    """The model folder with float32 weights (what coreai computes in on the CPU), for mlx_lm.server."""
    import mlx.core as mx

    into.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if not f.name.startswith("model.safetensors"):
            shutil.copy(f, into / f.name)
    weights = {}
    for f in sorted(folder.glob("*.safetensors")):
        weights.update(
            {k: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in mx.load(str(f)).items()}
        )
    mx.save_safetensors(str(into / "model.safetensors"), weights)
    return into


class _Server:
    """A server subprocess on a free loopback port; `base` is its URL once it answers /v1/models.
    stderr: where its log goes (a file, or DEVNULL)."""

    def __init__(self, code: str, args: list[str], stderr=subprocess.DEVNULL):
        self.port = _port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
        )
        argv = [sys.executable, "-c", code, *[a.replace("{port}", str(self.port)) for a in args]]
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr)

    def __enter__(self):
        import httpx

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}")
            try:
                httpx.get(self.base + "/v1/models", timeout=2)
                return self
            except httpx.HTTPError:
                time.sleep(0.5)
        raise RuntimeError("the server did not start")

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(30)


# Both servers load the system OpenBLAS before MLX (mlx_lm.server alone would use the bundled,
# ~40x slower reference BLAS; see runtime.blas).
CODE_COREAI = "import sys; from coreai.cli import main; sys.exit(main(sys.argv[1:]))"
CODE_MLX_LM = (
    "import sys; from runtime.blas import setup_blas; setup_blas(); "
    "sys.argv = ['mlx_lm.server', *sys.argv[1:]]; from mlx_lm.server import main; main()"
)


def concurrency_main(args) -> int:
    levels = [int(c) for c in args.concurrency.split(",")]
    folder = store.ensure(args.model) if not Path(args.model).is_dir() else Path(args.model)
    results = {"model": args.model, "max_tokens": args.max_tokens, "max_batch": args.max_batch}
    results.update(speculative=args.speculative, requests=args.requests, rounds=args.repeats, levels=[])

    def free(c: int, tag: str, model: str) -> list[dict]:
        return [
            b
            for b in workload(args.requests, f"free c={c} {tag}", args.max_tokens, model)
            if "response_format" not in b
        ]

    coreai_args = ["serve", str(folder), "--port", "{port}", "--max-batch", str(args.max_batch), "--max-queue", "64"]
    coreai_args += ["--speculative", args.speculative]
    with tempfile.TemporaryDirectory() as tmp:
        f32 = _float32_copy(folder, Path(tmp) / "f32")
        mlx_args = ["--model", str(f32), "--port", "{port}", "--temp", "0", "--max-tokens", str(args.max_tokens)]
        # Both servers stay up (an idle one takes no CPU) and each level runs on both, round after
        # round, so a change of load on a shared machine hits both sides alike; figures are medians.
        with _Server(CODE_COREAI, coreai_args) as ours, _Server(CODE_MLX_LM, mlx_args) as theirs:
            import httpx

            name = httpx.get(ours.base + "/v1/models").json()["data"][0]["id"]
            _timed(ours.base, workload(2, "warm-up", 4, name)[1])
            _timed(theirs.base, workload(2, "warm-up", 4, "default_model")[1])
            for c in levels:
                runs = {"coreai_mixed": [], "coreai_free": [], "mlx_lm_free": []}
                for r in range(args.repeats):
                    tag = f"round {r}"
                    runs["coreai_mixed"].append(
                        run_level(ours.base, workload(args.requests, f"mixed c={c} {tag}", args.max_tokens, name), c)
                    )
                    in_flight = min(c, args.requests // 2)
                    runs["coreai_free"].append(run_level(ours.base, free(c, "coreai " + tag, name), in_flight))
                    runs["mlx_lm_free"].append(
                        run_level(theirs.base, free(c, "mlx_lm " + tag, "default_model"), in_flight)
                    )
                level = {"concurrency": c, **{k: _median_run(v) for k, v in runs.items()}}
                results["levels"].append(level)
                for k, label in (
                    ("coreai_mixed", "coreai mixed"),
                    ("coreai_free", "coreai free"),
                    ("mlx_lm_free", "mlx_lm free"),
                ):
                    print(_line(label, level[k]), flush=True)
    first = results["levels"][0]["coreai_mixed"]
    for level in results["levels"]:
        m = level["coreai_mixed"]
        m["speedup_over_first_level"] = m["aggregate_tps"] / first["aggregate_tps"]
        m["steady_speedup_over_first_level"] = m["steady_tps"] / first["steady_tps"]
    print()
    print(
        "| concurrency | coreai mixed agg tok/s (speedup) | steady agg tok/s (speedup) | per-request tok/s "
        "| TTFT p50 / p95 s | valid JSON | coreai free agg / steady tok/s | mlx_lm free agg / steady tok/s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for level in results["levels"]:
        m, f, x = level["coreai_mixed"], level["coreai_free"], level["mlx_lm_free"]
        print(
            f"| {level['concurrency']} | {m['aggregate_tps']:.2f} ({m['speedup_over_first_level']:.2f}x) "
            f"| {m['steady_tps']:.2f} ({m['steady_speedup_over_first_level']:.2f}x) "
            f"| {m['per_request_decode_tps']:.2f} | {m['ttft_p50']:.2f} / {m['ttft_p95']:.2f} "
            f"| {m['constrained_valid']}/{m['constrained']} | {f['aggregate_tps']:.2f} / {f['steady_tps']:.2f} "
            f"| {x['aggregate_tps']:.2f} / {x['steady_tps']:.2f} |"
        )
    out = Path(args.out or "benchmarks/results/server_concurrency.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"written {out}")
    return 0


def _median_run(runs: list[dict]) -> dict:
    """The median of each figure over rounds (valid counts summed), with every round's aggregate tok/s."""
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k not in ("constrained", "constrained_valid")}
    out.update({k: sum(r[k] for r in runs) for k in ("constrained", "constrained_valid")})
    out["requests"] = runs[0]["requests"]
    out["concurrency"] = runs[0]["concurrency"]
    out["aggregate_tps_rounds"] = [r["aggregate_tps"] for r in runs]
    out["steady_tps_rounds"] = [r["steady_tps"] for r in runs]
    return out


def _line(name: str, r: dict) -> str:
    return (
        f"{name:12s} c={r['concurrency']}: {r['requests']} requests, {r['completion_tokens']:.0f} tokens in "
        f"{r['wall_seconds']:.1f} s = {r['aggregate_tps']:.2f} tok/s aggregate ({r['steady_tps']:.2f} while all "
        f"{r['concurrency']} were in flight), {r['per_request_decode_tps']:.2f} "
        f"tok/s per request, TTFT p50 {r['ttft_p50']:.2f} s p95 {r['ttft_p95']:.2f} s, "
        f"valid {r['constrained_valid']}/{r['constrained']}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=store.DEFAULT_MODEL)
    parser.add_argument("--max-tokens", type=int, default=None, help="64; 48 with --concurrency")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of each level with --concurrency (medians)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--concurrency", help="e.g. 1,2,4,8: measure batching at these concurrencies")
    parser.add_argument(
        "--requests",
        type=int,
        default=16,
        help="requests per concurrency level (--concurrency); several per row in flight, or the tail (the last "
        "requests decoding alone) dominates the figure",
    )
    parser.add_argument("--max-batch", type=int, default=8, help="the coreai server's --max-batch (--concurrency)")
    parser.add_argument(
        "--speculative", default="prompt_lookup", help="the coreai server's --speculative (--concurrency)"
    )
    args = parser.parse_args(argv)
    if args.concurrency:
        args.max_tokens = args.max_tokens or 48
        return concurrency_main(args)
    args.max_tokens = args.max_tokens or 64
    args.out = args.out or "bench_server.json"
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
        ask = [{"role": "user", "content": "Which rule is about examples?"}]
        _stream(base, shared + [{"role": "user", "content": "Hello."}], 8)
        warm = _stream(base, shared + ask, 8)  # the system prompt is cached
        # The prefix cache holds several prompts (LRU), so a cold prompt is one it never saw.
        cold = _stream(base, [{"role": "system", "content": "Team C. " + SYSTEM}] + ask, 8)
        # A long prompt the prefix cache does not hold, for 1 and for 4 choices: they prefill it once.
        one = _choices_ttft(base, [{"role": "system", "content": "Team A. " + SYSTEM}] + ask, 1)
        four = _choices_ttft(base, [{"role": "system", "content": "Team B. " + SYSTEM}] + ask, 4)

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
    results["n_choices_ttft"] = {"prompt_tokens": cold["prompt_tokens"], "n1": one, "n4": four}
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
    print(
        f"TTFT of the last of n sampled choices, uncached {pc['prompt_tokens']}-token prompt: n=1 {one:.2f} s, "
        f"n=4 {four:.2f} s"
    )
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

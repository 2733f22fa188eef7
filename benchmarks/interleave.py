"""Chunked prefill interleaved with decode, through the server (prints figures and writes JSON; not a test).

While a long prompt (an agent's first request) prefills, a stream that was already running keeps
decoding between its prefill chunks and a short request admitted meanwhile starts within a few
chunks. Measured against the same requests alone, on one server, greedy:

- the running stream's inter-token latency (ITL, s) p50/p99 while the long prompt prefills, against
  the same stream alone (goal: p99 <= 3x alone);
- the short request's TTFT (s) behind the long prompt, against alone;
- the long prompt's own TTFT (s) beside the others, against alone (goal: no more than 15 % worse).

Every prompt starts with a fresh nonce, so the prefix cache never serves one. The long prompt's size
is `--long-tokens` (default 4096: about 40 s of prefill on 2 CPU cores; the issue's 20k takes
about 8 minutes per run here).

    python -m benchmarks.interleave [MODEL] [--long-tokens 4096] [--short-tokens 200]
        [--out benchmarks/results/interleave.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import uuid
from pathlib import Path

import httpx

import coreai
from coreai import store
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread

FILLER = "The build log lists each module, its tests, their timings and the files they touched. "


def _messages(model, tokens: int, question: str) -> list[dict]:
    """Chat messages of about `tokens` prompt tokens, starting with a nonce (no prefix-cache hit)."""
    head = f"Session {uuid.uuid4().hex}. "
    per = max(1, len(model.tokenizer.encode(FILLER)))
    filler = FILLER * max(0, (tokens - 40) // per)
    return [{"role": "system", "content": head + filler}, {"role": "user", "content": question}]


def _stream(base: str, messages: list[dict], max_tokens: int, times: list[float], sent: list[float]) -> None:
    """One streamed greedy chat request; appends the send time to `sent` and each content chunk's
    arrival time (time.monotonic(), s) to `times`."""
    body = {"model": "bench", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    sent.append(time.monotonic())
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):  # not the role chunk (empty content)
                    times.append(time.monotonic())


def _itl(times: list[float], start: float = 0.0, end: float = float("inf")) -> list[float]:
    """Gaps (s) between consecutive chunks whose later chunk arrived within [start, end]."""
    return [b - a for a, b in zip(times, times[1:], strict=False) if start <= b <= end]


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else float("nan"))


def run(base: str, model, long_tokens: int, short_tokens: int, stream_tokens: int) -> dict:
    ask = "Summarise the log in one sentence."
    # Alone: the running stream, the short request, the long prompt, each by itself.
    stream_alone: list[float] = []
    _stream(base, _messages(model, 60, "Count from 1 to 200, comma-separated."), stream_tokens, stream_alone, [])
    short_alone: list[float] = []
    short_sent: list[float] = []
    _stream(base, _messages(model, short_tokens, ask), 8, short_alone, short_sent)
    long_alone: list[float] = []
    long_sent: list[float] = []
    _stream(base, _messages(model, long_tokens, ask), 8, long_alone, long_sent)
    alone = {
        "itl": _itl(stream_alone),
        "short_ttft": short_alone[0] - short_sent[0],
        "long_ttft": long_alone[0] - long_sent[0],
    }
    # Together: the stream runs, the long prompt arrives, then the short request one second later.
    running: list[float] = []
    threads = [
        threading.Thread(
            target=_stream,
            args=(base, _messages(model, 60, "Count from 1 to 200, comma-separated."), stream_tokens, running, []),
        )
    ]
    threads[0].start()
    while len(running) < 5:
        time.sleep(0.05)
    long_times: list[float] = []
    long_at: list[float] = []
    threads.append(
        threading.Thread(target=_stream, args=(base, _messages(model, long_tokens, ask), 8, long_times, long_at))
    )
    threads[-1].start()
    time.sleep(1.0)
    short_times: list[float] = []
    short_at: list[float] = []
    threads.append(
        threading.Thread(target=_stream, args=(base, _messages(model, short_tokens, ask), 8, short_times, short_at))
    )
    threads[-1].start()
    for t in threads:
        t.join()
    prefill = (long_at[0], long_times[0])  # while the long prompt prefilled
    together = {
        "itl": _itl(running, *prefill),
        "short_ttft": short_times[0] - short_at[0],
        "long_ttft": long_times[0] - long_at[0],
    }
    return {"alone": alone, "together": together}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=store.DEFAULT_MODEL)
    parser.add_argument("--long-tokens", type=int, default=4096)
    parser.add_argument("--short-tokens", type=int, default=200)
    parser.add_argument("--stream-tokens", type=int, default=400, help="the running stream's max_tokens")
    parser.add_argument("--out", default="benchmarks/results/interleave.json")
    args = parser.parse_args(argv)
    model = coreai.load(args.model)
    config = ServerConfig(model_name="bench", max_tokens=max(args.stream_tokens, 16), speculative=None)
    with serve_in_thread(model, config) as base:
        r = run(base, model, args.long_tokens, args.short_tokens, args.stream_tokens)
    a, t = r["alone"], r["together"]
    figures = {
        "model": model.name,
        "load_average": os.getloadavg(),
        "long_tokens": args.long_tokens,
        "short_tokens": args.short_tokens,
        "itl_p50_alone": _pct(a["itl"], 50),
        "itl_p99_alone": _pct(a["itl"], 99),
        "itl_p50_during_prefill": _pct(t["itl"], 50),
        "itl_p99_during_prefill": _pct(t["itl"], 99),
        "itl_samples_during_prefill": len(t["itl"]),
        "short_ttft_alone": a["short_ttft"],
        "short_ttft_behind_long": t["short_ttft"],
        "long_ttft_alone": a["long_ttft"],
        "long_ttft_beside_others": t["long_ttft"],
    }
    figures["itl_p99_ratio"] = figures["itl_p99_during_prefill"] / figures["itl_p99_alone"]
    figures["long_ttft_ratio"] = figures["long_ttft_beside_others"] / figures["long_ttft_alone"]
    print(f"{model.name}, long prompt ~{args.long_tokens} tokens, load average {figures['load_average']}")
    print(
        f"running stream ITL p50/p99: alone {figures['itl_p50_alone']:.3f}/{figures['itl_p99_alone']:.3f} s, "
        f"during the long prefill {figures['itl_p50_during_prefill']:.3f}/{figures['itl_p99_during_prefill']:.3f} s "
        f"(p99 ratio {figures['itl_p99_ratio']:.2f}; goal <= 3)"
    )
    print(f"short request TTFT: alone {a['short_ttft']:.2f} s, behind the long prompt {t['short_ttft']:.2f} s")
    print(
        f"long prompt TTFT: alone {a['long_ttft']:.2f} s, beside the others {t['long_ttft']:.2f} s "
        f"(ratio {figures['long_ttft_ratio']:.2f}; goal <= 1.15)"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

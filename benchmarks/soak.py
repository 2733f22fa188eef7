"""Soak benchmark (prints figures and writes JSON; not a test): `coreai serve` as a subprocess under
a mixed load for minutes, watching its errors, latency, memory and threads.

`--clients` (16) clients send, for `--minutes` (10), a mix over the three APIs: constrained chat
(`json_schema`), free streamed chat, chat with a required tool, `n = 2`, a streamed constrained
Responses request, streamed Messages, a Messages tool call, streams dropped after their first token
(a client disconnecting mid-stream) and bad inputs (each must be a 4xx). It reports requests by
status, 5xx (goal 0), requests that got no answer within `--timeout` (hangs, goal 0), every
constrained output checked against its schema (goal: all valid), p50/p99 TTFT (streams, to the
first event with text) and latency, the server's resident memory (RSS) at the start, after the
warm-up (the first fifth of the run, at most a minute) and at the end (goal: drift under 5 % after
the warm-up), the prefix cache's bytes against its bound, and at the end, with no client left,
the rows still running or waiting and the threads beside the start's (goal: none leaked).

    python -m benchmarks.soak [MODEL] [--minutes 10] [--clients 16] [--max-tokens 48] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import jsonschema

from benchmarks.server import CODE_COREAI, _Server
from coreai import store

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}
ASK = "Invent a person and give their name and age."
USER = [{"role": "user", "content": ASK}]
KINDS = ("chat_json", "chat_stream", "chat_tool", "chat_n2", "responses_json", "messages_stream")
KINDS += ("messages_tool", "dropped_stream", "bad_input")
BAD = [
    ("/v1/chat/completions", {"model": "m", "messages": USER, "response_format": {"type": "json_schema"}}),
    ("/v1/chat/completions", {"model": "m", "messages": USER, "no_such_field": 1}),
    ("/v1/responses", {"model": "m", "input": [{"type": {}}]}),
    ("/v1/messages", {"model": "m", "messages": USER}),  # no max_tokens
    ("/v1/chat/completions", b"{not json"),
]


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, round(q * (len(values) - 1)))], 4)


def _proc(pid: int) -> dict:
    """The process's resident memory (MiB) and threads, from /proc (Linux) or `ps` (macOS)."""
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        return {"rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "threads": int(fields["Threads"])}
    rss = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return {"rss_mib": round(int(rss or 0) / 1024, 1), "threads": None}


class Client:
    """One client's loop: picks a kind, sends it, records (kind, status, ttft, latency, valid)."""

    def __init__(self, base: str, seed: int, max_tokens: int, timeout: float):
        self.http = httpx.Client(base_url=base, timeout=timeout)
        self.rng = random.Random(seed)
        self.max_tokens = max_tokens
        self.records: list[dict] = []
        self.stop = False

    def run(self, until: float) -> None:
        while time.monotonic() < until and not self.stop:
            kind = self.rng.choice(KINDS)
            t0 = time.perf_counter()
            record = {"kind": kind, "t": time.monotonic()}
            try:
                record.update(getattr(self, kind)())
            except httpx.TimeoutException:
                record["status"] = "timeout"
            except httpx.HTTPError as exc:
                record["status"] = f"transport: {type(exc).__name__}"
            record["latency"] = time.perf_counter() - t0
            self.records.append(record)
        self.http.close()

    # ---- the kinds: each returns {"status", and "valid" for a constrained output, "ttft" for a stream}

    def _post(self, path: str, body: dict) -> tuple[int, dict]:
        r = self.http.post(path, json=body)
        return r.status_code, (r.json() if r.headers.get("content-type", "").startswith("application/json") else {})

    def _stream(self, path: str, body: dict, drop: bool = False) -> dict:
        t0 = time.perf_counter()
        out: dict = {"events": []}
        with self.http.stream("POST", path, json=body) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    out["ended"] = True  # chat's last line
                if not line.startswith("data: ") or out.get("ended"):
                    continue
                event = json.loads(line[6:])
                if event.get("type") in ("message_stop", "response.completed", "response.incomplete"):
                    out["ended"] = True  # the API's last event: the stream was not cut
                if "error" in event or event.get("type") in ("error", "response.failed"):
                    out["error_event"] = True  # each API's error inside a stream that began
                if "ttft" not in out and _has_text(event):
                    out["ttft"] = time.perf_counter() - t0
                    if drop:
                        return {"status": r.status_code, "ttft": out["ttft"]}  # the client leaves
                out["events"].append(event)
        if out["status"] == 200 and not out.pop("ended", False):
            out["unended"] = True  # a 200 stream that stopped before its API's last event
        return out

    def _streamed(self, path: str, body: dict) -> dict:
        out = self._stream(path, body)
        return {k: out[k] for k in ("status", "ttft", "error_event", "unended") if k in out}

    def _valid(self, text: str | None, schema: dict) -> bool:
        try:
            jsonschema.validate(json.loads(text or ""), schema)
            return True
        except (ValueError, jsonschema.ValidationError):
            return False

    def chat_json(self) -> dict:
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
        body = {"model": "m", "messages": USER, "max_tokens": self.max_tokens, "response_format": fmt}
        status, reply = self._post("/v1/chat/completions", body)
        if status != 200:
            return {"status": status}
        choice = reply["choices"][0]
        if choice["finish_reason"] == "length":
            return {"status": status, "cut": True}
        return {"status": status, "valid": self._valid(choice["message"]["content"], SCHEMA)}

    def chat_stream(self) -> dict:
        body = {"model": "m", "messages": USER, "max_tokens": self.max_tokens, "stream": True}
        return self._streamed("/v1/chat/completions", body)

    def dropped_stream(self) -> dict:
        body = {"model": "m", "messages": USER, "max_tokens": self.max_tokens, "stream": True}
        return self._stream("/v1/chat/completions", body, drop=True)

    def chat_tool(self) -> dict:
        tool = {"type": "function", "function": {"name": "weather", "parameters": WEATHER}}
        body = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [tool]}
        status, reply = self._post("/v1/chat/completions", {**body, "tool_choice": "required", "max_tokens": 64})
        if status != 200:
            return {"status": status}
        calls = reply["choices"][0]["message"].get("tool_calls") or []
        if reply["choices"][0]["finish_reason"] == "length":
            return {"status": status, "cut": True}
        valid = bool(calls) and all(self._valid(c["function"]["arguments"], WEATHER) for c in calls)
        return {"status": status, "valid": valid}

    def chat_n2(self) -> dict:
        body = {"model": "m", "messages": USER, "max_tokens": self.max_tokens, "n": 2, "temperature": 1.0}
        status, reply = self._post("/v1/chat/completions", body)
        return {"status": status} if status != 200 else {"status": status, "choices": len(reply["choices"])}

    def responses_json(self) -> dict:
        fmt = {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}
        body = {"model": "m", "input": ASK, "max_output_tokens": self.max_tokens, "stream": True}
        out = self._stream("/v1/responses", {**body, "text": {"format": fmt}})
        done = [e["response"] for e in out["events"] if e.get("type") == "response.completed"]
        if out["status"] != 200 or not done:
            cut = any(e.get("type") == "response.incomplete" for e in out["events"])
            ended = {"cut": True} if cut else {"error_event": True} if out.get("error_event") else {}
            return {"status": out["status"], "ttft": out.get("ttft"), **ended, "unended": out.get("unended", False)}
        text = "".join(c.get("text", "") for item in done[0]["output"] for c in item.get("content") or [])
        return {"status": out["status"], "ttft": out.get("ttft"), "valid": self._valid(text, SCHEMA)}

    def messages_stream(self) -> dict:
        body = {"model": "m", "messages": USER, "max_tokens": self.max_tokens, "stream": True}
        return self._streamed("/v1/messages", body)

    def messages_tool(self) -> dict:
        tool = {"name": "weather", "input_schema": WEATHER}
        body = {"model": "m", "messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": [tool]}
        status, reply = self._post("/v1/messages", {**body, "tool_choice": {"type": "any"}, "max_tokens": 64})
        if status != 200:
            return {"status": status}
        if reply["stop_reason"] == "max_tokens":
            return {"status": status, "cut": True}
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        valid = bool(uses) and all(self._valid(json.dumps(u["input"]), WEATHER) for u in uses)
        return {"status": status, "valid": valid}

    def bad_input(self) -> dict:
        path, body = self.rng.choice(BAD)
        if isinstance(body, bytes):
            r = self.http.post(path, content=body, headers={"content-type": "application/json"})
        else:
            r = self.http.post(path, json=body)
        return {"status": r.status_code, "refused": 400 <= r.status_code < 500}


def _has_text(event: dict) -> bool:
    if "choices" in event:
        return any((c.get("delta") or {}).get("content") for c in event["choices"])
    if event.get("type") == "response.output_text.delta":
        return True
    return event.get("type") == "content_block_delta" and bool(event.get("delta", {}).get("text"))


def _by_minute(samples: list[dict], key: str) -> list:
    """`key` of the first sample at or after each whole minute from the first, then of the last."""
    t0, out, mark = samples[0]["t"], [], 0
    for s in samples[:-1]:
        if s["t"] - t0 >= 60 * mark:
            out.append(s)
            mark = int((s["t"] - t0) // 60) + 1
    return [x.get(key, 0) for x in [*out, samples[-1]]]


def _drift_once_full(samples: list[dict]) -> dict:
    full = next(
        (s for s in samples if s.get("prefix_cache_bytes", 0) >= 0.95 * s.get("prefix_cache_max_bytes", 0) > 0), None
    )
    if full is None:
        return {"prefix_cache_full_after_s": None, "rss_drift_once_prefix_cache_full_pct": None}
    return {
        "prefix_cache_full_after_s": round(full["t"] - samples[0]["t"], 1),
        "rss_drift_once_prefix_cache_full_pct": round(100 * (samples[-1]["rss_mib"] / full["rss_mib"] - 1), 2),
    }


def summarize(records: list[dict], samples: list[dict], warm_at: float) -> dict:
    statuses = Counter(str(r.get("status")) for r in records)
    constrained = [r for r in records if "valid" in r]
    ttfts = [r["ttft"] for r in records if r.get("ttft") is not None]
    latencies = [r["latency"] for r in records if r.get("status") == 200 and r["kind"] != "dropped_stream"]
    warm = next((s for s in samples if s["t"] >= warm_at), samples[-1])
    bad = [r for r in records if r["kind"] == "bad_input"]
    points = {"start": samples[0], "after_warmup": warm, "end": samples[-1]}
    return {
        "requests": len(records),
        "by_status": dict(sorted(statuses.items())),
        "by_kind": dict(sorted(Counter(r["kind"] for r in records).items())),
        "status_by_kind": {
            kind: dict(Counter(str(r.get("status")) for r in records if r["kind"] == kind)) for kind in KINDS
        },
        "server_errors_5xx": sum(s.isdigit() and int(s) >= 500 for s in statuses.elements()),
        "no_answer": sum(not str(r.get("status")).isdigit() for r in records),
        "bad_inputs_refused_4xx": f"{sum(r.get('refused', False) for r in bad)}/{len(bad)}",
        "constrained_valid": f"{sum(r['valid'] for r in constrained)}/{len(constrained)}",
        "constrained_cut_by_max_tokens": sum(r.get("cut", False) for r in records),
        "ttft_s": {"p50": _percentile(ttfts, 0.5), "p99": _percentile(ttfts, 0.99)},
        "latency_s": {"p50": _percentile(latencies, 0.5), "p99": _percentile(latencies, 0.99)},
        "rss_mib": {"start": samples[0]["rss_mib"], "after_warmup": warm["rss_mib"], "end": samples[-1]["rss_mib"]},
        "rss_drift_after_warmup_pct": round(100 * (samples[-1]["rss_mib"] / warm["rss_mib"] - 1), 2),
        "rss_peak_mib": max(s["rss_mib"] for s in samples),
        # The bounded prefix cache may still be filling after the warm-up: the drift from the first
        # sample where it held 95 % of its bound (None if it never did) tells growth beyond it.
        **_drift_once_full(samples),
        # Whether it still grows at the end or has levelled off: the RSS at each minute of the run.
        "rss_mib_by_minute": _by_minute(samples, "rss_mib"),
        # The prefix cache fills up to its bound well after the first minute: bounded growth, not a leak.
        "prefix_cache_mib_by_minute": [round(b / 2**20, 1) for b in _by_minute(samples, "prefix_cache_bytes")],
        "mlx_active_mib_by_minute": [round(b / 2**20, 1) for b in _by_minute(samples, "mlx_active_bytes")],
        # What the RSS holds, from MLX's allocator: arrays alive, and freed buffers kept for reuse.
        "mlx_active_mib": {k: round(s.get("mlx_active_bytes", 0) / 2**20, 1) for k, s in points.items()},
        "mlx_cache_mib": {k: round(s.get("mlx_cache_bytes", 0) / 2**20, 1) for k, s in points.items()},
        "prefix_cache_bytes_peak": max(s.get("prefix_cache_bytes", 0) for s in samples),
        "threads": {"start": samples[0]["threads"], "after_warmup": warm["threads"], "end": samples[-1]["threads"]},
    }


def load(args, base: str, pid: int) -> dict:
    """The mixed clients against the server at `base` (process `pid`) for `args.minutes`; the figures."""
    samples: list[dict] = []
    stop = threading.Event()

    def sample() -> None:
        point = {"t": time.monotonic(), **_proc(pid)}
        point.update(httpx.get(base + "/health", timeout=30).json().get("memory", {}))
        samples.append(point)

    def sampler() -> None:
        while not stop.wait(5.0):
            sample()

    sample()
    t_start = time.monotonic()
    duration = 60 * args.minutes
    warm_at = t_start + min(60.0, duration / 5)
    clients = [Client(base, args.seed + i, args.max_tokens, args.timeout) for i in range(args.clients)]
    threads = [threading.Thread(target=c.run, args=(t_start + duration,)) for c in clients]
    watcher = threading.Thread(target=sampler)
    for t in [*threads, watcher]:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    time.sleep(2.0)  # the dropped streams' rows leave within a step
    sample()
    health = httpx.get(base + "/health", timeout=30).json()
    return {
        "model": args.model,
        "ranks": args.ranks,
        "minutes": args.minutes,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "load_average": os.getloadavg(),
        **summarize([r for c in clients for r in c.records], samples, warm_at),
        "prefix_cache_bytes_bound": args.prompt_cache_bytes,
        "rows_left": {"running": health["running"], "waiting": health["waiting"]},
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=store.DEFAULT_MODEL)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds without an answer that count as a hang")
    p.add_argument("--prompt-cache-bytes", type=int, default=256 << 20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ranks", type=int, choices=(1, 2), default=1, help="2: under mlx.launch, then a rank fault")
    p.add_argument("--stop-seconds", type=float, default=30.0, help="--ranks 2: rank 1 SIGSTOPped this long")
    p.add_argument("--rank-timeout", type=float, default=20.0, help="--ranks 2: coreai serve --rank-timeout")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/soak.json"))
    args = p.parse_args(argv)
    model = args.model if Path(args.model).is_dir() else str(store.ensure(args.model))
    serve = ["--alias", "*", "--max-queue", str(4 * args.clients)]
    serve += ["--prompt-cache-bytes", str(args.prompt_cache_bytes), "--grammar-journal", "off"]
    if args.ranks == 2:
        from benchmarks import soak_ranks

        report = soak_ranks.run(args, model, serve, sys.modules[__name__])
    else:
        log = args.out.with_suffix(".server.log")  # the server's stderr: a 5xx's traceback
        log.parent.mkdir(parents=True, exist_ok=True)
        command = ["serve", model, "--port", "{port}", *serve]
        with log.open("w") as stderr, _Server(CODE_COREAI, command, stderr) as server:
            report = load(args, server.base, server.process.pid)
        report["server_log"] = str(log)
        # -15: stopped in order by SIGTERM (uvicorn re-raises it once shut down)
        report["server_exit_code"] = server.process.returncode
    print(json.dumps(report, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()

"""Agent soak (prints figures, writes JSON; not a test): recorded agent sessions replayed by several
clients at once, with resends, against `coreai serve` (a subprocess on loopback: its RSS is its own).

Sessions as recorded (bodies, headers, order; streamed): Claude Code 2.1.332 (tests/data/claude_code/:
a HEAD probe, 4 POST /v1/messages?beta=true, another session's first request) and Codex (tests/data/
codex/: 5 POST /v1/responses, 2 of them compactions); no opencode recording (not installed yet; another
issue). A replay differs from the others only by " (client C, round R)" after the session's question
(its first request's last user text) wherever the session carries it (the later Claude requests'
last user text is the `<total_tokens>` marker or a tool result: tagging those would defeat the marker
rule or split a session's requests apart). `--resend-rate`: a request is opened, its first event
line read, the connection closed 0.2-2 s later (while the prompt prefills, if it still does), then it
is sent again and read whole. `--forced-tool-rate`: `tool_choice` names one of the request's tools
(same prompt; the tiny model never calls a tool of its own accord: the tool check would be empty).

Reported (`summarize` gives the goals): statuses, 5xx, hangs, tool inputs valid against their schema,
/health `stats`, distinct prompt prefixes against cold prefills, the server's RSS and the load
average. The model: by default a tiny random qwen2 network (`TINY_NOTE` says why) served with
`--max-tokens 24 --temperature 0`; `--model` picks another.

    python -m benchmarks.agent_soak [--minutes 10] [--clients 4] [--resend-rate 0.2] [--model M]
        [--forced-tool-rate 0.2] [--timeout 600] [--out benchmarks/results/agent_soak.json]
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import cast

import httpx
import jsonschema

from benchmarks.server import CODE_COREAI, _Server
from benchmarks.soak import _by_minute, _drift_once_full, _percentile, _proc
from coreai import store
from coreai.service.markers import strip_markers

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
COLD = 0.5  # a request whose cached prompt tokens are under this share of its prompt prefilled it cold
TINY_NOTE = (  # why the tiny network by default
    "tiny random qwen2, 1 layer, 131,072 positions: a cold prefill of Claude Code's prompt (~37k tokens) takes "
    "seconds; the default model takes ~8 minutes on this CPU, too slow for a soak's turnover"
)
WHERE = ("session", "client", "round", "request", "prompt", "cached", "resend")  # a cold prefill's record
SAMPLE_SECONDS = 5.0  # between RSS samples
RESEND_WAIT = 16.0  # seconds after the last request, for a held job nobody claimed to expire (RESEND_GRACE 15 s)
DETAIL = ("server_stats_before", "server_stats_after", "cold_prefill_list", "tool_inputs_invalid", "errors_4xx")
OPENCODE = "not replayed: no opencode recording (opencode is not installed yet; another issue)"


def sessions() -> dict[str, list[dict]]:
    """The recorded sessions: name -> its requests [{"method", "path", "headers", "body"}] (the HEAD
    probe has no body)."""
    claude, other = (
        json.loads((DATA / "claude_code" / f).read_text()) for f in ("session.json", "other_question.json")
    )
    with gzip.open(DATA / "codex" / "session.jsonl.gz", "rt") as f:
        codex = [{"method": "POST", "headers": {}, **json.loads(line)} for line in f]
    return {"claude_code": claude["requests"], "claude_code_other_question": other["requests"], "codex": codex}


def _user_texts(body: dict) -> list[dict]:
    """The text-holding dicts of `body`'s user messages, in order (Messages `text` blocks, Responses
    `input_text` parts; a message whose content is a string is the dict itself)."""
    out = []
    for m in body.get("messages") or body.get("input") or []:
        if isinstance(m, dict) and m.get("role") == "user":
            parts = m["content"] if isinstance(m["content"], list) else [m]
            out += [p for p in parts if p.get("type") in ("text", "input_text") or p is m]
    return out


def tagged(session: list[dict], tag: str) -> list[dict]:
    """`session`'s requests (copies) with `tag` appended to the session's question wherever it occurs."""
    first = next(r for r in session if r.get("body"))
    parts = _user_texts(first["body"])
    question = parts[-1].get("text", parts[-1].get("content"))
    out = copy.deepcopy(session)
    for request in out:
        for part in _user_texts(request.get("body") or {}):
            key = "text" if "text" in part else "content"
            if part[key] == question:
                part[key] = question + tag
    return out


def prefix_key(body: dict) -> str:
    """A request's system prompt (after the server's marker rules) and tools, as one string: its
    shared prefix. Responses: `instructions` and the developer/system items before the first user one."""
    if "messages" in body:
        system = body.get("system") or ""
        texts = [system] if isinstance(system, str) else [b.get("text", "") for b in system]
    else:
        texts = [body.get("instructions") or ""]
        for item in body.get("input") or []:
            if item.get("role") not in ("developer", "system"):
                break
            texts += [p.get("text", "") for p in item["content"]] if isinstance(item["content"], list) else []
    stripped, _ = strip_markers([{"role": "system", "content": "\n".join(texts)}])
    return json.dumps([stripped[0]["content"], body.get("tools") or []], sort_keys=True)


def tool_schemas(body: dict) -> dict[tuple[str | None, str], dict]:
    """(namespace, name) -> the input schema of each tool `body` declares."""
    out: dict[tuple[str | None, str], dict] = {}
    for tool in body.get("tools") or []:
        if "input_schema" in tool or tool.get("type") == "function":
            out[None, tool["name"]] = tool.get("input_schema", tool.get("parameters")) or {}
        for inner in tool.get("tools") or [] if tool.get("type") == "namespace" else []:
            out[tool["name"], inner["name"]] = inner.get("parameters") or {}
    return out


def forced(body: dict, rng: random.Random) -> tuple[dict, str]:
    """`body` with `tool_choice` naming one of its (loaded, top-level) tools at random, and the name."""
    kind = "tool" if "messages" in body else "function"  # Messages: loaded tools; Responses: functions
    name = rng.choice([t["name"] for t in body["tools"] if t.get("type", kind) == kind and not t.get("defer_loading")])
    return {**body, "tool_choice": {"type": kind, "name": name}}, name


class Client:
    """One client's loop: a session at a time, its requests in order; `records`, one per request sent."""

    def __init__(self, index: int, base: str, args, all_sessions: dict[str, list[dict]]):
        self.index, self.args, self.sessions = index, args, all_sessions
        self.http = httpx.Client(base_url=base, timeout=httpx.Timeout(args.timeout, connect=30))
        self.rng = random.Random(args.seed * 1000 + index)
        self.records: list[dict] = []

    def run(self, until: float) -> None:
        rounds = 0
        while time.monotonic() < until:
            rounds += 1
            name = self.rng.choice(sorted(self.sessions))
            requests = tagged(self.sessions[name], f" (client {self.index}, round {rounds})")
            for i, request in enumerate(requests):
                if time.monotonic() >= until:
                    break
                where = {"client": self.index, "session": name, "round": rounds, "request": i}
                self.records += [{**where, **r} for r in self.send(request)]
        self.http.close()

    def send(self, request: dict) -> list[dict]:
        """The request's records: one, or the abandoned copy and the resend."""
        t, body, path, extra = time.monotonic(), request.get("body"), request["path"], cast(dict, {})
        if body is None:  # the HEAD probe
            return [{"kind": "head", "t": t, **self.call(request["method"], path, None, {})}]
        if body.get("tools") and self.rng.random() < self.args.forced_tool_rate:
            body, extra["forced"] = forced(body, self.rng)
        out, headers = [], request["headers"]  # as recorded (Claude Code's anthropic-beta, ...)
        if self.rng.random() < self.args.resend_rate:
            out.append({"kind": "abandoned", "t": t, **self.call("POST", path, body, headers, leave=True)})
            extra["resend"] = True
        kind = "messages" if "messages" in body else "responses"
        return [*out, {"kind": kind, "t": time.monotonic(), **extra, **self.call("POST", path, body, headers)}]

    def call(self, method: str, path: str, body: dict | None, headers: dict, leave: bool = False) -> dict:
        """Send a request and read its stream to the end: status, latency, usage, tool inputs
        checked. leave: read the first line, then close the connection 0.2-2 s later (as a client's
        stream watchdog does) and return the status alone."""
        t0 = time.perf_counter()
        out: dict = {"tools": []}
        events: list[dict] = []
        try:
            with self.http.stream(method, path, json=body, headers=headers) as r:
                out["status"] = r.status_code
                if leave:
                    next(r.iter_lines(), None)
                    time.sleep(self.rng.uniform(0.2, 2.0))
                    return {"status": r.status_code}
                if r.status_code != 200:
                    out["error"] = r.read()[:300].decode(errors="replace")
                for line in r.iter_lines() if r.status_code == 200 else ():
                    if time.perf_counter() - t0 > self.args.timeout:
                        out["status"] = "hang"  # keepalives kept coming, the answer did not
                        break
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))
        except httpx.TimeoutException:
            out["status"] = "hang"
        except httpx.HTTPError as exc:
            out["status"] = f"transport: {type(exc).__name__}"
        out["latency"] = time.perf_counter() - t0
        if out["status"] == 200 and body is not None:
            (_messages if "messages" in body else _responses)(events, tool_schemas(body), out)
        return out


def _check(schemas: dict, namespace: str | None, name: str, arguments: str) -> dict:
    """A returned tool input: its name and whether it parses and is valid against its tool's schema."""
    schema = schemas.get((namespace, name))
    try:
        value = json.loads(arguments or "{}")
        valid = schema is not None and jsonschema.validators.validator_for(schema)(schema).is_valid(value)
    except ValueError:
        valid = False
    return {"name": name if namespace is None else f"{namespace}.{name}", "valid": valid, "input": arguments[:200]}


def _messages(events: list[dict], schemas: dict, out: dict) -> None:
    """Messages stream: `tool_use` inputs from their `input_json_delta`s, usage, stop reason, ending."""
    blocks: dict[int, list] = {}
    for e in events:
        kind = e.get("type")
        if kind == "content_block_start" and e["content_block"]["type"] == "tool_use":
            blocks[e["index"]] = [e["content_block"]["name"], ""]
        elif kind == "content_block_delta" and e["delta"].get("type") == "input_json_delta":
            blocks[e["index"]][1] += e["delta"]["partial_json"]
        elif kind == "content_block_stop" and e["index"] in blocks:
            out["tools"].append(_check(schemas, None, *blocks.pop(e["index"])))
        elif kind == "message_delta":
            u = e.get("usage") or {}
            out["cached"] = u.get("cache_read_input_tokens") or 0
            out["prompt"] = (u.get("input_tokens") or 0) + out["cached"] + (u.get("cache_creation_input_tokens") or 0)
            out["stop"] = e["delta"].get("stop_reason")
        elif kind == "error":
            out["error_event"] = True
    out["ended"] = bool(events) and events[-1].get("type") == "message_stop"


def _responses(events: list[dict], schemas: dict, out: dict) -> None:
    """Responses stream: the final response's function calls, usage and status."""
    final = next((e for e in events if e.get("type") in ("response.completed", "response.incomplete")), None)
    out["error_event"] = any(e.get("type") in ("error", "response.failed") for e in events)
    out["ended"] = final is not None
    if final is not None:
        response = final["response"]
        for item in response.get("output") or []:
            if item.get("type") == "function_call":
                out["tools"].append(_check(schemas, item.get("namespace"), item["name"], item["arguments"]))
        usage = response.get("usage") or {}
        out["prompt"] = usage.get("input_tokens") or 0
        out["cached"] = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
        out["stop"] = response["status"]


def _delta(before: dict, after: dict) -> dict:
    """after - before for each number of the /health stats (nested dicts too)."""
    return {k: _delta(before.get(k, {}), v) if isinstance(v, dict) else v - before.get(k, 0) for k, v in after.items()}


def summarize(records: list[dict], samples: list[dict], warm_at: float, stats: tuple[dict, dict]) -> dict:
    """The figures of a run from the clients' `records`, the RSS `samples` (warm-up over at `warm_at`)
    and the /health `stats` before and after. Goals: no 5xx, no hang, every tool input valid; about
    one cold prefill (usage: under `COLD` of the prompt read from the cache) per distinct prefix
    (system after the marker rules + tools), not one per session; RSS drift < 5 % after the warm-up."""
    statuses = Counter(str(r["status"]) for r in records)
    done = [r for r in records if r["kind"] in ("messages", "responses")]
    ok = [r for r in done if r["status"] == 200]
    tools = [t for r in done for t in r.get("tools", [])]
    cold = [r for r in done if r.get("prompt") and r.get("cached", 0) < COLD * r["prompt"]]
    keys = {n: {prefix_key(q["body"]) for q in s if q.get("body")} for n, s in sessions().items()}
    warm, t0 = next((s for s in samples if s["t"] >= warm_at), samples[-1]), samples[0]["t"]
    cached, prompted = (sum(r.get(k, 0) for r in ok) for k in ("cached", "prompt"))
    delta, cold_mean = _delta(*stats), sum(r["prompt"] for r in cold) / max(1, len(cold))
    return {
        "requests": len(records),
        "by_status": dict(sorted(statuses.items())),
        "by_kind": dict(sorted(Counter(r["kind"] for r in records).items())),
        "server_errors_5xx": sum(s.isdigit() and int(s) >= 500 for s in statuses.elements()),
        "hangs": statuses.get("hang", 0),
        "errors_4xx": [r.get("error") for r in records if str(r["status"]).startswith("4")][:5],
        "error_events": sum(r.get("error_event", False) for r in ok),
        "unended_streams": sum(not r.get("ended") for r in ok),
        "stop_reasons": dict(Counter(str(r.get("stop")) for r in ok)),
        "tool_inputs_valid": f"{sum(t['valid'] for t in tools)}/{len(tools)}",
        "tool_inputs_invalid": [t for t in tools if not t["valid"]][:10],
        "tool_calls_by_name": dict(Counter(t["name"] for t in tools)),
        "forced_tool_requests": sum("forced" in r for r in done),
        "forced_without_a_call": sum("forced" in r and not r.get("tools") for r in ok),  # cut by --max-tokens
        "distinct_prefixes": {**{n: len(k) for n, k in keys.items()}, "total": len(set().union(*keys.values()))},
        "cold_prefills": len(cold),
        "cold_prefills_by_session": dict(Counter(r["session"] for r in cold)),
        "cold_prefill_list": [{**{k: r.get(k) for k in WHERE}, "at_s": round(r["t"] - t0, 1)} for r in cold],
        # Usage counts a prefix copied from a row still prefilling (`KVBatch._share_prefill`) as computed. The
        # server's bound: prompt tokens it computed (cold prefills + every request's new tail) in cold prompts.
        "server_cold_prefill_equivalents": round(delta["prefill_tokens"] / cold_mean, 2) if cold else None,
        "usage_cached_share": round(cached / max(1, prompted), 4),
        "resends_sent": sum(r["kind"] == "abandoned" for r in records),
        "server_stats_before": stats[0],
        "server_stats_after": stats[1],
        "server_stats_delta": delta,
        "latency_s_p50_p99": [_percentile([r["latency"] for r in ok], q) for q in (0.5, 0.99)],
        "rss_mib": {"start": samples[0]["rss_mib"], "after_warmup": warm["rss_mib"], "end": samples[-1]["rss_mib"]},
        "rss_drift_after_warmup_pct": round(100 * (samples[-1]["rss_mib"] / warm["rss_mib"] - 1), 2),
        **_drift_once_full(samples),
        "rss_mib_by_minute": _by_minute(samples, "rss_mib"),
        "prefix_cache_mib_by_minute": [round(b / 2**20, 1) for b in _by_minute(samples, "prefix_cache_bytes")],
    }


def load(args, base: str, pid: int) -> dict:
    """The clients against the server at `base` (process `pid`) for `args.minutes`; the figures."""
    samples: list[dict] = []
    stop = threading.Event()

    def sample() -> dict:
        health = httpx.get(base + "/health", timeout=60).json()
        samples.append({"t": time.monotonic(), **_proc(pid), **health.get("memory", {})})
        return health

    def sampler() -> None:
        while not stop.wait(SAMPLE_SECONDS):
            sample()

    before, start = sample()["stats"], time.monotonic()
    clients = [Client(i, base, args, sessions()) for i in range(args.clients)]
    threads = [threading.Thread(target=c.run, args=(start + 60 * args.minutes,)) for c in clients]
    for t in [*threads, watcher := threading.Thread(target=sampler)]:
        t.start()
    for t in threads:
        t.join()
    time.sleep(RESEND_WAIT)  # a held job nobody claimed expires
    stop.set()
    watcher.join()
    health = sample()
    records = sorted((r for c in clients for r in c.records), key=lambda r: r["t"])
    report = summarize(records, samples, start + min(60.0, 12 * args.minutes), (before, health["stats"]))
    return {**report, "rows_left": {"running": health["running"], "waiting": health["waiting"]}}


def tiny_long(folder: Path) -> Path:
    """The default model, written to `folder`: tests/test_agent_cli.py's `tiny_long` (a random qwen2
    network, one layer, two heads, 131,072 positions, its end token's head row a little above
    "right"'s so that greedy turns end after a few tokens), by tests/conftest.py's writers."""
    import mlx.core as mx
    from tokenizers import Tokenizer

    sys.path.insert(0, str(ROOT))
    from tests.conftest import _write_tiny_network, _write_tiny_tokenizer

    _write_tiny_tokenizer(folder)
    shape = dict(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    _write_tiny_network(folder, "qwen2", max_position_embeddings=131072, **shape)
    weights = cast("dict[str, mx.array]", mx.load(str(folder / "model.safetensors")))
    vocabulary, head = Tokenizer.from_file(str(folder / "tokenizer.json")), weights["lm_head.weight"]
    end, right = (cast(int, vocabulary.token_to_id(t)) for t in ("<|im_end|>", "right"))
    head[end] = head[right] * 1.05
    mx.save_safetensors(str(folder / "model.safetensors"), {**weights, "lm_head.weight": head})
    return folder


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="registry name or MLX folder (default: the tiny long-context network)")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--resend-rate", type=float, default=0.2)
    p.add_argument("--forced-tool-rate", type=float, default=0.2)
    p.add_argument("--max-tokens", type=int, default=24, help="coreai serve --max-tokens")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds without an answer's end: a hang")
    p.add_argument("--prompt-cache-bytes", type=int, default=256 << 20, help="coreai serve --prompt-cache-bytes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "agent_soak.json")
    args = p.parse_args(argv)
    codex_model = sessions()["codex"][0]["body"]["model"]  # Codex sends its configured name
    serve = ["--port", "{port}", "--alias", "claude-*", "--alias", codex_model, "--temperature", "0"]
    serve += ["--max-tokens", str(args.max_tokens), "--prompt-cache-bytes", str(args.prompt_cache_bytes)]
    serve += ["--max-queue", str(8 * args.clients), "--grammar-journal", "off"]
    log = args.out.with_suffix(".server.log")  # the server's stderr: a 5xx's traceback
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model, note = (args.model, "chosen with --model") if args.model else (str(tiny_long(Path(tmp))), TINY_NOTE)
        if args.model and not Path(args.model).is_dir():
            model = str(store.ensure(args.model))
        load_before = os.getloadavg()
        with log.open("w") as stderr, _Server(CODE_COREAI, ["serve", model, *serve], stderr) as server:
            figures = load(args, server.base, server.process.pid)
    report = {
        "model": args.model or "tiny-long (random)",
        "model_note": note,
        "opencode": OPENCODE,
        "command": " ".join(["coreai serve MODEL", *serve]).replace("{port}", "PORT"),
        **{k: v for k, v in vars(args).items() if k not in ("model", "out")},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        **figures,
        "server_log": str(log),
        "server_exit_code": server.process.returncode,  # -15: stopped in order by SIGTERM
    }
    print(json.dumps({k: v for k, v in report.items() if k not in DETAIL}, indent=1))
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"-> {args.out}")
    return report


if __name__ == "__main__":
    main()

"""One prefill of an agent's prompt per machine (issue #57): new sessions of the real agent CLIs, with
their full default set-up, against `coreai serve` on the default model. Per CLI, in one workspace:
session A asks one question, session B (a new CLI run) another; then the server restarts on the
same `--prompt-cache-dir` and session C asks a third. Prints and writes (JSON) each session's first
request: prompt tokens, those read from the prefix cache, the time to its first output (the
client's view, through a recording proxy) and the markers the server removed; then B's and C's
cached share and TTFT ratio to A's, against the goals (>= 95 % cached, TTFT <= 10 % of A's).

    python -m benchmarks.agent_prefix [--model qwen2.5-coder-0.5b-instruct] [--clients claude codex]
        [--out benchmarks/results/agent_prefix.json]

Each session is cut after its first turn (`--max-turns 1` for Claude Code; Codex's turn as it
ends): the first request is what a new session waits for.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the CLI runners live with the tests that drive them

FILES = {"hello.py": 'print("Hello, world!")\n', "sum.py": "print(sum([1, 2, 3]))\n"}
QUESTIONS = ["What does hello.py print?", "What does sum.py print?", "How many lines does hello.py have?"]
GOAL_CACHED, GOAL_TTFT = 0.95, 0.10


SERVERS = ((0, 1), (2,))  # sessions A and B on one server; C on a new one (the restart, same folder)


def claude_sessions(model, config, root: Path) -> list[dict]:
    """Sessions A and B on one server, C after a restart: each one's first Messages request."""
    from agent_cli import MAIN_MODEL, Recorder, fresh_workspace, run_claude

    from coreai.server.background import serve_in_thread

    workspace = fresh_workspace(root, FILES)
    rows = []
    for sessions in SERVERS:
        with serve_in_thread(model, config) as base:  # a clean stop writes the prefix cache to the folder
            for i in sessions:
                recorder = Recorder(upstream=base)
                with recorder.serving() as front:
                    run = run_claude(front, workspace, QUESTIONS[i], "--max-turns", "1", timeout=3600)
                rows.append(
                    session_row(i, [x for x in recorder.exchanges if (x.body or {}).get("model") == MAIN_MODEL])
                )
                rows[-1] |= {"exit_code": run.returncode, "answer": str(run.result.get("result"))[:200]}
                print(rows[-1], flush=True)
    return rows


def session_row(i: int, exchanges: list) -> dict:
    """Session i's first turn from its Messages exchanges (the first request and any resend of it, until
    one answers): the user's TTFT is from the first request's start to the first content block of
    any of them; prompt and cached tokens are the answering exchange's."""
    t0 = exchanges[0].started
    # The first request and the CLI's resends of it (their bodies may differ in a volatile marker)
    # up to the first one answered.
    done = next((n for n, x in enumerate(exchanges) if x.usage()), len(exchanges) - 1)
    sent = exchanges[: done + 1]
    answered = next((x for x in sent if x.usage()), sent[-1])
    usage = answered.usage()
    firsts = [x.started - t0 + x.ttft for x in sent if x.ttft is not None]
    return {
        "session": "ABC"[i],
        "question": QUESTIONS[i],
        "restarted": i == 2,
        "prompt_tokens": usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0),
        "cached_tokens": usage.get("cache_read_input_tokens", 0),
        "ttft_s": round(min(firsts), 2) if firsts else None,
        "sent": [
            {
                "at_s": round(x.started - t0, 2),
                "seconds": round(x.seconds, 2),
                "status": x.status,
                "answered": bool(x.usage()),
                "last_events": [e.get("type") for e in x.events()][-3:],
                "error": next((e.get("error") for e in x.events() if e.get("type") == "error"), None),
            }
            for x in sent
        ],
        "removed": answered.reply_headers.get("x-coreai-ignored", ""),
    }


class ServiceLog(logging.Handler):
    """The service's log lines about clients that left and resends (kept in the JSON)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "resend" in (message := record.getMessage()):
            self.lines.append(f"{time.strftime('%H:%M:%S')} {message}")


def codex_sessions(model, config, root: Path) -> list[dict]:
    """The same three sessions with the Codex CLI (its default prompt and tools, HTTP transport
    through the timing proxy), each a new `codex exec` in the same workspace."""
    import uvicorn
    from codex_cli import codex_exec, recording_proxy

    from coreai.server.background import serve_in_thread

    rows = []
    for sessions in SERVERS:
        with serve_in_thread(model, config) as base:
            measure: list[dict] = []
            proxy = uvicorn.Server(uvicorn.Config(recording_proxy(base, None, measure), port=0, log_level="warning"))
            threading.Thread(target=proxy.run, daemon=True).start()
            while not proxy.started:
                time.sleep(0.1)
            port = proxy.servers[0].sockets[0].getsockname()[1]
            for i in sessions:
                seen = len(measure)
                url = f"http://127.0.0.1:{port}"
                run = codex_exec(
                    url, config.model_name, QUESTIONS[i], root, websockets=False, files=FILES, timeout=3600
                )
                first = measure[seen] if len(measure) > seen else {}
                usage = first.get("usage") or {}
                rows.append(
                    {
                        "session": "ABC"[i],
                        "question": QUESTIONS[i],
                        "restarted": i == 2,
                        "prompt_tokens": usage.get("input_tokens"),
                        "cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens", 0),
                        "ttft_s": first.get("ttft_s"),
                        "seconds": first.get("seconds"),
                        "requests": len(measure) - seen,
                        "completed": run.completed,
                        "errors": run.errors,
                        "answer": "\n".join(m.get("text", "") for m in run.items("agent_message"))[:200],
                    }
                )
                print(rows[-1], flush=True)
            proxy.should_exit = True
    return rows


def first_token_s(row: dict) -> tuple[float | None, bool]:
    """(seconds, exact) of a session's wait for its first token: its TTFT, or, when no request of
    it was seen answering (the CLI gave up and its resend's reply was not recorded), a lower bound:
    the time its first request streamed with no content."""
    if row.get("ttft_s") is not None:
        return row["ttft_s"], True
    sent = row.get("sent") or []
    return (sent[0]["seconds"], False) if sent else (None, False)


def verdict(rows: list[dict]) -> dict:
    """B's and C's cached share of their prompt and TTFT ratio to A's (an upper bound where A's TTFT is
    a lower bound), and whether each met its goal."""
    a_seconds, a_exact = first_token_s(rows[0])
    out = {}
    for row in rows[1:]:
        share = row["cached_tokens"] / row["prompt_tokens"] if row.get("prompt_tokens") else None
        ratio = row["ttft_s"] / a_seconds if row.get("ttft_s") and a_seconds else None
        out[row["session"]] = {
            "cached_share": round(share, 4) if share is not None else None,
            "ttft_ratio": round(ratio, 4) if ratio is not None else None,
            "ttft_ratio_is_upper_bound": not a_exact,
            "met": share is not None and ratio is not None and share >= GOAL_CACHED and ratio <= GOAL_TTFT,
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--clients", nargs="+", choices=("claude", "codex"), default=["claude", "codex"])
    parser.add_argument("--max-tokens", type=int, default=64, help="the server's --max-tokens (the answer's length)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "agent_prefix.json")
    args = parser.parse_args(argv)

    from coreai.api import load
    from coreai.server import ServerConfig

    model = load(args.model)
    service_log = ServiceLog()
    logging.getLogger("coreai.service").addHandler(service_log)
    logging.getLogger("coreai.service").setLevel(logging.INFO)
    results: dict = {"model": args.model, "load_average_before": os.getloadavg(), "clients": {}}
    for client in args.clients:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            config = ServerConfig(
                model_name=args.model,
                aliases=("claude-*",),
                max_tokens=args.max_tokens,
                temperature=0.0,
                prompt_cache_dir=str(root / "kv"),
            )
            rows = (claude_sessions if client == "claude" else codex_sessions)(model, config, root)
        results["clients"][client] = {"sessions": rows, "verdict": verdict(rows), "resend_log": service_log.lines}
        service_log.lines = []
        print(client, json.dumps(results["clients"][client]["verdict"]), flush=True)
    results["load_average_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"{'client':<7} {'session':<8} {'prompt':>7} {'cached':>7} {'ttft s':>8}")
    for client, data in results["clients"].items():
        for r in data["sessions"]:
            print(
                f"{client:<7} {r['session']:<8} {r['prompt_tokens']!s:>7} {r['cached_tokens']!s:>7} {r['ttft_s']!s:>8}"
            )
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

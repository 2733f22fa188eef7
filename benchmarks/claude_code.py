"""Claude Code end to end against `coreai serve` (issue 46): the real CLI (node_modules/.bin/claude)
runs one task in a workspace holding hello.py against a real server on loopback, through a
recorder; then the server restarts on the same `--prompt-cache-dir` and the session's last request
is sent again. Prints and writes (JSON) per Messages request (turn): the model slot, prompt tokens,
those read from the prefix cache (`cache_read_input_tokens`), TTFT (the engine's, from its log) and
the time to the first content block; the tool calls the CLI executed; the restart's TTFT and
cache read, beside the first turn's cold TTFT.

    python -m benchmarks.claude_code [--model qwen2.5-coder-0.5b-instruct] [--max-turns 5]
        [--full] [--loop-guard] [--out benchmarks/results/claude_code.json]

By default the CLI runs with its own `--system-prompt` and `--tools Read` (its full default prompt,
about 20,000 tokens of the default model, takes many minutes to prefill on a CPU); `--full` runs the
full default set-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the agent-CLI helper the tests use (one home: tests/agent_cli.py)

PROMPT = "What does hello.py print? Read it, and greet.py too, then answer."
FILES = {
    "hello.py": 'from greet import greet\n\nprint(greet("world"))\n',
    "greet.py": 'def greet(name):\n    return f"Hello, {name}!"\n',
}
SYSTEM = (
    "You are a coding assistant in {workspace}. Read files with the Read tool (absolute paths), then answer briefly."
)
TTFT_LOG = re.compile(r"prompt (\d+) tokens \((\d+) cached\), ttft ([\d.]+) s")


class EngineLog(logging.Handler):
    """The engine's per-generation log lines: (prompt tokens, cached tokens, TTFT seconds)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.rows: list[tuple[int, int, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if found := TTFT_LOG.search(record.getMessage()):
            self.rows.append((int(found[1]), int(found[2]), float(found[3])))


def turn_rows(exchanges, engine: list[tuple[int, int, float]]) -> list[dict]:
    """One row per streamed Messages exchange (in order), with the engine's TTFT of its generation."""
    rows = []
    posts = [x for x in exchanges if x.path.startswith("/v1/messages") and "count_tokens" not in x.path]
    for i, x in enumerate(posts):
        usage = x.usage()
        row = {
            "turn": i + 1,
            "model": (x.body or {}).get("model"),
            "status": x.status,
            "prompt_tokens": usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0),
            "cache_read_input_tokens": usage.get("cache_read_input_tokens"),
            "output_tokens": usage.get("output_tokens"),
            "stop_reason": usage.get("stop_reason"),
            "first_block_s": round(x.ttft, 2) if x.ttft is not None else None,
            "seconds": round(x.seconds, 2),
        }
        if i < len(engine):
            row["ttft_s"] = round(engine[i][2], 2)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=256, help="the server's --max-tokens")
    parser.add_argument("--full", action="store_true", help="the CLI's full default prompt and tools")
    parser.add_argument("--loop-guard", action="store_true", help="serve with --loop-guard")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "claude_code.json")
    args = parser.parse_args(argv)

    import httpx
    from agent_cli import CLAUDE, MISSING, Recorder, fresh_workspace, run_claude

    from coreai.api import load
    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    if not CLAUDE.exists():
        raise SystemExit(MISSING)
    engine_log = EngineLog()
    logging.getLogger("coreai.service").addHandler(engine_log)
    logging.getLogger("coreai.service").setLevel(logging.INFO)
    model = load(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        options = dict(aliases=("claude-*",), max_tokens=args.max_tokens, temperature=0.0, loop_guard=args.loop_guard)
        config = ServerConfig(model_name=args.model, prompt_cache_dir=str(root / "kv"), **options)  # type: ignore[arg-type]
        workspace = fresh_workspace(root, FILES)
        cli_args = ["--max-turns", str(args.max_turns)]
        if not args.full:
            cli_args += ["--system-prompt", SYSTEM.format(workspace=workspace), "--tools", "Read"]
        recorder = Recorder()
        with serve_in_thread(model, config) as base:
            recorder.upstream = base
            with recorder.serving() as front:
                run = run_claude(front, workspace, PROMPT, *cli_args, timeout=6 * 3600)
        turns = turn_rows(recorder.exchanges, engine_log.rows)
        last = next(
            x for x in reversed(recorder.exchanges) if x.body and x.body.get("model") == recorder_main(recorder)
        )
        kept = sorted(p.name for p in (root / "kv").glob("*"))
        engine_log.rows.clear()
        with serve_in_thread(model, config) as base:  # the restart, on the same prompt-cache folder
            start = time.monotonic()
            reply = httpx.post(base + last.path, json=last.body, headers={"anthropic-beta": "x"}, timeout=None)
            restart_seconds = time.monotonic() - start
    restart_usage = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
    final = next((e["usage"] for e in reversed(restart_usage) if e.get("type") == "message_delta"), {})
    results = {
        "model": args.model,
        "cli": "claude-code 2.1.332",
        "setup": "full default prompt and tools" if args.full else "--system-prompt (short) --tools Read",
        "max_turns": args.max_turns,
        "loop_guard": args.loop_guard,
        "exit_code": run.returncode,
        "result": run.result.get("result"),
        "terminal_reason": run.result.get("terminal_reason"),
        "tool_calls_made": len(run.blocks("assistant", "tool_use")),
        "tool_calls_executed": len(run.blocks("user", "tool_result")),
        "distinct_tool_calls": len(
            {json.dumps([b["name"], b["input"]], sort_keys=True) for b in run.blocks("assistant", "tool_use")}
        ),
        "turns": turns,
        "kept_files": kept,
        "restart": {
            "prompt_tokens": final.get("input_tokens", 0) + final.get("cache_read_input_tokens", 0),
            "cache_read_input_tokens": final.get("cache_read_input_tokens"),
            "ttft_s": round(engine_log.rows[0][2], 2) if engine_log.rows else None,
            "seconds": round(restart_seconds, 2),
        },
        "cold_ttft_s": turns[0].get("ttft_s") if turns else None,
        "load_average": os.getloadavg(),
        "cli_seconds": round(run.seconds, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"{'turn':>4} {'model':<20} {'prompt':>7} {'cached':>7} {'ttft s':>7} {'block s':>8} {'stop':<10}")
    for t in turns:
        print(
            f"{t['turn']:>4} {t['model']:<20} {t['prompt_tokens']:>7} {t['cache_read_input_tokens']!s:>7} "
            f"{t.get('ttft_s')!s:>7} {t['first_block_s']!s:>8} {t['stop_reason']!s:<10}"
        )
    r = results["restart"]
    print(f"tool calls executed {results['tool_calls_executed']} ({results['distinct_tool_calls']} distinct)")
    print(f"restart: prompt {r['prompt_tokens']}, cached {r['cache_read_input_tokens']}, ttft {r['ttft_s']} s")
    print(f"-> {args.out}")
    return 0


def recorder_main(recorder) -> str | None:
    """The model id of the session's main slot (its first Messages request's)."""
    return next((x.body.get("model") for x in recorder.exchanges if x.body and "messages" in x.body), None)


if __name__ == "__main__":
    raise SystemExit(main())

"""A Codex CLI session against `coreai serve` on the real model (issue #47): the pinned Codex CLI
(node_modules/.bin/codex) through a timing proxy (`tests/codex_cli.py`'s `recording_proxy`, HTTP
transport), its prompt shortened by its own configuration (`short_config`), a low auto-compact limit
so that it compacts. Prints and writes, per request: whether it was a turn or a compaction, the
prompt tokens, those read from the prefix cache, the time to the first output item (TTFT) and the
whole time; then turns, tool calls executed, compaction time and the prompt tokens it saved.

    python -m benchmarks.codex_session [--model qwen2.5-coder-0.5b-instruct] [--compact-limit 2000]
        [--repetition-penalty 1.15] [--[no-]loop-guard] [--edit] [--turn-timeout 900] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Four questions, each answered by reading one file (a tool round trip per turn). An edit turn
# ('Change hello.py so that it prints "Hello, Bob!".') ended by the budget in every run on the 0.5B
# model (docs/reports/codex.md): `--edit` puts it back as the second turn.
FILES = {
    "hello.py": 'print("Hello, Ada!")\n',
    "bye.py": 'name = "Grace"\nprint(f"Bye, {name}!")\n',
    "sum.py": "print(sum([1, 2, 3]))\n",
    "count.py": 'print(len("coreai"))\n',
}
PROMPTS = [f"What does {name} print?" for name in FILES]
EDIT = 'Change hello.py so that it prints "Hello, Bob!".'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--compact-limit", type=int, default=2000, help="Codex's model_auto_compact_token_limit")
    parser.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.15,
        help="the server's default (`coreai serve --repetition-penalty`; 1: none): without it the 0.5B model "
        "runs away inside a call's arguments (a request_user_input of endless questions, a string of zeros)",
    )
    parser.add_argument(
        "--loop-guard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="`coreai serve --loop-guard`: without it the model, at temperature 0, repeats a call after each "
        "compaction until the turn times out",
    )
    parser.add_argument("--edit", action="store_true", help="the edit turn of the earlier runs as turn 2")
    parser.add_argument("--turn-timeout", type=float, default=900, help="seconds a turn may take")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "codex_session.json")
    args = parser.parse_args(argv)

    import uvicorn

    sys.path.insert(0, str(ROOT / "tests"))  # the CLI runner lives with the tests that drive it
    from codex_cli import codex_exec, codex_missing, recording_proxy, short_config

    from coreai.api import load
    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    if codex_missing():
        print(codex_missing())
        return 1
    model = load(args.model)
    measure: list[dict] = []
    turns = []
    penalty = args.repetition_penalty
    config = ServerConfig(
        model_name=args.model, max_tokens=1024, temperature=0.0, repetition_penalty=penalty, loop_guard=args.loop_guard
    )
    with serve_in_thread(model, config) as base, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        proxy = uvicorn.Server(uvicorn.Config(recording_proxy(base, None, measure), port=0, log_level="warning"))
        threading.Thread(target=proxy.run, daemon=True).start()
        while not proxy.started:
            time.sleep(0.1)
        port = proxy.servers[0].sockets[0].getsockname()[1]
        # the top-level key before the tables of `short_config`
        extra = f"model_auto_compact_token_limit = {args.compact_limit}\n" + short_config(tmp, args.model)
        prompts = PROMPTS[:1] + [EDIT] + PROMPTS[1:] if args.edit else PROMPTS
        for i, prompt in enumerate(prompts):
            start = time.perf_counter()
            try:
                run = codex_exec(
                    f"http://127.0.0.1:{port}",
                    args.model,
                    prompt,
                    tmp,
                    websockets=False,
                    extra_config=extra,
                    files=FILES if i == 0 else None,
                    timeout=args.turn_timeout,
                    resume=i > 0,
                )
            except subprocess.TimeoutExpired:  # Codex killed: the turn did not end within --turn-timeout
                turns.append({"prompt": prompt, "seconds": args.turn_timeout, "completed": False, "timed_out": True})
                print(f"turn {i + 1}: timed out after {args.turn_timeout} s")
                continue
            executed = run.items("command_execution") + run.items("file_change")
            turns.append(
                {
                    "prompt": prompt,
                    "seconds": round(time.perf_counter() - start, 1),
                    "completed": run.completed,
                    "tool_calls_executed": len(executed),
                    # what the model asked Codex to run, and its answer: a session can pass while the answers are wrong
                    "commands": [c.get("command") for c in run.items("command_execution")],
                    "answer": "\n".join(m.get("text", "") for m in run.items("agent_message")),
                    "errors": run.errors,
                }
            )
            print(f"turn {i + 1}: {turns[-1]['seconds']} s, {len(executed)} tool calls executed, errors {run.errors}")
            print(f"  commands: {turns[-1]['commands']}\n  answer: {turns[-1]['answer'][:300]!r}")
        proxy.should_exit = True
    rows = []
    for m in measure:
        usage = m.get("usage") or {}
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
        rows.append(
            {
                "kind": "turn" if m["tools"] else "compaction",
                "tool_output_sent": m["tool_output"],
                "prompt_tokens": usage.get("input_tokens"),
                "cached_prompt_tokens": cached,
                "ttft_s": m["ttft_s"],
                "seconds": m["seconds"],
            }
        )
        print(rows[-1])
    compactions = [i for i, r in enumerate(rows) if r["kind"] == "compaction"]
    saved = []
    for i in compactions:
        before = next((r["prompt_tokens"] for r in reversed(rows[:i]) if r["kind"] == "turn"), None)
        after = next((r["prompt_tokens"] for r in rows[i + 1 :] if r["kind"] == "turn"), None)
        if before is not None and after is not None:
            saved.append(before - after)
    summary = {
        "model": args.model,
        "repetition_penalty": penalty,
        "compact_limit": args.compact_limit,
        "loop_guard": args.loop_guard,
        "prompts": prompts,
        "turns": turns,
        "requests": rows,
        "tool_calls_executed": sum(t.get("tool_calls_executed", 0) for t in turns),
        "tool_round_trips": sum(r["tool_output_sent"] for r in rows),  # a tool's output sent back to the model
        "compaction_seconds": [rows[i]["seconds"] for i in compactions],
        "prompt_tokens_saved_by_compaction": saved,
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps({k: v for k, v in summary.items() if k not in ("turns", "requests")}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

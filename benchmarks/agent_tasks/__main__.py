"""Run the agent tasks (`benchmarks.agent_tasks.tasks`) through one agent CLI against a running
`coreai serve`, each in a fresh temporary workspace with its own HOME, the CLI configured and run by
`coreai launch` (`--config-dir` in the task's folder), and write the figures.

    python -m benchmarks.agent_tasks --client claude|codex|opencode [--tasks a,b] [--base-url URL]
        [--short] [--max-tokens N] [--max-turns N] [--timeout S] [--cli-arg ARG ...] [--out FILE]

Per task: pass or fail and why (the checker's words), the exit code, tool calls (valid, invalid,
errored, repeated identical), the CLI's turns, the server's model requests, prompt tokens and the
share read from the prefix cache (deltas of /health's `stats`: `prefills`, `prefill_tokens`,
`cached_tokens`), seconds to the CLI's first model output (from its start: the CLI's own start-up
included) and wall time; the transcript's summary (answer, calls, errors) and the raw events (long
strings cut) go in the JSON (default benchmarks/results/agent_tasks_<client>[_short].json) with
the command, the server's /health and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from benchmarks.agent_tasks import transcripts
from benchmarks.agent_tasks.tasks import BY_NAME, TASKS, Task

ROOT = Path(__file__).resolve().parents[2]


def health(base_url: str) -> dict:
    # A server busy with a long prefill can answer late (its event loop shares the GIL with the worker).
    with urllib.request.urlopen(f"{base_url}/health", timeout=120) as reply:
        return json.loads(reply.read())


def cut(value, limit: int = 1500):
    """JSON data with every string longer than `limit` cut (a transcript holds whole prompts)."""
    if isinstance(value, dict):
        return {k: cut(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [cut(v, limit) for v in value]
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"...[{len(value) - limit} more]"
    return value


def run_task(task: Task, args, host: str, port: int) -> dict:
    """One task in a fresh folder: the workspace, HOME and the CLI's configuration under it."""
    with tempfile.TemporaryDirectory(prefix=f"agent-{task.name}-") as tmp:
        work, home = Path(tmp) / "work", Path(tmp) / "home"
        work.mkdir()
        home.mkdir()
        task.write(work)
        launch = [sys.executable, "-m", "coreai", "launch", args.client, "--host", host, "--port", str(port)]
        launch += ["--config-dir", str(Path(tmp) / "config"), "--max-tokens", str(args.max_tokens)]
        launch += ["--short"] if args.short else []
        cli = transcripts.cli_args(args.client, task.prompt, args.max_turns, tuple(args.cli_arg))
        command = [*launch, "--", *cli]
        drop = ("ANTHROPIC_", "OPENAI_", "CODEX_", "OPENCODE_", "CLAUDE_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)} | {"HOME": str(home), "NO_COLOR": "1"}
        env["PWD"] = str(work)  # opencode takes its project folder from $PWD, not the process's cwd
        before = health(args.base_url)["stats"]
        start = time.monotonic()
        lines: list[tuple[float, dict]] = []
        child = subprocess.Popen(
            command,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # the watchdog ends launch and the CLI together (the CLI holds the pipe)
        )
        watchdog = threading.Timer(args.timeout, os.killpg, (child.pid, signal.SIGKILL))
        watchdog.start()
        try:
            assert child.stdout is not None
            for line in child.stdout:  # the arrival time of each event
                if line.startswith("{"):
                    try:
                        lines.append((round(time.monotonic() - start, 2), json.loads(line)))
                    except ValueError:
                        pass
            code = child.wait()
        finally:
            watchdog.cancel()
        timed_out = time.monotonic() - start >= args.timeout
        stderr = child.stderr.read() if child.stderr else ""
        wall = time.monotonic() - start
        after = health(args.base_url)["stats"]
        transcript = transcripts.refused(args.client, transcripts.PARSERS[args.client](lines), stderr)
        passed, why = task.check(work, transcript.answer)
    computed = after["prefill_tokens"] - before["prefill_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    return {
        "task": task.name,
        "kind": task.kind,
        "passed": passed and code == 0,
        "why": why if code == 0 else f"exit {code}{' (timed out)' if timed_out else ''}; {why}",
        "exit_code": code,
        **transcript.counts(),
        "turns": transcript.turns,
        "model_requests": after["prefills"] - before["prefills"],
        "prompt_tokens": computed + cached,
        "cached_share": round(cached / (computed + cached), 3) if computed + cached else None,
        "first_output_s": transcript.first_output_s,
        "wall_s": round(wall, 1),
        "transcript": transcript.summary(),
        "stderr": stderr[-1500:],
        "events": cut([event for _, event in lines]),
    }


COLUMNS = ("task", "pass", "exit", "calls", "valid", "invalid", "errored", "repeated", "turns", "requests")
COLUMNS += ("prompt_tok", "cached", "first_s", "wall_s")


def table(rows: list[dict]) -> str:
    out = [" | ".join(COLUMNS), " | ".join("---" for _ in COLUMNS)]
    for r in rows:
        share = "-" if r["cached_share"] is None else f"{r['cached_share']:.0%}"
        cells = (r["task"], "yes" if r["passed"] else "no", r["exit_code"], r["tool_calls"], r["valid"], r["invalid"])
        cells += (r["errored"], r["repeated"], r["turns"], r["model_requests"], r["prompt_tokens"], share)
        cells += (r["first_output_s"] if r["first_output_s"] is not None else "-", r["wall_s"])
        out.append(" | ".join(str(c) for c in cells))
    return "\n".join(out)


def reread(path: Path, client: str) -> int:
    """The counts of a results file's tasks read again from the events it kept (after a change to
    `transcripts`); the times stay as measured."""
    result = json.loads(path.read_text())
    for row in result["tasks"]:
        transcript = transcripts.PARSERS[client]([(0.0, event) for event in row["events"]])
        transcript = transcripts.refused(client, transcript, row.get("stderr", ""))
        row |= transcript.counts() | {"turns": transcript.turns, "transcript": transcript.summary()}
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result["tasks"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.agent_tasks", description=__doc__.splitlines()[0])
    p.add_argument("--client", required=True, choices=sorted(transcripts.PARSERS))
    p.add_argument("--tasks", help=f"comma-separated task names (default: all {len(TASKS)}): {', '.join(BY_NAME)}")
    p.add_argument("--base-url", default="http://127.0.0.1:8080", help="a running coreai serve (default: %(default)s)")
    p.add_argument("--short", action="store_true", help="coreai launch --short: the CLI's shorter prompt, fewer tools")
    p.add_argument("--max-tokens", type=int, default=1024, help="the server's reply bound (default: %(default)s)")
    p.add_argument("--max-turns", type=int, default=8, help="Claude Code's --max-turns (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per task (default: %(default)s)")
    p.add_argument("--cli-arg", action="append", default=[], help="one more option for the CLI (repeat it)")
    p.add_argument("--out", type=Path)
    p.add_argument("--reread", type=Path, help="a results file: its tool-call counts read again from its events")
    args = p.parse_args(argv)
    if args.reread:
        return reread(args.reread, args.client)
    names = args.tasks.split(",") if args.tasks else list(BY_NAME)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"unknown tasks {unknown}; known: {', '.join(BY_NAME)}")
    url = urlparse(args.base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    try:
        server = health(args.base_url)
    except OSError as exc:
        p.error(f"no coreai serve answers at {args.base_url}/health ({exc}): start one first")
    load = [round(x, 2) for x in os.getloadavg()]
    name = f"agent_tasks_{args.client}{'_short' if args.short else ''}.json"
    out = args.out or ROOT / "benchmarks" / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for name in names:  # the file is written after each task: a run stopped midway keeps its tasks
        rows.append(run_task(BY_NAME[name], args, host, port))
        r = rows[-1]
        print(f"{name}: {'pass' if r['passed'] else 'FAIL'} ({r['why']}) {r['wall_s']} s", flush=True)
        end = [round(x, 2) for x in os.getloadavg()]
        result = {
            "command": " ".join(["python -m benchmarks.agent_tasks", *(argv if argv is not None else sys.argv[1:])]),
            "client": args.client,
            "server": {k: server.get(k) for k in ("model", "aliases")},
            "load_average": {"start": load, "end": end},
            "passed": sum(r["passed"] for r in rows),
            "tasks": rows,
        }
        out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(rows))
    print(f"{sum(r['passed'] for r in rows)}/{len(rows)} passed; load average {load} at the start, {end} at the end")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Re-capture the recorded Claude Code session that tests/test_agent_cli.py replays (run it after a
new CLI release is pinned in package.json, then `make install`):

    python tests/capture_claude_code.py            # writes tests/data/claude_code/session.json
                                                   # and other_question.json

The CLI runs its full default set-up (system prompt, tools, deferred tools, thinking) in an empty
workspace holding hello.py, against a `Recorder` whose script plays the model: it loads a deferred
tool with ToolSearch (`select:TaskList`), calls it, reads hello.py, then answers. The CLI executes
each call, so the recording holds its real requests with real tool results (tool_reference blocks
included). Keys and the machine's paths are taken out (`agent_cli.scrubbed`). No model is needed.

A second session in the same workspace with another first question is cut after its first request
(`OTHER`, other_question.json): the agent-prefix tests replay it after the session's first request
(Claude Code's billing line differs between the two; the rest of the prefix does not).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_cli import CLAUDE, MAIN_MODEL, ROOT, Recorder, fresh_workspace, run_claude, scrubbed  # noqa: E402

OUT = ROOT / "tests" / "data" / "claude_code" / "session.json"
OTHER = OUT.with_name("other_question.json")
OTHER_PROMPT = "How many lines does hello.py have?"
HELLO = 'print("Hello, world!")\n'
PROMPT = "What does hello.py print?"
WORKSPACE, HOME = "/tmp/workspace", "/tmp/home"  # the stand-ins of the machine's paths


def results(body: dict) -> int:
    """The tool_result blocks in a request's messages: the step of the scripted session."""
    return sum(
        b.get("type") == "tool_result" for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
    )


def script(workspace: Path):
    def reply(body: dict) -> tuple[list[dict], str]:
        if body["model"] != MAIN_MODEL:  # the small-model side requests (titles, summaries)
            return [{"type": "text", "text": "Hello world"}], "end_turn"
        step = results(body)
        calls = [
            ("ToolSearch", {"query": "select:TaskList", "max_results": 5}),
            ("TaskList", {}),
            ("Read", {"file_path": str(workspace / "hello.py")}),
        ]
        if step < len(calls):
            name, args = calls[step]
            return [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": f"toolu_{step:02d}", "name": name, "input": args},
            ], "tool_use"
        return [{"type": "text", "text": "hello.py prints `Hello, world!`."}], "end_turn"

    return reply


def session(prompt: str, script_of) -> list[dict]:
    """The requests of one scripted CLI run on `prompt` in a fresh workspace holding hello.py, scrubbed."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        workspace = fresh_workspace(root, {"hello.py": HELLO})
        recorder = Recorder(script=script_of(workspace))
        with recorder.serving() as base:
            run = run_claude(base, workspace, prompt, home=root / "home", essential_only=False)
        if run.returncode != 0:
            raise SystemExit(f"the CLI failed: {run.describe()}")
        paths = {str(workspace): WORKSPACE, str(root / "home"): HOME, str(root): "/tmp", str(Path.home()): HOME}
        paths[re.sub("[^A-Za-z0-9]", "-", str(workspace))] = WORKSPACE.replace("/", "-")  # its memory folder
        return [
            scrubbed({"method": x.method, "path": x.path, "headers": x.headers, "body": x.body}, paths)
            for x in recorder.exchanges
        ]


def write(path: Path, requests: list[dict]) -> None:
    version = next((r["headers"].get("user-agent", "") for r in requests if r["body"]), "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cli": version, "requests": requests}, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(requests)} requests of {version} ({CLAUDE.name}) -> {path.relative_to(ROOT)}")


def main() -> None:
    write(OUT, session(PROMPT, script))
    answer = lambda workspace: lambda body: ([{"type": "text", "text": "One line."}], "end_turn")  # noqa: E731
    first = [r for r in session(OTHER_PROMPT, answer) if (r["body"] or {}).get("model") == MAIN_MODEL][:1]
    write(OTHER, first)


if __name__ == "__main__":
    main()

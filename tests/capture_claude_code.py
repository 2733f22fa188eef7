"""Re-capture the recorded Claude Code session that tests/test_agent_cli.py replays (run it after a
new CLI release is pinned in package.json, then `make install`):

    python tests/capture_claude_code.py            # writes tests/data/claude_code/session.json

The CLI runs its full default set-up (system prompt, tools, deferred tools, thinking) in an empty
workspace holding hello.py, against a `Recorder` whose script plays the model: it loads a deferred
tool with ToolSearch (`select:TaskList`), calls it, reads hello.py, then answers. The CLI executes
each call, so the recording holds its real requests with real tool results (tool_reference blocks
included). Keys and the machine's paths are taken out (`agent_cli.scrubbed`). No model is needed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_cli import CLAUDE, MAIN_MODEL, ROOT, Recorder, fresh_workspace, run_claude, scrubbed  # noqa: E402

OUT = ROOT / "tests" / "data" / "claude_code" / "session.json"
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


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        workspace = fresh_workspace(root, {"hello.py": HELLO})
        recorder = Recorder(script=script(workspace))
        with recorder.serving() as base:
            run = run_claude(base, workspace, PROMPT, home=root / "home", essential_only=False)
        if run.returncode != 0:
            raise SystemExit(f"the CLI failed: {run.describe()}")
        paths = {str(workspace): WORKSPACE, str(root / "home"): HOME, str(root): "/tmp", str(Path.home()): HOME}
        requests = [
            scrubbed({"method": x.method, "path": x.path, "headers": x.headers, "body": x.body}, paths)
            for x in recorder.exchanges
        ]
    version = next((r["headers"].get("user-agent", "") for r in requests if r["body"]), "")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"cli": version, "requests": requests}, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(requests)} requests of {version} ({CLAUDE.name}) -> {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

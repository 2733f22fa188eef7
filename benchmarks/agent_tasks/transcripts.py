"""Each CLI's JSON output read into one shape: the final answer, the tool calls (name, input, whether
the CLI reported an error, whether the error was about the call's input), the CLI's turns, its
token counts, and the seconds to its first model output.

- Claude Code (`-p --output-format stream-json --verbose`): `assistant` events' `tool_use` blocks,
  `user` events' `tool_result` blocks (`is_error`), the closing `result` event (answer, `num_turns`).
- Codex (`exec --json`): `command_execution`, `file_change` and `mcp_tool_call` items (failed, or a
  command exiting non-zero, is an error), `agent_message` items (the last is the answer), `error`
  items and `turn.failed`, `turn.completed`'s usage.
- opencode (`run --format json`): `tool_use` events (their part's `state.status` "error"; the tool
  `invalid` is a call opencode could not read, e.g. arguments that are not JSON), `text`
  events (the answer: the last step's text), `step_start` events (turns), `step_finish` tokens.

An error counts as an invalid input when its message says the input did not validate (the CLIs'
words: Claude Code's `InputValidationError`, opencode's "invalid arguments", Codex's "failed to
parse").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

INVALID = ("inputvalidationerror", "invalid arguments", "invalid input", "failed to parse", "invalid_type")


@dataclass
class Call:
    name: str
    input: object
    error: bool = False
    message: str = ""

    @property
    def invalid(self) -> bool:
        return self.error and any(word in self.message.lower() for word in INVALID)

    @property
    def key(self) -> str:
        return self.name + json.dumps(self.input, sort_keys=True)


@dataclass
class Transcript:
    answer: str = ""
    calls: list[Call] = field(default_factory=list)
    turns: int = 0
    errors: list[str] = field(default_factory=list)  # the CLI's own error events (API errors, failed turns)
    usage: dict = field(default_factory=dict)  # as the CLI reports it
    first_output_s: float | None = None  # seconds from the CLI's start to its first model output

    def counts(self) -> dict:
        seen: set[str] = set()
        repeated = 0
        for call in self.calls:
            repeated += call.key in seen
            seen.add(call.key)
        invalid = sum(c.invalid for c in self.calls)
        return {
            "tool_calls": len(self.calls),
            "invalid": invalid,
            "errored": sum(c.error for c in self.calls) - invalid,
            "valid": len(self.calls) - sum(c.error for c in self.calls),
            "repeated": repeated,
        }

    def summary(self) -> dict:
        """The transcript as the results file keeps it (the calls' inputs and errors cut short)."""
        calls = [asdict(c) | {"input": json.dumps(c.input)[:500], "message": c.message[:300]} for c in self.calls]
        head = {"answer": self.answer[:2000], "turns": self.turns, "errors": self.errors[:10], "usage": self.usage}
        return head | {"calls": calls}


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_text(c.get("text", c.get("content", ""))) if isinstance(c, dict) else str(c) for c in content)
    return str(content)


def claude(lines: list[tuple[float, dict]]) -> Transcript:
    t = Transcript()
    by_id: dict[str, Call] = {}
    for seconds, event in lines:
        kind = event.get("type")
        content = (event.get("message") or {}).get("content")
        if kind == "assistant" and isinstance(content, list):
            if t.first_output_s is None:
                t.first_output_s = seconds
            for block in content:
                if block.get("type") == "tool_use":
                    by_id[block["id"]] = Call(block["name"], block.get("input"))
                    t.calls.append(by_id[block["id"]])
        elif kind == "user" and isinstance(content, list):
            for block in content:
                if block.get("type") == "tool_result" and block.get("tool_use_id") in by_id:
                    call = by_id[block["tool_use_id"]]
                    call.error = bool(block.get("is_error"))
                    call.message = _text(block.get("content"))[:2000] if call.error else ""
        elif kind == "result":
            t.answer = str(event.get("result") or "")
            t.turns = int(event.get("num_turns") or 0)
            t.usage = event.get("usage") or {}
            if event.get("is_error") or event.get("api_error_status"):
                t.errors.append(f"{event.get('subtype')}: {str(event.get('result'))[:300]}")
    return t


def codex(lines: list[tuple[float, dict]]) -> Transcript:
    t = Transcript()
    for seconds, event in lines:
        kind = event.get("type")
        item = event.get("item") or {}
        if kind in ("item.started", "item.completed") and t.first_output_s is None and item.get("type") != "error":
            t.first_output_s = seconds
        if kind == "turn.started":
            t.turns += 1
        elif kind == "turn.completed":
            t.usage = event.get("usage") or {}
        elif kind in ("turn.failed", "error"):
            t.errors.append(str(event.get("message") or (event.get("error") or {}).get("message"))[:300])
        if kind != "item.completed":
            continue
        if item.get("type") == "agent_message":
            t.answer = item.get("text") or ""
        elif item.get("type") == "command_execution":
            failed = item.get("status") == "failed" or (item.get("exit_code") not in (0, None))
            output = str(item.get("aggregated_output") or "")
            t.calls.append(Call("shell", item.get("command"), failed, output[-2000:] if failed else ""))
        elif item.get("type") == "file_change":
            failed = item.get("status") == "failed"
            t.calls.append(Call("apply_patch", item.get("changes"), failed, str(item)[-500:] if failed else ""))
        elif item.get("type") == "mcp_tool_call":
            failed = item.get("status") == "failed"
            name = f"{item.get('server')}.{item.get('tool')}"
            t.calls.append(Call(name, item.get("arguments"), failed, str(item.get("error") or "")[:2000]))
        elif item.get("type") == "error":
            t.errors.append(str(item.get("message"))[:300])
    return t


def opencode(lines: list[tuple[float, dict]]) -> Transcript:
    t = Transcript()
    step_text: list[str] = []
    tokens = {"input": 0, "output": 0, "cache_read": 0}
    for seconds, event in lines:
        kind, part = event.get("type"), event.get("part") or {}
        if kind in ("text", "tool_use") and t.first_output_s is None:
            t.first_output_s = seconds
        if kind == "step_start":
            t.turns += 1
            step_text = []
        elif kind == "text":
            step_text.append(part.get("text") or "")
            t.answer = "".join(step_text)
        elif kind == "tool_use" and part.get("tool") == "invalid":  # a call opencode could not read
            given = (part.get("state") or {}).get("input") or {}
            t.calls.append(Call(str(given.get("tool", "?")), given, True, str(given.get("error") or "invalid input")))
        elif kind == "tool_use":
            state = part.get("state") or {}
            failed = state.get("status") == "error"
            t.calls.append(Call(part.get("tool", "?"), state.get("input"), failed, str(state.get("error") or "")))
        elif kind == "step_finish":
            got = part.get("tokens") or {}
            tokens["input"] += got.get("input") or 0
            tokens["output"] += got.get("output") or 0
            tokens["cache_read"] += (got.get("cache") or {}).get("read") or 0
        elif kind == "error":
            t.errors.append(json.dumps(event.get("error") or event)[:300])
    t.usage = tokens
    return t


PARSERS = {"claude": claude, "codex": codex, "opencode": opencode}
CODEX_REFUSED = "codex_core::tools::router: error="  # a call Codex refused before running it: on stderr only


# Codex's router errors about a call's input, not its run ("write_stdin failed: Unknown process id 1"
# is a call that ran and failed: errored, not invalid).
CODEX_INPUT_ERRORS = ("requires an explicit", "failed to parse", "missing field", "unknown field", "invalid type")


def refused(client: str, t: Transcript, stderr: str) -> Transcript:
    """`t` with the calls that Codex's tool router reported only on stderr added: refused for their
    input (e.g. "`justification` requires an explicit `sandbox_permissions`") as invalid, the others
    as errored."""
    if client == "codex":
        for line in stderr.splitlines():
            if CODEX_REFUSED in line:
                message = line.split(CODEX_REFUSED, 1)[1]
                bad_input = any(words in message for words in CODEX_INPUT_ERRORS)
                t.calls.append(Call("refused", message, True, ("invalid input: " if bad_input else "") + message))
    return t


def cli_args(client: str, prompt: str, max_turns: int, extra: tuple[str, ...] = ()) -> list[str]:
    """The CLI's non-interactive arguments: JSON output, tools allowed without asking (the workspace is
    a fresh temporary folder); `extra`: more of the CLI's options (Codex's `-c key=value`)."""
    if client == "claude":
        return [
            *extra,
            "-p",
            prompt,
            "--output-format",
            "stream-json",
            "--verbose",
            "--max-turns",
            str(max_turns),
            "--permission-mode",
            "acceptEdits",
            "--allowedTools",
            "Bash,Read,Edit,Write,Glob,Grep",
        ]
    if client == "codex":
        return ["exec", *extra, "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt]
    return ["run", *extra, "--format", "json", "--auto", prompt]

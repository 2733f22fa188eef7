"""OpenAI's `local_shell` tool (`{"type": "local_shell"}`): a shell the client runs, as Codex's
older models use it. The model sees it as a function `local_shell` whose arguments are the `exec`
action's fields (OpenAI's `LocalShellCallAction`: `command` as argv, `env`, `timeout_ms`,
`working_directory`), constrained like any function tool's (`PARAMETERS`); its call is a
`local_shell_call` output item (`call_item`), and one passed back, with its
`local_shell_call_output`, is the same call and result again (`chat_call`). Computer use
(`computer_use_preview`) stays a hosted tool: its results are screenshots, which these models
cannot read.
"""

from __future__ import annotations

import json

from coreai.server.responses import schemas as r

NAME = "local_shell"
DESCRIPTION = (
    "Run a command on the user's machine and get its output. `command` is the argument vector "
    '(for example ["ls", "-la"], or ["bash", "-lc", "grep -rn main ."] for a shell pipeline).'
)
PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "working_directory": {"type": "string"},
        "timeout_ms": {"type": "integer", "minimum": 1},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["command"],
    "additionalProperties": False,
}


def tool() -> r.FunctionTool:
    """The function tool the model sees for `local_shell`."""
    return r.FunctionTool(type="function", name=NAME, description=DESCRIPTION, parameters=PARAMETERS, strict=True)


def call_item(item_id: str, call_id: str, arguments: str, status) -> r.OutputLocalShellCall:
    """A `local_shell_call` output item of a call's arguments (JSON text of `PARAMETERS`; the
    grammar held them to it)."""
    given = json.loads(arguments) if arguments else {}
    action = {
        "type": "exec",
        "command": given.get("command", []),
        "env": given.get("env", {}),
        "timeout_ms": given.get("timeout_ms"),
        "user": None,
        "working_directory": given.get("working_directory"),
    }
    return r.OutputLocalShellCall(id=item_id, call_id=call_id, action=action, status=status)


def chat_call(call_id: str, action: r.LocalShellAction) -> dict:
    """A passed-back call as a chat message's tool call, as the model wrote it: a `local_shell`
    function call whose arguments (JSON text) are the action's fields the schema has, unset ones
    left out."""
    given = action.model_dump(include={"command", "env", "timeout_ms", "working_directory"}, exclude_none=True)
    if not given.get("env"):
        given.pop("env", None)
    arguments = json.dumps(given, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": NAME, "arguments": arguments}}

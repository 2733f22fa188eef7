"""What every dialect maps the same way, in one neutral home below them: a message's role as the
chat template names it, the sampling fields a body gives by name, a tool call in the chat template's
shape, and the tool-call pairing of a conversation once it is chat messages (`{"role", "content",
"tool_calls", "tool_call_id"}`, what `prepare` renders). Each dialect maps its own shapes to chat
messages with these and words its own errors from what they return; nothing here names a dialect's
fields but the `param` a caller passes in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from guided.tools import INPUT
from runtime.sampling import given_sampling

# Roles a dialect may send that the chat templates know by another name.
TEMPLATE_ROLES = {"developer": "system"}


def template_role(role: str) -> str:
    """`role` as the chat templates name it (`developer` -> `system`)."""
    return TEMPLATE_ROLES.get(role, role)


def sampling_of(body: Any) -> dict[str, Any]:
    """The sampling fields `body` gives, read by name (`runtime.sampling.given_sampling`: temperature,
    top_p, top_k, min_p, repetition_penalty, seed, ...); a seed is taken mod 2**64 (OpenAI's are
    signed 64-bit)."""
    given = given_sampling(body)
    if "seed" in given:
        given["seed"] %= 2**64
    return given


def template_call(call_id: str, name: str, arguments: Any) -> dict:
    """A tool call as the chat template expects it, its arguments the JSON value (templates render
    them with `tojson`; a dialect that sends JSON text parses it first, naming its own field)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def template_custom_call(call_id: str, name: str, value: str) -> dict:
    """A custom tool's call as the chat template expects it: a function call whose one string
    argument is the input, the shape the tool is shown in (`guided.tools.custom`)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": {INPUT: value}}}


def pairing_error(messages: Sequence[dict]) -> tuple[int, str, str] | None:
    """`tool_pairing_error` of chat messages (dicts with `role`, `tool_calls`, `tool_call_id`)."""
    return tool_pairing_error(
        [(m["role"], [c["id"] for c in m.get("tool_calls") or []], m.get("tool_call_id")) for m in messages]
    )


def tool_pairing_error(turns: Sequence[tuple[str, list[str], str | None]]) -> tuple[int, str, str] | None:
    """The tool-call pairing OpenAI checks (its messages, with the spelling fixed), both ways: a tool
    message answers a call of the assistant message before it (other tool messages between them),
    else the template would render a result the model never asked for; and every call of an
    assistant message is answered by a tool message before the next other message (or the end),
    else the model would be asked to go on from a call that never returned. turns: each message's
    (role, its call ids, the call id it answers); returns (the index of the first message at fault,
    its field at fault, the message) or None."""
    calls: set[str] | None = None  # the ids of the last assistant message's calls, while tool messages follow
    pending: list[str] = []  # those not answered yet
    owner = 0  # the index of that assistant message
    for i, (role, ids, answers) in enumerate(turns):
        if role == "tool":
            if calls is None:
                return (
                    i,
                    "role",
                    "messages with role 'tool' must be a response to a preceding message with 'tool_calls'",
                )
            if answers not in calls:
                return i, "tool_call_id", f"'tool_call_id' of {answers!r} not found in 'tool_calls' of previous message"
            pending = [c for c in pending if c != answers]
            continue
        if pending:
            break
        calls = set(ids) if role == "assistant" and ids else None
        pending, owner = list(ids) if calls else [], i
    if pending:
        return (
            owner,
            "tool_calls",
            (
                "an assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'; not answered: {', '.join(pending)}"
            ),
        )
    return None

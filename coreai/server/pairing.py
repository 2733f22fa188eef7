"""The tool-call pairing every front end checks on a conversation (chat's messages, Responses' input
items, Anthropic's blocks), on each message's role and call ids alone, so that one rule names the
message at fault in each front end's own terms."""

from __future__ import annotations

from collections.abc import Sequence


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

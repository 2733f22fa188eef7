"""OpenAI's shapes of tool calls: the calls of a reply (`guided.toolcalls.ToolCall`) as a message's
`tool_calls` and as streamed `tool_calls` deltas. The grammar, the call boundaries and the verdict
are `guided`'s (`ConstrainedSession(tools=...)`); this module only maps them."""

from __future__ import annotations

from coreai.server import schemas as s
from guided.toolcalls import ToolCall, new_call_id


def message_tool_calls(calls: list[ToolCall]) -> list[s.ResponseToolCall] | None:
    """A message's `tool_calls` (None when there are none, as OpenAI sends)."""
    return [
        s.ResponseToolCall(id=c.id, function=s.ResponseFunctionCall(name=c.name, arguments=c.arguments)) for c in calls
    ] or None


def chunk_tool_call(event: tuple) -> s.ChunkToolCall:
    """The streamed delta of a `guided.toolcalls.CallStream` event: ("open", index, name) is the
    call's first delta (index, a new id, type, name, arguments ""), ("args", index, text) a fragment."""
    kind, index, value = event
    if kind == "open":
        return s.ChunkToolCall(
            index=index, id=new_call_id(), type="function", function=s.ChunkFunctionCall(name=value, arguments="")
        )
    return s.ChunkToolCall(index=index, function=s.ChunkFunctionCall(arguments=value))

"""OpenAI's shapes of tool calls: the calls of a reply (`guided.tools.calls.ToolCall`) as a message's
`tool_calls` and as streamed `tool_calls` deltas. The grammar, the call boundaries, the call ids and
the verdict are `guided`'s (`ConstrainedSession(tools=...)`); this module only maps them."""

from __future__ import annotations

from collections.abc import Sequence

from coreai.server import reply_schemas as o
from guided.tools.calls import ToolCall


def message_tool_calls(calls: list[ToolCall]) -> list[o.ResponseToolCall] | None:
    """A message's `tool_calls` (None when there are none, as OpenAI sends)."""
    return [
        o.ResponseToolCall(id=c.id, function=o.ResponseFunctionCall(name=c.name, arguments=c.arguments)) for c in calls
    ] or None


def chunk_tool_call(event: tuple, ids: Sequence[str]) -> o.ChunkToolCall:
    """The streamed delta of a `guided.tools.calls.CallStream` event: ("open", index, name) is the
    call's first delta (index, its id `ids[index]`, type, name, arguments ""), ("args", index, text)
    a fragment. ids: the generation's call ids by index (`CallTracker.ids`, the result's calls'),
    so a streamed call has the id its `ToolCall` has."""
    kind, index, value = event
    if kind == "open":
        return o.ChunkToolCall(
            index=index, id=ids[index], type="function", function=o.ChunkFunctionCall(name=value, arguments="")
        )
    return o.ChunkToolCall(index=index, function=o.ChunkFunctionCall(arguments=value))

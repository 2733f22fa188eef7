"""OpenAI's shapes of tool calls: the calls of a reply (`guided.tools.calls.ToolCall`) as a message's
`tool_calls`, and the call events (`coreai.server.events`) as streamed `tool_calls` deltas. The
grammar, the call boundaries, the call ids and the verdict are `guided`'s
(`ConstrainedSession(tools=...)`); this module only maps them."""

from __future__ import annotations

from coreai.server import reply_schemas as o
from coreai.server.events import CallArguments, CallOpened
from guided.tools.calls import ToolCall


def message_tool_calls(calls: list[ToolCall]) -> list[o.ResponseToolCall] | None:
    """A message's `tool_calls` (None when there are none, as OpenAI sends)."""
    return [
        o.ResponseToolCall(id=c.id, function=o.ResponseFunctionCall(name=c.name, arguments=c.arguments)) for c in calls
    ] or None


def chunk_tool_call(event: CallOpened | CallArguments) -> o.ChunkToolCall:
    """The streamed delta of a call event: a call's first delta (index, id, type, name, arguments
    "") when it opens, then its argument fragments."""
    if isinstance(event, CallOpened):
        function = o.ChunkFunctionCall(name=event.name, arguments="")
        return o.ChunkToolCall(index=event.index, id=event.id, type="function", function=function)
    return o.ChunkToolCall(index=event.index, function=o.ChunkFunctionCall(arguments=event.text))

"""OpenAI's shapes of tool calls: the calls of a reply (`guided.tools.calls.ToolCall`) as a message's
`tool_calls`, and the call events (`coreai.service.events`) as streamed `tool_calls` deltas. The
grammar, the call boundaries, the call ids and the verdict are `guided`'s
(`ConstrainedSession(tools=...)`); this module only maps them."""

from __future__ import annotations

from coreai.server.openai import reply_schemas as o
from coreai.service.events import CallArguments, CallOpened
from guided.tools import ToolCall


def message_tool_calls(calls: list[ToolCall]) -> list[o.ResponseToolCall | o.ResponseCustomToolCall] | None:
    """A message's `tool_calls` (None when there are none, as OpenAI sends): a custom tool's call
    as `{"id", "type": "custom", "custom": {"name", "input"}}`."""
    return [
        o.ResponseCustomToolCall(id=c.id, custom=o.ResponseCustomCall(name=c.name, input=c.payload))
        if c.kind == "custom"
        else o.ResponseToolCall(id=c.id, function=o.ResponseFunctionCall(name=c.name, arguments=c.arguments))
        for c in calls
    ] or None


def chunk_tool_call(event: CallOpened | CallArguments, kind: str) -> o.ChunkToolCall:
    """The streamed delta of a call event: a call's first delta (index, id, type, name, arguments
    or input "") when it opens, then its fragments. kind: the call's ("function" or "custom")."""
    if isinstance(event, CallOpened):
        if kind == "custom":
            custom = o.ChunkCustomCall(name=event.name, input="")
            return o.ChunkToolCall(index=event.index, id=event.id, type="custom", custom=custom)
        function = o.ChunkFunctionCall(name=event.name, arguments="")
        return o.ChunkToolCall(index=event.index, id=event.id, type="function", function=function)
    if kind == "custom":
        return o.ChunkToolCall(index=event.index, custom=o.ChunkCustomCall(input=event.text))
    return o.ChunkToolCall(index=event.index, function=o.ChunkFunctionCall(arguments=event.text))

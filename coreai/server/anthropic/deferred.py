"""Anthropic's deferred tools and tool search, as the Messages mapping applies them.

A client tool with `defer_loading: true` is neither shown to the model nor callable until a
`tool_reference` block (`{"type": "tool_reference", "tool_name": NAME}`) in a `tool_result` of the
conversation names it: the client's own tool search answered with it (Claude Code's `ToolSearch`
does, then sends the tool's definition in `tools` with `defer_loading` still set). From then on:

- the reference expands, where it stands in the tool result, to the tool's definition: a
  `<functions>` block of `<function>{"description", "name", "parameters"}</function>` lines (the
  encoding Claude Code's ToolSearch describes to the model), so the prompt before it (the system
  prompt and its tool list) is unchanged and the prefix cache keeps serving it;
- the tool is callable: the grammar admits its calls (`GenerationRequest.tools`), while the
  template's tool list leaves it out (`GenerationRequest.unlisted_tools`).

A reference to a name that no tool in `tools` has is a 400 naming the block (Anthropic's
`tool_reference` must name a tool of the request); a `tool_choice` naming a deferred tool not
loaded is a 400 naming `tool_choice.name`.
"""

from __future__ import annotations

import json

from coreai.server.anthropic import schemas as m
from coreai.server.errors import bad_request


def references(req: m.CountTokensRequest) -> dict[str, str]:
    """The tools the conversation's `tool_reference` blocks load: name -> the field of the first
    block naming it (`messages[i].content[j].content[k]`)."""
    found: dict[str, str] = {}
    for i, message in enumerate(req.messages):
        if isinstance(message.content, str):
            continue
        for j, block in enumerate(message.content):
            if isinstance(block, m.ToolResultBlock) and isinstance(block.content, list):
                for k, part in enumerate(block.content):
                    if isinstance(part, m.ToolReferenceBlock):
                        found.setdefault(part.tool_name, f"messages[{i}].content[{j}].content[{k}]")
    return found


def callable_tools(req: m.CountTokensRequest, tools: list[m.Tool]) -> tuple[list[m.Tool], frozenset[str]]:
    """(the client tools the model may call, the names among them loaded by a reference: callable
    and not in the template's tool list). Raises a 400 for a reference naming no tool of `tools`, or
    a `tool_choice` naming a deferred tool not loaded."""
    by_name = {tool.name: tool for tool in tools}
    loaded = references(req)
    for name, where in loaded.items():
        if name not in by_name:
            raise bad_request(
                f"{where}.tool_name: the tool_reference names {name!r}, which is not among the request's tools",
                f"{where}.tool_name",
            )
    usable = [tool for tool in tools if not tool.defer_loading or tool.name in loaded]
    choice = req.tool_choice
    if choice is not None and choice.type == "tool" and choice.name in by_name and by_name[choice.name] not in usable:
        raise bad_request(
            f"tool_choice.name: {choice.name!r} is deferred (defer_loading) and no tool_reference has loaded it",
            "tool_choice.name",
        )
    if choice is not None and choice.type == "any" and tools and not usable:
        raise bad_request(
            "tool_choice: 'any' asks for a call, and every tool is deferred (defer_loading) and not loaded",
            "tool_choice",
        )
    return usable, frozenset(tool.name for tool in usable if tool.defer_loading)


def definition(tool: m.Tool) -> str:
    """The `<functions>` block a `tool_reference` to `tool` expands to."""
    entry = {"description": tool.description or "", "name": tool.name, "parameters": tool.input_schema}
    return f"<functions>\n<function>{json.dumps(entry, ensure_ascii=False)}</function>\n</functions>"

"""The Messages dialect's mapping: a validated Anthropic `MessagesRequest` to the service's one
`GenerationRequest`, once, with no chat request in between. Its errors, and the
prepare step's (`MESSAGES_NAMES`), name the Messages fields: `messages[i].content[j]`,
`tools[i].input_schema`, `output_config.format.schema`, `tool_choice`, `thinking`.

What maps to what:
- `system` (text or text blocks) -> the system message; `messages` -> chat messages: a user
  message's `tool_result` blocks become `tool` messages (before its text, as the results answer the
  calls before them; `is_error` results say so in their text), an assistant message's `tool_use`
  blocks its `tool_calls` (the input object as the arguments), its text blocks its content;
  `thinking` / `redacted_thinking` blocks are dropped (chat templates drop earlier reasoning).
- `output_config.format` (or the beta's top-level `output_format`) -> the answer's JSON Schema,
  enforced by the grammar; `tools` -> function tools whose arguments are always constrained to
  `input_schema` (the client-run types `bash_*`, `text_editor_*`, `memory_*` to their published
  schemas: `client_tools`); `tool_choice` auto / any / tool / none -> auto / required / the named function /
  none; `disable_parallel_tool_use` -> one call at most.
- `defer_loading` tools and `tool_reference` blocks: Anthropic's tool search (`deferred`): a deferred
  tool is shown and callable once a reference loads it, the reference expanding to its definition.
- `max_tokens` -> the budget (above the server's `--max-tokens`: cut to it and named, as in every
  dialect: `coreai.service.prepare`).
- `thinking` enabled -> the reasoning budget `budget_tokens`; adaptive -> the default budget;
  disabled -> `enable_thinking: false` for the chat template. A model that does not reason
  answers without thinking blocks.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import from_json

from coreai.server.anthropic import schemas as m
from coreai.server.anthropic.client_tools import client_tool
from coreai.server.anthropic.deferred import callable_tools, definition
from coreai.server.errors import bad_request
from coreai.server.policy import Hint
from coreai.service import GenerationRequest, Names
from coreai.service.chat import pairing_error, sampling_of, template_call

MESSAGES_NAMES = Names(
    messages="messages",
    max_tokens="max_tokens",
    reasoning_effort="thinking",
    tools="tools",
    tool_choice="tool_choice",
    tool_parameters="tools[{}].input_schema",
    schema_in_prompt="output_config.format",
)
UNREADABLE = "this server's models read text only"
PREFIX_CACHE = "nothing needed: the prefix cache reuses every prefix, whatever the breakpoint or TTL"
# The Messages fields of the field policy's class (b) (`coreai.server.policy`, docs/reference/field-policy.md).
HINTS = (
    Hint("metadata", "nothing: no accounts, billing or abuse tracking on a local server"),
    Hint("service_tier", "nothing: one tier"),
    Hint("context_management", "nothing: the messages the client sends are the context"),
    Hint("cache_control", PREFIX_CACHE),
    Hint("system[].cache_control", PREFIX_CACHE),
    Hint("messages[].content[].cache_control", PREFIX_CACHE),
    Hint("tools[].cache_control", PREFIX_CACHE),
    Hint("thinking.display", "the reasoning is returned as the model wrote it"),
    Hint("output_config.effort", "nothing: the reasoning budget is `thinking.budget_tokens`"),
)
# `anthropic-beta` values whose feature this server has (their fields are read as any other).
HONOURED_BETAS = ("structured-outputs-", "fine-grained-tool-streaming-", "interleaved-thinking-")


def ignored(req: m.CountTokensRequest, betas: str | None) -> list[str]:
    """What `req` asks for that this server accepts and does not apply beyond its hints (`HINTS`):
    its hosted tools (left out of the prompt, `hosted_tools`), `mcp_servers`, and the
    `anthropic-beta` values (a comma-separated header) of features it does not have."""
    names = [f"tools[{i}] ({kind})" for i, kind in hosted_tools(req.tools or [])]
    names += ["mcp_servers"] if req.mcp_servers else []
    for beta in (b.strip() for b in (betas or "").split(",")):
        if beta and not beta.startswith(HONOURED_BETAS):
            names.append(f"anthropic-beta: {beta}")
    return names


def hosted_tools(tools: list) -> list[tuple[int, str]]:
    """(index, type) of the server tools among `tools`: hosted by Anthropic (or computer use,
    whose screenshots these models cannot read), not run here."""
    return [(i, tool.type) for i, tool in enumerate(tools) if isinstance(tool, m.ServerTool)]


def model_tools(tools: list) -> list[m.Tool]:
    """The tools the model sees, in the request's order: client tools, and the client-run types as
    the client tools they stand for (`client_tools.client_tool`)."""
    return [client_tool(t) if isinstance(t, m.ClientRunTool) else t for t in tools if not isinstance(t, m.ServerTool)]


def generation_request(req: m.CountTokensRequest) -> GenerationRequest:
    """The generation `req` asks for (a `CountTokensRequest` renders the same prompt, with no
    budget). Raises a 400
    `APIError` naming the Messages field at fault: a block this server cannot read, a forced server
    tool (the others are left out of the prompt: `ignored` names them), a `tool_result`
    answering no `tool_use` before it, a `tool_use` left unanswered, both
    `output_config.format` and `output_format`, a last assistant message (a prefill to continue),
    `stop_sequences` beside a constrained output (they would cut it)."""
    if req.messages[-1].role == "assistant":
        raise bad_request(
            "messages: a last assistant message (a prefilled answer to continue) is not supported here; "
            "end with a user message",
            f"messages[{len(req.messages) - 1}].role",
        )
    if req.tool_choice is not None and not req.tools:
        raise bad_request("tool_choice: tool_choice is only allowed when tools are given", "tool_choice")
    client_tools = model_tools(req.tools or [])
    _check_not_forced_hosted(req, client_tools)
    definitions = {t.name: definition(t) for t in client_tools}
    client_tools, unlisted = callable_tools(req, client_tools)
    create = req if isinstance(req, m.MessagesRequest) else None
    forced = req.tool_choice is not None and req.tool_choice.type in ("any", "tool") and bool(req.tools)
    if create and create.stop_sequences and (_answer(req) is not None or forced):
        raise bad_request(
            "stop_sequences cannot be combined with output_config.format or a forced tool call (tool_choice "
            "any / tool): a stop sequence would cut the constrained output; the grammar decides where it ends",
            "stop_sequences",
        )
    messages: list[dict] = [{"role": "system", "content": _system(req.system)}] if req.system else []
    for i, turn in enumerate(req.messages):
        messages += chat_messages(turn, i, definitions)
    if found := pairing_error(messages):
        at, field, message = found
        if field == "tool_calls":
            pending = message.rsplit("not answered: ", 1)[-1]
            message = f"each tool_use block needs a tool_result block in the next user message; not answered: {pending}"
        else:
            message = (
                f"a tool_result block answers tool_use_id {messages[at].get('tool_call_id')!r}, which no tool_use "
                "block before it has"
            )
        raise bad_request(f"messages: {message}", "messages")
    return GenerationRequest(
        messages=messages,
        names=MESSAGES_NAMES,
        sampling=sampling_of(create) if create else {},
        max_tokens=create.max_tokens if create else None,
        stop=list(create.stop_sequences or []) if create else [],
        answer=_answer(req),
        tools=_tools(client_tools) if client_tools else None,
        unlisted_tools=unlisted,
        tool_choice=_tool_choice(req.tool_choice) if client_tools else None,
        parallel_tool_calls=not (req.tool_choice and req.tool_choice.disable_parallel_tool_use),
        max_reasoning_tokens=req.thinking.budget_tokens if isinstance(req.thinking, m.ThinkingEnabled) else None,
        chat_template_kwargs={"enable_thinking": False} if isinstance(req.thinking, m.ThinkingDisabled) else None,
    )


def chat_messages(message: m.Message, index: int, definitions: dict[str, str] | None = None) -> list[dict]:
    """The chat messages of `messages[index]`, as the chat template expects them; `definitions`:
    the text a `tool_reference` to each tool name expands to (`deferred.definition`). An empty
    content (`""` or `[]`) is a 400 naming it, as Anthropic's API answers: the turn would say nothing."""
    if not message.content:
        where = f"messages[{index}].content"
        raise bad_request(f"{where}: every message needs non-empty content", where)
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    text: list[str] = []
    results: list[dict] = []
    calls: list[dict] = []
    for j, block in enumerate(message.content):
        where = f"messages[{index}].content[{j}]"
        if isinstance(block, m.TextBlock):
            text.append(block.text)
        elif isinstance(block, m.ToolUseBlock):
            if message.role != "assistant":
                raise bad_request(f"{where}: tool_use blocks belong in assistant messages", where)
            calls.append(template_call(block.id, block.name, block.input))
        elif isinstance(block, m.ToolResultBlock):
            if message.role != "user":
                raise bad_request(f"{where}: tool_result blocks belong in user messages", where)
            results.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": _result(block, where, definitions or {})}
            )
        elif isinstance(block, m.OtherBlock):
            raise bad_request(f"{where}: {block.type} blocks are not supported: {UNREADABLE}", where)
        # thinking / redacted_thinking: an earlier turn's reasoning, which templates drop
    out = results
    if message.role == "assistant":
        if text or calls:
            out.append(
                {"role": "assistant", "content": "".join(text) or None, **({"tool_calls": calls} if calls else {})}
            )
    elif text or not results:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _result(block: m.ToolResultBlock, where: str, definitions: dict[str, str]) -> str:
    """A tool result's text (a `tool_reference` expanded to the tool's definition); an error result
    says so, as the model has no other way to tell."""
    parts = block.content if isinstance(block.content, list) else [block.content or ""]
    text = []
    for k, part in enumerate(parts):
        if isinstance(part, m.OtherBlock):
            raise bad_request(f"{where}.content[{k}]: {part.type} blocks are not supported: {UNREADABLE}", where)
        if isinstance(part, m.ToolReferenceBlock):
            text.append(definitions[part.tool_name])  # `callable_tools` checked the name
        else:
            text.append(part if isinstance(part, str) else part.text)
    return ("Error: " if block.is_error else "") + "".join(text)


def _system(system: str | list[m.TextBlock]) -> str:
    return system if isinstance(system, str) else "\n\n".join(b.text for b in system)


def _answer(req: m.CountTokensRequest) -> tuple[str, dict] | None:
    fmt = req.output_config.format if req.output_config else None
    if fmt is not None and req.output_format is not None:
        raise bad_request("give either output_config.format or output_format, not both", "output_format")
    if fmt is not None:
        return "output_config.format.schema", {"schema": fmt.schema_}
    if req.output_format is not None:
        return "output_format.schema", {"schema": req.output_format.schema_}
    return None


def _check_not_forced_hosted(req: m.CountTokensRequest, client_tools: list[m.Tool]) -> None:
    """A 400 when `tool_choice` forces a server tool (by name, or `any` with no client tool): this
    server cannot run it, and answering without it would not be what was asked."""
    choice, hosted = req.tool_choice, hosted_tools(req.tools or [])
    if choice is None or not hosted:
        return
    named = {getattr(req.tools[i], "name", None): kind for i, kind in hosted} if req.tools else {}
    if choice.type == "tool" and choice.name in named:
        where = "tool_choice.name"
        raise bad_request(f"{where}: {choice.name!r} is a server tool ({named[choice.name]}), not run here", where)
    if choice.type == "any" and not client_tools:
        raise bad_request(
            "tool_choice: 'any' asks for a call, and the only tools are server tools, not run here", "tool_choice"
        )


def _tools(tools: list[m.Tool]) -> list[dict]:
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.strict is not None:
            function["strict"] = tool.strict
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: m.ToolChoice | None) -> str | dict:
    if choice is None or choice.type == "auto":
        return "auto"
    if choice.type == "any":
        return "required"
    if choice.type == "none":
        return "none"
    if not choice.name:
        raise bad_request("tool_choice: a choice of type 'tool' needs the tool's name", "tool_choice.name")
    return {"type": "function", "function": {"name": choice.name}}


def input_json(arguments: str) -> dict:
    """A call's arguments (JSON text, complete or cut by the budget) as the `input` object of a
    `tool_use` block: a cut call's object holds what was decoded (pydantic's partial JSON)."""
    try:
        value = from_json(arguments, allow_partial=True) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

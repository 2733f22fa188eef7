"""The Responses front end's mapping: a validated `ResponseCreateRequest` (and the conversation
stored before its `previous_response_id`) to the `GenerationRequest` the prepare step runs, once,
with no chat request in between. Its errors, and the prepare step's (`RESPONSES_NAMES`), name the
Responses parameters: `input`, `input[i].arguments`, `text.format`, `tools[i].parameters`,
`max_output_tokens`, `reasoning.effort`."""

from __future__ import annotations

from collections.abc import Sequence

from coreai.server.errors import APIError, bad_request
from coreai.server.openai.family import HINTS as FAMILY_HINTS
from coreai.server.openai.family import parsed_arguments, reasoning_of, structured_options
from coreai.server.policy import Hint
from coreai.server.responses import compaction, local_shell
from coreai.server.responses import schemas as r
from coreai.server.responses.capsule import PREFIX, CapsuleError, open_capsule
from coreai.server.responses.namespaces import flat_name, flatten
from coreai.service import GenerationRequest, Names
from coreai.service.chat import pairing_error, sampling_of, template_call, template_custom_call, template_role

# The Responses fields of the field policy's class (b): the OpenAI family's (but `metadata`, which a
# response echoes back) and Responses' own.
HINTS = (
    *(hint for hint in FAMILY_HINTS if hint.path != "metadata"),
    Hint("client_metadata", "nothing: the client's own bookkeeping"),
    Hint("reasoning.summary", "the reasoning is returned whole, as a reasoning item's content"),
)

RESPONSES_NAMES = Names(
    messages="input",
    max_tokens="max_output_tokens",
    reasoning_effort="reasoning.effort",
    tool_parameters="tools[{}].parameters",
    tool_format="tools[{}].format",
)


def generation_request(
    req: r.ResponseCreateRequest, history: Sequence[dict] = ()
) -> tuple[GenerationRequest, list[dict]]:
    """The generation `req` asks for, and the conversation to store with its response (`history`,
    the stored turns before `previous_response_id` as chat messages, then `input`'s; not
    `instructions`, as OpenAI carries them over). Raises a 400 `APIError` naming the Responses
    field: `input` when there is no message to answer or a function_call_output answers no call
    before it, `input[i].arguments` when a function call's arguments are not JSON text."""
    turns, call_params = input_messages(req)
    conversation = list(history) + turns
    instructions = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages = instructions + conversation
    if not messages:
        raise APIError(400, "input: no message to answer (only reasoning items)", param="input", code="invalid_value")
    if found := pairing_error(messages):
        raise bad_request(f"input: {found[2]}", "input")
    if compaction.is_trigger(req):  # local compaction: the model summarizes the conversation
        summary = GenerationRequest(
            messages=compaction.summary_messages(messages),
            names=RESPONSES_NAMES,
            sampling=sampling_of(req),
            max_tokens=req.max_output_tokens,
            answer=compaction.summary_answer(),
        )
        return summary, conversation
    params = iter(["previous_response_id"] * sum(len(m.get("tool_calls") or []) for m in history) + call_params)
    fmt = req.text.format if req.text else None
    response_format = None
    if isinstance(fmt, r.TextFormatJsonSchema):  # `text.format` is the chat path's response_format, flat
        response_format = ("text.format.schema", {"schema": fmt.schema_, "strict": fmt.strict is not False})
    elif isinstance(fmt, r.TextFormatJsonObject):
        response_format = ("text.format", {"json_object": True})
    choice: str | dict | r.FunctionChoice | r.CustomChoice | r.HostedChoice | None = req.tool_choice
    if isinstance(choice, r.HostedChoice):
        raise bad_request(f"tool_choice: {choice.type!r} is a hosted tool, not run here", "tool_choice.type")
    if isinstance(choice, (r.FunctionChoice, r.CustomChoice)):
        choice = {"type": choice.type, choice.type: {"name": choice.name}}
    tools = [tool_definition(t) for t in flatten(req.tools).tools]
    if choice == "required" and req.tools and not tools:
        raise bad_request("tool_choice: 'required' asks for a call, and the only tools are hosted ones", "tool_choice")
    if response_format is not None and req.structured_outputs is not None:
        raise bad_request("give either text.format or structured_outputs, not both", "structured_outputs")
    generation = GenerationRequest(
        messages=[template_message(m, params) for m in messages],
        names=RESPONSES_NAMES,
        sampling=sampling_of(req),
        max_tokens=req.max_output_tokens,
        answer=response_format or structured_options(req),
        tools=tools or None,
        tool_choice=choice if tools else None,
        parallel_tool_calls=req.parallel_tool_calls,
        logprobs=req.top_logprobs is not None or "message.output_text.logprobs" in (req.include or []),
        top_logprobs=req.top_logprobs or 0,
        **reasoning_of(req.reasoning.effort if req.reasoning else None),
    )
    return generation, conversation


def ignored(req: r.ResponseCreateRequest) -> list[str]:
    """What `req` asks for that this server accepts and does not apply beyond its hints (`HINTS`):
    `include` values other than the logprobs and the reasoning capsule, and its hosted tools (left
    out of what the model sees)."""
    made = ("message.output_text.logprobs", "reasoning.encrypted_content")
    names = [f"include: {value}" for value in req.include or [] if value not in made]
    hosted = [(i, t.type) for i, t in enumerate(req.tools or []) if isinstance(t, r.HostedTool)]
    return names + [f"tools[{i}] ({kind})" for i, kind in hosted]


def tool_definition(tool: r.FunctionTool | r.CustomTool) -> dict:
    """A Responses tool as guided takes it: a function in the chat shape, a custom tool flat."""
    if isinstance(tool, r.CustomTool):
        return tool.model_dump(exclude_none=True)
    return {"type": "function", "function": tool.model_dump(exclude_none=True, exclude={"type"})}


def input_messages(req: r.ResponseCreateRequest) -> tuple[list[dict], list[str]]:
    """The chat messages of `input`, and the parameter of each call in them, in order: a
    function_call (custom_tool_call, local_shell_call) joins the assistant message before it (or
    starts one), a function_call_output (custom_tool_call_output, local_shell_call_output) is a
    `tool` message, reasoning items are dropped (the templates drop earlier turns' reasoning too)."""
    messages: list[dict] = []
    call_params: list[str] = []
    items = [r.MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        if isinstance(item, r.MessageItem):
            messages.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, (r.FunctionCallItem, r.CustomToolCallItem, r.LocalShellCallItem)):
            if isinstance(item, r.CustomToolCallItem):
                call = {"id": item.call_id, "type": "custom", "custom": {"name": item.name, "input": item.input}}
            elif isinstance(item, r.LocalShellCallItem):  # as the model wrote it (`local_shell`)
                call = local_shell.chat_call(item.call_id, item.action)
            else:
                name = flat_name(item.namespace, item.name)  # as the model saw it (`namespaces`)
                call = {"id": item.call_id, "type": "function", "function": {"name": name, "arguments": item.arguments}}
            call_params.append(f"input[{i}].{'action' if isinstance(item, r.LocalShellCallItem) else 'arguments'}")
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, (r.FunctionCallOutputItem, r.CustomToolCallOutputItem)):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
        elif isinstance(item, r.LocalShellCallOutputItem):  # its `id` is the call's call_id
            messages.append({"role": "tool", "tool_call_id": item.id, "content": item.output})
        elif isinstance(item, r.CompactionItem):
            messages.append({"role": "user", "content": compaction_text(opened("compaction", item, i))})
        elif isinstance(item, r.ReasoningItem) and (item.encrypted_content or "").startswith(PREFIX):
            opened("reasoning", item, i)  # checked, then dropped as every reasoning item is
    return messages, call_params


def opened(kind: str, item: r.CompactionItem | r.ReasoningItem, i: int):
    """The data of input item `i`'s capsule; a 400 naming `input[i].encrypted_content` when it is not
    one of this server's `kind` capsules."""
    try:
        return open_capsule(kind, item.encrypted_content or "")
    except CapsuleError as exc:
        raise bad_request(f"input[{i}].encrypted_content: {exc}", f"input[{i}].encrypted_content") from None


def compaction_text(data) -> str:
    """A compaction capsule's data as the user turn that stands for the conversation it replaced."""
    summary = data.get("summary", "") if isinstance(data, dict) else ""
    return f"{SUMMARY_HEADER}\n{summary}"


SUMMARY_HEADER = "Summary of the conversation so far (earlier turns were compacted):"


def template_message(message: dict, call_params) -> dict:
    """A chat message (dict) as the chat template expects it: `developer` as `system`, tool-call
    arguments parsed (a 400 naming the next of `call_params` when they are not JSON text), a custom
    call's input as its one argument."""
    out = {"role": template_role(message["role"]), "content": message["content"]}
    calls = []
    for c in message.get("tool_calls") or []:
        param = next(call_params)  # one per call, in order, whichever its kind
        if c["type"] == "custom":
            calls.append(template_custom_call(c["id"], c["custom"]["name"], c["custom"]["input"]))
        else:
            arguments = parsed_arguments(c["function"]["arguments"], param)
            calls.append(template_call(c["id"], c["function"]["name"], arguments))
    if calls:
        out["tool_calls"] = calls
    if message["role"] == "tool":
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _text(content) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)

"""The OpenAI dialect's mapping: a validated chat completions body (`chat_request`) or legacy
completions body (`completion_request`) to the service's `GenerationRequest`, once; the service
prepares it (constraint, prompt, sampling, budget) and refuses what it must, naming these fields.
`structured_options`, `reasoning_of`, `parsed_arguments` and `HINTS` also serve the Responses dialect, through
`coreai.server.openai.family`; what every dialect maps alike is `coreai.service.chat`'s."""

from __future__ import annotations

import json
from typing import Any, cast

from coreai.server.errors import bad_request
from coreai.server.openai import schemas as s
from coreai.server.policy import Hint
from coreai.service import GenerationRequest, Names
from coreai.service.chat import sampling_of, template_call, template_custom_call, template_role

REASONING_BUDGETS = {"low": 256, "medium": 1024, "high": 4096}  # reasoning_effort -> max reasoning tokens
# The OpenAI family's fields of the field policy's class (b) (`coreai.server.policy`), chat's and
# Responses' alike (a field a body does not have is never present).
HINTS = (
    Hint("metadata", "nothing: tags for the caller's own bookkeeping (Responses echoes them back)"),
    Hint("service_tier", "nothing: one tier"),
    Hint("user", "nothing: no abuse monitoring on a local server"),
    Hint("safety_identifier", "nothing: no abuse monitoring on a local server"),
    Hint("prompt_cache_key", "nothing needed: the prefix cache reuses every prefix, whatever the key"),
)


def reasoning_of(effort: str | None) -> dict[str, Any]:
    """The `GenerationRequest` fields of OpenAI's `reasoning_effort` (`reasoning.effort`): its
    budget, and a model that does not reason refuses it."""
    if effort is None:
        return {}
    return {"max_reasoning_tokens": REASONING_BUDGETS[effort], "require_reasoning": True}


def chat_request(req: s.ChatCompletionRequest) -> GenerationRequest:
    """The generation a chat completions body asks for (400 `APIError` when a tool call's arguments
    are not JSON text)."""
    # OpenAI's newer name wins when both are given.
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    choice = req.tool_choice if isinstance(req.tool_choice, (str, type(None))) else req.tool_choice.model_dump()
    return GenerationRequest(
        messages=[template_message(m, i) for i, m in enumerate(req.messages)],
        names=Names(max_tokens=field, tool_format="tools[{}].custom.format"),
        sampling=sampling_of(req),
        max_tokens=getattr(req, field),
        stop=req.stop_list(),
        answer=with_layout(structured_options(req, req.response_format), req.whitespace),
        tools=[t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None,
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls,
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs or 0,
        chat_template_kwargs=req.chat_template_kwargs,
        schema_in_prompt=req.schema_in_prompt,
        schema_hint_budget=req.schema_hint_budget,
        n=req.n,
        origins=req.token_provenance,
        **reasoning_of(req.reasoning_effort),
    )


def completion_request(req: s.CompletionRequest) -> GenerationRequest:
    """The generation a legacy completions body asks for: its prompt as given (text, one text in a
    list, or token ids), no chat template, no schema description. 400 `APIError` for several
    prompts or an empty one."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise bad_request("only one prompt per request is supported", "prompt")
        prompt = prompt[0]
    if not prompt:
        raise bad_request("the prompt is empty", "prompt")
    return GenerationRequest(
        messages=cast("str | list[int]", prompt),  # one text prompt, or token ids
        names=Names(messages="prompt"),
        sampling=sampling_of(req),
        max_tokens=req.max_tokens,
        stop=req.stop_list(),
        answer=structured_options(req),
        logprobs=req.logprobs is not None,
        top_logprobs=req.logprobs or 0,
        chat_template=False,
        schema_in_prompt=False,  # a raw prompt is the caller's own text
        n=req.n,
        parse_special=bool(req.parse_special_tokens),
    )


def structured_options(req, response_format=None) -> tuple[str, dict] | None:
    """(the parameter to name in errors, the `guided.Constraint` options) of `response_format`
    (chat) or `structured_outputs` (vLLM's extension: chat, completions and Responses bodies); None
    for free text."""
    if req.structured_outputs is not None and response_format is not None and response_format.type != "text":
        raise bad_request("give either response_format or structured_outputs, not both", "structured_outputs")
    if isinstance(response_format, s.JsonObjectFormat):
        if response_format.schema_ is not None:  # llama.cpp's json_object with a schema: that schema
            return "response_format.schema", {"schema": response_format.schema_}
        return "response_format", {"json_object": True}
    if isinstance(response_format, s.JsonSchemaFormat):
        spec = response_format.json_schema
        # OpenAI's `strict: false` allows keys the schema does not declare; otherwise objects are closed.
        return "response_format.json_schema.schema", {"schema": spec.schema_, "strict": spec.strict is not False}
    so = req.structured_outputs
    if so is None:
        return None
    if so.json_ is not None:
        return "structured_outputs.json", {"schema": so.json_}
    if so.regex is not None:
        return "structured_outputs.regex", {"regex": so.regex}
    if so.choice is not None:
        return "structured_outputs.choice", {"choices": so.choice}
    return "structured_outputs.grammar", {"grammar": so.grammar}


def with_layout(answer: tuple[str, dict] | None, whitespace: str | None) -> tuple[str, dict] | None:
    """The answer's options with the request's JSON layout (`whitespace`), which wins over the
    server's; unchanged without one, or for answers that are not JSON."""
    if answer is None or whitespace is None or not {"schema", "json_object"} & answer[1].keys():
        return answer
    return answer[0], {**answer[1], "whitespace": whitespace}


def template_message(m, index: int) -> dict:
    """An OpenAI message as the chat template expects it: text content joined from its parts,
    `developer` as `system`, tool-call arguments parsed from JSON text (templates render them with
    `tojson`). Raises a 400 `APIError` when a call's arguments are not JSON text."""
    content = m.content if isinstance(m.content, str) or m.content is None else "".join(p.text for p in m.content)
    out: dict[str, Any] = {"role": template_role(m.role), "content": content}
    if getattr(m, "name", None) is not None:  # templates that know participants render it; others ignore it
        out["name"] = m.name
    if isinstance(m, s.AssistantMessage) and m.tool_calls:
        out["tool_calls"] = [
            template_custom_call(c.id, c.custom.name, c.custom.input)
            if isinstance(c, s.CustomToolCall)
            else template_call(
                c.id,
                c.function.name,
                parsed_arguments(c.function.arguments, f"messages[{index}].tool_calls[{j}].function.arguments"),
            )
            for j, c in enumerate(m.tool_calls)
        ]
    if isinstance(m, s.ToolMessage):
        out["tool_call_id"] = m.tool_call_id
    return out


def parsed_arguments(arguments: str, param: str) -> Any:
    """A call's arguments, JSON text as the OpenAI family sends them, parsed; a 400 (`APIError`)
    naming `param` when they are not JSON text."""
    try:
        return json.loads(arguments)
    except ValueError:
        raise bad_request("tool call arguments must be JSON text", param) from None

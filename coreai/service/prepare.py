"""`prepare`: the one step from a `GenerationRequest` to the `GenerationJob` that runs it.

In one order, without going back to the front end in between: the constraint is compiled (through
the grammar cache; or the request brings one compiled), the prompt rendered (`guided.prompt`: tool
prompt, schema description, chat template, reasoning plan), then the sampling parameters checked
once (`runtime.SamplingParams`) and the budget checked and cut at the model's context. Every refusal
is an `InputError` (`RequestError`, `SchemaError`, `GrammarError`, `ParameterError`) whose `param`
is the front end's own name of the field at fault (`GenerationRequest.names`). The server runs this
on a thread-pool thread, so a bad request is refused before it queues.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any, cast

from jinja2 import TemplateError

from coreai.service.job import GenerationJob
from coreai.service.markers import strip_markers
from coreai.service.request import GenerationRequest, RequestError, resend_key
from guided import Constraint, GrammarCache, GrammarError, SchemaError, default_cache, render_prompt
from runtime import SamplingParams
from runtime.errors import InputError
from runtime.sampling import check_max_tokens

log = logging.getLogger("coreai.service")


@dataclass(frozen=True)
class Settings:
    """What the service's owner (the server's configuration, the CLI's flags) sets for every
    request, where the request says nothing.

    whitespace: the JSON layout of answers (`guided.spec.WHITESPACES`; None: the constraint's default).
    schema_in_prompt, schema_hint_budget: the schema description's setting and token bound (None:
        `guided.schema_prompt`'s). options: `guided.Constraint` keyword arguments every constraint
        gets (strict, lenient, max_reasoning_tokens, ...). sampling: `SamplingParams` defaults by
        field name (the server's temperature). max_tokens: the budget of a request that gives none;
        max_tokens_limit: the largest budget a request gets (None: no bound); a larger one is cut to
        it and the cut is named (`GenerationJob.capped`), in every dialect alike: agent clients send
        their own ceiling (Claude Code and opencode: 32000), not a budget. speculative: the
        speculative decoding of a request that does not choose. guided: False when the grammar
        engine cannot use the model's tokenizer (then every constrained request is refused).
        loop_guard: a call identical (name and arguments) to one the conversation already answered
        is excluded by the grammar (`answered_calls`, `guided.tools.loop_guard`), and a reply ends
        at its first call repeating an earlier one of it (`guided.Constraint`'s end_at_repeated_call).
        strip_markers: agent clients' volatile prompt markers are removed from the messages before
        the prompt is rendered (`coreai.service.markers`; the server's setting, never the CLI's).
    """

    whitespace: str | None = None
    schema_in_prompt: bool | None = None
    schema_hint_budget: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = 256
    max_tokens_limit: int | None = None
    speculative: Any = None
    guided: bool = True
    loop_guard: bool = False
    strip_markers: bool = False


def answer_constraint(
    model, answer: tuple[str, dict] | None, cache: GrammarCache = default_cache, settings: Settings = Settings()
) -> Constraint | None:
    """The constraint of an answer format alone (`GenerationRequest.answer`), or None for free text.
    Raises SchemaError / GrammarError / InputError with `param` the answer's field."""
    if answer is None:
        return None
    param, options = answer
    return _compiled(model, cache, settings, {param: param}, param, **options)


def build_constraint(
    model, req: GenerationRequest, cache: GrammarCache = default_cache, settings: Settings = Settings()
) -> Constraint | None:
    """The constraint of `req`, or None for free text. Tools are one `Constraint(tools=...)`: the
    call format comes from the chat template (a template without tool markup gets the generic JSON
    envelope), `tool_choice: "none"` bans the call marker. A JSON answer format beside tools (OpenAI
    accepts both) is the text answer's format under "auto", alone under "none", and not used under
    "required" or a named function (calls only). Raises SchemaError / GrammarError / InputError
    whose `param` is the front end's name (`req.names`) of the field at fault."""
    if req.constraint is not None:
        return req.constraint
    if not req.tools or (req.tool_choice == "none" and req.answer is not None):
        return answer_constraint(model, req.answer, cache, settings)
    names = req.names
    param, answer = req.answer or (names.tools, {})
    fields = {"tools": names.tools, "tool_choice": names.tool_choice, "answer": param}
    tool_fields = {"parameters": names.tool_parameters, "format": names.tool_format}
    options = dict(tools=req.tools, tool_choice=req.tool_choice or "auto", parallel_tool_calls=req.parallel_tool_calls)
    options["end_at_repeated_call"] = settings.loop_guard
    if settings.loop_guard and isinstance(req.messages, list) and (answered := answered_calls(req.messages)):
        try:
            return _compiled(
                model, cache, settings, fields, param, tool_fields, **options, **answer, excluded_calls=answered
            )
        except GrammarError as exc:  # the narrowed grammar is over the engine's bounds: the guard steps aside
            log.warning("loop guard off for this request: %s", exc)
    return _compiled(model, cache, settings, fields, param, tool_fields, **options, **answer)


def answered_calls(messages: list) -> dict[str, list[dict]]:
    """The function calls of chat `messages` that a later `tool` message answers: tool name -> their
    argument objects (each once), for the loop guard."""
    answered = {m.get("tool_call_id") for m in messages if isinstance(m, dict) and m.get("role") == "tool"}
    out: dict[str, list[dict]] = {}
    for message in messages:
        for call in (message.get("tool_calls") or []) if isinstance(message, dict) else []:
            function = call.get("function") or {}
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    continue
            if call.get("id") in answered and isinstance(arguments, dict):
                seen = out.setdefault(function.get("name", ""), [])
                if arguments not in seen:
                    seen.append(arguments)
    return out


def _compiled(
    model, cache, settings: Settings, fields: dict[str, str], param: str, tool_fields: dict | None = None, **options
) -> Constraint:
    """`Constraint(model, **options)` with the settings' defaults, its errors' `param` set: `fields`
    maps guided's neutral names to the front end's, `param` is the field of a schema or grammar
    error, `tool_fields` the field (formatted with the tool's index) of an error about a tool's
    "parameters" or its "format" (a custom tool's grammar: `GrammarError.tool_field`)."""
    if settings.whitespace is not None and {"schema", "json_object"} & options.keys():  # a JSON answer: the
        options.setdefault("whitespace", settings.whitespace)  # request's layout if it gave one, else the default's
    try:
        return Constraint(model, cache=cache, **{**settings.options, **options})
    except (SchemaError, GrammarError) as exc:
        where = (tool_fields or {}).get(exc.tool_field)
        exc.param = where.format(exc.tool_index) if exc.tool_index is not None and where else param
        raise
    except InputError as exc:
        exc.param = fields.get(exc.param or "", exc.param or param)
        raise


def _constrained_field(req: GenerationRequest) -> str | None:
    """The field that asks for a constraint (None: none does)."""
    if req.constraint is not None:
        return req.names.messages
    return req.answer[0] if req.answer else req.names.tools if req.tools else None


def prepare(
    model, req: GenerationRequest, cache: GrammarCache = default_cache, settings: Settings = Settings()
) -> GenerationJob:
    """The job of `req` on `model` (see the module docstring). Raises `RequestError` (guided
    generation unavailable for a constrained request, a model that does not reason asked to,
    `schema_in_prompt` without a JSON answer, a template that cannot render the messages, token ids
    outside the vocabulary, a prompt filling the context), the constraint's errors, and
    `ParameterError` for the budget and sampling, each naming the front end's field."""
    removed: list[str] = []
    if settings.strip_markers and isinstance(req.messages, list) and req.messages and isinstance(req.messages[0], dict):
        messages, removed = strip_markers(req.messages)
        req = dataclasses.replace(req, messages=messages)
    names = req.names
    asking = _constrained_field(req)
    if not settings.guided and asking is not None:
        raise RequestError("guided generation is not available for this model's tokenizer", asking)
    if req.require_reasoning and model.tokenizer.reasoning_markers is None:
        raise RequestError(
            f"{names.reasoning_effort}: this model does not reason (its chat template has no reasoning markers)",
            names.reasoning_effort,
            "unsupported_parameter",
        )
    constraint = build_constraint(model, req, cache, settings)
    if req.schema_in_prompt and (constraint is None or constraint.json_spec is None):
        raise RequestError(
            f"{names.schema_in_prompt} needs a JSON answer format (a JSON Schema or json_object)",
            names.schema_in_prompt,
        )
    ids, reasoning = _render(model, req, constraint, settings)
    budget = settings.max_tokens
    capped: tuple[str, ...] = ()
    if req.max_tokens is not None:
        budget = check_max_tokens(req.max_tokens, None, names.max_tokens)
        limit = settings.max_tokens_limit
        if limit is not None and budget > limit:
            capped, budget = (f"{names.max_tokens} {budget} (capped to the server's {limit})",), limit
    sampling = SamplingParams(**{**settings.sampling, **req.sampling})
    sampling.check_token_ids(model.vocab_size)
    if model.context_length:
        room = model.context_length - len(ids)
        if room < 1:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the model's context is {model.context_length}",
                names.messages,
                "context_length_exceeded",
            )
        budget = min(budget, room)  # cut at the context: finish_reason "length" says so
    return GenerationJob(
        prompt_ids=ids,
        sampling=sampling,
        max_tokens=budget,
        stop=list(req.stop),
        constraint=constraint,
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs,
        speculative=settings.speculative if req.speculative is None else req.speculative,
        reasoning=reasoning,
        n=req.n,
        origins=req.origins,
        removed=tuple(removed),
        capped=capped,
        key=resend_key(req),
    )


def _render(model, req: GenerationRequest, constraint: Constraint | None, settings: Settings):
    """(prompt ids, reasoning plan) of `req` (`guided.prompt.render_prompt`); a raw text prompt
    with `parse_special` is encoded with its special-token text read as those tokens."""
    names = req.names
    messages = req.messages
    if isinstance(messages, list) and messages and all(isinstance(t, int) for t in messages):
        if any(not 0 <= t < model.vocab_size for t in cast("list[int]", messages)):
            raise RequestError(f"prompt token ids must be in [0, {model.vocab_size})", names.messages)
    if req.parse_special and isinstance(messages, str) and not req.chat_template:
        messages = model.tokenizer.encode(messages, parse_special=True)
    wanted = req.schema_in_prompt if req.schema_in_prompt is not None else settings.schema_in_prompt
    tools = req.tools if req.tools and req.tool_choice != "none" else None
    if req.constraint is None and constraint is not None and constraint.tools is not None:
        tools = constraint.tools.template_tools  # the tools constraint's format renders its own template tools
        if tools is not None and req.unlisted_tools:
            tools = [t for t in tools if _tool_name(t) not in req.unlisted_tools]
    try:
        rendered = render_prompt(
            model,
            constraint,
            messages,
            chat_template=req.chat_template,
            tools=tools,
            chat_template_kwargs=req.chat_template_kwargs,
            schema_in_prompt=wanted,
            schema_hint_budget=req.schema_hint_budget or settings.schema_hint_budget,
            max_reasoning_tokens=req.max_reasoning_tokens,
        )
    except (TemplateError, ValueError) as exc:
        raise RequestError(f"cannot render the chat template: {exc}", names.messages) from None
    return rendered.ids, rendered.reasoning


def _tool_name(template_tool: dict) -> str | None:
    """The name of a template tool (`{"type": "function", "function": {"name": ...}}` or flat)."""
    return (template_tool.get("function") or template_tool).get("name")

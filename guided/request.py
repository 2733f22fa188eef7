"""`GenerationRequest`: one generation as every front end asks for it, and `prepare`, the one step
from it to what a decoding loop runs.

Chat completions, Responses (`coreai.server`) and the CLI each fill a `GenerationRequest` once from
their own validated input, spelling their parameter names in `Names`; `prepare` compiles its
constraint (`guided.constraint.Constraint`, through the grammar cache) and renders its prompt in the
one order of `guided.prompt`, without going back to the front end in between; `stream` runs the
result on one model (the server's engine runs it in a batch instead). Every refusal is an
`InputError` (`RequestError`, `SchemaError`, `GrammarError`) whose `param` is the front end's own
name of the field at fault, taken from `Names`, never renamed afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from guided.bitmask import TokenBitmask
from guided.cache import GrammarCache, default_cache
from guided.constraint import Constraint
from guided.errors import GrammarError, SchemaError
from guided.prompt import render_prompt
from runtime.errors import InputError
from runtime.reasoning import ReasoningPlan
from runtime.sampling import SamplingParams
from runtime.sequence import Delta

REASONING_BUDGETS = {"low": 256, "medium": 1024, "high": 4096}  # reasoning_effort -> max reasoning tokens


class RequestError(InputError):
    """A request `prepare` refuses; `param` is the front end's name of the field at fault and `code`
    an OpenAI-style error code ("unsupported_parameter", ...) or None."""


@dataclass(frozen=True)
class Names:
    """How the front end spells the fields `prepare` and the budget checks may blame, for its errors'
    `param` and messages. `tool_parameters` (a function tool's parameters) and `tool_format` (a custom
    tool's grammar) are formatted with the tool's index."""

    messages: str = "messages"
    max_tokens: str = "max_tokens"
    reasoning_effort: str = "reasoning_effort"
    tools: str = "tools"
    tool_choice: str = "tool_choice"
    tool_parameters: str = "tools[{}].function.parameters"
    tool_format: str = "tools[{}].custom.format"
    schema_in_prompt: str = "schema_in_prompt"


@dataclass(frozen=True)
class Sampling:
    """The request's sampling fields as given (None: the default; `runtime.SamplingParams` checks the
    ranges). seed: OpenAI's signed 64-bit (or unsigned) value; logit_bias: token id -> bias."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    seed: int | None = None


@dataclass
class GenerationRequest:
    """One generation, front-end neutral.

    messages: the conversation in the chat template's form (`developer` as `system`, text content
        joined, tool-call arguments parsed from JSON), or a text prompt (a user message, or the raw
        prompt when `chat_template` is False).
    answer: (the field named in its errors, the `Constraint` options) of the answer's format
        (`response_format`, `text.format`, `structured_outputs`, `--schema`, ...), or None for free text.
    tools: function tools (the chat shape `{"type": "function", "function": {...}}`, or any shape
        `guided.tools.constraint.make_tool` takes) and custom tools (`{"type": "custom", ...}`:
        raw text input, free or held to a Lark / regex grammar, `guided.tools.custom`), or None.
    tool_choice: "none", "auto", "required", `{"type": "function", "function": {"name": ...}}`,
        `{"type": "custom", "custom": {"name": ...}}` or None.
    max_tokens: the completion budget asked for (tokens; None: the front end's default).
    logprobs / top_logprobs: per-token log-probabilities, with that many alternatives (0-20).
    reasoning_effort: "low", "medium", "high" or None (the thinking budget, `REASONING_BUDGETS`);
        a model that does not reason refuses it.
    max_reasoning_tokens: the thinking budget in tokens (Anthropic's `thinking.budget_tokens`), which
        wins over `reasoning_effort`; a model that does not reason answers without thinking.
    schema_in_prompt: the JSON answer's schema said in words in the prompt (None: the front end's setting).
    schema_hint_budget: the tokens that description may take at most (None: the front end's setting).
    token_provenance: stream each token's origin (`coreai.server.provenance`, chat's opt-in extension).
    """

    messages: list[dict] | str
    names: Names = field(default_factory=Names)
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    answer: tuple[str, dict] | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    reasoning_effort: str | None = None
    max_reasoning_tokens: int | None = None
    chat_template: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    schema_in_prompt: bool | None = None
    schema_hint_budget: int | None = None
    token_provenance: bool = False


@dataclass(frozen=True)
class Prepared:
    """What a decoding loop runs for a request: ids, the rendered prompt's token ids; reasoning, the
    plan of a thinking model's reasoning block (None: none); constraint, the compiled constraint
    (None: free text)."""

    ids: list[int]
    reasoning: ReasoningPlan | None
    constraint: Constraint | None


@dataclass(frozen=True)
class Defaults:
    """A front end's settings where the request says nothing: whitespace, the JSON layout of answers
    (`guided.spec.WHITESPACES`; None: the constraint's default); schema_in_prompt and
    schema_hint_budget (None: `guided.schema_prompt`'s); constraint options every constraint gets
    (strict, lenient, max_reasoning_tokens, ...: `Constraint`'s keyword arguments)."""

    whitespace: str | None = None
    schema_in_prompt: bool | None = None
    schema_hint_budget: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


def answer_constraint(
    model, answer: tuple[str, dict] | None, cache: GrammarCache = default_cache, defaults: Defaults = Defaults()
) -> Constraint | None:
    """The constraint of an answer format alone (`GenerationRequest.answer`), or None for free text.
    Raises SchemaError / GrammarError / InputError with `param` the answer's field."""
    if answer is None:
        return None
    param, options = answer
    return _compiled(model, cache, defaults, {param: param}, param, **options)


def build_constraint(
    model, req: GenerationRequest, cache: GrammarCache = default_cache, defaults: Defaults = Defaults()
) -> Constraint | None:
    """The constraint of `req`, or None for free text. Tools are one `Constraint(tools=...)`: the
    call format comes from the chat template (a template without tool markup gets the generic JSON
    envelope), `tool_choice: "none"` bans the call marker. A JSON answer format beside tools (OpenAI
    accepts both) is the text answer's format under "auto", alone under "none", and not used under
    "required" or a named function (calls only). Raises SchemaError / GrammarError / InputError
    whose `param` is the front end's name (`req.names`) of the field at fault."""
    if not req.tools or (req.tool_choice == "none" and req.answer is not None):
        return answer_constraint(model, req.answer, cache, defaults)
    names = req.names
    param, answer = req.answer or (names.tools, {})
    fields = {"tools": names.tools, "tool_choice": names.tool_choice, "answer": param}
    return _compiled(
        model,
        cache,
        defaults,
        fields,
        param,
        tool_fields={"parameters": names.tool_parameters, "format": names.tool_format},
        tools=req.tools,
        tool_choice=req.tool_choice or "auto",
        parallel_tool_calls=req.parallel_tool_calls,
        **answer,
    )


def _compiled(
    model, cache, defaults: Defaults, fields: dict[str, str], param: str, tool_fields: dict | None = None, **options
) -> Constraint:
    """`Constraint(model, **options)` with the front end's defaults, its errors' `param` set:
    `fields` maps guided's neutral names to the front end's, `param` is the field of a schema or
    grammar error, `tool_fields` the field (formatted with the tool's index) of an error about a
    tool's "parameters" or its "format" (a custom tool's grammar: `GrammarError.tool_field`)."""
    if defaults.whitespace is not None and {"schema", "json_object"} & options.keys():  # a JSON answer: the
        options.setdefault("whitespace", defaults.whitespace)  # request's layout if it gave one, else the default's
    try:
        return Constraint(model, cache=cache, **{**defaults.options, **options})
    except (SchemaError, GrammarError) as exc:
        where = (tool_fields or {}).get(exc.tool_field)
        exc.param = where.format(exc.tool_index) if exc.tool_index is not None and where else param
        raise
    except InputError as exc:
        exc.param = fields.get(exc.param or "", exc.param or param)
        raise


def prepare(
    model, req: GenerationRequest, cache: GrammarCache = default_cache, defaults: Defaults = Defaults()
) -> Prepared:
    """Compile `req`'s constraint and render its prompt (tool prompt, schema description, chat
    template, reasoning plan: `guided.prompt`). Raises `RequestError` (a model that does not reason
    asked for `reasoning_effort`, `schema_in_prompt` without a JSON answer, a template that cannot
    render the messages) and the errors of `build_constraint`, each naming the front end's field."""
    names = req.names
    if req.reasoning_effort is not None and model.tokenizer.reasoning_markers is None:
        raise RequestError(
            f"{names.reasoning_effort}: this model does not reason (its chat template has no reasoning markers)",
            names.reasoning_effort,
            "unsupported_parameter",
        )
    constraint = build_constraint(model, req, cache, defaults)
    if req.schema_in_prompt and (constraint is None or constraint.json_spec is None):
        raise RequestError(
            f"{names.schema_in_prompt} needs a JSON answer format (a JSON Schema or json_object)",
            names.schema_in_prompt,
        )
    wanted = req.schema_in_prompt if req.schema_in_prompt is not None else defaults.schema_in_prompt
    tools = req.tools if req.tools and req.tool_choice != "none" else None
    budget = req.schema_hint_budget or defaults.schema_hint_budget
    budget_tokens = req.max_reasoning_tokens or (
        REASONING_BUDGETS[req.reasoning_effort] if req.reasoning_effort else None
    )
    try:
        rendered = render_prompt(
            model,
            constraint,
            req.messages,
            chat_template=req.chat_template,
            tools=None if constraint is not None and constraint.tools is not None else tools,
            chat_template_kwargs=req.chat_template_kwargs,
            schema_in_prompt=wanted,
            schema_hint_budget=budget,
            max_reasoning_tokens=budget_tokens,
        )
    except (TemplateError, ValueError) as exc:
        raise RequestError(f"cannot render the chat template: {exc}", names.messages) from None
    return Prepared(rendered.ids, rendered.reasoning, constraint)


def stream(
    model,
    prepared: Prepared,
    sampling: SamplingParams,
    *,
    max_tokens: int,
    logprobs: bool = False,
    bitmask: TokenBitmask | None = None,
    **kwargs,
) -> Iterator[Delta]:
    """Run `prepared` on `model` alone, streaming `runtime.Delta`s; under a constraint the last
    delta's `result` is the generation's verdict (a `guided.GuidedResult`, `.outcome` decided).
    bitmask: the buffers the generation fills (None: its own). Other keyword arguments go to
    `Model.stream` (stop, cancel, prompt_cache, speculative). Raises what `Model.stream` raises."""
    constraint = prepared.constraint
    generation = None if constraint is None else constraint.generation(sampling, logprobs, prepared.reasoning, bitmask)
    strategy = None if generation is None else generation.strategy
    for delta in model.stream(
        prepared.ids, strategy=strategy, sampling=sampling, max_tokens=max_tokens, logprobs=logprobs, **kwargs
    ):
        if delta.result is not None and generation is not None:
            delta.result = generation.verdict(delta.result)
        yield delta

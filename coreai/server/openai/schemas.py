"""Request bodies of the OpenAI-compatible API, as pydantic models (replies: `reply_schemas`).

Requests forbid unknown fields (`extra="forbid"`): a field this server cannot honour is a 400 naming
it, never silently ignored. Their JSON types are strict, as OpenAI's: a bool is true/false (not "yes"),
an integer is not true or 1.0, a number is not a string (an integer is a number). Unions are
discriminated (messages by `role`, content parts and response formats by `type`) so a bad value gets
one error naming its location, not one per union member.
Shapes follow OpenAI's API reference (chat completions, legacy completions, models); the extensions
are `top_k`, `min_p`, `repetition_penalty` and vLLM's `structured_outputs` (`json` | `regex` |
`choice` | `grammar`, exactly one).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Strict, Tag, model_validator

from coreai.server.bodies import FUNCTION_NAME, Body, Request, field_error
from coreai.service.chat import tool_pairing_error
from runtime.errors import InputError

MAX_CHOICES = 16  # `n`: each choice is a row of the batch; more would mostly wait in the queue


# ---- chat messages -------------------------------------------------------------------------------


class TextPart(Request):
    type: Literal["text"]
    text: str


Content = str | list[Annotated[TextPart, Field(discriminator="type")]]


class FunctionCall(Request):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class CustomCall(Request):
    name: str
    input: str  # the raw input, as the custom tool took it


class CustomToolCall(Request):
    id: str
    type: Literal["custom"]
    custom: CustomCall


def _call_tag(value) -> str:
    # A call without a type is a function call, as OpenAI reads it. Capitalised tags: the 400's field
    # path skips them (`errors.field_path` keeps lower-case keys).
    kind = value.get("type", "function") if isinstance(value, dict) else getattr(value, "type", "function")
    return "Custom" if kind == "custom" else "Function"


AnyToolCall = Annotated[
    Annotated[ToolCall, Tag("Function")] | Annotated[CustomToolCall, Tag("Custom")], Discriminator(_call_tag)
]


class SystemMessage(Request):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None  # a participant's name (OpenAI's), for templates that use it


class UserMessage(Request):
    role: Literal["user"]
    content: Content
    name: str | None = None  # a participant's name (OpenAI's), for templates that use it


class AssistantMessage(Request):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[AnyToolCall] | None = None
    refusal: None = None
    name: str | None = None


class ToolMessage(Request):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


# ---- tools and structured output ------------------------------------------------------------------


class FunctionDefinition(Request):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Request):
    type: Literal["function"]
    function: FunctionDefinition


class GrammarDefinition(Request):
    syntax: Literal["lark", "regex"]
    definition: str


class TextInput(Request):
    type: Literal["text"]


class GrammarInput(Request):
    type: Literal["grammar"]
    grammar: GrammarDefinition


class CustomDefinition(Request):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    format: Annotated[TextInput | GrammarInput, Field(discriminator="type")] = TextInput(type="text")


class CustomTool(Request):
    """A custom tool: its input is raw text, free or held to a Lark or regex grammar
    (`guided.tools.custom`)."""

    type: Literal["custom"]
    custom: CustomDefinition


class NamedFunction(Request):
    name: str


class NamedToolChoice(Request):
    type: Literal["function"]
    function: NamedFunction


class NamedCustomChoice(Request):
    type: Literal["custom"]
    custom: NamedFunction


class TextFormat(Request):
    type: Literal["text"]


class JsonObjectFormat(Request):
    type: Literal["json_object"]
    # llama.cpp's extension (also older instructor's JSON_SCHEMA mode): a schema beside json_object is
    # enforced as `json_schema` is; without it, any JSON object.
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")


class JsonSchemaSpec(Request):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    # Required (OpenAI's): a forgotten schema is a 400, not "any JSON value" in silence ({}, true ask for it).
    schema_: dict[str, Any] | bool = Field(alias="schema")
    strict: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_schema_is_missing(cls, data):
        return {k: v for k, v in data.items() if not (k == "schema" and v is None)} if isinstance(data, dict) else data


class JsonSchemaFormat(Request):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class StructuredOutputs(Request):
    """vLLM's `structured_outputs` extension: exactly one of a JSON Schema, a regex (the whole output
    matches it), a list of choices (the output is one of them) or a Lark / GBNF grammar."""

    json_: dict[str, Any] | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [v for v in (self.json_, self.regex, self.choice, self.grammar) if v is not None]
        if len(given) != 1:
            raise InputError("give exactly one of json, regex, choice, grammar")
        return self


class StreamOptions(Request):
    include_usage: bool = False


# ---- requests -------------------------------------------------------------------------------------


class SamplingFields(Body):
    """Fields shared by chat and legacy completions. The sampling fields' ranges and `max_tokens` are
    checked in one place, where the runtime's `SamplingParams` is built (a 400 naming the field)."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = Field(None, le=2)  # OpenAI's bound; the runtime checks the rest
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Token id -> bias in [-100, 100]; the ids are JSON object keys, hence strings parsed as integers.
    logit_bias: dict[Annotated[int, Strict(False)], float] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)  # OpenAI's are signed 64-bit; unsigned too
    stop: str | list[str] | None = Field(default=None, max_length=4)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)  # choices, decoded as rows of one batch
    stream: bool = False
    stream_options: StreamOptions | None = None
    structured_outputs: StructuredOutputs | None = None
    user: str | None = None  # OpenAI's end-user id, for its abuse monitoring: nothing to do on a local server

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise field_error("stream_options", "stream_options is only allowed with stream: true", self.stream_options)
        return self

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data):
        # OpenAI takes null for an optional parameter as its default, and some clients send them so.
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _no_stop_in_constrained_output(self):
        # A stop string would cut a grammar-constrained output, which then no longer validates.
        if self.stop and self.output_constrained():
            raise field_error(
                "stop",
                "stop cannot be combined with response_format, structured_outputs or a forced tool call "
                '(tool_choice "required" or a named function): it would cut the constrained output; the '
                "grammar already decides where the output ends",
                self.stop,
            )
        return self

    def output_constrained(self) -> bool:
        """Whether a grammar constrains the whole output (so it alone decides where the output ends)."""
        return self.structured_outputs is not None

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name of max_tokens, which it wins over
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Annotated[Tool | CustomTool, Field(discriminator="type")]] | None = None
    tool_choice: (
        Literal["none", "auto", "required"]
        | Annotated[NamedToolChoice | NamedCustomChoice, Field(discriminator="type")]
        | None
    ) = None
    parallel_tool_calls: bool = True
    # Thinking models: the reasoning budget (low 256, medium 1024, high 4096 tokens) and template
    # variables such as {"enable_thinking": false}, as vLLM accepts them.
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Extension: the JSON output's schema said in words at the start of the system message (see
    # `ConstrainedSession.prompt`); null: the server's --schema-in-prompt setting.
    schema_in_prompt: bool | None = None
    # Extension: the tokens that description may take at most; null: the server's --schema-hint-budget.
    schema_hint_budget: int | None = Field(default=None, ge=1)
    # Extensions (the playground sets them): the JSON layout of this request's JSON answer (null: the
    # server's --whitespace), and per-chunk token origins and generation stats (`coreai.server.openai.provenance`).
    whitespace: Literal["pretty", "compact", "any"] | None = None
    token_provenance: bool = False
    # OpenAI's bookkeeping fields, which SDKs and frameworks send: hints of the field policy
    # (`request.HINTS`), accepted and named in `x-coreai-ignored`; `store: true` (keep the completion
    # for GET /v1/chat/completions) is refused, since nothing here stores chat completions (the
    # Responses API stores responses).
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    store: bool | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @model_validator(mode="after")
    def _consistent(self):
        if self.store:
            raise field_error(
                "store", "stored chat completions are not supported here (use /v1/responses, which stores)", True
            )
        if self.token_provenance and not self.stream:
            raise field_error("token_provenance", "token_provenance is only allowed with stream: true", True)
        if self.top_logprobs and not self.logprobs:
            raise field_error("top_logprobs", "top_logprobs requires logprobs: true", self.top_logprobs)
        if self.tool_choice is not None and not self.tools:
            raise field_error("tool_choice", "tool_choice is only allowed when tools are given", self.tool_choice)
        return self

    @model_validator(mode="after")
    def _tool_results_answer_calls(self):
        turns = [
            (m.role, [c.id for c in m.tool_calls or []] if isinstance(m, AssistantMessage) else [], None)
            if not isinstance(m, ToolMessage)
            else (m.role, [], m.tool_call_id)
            for m in self.messages
        ]
        if found := tool_pairing_error(turns):
            i, key, message = found
            raise field_error(("messages", i, key), message, getattr(self.messages[i], key))
        for i, m in enumerate(self.messages):  # OpenAI: "required unless tool_calls is specified"
            if isinstance(m, AssistantMessage) and m.content is None and not m.tool_calls:
                raise field_error(("messages", i, "content"), "an assistant message needs content or tool_calls", None)
        return self

    def output_constrained(self) -> bool:
        # With tool_choice "auto" the model may answer in text, where a stop string is an ordinary stop.
        forced_call = bool(self.tools) and (
            self.tool_choice == "required" or isinstance(self.tool_choice, (NamedToolChoice, NamedCustomChoice))
        )
        json_output = self.response_format is not None and self.response_format.type != "text"
        return super().output_constrained() or forced_call or json_output


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    # Extension: a text prompt is plain text by default, so "<|im_start|>" in it is text, not the
    # control token; true parses special-token text into control tokens (llama.cpp `parse_special`).
    parse_special_tokens: bool = False

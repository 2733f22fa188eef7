"""Request and response bodies of OpenAI's Responses API (`POST /v1/responses`), as pydantic models.

Requests are strict and forbid unknown fields, like `coreai.server.openai.schemas`: a field this server
cannot honour (`background`, `conversation`, `prompt`, ...) is a 400 naming
it. Input items (`items.py`, re-exported here) and tools are discriminated by `type`, so a bad item
gets one error naming its location. A built-in tool
(`web_search`, `file_search`, ...) is a 400 at `tools[i].type`.

The response models follow the `openai` SDK's `Response` and its output items; events are built as
plain dicts in `coreai.server.responses.stream`.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from coreai.server.bodies import FUNCTION_NAME, Body, Request
from coreai.server.openai.family import StructuredOutputs
from coreai.server.responses.items import (  # noqa: F401 - the input items, read as schemas.X too
    ITEM_TAGS,
    CompactionItem,
    CompactionTriggerItem,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    InputText,
    LocalShellAction,
    LocalShellCallItem,
    LocalShellCallOutputItem,
    MessageItem,
    OutputText,
    Part,
    ReasoningItem,
    ReasoningText,
)


def located_error(loc: tuple, message: str, value: Any) -> ValidationError:
    """A validator's error at the request location `loc` (e.g. ("tools", 0, "type"))."""
    error = PydanticCustomError("value_error", "{message}", {"message": message})
    return ValidationError.from_exception_data("request", [InitErrorDetails(type=error, loc=loc, input=value)])


def new_id(prefix: str) -> str:
    """A fresh object id such as "resp_<32 hex>" ("msg_", "fc_", "rs_" for output items)."""
    return prefix + uuid.uuid4().hex


# ---- tools and text format -----------------------------------------------------------------------


class FunctionTool(Request):
    """A function tool in the Responses flat shape."""

    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextInput(Request):
    type: Literal["text"]


class GrammarInput(Request):
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str


class CustomTool(Request):
    """A custom tool: its input is raw text, free (`text`) or held to a Lark or regex grammar
    (`guided.tools.custom`)."""

    type: Literal["custom"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    format: Annotated[TextInput | GrammarInput, Field(discriminator="type")] = TextInput(type="text")


class NamespaceTool(Request):
    """Tools grouped under a namespace (Codex's sub-agent tools): the model sees each as the function
    `<namespace>__<name>` (`namespaces.py`); its calls come back with `name` and `namespace`."""

    type: Literal["namespace"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    tools: list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]]


# OpenAI's hosted tools: run by OpenAI's servers, not here. The field policy (`coreai.server.policy`,
# class (c)): left out of what the model sees and named in `x-coreai-ignored`; forced, a 400.
HOSTED_TOOLS = (
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "computer_use",
    "mcp",
)


class HostedTool(Request):
    """A hosted tool (`HOSTED_TOOLS`), validated by its type only (its options are OpenAI's)."""

    model_config = ConfigDict(extra="allow")
    type: Literal[HOSTED_TOOLS]  # type: ignore[valid-type]  # a tuple of literals, as typing allows at run time


class LocalShellTool(Request):
    """OpenAI's `local_shell` tool: run by the client, shown to the model as a function (`local_shell.py`)."""

    type: Literal["local_shell"]


def _tool_tag(value) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "hosted" if kind in HOSTED_TOOLS else kind


AnyTool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[LocalShellTool, Tag("local_shell")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_tag),
]


class FunctionChoice(Request):
    type: Literal["function"]
    name: str


class CustomChoice(Request):
    type: Literal["custom"]
    name: str


class HostedChoice(Request):
    """A `tool_choice` forcing a hosted tool (`{"type": "web_search_preview"}`): refused by the mapping."""

    model_config = ConfigDict(extra="allow")
    type: Literal[HOSTED_TOOLS]  # type: ignore[valid-type]


class TextFormatText(Request):
    type: Literal["text"]


class TextFormatJsonObject(Request):
    type: Literal["json_object"]


class TextFormatJsonSchema(Request):
    type: Literal["json_schema"]
    name: str = Field(pattern=FUNCTION_NAME)
    schema_: dict[str, Any] | bool = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(Request):
    format: Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")] = (
        TextFormatText(type="text")
    )


class ReasoningConfig(Request):
    effort: Literal["low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # a hint: the reasoning comes whole


# ---- the request ---------------------------------------------------------------------------------


# `include` values: the logprobs are returned; the others name outputs of hosted tools or encrypted
# state this server does not make (named in `x-coreai-ignored`).
INCLUDABLE = (
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
)


class ResponseCreateRequest(Body):
    """`POST /v1/responses`. Accepted and ignored, as OpenAI's semantics allow on a local server:
    `user`, `truncation: "disabled"` (the default: a prompt over the context is a
    400), `include: []`. `metadata` is echoed back."""

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    text: TextConfig | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's extension, as on chat completions
    tools: list[AnyTool] | None = None
    tool_choice: (
        Literal["none", "auto", "required"]
        | Annotated[FunctionChoice | CustomChoice, Field(discriminator="type")]
        | HostedChoice
        | None
    ) = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(None, le=2)  # OpenAI's bound; the runtime checks the rest
    top_p: float | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)  # extension (vLLM's)
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    user: str | None = None
    stream: bool = False
    # Stored (the default, as OpenAI's) in the server's bounded in-memory store, for
    # `previous_response_id` and `GET` / `DELETE /v1/responses/{id}` (`coreai.server.responses.store`).
    store: bool | None = None
    previous_response_id: str | None = None
    truncation: Literal["disabled"] | None = None
    include: list[Literal[INCLUDABLE]] | None = None  # type: ignore[valid-type]
    # Hints of the field policy (`request.HINTS`): accepted, named in `x-coreai-ignored`.
    client_metadata: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_builtin_tools(cls, data):
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None}  # null is the default, as OpenAI reads it
        for i, tool in enumerate(data.get("tools") or []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind is not None and kind not in ("function", "custom", "namespace", "local_shell", *HOSTED_TOOLS):
                raise located_error(
                    ("tools", i, "type"),
                    f"the built-in tool {kind!r} is not supported; this server runs function, custom and "
                    "local_shell tools and namespaces of them (hosted tools are left out)",
                    kind,
                )
        return data

    @model_validator(mode="after")
    def _consistent(self):
        if isinstance(self.input, list) and not self.input:
            raise located_error(("input",), "input must hold at least one item", self.input)
        # "auto" / "none" ask for no call: meaningful with no tools (Codex's compaction request sends
        # `tool_choice: "auto"` with `tools: []`); a forced call needs a tool.
        if self.tool_choice not in (None, "auto", "none") and not self.tools:
            raise located_error(("tool_choice",), "tool_choice is only allowed when tools are given", self.tool_choice)
        return self


# The response models live in `output.py`; the dialect reads them as `schemas.X` too.
from coreai.server.responses.output import (  # noqa: E402, F401
    IncompleteDetails,
    InputTokensDetails,
    OutputCompaction,
    OutputCustomToolCall,
    OutputFunctionCall,
    OutputItem,
    OutputLocalShellCall,
    OutputMessage,
    OutputReasoning,
    OutputTextPart,
    OutputTokensDetails,
    ReasoningContent,
    Response,
    ResponseError,
    ResponseUsage,
)

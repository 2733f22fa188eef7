"""Request bodies of the Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`),
as pydantic models, after the `anthropic` SDK's `MessageCreateParams`.

Requests are strict and forbid unknown fields, as Anthropic's API does: a field this server neither
enforces nor lists in its field policy (`HINTS`, `coreai.server.policy`) is a 400 naming it. The
hints (`context_management`, `cache_control`, `metadata`, `thinking.display`, ...) are accepted and
named in the `x-coreai-ignored` header.
Content blocks are discriminated by `type`; the blocks this server reads are text, `tool_use`,
`tool_result`, `thinking` and `redacted_thinking` (passed back, not shown to the model); `image`
and `document` blocks validate and are refused by the mapping (`messages_request`), naming the
block, since the models served here read text only. Server tools (a `type` other than "custom")
are left out of what the model sees and named the same way (a forced one is a 400). Replies and
stream events are plain dicts (`coreai.server.anthropic.reply`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag

from coreai.server.bodies import FUNCTION_NAME, Body, Request


class CacheControl(Request):
    """A prompt-caching breakpoint: accepted and not needed (the prefix cache reuses every prefix)."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Request):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None  # passed back with an earlier answer; this server cites nothing


class ToolUseBlock(Request):
    """A call the assistant made earlier, passed back: `input` is its arguments object."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: dict[str, Any] | None = None  # the SDK's fields of a block passed back as it came
    toolset_name: str | None = None


class OtherBlock(Request):
    """A block this server validates but cannot read (image, document, search results, server tool
    results): the mapping refuses it with a 400 naming it."""

    model_config = ConfigDict(extra="allow")
    type: Literal[
        "image",
        "document",
        "search_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
    ]


class ToolReferenceBlock(Request):
    """A deferred tool (`defer_loading`) a tool search found, in a `tool_result`: it loads the tool
    (Anthropic's tool search; the mapping expands it to the tool's definition)."""

    type: Literal["tool_reference"]
    tool_name: str
    cache_control: CacheControl | None = None


ResultPart = Annotated[TextBlock | ToolReferenceBlock | OtherBlock, Field(discriminator="type")]


class ToolResultBlock(Request):
    """The result of call `tool_use_id`: text or text blocks; `is_error` marks a failed call."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultPart] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(Request):
    """An earlier answer's reasoning, passed back (chat templates drop earlier turns' reasoning)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Request):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock | OtherBlock,
    Field(discriminator="type"),
]


class Message(Request):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(Request):
    """A client tool: its arguments are always constrained to `input_schema` (`strict` closes its
    objects to the properties it names, as chat's `strict` does; see `guided.tools.definitions`).
    `defer_loading`: left out of the prompt and the grammar until a `tool_reference` block in a
    `tool_result` (a tool search's answer) names it (Anthropic's tool search)."""

    type: Literal["custom"] | None = None
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    cache_control: CacheControl | None = None
    defer_loading: bool | None = None  # not shown nor callable until a tool_reference block loads it


class ServerTool(Request):
    """A server tool (`web_search_20250305`, `bash_20250124`, ...), which this server does not run:
    validated so that the mapping can refuse it naming its `type`."""

    model_config = ConfigDict(extra="allow")
    type: str
    name: str | None = None


# Anthropic's client-run tool types: defined by Anthropic, run by the client, shown to the model with
# their published input schemas (`client_tools.py`).
CLIENT_RUN_TYPES = (
    "bash_20241022",
    "bash_20250124",
    "text_editor_20241022",
    "text_editor_20250124",
    "text_editor_20250429",
    "text_editor_20250728",
    "memory_20250818",
)


class ClientRunTool(Request):
    """A client-run tool (`CLIENT_RUN_TYPES`): its fixed `type` and `name`, no `input_schema` (the
    type's published one applies); `max_characters`: a text editor's view truncation, which the
    client applies."""

    type: Literal[CLIENT_RUN_TYPES]  # type: ignore[valid-type]  # a tuple of literals, as typing allows at run time
    name: str = Field(pattern=FUNCTION_NAME)
    max_characters: int | None = Field(default=None, ge=1)
    cache_control: CacheControl | None = None
    defer_loading: bool | None = None


def _tool_kind(value) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in (None, "custom"):
        return "custom"
    return "client" if kind in CLIENT_RUN_TYPES else "server"


ToolUnion = Annotated[
    Annotated[Tool, Tag("custom")] | Annotated[ClientRunTool, Tag("client")] | Annotated[ServerTool, Tag("server")],
    Discriminator(_tool_kind),
]


class ToolChoice(Request):
    """`auto` (the default with tools), `any` (at least one call), `tool` (a call of `name`) or
    `none`; `disable_parallel_tool_use`: at most one call (exactly one under `any` / `tool`)."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingEnabled(Request):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1)
    display: str | None = None  # how Claude shows its thinking ("summarized", "omitted", ...): a hint here


class ThinkingAdaptive(Request):
    """Claude's adaptive thinking: here the reasoning budget's default."""

    type: Literal["adaptive"]
    display: str | None = None


class ThinkingDisabled(Request):
    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type")]


class JsonOutputFormat(Request):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Request):
    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class Metadata(Request):
    user_id: str | None = None


class CountTokensRequest(Body):
    """`POST /v1/messages/count_tokens`: the prompt a create request would prefill."""

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolUnion] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: JsonOutputFormat | None = None  # the structured-outputs beta's name of output_config.format
    cache_control: CacheControl | None = None
    context_management: dict[str, Any] | None = None  # Claude's server-side context editing: a hint here
    mcp_servers: list[dict[str, Any]] | None = None  # Anthropic's MCP connector: hosted tools, not run here


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`. `max_tokens` is required (Anthropic's rule); sampling ranges are
    checked where the runtime's `SamplingParams` is built."""

    max_tokens: int
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)  # Anthropic's range
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None

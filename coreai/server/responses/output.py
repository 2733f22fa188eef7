"""The Responses API's response models, after the `openai` SDK's `Response` and its output items
(the request models are in `coreai.server.responses.schemas`, which re-exports these)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from coreai.server.openai.family import TokenLogprob

# ---- the response --------------------------------------------------------------------------------


class OutputTextPart(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[TokenLogprob] | None = None


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputTextPart]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]
    namespace: str | None = None  # the namespace tool holding the function (`namespaces.py`)


class OutputLocalShellCall(BaseModel):
    """A call of the `local_shell` tool: its `exec` action (`local_shell.py`)."""

    type: Literal["local_shell_call"] = "local_shell_call"
    id: str
    call_id: str
    action: dict[str, Any]
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningContent(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = []
    content: list[ReasoningContent]
    status: Literal["in_progress", "completed", "incomplete"]
    encrypted_content: str | None = None  # with include ["reasoning.encrypted_content"]: a capsule


class OutputCustomToolCall(BaseModel):
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    status: Literal["in_progress", "completed", "incomplete"]


class OutputCompaction(BaseModel):
    """The one item answering a `compaction_trigger` (and `POST /v1/responses/compact`'s last item):
    `encrypted_content` is the capsule of the conversation's summary (`compaction.py`)."""

    type: Literal["compaction"] = "compaction"
    id: str
    encrypted_content: str


OutputItem = (
    OutputMessage
    | OutputFunctionCall
    | OutputCustomToolCall
    | OutputLocalShellCall
    | OutputReasoning
    | OutputCompaction
)


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0  # the SDK requires it; this server reports no cache writes as such


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


class Response(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    model: str
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    output: list[OutputItem]
    output_text: str = ""  # the SDK's convenience property, also sent (as vLLM does)
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool
    temperature: float | None = Field(None, le=2)  # OpenAI's bound; the runtime checks the rest
    top_p: float | None = None
    top_logprobs: int | None = None
    tool_choice: Any
    tools: list[dict[str, Any]]
    text: dict[str, Any]
    reasoning: dict[str, Any] | None = None
    store: bool = False
    previous_response_id: str | None = None
    user: str | None = None
    usage: ResponseUsage | None = None

"""Response bodies of the OpenAI-compatible API (chat completions and their chunks, legacy
completions, models, errors), as pydantic models. Shapes follow OpenAI's API reference; request
bodies are in `coreai.server.openai.schemas`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# ---- responses ------------------------------------------------------------------------------------


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: None = None


class ResponseFunctionCall(BaseModel):
    name: str
    arguments: str


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


class ResponseCustomCall(BaseModel):
    name: str
    input: str


class ResponseCustomToolCall(BaseModel):
    id: str
    type: Literal["custom"] = "custom"
    custom: ResponseCustomCall


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None  # a thinking model's reasoning (vLLM's and DeepSeek's field)
    refusal: str | None = None  # set when a constrained output is not valid (finish_reason "error")
    tool_calls: list[ResponseToolCall | ResponseCustomToolCall] | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    """OpenAI's fields for predicted outputs, here the speculative draft tokens: accepted ones were
    emitted without a forward pass of their own, rejected ones were scored and thrown away."""

    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()
    completion_tokens_details: CompletionTokensDetails = CompletionTokensDetails()


# finish_reason: OpenAI's values plus "error" (the grammar engine failed, or the output does not
# validate against the requested schema); never "stop" for output that breaks its constraint.
FinishReason = Literal["stop", "length", "tool_calls", "error"]


class ChatChoice(BaseModel):
    index: int = 0
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class ChunkFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ChunkCustomCall(BaseModel):
    name: str | None = None
    input: str | None = None


class ChunkToolCall(BaseModel):
    """A streamed call delta: a function call's `function` fragments, or a custom tool call's
    `custom` ones (its raw input), as OpenAI's chat streams them (the other field is left out)."""

    index: int
    id: str | None = None
    type: Literal["function", "custom"] | None = None
    function: ChunkFunctionCall | None = None
    custom: ChunkCustomCall | None = None


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    reasoning_content: str | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions logprobs shape."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None

"""`GenerationRequest`: one generation as every front end asks for it. Chat completions
(`prepare.chat_request`) and Responses (`responses_request.generation_request`) fill it once from
their own validated body; `Preparer.prepare` turns it into what the worker runs. Nothing in it is
validated again: the front end's body was, and the prepare step's own checks (budget, sampling
ranges, schemas, the prompt's length) name the front end's parameters through `names`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Names:
    """How the front end spells the parameters the prepare step checks, for its 400s' `param` and
    messages. `tool_parameters` is formatted with the tool's index."""

    messages: str = "messages"
    max_tokens: str = "max_tokens"
    reasoning_effort: str = "reasoning_effort"
    tools: str = "tools"
    tool_choice: str = "tool_choice"
    tool_parameters: str = "tools[{}].function.parameters"


@dataclass(frozen=True)
class Sampling:
    """The request's sampling fields as given (None: the default; `SamplingParams` checks the
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
    """One chat generation, front-end neutral.

    messages: the conversation in the chat template's form (`developer` as `system`, text content
        joined, tool-call arguments parsed from JSON).
    answer: (the parameter named in its errors, the `ConstrainedSession` options) of the answer's
        format (`response_format`, `text.format`, `structured_outputs`), or None for free text.
    tools: function tools in the chat shape (`{"type": "function", "function": {...}}`), or None.
    tool_choice: "none", "auto", "required", `{"type": "function", "function": {"name": ...}}` or None.
    max_tokens: the completion budget asked for (tokens; None: the server's).
    logprobs / top_logprobs: per-token log-probabilities, with that many alternatives (0-20).
    reasoning_effort: "low", "medium", "high" or None (the thinking budget, `prepare.REASONING_BUDGETS`).
    schema_in_prompt: the JSON answer's schema said in words in the prompt (None: the server's setting).
    schema_hint_budget: the tokens that description may take at most (None: the server's setting).
    token_provenance: stream each token's origin (`coreai.server.provenance`, chat's opt-in extension).
    """

    messages: list[dict]
    names: Names = field(default_factory=Names)
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    answer: tuple[str, dict] | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    schema_in_prompt: bool | None = None
    schema_hint_budget: int | None = None
    token_provenance: bool = False

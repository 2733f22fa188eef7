"""`GenerationRequest`: one generation as every front end asks for it (the three server dialects,
the CLI, `coreai.ConstrainedSession`), in no front end's vocabulary.

Each front end fills one `GenerationRequest` from its own validated input, spelling its field names
in `Names`, so that every refusal (`RequestError`, and guided's `SchemaError`, `GrammarError`, a
sampling `ParameterError`) names the front end's own field in `param`, never renamed afterwards.
`coreai.service.prepare` turns it into the one job the engine (or a single-sequence loop) runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from guided import Constraint
from runtime.errors import InputError


class RequestError(InputError):
    """A request the service refuses; `param` is the front end's name of the field at fault and
    `code` an error code for clients ("unsupported_parameter", "context_length_exceeded", ...) or None."""


@dataclass(frozen=True)
class Names:
    """How the front end spells the fields the service may blame, for its errors' `param` and
    messages. `tool_parameters` (a function tool's parameters) and `tool_format` (a custom tool's
    grammar) are formatted with the tool's index."""

    messages: str = "messages"
    max_tokens: str = "max_tokens"
    reasoning_effort: str = "reasoning_effort"
    tools: str = "tools"
    tool_choice: str = "tool_choice"
    tool_parameters: str = "tools[{}].function.parameters"
    tool_format: str = "tools[{}].custom.format"
    schema_in_prompt: str = "schema_in_prompt"
    n: str = "n"


@dataclass
class GenerationRequest:
    """One generation, front-end neutral.

    messages: the conversation in the chat template's form (`developer` as `system`, text content
        joined, tool-call arguments parsed from JSON), a text prompt (a user message, or the raw
        prompt when `chat_template` is False), or token ids (used as they are).
    sampling: the `runtime.SamplingParams` fields the request gives, by name (`runtime.sampling.
        given_sampling`); the others take the service's defaults (`Settings.sampling`), then
        `SamplingParams`' own.
    max_tokens: the completion budget asked for (tokens; None: the service's `Settings.max_tokens`).
    stop: stop strings (they match content only, never inside a tool call).
    answer: (the field named in its errors, the `guided.Constraint` options) of the answer's format
        (`response_format`, `text.format`, `output_config.format`, `--schema`, ...), or None.
    tools: function tools (the chat shape `{"type": "function", "function": {...}}`, or any shape
        `guided.tools.definitions.make_tool` takes) and custom tools (`{"type": "custom", ...}`), or None.
    unlisted_tools: names of `tools` the model may call that the template's tool list leaves out:
        the conversation shows their definitions where they were loaded (deferred tools a tool
        search found), so the prompt before that point, and its cached prefix, stay as they were.
    tool_choice: "none", "auto", "required", `{"type": "function", "function": {"name": ...}}`,
        `{"type": "custom", "custom": {"name": ...}}` or None.
    constraint: a constraint compiled already (`coreai.ConstrainedSession`'s), used instead of
        compiling `answer` / `tools`; `tools` are then only the template's.
    logprobs / top_logprobs: per-token log-probabilities, with that many alternatives (0-20).
    max_reasoning_tokens: the thinking budget in tokens (None: the constraint's, else 1024).
    require_reasoning: the front end asked for reasoning explicitly (OpenAI's `reasoning_effort`):
        a model that does not reason refuses, naming `names.reasoning_effort`; otherwise such a
        model answers without thinking.
    schema_in_prompt: the JSON answer's schema said in words in the prompt (None: the service's setting).
    schema_hint_budget: the tokens that description may take at most (None: the service's setting).
    n: independent choices of one prompt (each a row of the batch; choice i seeded `seed + i`).
    speculative: speculative decoding ("prompt_lookup", "draft", a draft `runtime.Model`, "off";
        None: the service's setting); the output does not change, only its speed.
    parse_special: a raw text prompt's special-token text is read as those tokens (legacy
        completions' `parse_special_tokens`), else it stays text.
    origins: stream each token's origin (sampled, forced by the grammar, drafted).
    """

    messages: list[dict] | str | list[int]
    names: Names = field(default_factory=Names)
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    answer: tuple[str, dict] | None = None
    tools: list | None = None
    unlisted_tools: frozenset[str] = frozenset()
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    constraint: Constraint | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    max_reasoning_tokens: int | None = None
    require_reasoning: bool = False
    chat_template: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    schema_in_prompt: bool | None = None
    schema_hint_budget: int | None = None
    n: int = 1
    speculative: Any = None
    parse_special: bool = False
    origins: bool = False


def resend_key(req: GenerationRequest) -> str | None:
    """A hash (hex SHA-256) of everything in `req` that decides its generation, so that a request a
    client sends again (a resend after its stream-idle watchdog gave up) is known as the same one
    (`coreai.service.resend`). None where a resend cannot be told by value: a request bringing a
    compiled constraint or a draft model (the Python API's objects), or asking for n > 1 choices."""
    if req.constraint is not None or req.n != 1 or not isinstance(req.speculative, str | None):
        return None
    fields = {f.name: getattr(req, f.name) for f in dataclasses.fields(req) if f.name != "names"}
    fields["unlisted_tools"] = sorted(req.unlisted_tools)
    text = json.dumps(fields, sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()

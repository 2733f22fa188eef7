"""`GuidedResult`: a generation's result with the grammar's and the final check's verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from guided.compiler import NotEnforced
from guided.outcome import Outcome
from guided.strategy import GuidedStats
from guided.tools.calls import ToolCall
from runtime.sequence import GenerationResult


@dataclass
class GuidedResult(GenerationResult):
    """A `GenerationResult` with the grammar's verdict.

    value: the parsed JSON value (JSON inputs, when the text parses), else None.
    complete: the grammar matched the whole output (False after max_tokens, an error or a cancel).
    valid: complete and, for JSON Schema inputs, the value validates with `jsonschema` against the
        schema as given (a safety net; in lenient mode it checks what the grammar did not enforce).
    errors: why not valid: "incomplete ...", the engine's message, or "<pointer>: <jsonschema message>".
    stats: guided counters (`GuidedStats`); not_enforced: lenient-mode gaps.
    reasoning: a thinking model's reasoning text (between its markers, stripped), or None when it did
        not reason; `text`, `value` and `valid` are then about the answer after the block only.
    parsed: for a pydantic model class given as the schema, `value` as an instance of it (validated by
        pydantic, as the openai client's `parse` does); None when not valid or for other schemas.
    tool_calls: the calls of a `tools=` session (`guided.tools.calls.ToolCall`: id, name, arguments
        text, parsed args), taken from the grammar's captures; content: its text beside them, or None.
    outcome: what the result means for a reply (`guided.outcome.Outcome`: finish, content,
        reasoning and its token count, calls, refusal), decided by the verdict.
    """

    value: Any = None
    complete: bool = False
    valid: bool = False
    errors: list[str] = field(default_factory=list)
    stats: GuidedStats = field(default_factory=GuidedStats)
    not_enforced: tuple[NotEnforced, ...] = ()
    compile_seconds: float = 0.0
    reasoning: str | None = None
    parsed: Any = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None
    outcome: Outcome | None = None

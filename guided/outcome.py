"""`Outcome`: what a finished generation means, decided once for every front end.

Chat completions, Responses, the CLI (and the coming Messages) render an `Outcome`; none of them
decides again what a result means. The rules (OpenAI's, which the others map from):

- finish "length": the token budget cut the output, also after complete calls (as OpenAI reports
  it): the complete calls are still the reply's `tool_calls` (a call cut by the budget is no call; the
  complete ones were closed under the grammar), and a stream that already sent part of the cut call
  ends with "length", so a client knows that call is unfinished;
- "tool_calls": the output ended after complete calls; "stop": it ended normally;
- "error": the grammar engine failed, or the output stopped but breaks its constraint (the verdict
  turned that "stop" into "error"), or a cancelled generation with nobody listening. A constrained
  output that ended "error" carries a `refusal`, so that a client's `parse()` never presents it as valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from guided.enforcement import KeywordEnforcement
from guided.tools.calls import ToolCall
from runtime.reasoning import ReasoningPlan
from runtime.sequence import GenerationResult


@dataclass(frozen=True)
class Outcome:
    """finish: "stop" | "length" | "tool_calls" | "error" (see the module docstring). content: the
    text answer ("" when none; beside calls, the text outside them). reasoning: a thinking model's
    reasoning text as streamed (between its markers, not stripped), or None when it did not reason;
    reasoning_tokens: the delivered tokens of its block (end marker included; `ReasoningPlan.count`).
    tool_calls: the complete calls. error: why "error" (the engine's or the check's message).
    refusal: for a constrained output that failed, the message a reply carries instead of
    presenting it; None otherwise. enforcement: the constraint's enforcement report
    (`guided.constraint.Constraint.report`: how each schema keyword was enforced), () for free text."""

    finish: str
    content: str = ""
    reasoning: str | None = None
    reasoning_tokens: int = 0
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None
    refusal: str | None = None
    enforcement: tuple[KeywordEnforcement, ...] = ()


def decide(
    result: GenerationResult,
    content: str,
    calls: list[ToolCall],
    reasoning: str | None,
    plan: ReasoningPlan | None,
    constrained: bool,
    enforcement: tuple[KeywordEnforcement, ...] = (),
) -> Outcome:
    """The `Outcome` of `result` (its finish_reason already the verdict's, for a constrained one).
    `plan`: the reasoning plan it ran with, which counts the reasoning tokens among the delivered
    ones (`result.token_ids`) when there is a `reasoning` block; `enforcement`: the constraint's report."""
    reason = result.finish_reason
    if reason == "stop":
        finish = "tool_calls" if calls else "stop"
    else:
        finish = "length" if reason == "length" else "error"
    error = (result.error or "generation failed") if finish == "error" else None
    refusal = f"the output is not valid against its constraint: {error}" if constrained and error else None
    tokens = plan.count(result.token_ids) if reasoning is not None and plan is not None else 0
    return Outcome(finish, content, reasoning, tokens, list(calls), error, refusal, enforcement)


def free_outcome(result: GenerationResult, plan: ReasoningPlan | None = None) -> Outcome:
    """The `Outcome` of an unconstrained generation: its reasoning block (per `plan`, the plan it
    ran with) split off the text and counted in tokens."""
    reasoning, content = plan.split(result.text) if plan is not None else (None, result.text)
    return decide(result, content, [], reasoning, plan, constrained=False)

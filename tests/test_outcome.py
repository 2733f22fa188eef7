"""The one decision of what a result means (`guided.outcome`): the finish rules, the refusal of a
constrained output that failed, the reasoning block's tokens counted from the token ids, and the
verdict of a real generation carrying its outcome."""

from __future__ import annotations

import pytest

from coreai import ConstrainedSession
from guided import free_outcome
from guided.outcome import decide
from guided.tools.calls import ToolCall
from runtime.reasoning import ReasoningMarkers, ReasoningPlan, ReasoningTokens
from runtime.sequence import GenerationResult, Timings, Usage

CALL = ToolCall("call_1", "f", "{}", {}, 0)
START, END = 7, 8
PLAN = ReasoningTokens(ReasoningMarkers("<think>", "</think>"), (START,), (END,), (9, 9))


def result(finish: str, token_ids=(1, 2, 3), text="abc", error=None) -> GenerationResult:
    return GenerationResult(text, list(token_ids), finish, Usage(5, len(token_ids)), Timings(), error=error)


@pytest.mark.parametrize(
    "finish, calls, expected",
    [
        ("stop", [], "stop"),
        ("stop", [CALL], "tool_calls"),
        ("length", [CALL], "length"),  # cut after a complete call: the call is kept, the finish says the cut
        ("length", [], "length"),
        ("error", [CALL], "error"),
        ("cancelled", [], "error"),
    ],
)
def test_finish(finish, calls, expected):
    assert decide(result(finish), "", calls, None, None, constrained=True).finish == expected


def test_a_constrained_output_that_failed_is_a_refusal_and_a_free_one_is_not():
    failed = result("error", error="incomplete: a stop string ended the output")
    constrained = decide(failed, "abc", [], None, None, constrained=True)
    assert constrained.refusal is not None and "a stop string ended the output" in constrained.refusal
    assert decide(failed, "abc", [], None, None, constrained=False).refusal is None
    assert decide(result("length"), "ab", [], None, None, constrained=True).refusal is None


@pytest.mark.parametrize(
    "opened, ids, expected",
    [
        (True, [1, 2, END, 9, 9, 4], 3),  # the block from the start, its end marker included
        (False, [START, 1, 2, END, 9, 9, 4], 3),  # the model opened it: its start marker not counted
        (False, [1, 2, 3], 0),  # no block
        (True, [1, 2, 3], 3),  # still open when the output ended
    ],
)
def test_reasoning_tokens_counted_from_the_ids(opened, ids, expected):
    assert ReasoningPlan(PLAN, opened).count(ids) == expected


def test_free_outcome_splits_and_counts_the_reasoning():
    text = "weighing it</think>\n\nYes."
    out = free_outcome(result("stop", [1, 2, END, 9, 9, 4], text), ReasoningPlan(PLAN, opened=True))
    assert (out.finish, out.reasoning, out.content, out.reasoning_tokens) == ("stop", "weighing it", "Yes.", 3)
    assert free_outcome(result("stop")).content == "abc" and free_outcome(result("stop")).reasoning is None


def test_the_verdict_carries_the_outcome(tiny_model):
    session = ConstrainedSession(
        tiny_model, schema={"type": "array", "items": {"type": "integer"}}, whitespace="compact"
    )
    cut = session.generate("Numbers", max_tokens=2)
    assert cut.outcome.finish == "length" and cut.outcome.refusal is None and not cut.valid
    stopped = session.generate("Numbers", max_tokens=64, stop=["["])  # the stop string cuts what the grammar needs
    assert stopped.finish_reason == "error" and stopped.outcome.finish == "error" and stopped.outcome.refusal

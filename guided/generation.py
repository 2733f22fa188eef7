"""`Generation`: the state of one constrained generation and its verdict.

A `guided.constraint.Constraint` is compiled once and shared; each generation under it gets a
`Generation`: its decoding strategy (matcher, bitmask rows, reasoning gate, rollback planner), its
call tracker and in-call checker (tools), and, once the loop has run (this process's loop or the
server's batch), `verdict()`: the grammar's and the final check's judgement of the result. The
engine holds this object and reads nothing out of the strategy's internals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from guided.bitmask import TokenBitmask
from guided.outcome import decide
from guided.result import GuidedResult
from guided.spec import JSON_KINDS
from guided.strategy import ConstrainedDecodingStrategy
from guided.tools.calls import ToolCall
from guided.validation import check_json
from runtime.reasoning import ReasoningPlan
from runtime.sampling import SamplingParams
from runtime.sequence import GenerationResult

if TYPE_CHECKING:
    from guided.constraint import Constraint


class Generation:
    """One generation under `constraint`: `strategy` drives the decoding loop; `verdict(result)`
    judges what it produced. sampling: its settings (greedy by default); logprobs: return the masked
    log-probabilities; reasoning: its `ReasoningPlan` (None: no reasoning block); bitmask: buffers
    to fill ([max_draft + 1, words] int32; None allocates its own)."""

    def __init__(
        self,
        constraint: Constraint,
        sampling: SamplingParams | None = None,
        logprobs: bool = False,
        reasoning: ReasoningPlan | None = None,
        bitmask: TokenBitmask | None = None,
    ):
        self.constraint = constraint
        self.tracker = constraint.tracker()
        self.strategy = ConstrainedDecodingStrategy(
            constraint.compiled,
            sampling,
            bitmask=bitmask,
            jump_forward=constraint.jump_forward,
            want_logprobs=logprobs,
            max_draft=constraint.max_draft,
            reasoning=reasoning,
            max_retries=constraint.max_retries,
            tracker=self.tracker,
            checker=constraint.call_checker(self.tracker),
        )

    @property
    def call_ids(self) -> tuple[str, ...]:
        """The ids of the calls made so far (a call's id exists from its first streamed token)."""
        return tuple(self.tracker.ids) if self.tracker is not None else ()

    def verdict(self, result: GenerationResult) -> GuidedResult:
        """The grammar's and the final check's verdict on the `result` this generation's strategy
        produced. An output that ended "stop" but is not valid (a stop string cut what the grammar
        still required; the final check failed) is reported with finish_reason "error": never
        invalid output presented as a normal stop."""
        c, strategy = self.constraint, self.strategy
        complete = result.finish_reason == "stop" and strategy.complete
        reasoning = raw_reasoning = None
        if strategy.gate.reasoned:
            assert strategy.gate.plan is not None  # a reasoned gate has its plan
            raw_reasoning, answer = strategy.gate.plan.split(result.text)
            reasoning = raw_reasoning.strip() if raw_reasoning is not None else None
            result = GenerationResult(**dict(vars(result), text=answer))
        if complete and result.stop_string is not None:
            # The grammar accepted the tokens; the stop string cut their text. Valid only if the grammar
            # accepts what is left.
            complete = self._accepts(result.text)
        errors: list[str] = []
        if result.finish_reason == "error":
            errors.append(result.error or strategy.error or "grammar engine error")
        elif result.finish_reason == "stop" and not complete:
            errors.append("incomplete: a stop string ended the output before its grammar was complete")
        elif not complete:
            errors.append(f"incomplete: generation ended ({result.finish_reason}) before the grammar was complete")
        value = None
        try:
            if complete and c.spec.kind in JSON_KINDS:
                value, json_errors = check_json(result.text, c.spec.schema)
                errors += json_errors
            if complete and c.check is not None:
                errors += c.check(result.text)
        except Exception as exc:  # noqa: BLE001 - an output that cannot be checked is not valid
            errors.append(f"the final check failed: {type(exc).__name__}: {exc}")
        calls: list[ToolCall] = []
        content = None
        if c.tools is not None:
            calls, content = self._tool_reply(result, reasoning is not None)
            if complete:
                schemas = {t.name: t.parameters for t in c.tools.tools}
                errors += [
                    f"{call.name}: {e}" for call in calls for e in check_json(call.arguments, schemas[call.name])[1]
                ]
                if c.answer_spec is not None and not calls:
                    value, answer_errors = check_json(content or "", c.answer_spec.schema)
                    errors += answer_errors
        parsed = None
        if c.model_class is not None and complete and not errors and not calls:  # calls: no answer
            try:
                parsed = c.model_class.model_validate(value)
            except ValueError as exc:  # pydantic's ValidationError: a constraint JSON Schema cannot express
                errors.append(f"pydantic: {exc}")
        fields = vars(result)
        if result.finish_reason == "stop" and errors:
            fields = dict(fields, finish_reason="error", error="; ".join(errors))
            result = GenerationResult(**fields)
        answer = (content or "") if c.tools is not None else result.text
        # The outcome's reasoning is the block as streamed (unstripped), so a reply and its stream agree.
        outcome = decide(
            result, answer, calls, raw_reasoning, strategy.gate.plan, constrained=True, enforcement=c.report
        )
        return GuidedResult(
            **fields,
            value=value,
            complete=complete,
            valid=complete and not errors,
            errors=errors,
            stats=strategy.stats,
            not_enforced=c.compiled.not_enforced,
            compile_seconds=c.compiled.compile_seconds,
            reasoning=reasoning,
            parsed=parsed,
            tool_calls=calls,
            content=content,
            outcome=outcome,
        )

    def _accepts(self, text: str) -> bool:
        """Whether the grammar matches `text` whole (tokenized afresh: the grammar is over bytes)."""
        matcher = self.constraint.compiled.matcher()
        ids = self.constraint.model.tokenizer.encode(text, add_special_tokens=False)
        return matcher.accept_tokens(ids) and matcher.is_accepting()

    def _tool_reply(self, result: GenerationResult, reasoned: bool) -> tuple[list[ToolCall], str | None]:
        """The calls and the text answer of a tools generation (`result.text` is the answer)."""
        tracker = self.tracker
        assert tracker is not None  # a tools generation has its tracker
        kept = len(result.token_ids) - (tracker.start or 0) if tracker.start is not None else 0
        calls, response, self.strategy.stats.repeated_calls = tracker.result(kept)
        if response is not None:  # the generic envelope's text answer
            return calls, response
        content = "".join(text for label, text in result.parts if label is None)
        if reasoned:
            assert self.strategy.gate.plan is not None  # a reasoned gate has its plan
            content = self.strategy.gate.plan.split(content)[1]
        content = content.strip() if calls else content
        return calls, content or None

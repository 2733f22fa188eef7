"""The neutral events of one generation, and its outcome: what every front end renders.

`ReplyEvents` reads a choice's `Piece`s (the worker's output) and its final `GenerationResult`
into events: `ReasoningDelta`, `ContentDelta`, `CallOpened`, `CallArguments` (a fragment of a
call's arguments), `CallDone` and last `Finish`, which carries guided's `Outcome`. The outcome is
decided once, in `guided.outcome` (the verdict's, or `free_outcome` for free text); a streamed reply
ends with it and a whole reply is rendered from it (`finish_of` folds the same events), so the two
never disagree. Each server dialect renders these events; none reads another's output.

Log-probabilities ride on the events that carry decoded text: the entries of the tokens decoded
since the last such event (a piece whose text is all reasoning, or held back, passes its entries on).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import cast

from coreai.service.engine import Piece, TokenLogprob
from coreai.service.worker import Job
from guided import Constraint, GuidedResult, Outcome, free_outcome
from guided.tools import CUSTOM, INPUT, CallStream, ToolCall, call_key
from runtime import GenerationResult
from runtime.reasoning import ReasoningPlan

log = logging.getLogger("coreai.service")


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ContentDelta:
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass(frozen=True)
class CallOpened:
    """Call `index` begins: its id (the one its `ToolCall` has), its complete name and its tool's
    kind ("function", or "custom": its fragments are its raw input)."""

    index: int
    id: str
    name: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    kind: str = "function"


@dataclass(frozen=True)
class CallArguments:
    """A fragment of call `index`'s arguments (JSON text; a custom call's input); the fragments
    concatenate to them (`ToolCall.payload`)."""

    index: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass(frozen=True)
class CallDone:
    """Call `index` ended: complete (the grammar closed it), or not (cut by the token budget)."""

    index: int
    complete: bool


@dataclass(frozen=True)
class CutCall:
    """A call opened and cut before its end (by the budget): what was decoded of it (a custom call's
    input so far, `kind` "custom")."""

    index: int
    id: str
    name: str
    arguments: str
    kind: str = "function"


@dataclass(frozen=True)
class Finish:
    """The last event: guided's `Outcome` (decided once there: finish, content, reasoning and its
    tokens, calls, refusal, enforcement) and what only the stream knows: the `result` (usage,
    timings, stop string), the calls the budget `cut` (never among the outcome's calls), every
    decoded token's `logprobs`, and the entries no earlier event carried (`pending`)."""

    outcome: Outcome
    result: GenerationResult
    cut: list[CutCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    pending: list[TokenLogprob] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        """ "stop", "length", "tool_calls" or "error" (`guided.outcome`)."""
        return self.outcome.finish

    @property
    def content(self) -> str | None:
        """The answer's text; None when the reply is calls only (as OpenAI sends it)."""
        return self.outcome.content if self.outcome.content or not self.outcome.tool_calls else None

    @property
    def calls(self) -> list[ToolCall]:
        return self.outcome.tool_calls

    @property
    def reasoning(self) -> str | None:
        return self.outcome.reasoning

    @property
    def reasoning_tokens(self) -> int:
        return self.outcome.reasoning_tokens

    @property
    def refusal(self) -> str | None:
        return self.outcome.refusal


Event = ReasoningDelta | ContentDelta | CallOpened | CallArguments | CallDone | Finish


@dataclass(frozen=True)
class WholeCall:
    """A complete call's argument fragments, held until the grammar closed it (`whole_calls`); its
    `CallOpened` came before, when the call began."""

    opened: CallOpened
    fragments: list[CallArguments]


async def whole_calls(
    events: AsyncIterator[Event],
) -> AsyncIterator[ReasoningDelta | ContentDelta | CallOpened | WholeCall | Finish]:
    """`events` with each call's fragments held until it is complete: a `CallOpened` passes as it
    comes (a renderer closes its open text there), its `CallArguments` and `CallDone` become one
    `WholeCall` once the grammar closed the call, and a call the budget cut yields nothing more, so
    a client never gets arguments it cannot parse (the Messages and Responses streams: a client
    replaying the output, as Codex does, would send them back)."""
    held: dict[int, tuple[CallOpened, list[CallArguments]]] = {}
    async for event in events:
        if isinstance(event, CallOpened):
            held[event.index] = (event, [])
            yield event
        elif isinstance(event, CallArguments):
            held[event.index][1].append(event)
        elif isinstance(event, CallDone):
            opened, fragments = held.pop(event.index)
            if event.complete:
                yield WholeCall(opened, fragments)
        else:
            yield event  # text, reasoning, the Finish


def decided(result: GenerationResult, reasoning: ReasoningPlan | None = None) -> Outcome:
    """guided's outcome of `result`: the verdict's for a constrained result (decided there), else
    `free_outcome` with the generation's reasoning plan. An "error" is logged (the engine's or the
    final check's message, or a cancelled generation nobody heard)."""
    outcome = result.outcome if isinstance(result, GuidedResult) else free_outcome(result, reasoning)
    assert outcome is not None  # a GuidedResult comes out of the verdict, its outcome set
    if outcome.finish == "error":
        log.warning("generation ended with %s: %s", result.finish_reason, result.error)
    return outcome


class ReplyEvents:
    """The events of one choice: `feed` each piece, then `end` with the result. `constraint` and
    `reasoning` are the job's (`coreai.service.prepare`): tools split the calls off the text, a
    reasoning plan the thinking block."""

    def __init__(self, constraint: Constraint | None, reasoning: ReasoningPlan | None):
        self.constrained = constraint is not None
        self.tools = constraint is not None and constraint.tool_mode is not None
        self.calls = CallStream(constraint.tools) if self.tools and constraint is not None else None
        self.end_at_repeat = constraint is not None and constraint.tools is not None and constraint.tools.end_at_repeat
        tools = constraint.tools.tools if constraint is not None and constraint.tools is not None else []
        self.kinds = {t.name: t.kind for t in tools}  # a call's kind, by its tool's name
        self.reasoning = reasoning
        self.splitter = reasoning.splitter() if reasoning else None
        self.text: list[str] = []
        self.logprobs: list[TokenLogprob] = []  # every entry, for the outcome
        self.pending: list[TokenLogprob] = []  # the entries no event carried yet
        self.opened: dict[int, list[str]] = {}  # call index -> [id, name, arguments so far, kind]
        self.open: int | None = None  # the call streaming now
        self.keys: set[tuple[str, str]] = set()  # the closed calls' (name, arguments)
        self.repeated = False  # a closed call repeated an earlier one: no call after it is complete
        self.streamed_content = False

    def feed(self, piece: Piece) -> list[Event]:
        self.text.append(piece.text)
        self.logprobs += piece.logprobs or []
        self.pending += piece.logprobs or []
        text = "".join(t for label, t in piece.parts if label is None) if self.tools else piece.text
        events: list[Event] = []
        if self.splitter is not None:
            reasoning, text = self.splitter.feed(text)
            if reasoning:
                events.append(ReasoningDelta(reasoning))
        if text:
            events += self._content(text)
        for call in self.calls.feed(piece.parts) if self.calls is not None else []:
            events += self._call(call, piece.call_ids)
        return events

    def end(self, result: GenerationResult | None) -> list[Event]:
        """The last events; without a result (cancelled: nobody is listening) no `Finish`."""
        events: list[Event] = []
        if self.splitter is not None:
            reasoning, text = self.splitter.finish()
            if reasoning:
                events.append(ReasoningDelta(reasoning))
            if text:
                events += self._content(text)
        if result is None:
            return events
        complete = cast(GuidedResult, result).tool_calls if self.tools else []  # tools: constrained
        if self.tools:
            content = cast(GuidedResult, result).content
            if not self.streamed_content and content:  # the generic envelope's answer
                events += self._content(content, carry=False)
            ids = [c.id for c in complete]
            assert self.calls is not None  # set with tools
            for call in self.calls.finish(complete):
                events += self._call(call, ids, carry=False)
        if self.open is not None:
            events.append(CallDone(self.open, self.open in {c.index for c in complete}))
        events.append(self._finish(result))
        return events

    def _finish(self, result: GenerationResult) -> Finish:
        """The last event: guided's outcome (`decided`) with the cut calls' decoded arguments and
        every token's log-probabilities."""
        outcome = decided(result, self.reasoning)
        done = {c.index for c in outcome.tool_calls}
        cut = [CutCall(i, *opened) for i, opened in self.opened.items() if i not in done]
        for call in cut:
            # Not sent to the client: the log is where a runaway argument can be seen (its tail, -v).
            log.info(
                "the token budget (%d tokens) cut tool call %r after %d characters; it is not sent: ...%r",
                len(result.token_ids),
                call.name,
                len(call.arguments),
                call.arguments[-120:],
            )
        if isinstance(result, GuidedResult) and (repeated := result.stats.repeated_calls):
            log.info("the reply repeated one of its calls and ended there: %d call(s) not sent", repeated)
        return Finish(outcome, result, cut, self.logprobs, self._take())

    def _take(self, carry: bool = True) -> list[TokenLogprob]:
        if not carry:
            return []
        taken, self.pending = self.pending, []
        return taken

    def _close_call(self) -> list[Event]:
        # A call followed by anything was closed by the grammar: it is complete, unless it repeats an
        # earlier call of the reply and the reply ends there (`ToolConstraint.end_at_repeat`).
        done, self.open = self.open, None
        return [] if done is None else [CallDone(done, not (self.end_at_repeat and self._repeats(done)))]

    def _repeats(self, index: int) -> bool:
        """Whether closed call `index` is, or comes after, the reply's first repeated call."""
        _, name, arguments, kind = self.opened[index]
        try:
            args = {INPUT: arguments} if kind == CUSTOM else json.loads(arguments)
        except ValueError:
            return False  # the grammar closed it: not reached
        key = call_key(name, args)
        self.repeated |= key in self.keys
        self.keys.add(key)
        return self.repeated

    def _content(self, text: str, carry: bool = True) -> list[Event]:
        self.streamed_content = True
        return [*self._close_call(), ContentDelta(text, self._take(carry))]

    def _call(self, event: tuple, ids, carry: bool = True) -> list[Event]:
        """A `CallStream` event: ("open", index, name) or ("args", index, fragment). ids: the
        generation's call ids by index (`CallTracker.ids`, the result's calls')."""
        kind, index, value = event
        if kind == "open":
            events = self._close_call()
            kind = self.kinds.get(value, "function")
            self.open, self.opened[index] = index, [ids[index], value, "", kind]
            return [*events, CallOpened(index, ids[index], value, self._take(carry), kind)]
        self.opened[index][2] += value
        return [CallArguments(index, value, self._take(carry))]


async def job_events(
    job: Job, events: ReplyEvents, observe: Callable[[Piece | GenerationResult], None] | None = None
) -> AsyncIterator[Event]:
    """The events of `job`'s generation as it runs (the caller cancels the job when it stops
    reading). observe: sees every piece and the result as they come, before their events (a
    renderer's extension: chat's token provenance)."""
    result = None
    while (item := await job.get()) is not Job.END:
        if observe is not None:
            observe(item)
        if isinstance(item, GenerationResult):
            result = item
        else:
            for event in events.feed(item):
                yield event
    for event in events.end(result):
        yield event


def finish_of(pieces: list[Piece], result: GenerationResult, events: ReplyEvents) -> Finish:
    """The `Finish` of a whole (collected) generation: the same events, folded, so a whole reply
    and a stream never disagree."""
    for piece in pieces:
        events.feed(piece)
    finish = events.end(result)[-1]
    assert isinstance(finish, Finish)  # with a result, the last event is the Finish
    return finish

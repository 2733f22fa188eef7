"""The Messages API's reply: a renderer of one generation's outcome and neutral events
(`coreai.service.events`), whole or streamed, in the `anthropic` SDK's shapes.

A whole reply is a `message` with content blocks: `thinking` (a reasoning model's block; its
`signature` is empty, as nothing here signs), `text`, then `tool_use` per complete call (`input` the
arguments object). A call cut by the token budget is left out, whole or streamed: the reply ends
`max_tokens` with no partial `tool_use` block, so a client never gets an input it cannot parse
(a client's `max_tokens` above the server's `--max-tokens` is cut to it). `stop_reason` maps
the outcome's finish: `end_turn`, `stop_sequence` (with the `stop_sequence` that matched),
`max_tokens`, `tool_use`, and `refusal` for a constrained output that failed: its text is not
presented (the content keeps only the thinking) and `stop_details.explanation` says why, so that
neither `create` nor `parse` ever hands back invalid output as valid. `usage.input_tokens` counts
the prompt tokens prefilled, `cache_read_input_tokens` those the prefix cache held (Anthropic's
split: their sum is the prompt).

The stream, in the SDK's order: `message_start`, `ping`, then per block `content_block_start`,
`content_block_delta` (`thinking_delta`, `text_delta`, `input_json_delta` whose `partial_json`
pieces join to the call's arguments: a call's events are held until it is complete, then sent
together), `content_block_stop`; then `message_delta` (stop reason,
usage) and `message_stop`. A server fault mid-stream is an `error` event.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from coreai.server.anthropic.errors import error_body
from coreai.server.anthropic.request import input_json
from coreai.server.dispatch import Collected
from coreai.server.streaming import merge, named_sse
from coreai.service import Finish, Job, ReplyEvents, finish_of, job_events
from coreai.service.events import CallOpened, ContentDelta, ReasoningDelta, WholeCall, whole_calls
from runtime import GenerationResult

PING_SECONDS = 15.0  # a ping after this long without an event: clients' stream-idle watchdogs are minutes
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "error": "refusal", "stop": "end_turn"}


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex


def stop_reason(outcome: Finish) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of `outcome`."""
    stop = outcome.result.stop_string
    if outcome.finish_reason == "stop" and stop is not None:
        return "stop_sequence", stop
    return STOP_REASONS[outcome.finish_reason], None


def usage(result: GenerationResult) -> dict:
    """Anthropic's usage of `result`: prompt tokens prefilled, and those read from the prefix cache."""
    u = result.usage
    return {
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    }


def thinking_block(text: str) -> dict:
    return {"type": "thinking", "thinking": text, "signature": ""}


def text_block(text: str) -> dict:
    return {"type": "text", "text": text, "citations": None}


def tool_use_block(call_id: str, name: str, arguments: str) -> dict:
    return {"type": "tool_use", "id": call_id, "name": name, "input": input_json(arguments)}


def stop_details(outcome: Finish) -> dict | None:
    return None if outcome.refusal is None else {"type": "refusal", "category": None, "explanation": outcome.refusal}


class MessageReply:
    """Renders one generation for a Messages request on `model` (the served name): `events` is its
    event source, `prompt_tokens` the prompt's length (the stream's first usage)."""

    def __init__(self, model: str, events: ReplyEvents | None = None, prompt_tokens: int = 0):
        self.model = model
        self.id = new_message_id()
        self.events = events
        self.prompt_tokens = prompt_tokens

    def sse(self, jobs: list[Job]) -> AsyncIterator[str]:
        [job] = jobs
        assert self.events is not None  # a reply of a dispatched request has its event source
        return sse(self.stream(self.events, job, self.prompt_tokens))

    def complete(self, collected: Collected) -> dict:
        [(pieces, result)] = collected
        assert self.events is not None
        return self.render(finish_of(pieces, result, self.events))

    def message(self, content: list[dict], outcome: Finish | None = None, start_usage: dict | None = None) -> dict:
        """The `message` object: whole (from `outcome`), or the stream's first (no outcome yet)."""
        reason, sequence = stop_reason(outcome) if outcome is not None else (None, None)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "stop_details": stop_details(outcome) if outcome is not None else None,
            "usage": usage(outcome.result) if outcome is not None else start_usage,
        }

    def render(self, outcome: Finish) -> dict:
        """The whole reply of `outcome` (see the module docstring)."""
        content = [thinking_block(outcome.reasoning)] if outcome.reasoning else []
        if outcome.refusal is None:
            if outcome.content:
                content.append(text_block(outcome.content))
            calls = sorted((c.index, c.id, c.name, c.arguments) for c in outcome.calls)  # never a cut one
            content += [tool_use_block(i, n, a) for _, i, n, a in calls]
        return self.message(content, outcome)

    async def stream(self, reply: ReplyEvents, job: Job, prompt_tokens: int) -> AsyncIterator[dict]:
        """The stream's events (see the module docstring); cancels the job when the client goes away
        (the generator is closed)."""
        blocks = _Blocks()
        try:
            start = {"input_tokens": prompt_tokens, "output_tokens": 0}
            yield {"type": "message_start", "message": self.message([], start_usage=start)}
            yield {"type": "ping"}
            async for event in whole_calls(job_events(job, reply)):  # a call the budget cut is never sent
                if isinstance(event, ReasoningDelta):
                    out = blocks.delta("thinking", {"type": "thinking_delta", "thinking": event.text})
                elif isinstance(event, ContentDelta):
                    out = blocks.delta("text", {"type": "text_delta", "text": event.text})
                elif isinstance(event, CallOpened):
                    out = blocks.close()
                elif isinstance(event, WholeCall):
                    start = tool_use_block(event.opened.id, event.opened.name, "")
                    deltas = [{"type": "input_json_delta", "partial_json": f.text} for f in event.fragments]
                    out = [*blocks.close(), *blocks.open(start), *map(blocks.event, deltas), *blocks.close()]
                else:
                    out = [*blocks.close(), *self._end(event)]
                for item in out:
                    yield item
        finally:
            job.release()  # a no-op once the job ended; frees the worker if the client left (`Job.release`)

    def _end(self, event: Finish) -> list[dict]:
        reason, sequence = stop_reason(event)
        delta = {"stop_reason": reason, "stop_sequence": sequence, "stop_details": stop_details(event)}
        return [
            {"type": "message_delta", "delta": delta, "usage": usage(event.result)},
            {"type": "message_stop"},
        ]


class _Blocks:
    """The content blocks of a stream: their indexes and the one open now."""

    def __init__(self):
        self.count = 0
        self.kind: str | None = None  # the open block's type

    def open(self, block: dict) -> list[dict]:
        self.kind = block["type"]
        return [{"type": "content_block_start", "index": self.count, "content_block": block}]

    def close(self) -> list[dict]:
        if self.kind is None:
            return []
        self.kind = None
        self.count += 1
        return [{"type": "content_block_stop", "index": self.count - 1}]

    def event(self, delta: dict) -> dict:
        return {"type": "content_block_delta", "index": self.count, "delta": delta}

    def delta(self, kind: str, delta: dict) -> list[dict]:
        out = []
        if self.kind != kind:
            out += self.close()
            out += self.open(thinking_block("") if kind == "thinking" else text_block(""))
        return [*out, self.event(delta)]


def sse(stream: AsyncIterator[dict]) -> AsyncIterator[str]:
    """The Messages stream as server-sent events, with a `ping` event after every `PING_SECONDS`
    without one (a prompt prefilling for minutes; Anthropic's streams carry pings too); a server
    fault after the first event is an `error` event, as Anthropic sends it."""
    return named_sse(merge([stream], keepalive=(PING_SECONDS, {"type": "ping"})), error_body)

"""The Responses event stream of one generation: a renderer of its neutral events
(`coreai.service.events`).

Events, in the order and with the names of OpenAI's stream (each with a `sequence_number` from 0):
`response.created`, `response.in_progress` (sent again, the same response object, after every
`KEEPALIVE_SECONDS` without an event: `keepalive`); per output item `response.output_item.added`,
then for a reasoning item `response.content_part.added`, `response.reasoning_text.delta`... /
`.done`, `response.content_part.done`; for a message the same with `response.output_text.*`; for a
function call `response.function_call_arguments.delta` (the argument fragments as they were decoded)
/ `.done` (a custom tool's call: `response.custom_tool_call_input.delta` / `.done`, its raw input),
`response.output_item.done`: a call's events are held until it is complete, then sent together; a
call cut by max_output_tokens is never sent (as on Messages). The last
event is `response.completed`, `response.incomplete` (cut by max_output_tokens) or `response.failed`
(a constrained output that failed: the text already streamed is not valid), carrying the whole
response: `ResponseBuilder.render` of the generation's `Finish`, as a whole reply is, with the ids
of the items streamed. A server fault mid-stream is an `error` event.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

from coreai.server.openai.family import TokenLogprob, chat_logprobs
from coreai.server.responses import schemas as r
from coreai.server.responses.schemas import new_id
from coreai.server.streaming import merge, named_sse
from coreai.service import Finish, Job, ReplyEvents, job_events
from coreai.service.events import CallOpened, ContentDelta, ReasoningDelta, WholeCall, whole_calls

# `response.in_progress` again after this long without an event (seconds): Codex aborts a stream
# with no parsed event for `stream_idle_timeout_ms` (300 s by default; SSE comments do not count)
# and retries it from scratch, and a CPU prefill of its prompt can take longer than that.
KEEPALIVE_SECONDS = 15.0

FINAL = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


class _Text:
    """The text item being streamed (reasoning or message): its index, item, text and logprobs so far."""

    def __init__(self, index: int, item, kind: str):
        self.index, self.item, self.kind, self.text = index, item, kind, ""
        self.logprobs: list[dict] = []


class _Renderer:
    """The Responses events of one generation's neutral events. builder: the request's `ResponseBuilder`."""

    def __init__(self, builder):
        self.builder = builder
        self.output: list = []  # the items opened, in order: their output_index
        self.ids: dict = {}  # "reasoning", "message", a call's index -> its item's id
        self.current: _Text | None = None

    def text_delta(self, kind: str, text: str, logprobs: list[dict]):
        if self.current is not None and self.current.kind != kind:
            yield from self.close_text("completed")
        if self.current is None:
            yield from self.open_text(kind)
        c = self.current
        assert c is not None  # opened above
        c.text += text
        c.logprobs += logprobs
        where = {"item_id": c.item.id, "output_index": c.index, "content_index": 0}
        if kind == "reasoning":
            yield {"type": "response.reasoning_text.delta", **where, "delta": text}
        else:
            yield {"type": "response.output_text.delta", **where, "delta": text, "logprobs": logprobs}

    def open_text(self, kind: str):
        item: r.OutputReasoning | r.OutputMessage
        if kind == "reasoning":
            item = r.OutputReasoning(id=new_id("rs_"), content=[], status="in_progress")
        else:
            item = r.OutputMessage(id=new_id("msg_"), status="in_progress", content=[])
        self.ids[kind] = item.id
        self.current = _Text(len(self.output), item, kind)
        self.output.append(item)
        where = {"item_id": item.id, "output_index": self.current.index}
        yield {"type": "response.output_item.added", "output_index": self.current.index, "item": item.model_dump()}
        yield {"type": "response.content_part.added", **where, "content_index": 0, "part": _part(kind, "")}

    def close_text(self, status: str):
        c, self.current = self.current, None
        assert c is not None  # closed only while open
        where = {"item_id": c.item.id, "output_index": c.index, "content_index": 0}
        if c.kind == "reasoning":
            c.item.content = [r.ReasoningContent(text=c.text)]
            c.item.encrypted_content = self.builder.reasoning_capsule(c.text)
            yield {"type": "response.reasoning_text.done", **where, "text": c.text}
        else:
            lp = [TokenLogprob(**e) for e in c.logprobs] if self.builder.logprobs else None
            c.item.content = [r.OutputTextPart(text=c.text, logprobs=lp)]
            yield {"type": "response.output_text.done", **where, "text": c.text, "logprobs": c.logprobs}
        yield {"type": "response.content_part.done", **where, "part": c.item.content[0].model_dump()}
        c.item.status = status
        yield {"type": "response.output_item.done", "output_index": c.index, "item": c.item.model_dump()}

    def call_opened(self):
        """A call began: the open text item ends (the call's own events wait for it to be complete:
        `whole_calls`)."""
        if self.current is not None:
            yield from self.close_text("completed")

    def whole_call(self, call: WholeCall):
        """A complete call's events, together (a `local_shell` call's: its item added and done, as
        OpenAI streams it, with no argument deltas)."""
        event, pieces = call.opened, [f.text for f in call.fragments]
        if self.builder.namespaces.is_local_shell(event.name):
            yield from self.local_shell_call(event, "".join(pieces))
            return
        item: r.OutputFunctionCall | r.OutputLocalShellCall | r.OutputCustomToolCall
        if event.kind == "custom":
            item = r.OutputCustomToolCall(
                id=new_id("ctc_"), call_id=event.id, name=event.name, input="", status="in_progress"
            )
        else:
            item = self.builder.function_call(new_id("fc_"), event.id, event.name, "", "in_progress")
        index = len(self.output)
        self.ids[event.index] = item.id
        self.output.append(item)
        yield {"type": "response.output_item.added", "output_index": index, "item": item.model_dump()}
        where = {"item_id": item.id, "output_index": index}
        custom = isinstance(item, r.OutputCustomToolCall)
        for text in pieces:
            if custom:
                yield {"type": "response.custom_tool_call_input.delta", **where, "delta": text}
            else:
                yield {"type": "response.function_call_arguments.delta", **where, "delta": text}
        if isinstance(item, r.OutputCustomToolCall):
            item.input = "".join(pieces)
            yield {"type": "response.custom_tool_call_input.done", **where, "input": item.input}
        elif isinstance(item, r.OutputFunctionCall):
            item.arguments = "".join(pieces)
            done = {"name": item.name, "arguments": item.arguments}
            yield {"type": "response.function_call_arguments.done", **where, **done}
        item.status = "completed"
        yield {"type": "response.output_item.done", "output_index": index, "item": item.model_dump()}

    def local_shell_call(self, event: CallOpened, arguments: str):
        item = self.builder.function_call(new_id("lsh_"), event.id, event.name, arguments, "in_progress")
        index = len(self.output)
        self.ids[event.index] = item.id
        self.output.append(item)
        yield {"type": "response.output_item.added", "output_index": index, "item": item.model_dump()}
        item.status = "completed"
        yield {"type": "response.output_item.done", "output_index": index, "item": item.model_dump()}

    def finish(self, event: Finish):
        """The open text item closed with the status the outcome gives it, then the final response
        (a compaction's one item is sent whole, here: its summary is not streamed)."""
        final = self.builder.render(event, self.ids)
        for index, item in enumerate(final.output if self.builder.compaction else []):
            yield {"type": "response.output_item.added", "output_index": index, "item": item.model_dump()}
            yield {"type": "response.output_item.done", "output_index": index, "item": item.model_dump()}
        if self.current is not None:
            statuses = {item.id: item.status for item in final.output}
            cut = event.finish_reason in ("length", "error")
            yield from self.close_text(statuses.get(self.current.item.id, "incomplete" if cut else "completed"))
        yield {"type": FINAL[final.status], "response": final.model_dump()}


def _part(kind: str, text: str) -> dict:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


async def events(builder, reply: ReplyEvents, job: Job) -> AsyncIterator[dict]:
    """The Responses events of `job`'s generation (sequence numbers not yet set; `sse_events` numbers
    them). `builder` is the request's `ResponseBuilder`, `reply` the choice's event source. Cancels
    the job when the client goes away (the generator is closed)."""
    render = _Renderer(builder)
    try:
        yield {"type": "response.created", "response": builder.response().model_dump()}
        yield in_progress(builder)
        async for event in whole_calls(job_events(job, reply)):  # a call the budget cut is never sent
            if builder.compaction and isinstance(event, (ReasoningDelta, ContentDelta)):
                continue  # the summary is sent as the compaction item, once whole
            if isinstance(event, ReasoningDelta):
                out = render.text_delta("reasoning", event.text, [])
            elif isinstance(event, ContentDelta):
                logprobs = chat_logprobs(builder.tokenizer, event.logprobs) if builder.logprobs else []
                out = render.text_delta("message", event.text, [e.model_dump() for e in logprobs])
            elif isinstance(event, CallOpened):
                out = render.call_opened()
            elif isinstance(event, WholeCall):
                out = render.whole_call(event)
            else:
                out = render.finish(event)
            for item in out:
                yield item
    finally:
        job.release()  # a no-op once the job ended; frees the worker if the client left (`Job.release`)


def in_progress(builder) -> dict:
    """The `response.in_progress` event of the request `builder` answers (`ResponseBuilder`): its
    response with status "in_progress" and no output."""
    return {"type": "response.in_progress", "response": builder.response().model_dump()}


def keepalive(builder, stream: AsyncIterator[dict]) -> AsyncGenerator[dict]:
    """`stream`'s events, with `in_progress(builder)` sent again whenever none came for
    `KEEPALIVE_SECONDS` (read at the call), so a stream waiting on a long prefill is not taken for
    a dead one. The first keepalive always follows `response.created` and the first
    `response.in_progress`: `events` yields both before it awaits anything, in the first step of
    `merge`'s pump task, which runs before a wait can time out. Closing this closes `stream` (and
    so lets go of the job: `events`)."""
    again = (KEEPALIVE_SECONDS, in_progress(builder))
    return cast("AsyncGenerator[dict]", merge([stream], keepalive=again))  # merge is an async generator


def sse_events(stream: AsyncIterator[dict]) -> AsyncIterator[str]:
    """The Responses stream as server-sent events, numbered by `sequence_number`; a server fault
    after the first event is an `error` event, as OpenAI sends it."""
    return named_sse(
        stream,
        lambda e: {"type": "error", "code": e.code or "server_error", "message": e.message, "param": None},
        numbered=True,
    )

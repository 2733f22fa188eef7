"""The Responses event stream of one generation, from the chat path's chunks (`ChatReply.stream_choice`).

Events, in the order and with the names of OpenAI's stream (each with a `sequence_number` from 0):
`response.created`, `response.in_progress`; per output item `response.output_item.added`, then for
a reasoning item `response.content_part.added`, `response.reasoning_text.delta`... /
`.done`, `response.content_part.done`; for a message the same with `response.output_text.*`; for a
function call `response.function_call_arguments.delta` (the argument fragments as the chat reply
streams them) / `.done`; `response.output_item.done`. The last event is `response.completed`, `response.incomplete`
(cut by max_output_tokens) or `response.failed` (a constrained output that failed: the text already
streamed is not valid), carrying the whole response. A server fault mid-stream is an `error` event.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import AsyncIterator

from coreai.server import responses_schemas as r
from coreai.server.queue import Job
from coreai.server.responses_schemas import new_id

log = logging.getLogger("coreai.server")


class _Open:
    """The output item being streamed: its index, item and text so far."""

    def __init__(self, index: int, item, kind: str):
        self.index, self.item, self.kind, self.text = index, item, kind, ""
        self.logprobs: list = []


async def events(builder, reply, job: Job) -> AsyncIterator[dict]:
    """The events of `job`'s generation (sequence numbers not yet set; `sse_events` numbers them).
    `builder` is the request's `ResponseBuilder`, `reply` its `ChatReply`."""
    yield {"type": "response.created", "response": builder.response().model_dump()}
    yield {"type": "response.in_progress", "response": builder.response().model_dump()}
    output: list = []
    results: list = [None]
    current: _Open | None = None
    reasoning_text: str | None = None
    finish = None

    def part(kind: str, text: str) -> dict:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def open_item(kind: str):
        nonlocal current
        if kind == "reasoning":
            item = r.OutputReasoning(id=new_id("rs_"), content=[], status="in_progress")
        else:
            item = r.OutputMessage(id=new_id("msg_"), status="in_progress", content=[])
        current = _Open(len(output), item, kind)
        output.append(item)
        where = {"item_id": item.id, "output_index": current.index}
        yield {"type": "response.output_item.added", "output_index": current.index, "item": item.model_dump()}
        yield {"type": "response.content_part.added", **where, "content_index": 0, "part": part(kind, "")}

    def close_item(status: str):
        nonlocal current, reasoning_text
        c, current = current, None
        where = {"item_id": c.item.id, "output_index": c.index, "content_index": 0}
        if c.kind == "reasoning":
            reasoning_text = c.text
            c.item.content = [r.ReasoningContent(text=c.text)]
            yield {"type": "response.reasoning_text.done", **where, "text": c.text}
        else:
            lp = [r.TokenLogprob(**e) for e in c.logprobs] if reply.req.logprobs else None
            c.item.content = [r.OutputTextPart(text=c.text, logprobs=lp)]
            yield {"type": "response.output_text.done", **where, "text": c.text, "logprobs": c.logprobs}
        yield {"type": "response.content_part.done", **where, "part": c.item.content[0].model_dump()}
        c.item.status = status
        yield {"type": "response.output_item.done", "output_index": c.index, "item": c.item.model_dump()}

    def text_delta(kind: str, text: str, logprobs: list):
        if current is not None and current.kind != kind:
            yield from close_item("completed")
        if current is None:
            yield from open_item(kind)
        current.text += text
        current.logprobs += logprobs
        where = {"item_id": current.item.id, "output_index": current.index, "content_index": 0}
        if kind == "reasoning":
            yield {"type": "response.reasoning_text.delta", **where, "delta": text}
        else:
            yield {"type": "response.output_text.delta", **where, "delta": text, "logprobs": logprobs}

    calls: list = []  # [item, output index] of the calls opened, the last one still streaming

    def close_call(status: str = "completed"):
        """Close the last call: "completed" once another item follows it (the grammar closed it);
        at the end, the result's verdict (its `tool_calls` are the complete calls)."""
        if not calls or calls[-1][0].status != "in_progress":
            return
        item, index = calls[-1]
        where = {"item_id": item.id, "output_index": index}
        yield {"type": "response.function_call_arguments.done", **where, "name": item.name, "arguments": item.arguments}
        item.status = status
        yield {"type": "response.output_item.done", "output_index": index, "item": item.model_dump()}

    def call_events(call: dict):
        """A chat tool-call delta: the first of a call (it has the `id` and the name) opens a
        function_call item; the others carry `arguments` fragments of the call at `index`."""
        if current is not None:
            yield from close_item("completed")
        fn = call.get("function") or {}
        if call.get("id"):
            yield from close_call()
            item = r.OutputFunctionCall(
                id=new_id("fc_"), call_id=call["id"], name=fn["name"], arguments="", status="in_progress"
            )
            calls.append([item, len(output)])
            output.append(item)
            yield {"type": "response.output_item.added", "output_index": len(output) - 1, "item": item.model_dump()}
        if fn.get("arguments"):
            item, index = calls[-1]
            item.arguments += fn["arguments"]
            where = {"item_id": item.id, "output_index": index}
            yield {"type": "response.function_call_arguments.delta", **where, "delta": fn["arguments"]}

    async with contextlib.aclosing(reply.stream_choice(job, 0, results)) as chunks:
        async for chunk in chunks:
            choice = chunk["choices"][0]
            delta = choice["delta"]
            logprobs = (choice.get("logprobs") or {}).get("content") or []
            if delta.get("reasoning_content"):
                for event in text_delta("reasoning", delta["reasoning_content"], []):
                    yield event
            if delta.get("content"):
                for event in [*close_call(), *text_delta("message", delta["content"], logprobs)]:
                    yield event
            for call in delta.get("tool_calls") or []:
                for event in call_events(call):
                    yield event
            finish = choice["finish_reason"] or finish
    result = results[0]
    if result is None:  # cancelled: nobody is listening
        return
    # The result's calls are the complete ones: a call streamed past them was cut (max_output_tokens).
    complete = len(calls) <= len(getattr(result, "tool_calls", None) or [])
    for event in close_call("completed" if complete else "incomplete"):
        yield event
    if current is not None:
        for event in close_item("incomplete" if finish in ("length", "error") else "completed"):
            yield event
    final = builder.finished(output, finish, result, reasoning_text)
    kind = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}
    yield {"type": kind[final.status], "response": final.model_dump()}


async def sse_events(stream: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Server-sent events `event: <type>` / `data: <json>`, numbered by `sequence_number`. The status
    (200) went out with the first event, so a failure afterwards (a bug) is an `error` event, as
    OpenAI sends it."""
    sequence = 0
    try:
        async for event in stream:
            event["sequence_number"] = sequence
            sequence += 1
            yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
    except Exception as exc:  # noqa: BLE001 - logged with its traceback, reported without it
        log.exception("internal error while streaming a response")
        error = {
            "type": "error",
            "code": "server_error",
            "message": f"internal server error ({type(exc).__name__})",
            "param": None,
            "sequence_number": sequence,
        }
        yield f"event: error\ndata: {json.dumps(error)}\n\n"

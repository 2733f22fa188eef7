"""Delivering a job's output: collected whole (watching for a client that leaves) or as
server-sent events."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import cast

from fastapi import Request

from coreai.server.errors import APIError, lost_error
from coreai.service import Job
from coreai.service.engine import Piece
from runtime import GenerationResult
from runtime.errors import ClusterLost

log = logging.getLogger("coreai.server")

DISCONNECT_POLL = 0.5  # seconds between checks that a non-streaming client is still there


async def collect(jobs: list[Job], request: Request) -> list[tuple[list[Piece], GenerationResult]] | None:
    """Each job's pieces and result (non-streaming; a request's `n` choices are jobs of their own).
    Checks for a client disconnect twice a second, also while pieces keep arriving; then cancels
    every job and returns None (`Job.release`: a job the client left before its first token waits
    a moment for the same request sent again)."""
    outcomes = await asyncio.gather(*(_collect(job, request) for job in jobs))
    if any(result is None for _, result in outcomes):
        for job in jobs:
            job.release()
        return None
    return cast("list[tuple[list[Piece], GenerationResult]]", outcomes)  # no result is None


async def _collect(job: Job, request: Request) -> tuple[list[Piece], GenerationResult | None]:
    pieces: list[Piece] = []
    result = None
    next_check = time.monotonic() + DISCONNECT_POLL
    while True:
        try:
            item = await asyncio.wait_for(job.get(), timeout=DISCONNECT_POLL)
        except TimeoutError:
            item = None
        if time.monotonic() >= next_check:
            if await request.is_disconnected():
                job.release()
                return pieces, None
            next_check = time.monotonic() + DISCONNECT_POLL
        if item is Job.END:
            return pieces, result
        if isinstance(item, GenerationResult):
            result = item
        elif item is not None:
            pieces.append(item)


async def merge(streams: list[AsyncIterator[dict]], keepalive: tuple[float, dict] | None = None) -> AsyncIterator[dict]:
    """The items of several async iterators, in the order they come. An error in one is raised here
    after the others end; closing this closes them all. keepalive: (seconds, item): a copy of the
    item whenever none came for that long, so a stream waiting on a long prefill is not taken for a
    dead one (Claude Code aborts a Messages stream silent for 300 s, then retries it from scratch)."""
    items: asyncio.Queue = asyncio.Queue()
    ended = object()

    async def pump(stream):
        try:
            async for item in stream:
                await items.put(item)
        finally:
            await stream.aclose()
            items.put_nowait(ended)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            try:
                item = await asyncio.wait_for(items.get(), keepalive[0]) if keepalive else await items.get()
            except TimeoutError:
                assert keepalive is not None  # only a timed get times out
                yield dict(keepalive[1])
                continue
            if item is ended:
                running -= 1
            else:
                yield item
        for task in tasks:
            task.result()  # an error of a choice's stream
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def failure(exc: Exception) -> APIError:
    """The error of a failure after a stream's first event (call it in the `except` block): a lost
    distributed model (`lost_error`, as before a stream begins), or a bug, logged with its
    traceback and reported without it (a 500 `server_error`)."""
    if isinstance(exc, ClusterLost):
        return lost_error(exc)
    log.exception("internal error while streaming")
    return APIError(500, f"internal server error ({type(exc).__name__})", "server_error")


async def sse(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Server-sent events, ending `data: [DONE]`. The status (200) is sent with the first event, so
    a failure afterwards (`failure`) is reported in-stream as an OpenAI error object, as OpenAI does."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    except Exception as exc:  # noqa: BLE001 - reported in-stream
        e = failure(exc)
        error = {"message": e.message, "type": e.type, "param": None, "code": e.code}
        yield f"data: {json.dumps({'error': error})}\n\n"
    yield "data: [DONE]\n\n"


async def named_sse(
    stream: AsyncIterator[dict], fault: Callable[[APIError], dict], numbered: bool = False
) -> AsyncIterator[str]:
    """Server-sent events `event: <type>` / `data: <json>` of `stream`'s events (the Responses and
    Messages streams), numbered by `sequence_number` from 0 when `numbered` (Responses). The status
    (200) went out with the first event, so a failure afterwards is sent as the event
    `fault(error)` (its API's error event of the `failure`)."""
    sequence = 0
    try:
        async for event in stream:
            if numbered:
                event["sequence_number"] = sequence
                sequence += 1
            yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
    except Exception as exc:  # noqa: BLE001 - reported in-stream
        error = fault(failure(exc))
        if numbered:
            error["sequence_number"] = sequence
        yield f"event: error\ndata: {json.dumps(error)}\n\n"

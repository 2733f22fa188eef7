"""Delivering a job's output: collected whole (watching for a client that leaves) or as
server-sent events."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import AsyncIterator

from fastapi import Request

from coreai.server.engine import Piece
from coreai.server.queue import Job
from runtime import GenerationResult

log = logging.getLogger("coreai.server")

DISCONNECT_POLL = 0.5  # seconds between checks that a non-streaming client is still there


async def collect(job: Job, request: Request) -> tuple[list[Piece], GenerationResult | None]:
    """All pieces and the result of a non-streaming job. Checks for a client disconnect twice a
    second, also while pieces keep arriving (then cancels the job and returns result None)."""
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
                job.cancel.set()
                return pieces, None
            next_check = time.monotonic() + DISCONNECT_POLL
        if item is Job.END:
            return pieces, result
        if isinstance(item, GenerationResult):
            result = item
        elif item is not None:
            pieces.append(item)


async def sse(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Server-sent events, ending `data: [DONE]`. The status (200) is sent with the first event, so
    a failure afterwards (a bug) is reported in-stream as an OpenAI error object, as OpenAI does."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    except Exception as exc:  # noqa: BLE001 - logged with its traceback, reported without it
        log.exception("internal error while streaming")
        error = {
            "message": f"internal server error ({type(exc).__name__})",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        yield f"data: {json.dumps({'error': error})}\n\n"
    yield "data: [DONE]\n\n"

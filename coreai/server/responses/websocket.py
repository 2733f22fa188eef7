"""Responses over a WebSocket on `/v1/responses` (OpenAI's WebSocket mode, as Codex uses it with
`supports_websockets`: the `OpenAI-Beta: responses_websockets=...` handshake).

Each text message is one request: `{"type": "response.create", ...the body of POST /v1/responses}`,
answered by the same events as the SSE stream (`stream.py`: `response.created` ... the final
`response.completed` / `.incomplete` / `.failed`), each a JSON text message numbered by
`sequence_number`, the messages of one connection handled one at a time; `response.in_progress` is
sent again while a long prefill sends nothing (`stream.keepalive`: Codex drops a socket silent for
its `stream_idle_timeout_ms`). `generate: false` (Codex's prewarm) answers `response.created` and
`response.completed` with no output and generates nothing.
The connection keeps its own responses (`store: false` ones too), so its next request may name
one as `previous_response_id` and send only the new items.

The HTTP shell's rules hold on the socket: the API key is checked at the handshake (a refused
key closes it with 1008 before it opens), a message over `max_body_bytes` is refused (413), a bad
request is an `error` event in OpenAI's shape (`{"type": "error", "status", "error": {"type",
"code", "message", "param"}}`) and the connection stays open; a client that leaves cancels its
generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from coreai.server.dispatch import check_model, start
from coreai.server.errors import APIError, validation_error
from coreai.server.guard import require_api_key
from coreai.server.responses import schemas as r
from coreai.server.responses.reply import ResponseBuilder, ResponsesReply, input_items
from coreai.server.responses.routes import ResponsesCall
from coreai.server.responses.store import ResponseStore
from coreai.server.streaming import failure

router = APIRouter(prefix="/v1")


def install(app) -> None:
    """Mount the WebSocket route on `app` (after `routes.install`: it uses the app's store)."""
    app.include_router(router)


CACHE_COUNT = 8  # responses a connection keeps for its previous_response_id


def error_event(error: APIError) -> dict:
    """An `APIError` as the WebSocket's error event."""
    detail = {"type": error.type, "code": error.code, "message": error.message, "param": error.param}
    return {"type": "error", "status": error.status, "error": detail}


class Connection:
    """One socket: its own responses (`cache`), the job now running (cancelled when the client
    leaves) and the event numbering of the request being answered."""

    def __init__(self, websocket: WebSocket):
        self.websocket = websocket
        self.app = websocket.app
        self.server = websocket.app.state.server
        self.cache = ResponseStore(max_count=CACHE_COUNT)
        self.sequence = 0
        self.jobs: list = []

    async def send(self, event: dict) -> None:
        event["sequence_number"] = self.sequence
        self.sequence += 1
        await self.websocket.send_text(json.dumps(event, ensure_ascii=False))

    def cancel(self) -> None:
        """The running answer's jobs let go (`Job.release`: cancelled, or held for a resend)."""
        for job in self.jobs:
            job.release()

    async def answer(self, text: str) -> None:
        """The events of one message; a refused request is one `error` event."""
        self.sequence = 0
        try:
            await self.create(self.request(text))
        except APIError as exc:
            await self.send(error_event(exc))

    def request(self, text: str) -> tuple[r.ResponseCreateRequest, bool]:
        """The message's request and its `generate` flag; raises a 400 or 413 `APIError`."""
        limit = self.server.config.max_body_bytes
        if len(text.encode()) > limit:
            raise APIError(413, f"the message exceeds {limit} bytes", code="request_too_large")
        try:
            body: Any = json.loads(text)
        except ValueError as exc:
            raise APIError(400, f"malformed JSON message: {exc}", code="invalid_json") from None
        if not isinstance(body, dict) or body.get("type") != "response.create":
            raise APIError(400, "a message is {'type': 'response.create', ...a Responses request}", param="type")
        body = {k: v for k, v in body.items() if k != "type"}
        generate = body.pop("generate", True)
        if not isinstance(generate, bool):
            raise APIError(400, "generate: a boolean", param="generate")
        try:
            return r.ResponseCreateRequest.model_validate(body), generate
        except ValidationError as exc:
            tags = self.app.state.union_tags
            raise validation_error(RequestValidationError(exc.errors(), body=body), tags) from None

    async def create(self, parsed: tuple[r.ResponseCreateRequest, bool]) -> None:
        req, generate = parsed
        call = ResponsesCall(req, self.server, self.app.state.responses, cache=self.cache)
        if not generate:
            return await self.prewarm(call)
        started = await start(self.server, call)  # the one skeleton; its headers are logged, not sent
        self.jobs = started.jobs
        reply = started.reply
        assert isinstance(reply, ResponsesReply)  # a ResponsesCall's
        stream = reply.stream(self.jobs)
        try:
            async for event in stream:
                await self.send(event)
        except Exception as exc:  # noqa: BLE001 - reported on the socket, as the SSE stream does
            if isinstance(exc, WebSocketDisconnect):
                raise
            await self.send(error_event(failure(exc)))
        finally:
            await stream.aclose()  # its reader stops (and lets go of the job) first
            self.cancel()
            self.jobs = []

    async def prewarm(self, call: ResponsesCall) -> None:
        """`generate: false`: the request checked (its model too, as `start` checks it) and kept (as a
        response with no output), nothing generated."""
        check_model(self.server, call.model)
        call.generation()  # checks the input, fills the conversation
        builder = ResponseBuilder(call.body, call.body.model, self.server.model.tokenizer)
        await self.send({"type": "response.created", "response": builder.response().model_dump()})
        final = builder.response("completed").model_dump()
        self.cache.put(final, call.conversation, input_items(call.body))
        await self.send({"type": "response.completed", "response": final})


@router.websocket("/responses")
async def responses_socket(websocket: WebSocket):
    """OpenAI Responses over a WebSocket (see the module docstring)."""
    try:
        require_api_key(websocket)
    except APIError as exc:
        await websocket.close(code=1008, reason=exc.message[:120])
        return
    await websocket.accept()
    conn = Connection(websocket)
    messages: asyncio.Queue = asyncio.Queue()

    answering: asyncio.Task | None = None

    async def read():  # the client's messages; its leaving stops the answer that runs
        try:
            while True:
                await messages.put(await websocket.receive_text())
        except (WebSocketDisconnect, RuntimeError):
            if answering is not None:
                answering.cancel()  # its stream lets go of its jobs once it reads no more (`Job.release`)
            await messages.put(None)

    reader = asyncio.create_task(read())
    try:
        while (text := await messages.get()) is not None:
            answering = asyncio.create_task(conn.answer(text))
            try:
                await answering
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # this handler is cancelled, not only the answer
                break  # the client left mid-answer
    except (WebSocketDisconnect, RuntimeError):
        pass  # the client left mid-answer
    finally:
        conn.cancel()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader

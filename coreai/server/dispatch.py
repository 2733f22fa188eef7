"""The one request skeleton every API dialect runs (`dispatch`), and what its routes share: the
server instance as a dependency, the model check, and the error responses the OpenAPI schema lists.

    check the model -> map the body (the dialect's `Call.generation`) -> prepare (the service, on a
    thread-pool thread: a bad request is a 400 before it queues) -> submit -> the enforcement and
    field-policy headers -> stream (the dialect's `Reply.sse`) or collect and render (`Reply.complete`)

A dialect supplies a `Call` per request: its mapping, its renderer and its stream renderer; its
error shape is registered with the app (`coreai.server.errors`). Dialects import this module and
the service, never each other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response, StreamingResponse

from coreai.server.enforcement import enforcement_headers
from coreai.server.errors import APIError, ErrorResponse, from_library_error
from coreai.server.policy import ignored_headers
from coreai.server.state import ServerState
from coreai.server.streaming import collect
from coreai.service import Closed, GenerationJob, GenerationRequest, Job, Names, QueueFull, Service
from coreai.service.engine import Piece
from guided import GrammarError
from runtime import GenerationResult
from runtime.errors import InputError

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 500, 503)
}


def server_state(request: Request) -> ServerState:
    """Dependency: the server instance that owns this app."""
    return request.app.state.server


Server = Annotated[ServerState, Depends(server_state)]


def check_model(server: ServerState, requested: str) -> None:
    """Raises a 404 `model_not_found` (`APIError`) unless `requested` is the served name or one of
    its aliases (`ServerConfig.aliases`)."""
    if not server.serves(requested):
        hint = (
            f" (or an alias: {', '.join(server.aliases)})" if server.aliases else " (coreai serve --alias adds names)"
        )
        raise APIError(
            404,
            f"the model {requested!r} does not exist; this server serves {server.name!r}{hint}",
            param="model",
            code="model_not_found",
        )


Collected = list[tuple[list[Piece], GenerationResult]]


class Reply(Protocol):
    """A dialect's renderer of one request's jobs (its choices)."""

    def sse(self, jobs: list[Job]) -> AsyncIterator[str]:
        """The reply as server-sent events, as they come; cancels the jobs when the client leaves."""
        ...

    def complete(self, collected: Collected) -> Any:
        """The whole reply (a dict or a pydantic model) of every choice's pieces and result."""
        ...


class Call(Protocol):
    """One request of a dialect: `model` (the name asked for), `stream`, the mapping to the
    service's request and the renderer of its job."""

    @property
    def model(self) -> str: ...

    @property
    def stream(self) -> bool: ...

    def generation(self) -> GenerationRequest: ...

    def ignored(self) -> list[str]:
        """The fields, hosted tools and headers of this request accepted and not applied (the
        field policy's classes (b) and (c), `coreai.server.policy`); called after `generation`."""
        ...

    def reply(self, job: GenerationJob) -> Reply: ...


def submit(server: ServerState, job: GenerationJob, names: Names) -> list[Job]:
    """Queue a job's choices, all or none: 429 (Retry-After) when the queue is full, 503 when the
    server is shutting down or its model is lost (each an `APIError`); a request that could never
    fit is the service's `RequestError` naming `names.n` (400)."""
    try:
        return server.service.submit(job, names)
    except InputError as exc:
        raise from_library_error(exc) from None
    except QueueFull as exc:
        raise APIError(
            429, str(exc), "rate_limit_error", None, "queue_full", headers={"Retry-After": str(exc.retry_after)}
        ) from None
    except Closed as exc:
        raise APIError(503, str(exc), "server_error", None, "server_shutting_down") from None


def prepared(service: Service, generation: GenerationRequest) -> GenerationJob:
    """`service.prepare(generation)`, its refusals 400 `APIError`s naming the dialect's field."""
    try:
        return service.prepare(generation)
    except (GrammarError, InputError) as exc:
        raise from_library_error(exc) from None


async def prepare(server: ServerState, call: Call) -> tuple[GenerationRequest, GenerationJob]:
    """The model checked, the body mapped and its job prepared (on a thread-pool thread)."""
    check_model(server, call.model)
    generation = call.generation()
    return generation, await run_in_threadpool(prepared, server.service, generation)


def ignored_names(call: Call, job: GenerationJob) -> list[str]:
    """What `x-coreai-ignored` names for `call`: its hints and hosted tools (`Call.ignored`) and the
    volatile prompt markers the service removed (`GenerationJob.removed`)."""
    return [*call.ignored(), *(f"{name} (removed from the prompt)" for name in job.removed)]


async def dispatch(server: ServerState, request: Request, call: Call) -> Response:
    """The skeleton (see the module docstring). A client that leaves a whole (non-streaming) reply
    cancels its jobs; nobody reads the 499 it gets."""
    generation, job = await prepare(server, call)
    jobs = submit(server, job, generation.names)
    reply = call.reply(job)
    headers = enforcement_headers(job.constraint) if job.constraint is not None else {}
    headers |= ignored_headers(ignored_names(call, job))
    if call.stream:
        return StreamingResponse(reply.sse(jobs), media_type="text/event-stream", headers=headers)
    collected = await collect(jobs, request)
    if collected is None:
        return JSONResponse({}, status_code=499)
    return JSONResponse(jsonable_encoder(reply.complete(collected)), headers=headers)

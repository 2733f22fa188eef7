"""The one request skeleton every API dialect runs (`dispatch`), and what its routes share: the
server instance as a dependency, the model check, and the error responses the OpenAPI schema lists.

    check the model -> map the body (the dialect's `Call.generation`) -> prepare (the service, on a
    thread-pool thread: a bad request is a 400 before it queues) -> submit -> the enforcement and
    field-policy headers (`start`, the same for every transport) -> stream (the dialect's
    `Reply.sse`) or collect and render (`Reply.complete`); the Responses WebSocket runs `start` and
    sends the reply's events as messages.

A dialect supplies a `Call` per request: its mapping, its renderer and its stream renderer, made
by the route's endpoint (`endpoint`: the skeleton owns it, so a dialect's code runs only when the
skeleton calls it, never around it); its error shape is registered with the app (`Dialect`).
Dialects import this module and the service, never each other.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from coreai.server.enforcement import enforcement_headers
from coreai.server.errors import APIError, ErrorResponse, from_library_error
from coreai.server.policy import Hint, ignored_fields, ignored_headers
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
    """One request of a dialect: `model` (the name asked for), `stream`, its validated `body` and
    the dialect's `hints` (the field policy's class (b) fields: `coreai.server.policy`), the mapping
    to the service's request and the renderer of its job."""

    @property
    def model(self) -> str: ...

    @property
    def body(self) -> BaseModel: ...

    @property
    def hints(self) -> Sequence[Hint]: ...

    @property
    def stream(self) -> bool: ...

    def generation(self) -> GenerationRequest: ...

    def ignored(self) -> list[str]:
        """What this request asks for that is accepted and not applied beyond its `hints`: hosted
        tools, headers, values (the field policy's classes (b) and (c)); called after `generation`."""
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
    """What `x-coreai-ignored` names for `call`: the hints its body gives (`Call.hints`), what else
    it asks for and is not applied (`Call.ignored`: hosted tools, ...), a budget cut to the
    server's bound (`GenerationJob.capped`) and the volatile prompt markers the service removed
    (`GenerationJob.removed`)."""
    hinted = ignored_fields(call.body.model_dump(by_alias=True, exclude_none=True), call.hints)
    markers = (f"{name} (removed from the prompt)" for name in job.removed)
    return [*hinted, *call.ignored(), *job.capped, *markers]


@dataclass
class Started:
    """A request prepared and queued: its choices' jobs, its renderer, and the enforcement and
    field-policy headers of its reply (logged too: a WebSocket has no headers per message)."""

    jobs: list[Job]
    reply: Reply
    headers: dict[str, str]


async def start(server: ServerState, call: Call) -> Started:
    """The skeleton's steps every transport shares: the model checked, the body mapped, the job
    prepared and queued, the headers of its reply. Raises `APIError` (400, 404, 429, 503)."""
    generation, job = await prepare(server, call)
    jobs = submit(server, job, generation.names)
    headers = enforcement_headers(job.constraint) if job.constraint is not None else {}
    headers |= ignored_headers(ignored_names(call, job))
    return Started(jobs, call.reply(job), headers)


async def dispatch(server: ServerState, request: Request, call: Call) -> Response:
    """The skeleton over HTTP (see the module docstring). A client that leaves a whole
    (non-streaming) reply cancels its jobs; nobody reads the 499 it gets."""
    started = await start(server, call)
    if call.stream:
        return StreamingResponse(
            started.reply.sse(started.jobs), media_type="text/event-stream", headers=started.headers
        )
    collected = await collect(started.jobs, request)
    if collected is None:
        return JSONResponse({}, status_code=499)
    return JSONResponse(jsonable_encoder(started.reply.complete(collected)), headers=started.headers)


def endpoint(
    body: type, make_call: Callable[[Any, Request, ServerState], Call], name: str, doc: str
) -> Callable[..., Awaitable[Response]]:
    """A route's endpoint (for `APIRouter.add_api_route`) that validates a `body` (the dialect's
    pydantic model: a 400 naming the field otherwise) and runs the skeleton on the `Call` that
    `make_call(body, request, server)` makes of it. name: the route's name (its OpenAPI operation
    id's start); doc: its description."""

    async def run(req: Any, request: Request, server: Server) -> Response:
        return await dispatch(server, request, make_call(req, request, server))

    parameter = inspect.Parameter.POSITIONAL_OR_KEYWORD
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # FastAPI reads the body's model here
        [
            inspect.Parameter("req", parameter, annotation=body),
            inspect.Parameter("request", parameter, annotation=Request),
            inspect.Parameter("server", parameter, annotation=Server),
        ]
    )
    run.__name__, run.__doc__ = name, doc
    return run

"""What every route module uses, below all of them: the server instance as a dependency, the model
check, queueing a request's generations and the error responses the OpenAPI schema lists. The route
modules (`routes`, `responses`, `messages`) import this one and never each other."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from coreai.server import reply_schemas as o
from coreai.server.engine import GenerationParams
from coreai.server.errors import APIError, bad_request
from coreai.server.queue import Closed, Job, QueueFull
from coreai.server.state import ServerState

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": o.ErrorResponse} for status in (400, 401, 404, 413, 429, 500, 503)
}


def server_state(request: Request) -> ServerState:
    """Dependency: the server instance that owns this app."""
    return request.app.state.server


Server = Annotated[ServerState, Depends(server_state)]


def check_model(server: ServerState, requested: str) -> None:
    """Raises a 404 `model_not_found` (`APIError`) unless `requested` is the served name."""
    if requested != server.name:
        raise APIError(
            404,
            f"the model {requested!r} does not exist; this server serves {server.name!r}",
            param="model",
            code="model_not_found",
        )


def submit(server: ServerState, params: GenerationParams, n: int) -> list[Job]:
    """Queue a request's `n` choices, all or none: 400 when they could never fit, 429 (Retry-After)
    when the queue is full, 503 when the server is shutting down (each an `APIError`)."""
    config = server.config
    if n > config.max_batch + config.max_queue:  # would never fit: not a 429 to retry
        raise bad_request(
            f"n = {n} is more than this server runs and queues at once "
            f"(max_batch {config.max_batch} + max_queue {config.max_queue})",
            "n",
        )
    try:
        return server.worker.submit(params.choices(n))
    except QueueFull as exc:
        raise APIError(
            429, str(exc), "rate_limit_error", None, "queue_full", headers={"Retry-After": str(exc.retry_after)}
        ) from None
    except Closed as exc:
        raise APIError(503, str(exc), "server_error", None, "server_shutting_down") from None

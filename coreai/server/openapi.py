"""The OpenAPI document (`/openapi.json`) tells the truth about errors and streams: every operation lists the
error statuses the shell may answer (400 bad input, 401 key, 403 Host or Origin, 404, 413 body,
429 queue, 500 bug, 503 shutting down or lost; and a dialect's own, such as an overloaded 529), each
in the error shape of the dialect its path belongs to, and not FastAPI's 422, which this server never sends (its
validation errors are 400s, `coreai.server.errors`). Clients generated from the document and
schema-driven fuzzers (tests/test_server_fuzz.py) then see only documented answers. A route that
streams (`stream: true`) lists its 200 as JSON or `text/event-stream` (each event with its data)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from fastapi import FastAPI

from coreai.server.errors import ErrorResponse

ERROR_STATUSES = ("400", "401", "403", "404", "413", "429", "500", "503")
# One event of an event stream as an SSE parser reads it (schemathesis checks each against this).
EVENT_STREAM = {
    "schema": {
        "type": "object",
        "properties": {"event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"}},
        "required": ["data"],
    }
}
OPEN_STATUSES = ("403", "500", "503")  # routes without a key or a body: /health and the like
OPENAI_SCHEMA = "#/components/schemas/ErrorResponse"


def install(
    app: FastAPI, shapes: Mapping[str, tuple[dict[str, Any], tuple[str, ...]]], streaming: Collection[str] = ()
) -> None:
    """Make `app.openapi()` list the error responses. shapes: path prefix -> (a dialect's error body
    as JSON Schema, extra statuses it answers: `Dialect.error_schemas`); other paths answer OpenAI's
    `ErrorResponse`. streaming: the routes that answer `stream: true` with server-sent events (their
    200 is JSON or an event stream)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            components = document.setdefault("components", {}).setdefault("schemas", {})
            error = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(error.pop("$defs", {}))
            components.setdefault("ErrorResponse", error)
            for path, operations in document.get("paths", {}).items():
                schema, extra = _shape(path, shapes)
                statuses = ERROR_STATUSES if path.startswith("/v1/") else OPEN_STATUSES
                for method, operation in operations.items():
                    responses = operation.setdefault("responses", {})
                    responses.pop("422", None)
                    if path in streaming and method == "post":
                        ok = responses.setdefault("200", {"description": "the reply"})
                        ok.setdefault("content", {})["text/event-stream"] = EVENT_STREAM
                    for status in (*statuses, *extra):
                        responses[status] = {
                            "description": "error",
                            "content": {"application/json": {"schema": schema}},
                        }
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _shape(path: str, shapes: Mapping[str, tuple[dict[str, Any], tuple[str, ...]]]):
    """(the error body's JSON Schema, extra statuses) of the dialect `path` belongs to."""
    for prefix, shape in shapes.items():
        if path.startswith(prefix):
            return shape
    return {"$ref": OPENAI_SCHEMA}, ()

"""The Messages API's error shape, `{"type": "error", "error": {"type", "message"}}`, registered
with the app for /v1/messages (`coreai.server.errors.install`) and used as the stream's `error`
event."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from coreai.server.errors import APIError

PATH = "/v1/messages"
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "overloaded_error",
    503: "overloaded_error",
}


def error_body(error: APIError) -> dict:
    """The body of `error_response` (also the Messages stream's `error` event). The shape has no
    `param`: the message names the field instead."""
    message = error.message
    if error.param and not message.startswith(error.param):
        message = f"{error.param}: {message}"
    return {"type": "error", "error": {"type": TYPES.get(error.status, "api_error"), "message": message}}


def error_response(error: APIError) -> JSONResponse:
    """`error` in the Messages API's shape, with Anthropic's status for it: an overloaded server
    (full queue, shutting down) is 529 `overloaded_error`, which the `anthropic` SDK retries."""
    body = error_body(error)
    status = 529 if body["error"]["type"] == "overloaded_error" else error.status
    return JSONResponse(body, status_code=status, headers=error.headers)


# The shape above as JSON Schema, for the OpenAPI document's error responses (`coreai.server.openapi`).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}

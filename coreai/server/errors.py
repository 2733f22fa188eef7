"""OpenAI error objects: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status,
and under the Messages API (/v1/messages) Anthropic's, `{"type": "error", "error": {"type", "message"}}`.

400 malformed JSON, bad parameters, invalid or unenforceable schemas and grammars; 401 missing or
wrong API key; 404 unknown model or route; 413 oversized body; 429 full queue (with Retry-After);
500 only for bugs (logged with their traceback, answered without it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from coreai.errors import ClusterLost, GrammarError, InputError, SchemaError, UnsupportedSchemaFeature

log = logging.getLogger("coreai.server")


class APIError(Exception):
    """An error answered as an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)

    def anthropic_response(self) -> JSONResponse:
        """This error in the Messages API's shape, `{"type": "error", "error": {"type", "message"}}`,
        with Anthropic's status for it: an overloaded server (full queue, shutting down) is 529
        `overloaded_error`, which the `anthropic` SDK retries. The shape has no `param`: the message
        names the field instead."""
        body = self.anthropic_error()
        status = 529 if body["error"]["type"] == "overloaded_error" else self.status
        return JSONResponse(body, status_code=status, headers=self.headers)

    def anthropic_error(self) -> dict:
        """The body of `anthropic_response` (also the Messages stream's `error` event)."""
        message = self.message
        if self.param and not message.startswith(self.param):
            message = f"{self.param}: {message}"
        return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(self.status, "api_error"), "message": message}}

    def response_for(self, path: str) -> JSONResponse:
        """The error object of the API `path` belongs to: Anthropic's under /v1/messages, else OpenAI's."""
        return self.anthropic_response() if path.startswith(ANTHROPIC_PATHS) else self.response()


ANTHROPIC_PATHS = ("/v1/messages",)
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "overloaded_error",
    503: "overloaded_error",
}


def lost_error(exc: ClusterLost) -> APIError:
    """A lost distributed model (a rank died or hung): 503 `cluster_lost`, before a stream begins and
    as the error event of one that began."""
    return APIError(503, str(exc), "server_error", None, "cluster_lost")


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    """A 400 `invalid_request_error`; `code` names the kind for clients (OpenAI's codes where one fits)."""
    return APIError(400, message, param=param, code=code)


def from_library_error(exc: GrammarError | InputError, param: str | None = None) -> APIError:
    """A refused request (a schema, grammar, tool definition or other input) -> 400 with reason,
    pointer and code. `param`: the request field at fault (e.g. "response_format.json_schema.schema");
    None: the one the error names (`guided.request` sets it in the front end's spelling)."""
    param = param if param is not None else exc.param
    if isinstance(exc, InputError):
        return bad_request(str(exc), param, exc.code or "invalid_value")
    if isinstance(exc, UnsupportedSchemaFeature):
        return bad_request(str(exc), param, "unsupported_schema_feature")
    if isinstance(exc, SchemaError):
        return bad_request(str(exc), param, "invalid_schema")
    return bad_request(str(exc), param, "invalid_grammar")


def field_path(loc, body) -> str:
    """pydantic's error location as the request's field path: ("body", "messages", 0, "user",
    "content") -> "messages[0].content".

    Union-member labels (a discriminator tag such as "user", or "str" for a `str | list` field) are
    in the location but not in the request; walking the location along the request body tells
    them apart from real keys.
    """
    out, node = "", body
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int) and isinstance(node, list) and part < len(node):
            out, node = out + f"[{part}]", node[part]
        elif isinstance(node, dict) and part in node:
            out, node = out + ("." if out else "") + str(part), node[part]
        elif not isinstance(node, (dict, list)) or isinstance(part, int):
            continue
        elif "[" not in str(part) and str(part)[:1].islower() and part not in _UNION_TAGS:
            out, node = out + ("." if out else "") + str(part), None  # a missing or unknown key
    return out


# Discriminator values of the request models' unions (never field names missing from a request).
_UNION_TAGS = {"system", "developer", "user", "assistant", "tool", "text", "json_object", "json_schema", "str", "bool"}
# The Messages API's block and tool tags (`coreai.server.messages_schemas`).
_UNION_TAGS |= {"tool_use", "tool_result", "thinking", "redacted_thinking", "custom", "server"}
_UNION_TAGS |= {"enabled", "adaptive", "disabled", "image", "document", "list[union[text,image]]"}


def _error_path(error: dict, body) -> str:
    """The request field of one pydantic error; a missing field is named even when its name is also
    a union tag (`json_schema`: both the response format's tag and its field)."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "missing" and loc and isinstance(loc[-1], str):
        parent = field_path(loc[:-1], body)
        return f"{parent}.{loc[-1]}" if parent else loc[-1]
    return field_path(loc, body)


def validation_error(exc: RequestValidationError) -> APIError:
    """One pydantic error as a 400 naming its field: the one deepest in the request (for a union,
    the member that matched furthest). Unknown fields say that they are not supported, so a client
    learns a parameter was refused rather than ignored."""
    body = getattr(exc, "body", None)
    errors = [(_error_path(e, body), e) for e in exc.errors()] or [("", {"type": "", "msg": "invalid request"})]
    param, first = max(errors, key=lambda pe: len(pe[0]))  # max keeps the first among equals
    kind = first.get("type", "")
    if kind == "json_invalid":
        return bad_request(
            f"malformed JSON body: {first.get('ctx', {}).get('error', first['msg'])}", None, "invalid_json"
        )
    if kind == "missing":
        return bad_request(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    if kind == "extra_forbidden":
        return bad_request(
            f"{param}: this server does not support the field {param.rsplit('.', 1)[-1]!r}",
            param,
            "unsupported_parameter",
        )
    msg = first.get("msg", "invalid value").removeprefix("Value error, ")
    return bad_request(f"{param or 'body'}: {msg}", param or None, "invalid_value")


_HTTP_CODES = {400: "invalid_json", 404: "not_found", 405: "method_not_allowed"}


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into an error object of the route's API."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response_for(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return validation_error(exc).response_for(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code, message = _HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail)
        if exc.status_code == 400:  # FastAPI's only 400: a body it cannot decode (not UTF-8 JSON)
            message = f"the request body is not UTF-8 JSON ({message})"
        error = APIError(exc.status_code, message, param=None, code=code, headers=exc.headers)
        return error.response_for(request.url.path)

    @app.exception_handler(ClusterLost)
    async def _lost(request: Request, exc: ClusterLost):  # a rank died mid-request: the server is going
        return lost_error(exc).response_for(request.url.path)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        error = APIError(500, f"internal server error ({type(exc).__name__})", "server_error")
        return error.response_for(request.url.path)

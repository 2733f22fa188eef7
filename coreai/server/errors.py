"""OpenAI error objects: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status,
and under a dialect that registered its own shape for its paths (`install`) that.

400 malformed JSON, bad parameters, invalid or unenforceable schemas and grammars; 401 missing or
wrong API key; 404 unknown model or route; 413 oversized body; 429 full queue (with Retry-After);
500 only for bugs (logged with their traceback, answered without it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from coreai.errors import ClusterLost, GrammarError, InputError, SchemaError, UnsupportedSchemaFeature

log = logging.getLogger("coreai.server")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error object, as the OpenAPI document lists it."""

    error: ErrorDetail


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


# A dialect whose errors are not OpenAI's objects registers its shape for its paths (`install`).
ErrorShape = Callable[[APIError], JSONResponse]


def respond(error: APIError, path: str, shapes: Mapping[str, ErrorShape]) -> JSONResponse:
    """`error` in the shape of the dialect `path` belongs to (`shapes`: path prefix -> shape), else
    as an OpenAI error object."""
    for prefix, shape in shapes.items():
        if path.startswith(prefix):
            return shape(error)
    return error.response()


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
    None: the one the error names (`coreai.service.prepare` sets it in the front end's spelling)."""
    param = param if param is not None else exc.param
    if isinstance(exc, InputError):
        return bad_request(str(exc), param, exc.code or "invalid_value")
    if isinstance(exc, UnsupportedSchemaFeature):
        return bad_request(str(exc), param, "unsupported_schema_feature")
    if isinstance(exc, SchemaError):
        return bad_request(str(exc), param, "invalid_schema")
    return bad_request(str(exc), param, "invalid_grammar")


def field_path(loc, body, tags: Collection[str] = ()) -> str:
    """pydantic's error location as the request's field path: ("body", "messages", 0, "user",
    "content") -> "messages[0].content".

    Union-member labels (a discriminator tag such as "user", or "str" for a `str | list` field) are
    in the location but not in the request; walking the location along the request body tells
    them apart from real keys, and `tags` (the dialects' discriminator values, `Dialect.union_tags`)
    from a missing or unknown key.
    """
    out, node = "", body
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int) and isinstance(node, list) and part < len(node):
            out, node = out + f"[{part}]", node[part]
        elif isinstance(node, dict) and part in node:
            out, node = out + ("." if out else "") + str(part), node[part]
        elif not isinstance(node, (dict, list)) or isinstance(part, int):
            continue
        elif "[" not in str(part) and str(part)[:1].islower() and part not in tags and part not in PYDANTIC_TAGS:
            out, node = out + ("." if out else "") + str(part), None  # a missing or unknown key
    return out


# pydantic's own labels of a union's members (`str | list[...]`, ...), never field names.
PYDANTIC_TAGS = frozenset({"str", "bool"})


def _error_path(error: dict, body, tags: Collection[str]) -> str:
    """The request field of one pydantic error; a missing field is named even when its name is also
    a union tag (`json_schema`: both the response format's tag and its field)."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "missing" and loc and isinstance(loc[-1], str):
        parent = field_path(loc[:-1], body, tags)
        return f"{parent}.{loc[-1]}" if parent else loc[-1]
    return field_path(loc, body, tags)


def validation_error(exc: RequestValidationError, tags: Collection[str] = ()) -> APIError:
    """One pydantic error as a 400 naming its field: the one deepest in the request (for a union,
    the member that matched furthest; `tags`: the dialects' union tags, `field_path`). Unknown
    fields say that they are not supported, so a client learns a parameter was refused rather than
    ignored."""
    body = getattr(exc, "body", None)
    errors = [(_error_path(e, body, tags), e) for e in exc.errors()] or [("", {"type": "", "msg": "invalid request"})]
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


def install(app: FastAPI, shapes: Mapping[str, ErrorShape], tags: Collection[str] = ()) -> None:
    """Register the handlers that turn every failure into an error object of the route's dialect
    (`shapes`, also read by the body limit: `app.state.error_shapes`); `tags`: the dialects' union
    tags (`field_path`; `app.state.union_tags`)."""
    app.state.error_shapes = dict(shapes)
    app.state.union_tags = frozenset(tags)

    def answer(error: APIError, request: Request) -> JSONResponse:
        return respond(error, request.url.path, request.app.state.error_shapes)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return answer(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return answer(validation_error(exc, request.app.state.union_tags), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code, message = _HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail)
        if exc.status_code == 400:  # FastAPI's only 400: a body it cannot decode (not UTF-8 JSON)
            message = f"the request body is not UTF-8 JSON ({message})"
        return answer(APIError(exc.status_code, message, param=None, code=code, headers=exc.headers), request)

    @app.exception_handler(ClusterLost)
    async def _lost(request: Request, exc: ClusterLost):  # a rank died mid-request: the server is going
        return answer(lost_error(exc), request)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return answer(APIError(500, f"internal server error ({type(exc).__name__})", "server_error"), request)

"""The request guards: `require_api_key`, the dependency of the /v1 routes (401), and `BodyLimit`,
ASGI middleware that bounds the body before anything parses it (413)."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from coreai.server.errors import APIError, respond
from coreai.server.trust import given_key, key_matches


def require_api_key(request: HTTPConnection) -> None:
    """Route dependency, behind `coreai.server.trust.CallerCheck` (which answers before routing): one
    of `ServerConfig.keys()` as `Authorization: Bearer <key>` (or the Anthropic SDK's `x-api-key:
    <key>`), when any is set. The scheme is case-insensitive (RFC 7235: "bearer" is "Bearer"); the
    key is compared exactly, in constant time. Raises APIError 401 `invalid_api_key`. `request`: an
    HTTP request or a WebSocket's handshake."""
    keys = request.app.state.server.config.keys()
    if not keys:
        return
    if not key_matches(given_key(dict(request.headers)), [k.encode() for k in keys]):
        raise APIError(
            401,
            "missing or incorrect API key (send Authorization: Bearer <key> or x-api-key: <key>)",
            param=None,
            code="invalid_api_key",
        )


class BodyLimit:
    """ASGI middleware run before routing and body parsing: request bodies over `limit` bytes get
    413 (they are read here up to the bound, also when chunked without Content-Length)."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = self.limit
        too_large = APIError(413, f"the request body exceeds {limit} bytes", code="request_too_large")
        shapes = scope["app"].state.error_shapes  # the dialects' error shapes (`errors.install`)
        if int(headers.get("content-length", 0) or 0) > limit:
            return await respond(too_large, scope["path"], shapes)(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # disconnected before the body arrived
            body += message.get("body", b"")
            if len(body) > limit:
                return await respond(too_large, scope["path"], shapes)(scope, receive, send)
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            # The body once, then the real channel (so disconnects are still seen).
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

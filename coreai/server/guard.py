"""`Guard`: ASGI middleware that checks the API key and bounds the body before routing."""

from __future__ import annotations

import hmac

from coreai.server.config import ServerConfig
from coreai.server.errors import APIError


class Guard:
    """ASGI middleware run before routing and body parsing: the API key (401) and the body size
    bound (413; bodies are read here up to the bound, also when chunked without Content-Length)."""

    def __init__(self, app, config: ServerConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.config.api_key and scope["path"].startswith("/v1"):
            # The scheme is case-insensitive (RFC 7235: "bearer" is "Bearer"); the key is compared exactly.
            scheme, _, given = headers.get("authorization", "").partition(" ")
            key_ok = hmac.compare_digest(given.strip().encode(), self.config.api_key.encode())
            if scheme.lower() != "bearer" or not key_ok:
                error = APIError(
                    401,
                    "missing or incorrect API key (send Authorization: Bearer <key>)",
                    param=None,
                    code="invalid_api_key",
                )
                return await error.response()(scope, receive, send)
        limit = self.config.max_body_bytes
        too_large = APIError(413, f"the request body exceeds {limit} bytes", code="request_too_large")
        if int(headers.get("content-length", 0) or 0) > limit:
            return await too_large.response()(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # disconnected before the body arrived
            body += message.get("body", b"")
            if len(body) > limit:
                return await too_large.response()(scope, receive, send)
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

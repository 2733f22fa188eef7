"""Who may talk to the server, checked before routing: `HostCheck` (the `Host` allow-list, against
DNS rebinding), CORS for the origins given (Starlette's `CORSMiddleware`, none by default) and
`CallerCheck` (a browser's `Origin`, then the API keys). `install` puts them on the app in that
order, outermost first, so a refused request never reaches a route and a wrong key never tells
whether a route exists. Refusals are in the error shape of the dialect the path belongs to
(`coreai.server.errors.respond`).

DNS rebinding: a page on an attacker's domain whose name is re-resolved to 127.0.0.1 is same-origin
with a loopback server; its requests carry the attacker's name in `Host`, which this allow-list
refuses (Ollama's CVE-2024-28224 was this bug).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.websockets import WebSocketClose

from coreai.server.errors import APIError, respond

LOOPBACK_NAMES = frozenset({"localhost"})
# Open without a key: the health probe, the page and its files, the API's documents.
OPEN_PATHS = frozenset({"/health", "/", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
OPEN_PREFIXES = ("/playground/", "/static-offline-docs/")


def host_name(host: str) -> str:
    """The name or address of a `Host` header value, normalized: lower case, port, IPv6 brackets
    and a trailing dot removed ("[::1]:8080" -> "::1", "LocalHost.:80" -> "localhost")."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:  # name:port or v4:port (more colons: a bare IPv6 address)
        host = host.partition(":")[0]
    return host.rstrip(".")


def host_allowed(host: str, allowed: frozenset[str], local: str | None) -> bool:
    """Whether `host` (a `Host` value) names this server: a loopback name or address (127.0.0.0/8,
    ::1, ::ffff:127.x), the address the connection arrived at (`local`), or one of `allowed`
    (normalized names; "*" allows any)."""
    if "*" in allowed:
        return True
    name = host_name(host)
    if not name:
        return False
    if name in LOOPBACK_NAMES or name in allowed:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return True
    return local is not None and _same_address(address, local)


def _same_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address, local: str) -> bool:
    try:
        other = ipaddress.ip_address(local.partition("%")[0])
    except ValueError:
        return False
    if isinstance(other, ipaddress.IPv6Address) and other.ipv4_mapped is not None:
        other = other.ipv4_mapped
    return address == other


def key_matches(given: str, keys: Iterable[bytes]) -> bool:
    """Whether `given` equals one of `keys`, each compared in constant time (`hmac.compare_digest`),
    every key compared whatever the result."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given.encode(), key)
    return found


def given_key(headers: dict[str, str]) -> str:
    """The key a request sends: `Authorization: Bearer <key>` (the scheme in any case, RFC 7235), else
    `x-api-key: <key>` (the Anthropic SDK's)."""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        given = headers.get("x-api-key", "")
    return given.strip()


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def _refuse(error: APIError, scope, receive, send) -> None:
    if scope["type"] == "websocket":  # closed before the handshake: uvicorn answers 403
        return await WebSocketClose(code=1008, reason=error.message[:120])(scope, receive, send)
    return await respond(error, scope["path"], scope["app"].state.error_shapes)(scope, receive, send)


class HostCheck:
    """ASGI middleware: a request whose `Host` does not name this server (`host_allowed`) gets 403
    `host_not_allowed`, on every route. A request without `Host` (HTTP/1.0; never a browser's)
    passes. allowed: the `--allowed-host` names."""

    def __init__(self, app, allowed: Iterable[str]):
        self.app = app
        self.allowed = frozenset("*" if a.strip() == "*" else host_name(a) for a in allowed)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        host = _headers(scope).get("host")
        local = (scope.get("server") or (None,))[0]
        if host is None or host_allowed(host, self.allowed, local):
            return await self.app(scope, receive, send)
        error = APIError(
            403,
            f"the Host {host!r} is not one this server answers to (its loopback names and addresses, and "
            f"the address it was reached at): a guard against DNS rebinding; start it with "
            f"--allowed-host {host_name(host) or 'NAME'} to allow that name",
            "permission_error",
            code="host_not_allowed",
        )
        await _refuse(error, scope, receive, send)


class CallerCheck:
    """ASGI middleware, inside CORS: a request from a browser page of another origin (an `Origin`
    that is neither the server's own, `scheme://Host`, nor one of `origins`; "*" allows any) gets 403
    `origin_not_allowed`; then, when `keys` are set, a request without one of them gets 401
    `invalid_api_key` on every path but `OPEN_PATHS` / `OPEN_PREFIXES`, before routing (so an
    unknown route is a 401 too, never a 404)."""

    def __init__(self, app, origins: Iterable[str], keys: Iterable[bytes]):
        self.app = app
        self.origins = frozenset(o.rstrip("/").lower() for o in origins)
        self.keys = tuple(keys)

    def origin_allowed(self, origin: str, host: str | None, scheme: str) -> bool:
        origin = origin.rstrip("/").lower()
        if "*" in self.origins or origin in self.origins:
            return True
        parts = urlsplit(origin)
        return host is not None and parts.scheme in (scheme, scheme.replace("ws", "http")) and parts.netloc == host

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        origin = headers.get("origin")
        host = headers.get("host", "").lower() or None
        if origin is not None and not self.origin_allowed(origin, host, scope.get("scheme", "http")):
            error = APIError(
                403,
                f"requests from pages of the origin {origin!r} are not allowed; start the server with "
                f"--cors-origin {origin} to allow them",
                "permission_error",
                code="origin_not_allowed",
            )
            return await _refuse(error, scope, receive, send)
        path = scope["path"]
        if self.keys and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES):
            if not key_matches(given_key(headers), self.keys):
                error = APIError(
                    401,
                    "missing or incorrect API key (send Authorization: Bearer <key> or x-api-key: <key>)",
                    code="invalid_api_key",
                )
                return await _refuse(error, scope, receive, send)
        await self.app(scope, receive, send)


def install(app: FastAPI, allowed_hosts: Iterable[str], cors_origins: Iterable[str], keys: Iterable[str]) -> None:
    """Add the checks to `app` (call after every other middleware: the last added runs first):
    HostCheck, then CORS when `cors_origins` are given (any method and header, no cookies), then
    CallerCheck."""
    origins = list(cors_origins)
    app.add_middleware(CallerCheck, origins=origins, keys=[k.encode() for k in keys if k])
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["x-coreai-enforcement", "x-coreai-ignored", "retry-after"],
        )
    app.add_middleware(HostCheck, allowed=list(allowed_hosts))

"""The FastAPI app, the shell around the API dialects: `/health`, `/v1/models`, `/v1/models/{model}`
(`coreai.server.models`), the dialects' routes (each package's `Dialect`: `DIALECTS`),
`/openapi.json`, `/docs` and `/redoc` with their scripts served here, not from a CDN, and the
playground page at `/`. Every request runs the one skeleton of `coreai.server.dispatch` on the
generation service (`coreai.service`), a WebSocket message too (`dispatch.start`).

A request is validated (pydantic, 400 naming the field), its prompt rendered and its constraint
compiled on a thread-pool thread (400 before it queues), then queued for the generation worker,
which decodes up to `max_batch` requests together (429 when the queue is full). Responses and SSE
chunks follow OpenAI's shapes; a client that disconnects cancels its generation. A constrained
response carries `x-coreai-enforcement`: how its schema's keywords are enforced (`enforcement_headers`).

The app's lifespan starts the worker and the grammar-journal warm-up, and on shutdown (after the
server has stopped taking connections and running requests have had `shutdown_timeout` to finish)
stops and joins them (`ServerState.stop`).
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi_offline import FastAPIOffline

from coreai.server import anthropic, models, openai, openapi, playground, responses, trust
from coreai.server.config import ServerConfig
from coreai.server.errors import install as install_error_handlers
from coreai.server.guard import BodyLimit
from coreai.server.state import ServerState
from guided import GrammarCache
from runtime import Model

__all__ = ["ServerConfig", "create_app"]

# The dialects this server speaks, each through its package's `Dialect` (the shell names no other of their parts).
DIALECTS = (openai.DIALECT, responses.DIALECT, anthropic.DIALECT)


def create_app(model: Model, config: ServerConfig | None = None, grammar_cache: GrammarCache | None = None) -> FastAPI:
    """The server's ASGI app for `model`. `grammar_cache`: the compiled grammars of this server (a
    new `GrammarCache` by default, owned by the app: `app.state.server.grammar_cache`). Builds the
    grammar engine's view of the tokenizer (a few seconds, once per tokenizer per process); the
    generation worker runs while the app's lifespan does."""
    state = ServerState.build(model, config or ServerConfig(), grammar_cache)
    import jsonschema  # noqa: F401 - the final output check's import (seconds) at start-up, not in a first request

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.start()
        try:
            yield
        finally:
            await run_in_threadpool(state.stop)  # joins threads: off the event loop

    app = FastAPIOffline(
        title="coreai-mlx",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI-compatible local server; response_format, structured_outputs and tools "
        "are enforced by guided generation.",
    )
    app.state.server = state
    app.add_middleware(BodyLimit, limit=state.config.max_body_bytes)
    config = state.config  # Host, CORS, Origin, key: before the body limit and routing (trust.py)
    trust.install(app, config.allowed_hosts, config.cors_origins, config.keys())
    shapes = {path: shape for d in DIALECTS for path, shape in d.error_shapes.items()}
    install_error_handlers(app, shapes, frozenset().union(*(d.union_tags for d in DIALECTS)))
    app.state.model_shapes = [d.models for d in DIALECTS if d.models is not None]
    app.include_router(models.router)
    for dialect in DIALECTS:
        dialect.install(app)
    playground.install(app)  # the page at `/` (docs/reference/server.md#the-playground)
    schemas = {path: schema for d in DIALECTS for path, schema in d.error_schemas.items()}
    openapi.install(app, schemas, [path for d in DIALECTS for path in d.streaming_paths])
    return app

"""The FastAPI app: `/health`, `/v1/models`, `/v1/models/{model}`, `/v1/chat/completions`,
`/v1/completions` (+ `/docs`, `/openapi.json`).

A request is validated (pydantic, 400 naming the field), its prompt rendered and its constraint
compiled on a thread-pool thread (400 before it queues), then queued for the generation worker,
which decodes up to `max_batch` requests together (429 when the queue is full). Responses and SSE
chunks follow OpenAI's shapes; a client that disconnects cancels its generation. A constrained
response carries `x-coreai-enforcement`: how its schema's keywords are enforced (`enforcement_headers`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from types import SimpleNamespace

from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from coreai.server import responses, schemas as s
from coreai.server.config import ServerConfig
from coreai.server.constraints import Constraints, enforcement_headers
from coreai.server.engine import Engine, GenerationParams
from coreai.server.errors import APIError, bad_request, install as install_error_handlers
from coreai.server.guard import Guard
from coreai.server.prepare import Preparer
from coreai.server.queue import Job, QueueFull
from coreai.server.replies import ChatReply, CompletionReply
from coreai.server.streaming import collect, sse
from guided import default_cache, get_tokenizer_info
from guided.journal import GrammarJournal
from runtime import Model

__all__ = ["ServerConfig", "create_app"]

log = logging.getLogger("coreai.server")

ERROR_RESPONSES = {status: {"model": s.ErrorResponse} for status in (400, 401, 404, 413, 429, 500)}


def warm_grammars(journal: GrammarJournal) -> None:
    """Record the server's compiles in `journal`, and compile the grammars recorded by earlier runs
    on a background thread (a request for one of them meanwhile compiles it itself)."""
    default_cache.persist(journal)

    def warm():
        t0 = time.perf_counter()
        n = default_cache.warm(journal)
        log.info("grammar journal: %d grammars compiled again in %.1f s (%s)", n, time.perf_counter() - t0, journal.dir)

    threading.Thread(target=warm, name="grammar-journal", daemon=True).start()


def create_app(model: Model, config: ServerConfig | None = None) -> FastAPI:
    """The server's ASGI app for `model`. Starts the generation worker; builds the grammar engine's
    view of the tokenizer (a few seconds, once per tokenizer per process)."""
    config = config or ServerConfig()
    name = config.model_name or model.name
    engine = Engine(model, config.max_queue, config.max_batch, config.prompt_cache_bytes)
    try:
        info = get_tokenizer_info(model.tokenizer, model.vocab_size, model.tokenizer.eos_ids)
    except ValueError as exc:
        log.warning("guided generation disabled: %s", exc)
        info = None
    preparer = Preparer(model, config, Constraints(model, info))
    if info is not None and config.grammar_journal:
        warm_grammars(GrammarJournal(config.grammar_journal, info))
    import jsonschema  # noqa: F401 - the final output check's import (seconds) at start-up, not in a first request

    card = s.ModelCard(id=name, created=int(time.time()))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        engine.close()

    app = FastAPI(
        title="coreai-mlx",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI-compatible local server; response_format, structured_outputs and tools "
        "are enforced by guided generation.",
    )
    app.add_middleware(Guard, config=config)
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        """The model served, and its load: generations running (batch rows) and waiting for one."""
        running, waiting = engine.worker.load()
        return {"status": "ok", "model": name, "running": running, "waiting": waiting}

    def check_model(requested: str) -> None:
        if requested != name:
            raise APIError(
                404,
                f"the model {requested!r} does not exist; this server serves {name!r}",
                param="model",
                code="model_not_found",
            )

    @app.get("/v1/models", response_model=s.ModelList, responses=ERROR_RESPONSES)
    async def models():
        return s.ModelList(data=[card])

    # `:path`: a served name may hold slashes ("org/model"), which a client may send unescaped.
    @app.get("/v1/models/{model:path}", response_model=s.ModelCard, responses=ERROR_RESPONSES)
    async def retrieve_model(model: str):
        """The served model's card (the official client's `models.retrieve`); any other name is a 404."""
        check_model(model)
        return card

    def submit(params: GenerationParams, n: int) -> list[Job]:
        if n > config.max_batch + config.max_queue:  # would never fit: not a 429 to retry
            raise bad_request(
                f"n = {n} is more than this server runs and queues at once "
                f"(max_batch {config.max_batch} + max_queue {config.max_queue})",
                "n",
            )
        try:
            return engine.submit(params, n)
        except QueueFull as exc:
            raise APIError(
                429, str(exc), "rate_limit_error", None, "queue_full", headers={"Retry-After": str(exc.retry_after)}
            ) from None

    async def respond(req, request: Request, response: Response, prepare, reply_class):
        check_model(req.model)
        params, constraint = await run_in_threadpool(prepare, req)
        jobs = submit(params, req.n)
        reply = reply_class(req, constraint, model, name, params.reasoning)
        headers = enforcement_headers(constraint.session) if constraint else {}
        if req.stream:
            return StreamingResponse(sse(reply.stream(jobs)), media_type="text/event-stream", headers=headers)
        response.headers.update(headers)
        outcomes = await collect(jobs, request)
        if outcomes is None:
            return JSONResponse({}, status_code=499)  # the client is gone; nobody reads this
        return reply.complete(outcomes)

    @app.post("/v1/chat/completions", response_model=s.ChatCompletion, responses=ERROR_RESPONSES)
    async def chat_completions(req: s.ChatCompletionRequest, request: Request, response: Response):
        """OpenAI chat completions (stream: SSE of `chat.completion.chunk`s ending `data: [DONE]`)."""
        return await respond(req, request, response, preparer.chat, ChatReply)

    @app.post("/v1/completions", response_model=s.Completion, responses=ERROR_RESPONSES)
    async def completions(req: s.CompletionRequest, request: Request, response: Response):
        """OpenAI legacy text completions of a plain prompt (no chat template)."""
        return await respond(req, request, response, preparer.completion, CompletionReply)

    # What the Responses route (coreai.server.responses) reaches through request.app.state.
    app.state.server = SimpleNamespace(
        model=model, name=name, preparer=preparer, submit=submit, check_model=check_model
    )
    app.include_router(responses.router)
    return app

"""The routes, on FastAPI `APIRouter`s: `/health`, and under the API-key dependency `/v1/models`,
`/v1/models/{model}`, `/v1/chat/completions`, `/v1/completions`. Each route gets the server
instance (`ServerState`, from `request.app.state`) through a dependency; the helpers shared with
the Responses routes are in `coreai.server.api`."""

from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter, Depends, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from coreai.server import reply_schemas as o
from coreai.server import schemas as s
from coreai.server.api import ERROR_RESPONSES, Server, check_model, submit
from coreai.server.constraints import enforcement_headers
from coreai.server.guard import require_api_key
from coreai.server.replies import ChatReply, CompletionReply
from coreai.server.state import ServerState
from coreai.server.streaming import collect, sse

router = APIRouter()
v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], responses=ERROR_RESPONSES)


@router.get("/health")
async def health(server: Server):
    """The model served, its load (generations running as batch rows, and waiting for one) and its
    ranks (`distributed`: null for one process); 503 once a distributed model is lost."""
    running, waiting = server.worker.load()
    body = {"status": "ok", "model": server.name, "running": running, "waiting": waiting}
    body["distributed"] = server.distributed
    if server.lost is not None:
        return JSONResponse({**body, "status": "lost", "error": server.lost}, status_code=503)
    return body


@v1.get("/models", response_model=o.ModelList)
async def models(request: Request, server: Server):
    """The served model: in Anthropic's shape when the request carries `anthropic-version` (the
    `anthropic` SDK's `models.list`), else OpenAI's."""
    if "anthropic-version" in request.headers:
        card = anthropic_card(server)
        return JSONResponse({"data": [card], "has_more": False, "first_id": card["id"], "last_id": card["id"]})
    return o.ModelList(data=[server.card])


# `:path`: a served name may hold slashes ("org/model"), which a client may send unescaped.
@v1.get("/models/{model:path}", response_model=o.ModelCard)
async def retrieve_model(model: str, request: Request, server: Server):
    """The served model's card (the official clients' `models.retrieve`, Anthropic's shape with
    `anthropic-version`); any other name is a 404."""
    check_model(server, model)
    if "anthropic-version" in request.headers:
        return JSONResponse(anthropic_card(server))
    return server.card


def anthropic_card(server: ServerState) -> dict:
    """The served model as Anthropic's `ModelInfo`."""
    created = datetime.fromtimestamp(server.card.created, timezone.utc).isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": server.name, "display_name": server.name, "created_at": created}


async def respond(server: ServerState, req, request: Request, response: Response, prepare, reply_class):
    check_model(server, req.model)
    params, constraint = await run_in_threadpool(prepare, req)
    jobs = submit(server, params, req.n)
    reply = reply_class(req, constraint, server.model, server.name, params.reasoning)
    headers = enforcement_headers(constraint) if constraint else {}
    if req.stream:
        return StreamingResponse(sse(reply.stream(jobs)), media_type="text/event-stream", headers=headers)
    response.headers.update(headers)
    outcomes = await collect(jobs, request)
    if outcomes is None:
        return JSONResponse({}, status_code=499)  # the client is gone; nobody reads this
    return reply.complete(outcomes)


@v1.post("/chat/completions", response_model=o.ChatCompletion)
async def chat_completions(req: s.ChatCompletionRequest, request: Request, response: Response, server: Server):
    """OpenAI chat completions (stream: SSE of `chat.completion.chunk`s ending `data: [DONE]`)."""
    return await respond(server, req, request, response, server.preparer.chat, ChatReply)


@v1.post("/completions", response_model=o.Completion)
async def completions(req: s.CompletionRequest, request: Request, response: Response, server: Server):
    """OpenAI legacy text completions of a plain prompt (no chat template)."""
    return await respond(server, req, request, response, server.preparer.completion, CompletionReply)


router.include_router(v1)

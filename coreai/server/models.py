"""The shell's own routes: `/health` and `/api/hello` (Claude Code's probe; no key needed) and,
under the API-key dependency, `/v1/models` and `/v1/models/{model}`, in OpenAI's shape, or Anthropic's
when the request carries `anthropic-version` (the `anthropic` SDK's `models.list` / `retrieve`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from coreai.server.dispatch import ERROR_RESPONSES, Server, check_model
from coreai.server.guard import require_api_key
from coreai.server.state import ServerState


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "coreai"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


router = APIRouter()
v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], responses=ERROR_RESPONSES)


@router.get("/health")
async def health(server: Server):
    """The model served, its load (generations running as batch rows, and waiting for one), its
    memory in bytes (`memory`: the KV bound, the running rows' worst case, the prefix cache), its
    counters (`stats`: prefills, prompt tokens computed and read from the cache, prompt markers
    removed, resends held and attached: `Service.stats`) and its ranks (`distributed`: null for one
    process); 503 once a distributed model is lost."""
    running, waiting = server.worker.load()
    body = {"status": "ok", "model": server.name, "running": running, "waiting": waiting}
    if server.aliases:
        body["aliases"] = server.aliases
    body["memory"] = server.service.memory()
    body["stats"] = server.service.stats()
    body["distributed"] = server.distributed
    if server.lost is not None:
        return JSONResponse({**body, "status": "lost", "error": server.lost}, status_code=503)
    return body


@router.get("/api/hello")
async def hello():
    """Claude Code's reachability probe at start-up (`HEAD /api/hello`, no key): 200."""
    return {"status": "ok"}


@router.head("/api/hello", response_class=Response)
async def hello_head() -> Response:
    """The probe as the CLI sends it: 200, no body (documented so: no content type)."""
    return Response(status_code=200)


def listed(server: ServerState) -> list[str]:
    """The model ids `/v1/models` lists: the served name, then its literal aliases (a glob such as
    `claude-*` names no one id; `/health` lists it)."""
    return [server.name, *(a for a in server.aliases if not any(c in a for c in "*?["))]


@v1.get("/models", response_model=ModelList)
async def models(request: Request, server: Server):
    """The served model: in Anthropic's shape when the request carries `anthropic-version`, else OpenAI's."""
    ids = listed(server)
    if "anthropic-version" in request.headers:
        infos = [anthropic_card(server, name) for name in ids]
        return JSONResponse({"data": infos, "has_more": False, "first_id": ids[0], "last_id": ids[-1]})
    return ModelList(data=[ModelCard(id=name, created=server.created) for name in ids])


# `:path`: a served name may hold slashes ("org/model"), which a client may send unescaped.
@v1.get("/models/{model:path}", response_model=ModelCard)
async def retrieve_model(model: str, request: Request, server: Server):
    """The card of the served model or one of its aliases, under the name asked for (the official
    clients' `models.retrieve`, Anthropic's shape with `anthropic-version`); any other name is a 404."""
    check_model(server, model)
    if "anthropic-version" in request.headers:
        return JSONResponse(anthropic_card(server, model))
    return ModelCard(id=model, created=server.created)


def anthropic_card(server: ServerState, name: str) -> dict:
    """The served model, under `name`, as Anthropic's `ModelInfo`."""
    created = datetime.fromtimestamp(server.created, UTC).isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": name, "display_name": name, "created_at": created}


router.include_router(v1)

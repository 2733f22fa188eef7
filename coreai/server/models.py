"""The shell's own routes: `/health` (no key needed) and, under the API-key dependency, `/v1/models`
and `/v1/models/{model}`, in OpenAI's shape, or a dialect's when the request carries the header that
dialect's SDK sends (`Dialect.models`, `app.state.model_shapes`)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from coreai.server.dialect import ModelShape
from coreai.server.dispatch import ERROR_RESPONSES, Server, check_model
from coreai.server.guard import require_api_key
from coreai.server.state import ServerState
from runtime.blas import blas_in_use


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
    process), and the BLAS of MLX's CPU matmuls with its thread count (`blas`); `max_tokens`: the
    largest reply bound a request gets (`--max-tokens`; a client configured for this server, as
    `coreai launch` does, takes it); 503 once a distributed model is lost."""
    running, waiting = server.worker.load()
    body = {"status": "ok", "model": server.name, "running": running, "waiting": waiting}
    if server.aliases:
        body["aliases"] = server.aliases
    body["max_tokens"] = server.service.settings.max_tokens_limit
    body["memory"] = server.service.memory()
    body["stats"] = server.service.stats()
    body["distributed"] = server.distributed
    body["blas"] = blas_in_use()  # the BLAS MLX's CPU matmuls run on and its threads (runtime/blas.py)
    if server.lost is not None:
        return JSONResponse({**body, "status": "lost", "error": server.lost}, status_code=503)
    return body


def listed(server: ServerState) -> list[str]:
    """The model ids `/v1/models` lists: the served name, then its literal aliases (a glob such as
    `claude-*` names no one id; `/health` lists it)."""
    return [server.name, *(a for a in server.aliases if not any(c in a for c in "*?["))]


def shape_of(request: Request) -> ModelShape | None:
    """The dialect's model shape `request` asks for by its header, or None (OpenAI's)."""
    return next((s for s in request.app.state.model_shapes if s.header in request.headers), None)


@v1.get("/models", response_model=ModelList)
async def models(request: Request, server: Server):
    """The served model: in a dialect's shape when the request carries its header, else OpenAI's."""
    ids = listed(server)
    if (shape := shape_of(request)) is not None:
        return JSONResponse(shape.listing(ids, server.created))
    return ModelList(data=[ModelCard(id=name, created=server.created) for name in ids])


# `:path`: a served name may hold slashes ("org/model"), which a client may send unescaped.
@v1.get("/models/{model:path}", response_model=ModelCard)
async def retrieve_model(model: str, request: Request, server: Server):
    """The card of the served model or one of its aliases, under the name asked for (the official
    clients' `models.retrieve`, in a dialect's shape when the request carries its header); any other
    name is a 404."""
    check_model(server, model)
    if (shape := shape_of(request)) is not None:
        return JSONResponse(shape.card(model, server.created))
    return ModelCard(id=model, created=server.created)


router.include_router(v1)

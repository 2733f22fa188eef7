"""`POST /v1/responses`, OpenAI's Responses API, on the one dispatch skeleton, and the stored
responses' routes.

A Responses request, validated once as such, is mapped to the service's `GenerationRequest`
(`request.generation_request`: instructions and input items to messages, `text.format` to the
answer's format, flat function tools, ...; its errors name the Responses fields), prepared,
constrained and queued as every dialect's are (`coreai.server.dispatch`), and rendered by
`reply.ResponsesReply`, whole or as the event stream. Stored responses (`store` not false) live in
the app's `ResponseStore` (`app.state.responses`, made by `install`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from coreai.server.dispatch import ERROR_RESPONSES, endpoint
from coreai.server.errors import APIError
from coreai.server.guard import require_api_key
from coreai.server.responses import schemas as r
from coreai.server.responses.compaction import kept_user_messages
from coreai.server.responses.reply import CompactReply, ResponsesReply
from coreai.server.responses.request import HINTS, generation_request, ignored
from coreai.server.responses.store import ResponseStore
from coreai.server.state import ServerState
from coreai.service import GenerationJob, GenerationRequest

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


def install(app: FastAPI) -> None:
    """Mount the Responses routes and their store on `app` (the WebSocket: `websocket.install`)."""
    app.state.responses = ResponseStore()
    app.include_router(router)


def response_store(request: Request) -> ResponseStore:
    """Dependency: the app's store of responses."""
    return request.app.state.responses


Store = Annotated[ResponseStore, Depends(response_store)]


@dataclass
class ResponsesCall:
    """A Responses request on the dispatch skeleton; `conversation` is filled by `generation` (the
    turns to store with the response)."""

    body: r.ResponseCreateRequest
    server: ServerState
    store: ResponseStore
    conversation: list[dict] = field(default_factory=list)
    # A WebSocket connection's own store: its responses, `store: false` ones too, for the
    # `previous_response_id` of the connection's next request (`websocket.py`).
    cache: ResponseStore | None = None
    hints = HINTS

    @property
    def model(self) -> str:
        return self.body.model

    @property
    def stream(self) -> bool:
        return bool(self.body.stream)

    def generation(self) -> GenerationRequest:
        history = []
        if self.body.previous_response_id is not None:
            previous = self.cache.get(self.body.previous_response_id) if self.cache is not None else None
            previous = previous or self.store.get(self.body.previous_response_id)
            if previous is None:
                raise not_found(self.body.previous_response_id, "previous_response_id")
            history = previous.messages
        generation, self.conversation = generation_request(self.body, history)
        return generation

    def ignored(self) -> list[str]:
        return ignored(self.body)

    def reply(self, job: GenerationJob) -> ResponsesReply:
        stores = ([self.store] if self.body.store is not False else []) + ([self.cache] if self.cache else [])
        return ResponsesReply(self.body, self.server.model.tokenizer, job, stores, self.conversation)


def response_call(req: r.ResponseCreateRequest, request: Request, server: ServerState) -> ResponsesCall:
    return ResponsesCall(req, server, response_store(request))


router.add_api_route(
    "/responses",
    endpoint(
        r.ResponseCreateRequest,
        response_call,
        "create_response",
        "OpenAI Responses (stream: SSE of Responses events, `response.created` ... `response.completed`).",
    ),
    methods=["POST"],
    response_model=r.Response,
    responses=ERROR_RESPONSES,
)


@dataclass
class CompactCall(ResponsesCall):
    """`POST /v1/responses/compact`: the request with a `compaction_trigger` appended, whole."""

    users: list[dict] = field(default_factory=list)

    @property
    def stream(self) -> bool:
        return False

    def reply(self, job: GenerationJob) -> ResponsesReply:
        return CompactReply(self.body, self.server.model.tokenizer, job, self.users)


def compact_call(req: r.ResponseCreateRequest, request: Request, server: ServerState) -> CompactCall:
    """The request with a `compaction_trigger` appended, never streamed."""
    items = [r.MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else list(req.input)
    trigger = r.CompactionTriggerItem(type="compaction_trigger")
    body = req.model_copy(update={"input": [*items, trigger], "stream": False})
    return CompactCall(body, server, response_store(request), users=kept_user_messages(req))


router.add_api_route(
    "/responses/compact",
    endpoint(
        r.ResponseCreateRequest,
        compact_call,
        "compact_response",
        "OpenAI's compaction, done locally (`compaction.py`): `input` (and `previous_response_id`'s "
        "conversation) summarized by the model into one `compaction` item, after the input's user messages.",
    ),
    methods=["POST"],
    responses=ERROR_RESPONSES,
)


def not_found(response_id: str, param: str) -> APIError:
    return APIError(
        404, f"Response with id {response_id!r} not found.", "invalid_request_error", param, "response_not_found"
    )


@router.get("/responses/{response_id}", response_model=r.Response, responses=ERROR_RESPONSES)
async def get_response(response_id: str, store: Store):
    """A stored response (`store` was not false), as it was sent; a 404 when unknown or evicted."""
    entry = store.get(response_id)
    if entry is None:
        raise not_found(response_id, "response_id")
    return JSONResponse(entry.response)


@router.get("/responses/{response_id}/input_items", responses=ERROR_RESPONSES)
async def list_input_items(
    response_id: str,
    store: Store,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
):
    """The input items of a stored response (its `input`, ids given when it was stored), as OpenAI
    pages them: newest first by default, at most `limit`, after the item `after`; a 404 when the
    response is unknown or evicted."""
    entry = store.get(response_id)
    if entry is None:
        raise not_found(response_id, "response_id")
    items = entry.input_items if order == "asc" else entry.input_items[::-1]
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
    return {"object": "list", "data": page, "first_id": first, "last_id": last, "has_more": len(items) > limit}


@router.delete("/responses/{response_id}", responses=ERROR_RESPONSES)
async def delete_response(response_id: str, store: Store):
    """Forget a stored response; a 404 when unknown or evicted."""
    if not store.delete(response_id):
        raise not_found(response_id, "response_id")
    return {"id": response_id, "object": "response", "deleted": True}

"""The Anthropic Messages dialect's routes, under the API-key dependency: `POST /v1/messages` (one
`dispatch` of a `MessagesCall`: `request.generation_request` maps the body, `reply.MessageReply`
renders the job's events) and `POST /v1/messages/count_tokens` (the same mapping and prepare step,
nothing queued); with no key, `/api/hello` (Claude Code's probe). Errors under these routes are
Anthropic's error objects (`errors`), and `/v1/models` answers in Anthropic's shape to a request
carrying `anthropic-version` (`MODELS`): both given to the shell as the package's `Dialect`.
See docs/reference/messages.md."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from coreai.server.anthropic import schemas as m
from coreai.server.anthropic.reply import MessageReply
from coreai.server.anthropic.request import HINTS, generation_request, ignored
from coreai.server.dialect import ModelShape
from coreai.server.dispatch import Server, endpoint, ignored_names, prepare
from coreai.server.guard import require_api_key
from coreai.server.policy import ignored_headers
from coreai.server.state import ServerState
from coreai.service import GenerationJob, GenerationRequest, ReplyEvents

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
probe = APIRouter()  # no key


def install(app: FastAPI) -> None:
    """Mount the Messages routes and the probe on `app` (their error shape, `errors.error_response`,
    is registered with the app's error handlers for `errors.PATH`)."""
    app.include_router(router)
    app.include_router(probe)


@probe.get("/api/hello")
async def hello():
    """Claude Code's reachability probe at start-up (`HEAD /api/hello`, no key): 200."""
    return {"status": "ok"}


@probe.head("/api/hello", response_class=Response)
async def hello_head() -> Response:
    """The probe as the CLI sends it: 200, no body (documented so: no content type)."""
    return Response(status_code=200)


def model_card(name: str, created: int) -> dict:
    """The served model, under `name`, as Anthropic's `ModelInfo` (`created`: Unix seconds)."""
    stamp = datetime.fromtimestamp(created, UTC).isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": name, "display_name": name, "created_at": stamp}


def model_list(ids: list[str], created: int) -> dict:
    """The served names as Anthropic's model list page (one page)."""
    return {"data": [model_card(i, created) for i in ids], "has_more": False, "first_id": ids[0], "last_id": ids[-1]}


# The `anthropic` SDK's `models.list` / `retrieve` send `anthropic-version`.
MODELS = ModelShape("anthropic-version", model_list, model_card)


@dataclass
class MessagesCall:
    """A Messages (or count_tokens) request on the dispatch skeleton."""

    body: m.CountTokensRequest
    server: ServerState
    betas: str | None = None  # the `anthropic-beta` header
    hints = HINTS

    @property
    def model(self) -> str:
        return self.body.model

    @property
    def stream(self) -> bool:
        return bool(getattr(self.body, "stream", False))

    def generation(self) -> GenerationRequest:
        return generation_request(self.body)

    def ignored(self) -> list[str]:
        return ignored(self.body, self.betas)

    def reply(self, job: GenerationJob) -> MessageReply:
        return MessageReply(self.body.model, ReplyEvents(job.constraint, job.reasoning), len(job.prompt_ids))


def message_call(req: m.MessagesRequest, request: Request, server: ServerState) -> MessagesCall:
    return MessagesCall(req, server, request.headers.get("anthropic-beta"))


router.add_api_route(
    "/messages",
    endpoint(
        m.MessagesRequest,
        message_call,
        "create_message",
        "Anthropic Messages (stream: SSE of `message_start` ... `message_stop`).",
    ),
    methods=["POST"],
)


@router.post("/messages/count_tokens")
async def count_tokens(req: m.CountTokensRequest, request: Request, server: Server):
    """The prompt tokens a create request with this body would prefill: the rendered prompt, with
    the tool prompt and the schema's description, as `create_message` renders it."""
    call = MessagesCall(req, server, request.headers.get("anthropic-beta"))
    _, job = await prepare(server, call)
    return JSONResponse({"input_tokens": len(job.prompt_ids)}, headers=ignored_headers(ignored_names(call, job)))

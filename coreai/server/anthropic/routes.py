"""The Anthropic Messages dialect's routes, under the API-key dependency: `POST /v1/messages` (one
`dispatch` of a `MessagesCall`: `request.generation_request` maps the body, `reply.MessageReply`
renders the job's events) and `POST /v1/messages/count_tokens` (the same mapping and prepare step,
nothing queued). Errors under these routes are Anthropic's error objects (`errors`, registered with
the app by `install`). See docs/reference/messages.md."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from coreai.server.anthropic import schemas as m
from coreai.server.anthropic.reply import MessageReply
from coreai.server.anthropic.request import generation_request, ignored
from coreai.server.dispatch import Server, dispatch, ignored_names, prepare
from coreai.server.guard import require_api_key
from coreai.server.policy import ignored_headers
from coreai.server.state import ServerState
from coreai.service import GenerationJob, GenerationRequest, ReplyEvents

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


def install(app: FastAPI) -> None:
    """Mount the Messages routes on `app` (their error shape, `errors.error_response`, is registered
    with the app's error handlers for `errors.PATH`)."""
    app.include_router(router)


@dataclass
class MessagesCall:
    """A Messages (or count_tokens) request on the dispatch skeleton."""

    body: m.CountTokensRequest
    server: ServerState
    betas: str | None = None  # the `anthropic-beta` header

    @property
    def model(self) -> str:
        return self.body.model

    @property
    def stream(self) -> bool:
        return bool(getattr(self.body, "stream", False))

    def generation(self) -> GenerationRequest:
        # A create request's `max_tokens` is cut to the server's bound (Anthropic's clients send a ceiling).
        return generation_request(self.body, self.server.config.max_tokens)

    def ignored(self) -> list[str]:
        return ignored(self.body, self.betas)

    def reply(self, job: GenerationJob) -> MessageReply:
        return MessageReply(self.body.model, ReplyEvents(job.constraint, job.reasoning), len(job.prompt_ids))


@router.post("/messages")
async def create_message(req: m.MessagesRequest, request: Request, server: Server):
    """Anthropic Messages (stream: SSE of `message_start` ... `message_stop`)."""
    return await dispatch(server, request, MessagesCall(req, server, request.headers.get("anthropic-beta")))


@router.post("/messages/count_tokens")
async def count_tokens(req: m.CountTokensRequest, request: Request, server: Server):
    """The prompt tokens a create request with this body would prefill: the rendered prompt, with
    the tool prompt and the schema's description, as `create_message` renders it."""
    call = MessagesCall(req, server, request.headers.get("anthropic-beta"))
    _, job = await prepare(server, call)
    return JSONResponse({"input_tokens": len(job.prompt_ids)}, headers=ignored_headers(ignored_names(call, job)))

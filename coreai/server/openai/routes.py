"""The OpenAI dialect's routes, under the API-key dependency: `/v1/chat/completions` and
`/v1/completions`, each one `dispatch` of a `Call` (the body's mapping and its renderer)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request

from coreai.server.dispatch import ERROR_RESPONSES, Server, dispatch
from coreai.server.guard import require_api_key
from coreai.server.openai import reply_schemas as o
from coreai.server.openai import schemas as s
from coreai.server.openai.replies import ChatReply, CompletionReply
from coreai.server.openai.request import chat_request, completion_request, ignored
from coreai.server.state import ServerState
from coreai.service import GenerationJob, GenerationRequest

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], responses=ERROR_RESPONSES)


@dataclass
class OpenAICall:
    """A chat or legacy completions request on the dispatch skeleton: `mapping` turns its body into
    the service's request, `renderer` renders its job."""

    body: s.ChatCompletionRequest | s.CompletionRequest
    server: ServerState
    mapping: Callable[[Any], GenerationRequest]
    renderer: type[ChatReply] | type[CompletionReply]

    @property
    def model(self) -> str:
        return self.body.model

    @property
    def stream(self) -> bool:
        return self.body.stream

    def generation(self) -> GenerationRequest:
        return self.mapping(self.body)

    def ignored(self) -> list[str]:
        return ignored(self.body)

    def reply(self, job: GenerationJob) -> ChatReply | CompletionReply:
        return self.renderer(self.body, job.constraint, self.server.model, self.body.model, job.reasoning)  # type: ignore[arg-type]


@router.post("/chat/completions", response_model=o.ChatCompletion)
async def chat_completions(req: s.ChatCompletionRequest, request: Request, server: Server):
    """OpenAI chat completions (stream: SSE of `chat.completion.chunk`s ending `data: [DONE]`)."""
    return await dispatch(server, request, OpenAICall(req, server, chat_request, ChatReply))


@router.post("/completions", response_model=o.Completion)
async def completions(req: s.CompletionRequest, request: Request, server: Server):
    """OpenAI legacy text completions of a plain prompt (no chat template)."""
    return await dispatch(server, request, OpenAICall(req, server, completion_request, CompletionReply))

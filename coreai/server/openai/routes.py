"""The OpenAI dialect's routes, under the API-key dependency: `/v1/chat/completions` and
`/v1/completions`, each the skeleton's `endpoint` on a `Call` (the body's mapping and its renderer)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request

from coreai.server.dispatch import ERROR_RESPONSES, endpoint
from coreai.server.guard import require_api_key
from coreai.server.openai import reply_schemas as o
from coreai.server.openai import schemas as s
from coreai.server.openai.reply import ChatReply, CompletionReply
from coreai.server.openai.request import HINTS, chat_request, completion_request
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
    hints = HINTS

    @property
    def model(self) -> str:
        return self.body.model

    @property
    def stream(self) -> bool:
        return self.body.stream

    def generation(self) -> GenerationRequest:
        return self.mapping(self.body)

    def ignored(self) -> list[str]:
        return []  # its hints only

    def reply(self, job: GenerationJob) -> ChatReply | CompletionReply:
        return self.renderer(self.body, job.constraint, self.server.model, self.body.model, job.reasoning)  # type: ignore[arg-type]


def chat_call(req: s.ChatCompletionRequest, request: Request, server: ServerState) -> OpenAICall:
    return OpenAICall(req, server, chat_request, ChatReply)


def completion_call(req: s.CompletionRequest, request: Request, server: ServerState) -> OpenAICall:
    return OpenAICall(req, server, completion_request, CompletionReply)


router.add_api_route(
    "/chat/completions",
    endpoint(
        s.ChatCompletionRequest,
        chat_call,
        "chat_completions",
        "OpenAI chat completions (stream: SSE of `chat.completion.chunk`s ending `data: [DONE]`).",
    ),
    methods=["POST"],
    response_model=o.ChatCompletion,
)
router.add_api_route(
    "/completions",
    endpoint(
        s.CompletionRequest,
        completion_call,
        "completions",
        "OpenAI legacy text completions of a plain prompt (no chat template).",
    ),
    methods=["POST"],
    response_model=o.Completion,
)

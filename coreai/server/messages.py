"""The Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, a third
front end on the one request and one outcome: `messages_request.generation_request` maps the body
into a `guided.request.GenerationRequest`, the preparer and the worker run it as they run chat and
Responses, and `messages_reply.MessageReply` renders its outcome and events. Errors under these
routes are Anthropic's error objects (`coreai.server.errors.APIError.anthropic_response`).
See docs/reference/messages.md."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from coreai.server import messages_schemas as m
from coreai.server.api import Server, check_model, submit
from coreai.server.constraints import enforcement_headers
from coreai.server.events import ReplyEvents, outcome_of
from coreai.server.messages_reply import MessageReply, sse
from coreai.server.messages_request import generation_request
from coreai.server.streaming import collect

router = APIRouter()


@router.post("/messages")
async def create_message(req: m.MessagesRequest, request: Request, server: Server):
    """Anthropic Messages (stream: SSE of `message_start` ... `message_stop`)."""
    check_model(server, req.model)
    generation = generation_request(req, server.config.max_tokens)
    params, constraint = await run_in_threadpool(server.preparer.prepare, generation)
    [job] = submit(server, params, 1)
    events = ReplyEvents(constraint, params.reasoning)
    headers = enforcement_headers(constraint) if constraint else {}
    reply = MessageReply(server.name)
    if req.stream:
        stream = reply.stream(events, job, len(params.prompt_ids))
        return StreamingResponse(sse(stream), media_type="text/event-stream", headers=headers)
    outcomes = await collect([job], request)
    if outcomes is None:
        return JSONResponse({}, status_code=499)  # the client is gone; nobody reads this
    [(pieces, result)] = outcomes
    return JSONResponse(reply.render(outcome_of(pieces, result, events)), headers=headers)


@router.post("/messages/count_tokens")
async def count_tokens(req: m.CountTokensRequest, server: Server):
    """The prompt tokens a create request with this body would prefill: the rendered prompt, with
    the tool prompt and the schema's description, as `create_message` renders it."""
    check_model(server, req.model)
    params, _ = await run_in_threadpool(server.preparer.prepare, generation_request(req))
    return {"input_tokens": len(params.prompt_ids)}

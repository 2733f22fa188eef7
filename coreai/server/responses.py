"""`POST /v1/responses`, OpenAI's Responses API, on the chat completions' guided path.

A Responses request is mapped to the internal chat request (`chat_request`: instructions and input
items to messages, `text.format` to `response_format`, flat function tools to chat tools, ...) and
prepared, constrained, queued and decoded by the same code as `/v1/chat/completions` (`Preparer.chat`,
`ChatReply`); only the shapes differ. The reply's message becomes output items (`response_from`):
`reasoning`, `message` with `output_text`, `function_call`s. A generation cut by `max_output_tokens`
is `incomplete`; a constrained output that failed (finish_reason "error" on the chat path) is
`failed` with `error` and no output, never `completed` with invalid text. `stream: true` is the
Responses event stream (`coreai.server.responses_stream`).

The route reaches the server through `request.app.state.server`: `model`, `name`, `preparer`,
`submit(params, n)` and `check_model(name)`.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from coreai.server import reply_schemas as o
from coreai.server import responses_schemas as r
from coreai.server import routes
from coreai.server import schemas as s
from coreai.server.constraints import enforcement_headers
from coreai.server.errors import APIError, validation_error
from coreai.server.replies import ChatReply, usage_info
from coreai.server.response_store import output_messages
from coreai.server.responses_schemas import new_id
from coreai.server.responses_stream import events, sse_events
from coreai.server.state import ServerState
from coreai.server.streaming import collect
from runtime import GenerationResult

router = APIRouter()


# The chat path's parameter names -> the Responses request's, for its 400s (longest prefix first).
PARAMS = [
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("reasoning_effort", "reasoning.effort"),
    ("messages", "input"),
]


def responses_param(param: str | None) -> str | None:
    """A chat-path parameter name as the Responses request spells it ("tools[0].function.parameters"
    -> "tools[0].parameters", "messages[2].content" -> "input")."""
    if param is None:
        return None
    param = param.replace(".function.", ".")
    for old, new in PARAMS:
        if param == old or param.startswith(old + ".") or param.startswith(old + "["):
            return new if old == "messages" else new + param[len(old) :]
    return param


def remapped(exc: APIError) -> APIError:
    """`exc` naming the Responses request's field instead of the chat path's."""
    param = responses_param(exc.param)
    message = exc.message
    if exc.param and param != exc.param:
        message = message.replace(exc.param, param)
    return APIError(exc.status, message, exc.type, param, exc.code, exc.headers)


def _text(content) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def chat_messages(req: r.ResponseCreateRequest, history: list[dict] = ()) -> list[dict]:
    """The chat messages of `instructions`, the stored conversation `history` (the turns before
    `previous_response_id`, its output included) and `input`."""
    instructions = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages = instructions + list(history) + input_messages(req)
    if not messages:
        raise APIError(400, "input: no message to answer (only reasoning items)", param="input", code="invalid_value")
    return messages


def input_messages(req: r.ResponseCreateRequest) -> list[dict]:
    """The chat messages of `input`: a function_call joins the assistant message before it (or
    starts one), a function_call_output is a `tool` message, reasoning items are dropped (the
    templates drop earlier turns' reasoning too)."""
    messages: list[dict] = []
    items = [r.MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for item in items:
        if isinstance(item, r.MessageItem):
            messages.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, r.FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, r.FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
    return messages


def chat_request(req: r.ResponseCreateRequest, history: list[dict] = ()) -> s.ChatCompletionRequest:
    """The internal chat request of a Responses request (400 naming the Responses field)."""
    body: dict = {
        "model": req.model,
        "messages": chat_messages(req, history),
        "parallel_tool_calls": req.parallel_tool_calls,
        "stream": req.stream,
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "seed": req.seed,
        "user": req.user,
    }
    fmt = req.text.format if req.text else None
    if isinstance(fmt, r.TextFormatJsonSchema):
        spec = fmt.model_dump(by_alias=True, exclude_none=True, exclude={"type"})
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif fmt is not None:
        body["response_format"] = {"type": fmt.type}
    if req.structured_outputs is not None:
        body["structured_outputs"] = req.structured_outputs.model_dump(by_alias=True, exclude_none=True)
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})} for t in req.tools
        ]
    if isinstance(req.tool_choice, r.FunctionChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    else:
        body["tool_choice"] = req.tool_choice
    if req.top_logprobs is not None or req.include:
        body["logprobs"], body["top_logprobs"] = True, req.top_logprobs or 0
    if req.reasoning is not None:
        body["reasoning_effort"] = req.reasoning.effort
    try:
        return s.ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise remapped(validation_error(RequestValidationError(exc.errors(), body=body))) from None


class ResponseBuilder:
    """The `Response` of one request, whole or as the stream's snapshots."""

    def __init__(self, req: r.ResponseCreateRequest, model_name: str, tokenizer):
        self.req, self.model_name, self.tokenizer = req, model_name, tokenizer
        self.id = new_id("resp_")
        self.created_at = int(time.time())

    def response(self, status: str = "in_progress", output: list | None = None, **fields) -> r.Response:
        req = self.req
        text = req.text.model_dump(by_alias=True, exclude_none=True) if req.text else {"format": {"type": "text"}}
        choice = req.tool_choice or "auto"
        return r.Response(
            id=self.id,
            created_at=self.created_at,
            model=self.model_name,
            status=status,
            output=output or [],
            instructions=req.instructions,
            metadata=req.metadata,
            max_output_tokens=req.max_output_tokens,
            parallel_tool_calls=req.parallel_tool_calls,
            temperature=req.temperature,
            top_p=req.top_p,
            top_logprobs=req.top_logprobs,
            tool_choice=choice if isinstance(choice, str) else choice.model_dump(),
            tools=[t.model_dump(exclude_none=True) for t in req.tools or []],
            text=text,
            reasoning=req.reasoning.model_dump() if req.reasoning else None,
            user=req.user,
            store=req.store is not False,
            previous_response_id=req.previous_response_id,
            **fields,
        )

    def finished(self, output: list, finish: str, result: GenerationResult, reasoning: str | None) -> r.Response:
        """The final response: `output` the items built, `finish` the chat path's finish_reason
        ("stop", "length", "tool_calls" or "error")."""
        usage = usage_info([result])
        reasoning_tokens = 0
        if reasoning:  # a constrained generation counts its block's tokens; free text is re-encoded
            stats = getattr(result, "stats", None)
            counted = stats.reasoning_tokens if stats is not None else len(self.tokenizer.encode(reasoning))
            reasoning_tokens = min(counted, usage.completion_tokens)
        usage = r.ResponseUsage(
            input_tokens=usage.prompt_tokens,
            input_tokens_details=r.InputTokensDetails(cached_tokens=usage.prompt_tokens_details.cached_tokens),
            output_tokens=usage.completion_tokens,
            output_tokens_details=r.OutputTokensDetails(reasoning_tokens=reasoning_tokens),
            total_tokens=usage.total_tokens,
        )
        if finish == "error":  # the output broke its constraint, or the engine failed: not presented
            error = r.ResponseError(code="server_error", message=result.error or "the generation failed")
            return self.response("failed", [], error=error, usage=usage)
        text = "".join(p.text for item in output if isinstance(item, r.OutputMessage) for p in item.content)
        if finish == "length":
            incomplete = r.IncompleteDetails(reason="max_output_tokens")
            return self.response("incomplete", output, output_text=text, incomplete_details=incomplete, usage=usage)
        return self.response("completed", output, output_text=text, usage=usage)


def logprobs_of(choice_logprobs: o.ChoiceLogprobs | None) -> list[r.TokenLogprob] | None:
    if choice_logprobs is None:
        return None
    return [r.TokenLogprob(**e.model_dump()) for e in choice_logprobs.content or []]


def output_items(choice: o.ChatChoice, status: str) -> list[r.OutputItem]:
    """A chat choice's message as Responses output items: reasoning, message, function calls."""
    message, items = choice.message, []
    if message.reasoning_content:
        content = [r.ReasoningContent(text=message.reasoning_content)]
        items.append(r.OutputReasoning(id=new_id("rs_"), content=content, status=status))
    if message.content:
        part = r.OutputTextPart(text=message.content, logprobs=logprobs_of(choice.logprobs))
        items.append(r.OutputMessage(id=new_id("msg_"), status=status, content=[part]))
    for call in message.tool_calls or []:
        items.append(
            r.OutputFunctionCall(
                id=new_id("fc_"),
                call_id=call.id,
                name=call.function.name,
                arguments=call.function.arguments,
                status="completed",
            )
        )
    return items


@router.post("/responses", response_model=r.Response, responses=routes.ERROR_RESPONSES)
async def create_response(
    req: r.ResponseCreateRequest, request: Request, server: ServerState = Depends(routes.server_state)
):
    """OpenAI Responses (stream: SSE of Responses events, `response.created` ... `response.completed`)."""
    routes.check_model(server, req.model)
    history = []
    if req.previous_response_id is not None:
        previous = server.responses.get(req.previous_response_id)
        if previous is None:
            raise not_found(req.previous_response_id, "previous_response_id")
        history = previous.messages
    chat = chat_request(req, history)
    try:
        params, constraint = await run_in_threadpool(server.preparer.chat, chat)
    except APIError as exc:
        raise remapped(exc) from None
    jobs = routes.submit(server, params, 1)
    reply = ChatReply(chat, constraint, server.model, server.name, params.reasoning)
    headers = enforcement_headers(constraint.session) if constraint else {}
    builder = ResponseBuilder(req, server.name, server.model.tokenizer)
    keep = None
    if req.store is not False:
        conversation = list(history) + input_messages(req)
        keep = lambda final: server.responses.put(final, conversation + output_messages(final["output"]))  # noqa: E731
    if req.stream:
        stream = events(builder, reply, jobs[0])
        return StreamingResponse(sse_events(stored(stream, keep)), media_type="text/event-stream", headers=headers)
    outcomes = await collect(jobs, request)
    if outcomes is None:
        return JSONResponse({}, status_code=499)  # the client is gone; nobody reads this
    pieces, result = outcomes[0]
    choice = reply.choice(0, pieces, result)
    status = "incomplete" if choice.finish_reason == "length" else "completed"
    body = builder.finished(
        output_items(choice, status), choice.finish_reason, result, choice.message.reasoning_content
    ).model_dump()
    if keep is not None:
        keep(body)
    return JSONResponse(body, headers=headers)


async def stored(stream, keep):
    """`stream`'s events; the response its last event carries is kept with `keep` (None: not stored)."""
    async for event in stream:
        if keep is not None and event["type"] in ("response.completed", "response.incomplete", "response.failed"):
            keep(event["response"])
        yield event


def not_found(response_id: str, param: str) -> APIError:
    return APIError(
        404, f"Response with id {response_id!r} not found.", "invalid_request_error", param, "response_not_found"
    )


@router.get("/responses/{response_id}", response_model=r.Response, responses=routes.ERROR_RESPONSES)
async def get_response(response_id: str, server: ServerState = Depends(routes.server_state)):
    """A stored response (`store` was not false), as it was sent; a 404 when unknown or evicted."""
    entry = server.responses.get(response_id)
    if entry is None:
        raise not_found(response_id, "response_id")
    return JSONResponse(entry.response)


@router.delete("/responses/{response_id}", responses=routes.ERROR_RESPONSES)
async def delete_response(response_id: str, server: ServerState = Depends(routes.server_state)):
    """Forget a stored response; a 404 when unknown or evicted."""
    if not server.responses.delete(response_id):
        raise not_found(response_id, "response_id")
    return {"id": response_id, "object": "response", "deleted": True}

"""`POST /v1/responses`, OpenAI's Responses API, on the one dispatch skeleton.

A Responses request, validated once as such, is mapped to the service's `GenerationRequest`
(`request.generation_request`: instructions and input items to messages, `text.format` to the
answer's format, flat function tools, ...; its errors name the Responses fields), prepared,
constrained and queued as every dialect's are (`coreai.server.dispatch`). The generation's
`Finish` (`coreai.service.events`) becomes output items
(`ResponseBuilder.render`): `reasoning`, `message` with `output_text`, `function_call`s and
`custom_tool_call`s (a custom tool's raw input). A
generation cut by `max_output_tokens` is `incomplete`; a constrained output that failed
(finish_reason "error") is `failed` with `error` and no output, never `completed` with invalid
text. `stream: true` is the Responses event stream (`coreai.server.responses.stream`), rendered
from the same events, ending with the same outcome. Stored responses (`store` not false) live in
the app's `ResponseStore` (`app.state.responses`, made by `install`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from coreai.server.dispatch import ERROR_RESPONSES, Collected, endpoint
from coreai.server.errors import APIError
from coreai.server.guard import require_api_key
from coreai.server.openai.family import chat_logprobs, usage_info
from coreai.server.responses import schemas as r
from coreai.server.responses.capsule import seal
from coreai.server.responses.compaction import compaction_item, is_trigger, kept_user_messages
from coreai.server.responses.namespaces import flatten
from coreai.server.responses.request import HINTS, generation_request, ignored
from coreai.server.responses.schemas import new_id
from coreai.server.responses.store import ResponseStore, output_messages
from coreai.server.responses.stream import events, keepalive, sse_events
from coreai.server.state import ServerState
from coreai.service import Finish, GenerationJob, GenerationRequest, Job, ReplyEvents, finish_of
from runtime import GenerationResult

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


def install(app: FastAPI) -> None:
    """Mount the Responses routes and their store on `app` (the WebSocket: `websocket.install`)."""
    app.state.responses = ResponseStore()
    app.include_router(router)


def response_store(request: Request) -> ResponseStore:
    """Dependency: the app's store of responses."""
    return request.app.state.responses


Store = Annotated[ResponseStore, Depends(response_store)]
ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class ResponseBuilder:
    """The `Response` of one request, whole or as the stream's snapshots. logprobs: whether the
    request asked for them (`top_logprobs` or `include`)."""

    def __init__(self, req: r.ResponseCreateRequest, model_name: str, tokenizer, logprobs: bool = False):
        self.req, self.model_name, self.tokenizer, self.logprobs = req, model_name, tokenizer, logprobs
        self.id = new_id("resp_")
        self.created_at = int(time.time())
        self.namespaces = flatten(req.tools)
        self.compaction = is_trigger(req)  # answered with one compaction item (`compaction.py`)
        self.capsules = "reasoning.encrypted_content" in (req.include or [])

    def reasoning_capsule(self, text: str) -> str | None:
        """The reasoning item's `encrypted_content` when the request includes it (`capsule.seal`)."""
        return seal("reasoning", {"text": text}) if self.capsules else None

    def function_call(self, item_id: str, call_id: str, flat: str, arguments: str, status) -> r.OutputFunctionCall:
        """A function call item, named as the client named the tool (`namespaces.Namespaces.split`)."""
        name, namespace = self.namespaces.split(flat)
        return r.OutputFunctionCall(
            id=item_id, call_id=call_id, name=name, namespace=namespace, arguments=arguments, status=status
        )

    def response(self, status: ResponseStatus = "in_progress", output: list | None = None, **fields) -> r.Response:
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

    def finished(self, output: list, finish: str, result: GenerationResult, reasoning_tokens: int) -> r.Response:
        """The final response: `output` the items built (`items`), `finish` the outcome's
        finish_reason ("stop", "length", "tool_calls" or "error"): "error" is `failed` with no
        output, "length" `incomplete`, the others `completed`. reasoning_tokens: the outcome's."""
        counts = usage_info([result])
        usage = r.ResponseUsage(
            input_tokens=counts.prompt_tokens,
            input_tokens_details=r.InputTokensDetails(cached_tokens=counts.prompt_tokens_details.cached_tokens),
            output_tokens=counts.completion_tokens,
            output_tokens_details=r.OutputTokensDetails(reasoning_tokens=reasoning_tokens),
            total_tokens=counts.total_tokens,
        )
        if finish == "error":  # the output broke its constraint, or the engine failed: not presented
            error = r.ResponseError(code="server_error", message=result.error or "the generation failed")
            return self.response("failed", [], error=error, usage=usage)
        text = "".join(p.text for item in output if isinstance(item, r.OutputMessage) for p in item.content)
        if finish == "length":
            incomplete = r.IncompleteDetails(reason="max_output_tokens")
            return self.response("incomplete", output, output_text=text, incomplete_details=incomplete, usage=usage)
        return self.response("completed", output, output_text=text, usage=usage)

    def items(self, outcome: Finish, ids: dict | None = None) -> list[r.OutputItem]:
        """The output items of `outcome`: reasoning, message and the complete calls; a call cut by the
        budget is never output (a client replaying it would send back arguments that are not JSON
        text; the response is `incomplete`). A text item is "incomplete" when the generation was
        cut or failed and nothing followed it. ids: the items' ids streamed already ("reasoning",
        "message", a call's index); new ones for the others."""
        ids = ids or {}
        if self.compaction:
            return [compaction_item(outcome.content or "", ids.get("compaction"))]
        ended = outcome.finish_reason not in ("length", "error")
        calls = bool(outcome.calls or outcome.cut)
        items: list[r.OutputItem] = []
        status: ItemStatus
        if outcome.reasoning:
            status = "completed" if ended or outcome.content or calls else "incomplete"
            content = [r.ReasoningContent(text=outcome.reasoning)]
            rid, capsule = ids.get("reasoning") or new_id("rs_"), self.reasoning_capsule(outcome.reasoning)
            items.append(r.OutputReasoning(id=rid, content=content, status=status, encrypted_content=capsule))
        if outcome.content:
            logprobs = chat_logprobs(self.tokenizer, outcome.logprobs) if self.logprobs else None
            part = r.OutputTextPart(text=outcome.content, logprobs=logprobs)
            status = "completed" if ended or calls else "incomplete"
            items.append(r.OutputMessage(id=ids.get("message") or new_id("msg_"), status=status, content=[part]))
        for call in outcome.calls:
            if call.kind == "custom":
                item_id = ids.get(call.index) or new_id("ctc_")
                items.append(
                    r.OutputCustomToolCall(
                        id=item_id, call_id=call.id, name=call.name, input=call.input or "", status="completed"
                    )
                )
                continue
            item_id = ids.get(call.index) or new_id("fc_")
            items.append(self.function_call(item_id, call.id, call.name, call.arguments, "completed"))
        return items

    def render(self, outcome: Finish, ids: dict | None = None) -> r.Response:
        """The final response of `outcome` (whole, or the stream's last event; `ids` as in `items`)."""
        return self.finished(self.items(outcome, ids), outcome.finish_reason, outcome.result, outcome.reasoning_tokens)


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
        return ResponsesReply(self, job)


class ResponsesReply:
    """The one choice of a Responses request, whole or as the event stream; the final response is
    stored unless the request said `store: false`."""

    def __init__(self, call: ResponsesCall, job: GenerationJob):
        req, server = call.body, call.server
        self.builder = ResponseBuilder(req, req.model, server.model.tokenizer, job.logprobs)
        self.events = ReplyEvents(job.constraint, job.reasoning)
        stores = ([call.store] if req.store is not False else []) + ([call.cache] if call.cache is not None else [])
        self.keep = None
        if stores:
            items, conversation = input_items(req), call.conversation

            def keep(final: dict) -> None:
                for store in stores:
                    store.put(final, conversation + output_messages(final["output"]), items)

            self.keep = keep

    def stream(self, jobs: list[Job]) -> AsyncGenerator[dict]:
        """The Responses events (not yet numbered), the final response kept as `complete` keeps it;
        `response.in_progress` again while none comes for a while (`stream.keepalive`: SSE and the
        WebSocket alike)."""
        [job] = jobs
        return keepalive(self.builder, stored(events(self.builder, self.events, job), self.keep))

    def sse(self, jobs: list[Job]) -> AsyncIterator[str]:
        return sse_events(self.stream(jobs))

    def complete(self, collected: Collected) -> dict:
        [(pieces, result)] = collected
        body = self.builder.render(finish_of(pieces, result, self.events)).model_dump()
        if self.keep is not None:
            self.keep(body)
        return body


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


class CompactReply(ResponsesReply):
    """`POST /v1/responses/compact`'s reply: OpenAI's `CompactedResponse`, the input's user
    messages then the one compaction item."""

    def __init__(self, call: ResponsesCall, job: GenerationJob, users: list[dict]):
        super().__init__(call, job)
        self.keep, self.users = None, users

    def complete(self, collected: Collected) -> dict:
        [(pieces, result)] = collected
        final = self.builder.render(finish_of(pieces, result, self.events)).model_dump()
        if final["status"] == "failed":
            raise APIError(500, (final.get("error") or {}).get("message", "the compaction failed"), "server_error")
        head = {"id": final["id"], "object": "response.compaction", "created_at": final["created_at"]}
        return head | {"output": self.users + final["output"], "usage": final["usage"]}


@dataclass
class CompactCall(ResponsesCall):
    """`POST /v1/responses/compact`: the request with a `compaction_trigger` appended, whole."""

    users: list[dict] = field(default_factory=list)

    @property
    def stream(self) -> bool:
        return False

    def reply(self, job: GenerationJob) -> ResponsesReply:
        return CompactReply(self, job, self.users)


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


async def stored(stream, keep) -> AsyncGenerator[dict]:
    """`stream`'s events; the response its last event carries is kept with `keep` (None: not stored)."""
    async for event in stream:
        if keep is not None and event["type"] in ("response.completed", "response.incomplete", "response.failed"):
            keep(event["response"])
        yield event


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


def input_items(req: r.ResponseCreateRequest) -> list[dict]:
    """`req.input` as stored items, each with an id (the client's, else a new one): a text input is
    one user message of `input_text`."""
    if isinstance(req.input, str):
        text = [{"type": "input_text", "text": req.input}]
        return [{"type": "message", "id": new_id("msg_"), "role": "user", "content": text, "status": "completed"}]
    prefixes = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}
    prefixes |= {"custom_tool_call": "ctc_", "custom_tool_call_output": "ctco_"}
    out = []
    for item in req.input:
        data = item.model_dump(exclude_none=True)
        if isinstance(data.get("content"), str):  # a message's text as the part OpenAI lists
            part = "output_text" if data.get("role") == "assistant" else "input_text"
            data["content"] = [{"type": part, "text": data["content"]}]
        data.setdefault("id", new_id(prefixes.get(data.get("type", "message"), "item_")))
        out.append(data)
    return out


@router.delete("/responses/{response_id}", responses=ERROR_RESPONSES)
async def delete_response(response_id: str, store: Store):
    """Forget a stored response; a 404 when unknown or evicted."""
    if not store.delete(response_id):
        raise not_found(response_id, "response_id")
    return {"id": response_id, "object": "response", "deleted": True}

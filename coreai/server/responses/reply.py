"""The Responses dialect's reply: a generation's `Finish` (`coreai.service.events`) as a `Response`
(`ResponseBuilder.render`): `reasoning`, `message` with `output_text`, `function_call`s and
`custom_tool_call`s (a custom tool's raw input). A generation cut by `max_output_tokens` is
`incomplete`; a constrained output that failed (finish_reason "error") is `failed` with `error` and
no output, never `completed` with invalid text. `ResponsesReply` renders one request's job whole or
as the event stream (`stream.py`, rendered from the same events, ending with the same outcome) and
keeps the final response in the stores it is given; `CompactReply` is the compaction's."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Literal

from coreai.server.dispatch import Collected
from coreai.server.errors import APIError
from coreai.server.openai.family import chat_logprobs, usage_info
from coreai.server.responses import local_shell
from coreai.server.responses import schemas as r
from coreai.server.responses.capsule import seal
from coreai.server.responses.compaction import compaction_item, is_trigger
from coreai.server.responses.namespaces import flatten
from coreai.server.responses.schemas import new_id
from coreai.server.responses.store import ResponseStore, output_messages
from coreai.server.responses.stream import events, keepalive, sse_events
from coreai.service import Finish, GenerationJob, Job, ReplyEvents, finish_of
from runtime import GenerationResult

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

    def function_call(
        self, item_id: str, call_id: str, flat: str, arguments: str, status
    ) -> r.OutputFunctionCall | r.OutputLocalShellCall:
        """A function call item, named as the client named the tool (`namespaces.Namespaces.split`);
        a `local_shell` call's item is its `local_shell_call` (`local_shell.call_item`)."""
        if self.namespaces.is_local_shell(flat):
            return local_shell.call_item(item_id, call_id, arguments, status)
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
            prefix = "lsh_" if self.namespaces.is_local_shell(call.name) else "fc_"
            item_id = ids.get(call.index) or new_id(prefix)
            items.append(self.function_call(item_id, call.id, call.name, call.arguments, "completed"))
        return items

    def render(self, outcome: Finish, ids: dict | None = None) -> r.Response:
        """The final response of `outcome` (whole, or the stream's last event; `ids` as in `items`)."""
        return self.finished(self.items(outcome, ids), outcome.finish_reason, outcome.result, outcome.reasoning_tokens)


class ResponsesReply:
    """The one choice of a Responses request, whole or as the event stream; the final response is
    stored unless the request said `store: false`."""

    def __init__(
        self,
        req: r.ResponseCreateRequest,
        tokenizer,
        job: GenerationJob,
        stores: Sequence[ResponseStore] = (),
        conversation: Sequence[dict] = (),
    ):
        """stores: where the final response is kept, with `conversation` (the turns before it, as
        chat messages) and its input items."""
        self.builder = ResponseBuilder(req, req.model, tokenizer, job.logprobs)
        self.events = ReplyEvents(job.constraint, job.reasoning)
        self.keep = None
        if stores:
            items, conversation = input_items(req), list(conversation)

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


class CompactReply(ResponsesReply):
    """`POST /v1/responses/compact`'s reply: OpenAI's `CompactedResponse`, the input's user
    messages then the one compaction item."""

    def __init__(self, req: r.ResponseCreateRequest, tokenizer, job: GenerationJob, users: list[dict]):
        super().__init__(req, tokenizer, job)
        self.users = users

    def complete(self, collected: Collected) -> dict:
        [(pieces, result)] = collected
        final = self.builder.render(finish_of(pieces, result, self.events)).model_dump()
        if final["status"] == "failed":
            raise APIError(500, (final.get("error") or {}).get("message", "the compaction failed"), "server_error")
        head = {"id": final["id"], "object": "response.compaction", "created_at": final["created_at"]}
        return head | {"output": self.users + final["output"], "usage": final["usage"]}


async def stored(stream, keep) -> AsyncGenerator[dict]:
    """`stream`'s events; the response its last event carries is kept with `keep` (None: not stored)."""
    async for event in stream:
        if keep is not None and event["type"] in ("response.completed", "response.incomplete", "response.failed"):
            keep(event["response"])
        yield event


def input_items(req: r.ResponseCreateRequest) -> list[dict]:
    """`req.input` as stored items, each with an id (the client's, else a new one): a text input is
    one user message of `input_text`."""
    if isinstance(req.input, str):
        text = [{"type": "input_text", "text": req.input}]
        return [{"type": "message", "id": new_id("msg_"), "role": "user", "content": text, "status": "completed"}]
    prefixes = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}
    prefixes |= {"custom_tool_call": "ctc_", "custom_tool_call_output": "ctco_"}
    prefixes |= {"local_shell_call": "lsh_", "local_shell_call_output": "lsho_"}
    out = []
    for item in req.input:
        data = item.model_dump(exclude_none=True)
        if isinstance(data.get("content"), str):  # a message's text as the part OpenAI lists
            part = "output_text" if data.get("role") == "assistant" else "input_text"
            data["content"] = [{"type": part, "text": data["content"]}]
        data.setdefault("id", new_id(prefixes.get(data.get("type", "message"), "item_")))
        out.append(data)
    return out

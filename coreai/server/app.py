"""The FastAPI app: `/health`, `/v1/models`, `/v1/chat/completions`, `/v1/completions` (+ `/docs`,
`/openapi.json`).

A request is validated (pydantic, 400 naming the field), its prompt rendered and its constraint
compiled on a thread-pool thread (400 before it queues), then queued for the single generation
worker (429 when the queue is full). Responses and SSE chunks follow OpenAI's shapes; a client that
disconnects cancels its generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from jinja2 import TemplateError

from coreai.server import schemas as s
from coreai.server.constraints import Constraint, Constraints
from coreai.server.engine import Engine, GenerationParams, Piece, TokenLogprob
from coreai.server.errors import APIError, bad_request, install as install_error_handlers
from coreai.server.queue import Job, QueueFull
from coreai.server.tools import ParsedCall, ToolCallParser
from guided import get_tokenizer_info
from runtime import GenerationResult, Model, SamplingParams
from runtime.reasoning import ReasoningMarkers, ReasoningSplitter, ReasoningTokens, split_reasoning

log = logging.getLogger("coreai.server")

DISCONNECT_POLL = 0.5  # seconds between checks that a non-streaming client is still there
ERROR_RESPONSES = {status: {"model": s.ErrorResponse} for status in (400, 401, 404, 413, 429, 500)}


@dataclass
class ServerConfig:
    """Server settings.

    model_name: the id clients send as `model` (default: the model's name).
    api_key: required as `Authorization: Bearer <key>` on /v1 routes when set.
    max_tokens: the default and the upper bound of a request's completion tokens.
    temperature: the default sampling temperature.
    max_queue: requests allowed to wait while one runs; more get 429.
    max_body_bytes: request bodies above this get 413.
    speculative: speculative decoding for every request ("prompt_lookup", "draft" with the model's
        draft model, or None); the output does not change, only its speed.
    """

    model_name: str | None = None
    api_key: str | None = None
    max_tokens: int = 1024
    temperature: float = 0.7
    max_queue: int = 16
    max_body_bytes: int = 4 * 1024 * 1024
    speculative: str | None = "prompt_lookup"


class Guard:
    """ASGI middleware run before routing and body parsing: the API key (401) and the body size
    bound (413; bodies are read here up to the bound, also when chunked without Content-Length)."""

    def __init__(self, app, config: ServerConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.config.api_key and scope["path"].startswith("/v1"):
            given = headers.get("authorization", "")
            expected = f"Bearer {self.config.api_key}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                error = APIError(
                    401,
                    "missing or incorrect API key (send Authorization: Bearer <key>)",
                    param=None,
                    code="invalid_api_key",
                )
                return await error.response()(scope, receive, send)
        limit = self.config.max_body_bytes
        too_large = APIError(413, f"the request body exceeds {limit} bytes", code="request_too_large")
        if int(headers.get("content-length", 0) or 0) > limit:
            return await too_large.response()(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # disconnected before the body arrived
            body += message.get("body", b"")
            if len(body) > limit:
                return await too_large.response()(scope, receive, send)
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            # The body once, then the real channel (so disconnects are still seen).
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def create_app(model: Model, config: ServerConfig | None = None) -> FastAPI:
    """The server's ASGI app for `model`. Starts the generation worker; builds the grammar engine's
    view of the tokenizer (a few seconds, once per tokenizer per process)."""
    config = config or ServerConfig()
    name = config.model_name or model.name
    engine = Engine(model, config.max_queue)
    try:
        info = get_tokenizer_info(model.tokenizer, model.vocab_size, model.tokenizer.eos_ids)
    except ValueError as exc:
        log.warning("guided generation disabled: %s", exc)
        info = None
    constraints = Constraints(model, info)
    import jsonschema  # noqa: F401 - the final output check's import (seconds) at start-up, not in a first request

    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        engine.close()

    app = FastAPI(
        title="coreai-mlx",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI-compatible local server; response_format, structured_outputs and tools "
        "are enforced by guided generation.",
    )
    app.add_middleware(Guard, config=config)
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": name, "queued": engine.worker.busy}

    @app.get("/v1/models", response_model=s.ModelList, responses=ERROR_RESPONSES)
    async def models():
        return s.ModelList(data=[s.ModelCard(id=name, created=created)])

    def check_model(requested: str) -> None:
        if requested != name:
            raise APIError(
                404,
                f"the model {requested!r} does not exist; this server serves {name!r}",
                param="model",
                code="model_not_found",
            )

    def generation_params(
        req: s.SamplingFields,
        prompt_ids: list[int],
        constraint: Constraint | None,
        max_tokens: int | None,
        logprobs: bool,
        top_logprobs: int,
    ) -> GenerationParams:
        if max_tokens is not None and max_tokens > config.max_tokens:
            field = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
            raise bad_request(f"{field} must be <= {config.max_tokens} on this server", field)
        budget = max_tokens or config.max_tokens
        if model.context_length:
            room = model.context_length - len(prompt_ids)
            if room < 1:
                raise bad_request(
                    f"the prompt has {len(prompt_ids)} tokens; the model's context is {model.context_length}",
                    "messages" if hasattr(req, "messages") else "prompt",
                    "context_length_exceeded",
                )
            budget = min(budget, room)  # cut at the context: finish_reason "length" says so
        try:  # SamplingParams checks the ranges: one place for the API, the CLI and the server
            sampling = SamplingParams(
                temperature=config.temperature if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=req.top_k or 0,
                min_p=req.min_p or 0.0,
                repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                seed=req.seed,
            )
        except ValueError as exc:
            raise bad_request(str(exc), str(exc).split(" ", 1)[0]) from None
        return GenerationParams(
            prompt_ids,
            sampling,
            budget,
            req.stop_list(),
            constraint.session if constraint else None,
            logprobs,
            top_logprobs,
            config.speculative,
            getattr(req, "chat_template_kwargs", None),
        )

    def prepare_chat(req: s.ChatCompletionRequest) -> tuple[GenerationParams, Constraint | None]:
        constraint = constraints.for_chat(req)
        tools = (
            [t.model_dump(exclude_none=True) for t in req.tools] if req.tools and req.tool_choice != "none" else None
        )
        messages = [_template_message(m, i) for i, m in enumerate(req.messages)]
        try:
            ids = model.prompt_ids(messages, tools=tools, chat_template_kwargs=req.chat_template_kwargs)
        except (TemplateError, ValueError) as exc:
            raise bad_request(f"cannot render the chat template: {exc}", "messages") from None
        params = generation_params(
            req, ids, constraint, req.max_completion_tokens or req.max_tokens, req.logprobs, req.top_logprobs or 0
        )
        return params, constraint

    def prepare_completion(req: s.CompletionRequest) -> tuple[GenerationParams, Constraint | None]:
        constraint = constraints.structured(req)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise bad_request("only one prompt per request is supported", "prompt")
            prompt = prompt[0]
        if not prompt:
            raise bad_request("the prompt is empty", "prompt")
        if isinstance(prompt, list) and any(not 0 <= t < model.vocab_size for t in prompt):
            raise bad_request(f"prompt token ids must be in [0, {model.vocab_size})", "prompt")
        if isinstance(prompt, str) and req.parse_special_tokens:
            ids = model.tokenizer.encode(prompt, parse_special=True)
        else:
            ids = model.prompt_ids(prompt, chat_template=False)  # special-token text stays text
        want = req.logprobs is not None
        params = generation_params(req, ids, constraint, req.max_tokens, want, req.logprobs or 0)
        return params, constraint

    def submit(params: GenerationParams) -> Job:
        try:
            return engine.submit(params)
        except QueueFull as exc:
            raise APIError(
                429, str(exc), "rate_limit_error", None, "queue_full", headers={"Retry-After": str(exc.retry_after)}
            ) from None

    async def respond(req, request: Request, prepare, reply_class):
        check_model(req.model)
        params, constraint = await run_in_threadpool(prepare, req)
        job = submit(params)
        reply = reply_class(req, constraint, model, name)
        reply.reasoning = _reasoning(model, req, params.prompt_ids)
        if req.stream:
            return StreamingResponse(_sse(reply.stream(job)), media_type="text/event-stream")
        pieces, result = await _collect(job, request)
        if result is None:
            return JSONResponse({}, status_code=499)  # the client is gone; nobody reads this
        return reply.complete(pieces, result)

    @app.post("/v1/chat/completions", response_model=s.ChatCompletion, responses=ERROR_RESPONSES)
    async def chat_completions(req: s.ChatCompletionRequest, request: Request):
        """OpenAI chat completions (stream: SSE of `chat.completion.chunk`s ending `data: [DONE]`)."""
        return await respond(req, request, prepare_chat, ChatReply)

    @app.post("/v1/completions", response_model=s.Completion, responses=ERROR_RESPONSES)
    async def completions(req: s.CompletionRequest, request: Request):
        """OpenAI legacy text completions of a plain prompt (no chat template)."""
        return await respond(req, request, prepare_completion, CompletionReply)

    return app


def _reasoning(model: Model, req, prompt_ids: list[int]) -> tuple[ReasoningMarkers, bool] | None:
    """(markers, whether the prompt opened the block) when a chat reply of a thinking model may
    carry reasoning; None otherwise (no markers, thinking turned off, the template closed the block)."""
    markers = model.tokenizer.reasoning_markers
    if markers is None or not isinstance(req, s.ChatCompletionRequest):
        return None
    if (req.chat_template_kwargs or {}).get("enable_thinking") is False:
        return None
    try:
        state = ReasoningTokens.of(markers, model.tokenizer.hf).prompt_state(prompt_ids)
    except ValueError:
        return None
    return None if state == "closed" else (markers, state == "open")


def _template_message(m, index: int) -> dict:
    """An OpenAI message as the chat template expects it: text content joined from its parts,
    `developer` as `system`, tool-call arguments parsed from JSON text (templates render them with
    `tojson`)."""
    content = m.content if isinstance(m.content, str) or m.content is None else "".join(p.text for p in m.content)
    role = "system" if m.role == "developer" else m.role
    out = {"role": role, "content": content}
    if isinstance(m, s.AssistantMessage) and m.tool_calls:
        calls = []
        for j, call in enumerate(m.tool_calls):
            try:
                arguments = json.loads(call.function.arguments)
            except ValueError:
                raise bad_request(
                    "tool call arguments must be JSON text", f"messages[{index}].tool_calls[{j}].function.arguments"
                ) from None
            calls.append(
                {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}
            )
        out["tool_calls"] = calls
    if isinstance(m, s.ToolMessage):
        out["tool_call_id"] = m.tool_call_id
    return out


async def _collect(job: Job, request: Request) -> tuple[list[Piece], GenerationResult | None]:
    """All pieces and the result of a non-streaming job. Checks for a client disconnect twice a
    second, also while pieces keep arriving (then cancels the job and returns result None)."""
    pieces: list[Piece] = []
    result = None
    next_check = time.monotonic() + DISCONNECT_POLL
    while True:
        try:
            item = await asyncio.wait_for(job.get(), timeout=DISCONNECT_POLL)
        except TimeoutError:
            item = None
        if time.monotonic() >= next_check:
            if await request.is_disconnected():
                job.cancel.set()
                return pieces, None
            next_check = time.monotonic() + DISCONNECT_POLL
        if item is Job.END:
            return pieces, result
        if isinstance(item, GenerationResult):
            result = item
        elif item is not None:
            pieces.append(item)


async def _sse(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Server-sent events, ending `data: [DONE]`. The status (200) is sent with the first event, so
    a failure afterwards (a bug) is reported in-stream as an OpenAI error object, as OpenAI does."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    except Exception as exc:  # noqa: BLE001 - logged with its traceback, reported without it
        log.exception("internal error while streaming")
        error = {
            "message": f"internal server error ({type(exc).__name__})",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        yield f"data: {json.dumps({'error': error})}\n\n"
    yield "data: [DONE]\n\n"


def _usage(result: GenerationResult) -> s.UsageInfo:
    """OpenAI's usage; speculative drafts are reported as OpenAI reports predicted outputs
    (`completion_tokens_details.accepted_prediction_tokens` / `rejected_prediction_tokens`)."""
    u = result.usage
    details = s.CompletionTokensDetails(
        accepted_prediction_tokens=result.accepted_tokens,
        rejected_prediction_tokens=result.drafted_tokens - result.accepted_tokens,
    )
    return s.UsageInfo(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        total_tokens=u.total_tokens,
        prompt_tokens_details=s.PromptTokensDetails(cached_tokens=u.cached_tokens),
        completion_tokens_details=details,
    )


def _finish_reason(result: GenerationResult, calls: list[ParsedCall]) -> str:
    """OpenAI's finish_reason for a result whose verdict is already in it (`ConstrainedSession` turns
    a "stop" whose output breaks its constraint into "error").

    "length" when cut, unless complete tool calls were made (a call cut by max_tokens is dropped by
    the parser; the complete ones were closed under the grammar): then "tool_calls"; "error" when the
    grammar engine failed or the output is not valid; "tool_calls" when calls were made; else "stop".
    """
    reason = result.finish_reason
    if reason == "stop" or (reason == "length" and calls):
        return "tool_calls" if calls else "stop"
    if reason != "length":  # "error" (the engine's or the final check's message), or "cancelled" with nobody listening
        log.warning("generation ended with %s: %s", reason, result.error)
    return "length" if reason == "length" else "error"


class _Reply:
    """Shared state of one response: ids, the tokenizer (for logprob token strings)."""

    def __init__(self, req, constraint: Constraint | None, model: Model, name: str, prefix: str):
        self.req, self.constraint, self.model, self.name = req, constraint, model, name
        self.reasoning: tuple[ReasoningMarkers, bool] | None = None  # set by the route (see `_reasoning`)
        self.id = prefix + uuid.uuid4().hex
        self.created = int(time.time())

    def token(self, token_id: int) -> tuple[str, list[int]]:
        text = self.model.tokenizer.decode([token_id], skip_special_tokens=False)
        return text, list(text.encode("utf-8"))

    def entry(self, token_id: int, logprob: float) -> s.TopLogprob:
        text, raw = self.token(token_id)
        return s.TopLogprob(token=text, logprob=max(logprob, -9999.0), bytes=raw)


class ChatReply(_Reply):
    """Builds a chat completion (or its chunks) from a job's pieces."""

    def __init__(self, req: s.ChatCompletionRequest, constraint, model, name):
        super().__init__(req, constraint, model, name, "chatcmpl-")
        self.tools = constraint is not None and constraint.tool_mode is not None

    def logprobs(self, entries: list[TokenLogprob]) -> s.ChoiceLogprobs:
        content = []
        for e in entries:
            main = self.entry(e.id, e.logprob)
            content.append(s.TokenLogprob(**main.model_dump(), top_logprobs=[self.entry(i, v) for i, v in e.top]))
        return s.ChoiceLogprobs(content=content)

    def complete(self, pieces: list[Piece], result: GenerationResult) -> s.ChatCompletion:
        text = "".join(p.text for p in pieces)
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = split_reasoning(text, *self.reasoning)
        calls: list[ParsedCall] = []
        if self.tools:
            parser = ToolCallParser()
            content = "".join(x for x in parser.feed(text) + parser.finish() if isinstance(x, str))
            calls = parser.calls
        else:
            content = text
        finish = _finish_reason(result, calls)
        tool_calls = [
            s.ResponseToolCall(id=c.id, function=s.ResponseFunctionCall(name=c.name, arguments=c.arguments))
            for c in calls
        ] or None
        message = s.ResponseMessage(
            content=content if content or not calls else None, tool_calls=tool_calls, reasoning_content=reasoning
        )
        logprobs = None
        if self.req.logprobs:
            logprobs = self.logprobs([e for p in pieces for e in (p.logprobs or [])])
        choice = s.ChatChoice(message=message, logprobs=logprobs, finish_reason=finish)
        return s.ChatCompletion(
            id=self.id, created=self.created, model=self.name, choices=[choice], usage=_usage(result)
        )

    def chunk(self, delta: s.ChunkDelta, finish: str | None = None, logprobs: s.ChoiceLogprobs | None = None) -> dict:
        """A `chat.completion.chunk`; the delta carries only the fields it sets, as OpenAI's do."""
        choice = {
            "index": 0,
            "delta": delta.model_dump(exclude_none=True),
            "logprobs": logprobs.model_dump() if logprobs else None,
            "finish_reason": finish,
        }
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.name,
            "system_fingerprint": None,
            "choices": [choice],
        }
        if self.req.stream_options and self.req.stream_options.include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the last
        return chunk

    async def stream(self, job: Job) -> AsyncIterator[dict]:
        """Chunks: the role, content / tool-call deltas (a call is sent whole once its block closes),
        the finish_reason, then usage if `stream_options.include_usage`. Cancels the job when the
        client goes away (the generator is closed)."""
        parser = ToolCallParser() if self.tools else None
        splitter = ReasoningSplitter(*self.reasoning) if self.reasoning else None
        content: list[str] = []
        pending_logprobs: list[TokenLogprob] = []
        result = None
        try:
            yield self.chunk(s.ChunkDelta(role="assistant", content=""))
            while (item := await job.get()) is not Job.END:
                if isinstance(item, GenerationResult):
                    result = item
                    continue
                pending_logprobs += item.logprobs or []
                text = item.text
                if splitter is not None:
                    reasoning, text = splitter.feed(text)
                    if reasoning:
                        yield self.chunk(s.ChunkDelta(reasoning_content=reasoning))
                out = parser.feed(text) if parser else ([text] if text else [])
                for x in out:
                    yield self._delta(x, parser, content, pending_logprobs)
                    pending_logprobs = []
            if splitter is not None:
                reasoning, text = splitter.finish()
                if reasoning:
                    yield self.chunk(s.ChunkDelta(reasoning_content=reasoning))
                for x in parser.feed(text) if parser else ([text] if text else []):
                    yield self._delta(x, parser, content, pending_logprobs)
                    pending_logprobs = []
            for x in parser.finish() if parser else []:
                yield self._delta(x, parser, content, pending_logprobs)
                pending_logprobs = []
            if result is None:
                return
            finish = _finish_reason(result, parser.calls if parser else [])
            logprobs = self.logprobs(pending_logprobs) if pending_logprobs else None
            yield self.chunk(s.ChunkDelta(), finish, logprobs)
            if self.req.stream_options and self.req.stream_options.include_usage:
                yield {
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.name,
                    "system_fingerprint": None,
                    "choices": [],
                    "usage": _usage(result).model_dump(),
                }
        finally:
            job.cancel.set()  # a no-op once the job ended; frees the worker if the client left

    def _delta(self, x, parser: ToolCallParser | None, content: list[str], logprobs: list[TokenLogprob]) -> dict:
        lp = self.logprobs(logprobs) if logprobs and self.req.logprobs else None
        if isinstance(x, ParsedCall):
            call = s.ChunkToolCall(
                index=x.index,
                id=x.id,
                type="function",
                function=s.ChunkFunctionCall(name=x.name, arguments=x.arguments),
            )
            return self.chunk(s.ChunkDelta(tool_calls=[call]), None, lp)
        content.append(x)
        return self.chunk(s.ChunkDelta(content=x), None, lp)


class CompletionReply(_Reply):
    """Builds a legacy text completion (or its chunks)."""

    def __init__(self, req: s.CompletionRequest, constraint, model, name):
        super().__init__(req, constraint, model, name, "cmpl-")

    def logprobs(self, entries: list[TokenLogprob], offset: int) -> s.CompletionLogprobs:
        tokens, values, tops, offsets = [], [], [], []
        for e in entries:
            text, _ = self.token(e.id)
            tokens.append(text)
            values.append(max(e.logprob, -9999.0))
            tops.append({self.token(i)[0]: max(v, -9999.0) for i, v in e.top})
            offsets.append(offset)
            offset += len(text)
        return s.CompletionLogprobs(
            tokens=tokens, token_logprobs=values, top_logprobs=tops if self.req.logprobs else None, text_offset=offsets
        )

    def complete(self, pieces: list[Piece], result: GenerationResult) -> s.Completion:
        text = "".join(p.text for p in pieces)
        logprobs = None
        if self.req.logprobs is not None:
            logprobs = self.logprobs([e for p in pieces for e in (p.logprobs or [])], 0)
        choice = s.CompletionChoice(text=text, logprobs=logprobs, finish_reason=_finish_reason(result, []))
        return s.Completion(id=self.id, created=self.created, model=self.name, choices=[choice], usage=_usage(result))

    def chunk(self, text: str, finish: str | None, logprobs: s.CompletionLogprobs | None = None) -> dict:
        choice = s.CompletionChoice(text=text, logprobs=logprobs, finish_reason=finish)
        return s.Completion(id=self.id, created=self.created, model=self.name, choices=[choice]).model_dump()

    async def stream(self, job: Job) -> AsyncIterator[dict]:
        text: list[str] = []
        offset = 0
        result = None
        try:
            while (item := await job.get()) is not Job.END:
                if isinstance(item, GenerationResult):
                    result = item
                    continue
                logprobs = self.logprobs(item.logprobs or [], offset) if self.req.logprobs is not None else None
                offset += len(item.text)
                text.append(item.text)
                yield self.chunk(item.text, None, logprobs)
            if result is None:
                return
            yield self.chunk("", _finish_reason(result, []))
            if self.req.stream_options and self.req.stream_options.include_usage:
                usage = _usage(result).model_dump()
                yield {
                    "id": self.id,
                    "object": "text_completion",
                    "created": self.created,
                    "model": self.name,
                    "choices": [],
                    "usage": usage,
                }
        finally:
            job.cancel.set()

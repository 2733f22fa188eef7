"""OpenAI response shapes of a finished or streaming generation: chat completions (content,
`reasoning_content`, tool calls, logprobs) and legacy text completions, whole or as chunks."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import cast

from coreai.server.openai import reply_schemas as o
from coreai.server.openai import schemas as s
from coreai.server.openai.provenance import Provenance
from coreai.server.openai.tools import chunk_tool_call, message_tool_calls
from coreai.server.streaming import merge, sse
from coreai.service import Finish, Job, ReplyEvents, decided, finish_of, job_events
from coreai.service.engine import Piece, TokenLogprob
from coreai.service.events import CallArguments, CallOpened, ContentDelta, ReasoningDelta, WholeCall, whole_calls
from guided import Constraint
from runtime import GenerationResult, Model
from runtime.reasoning import ReasoningPlan


def usage_info(results: list[GenerationResult]) -> o.UsageInfo:
    """OpenAI's usage of a request's choices: the prompt counted once, the completions summed;
    speculative drafts are reported as OpenAI reports predicted outputs
    (`completion_tokens_details.accepted_prediction_tokens` / `rejected_prediction_tokens`)."""
    prompt = results[0].usage
    completion = sum(r.usage.completion_tokens for r in results)
    accepted = sum(r.accepted_tokens for r in results)
    details = o.CompletionTokensDetails(
        accepted_prediction_tokens=accepted,
        rejected_prediction_tokens=sum(r.drafted_tokens for r in results) - accepted,
    )
    return o.UsageInfo(
        prompt_tokens=prompt.prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt.prompt_tokens + completion,
        prompt_tokens_details=o.PromptTokensDetails(cached_tokens=prompt.cached_tokens),
        completion_tokens_details=details,
    )


class _Reply:
    """Shared state of one response: ids, the tokenizer (for logprob token strings). A request's `n`
    choices are jobs of their own; their chunks go out as they come, each with its choice's index."""

    chunk_object = ""  # the `object` of a streamed chunk

    def __init__(
        self, req, constraint: Constraint | None, model: Model, name: str, reasoning: ReasoningPlan | None, prefix: str
    ):
        self.req, self.constraint, self.model, self.name = req, constraint, model, name
        self.reasoning = reasoning  # the generation's reasoning plan: the reply splits its block off
        self.id = prefix + uuid.uuid4().hex
        self.created = int(time.time())

    def sse(self, jobs: list[Job]) -> AsyncIterator[str]:
        """`stream` as server-sent events, ending `data: [DONE]`."""
        return sse(self.stream(jobs))

    def frame(self, choices: list[dict]) -> dict:
        """A streamed chunk carrying `choices`."""
        return dict(id=self.id, object=self.chunk_object, created=self.created, model=self.name, choices=choices)

    async def stream(self, jobs: list[Job]) -> AsyncIterator[dict]:
        """The chunks of every choice as they come, then, with `stream_options.include_usage`, a last
        chunk with the usage of all choices (OpenAI: `usage` is null on every other chunk). Cancels
        the jobs when the client goes away (the generator is closed)."""
        results: list[GenerationResult | None] = [None] * len(jobs)
        async for chunk in merge([self.stream_choice(job, i, results) for i, job in enumerate(jobs)]):
            yield chunk
        if self.include_usage and None not in results:
            yield {**self.frame([]), "usage": usage_info(cast(list[GenerationResult], results)).model_dump()}

    @property
    def include_usage(self) -> bool:
        return bool(self.req.stream_options and self.req.stream_options.include_usage)

    def stream_choice(self, job: Job, index: int, results: list) -> AsyncIterator[dict]:
        """The chunks of choice `index`; stores its `GenerationResult` in `results[index]`."""
        raise NotImplementedError

    def token(self, token_id: int) -> str:
        return token_text(self.model.tokenizer, token_id)


def token_text(tokenizer, token_id: int) -> str:
    """One token's text, special tokens included (a logprob entry's `token`)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


def chat_logprobs(tokenizer, entries: list[TokenLogprob]) -> list[o.TokenLogprob]:
    """Chat completions' (and Responses') logprob entries: each token's text, bytes and logprob
    (floored at -9999, OpenAI's) with its `top_logprobs`."""

    def entry(token_id: int, logprob: float) -> o.TopLogprob:
        text = token_text(tokenizer, token_id)
        return o.TopLogprob(token=text, logprob=max(logprob, -9999.0), bytes=list(text.encode("utf-8")))

    return [
        o.TokenLogprob(**entry(e.id, e.logprob).model_dump(), top_logprobs=[entry(i, v) for i, v in e.top])
        for e in entries
    ]


class ChatReply(_Reply):
    """Renders a chat completion (or its chunks) from its choices' outcomes (or events,
    `coreai.service.events`)."""

    chunk_object = "chat.completion.chunk"

    def __init__(self, req: s.ChatCompletionRequest, constraint, model, name, reasoning=None):
        super().__init__(req, constraint, model, name, reasoning, "chatcmpl-")
        self.provenance = Provenance(model.tokenizer) if req.token_provenance else None  # opt-in stream extension

    def events(self) -> ReplyEvents:
        """A choice's event source."""
        return ReplyEvents(self.constraint, self.reasoning)

    def logprobs(self, entries: list[TokenLogprob]) -> o.ChoiceLogprobs:
        return o.ChoiceLogprobs(content=chat_logprobs(self.model.tokenizer, entries))

    def complete(self, outcomes: list[tuple[list[Piece], GenerationResult]]) -> o.ChatCompletion:
        """The completion of every choice: `outcomes` is each choice's pieces and result, in order."""
        choices = [
            self.choice(i, finish_of(pieces, result, self.events())) for i, (pieces, result) in enumerate(outcomes)
        ]
        usage = usage_info([result for _, result in outcomes])
        return o.ChatCompletion(id=self.id, created=self.created, model=self.name, choices=choices, usage=usage)

    def choice(self, index: int, end: Finish) -> o.ChatChoice:
        message = o.ResponseMessage(
            content=end.content,
            tool_calls=message_tool_calls(end.calls),
            reasoning_content=end.outcome.reasoning,
            refusal=end.outcome.refusal,
        )
        logprobs = self.logprobs(end.logprobs) if self.req.logprobs else None
        finish = cast(o.FinishReason, end.finish_reason)  # pydantic checks the value
        return o.ChatChoice(index=index, message=message, logprobs=logprobs, finish_reason=finish)

    def frame(self, choices: list[dict]) -> dict:
        return {**super().frame(choices), "system_fingerprint": None}

    def chunk(
        self, index: int, delta: o.ChunkDelta, finish: str | None = None, logprobs: o.ChoiceLogprobs | None = None
    ) -> dict:
        """A `chat.completion.chunk` of choice `index`; the delta carries only the fields it sets, as
        OpenAI's do."""
        choice = {
            "index": index,
            "delta": delta.model_dump(exclude_none=True),
            "logprobs": logprobs.model_dump() if logprobs else None,
            "finish_reason": finish,
        }
        if self.provenance is not None:  # the tokens of the pieces read so far, and the stats at the end
            choice.update(self.provenance.take(index, finish is not None))
        chunk = self.frame([choice])
        if self.include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the last
        return chunk

    async def stream_choice(self, job: Job, index: int, results: list) -> AsyncIterator[dict]:
        """Chunks of one choice: the role, content / tool-call deltas (per call: its index, id and name,
        then its `arguments` fragments, sent together once the grammar closed the call, so a call the
        budget cut is never streamed, as the whole reply leaves it out: `whole_calls`), the
        finish_reason."""
        try:
            yield self.chunk(index, o.ChunkDelta(role="assistant", content=""))
            provenance = self.provenance
            observe = None if provenance is None else lambda item: provenance.add(index, item)
            async for event in whole_calls(job_events(job, self.events(), observe)):
                if isinstance(event, Finish):
                    results[index] = event.result
                    delta = o.ChunkDelta(refusal=event.outcome.refusal)
                    yield self.chunk(index, delta, event.finish_reason, self._logprobs(event.pending))
                elif isinstance(event, ReasoningDelta):
                    yield self.chunk(index, o.ChunkDelta(reasoning_content=event.text))
                elif isinstance(event, ContentDelta):
                    yield self.chunk(index, o.ChunkDelta(content=event.text), None, self._logprobs(event.logprobs))
                elif isinstance(event, WholeCall):
                    parts: list[CallOpened | CallArguments] = [event.opened, *event.fragments]
                    for part in parts:
                        delta = o.ChunkDelta(tool_calls=[chunk_tool_call(part, event.opened.kind)])
                        yield self.chunk(index, delta, None, self._logprobs(part.logprobs))
        finally:
            job.release()  # a no-op once the job ended; frees the worker if the client left (`Job.release`)

    def _logprobs(self, entries: list[TokenLogprob]) -> o.ChoiceLogprobs | None:
        return self.logprobs(entries) if entries and self.req.logprobs else None


class CompletionReply(_Reply):
    """Builds a legacy text completion (or its chunks)."""

    chunk_object = "text_completion"

    def __init__(self, req: s.CompletionRequest, constraint, model, name, reasoning=None):
        super().__init__(req, constraint, model, name, reasoning, "cmpl-")

    def logprobs(self, entries: list[TokenLogprob], offset: int) -> o.CompletionLogprobs:
        tokens, values, tops, offsets = [], [], [], []
        for e in entries:
            text = self.token(e.id)
            tokens.append(text)
            values.append(max(e.logprob, -9999.0))
            tops.append({self.token(i): max(v, -9999.0) for i, v in e.top})
            offsets.append(offset)
            offset += len(text)
        return o.CompletionLogprobs(
            tokens=tokens, token_logprobs=values, top_logprobs=tops if self.req.logprobs else None, text_offset=offsets
        )

    def complete(self, outcomes: list[tuple[list[Piece], GenerationResult]]) -> o.Completion:
        """The completion of every choice: `outcomes` is each choice's pieces and result, in order."""
        choices = []
        for i, (pieces, result) in enumerate(outcomes):
            logprobs = None
            if self.req.logprobs is not None:
                logprobs = self.logprobs([e for p in pieces for e in (p.logprobs or [])], 0)
            text, finish = "".join(p.text for p in pieces), cast(o.FinishReason, decided(result).finish)
            choices.append(o.CompletionChoice(index=i, text=text, logprobs=logprobs, finish_reason=finish))
        usage = usage_info([result for _, result in outcomes])
        return o.Completion(id=self.id, created=self.created, model=self.name, choices=choices, usage=usage)

    def chunk(self, index: int, text: str, finish: str | None, logprobs: o.CompletionLogprobs | None = None) -> dict:
        reason = cast("o.FinishReason | None", finish)  # pydantic checks the value
        choice = o.CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=reason)
        return o.Completion(id=self.id, created=self.created, model=self.name, choices=[choice]).model_dump()

    async def stream_choice(self, job: Job, index: int, results: list) -> AsyncIterator[dict]:
        """Chunks of one choice: its text as it comes, then the finish_reason."""
        offset = 0
        try:
            while (item := await job.get()) is not Job.END:
                if isinstance(item, GenerationResult):
                    results[index] = item
                    continue
                logprobs = self.logprobs(item.logprobs or [], offset) if self.req.logprobs is not None else None
                offset += len(item.text)
                yield self.chunk(index, item.text, None, logprobs)
            if results[index] is not None:
                yield self.chunk(index, "", decided(results[index]).finish)
        finally:
            job.release()

"""From a validated request to what the worker runs: `guided.request.prepare` (the constraint and the
rendered prompt), then the sampling parameters (checked once, by `SamplingParams`) and the token
budget. Runs on a thread-pool thread, so a bad request is a 400 before it queues.

Chat generations come in as a `guided.request.GenerationRequest` (`Preparer.prepare`);
`chat_request` is the chat completions front end's mapping into it. Legacy completions have a
prompt instead of messages (`Preparer.completion`)."""

from __future__ import annotations

import json
from typing import cast

from coreai.server import schemas as s
from coreai.server.config import ServerConfig
from coreai.server.constraints import structured_options
from coreai.server.engine import GenerationParams
from coreai.server.errors import bad_request, from_library_error
from guided import Constraint, GrammarCache, GrammarError
from guided.request import Defaults, GenerationRequest, Names, Sampling, answer_constraint, prepare
from guided.tools.custom import INPUT
from runtime import Model, SamplingParams
from runtime.errors import InputError, ParameterError
from runtime.sampling import check_max_tokens


class Preparer:
    """Prepares requests for one model and server configuration. `cache`: the server's compiled
    grammars; `guided`: False when the grammar engine cannot use the model's tokenizer (then every
    constrained request is a 400)."""

    def __init__(self, model: Model, config: ServerConfig, cache: GrammarCache, guided: bool = True):
        self.model, self.config, self.cache, self.guided = model, config, cache, guided
        self.defaults = Defaults(config.whitespace, config.schema_in_prompt, config.schema_hint_budget)

    def _require_guided(self, param: str | None) -> None:
        """A 400 naming `param`, the field asking for a constraint (None: none does), when guided
        generation is not available."""
        if not self.guided and param is not None:
            raise bad_request("guided generation is not available for this model's tokenizer", param)

    def generation_params(
        self,
        sampling: Sampling,
        max_tokens: int | None,
        names: Names,
        prompt_ids: list[int],
        stop: list[str],
        constraint: Constraint | None,
        logprobs: bool,
        top_logprobs: int,
        reasoning=None,
    ) -> GenerationParams:
        """What the worker runs. Checks the token budget (`max_tokens`, spelled `names.max_tokens`)
        and the sampling ranges in one place (the runtime's checks, each error a 400 naming its
        field), then cuts the budget at the context (a prompt filling it is a 400 naming
        `names.messages`)."""
        try:
            budget = self.config.max_tokens
            if max_tokens is not None:
                budget = check_max_tokens(max_tokens, self.config.max_tokens, names.max_tokens)
            params = SamplingParams(
                temperature=self.config.temperature if sampling.temperature is None else sampling.temperature,
                top_p=1.0 if sampling.top_p is None else sampling.top_p,
                top_k=sampling.top_k or 0,
                min_p=sampling.min_p or 0.0,
                repetition_penalty=1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty,
                presence_penalty=sampling.presence_penalty or 0.0,
                frequency_penalty=sampling.frequency_penalty or 0.0,
                seed=None if sampling.seed is None else sampling.seed % 2**64,  # OpenAI's seeds are signed 64-bit
                logit_bias=sampling.logit_bias,
            )
            params.check_token_ids(self.model.vocab_size)
        except ParameterError as exc:
            raise bad_request(str(exc), exc.param) from None
        if self.model.context_length:
            room = self.model.context_length - len(prompt_ids)
            if room < 1:
                raise bad_request(
                    f"the prompt has {len(prompt_ids)} tokens; the model's context is {self.model.context_length}",
                    names.messages,
                    "context_length_exceeded",
                )
            budget = min(budget, room)  # cut at the context: finish_reason "length" says so
        return GenerationParams(
            prompt_ids,
            params,
            budget,
            stop,
            constraint,
            logprobs,
            top_logprobs,
            self.config.speculative,
            reasoning,
        )

    def prepare(self, req: GenerationRequest) -> tuple[GenerationParams, Constraint | None]:
        """A generation and its constraint (`guided.request.prepare`: the constraint compiled, the
        prompt rendered), then the budget and sampling checked. Raises `APIError` (400) naming the
        front end's parameters (`req.names`)."""
        self._require_guided(req.answer[0] if req.answer else req.names.tools if req.tools else None)
        try:
            prepared = prepare(self.model, req, self.cache, self.defaults)
        except (GrammarError, InputError) as exc:
            raise from_library_error(exc) from None
        params = self.generation_params(
            req.sampling,
            req.max_tokens,
            req.names,
            prepared.ids,
            req.stop,
            prepared.constraint,
            req.logprobs,
            req.top_logprobs,
            prepared.reasoning,
        )
        params.provenance = req.token_provenance
        return params, prepared.constraint

    def chat(self, req: s.ChatCompletionRequest) -> tuple[GenerationParams, Constraint | None]:
        """A chat completions request's generation and constraint (400 on bad input)."""
        return self.prepare(chat_request(req))

    def completion(self, req: s.CompletionRequest) -> tuple[GenerationParams, Constraint | None]:
        """A legacy completion request's generation and constraint (400 on bad input)."""
        answer = structured_options(req)
        self._require_guided(answer[0] if answer else None)
        try:
            constraint = answer_constraint(self.model, answer, self.cache, self.defaults)
        except (GrammarError, InputError) as exc:
            raise from_library_error(exc) from None
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise bad_request("only one prompt per request is supported", "prompt")
            prompt = prompt[0]
        if not prompt:
            raise bad_request("the prompt is empty", "prompt")
        if isinstance(prompt, list) and any(not 0 <= t < self.model.vocab_size for t in cast("list[int]", prompt)):
            raise bad_request(f"prompt token ids must be in [0, {self.model.vocab_size})", "prompt")
        if isinstance(prompt, str) and req.parse_special_tokens:
            ids = self.model.tokenizer.encode(prompt, parse_special=True)
        else:
            ids = self.model.prompt_ids(prompt, chat_template=False)  # special-token text stays text
        names = Names(messages="prompt")
        want = req.logprobs is not None
        return (
            self.generation_params(
                sampling_of(req), req.max_tokens, names, ids, req.stop_list(), constraint, want, req.logprobs or 0
            ),
            constraint,
        )


def sampling_of(req: s.SamplingFields) -> Sampling:
    """The sampling fields of a chat or legacy completions body."""
    return Sampling(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logit_bias=req.logit_bias,
        seed=req.seed,
    )


def chat_request(req: s.ChatCompletionRequest) -> GenerationRequest:
    """The generation a chat completions body asks for (400 `APIError` when a tool call's arguments
    are not JSON text)."""
    # OpenAI's newer name wins when both are given.
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    choice = req.tool_choice if isinstance(req.tool_choice, (str, type(None))) else req.tool_choice.model_dump()
    return GenerationRequest(
        messages=[template_message(m, i) for i, m in enumerate(req.messages)],
        names=Names(max_tokens=field, tool_format="tools[{}].custom.format"),
        sampling=sampling_of(req),
        max_tokens=getattr(req, field),
        stop=req.stop_list(),
        answer=with_layout(structured_options(req, req.response_format), req.whitespace),
        tools=[t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None,
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls,
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs or 0,
        reasoning_effort=req.reasoning_effort,
        chat_template_kwargs=req.chat_template_kwargs,
        schema_in_prompt=req.schema_in_prompt,
        schema_hint_budget=req.schema_hint_budget,
        token_provenance=req.token_provenance,
    )


def with_layout(answer: tuple[str, dict] | None, whitespace: str | None) -> tuple[str, dict] | None:
    """The answer's options with the request's JSON layout (`whitespace`), which wins over the
    server's; unchanged without one, or for answers that are not JSON."""
    if answer is None or whitespace is None or not {"schema", "json_object"} & answer[1].keys():
        return answer
    return answer[0], {**answer[1], "whitespace": whitespace}


def template_message(m, index: int) -> dict:
    """An OpenAI message as the chat template expects it: text content joined from its parts,
    `developer` as `system`, tool-call arguments parsed from JSON text (templates render them with
    `tojson`). Raises a 400 `APIError` when a call's arguments are not JSON text."""
    content = m.content if isinstance(m.content, str) or m.content is None else "".join(p.text for p in m.content)
    role = "system" if m.role == "developer" else m.role
    out = {"role": role, "content": content}
    if getattr(m, "name", None) is not None:  # templates that know participants render it; others ignore it
        out["name"] = m.name
    if isinstance(m, s.AssistantMessage) and m.tool_calls:
        out["tool_calls"] = [
            template_custom_call(c.id, c.custom.name, c.custom.input)
            if isinstance(c, s.CustomToolCall)
            else template_call(
                c.id, c.function.name, c.function.arguments, f"messages[{index}].tool_calls[{j}].function.arguments"
            )
            for j, c in enumerate(m.tool_calls)
        ]
    if isinstance(m, s.ToolMessage):
        out["tool_call_id"] = m.tool_call_id
    return out


def template_call(call_id: str, name: str, arguments: str, param: str) -> dict:
    """A tool call as the chat template expects it, its `arguments` JSON text parsed; a 400
    (`APIError`) naming `param` when they are not JSON text."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        raise bad_request("tool call arguments must be JSON text", param) from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}


def template_custom_call(call_id: str, name: str, value: str) -> dict:
    """A custom tool's call as the chat template expects it: a function call whose one string
    argument is the input, the shape the tool is shown in (`guided.tools.custom`)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": {INPUT: value}}}

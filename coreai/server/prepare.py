"""From a validated request to what the worker runs: the rendered prompt ids, the sampling
parameters (checked once, by `SamplingParams`), the token budget and the guided session. Runs on a
thread-pool thread, so a bad request is a 400 before it queues."""

from __future__ import annotations

import json

from jinja2 import TemplateError

from coreai.server import schemas as s
from coreai.server.config import ServerConfig
from coreai.server.constraints import Constraint, Constraints
from coreai.server.engine import GenerationParams
from coreai.server.errors import bad_request
from guided.prompt import render_prompt
from runtime import Model, SamplingParams
from runtime.errors import ParameterError
from runtime.sampling import check_max_tokens

REASONING_BUDGETS = {"low": 256, "medium": 1024, "high": 4096}  # reasoning_effort -> max reasoning tokens


class Preparer:
    """Prepares requests for one model and server configuration."""

    def __init__(self, model: Model, config: ServerConfig, constraints: Constraints):
        self.model, self.config, self.constraints = model, config, constraints

    def generation_params(
        self,
        req: s.SamplingFields,
        prompt_ids: list[int],
        constraint: Constraint | None,
        logprobs: bool,
        top_logprobs: int,
        reasoning=None,
    ) -> GenerationParams:
        """What the worker runs. Checks the token budget and the sampling ranges in one place (the
        runtime's checks, each error a 400 naming its field), then cuts the budget at the context."""
        # OpenAI's newer name wins when both are given.
        field = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"
        try:
            budget = self.config.max_tokens
            if getattr(req, field) is not None:
                budget = check_max_tokens(getattr(req, field), self.config.max_tokens, field)
            sampling = SamplingParams(
                temperature=self.config.temperature if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=req.top_k or 0,
                min_p=req.min_p or 0.0,
                repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                seed=None if req.seed is None else req.seed % 2**64,  # OpenAI's seeds are signed 64-bit
                logit_bias=req.logit_bias,
            )
            sampling.check_token_ids(self.model.vocab_size)
        except ParameterError as exc:
            raise bad_request(str(exc), exc.param) from None
        if self.model.context_length:
            room = self.model.context_length - len(prompt_ids)
            if room < 1:
                raise bad_request(
                    f"the prompt has {len(prompt_ids)} tokens; the model's context is {self.model.context_length}",
                    "messages" if hasattr(req, "messages") else "prompt",
                    "context_length_exceeded",
                )
            budget = min(budget, room)  # cut at the context: finish_reason "length" says so
        return GenerationParams(
            prompt_ids,
            sampling,
            budget,
            req.stop_list(),
            constraint.session if constraint else None,
            logprobs,
            top_logprobs,
            self.config.speculative,
            reasoning,
        )

    def chat(self, req: s.ChatCompletionRequest) -> tuple[GenerationParams, Constraint | None]:
        """A chat request's generation and constraint (renders the template; 400 on bad input)."""
        if req.reasoning_effort is not None and self.model.tokenizer.reasoning_markers is None:
            raise bad_request(
                "reasoning_effort: this model does not reason (its chat template has no reasoning markers)",
                "reasoning_effort",
                "unsupported_parameter",
            )
        constraint = self.constraints.for_chat(req)
        session = constraint.session if constraint is not None else None
        if req.schema_in_prompt and (session is None or session.json_spec is None):
            raise bad_request(
                "schema_in_prompt needs response_format json_schema or json_object, or structured_outputs json",
                "schema_in_prompt",
            )
        wanted = req.schema_in_prompt if req.schema_in_prompt is not None else self.config.schema_in_prompt
        tools = (
            [t.model_dump(exclude_none=True) for t in req.tools] if req.tools and req.tool_choice != "none" else None
        )
        try:
            rendered = render_prompt(
                self.model,
                session,
                [template_message(m, i) for i, m in enumerate(req.messages)],
                tools=None if session is not None and session.tools is not None else tools,
                chat_template_kwargs=req.chat_template_kwargs,
                schema_in_prompt=wanted,
                max_reasoning_tokens=REASONING_BUDGETS[req.reasoning_effort or "medium"],
            )
        except (TemplateError, ValueError) as exc:
            raise bad_request(f"cannot render the chat template: {exc}", "messages") from None
        ids = rendered.ids
        params = self.generation_params(req, ids, constraint, req.logprobs, req.top_logprobs or 0, rendered.reasoning)
        params.provenance = req.token_provenance
        return params, constraint

    def completion(self, req: s.CompletionRequest) -> tuple[GenerationParams, Constraint | None]:
        """A legacy completion request's generation and constraint (400 on bad input)."""
        constraint = self.constraints.structured(req)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise bad_request("only one prompt per request is supported", "prompt")
            prompt = prompt[0]
        if not prompt:
            raise bad_request("the prompt is empty", "prompt")
        if isinstance(prompt, list) and any(not 0 <= t < self.model.vocab_size for t in prompt):
            raise bad_request(f"prompt token ids must be in [0, {self.model.vocab_size})", "prompt")
        if isinstance(prompt, str) and req.parse_special_tokens:
            ids = self.model.tokenizer.encode(prompt, parse_special=True)
        else:
            ids = self.model.prompt_ids(prompt, chat_template=False)  # special-token text stays text
        want = req.logprobs is not None
        params = self.generation_params(req, ids, constraint, want, req.logprobs or 0)
        return params, constraint


def template_message(m, index: int) -> dict:
    """An OpenAI message as the chat template expects it: text content joined from its parts,
    `developer` as `system`, tool-call arguments parsed from JSON text (templates render them with
    `tojson`)."""
    content = m.content if isinstance(m.content, str) or m.content is None else "".join(p.text for p in m.content)
    role = "system" if m.role == "developer" else m.role
    out = {"role": role, "content": content}
    if getattr(m, "name", None) is not None:  # templates that know participants render it; others ignore it
        out["name"] = m.name
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

"""`ConstrainedSession`: guided generation on a `runtime.Model`, plus the low-level calls for people
who run their own decoding loop (`next_token_bitmask`, `apply_mask`, `accept_token`, ...).

A session holds a `guided.Constraint` (compiled once through the shared `GrammarCache`, immutable,
shareable), one double-buffered bitmask, the low-level calls' matcher and a default for speculation.
Each `generate`/`stream` fills the one `coreai.service.GenerationRequest`, gets its job from
`coreai.service.prepare` as the CLI and the server do, and runs it alone (`coreai.service.run`).
Sessions are not shared between threads; constraints are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import mlx.core as mx

from coreai.service.prepare import prepare
from coreai.service.request import GenerationRequest, Names
from coreai.service.run import stream
from guided import ConstrainedDecodingStrategy, Constraint, Generation, GuidedResult, TokenBitmask, describe_in_prompt
from runtime.drafters import make_drafter
from runtime.errors import ParameterError
from runtime.reasoning import ReasoningPlan
from runtime.sampling import SamplingParams, given_sampling
from runtime.sequence import Delta

# The Python API's names of the fields a refusal may blame: its own keyword arguments.
SESSION_NAMES = Names(messages="prompt", max_tokens="max_tokens")


class ConstrainedSession:
    """Guided generation on `model`: a `guided.Constraint` (whose docstring says what each
    constraint and option means: exactly one of schema=, json_object=, regex=, choices=, grammar=,
    or tools= with an optional answer format) with generation at hand. The constraint is
    `self.constraint`; its read-only attributes (`compiled`, `spec`, `tools`, `report`,
    `tokenizer_info`, `json_spec`, ...) read through the session too.

    speculative (None): the default for `stream`/`generate`: "prompt_lookup", "draft" (the model's
        `draft`), a draft `Model`, or None (see `runtime.speculative`); the output does not change.

    Raises SchemaError (pointer), UnsupportedSchemaFeature (keyword, pointer), GrammarError, ParameterError.
    """

    def __init__(self, model, *, speculative=None, **constraint):
        self.constraint = Constraint(model, **constraint)
        self.model = model
        if isinstance(speculative, str):
            make_drafter(speculative, model)  # an unknown option fails here, not at the first generation
        self.speculative = speculative
        self._bitmask: TokenBitmask | None = None
        self.matcher = self.compiled.matcher()  # the low-level calls' state

    def __getattr__(self, name: str):
        # Only reached for names the session lacks: the constraint's attributes, read-only here.
        if name == "constraint":  # not set yet (an error in __init__): no recursion
            raise AttributeError(name)
        return getattr(self.constraint, name)

    @property
    def bitmask(self) -> TokenBitmask:
        """This session's bitmask buffers ([max_draft + 1, words] int32, two of them), allocated on
        first use, so on the thread that generates."""
        if self._bitmask is None:
            self._bitmask = TokenBitmask(self.model.vocab_size, batch=self.max_draft + 1)
        return self._bitmask

    def prompt(self, prompt, chat_template: bool = True):
        """`prompt` with the schema's description when `schema_in_prompt` is on (`guided.prompt.
        describe_in_prompt`); token ids and other prompts are unchanged."""
        return describe_in_prompt(self.constraint, prompt, chat_template)

    def strategy(
        self, sampling: SamplingParams | None = None, logprobs: bool = False, reasoning: ReasoningPlan | None = None
    ) -> ConstrainedDecodingStrategy:
        """A fresh `ConstrainedDecodingStrategy` for a decoding loop of one's own, filling this
        session's bitmask (one generation at a time); `reasoning`: its plan (`plan()`)."""
        return Generation(self.constraint, sampling, logprobs, reasoning, self.bitmask).strategy

    def stream(
        self, prompt, *, max_tokens: int = 256, sampling: SamplingParams | None = None, **kwargs
    ) -> Iterator[Delta]:
        """Stream `runtime.Delta`s; the last one has `finish_reason` and a `GuidedResult` in `.result`.

        prompt: text, chat messages or token ids (as `Model.stream`). Sampling is `sampling`, or
        built from keyword fields of `SamplingParams` (`temperature=`, `top_p=`, `seed=`,
        `frequency_penalty=`, ...; greedy by default). `tools` (the template's), `chat_template`,
        `chat_template_kwargs`, `logprobs`, `speculative` and `stop` fill the request with the rest;
        other keyword arguments go to `Model.stream` (`cancel`, `prompt_cache`). The job is the one
        `coreai.service.prepare` makes for the CLI and the server (budget cut at the context).
        Raises ParameterError for bad parameters (also for sampling= beside sampling fields) and
        `coreai.service.RequestError` for a prompt the template cannot render or that fills the context.
        """
        fields = given_sampling({k: kwargs.pop(k) for k in list(kwargs) if k in SamplingParams.__dataclass_fields__})
        if sampling is not None and fields:
            raise ParameterError(
                f"give either sampling= or sampling fields ({', '.join(fields)}), not both", "sampling"
            )
        given = dict(vars(sampling)) if sampling is not None else fields
        template = {k: kwargs.pop(k) for k in ("chat_template", "chat_template_kwargs") if k in kwargs}
        request = GenerationRequest(
            messages=prompt,
            names=SESSION_NAMES,
            sampling=given,
            max_tokens=max_tokens,
            stop=kwargs.pop("stop", None) or [],
            tools=kwargs.pop("tools", None),
            constraint=self.constraint,
            logprobs=kwargs.pop("logprobs", False),
            speculative=kwargs.pop("speculative", self.speculative),
            **template,
        )
        job = prepare(self.model, request)
        yield from stream(self.model, job, bitmask=self.bitmask, **kwargs)

    def generate(self, prompt, **kwargs) -> GuidedResult:
        """Run one constrained generation to the end; arguments as `stream`. Returns a `GuidedResult`."""
        for delta in self.stream(prompt, **kwargs):
            if delta.result is not None:
                return cast(GuidedResult, delta.result)  # `stream` replaced it with the verdict
        raise AssertionError("stream ended without a result")

    # -- low-level calls, for a decoding loop of one's own ------------------------------------------

    def next_token_bitmask(self) -> mx.array:
        """Fill and return the next-token bitmask: mx.array [1, ceil(vocab_size / 32)] int32 (row 0 of
        one of this session's two buffers; valid until the call after next)."""
        return self.bitmask.fill(self.matcher)[:1]

    def apply_mask(self, logits: mx.array) -> mx.array:
        """Logits [1, vocab_size] or [vocab_size] (float32/float16/bfloat16) with disallowed tokens at
        -inf, using the mask of the last `next_token_bitmask()` call."""
        return self.bitmask.apply(logits)

    def accept_token(self, token: int) -> bool:
        """Advance the grammar by one token; False if not allowed (the session's matcher is then in an
        error state until `reset()`)."""
        return self.matcher.accept_token(token)

    def jump_forward_string(self) -> str:
        """The text the grammar forces next ("" if none); does not change the state."""
        return self.matcher.jump_forward_string()

    def rollback(self, n: int) -> bool:
        """Undo the last `n` accepted tokens; False if fewer were accepted."""
        return self.matcher.rollback(n)

    def reset(self) -> None:
        """Back to the grammar's start (also after an error)."""
        self.matcher.reset()

    @property
    def is_terminated(self) -> bool:
        """True when only EOS can follow (the grammar is complete) or the matcher is in an error state."""
        return self.matcher.is_terminated()

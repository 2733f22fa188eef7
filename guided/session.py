"""`ConstrainedSession`: guided generation on a `runtime.Model`, plus the low-level calls for people
who run their own decoding loop (`next_token_bitmask`, `apply_mask`, `accept_token`, ...).

A session compiles its grammar once (through the shared `GrammarCache`) and owns one double-buffered
bitmask; each `generate`/`stream` gets a fresh matcher. Sessions are not shared between threads;
compiled grammars are.
"""

from __future__ import annotations

from typing import Callable, Iterator

import mlx.core as mx
import numpy as np

from guided.bitmask import TokenBitmask
from guided.cache import GrammarCache, default_cache
from guided.callcheck import CallChecker, call_plans
from guided.enforcement import KeywordEnforcement, enforcement
from guided.errors import GrammarError
from guided.prompt import describe_in_prompt, render_prompt
from guided.result import GuidedResult
from guided.schema_prompt import SCHEMA_IN_PROMPT
from guided.spec import JSON_KINDS, make_spec
from guided.strategy import ConstrainedDecodingStrategy
from guided.tokenizer_info import get_tokenizer_info
from guided.tool_answer import answer_schema, answer_spec, checked_answer
from guided.toolcalls import CallTracker, ToolCall
from guided.tools import ToolConstraint, tool_constraint
from guided.validation import check_json
from runtime.drafters import make_drafter
from runtime.reasoning import ReasoningMarkers, ReasoningPlan, ReasoningTokens, plan_reasoning
from runtime.sampling import SamplingParams
from runtime.sequence import Delta, GenerationResult


class ConstrainedSession:
    """Generate text constrained by exactly one of:

    schema: a JSON Schema (dict, JSON text, file path or pydantic model class);
    json_object: True for any JSON object;
    regex: a regular expression for the whole output;
    choices: a list of strings, the output is one of them;
    grammar: Lark (also with llama.cpp's `%llguidance {}` line) or GBNF text, or a .lark/.gbnf path;
    tools: functions the model may call (see `guided.tools`: OpenAI or Responses function
        definitions, pydantic model classes, typed Python functions), with tool_choice ("auto",
        "required", "none" or {"type": "function", "function": {"name": ...}}),
        parallel_tool_calls (True) and tool_format (None: detected from the chat template, else one
        of `guided.tool_formats.FORMATS`: "hermes", "llama3", "mistral", "mistral_names", "phi4",
        "glm45", "kimi_k2", "lfm2", "pythonic", "qwen3_coder", "generic"). The result has
        `tool_calls` and `content`. A schema or json_object beside tools is the text answer's format
        (OpenAI's response_format with tools): under "auto" the reply is calls or that JSON
        (`content`, `value`), under "none" the JSON, under "required" / a named function calls only.

    Options: whitespace (None: `guided.spec.DEFAULT_WHITESPACE`, "pretty"; "compact", "any"; the
    older any_whitespace=True/False means "any"/"compact"), strict (True), lenient (False): see `guided.spec`.
    jump_forward (True): append grammar-forced tokens without sampling.
    speculative (None): the default for `stream`/`generate`: "prompt_lookup", "draft" (the model's
        `draft`), a draft `Model`, or None (see `runtime.speculative`); the output does not change.
    max_draft (32): the longest speculative draft (the bitmask has max_draft + 1 rows, 19 KB each for Qwen).
    max_retries (8): validate-and-rollback retries per generation, for keywords the grammar cannot
        express (`compiled.validated`, see `guided.checker`; in tool calls `guided.callcheck`); past it
        the generation ends in "error".
    check: an extra final check of the output text, `check(text) -> list of errors`; errors make the
        result invalid.
    max_reasoning_tokens (1024): a thinking model (its chat template has known reasoning markers, see
        `runtime.reasoning`) reasons freely before the constrained answer, for at most this many
        tokens, then the end marker is forced. `reasoning_markers=(start, end)` overrides the
        detected markers; `chat_template_kwargs={"enable_thinking": False}` in `stream`/`generate`
        turns reasoning off where the template supports it.
    cache: the compiled-grammar cache (the process-wide `default_cache` by default).
    schema_in_prompt (None: `guided.schema_prompt.SCHEMA_IN_PROMPT` for JSON constraints, off for the
        others): put `describe_schema(schema)` (the expected output in words: keys in order, types,
        formats such as "a date written YYYY-MM-DD", enums, ranges, descriptions) at the start of the
        system message of every prompt (`prompt()`), so the model knows what the grammar will ask of it.
        True for a regex, choices or grammar constraint raises ValueError (there is no schema).

    This object is the one guided path: the Python API, the CLI and the server all go from spec to
    compiled grammar to strategy to verdict through it.

    Raises SchemaError (pointer), UnsupportedSchemaFeature (keyword, pointer), GrammarError, ValueError.
    """

    def __init__(
        self,
        model,
        *,
        schema=None,
        json_object: bool = False,
        regex: str | None = None,
        choices=None,
        grammar: str | None = None,
        tools: list | None = None,
        tool_choice=None,
        parallel_tool_calls: bool = True,
        tool_format: str | None = None,
        whitespace: str | None = None,
        any_whitespace: bool | None = None,
        strict: bool = True,
        lenient: bool = False,
        jump_forward: bool = True,
        speculative=None,
        max_draft: int = 32,
        max_retries: int = 8,
        check: Callable[[str], list[str]] | None = None,
        max_reasoning_tokens: int = 1024,
        reasoning_markers: tuple[str, str] | None = None,
        cache: GrammarCache | None = None,
        schema_in_prompt: bool | None = None,
    ):
        self.model = model
        self.tokenizer_info = get_tokenizer_info(model.tokenizer.hf, model.vocab_size, model.tokenizer.eos_ids)
        self.tools: ToolConstraint | None = None
        self.call_plans = {}  # tool name -> the `CheckPlan` validate-and-rollback checks its calls with
        self.answer_spec = None  # beside tools: the JSON answer's spec (a response format), for the verdict
        self.model_class = schema if isinstance(schema, type) and hasattr(schema, "model_validate") else None
        options = dict(whitespace=whitespace, any_whitespace=any_whitespace, strict=strict, lenient=lenient)
        if tools is not None:
            answer = answer_spec(schema, json_object, (regex, choices, grammar), **options)
            hf, ll = model.tokenizer.hf, self.tokenizer_info.ll_tokenizer
            self.tools = tool_constraint(
                tools, tool_choice, parallel_tool_calls, tool_format, hf, ll, answer=answer_schema(answer)
            )
            self.call_plans = call_plans(self.tools, self.tokenizer_info, cache or default_cache)
            self.answer_spec = checked_answer(answer, self.tools, self.tokenizer_info, cache or default_cache)
            grammar, schema, json_object = self.tools.grammar, None, False
        self.spec = make_spec(
            schema=schema, json_object=json_object, regex=regex, choices=choices, grammar=grammar, **options
        )
        self.compiled = (cache or default_cache).get(self.spec, self.tokenizer_info)
        self.jump_forward = jump_forward
        if isinstance(speculative, str):
            make_drafter(speculative, model)  # an unknown option fails here, not at the first generation
        self.speculative = speculative
        self.max_draft = max_draft
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.max_retries = max_retries
        self.check = check
        self._bitmask: TokenBitmask | None = None
        self.matcher = self.compiled.matcher()  # the low-level calls' state
        if self._admits_only_empty_output():
            raise GrammarError(f"the {self.spec.kind} constraint admits only the empty output: nothing to generate")
        if max_reasoning_tokens < 1:
            raise ValueError(f"max_reasoning_tokens must be >= 1, got {max_reasoning_tokens}")
        self.max_reasoning_tokens = max_reasoning_tokens
        self.reasoning_tokens = (
            ReasoningTokens.of(ReasoningMarkers(*reasoning_markers), model.tokenizer.hf)
            if reasoning_markers
            else model.tokenizer.reasoning_tokens
        )
        # The JSON format the output follows (beside tools: the text answer's), which the prompt describes.
        self.json_spec = self.answer_spec or (self.spec if self.spec.kind in JSON_KINDS else None)
        if schema_in_prompt and self.json_spec is None:
            raise ValueError(f"schema_in_prompt needs a JSON Schema or json_object constraint, not {self.spec.kind}")
        self.schema_in_prompt = self.json_spec is not None and (
            SCHEMA_IN_PROMPT if schema_in_prompt is None else bool(schema_in_prompt)
        )

    def _admits_only_empty_output(self) -> bool:
        """True when the first mask allows end-of-sequence ids alone (regex "", choices [""], a Lark
        `start: ""`): a constraint that cannot have been meant, refused rather than answered with ""."""
        words = np.zeros((1, self.matcher.words), np.int32)
        self.matcher.fill_next_token_bitmask(words)
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        return set(allowed.tolist()) <= set(self.tokenizer_info.eos_ids)

    @property
    def enforcement(self) -> tuple[KeywordEnforcement, ...]:
        """How each keyword of the schema is enforced: by the grammar, by validate-and-rollback, or
        not at all (lenient mode); see `guided.enforcement`. () for non-JSON constraints."""
        return enforcement(self.compiled)

    @property
    def bitmask(self) -> TokenBitmask:
        """This session's bitmask buffers ([max_draft + 1, words] int32, two of them), allocated on
        first use, so on the thread that generates (the server builds sessions on request threads)."""
        if self._bitmask is None:
            self._bitmask = TokenBitmask(self.model.vocab_size, batch=self.max_draft + 1)
        return self._bitmask

    # -- generation ---------------------------------------------------------------------------------

    def prompt(self, prompt, chat_template: bool = True):
        """`prompt` with the schema's description when `schema_in_prompt` is on (`guided.prompt.
        describe_in_prompt`); token ids and other prompts are unchanged."""
        return describe_in_prompt(self, prompt, chat_template)

    def plan(self, prompt_ids: list[int], chat_template_kwargs: dict | None = None) -> ReasoningPlan | None:
        """The reasoning plan of a generation from `prompt_ids` (see `runtime.reasoning.plan_reasoning`):
        None when the model does not think, the template variables turn thinking off, or the
        prompt closed the block."""
        return plan_reasoning(self.reasoning_tokens, prompt_ids, chat_template_kwargs, self.max_reasoning_tokens)

    def strategy(
        self,
        sampling: SamplingParams | None = None,
        logprobs: bool = False,
        reasoning: ReasoningPlan | None = None,
        shared_bitmask: bool = True,
    ) -> ConstrainedDecodingStrategy:
        """A fresh `ConstrainedDecodingStrategy` for one generation; `reasoning`: its plan (`plan()`),
        None for no reasoning block. It fills this session's bitmask, which serves one generation at
        a time; `shared_bitmask=False` gives it buffers of its own, for generations of one session
        that run at once (rows of one batch)."""
        tracker = self.tracker()
        return ConstrainedDecodingStrategy(
            self.compiled,
            sampling,
            bitmask=self.bitmask if shared_bitmask else None,
            jump_forward=self.jump_forward,
            want_logprobs=logprobs,
            max_draft=self.max_draft,
            reasoning=reasoning,
            max_retries=self.max_retries,
            tracker=tracker,
            checker=self.call_checker(tracker),
        )

    def tracker(self) -> CallTracker | None:
        """A fresh `CallTracker` for one generation under `tools=` (None otherwise)."""
        if self.tools is None:
            return None
        decode = self.tokenizer_info.ll_tokenizer.decode_bytes
        return CallTracker(self.compiled.matcher(), lambda t: decode([t]), self.tools)

    def call_checker(self, tracker: CallTracker | None) -> CallChecker | None:
        """Validate-and-rollback inside the calls of one generation, whose `tracker` it reads (see
        `guided.callcheck`); None when the grammar enforces every tool's parameters whole."""
        if tracker is None or not self.call_plans:
            return None
        return CallChecker(self.call_plans, tracker, generic=self.tools.fmt == "generic")

    def tool_prompt(self, prompt):
        """`prompt` as the tool format's template needs it (`ToolConstraint.prompt`: the generic
        format's system message, Phi-4-mini's system `tools` field); else `prompt` unchanged."""
        return self.tools.prompt(prompt) if self.tools is not None else prompt

    def stream(
        self, prompt, *, max_tokens: int = 256, sampling: SamplingParams | None = None, **kwargs
    ) -> Iterator[Delta]:
        """Stream `runtime.Delta`s; the last one has `finish_reason` and a `GuidedResult` in `.result`.

        prompt: text, chat messages or token ids (as `Model.stream`). Sampling is `sampling`, or
        built from keyword fields of `SamplingParams` (`temperature=`, `top_p=`, `seed=`,
        `frequency_penalty=`, ...; greedy by default). Other keyword arguments go to `Model.stream`
        (e.g. `tools`, `cancel`, `prompt_cache`, `chat_template`, `logprobs`, `speculative`, `stop`,
        `chat_template_kwargs`). Raises ValueError for bad parameters (also for sampling= beside
        sampling fields).
        """
        fields = {k: kwargs.pop(k) for k in list(kwargs) if k in SamplingParams.__dataclass_fields__}
        if sampling is not None and fields:
            raise ValueError(f"give either sampling= or sampling fields ({', '.join(fields)}), not both")
        sampling = sampling or SamplingParams(**fields)
        kwargs.setdefault("speculative", self.speculative)
        template = {k: kwargs.pop(k) for k in ("chat_template", "tools", "chat_template_kwargs") if k in kwargs}
        rendered = render_prompt(self.model, self, prompt, **template)
        strategy = self.strategy(sampling, kwargs.get("logprobs", False), rendered.reasoning)
        for delta in self.model.stream(
            rendered.ids, strategy=strategy, sampling=sampling, max_tokens=max_tokens, **kwargs
        ):
            if delta.result is not None:
                delta.result = self.verdict(delta.result, strategy)
            yield delta

    def generate(self, prompt, **kwargs) -> GuidedResult:
        """Run one constrained generation to the end; arguments as `stream`. Returns a `GuidedResult`."""
        for delta in self.stream(prompt, **kwargs):
            if delta.result is not None:
                return delta.result
        raise AssertionError("stream ended without a result")

    def _accepts(self, text: str) -> bool:
        """Whether the grammar matches `text` whole (tokenized afresh: the grammar is over bytes)."""
        matcher = self.compiled.matcher()
        return matcher.accept_tokens(self.model.tokenizer.encode(text, add_special_tokens=False)) and (
            matcher.is_accepting()
        )

    def verdict(self, result: GenerationResult, strategy: ConstrainedDecodingStrategy) -> GuidedResult:
        """The grammar's and the final check's verdict on a generation `strategy` (from `strategy()`)
        drove, in this loop or another (the server's batch). An output that ended "stop" but is not valid
        (a stop string cut what the grammar still required; the final check failed) is reported
        with finish_reason "error": never invalid output presented as a normal stop."""
        complete = result.finish_reason == "stop" and strategy.complete
        reasoning = None
        if strategy.gate.reasoned:
            reasoning, answer = strategy.gate.plan.split(result.text)
            reasoning = reasoning.strip() if reasoning is not None else None
            result = GenerationResult(**dict(vars(result), text=answer))
        if complete and result.stop_string is not None:
            # The grammar accepted the tokens; the stop string cut their text. Valid only if the grammar
            # accepts what is left.
            complete = self._accepts(result.text)
        errors: list[str] = []
        if result.finish_reason == "error":
            errors.append(result.error or strategy.error or "grammar engine error")
        elif result.finish_reason == "stop" and not complete:
            errors.append("incomplete: a stop string ended the output before its grammar was complete")
        elif not complete:
            errors.append(f"incomplete: generation ended ({result.finish_reason}) before the grammar was complete")
        value = None
        try:
            if complete and self.spec.kind in JSON_KINDS:
                value, json_errors = check_json(result.text, self.spec.schema)
                errors += json_errors
            if complete and self.check is not None:
                errors += self.check(result.text)
        except Exception as exc:  # noqa: BLE001 - an output that cannot be checked is not valid
            errors.append(f"the final check failed: {type(exc).__name__}: {exc}")
        calls, content = [], None
        if self.tools is not None:
            calls, content = self._tool_reply(result, strategy, reasoning is not None)
            if complete:
                schemas = {t.name: t.parameters for t in self.tools.tools}
                errors += [f"{c.name}: {e}" for c in calls for e in check_json(c.arguments, schemas[c.name])[1]]
                if self.answer_spec is not None and not calls:
                    value, answer_errors = check_json(content or "", self.answer_spec.schema)
                    errors += answer_errors
        parsed = None
        if self.model_class is not None and complete and not errors and not calls:  # calls: no answer
            try:
                parsed = self.model_class.model_validate(value)
            except ValueError as exc:  # pydantic's ValidationError: a constraint JSON Schema cannot express
                errors.append(f"pydantic: {exc}")
        fields = vars(result)
        if result.finish_reason == "stop" and errors:
            fields = dict(fields, finish_reason="error", error="; ".join(errors))
        return GuidedResult(
            **fields,
            value=value,
            complete=complete,
            valid=complete and not errors,
            errors=errors,
            stats=strategy.stats,
            not_enforced=self.compiled.not_enforced,
            compile_seconds=self.compiled.compile_seconds,
            reasoning=reasoning,
            parsed=parsed,
            tool_calls=calls,
            content=content,
        )

    def _tool_reply(self, result: GenerationResult, strategy, reasoned: bool) -> tuple[list[ToolCall], str | None]:
        """The calls and the text answer of a tools generation (`result.text` is the answer)."""
        tracker = strategy.tracker
        kept = len(result.token_ids) - (tracker.start or 0) if tracker.start is not None else 0
        calls, response = tracker.result(kept)
        if response is not None:  # the generic envelope's text answer
            return calls, response
        content = "".join(text for label, text in result.parts if label is None)
        if reasoned:
            content = strategy.gate.plan.split(content)[1]
        content = content.strip() if calls else content
        return calls, content or None

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

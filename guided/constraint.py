"""`Constraint`: what a guided generation is held to, compiled once and shared.

Everything here is fixed when the constraint is built and never changes after (the line xgrammar
draws between a compiled grammar and a matcher): the spec, the compiled grammar, the tool
constraint with its call plans, the answer format beside tools, the final check, the reasoning
markers and budget, and the decoding options every generation under it uses. It is safe to share
between threads and requests; each generation gets its own state, a `guided.generation.Generation`
of it (strategy, matcher, call tracker, checker, verdict), which knows the constraint and not the
other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import numpy as np

from guided.cache import GrammarCache, default_cache
from guided.enforcement import ROLLBACK, KeywordEnforcement, enforcement
from guided.errors import GrammarError
from guided.schema.pointer import parse_pointer, pointer
from guided.schema_prompt import SCHEMA_HINT_BUDGET, SCHEMA_IN_PROMPT
from guided.spec import JSON_KINDS, make_spec
from guided.tokenizer_info import get_tokenizer_info
from guided.tools.answer import answer_schema, answer_spec, checked_answer
from guided.tools.calls import CallTracker
from guided.tools.check import CallChecker, call_plans
from guided.tools.constraint import ToolConstraint, tool_constraint
from runtime.errors import ParameterError
from runtime.reasoning import ReasoningMarkers, ReasoningPlan, ReasoningTokens, plan_reasoning


class Constraint:
    """A compiled constraint on `model`'s output: exactly one of

    schema: a JSON Schema (dict, JSON text, file path or pydantic model class);
    json_object: True for any JSON object;
    regex: a regular expression for the whole output;
    choices: a list of strings, the output is one of them;
    grammar: Lark (also with llama.cpp's `%llguidance {}` line) or GBNF text, or a .lark/.gbnf path;
    tools: functions the model may call (see `guided.tools.definitions`: OpenAI or Responses function
        definitions, pydantic model classes, typed Python functions), with tool_choice ("auto",
        "required", "none" or {"type": "function", "function": {"name": ...}}),
        parallel_tool_calls (True) and tool_format (None: detected from the chat template, else one
        of `guided.tools.formats.FORMATS`: "hermes", "llama3", "mistral", "mistral_names", "phi4",
        "glm45", "kimi_k2", "lfm2", "pythonic", "qwen3_coder", "generic"). The result has
        `tool_calls` and `content`. A schema or json_object beside tools is the text answer's format
        (OpenAI's response_format with tools): under "auto" the reply is calls or that JSON
        (`content`, `value`), under "none" the JSON, under "required" / a named function calls only.
        excluded_calls: tool name -> argument objects the calls must not repeat (the loop guard,
        `guided.tools.loop_guard`: the grammar excludes them; the prompt shows the tools as given).
        end_at_repeated_call (False): end the reply at its first call identical (name and arguments)
        to an earlier call of it, which is left out (the loop guard within a reply: a small model's
        doom loop writes one call until the budget ends; off, a question asking for the same call
        twice gets two, as BFCL's parallel_158 does).

    Options: whitespace (None: `guided.spec.DEFAULT_WHITESPACE`, "pretty"; "compact", "any"; the
    older any_whitespace=True/False means "any"/"compact"), strict (True), lenient (False): see `guided.spec`.
    jump_forward (True): append grammar-forced tokens without sampling.
    max_draft (32): the longest speculative draft (the bitmask has max_draft + 1 rows, 19 KB each for Qwen).
    max_retries (8): validate-and-rollback retries per generation, for keywords the grammar cannot
        express (`compiled.validated`, see `guided.checker`; in tool calls `guided.tools.check`); past it
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
        True for a regex, choices or grammar constraint raises ParameterError (there is no schema).
    schema_hint_budget (None: `guided.schema_prompt.SCHEMA_HINT_BUDGET`, 400): the description's
        tokens at most; a longer one says large enums by their size and a few members, then leaves
        the last keys to the grammar (which enforces all of them either way).

    It is immutable once built and shared between threads; each generation gets its own state,
    `guided.Generation(constraint, ...)`.

    Raises SchemaError (pointer), UnsupportedSchemaFeature (keyword, pointer), GrammarError (also
    for a constraint that admits only the empty output), ParameterError (bad options).
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
        excluded_calls: dict[str, list[dict]] | None = None,
        end_at_repeated_call: bool = False,
        whitespace: str | None = None,
        any_whitespace: bool | None = None,
        strict: bool = True,
        lenient: bool = False,
        jump_forward: bool = True,
        max_draft: int = 32,
        max_retries: int = 8,
        check: Callable[[str], list[str]] | None = None,
        max_reasoning_tokens: int = 1024,
        reasoning_markers: tuple[str, str] | None = None,
        cache: GrammarCache | None = None,
        schema_in_prompt: bool | None = None,
        schema_hint_budget: int | None = None,
    ):
        if max_retries < 0:
            raise ParameterError(f"max_retries must be >= 0, got {max_retries}", "max_retries")
        if schema_hint_budget is not None and (isinstance(schema_hint_budget, bool) or schema_hint_budget < 1):
            raise ParameterError(
                f"schema_hint_budget must be >= 1 token, got {schema_hint_budget}", "schema_hint_budget"
            )
        if max_reasoning_tokens < 1:
            raise ParameterError(
                f"max_reasoning_tokens must be >= 1, got {max_reasoning_tokens}", "max_reasoning_tokens"
            )
        cache = cache or default_cache
        self.model = model
        self.tokenizer_info = get_tokenizer_info(model.tokenizer.hf, model.vocab_size, model.tokenizer.eos_ids)
        self.tools: ToolConstraint | None = None
        self.call_plans = {}  # tool name -> the `CheckPlan` validate-and-rollback checks its calls with
        self.answer_spec = None  # beside tools: the JSON answer's spec (a response format), for the verdict
        self.model_class = schema if isinstance(schema, type) and hasattr(schema, "model_validate") else None
        options: dict[str, Any] = dict(
            whitespace=whitespace, any_whitespace=any_whitespace, strict=strict, lenient=lenient
        )
        if tools is not None:
            answer = answer_spec(schema, json_object, (regex, choices, grammar), **options)
            hf, ll = model.tokenizer.hf, self.tokenizer_info.ll_tokenizer
            self.tools = tool_constraint(
                tools,
                tool_choice,
                parallel_tool_calls,
                tool_format,
                hf,
                ll,
                answer=answer_schema(answer),
                excluded_calls=excluded_calls,
                end_at_repeat=end_at_repeated_call,
            )
            self.call_plans = call_plans(self.tools, self.tokenizer_info, cache)
            self.answer_spec = checked_answer(answer, self.tools, self.tokenizer_info, cache)
            grammar, schema, json_object = self.tools.grammar, None, False
        self.spec = make_spec(
            schema=schema, json_object=json_object, regex=regex, choices=choices, grammar=grammar, **options
        )
        self.compiled = cache.get(self.spec, self.tokenizer_info)
        if self._admits_only_empty_output():
            raise GrammarError(f"the {self.spec.kind} constraint admits only the empty output: nothing to generate")
        self.jump_forward, self.max_draft, self.max_retries, self.check = jump_forward, max_draft, max_retries, check
        self.max_reasoning_tokens = max_reasoning_tokens
        self.reasoning_tokens = (
            ReasoningTokens.of(ReasoningMarkers(*reasoning_markers), model.tokenizer.hf)
            if reasoning_markers
            else model.tokenizer.reasoning_tokens
        )
        # The JSON format the output follows (beside tools: the text answer's), which the prompt describes.
        self.json_spec = self.answer_spec or (self.spec if self.spec.kind in JSON_KINDS else None)
        if schema_in_prompt and self.json_spec is None:
            raise ParameterError(
                f"schema_in_prompt needs a JSON Schema or json_object constraint, not {self.spec.kind}",
                "schema_in_prompt",
            )
        self.schema_in_prompt = self.json_spec is not None and (
            SCHEMA_IN_PROMPT if schema_in_prompt is None else bool(schema_in_prompt)
        )
        self.schema_hint_budget = SCHEMA_HINT_BUDGET if schema_hint_budget is None else schema_hint_budget

    def _admits_only_empty_output(self) -> bool:
        """True when the first mask allows end-of-sequence ids alone (regex "", choices [""], a Lark
        `start: ""`): a constraint that cannot have been meant, refused rather than answered with ""."""
        matcher = self.compiled.matcher()
        words = np.zeros((1, matcher.words), np.int32)
        matcher.fill_next_token_bitmask(words)
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        return set(allowed.tolist()) <= set(self.tokenizer_info.eos_ids)

    @property
    def tool_mode(self) -> str | None:
        """ "auto", "required" (also a named function), "none" under tools= (how a reply maps the
        output to calls), None without tools."""
        return self.tools.mode if self.tools is not None else None

    @cached_property  # the constraint never changes: one walk of its schema, not one per request
    def enforcement(self) -> tuple[KeywordEnforcement, ...]:
        """How each keyword of the schema is enforced: by the grammar, by validate-and-rollback, or
        not at all (lenient mode); see `guided.enforcement`. () for non-JSON constraints."""
        return enforcement(self.compiled)

    @cached_property
    def report(self) -> tuple[KeywordEnforcement, ...]:
        """The enforcement report of everything this constraint holds the output to: `enforcement`,
        then under tools the keywords validate-and-rollback checks inside each tool's calls (the
        others the grammar enforces), each naming its tool. Every front end shows this one report
        (the server's `x-coreai-enforcement` header, `coreai generate -v`, `Outcome.enforcement`)."""
        in_calls = tuple(
            KeywordEnforcement(parse_pointer(at)[-1], at, ROLLBACK, name)
            for name, plan in self.call_plans.items()
            for at in sorted(pointer(path) for path in plan.keyword_paths)
        )
        return self.enforcement + in_calls

    def plan(self, prompt_ids: list[int], chat_template_kwargs: dict | None = None) -> ReasoningPlan | None:
        """The reasoning plan of a generation from `prompt_ids` (see `runtime.reasoning.plan_reasoning`):
        None when the model does not think, the template variables turn thinking off, or the
        prompt closed the block."""
        return plan_reasoning(self.reasoning_tokens, prompt_ids, chat_template_kwargs, self.max_reasoning_tokens)

    def tracker(self) -> CallTracker | None:
        """A fresh `CallTracker` for one generation under `tools=` (None otherwise)."""
        if self.tools is None:
            return None
        decode = self.tokenizer_info.ll_tokenizer.decode_bytes
        return CallTracker(self.compiled.matcher(), lambda t: decode([t]), self.tools)

    def call_checker(self, tracker: CallTracker | None) -> CallChecker | None:
        """Validate-and-rollback inside the calls of one generation, whose `tracker` it reads (see
        `guided.tools.check`); None when the grammar enforces every tool's parameters whole."""
        if tracker is None or not self.call_plans:
            return None
        assert self.tools is not None  # call plans exist only with tools
        return CallChecker(self.call_plans, tracker, generic=self.tools.fmt == "generic")

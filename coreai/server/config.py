"""`ServerConfig`: the server's settings and their defaults, the one source of both (`coreai serve`
reads its defaults from here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from guided import WHITESPACES
from runtime import SamplingParams
from runtime.errors import ParameterError
from runtime.sampling import check_max_tokens

if TYPE_CHECKING:
    from coreai.service import Settings


@dataclass
class ServerConfig:
    """Server settings.

    model_name: the id clients send as `model` (default: the model's name).
    aliases: other names clients may send as `model` for the served model, each `NAME` or
        `NAME=MODEL` (MODEL: the served name, checked at start); NAME may be a glob (`claude-*`,
        fnmatch's, case-sensitive), so an agent's fixed model ids (Claude Code's main and small
        models) reach the served model. Replies name the model the request asked for.
    api_key: required as `Authorization: Bearer <key>` (or `x-api-key`) on every route but the open
        ones (`coreai.server.trust.OPEN_PATHS`) when set; api_keys: more keys, any one of them will do.
    allowed_hosts: names (or addresses) the `Host` header may carry beside the loopback ones and the
        address a request arrived at (`coreai.server.trust`); "*" allows any (unsafe: DNS rebinding).
    cors_origins: browser origins (`http://host:port`) allowed to call the server (CORS; none by
        default); "*" allows any.
    max_kv_bytes: the KV-cache bytes the running generations may take together at most
        (`coreai.service.memory`); a request that does not fit waits, one that never could is a
        400. None: from the machine's memory (`memory.default_max_kv_bytes`).
    max_tokens: the default and the upper bound of a request's completion tokens (>= 1).
    temperature: the default sampling temperature.
    repetition_penalty: the default repetition penalty (`runtime.sampling.SamplingParams`: > 0, 1 is
        none, over the last 64 tokens), or None (none). A request's own value overrides it; llama.cpp's
        `--repeat-penalty`. It helps a small model that loops inside a tool call's arguments, and costs
        right calls where a reply repeats on purpose (parallel calls: docs/reports/bfcl.md).
    max_queue: requests allowed to wait while `max_batch` run; more get 429 (>= 0).
    max_batch: requests decoding together in one batch (continuous batching, see `runtime.batch`; >= 1).
    prompt_cache_bytes: bound of the prefix cache (KV caches of earlier prompts and replies, LRU), in
        bytes; 0 turns it off.
    prompt_cache_dir: a folder where the prefix cache's newest entries are written when the server
        stops and read back when it starts (mlx-lm's prompt-cache files: `coreai.service.prefix_store`),
        so a restarted server does not prefill an agent's prompt again; None: not kept.
    max_body_bytes: request bodies above this get 413 (>= 1).
    speculative: speculative decoding for every request ("prompt_lookup", "draft" with the model's
        draft model, or None); the output does not change, only its speed.
    grammar_journal: a folder where compiled grammars are recorded, and compiled again in the
        background at start-up (`guided.journal`), or None.
    shutdown_timeout: seconds requests still running at shutdown (Ctrl-C) get to finish before they
        are cancelled (>= 0).
    schema_in_prompt: the schema of a JSON `response_format` / `structured_outputs.json` said in words
        at the start of the system message (`ConstrainedSession.prompt`); None: the session's default
        (`guided.schema_prompt.SCHEMA_IN_PROMPT`). A request's `schema_in_prompt` overrides it.
    schema_hint_budget: the tokens that description may take at most (None: the session's,
        `guided.schema_prompt.SCHEMA_HINT_BUDGET`); a request's `schema_hint_budget` overrides it.
    whitespace: the JSON layout of `response_format` / `structured_outputs.json` answers, one of
        `guided.spec.WHITESPACES` ("pretty", "compact", "any"); None: the session's default
        (`guided.spec.DEFAULT_WHITESPACE`).

    loop_guard: a tool call identical (name and arguments) to one the conversation already answered
        is excluded by the grammar, so a small model that loops must answer or call something new
        (`guided.tools.loop_guard`), and a reply ends at its first call repeating an earlier one of
        the same reply, which is not sent; off by default.
    strip_markers: agent clients' volatile prompt markers (Claude Code's billing line, ...) are
        removed before the prompt is rendered, so sessions share the KV cache of their long prefix
        (`coreai.service.markers`); each removal is named in `x-coreai-ignored`. On by default.

    Raises `runtime.errors.ParameterError` (a ValueError naming the field in `param`) for a setting
    out of range, the sampling defaults included.
    """

    model_name: str | None = None
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    api_keys: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    max_kv_bytes: int | None = None
    max_tokens: int = 1024
    temperature: float = 0.7
    repetition_penalty: float | None = None
    max_queue: int = 16
    max_batch: int = 8
    prompt_cache_bytes: int = 1 << 30
    prompt_cache_dir: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    speculative: str | None = "prompt_lookup"
    grammar_journal: str | None = None
    shutdown_timeout: float = 5.0
    schema_in_prompt: bool | None = None
    schema_hint_budget: int | None = None
    whitespace: str | None = None
    loop_guard: bool = False
    strip_markers: bool = True

    def settings(self) -> Settings:
        """What the generation service gives every request where it says nothing."""
        from coreai.service import Settings  # here: the command line reads this module without the service

        return Settings(
            whitespace=self.whitespace,
            schema_in_prompt=self.schema_in_prompt,
            schema_hint_budget=self.schema_hint_budget,
            sampling=self.sampling(),
            max_tokens=self.max_tokens,
            max_tokens_limit=self.max_tokens,
            speculative=self.speculative,
            loop_guard=self.loop_guard,
            strip_markers=self.strip_markers,
        )

    def sampling(self) -> dict:
        """The sampling defaults (`runtime.SamplingParams` fields) of a request that leaves them out."""
        penalty = {} if self.repetition_penalty is None else {"repetition_penalty": self.repetition_penalty}
        return {"temperature": self.temperature, **penalty}

    def keys(self) -> tuple[str, ...]:
        """Every API key the server accepts (none: no key needed)."""
        return tuple(k for k in (self.api_key, *self.api_keys) if k)

    def __post_init__(self):
        # The defaults go through the checks a request's values go through: out of range, every
        # request leaving the field out would be refused with a 400 blaming the client.
        SamplingParams(**self.sampling())
        check_max_tokens(self.max_tokens)
        bounds = (
            ("max_queue", 0),
            ("max_batch", 1),
            ("prompt_cache_bytes", 0),
            ("max_body_bytes", 1),  # else every request would get 413
            ("shutdown_timeout", 0),
        )
        for name, least in bounds:
            if not getattr(self, name) >= least:
                raise ParameterError(f"{name} must be >= {least}, got {getattr(self, name)!r}", name)
        if self.max_kv_bytes is not None and not self.max_kv_bytes >= 1:
            raise ParameterError(f"max_kv_bytes must be >= 1, got {self.max_kv_bytes!r}", "max_kv_bytes")
        if self.schema_hint_budget is not None and not self.schema_hint_budget >= 1:
            raise ParameterError(
                f"schema_hint_budget must be >= 1, got {self.schema_hint_budget!r}", "schema_hint_budget"
            )
        for alias in self.aliases:
            if not parse_alias(alias)[0]:
                raise ParameterError(f"alias must be NAME or NAME=MODEL, got {alias!r}", "aliases")
        if self.whitespace is not None and self.whitespace not in WHITESPACES:
            raise ParameterError(
                f"whitespace must be one of {', '.join(WHITESPACES)}, got {self.whitespace!r}", "whitespace"
            )


def parse_alias(text: str) -> tuple[str, str | None]:
    """(NAME, MODEL or None) of an `aliases` entry `NAME` or `NAME=MODEL`."""
    name, _, model = text.partition("=")
    return name.strip(), model.strip() or None

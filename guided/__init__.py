"""Guided (grammar-constrained) generation: JSON Schema, regex, choices, Lark and GBNF compiled with
llguidance, token bitmasks filled in place in MLX memory, and a decoding strategy with jump-forward,
rollback and EOS gating, in the shape of xgrammar and llguidance: a schema or grammar is compiled
into a `Constraint` (once, shared), each generation under it is a `Generation` (matcher, bitmask,
strategy, verdict), and its meaning an `Outcome`. No HTTP, request bodies or dialects live here
(requests, jobs and `coreai.ConstrainedSession` are `coreai`'s); the tool definitions it reads are
OpenAI's function shapes (chat and Responses), the common ground of the chat templates."""

import runtime  # noqa: F401 - first: sets up the system BLAS before mlx.core loads (runtime.blas)
from guided.bitmask import TokenBitmask, apply_token_bitmask
from guided.cache import CacheStats, GrammarCache, default_cache
from guided.compiler import CompiledGrammar, GrammarBackend, LLGuidanceBackend, NotEnforced, compile_grammar
from guided.constraint import Constraint
from guided.enforcement import GRAMMAR, KeywordEnforcement, enforcement, summary
from guided.errors import GrammarError, SchemaError, UnsatisfiableSchema, UnsupportedSchemaFeature
from guided.generation import Generation
from guided.journal import GrammarJournal
from guided.matcher import GrammarMatcher
from guided.outcome import Outcome, free_outcome
from guided.prompt import describe_in_prompt, render_prompt
from guided.result import GuidedResult
from guided.spec import DEFAULT_WHITESPACE, WHITESPACES, GrammarSpec, make_spec
from guided.strategy import ConstrainedDecodingStrategy, GuidedStats
from guided.tokenizer_info import TokenizerInfo, build_tokenizer_info, get_tokenizer_info
from guided.validation import check_json

__all__ = [
    "CacheStats",
    "CompiledGrammar",
    "ConstrainedDecodingStrategy",
    "Constraint",
    "DEFAULT_WHITESPACE",
    "GRAMMAR",
    "Generation",
    "GrammarBackend",
    "GrammarCache",
    "GrammarError",
    "GrammarJournal",
    "GrammarMatcher",
    "GrammarSpec",
    "GuidedResult",
    "GuidedStats",
    "KeywordEnforcement",
    "LLGuidanceBackend",
    "NotEnforced",
    "Outcome",
    "SchemaError",
    "TokenBitmask",
    "TokenizerInfo",
    "UnsatisfiableSchema",
    "UnsupportedSchemaFeature",
    "WHITESPACES",
    "apply_token_bitmask",
    "build_tokenizer_info",
    "check_json",
    "compile_grammar",
    "default_cache",
    "describe_in_prompt",
    "enforcement",
    "free_outcome",
    "get_tokenizer_info",
    "make_spec",
    "render_prompt",
    "summary",
]

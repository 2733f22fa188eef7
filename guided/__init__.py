"""Guided (grammar-constrained) generation: JSON Schema, regex, choices, Lark and GBNF compiled with
llguidance, token bitmasks filled in place in MLX memory, and a decoding strategy with jump-forward,
rollback and EOS gating. `ConstrainedSession` is the entry point; underneath it a `Constraint` is
compiled once and shared, each generation is a `Generation`, and its meaning an `Outcome`."""

import runtime  # noqa: F401 - first: sets up the system BLAS before mlx.core loads (runtime.blas)
from guided.bitmask import TokenBitmask, apply_token_bitmask
from guided.cache import CacheStats, GrammarCache, default_cache
from guided.compiler import CompiledGrammar, GrammarBackend, LLGuidanceBackend, NotEnforced, compile_grammar
from guided.constraint import Constraint
from guided.errors import GrammarError, SchemaError, UnsatisfiableSchema, UnsupportedSchemaFeature
from guided.generation import Generation
from guided.matcher import GrammarMatcher
from guided.outcome import Outcome, free_outcome
from guided.result import GuidedResult
from guided.session import ConstrainedSession
from guided.spec import GrammarSpec, make_spec
from guided.strategy import ConstrainedDecodingStrategy, GuidedStats
from guided.tokenizer_info import TokenizerInfo, build_tokenizer_info, get_tokenizer_info
from guided.validation import check_json

__all__ = [
    "CacheStats",
    "CompiledGrammar",
    "ConstrainedDecodingStrategy",
    "ConstrainedSession",
    "Constraint",
    "Generation",
    "GrammarBackend",
    "GrammarCache",
    "GrammarError",
    "GrammarMatcher",
    "GrammarSpec",
    "GuidedResult",
    "GuidedStats",
    "LLGuidanceBackend",
    "NotEnforced",
    "Outcome",
    "SchemaError",
    "TokenBitmask",
    "TokenizerInfo",
    "UnsatisfiableSchema",
    "UnsupportedSchemaFeature",
    "apply_token_bitmask",
    "build_tokenizer_info",
    "check_json",
    "compile_grammar",
    "default_cache",
    "free_outcome",
    "get_tokenizer_info",
    "make_spec",
]

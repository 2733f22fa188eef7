"""Compile a `GrammarSpec` for one tokenizer with llguidance, bounded by parser limits, and turn the
engine's refusals into our errors: `UnsupportedSchemaFeature` (keyword + JSON pointer) for schema
keywords it cannot enforce, `GrammarError` for bad regex / Lark / limits.

llguidance reports an unenforceable keyword as a message without a location ("Unimplemented keys:
["not"]", "Unknown format: foo", a regex parse error, ...); `locate` finds the keyword's pointer in
the schema. Source of the engine's behaviour: llguidance docs/json_schema.md (supported keywords,
`lenient`), llguidance `LLParserLimits` (compile and per-step bounds).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Protocol

from llguidance import LLMatcher, LLParserLimits

from guided.checker import CheckPlan
from guided.errors import GrammarError, SchemaError, UnsatisfiableSchema, UnsupportedSchemaFeature
from guided.matcher import GrammarMatcher
from guided.productive import check_ends
from guided.schema.pointer import get, local_ref, parse_pointer, path_of, pointer
from guided.schema.rewrite import close_objects
from guided.schema.walk import keyword_paths, nodes
from guided.spec import JSON_KINDS, GrammarSpec
from guided.tokenizer_info import TokenizerInfo
from guided.validation import can_validate


def default_limits() -> LLParserLimits:
    """llguidance's default bounds (lexer fuel 1M at compile, 200k per mask step; 50k Earley items per
    step; 250k lexer states; 500k grammar symbols), with short error messages: verbose ones dump the
    parser state and the whole grammar."""
    return LLParserLimits(verbose_errors=False)


@dataclass(frozen=True)
class NotEnforced:
    """A schema keyword compiled away in lenient mode: `keyword` at JSON `pointer`, and the engine's `message`."""

    keyword: str
    pointer: str
    message: str


@dataclass
class CompiledGrammar:
    """A grammar compiled for one tokenizer. Shared between threads and generations (read-only);
    each generation gets its own `GrammarMatcher` from `matcher()`.

    spec: the spec the engine compiled (with validate-and-rollback: the schema's lenient variant,
    where the engine leaves out what it cannot express).

    compile_seconds: wall time of the compile (s). validated: keywords the grammar leaves out and the
    decoder enforces by validate-and-rollback (`checks` says how; see `guided.checker`).
    not_enforced: lenient-mode gaps, keywords enforced by neither (empty otherwise).
    warnings: other engine warnings (text).
    """

    spec: GrammarSpec
    tokenizer: TokenizerInfo
    template: LLMatcher
    not_enforced: tuple[NotEnforced, ...] = ()
    warnings: tuple[str, ...] = ()
    compile_seconds: float = 0.0
    validated: tuple[NotEnforced, ...] = ()
    checks: CheckPlan | None = None

    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the grammar's start (a copy of the compiled template: microseconds)."""
        return GrammarMatcher(self.template, self.tokenizer)


def _bad_patterns(schema):
    """Paths of `pattern` values and `patternProperties` keys llguidance cannot compile on their own
    (anywhere in the document: schemas sometimes hide subschemas under non-standard keys)."""
    for path, sub in nodes(schema):
        if not isinstance(sub, dict):
            continue
        candidates = [(path + ("pattern",), sub.get("pattern"))]
        if isinstance(sub.get("patternProperties"), dict):
            candidates += [(path + ("patternProperties", k), k) for k in sub["patternProperties"]]
        for where, regex in candidates:
            if isinstance(regex, str):
                grammar = LLMatcher.grammar_from_json_schema({"type": "string", "pattern": regex})
                if LLMatcher.validate_grammar(grammar):
                    yield where


def locate(schema, message: str) -> list[tuple[str, str]]:
    """[(keyword, JSON pointer)] that an llguidance schema message is about; [("", "")] if unknown."""
    found: list[tuple[str, tuple]] = []
    if m := re.search(r"Unimplemented keys: (\[.*?\])", message):
        for kw in json.loads(m.group(1)):
            found += [(kw, p) for p in keyword_paths(schema, kw)]
    elif m := re.search(r"(?:Unknown|Unimplemented|Unsupported) format: (.*)", message):
        found += [("format", p) for p in keyword_paths(schema, "format", m.group(1).strip())]
    elif "oneOf" in message:
        found += [("oneOf", p) for p in keyword_paths(schema, "oneOf")]
    elif "min/maxProperties" in message:
        found += [(kw, p) for kw in ("minProperties", "maxProperties") for p in keyword_paths(schema, kw)]
    elif "patternProperty" in message:
        found += [("patternProperties", p) for p in keyword_paths(schema, "patternProperties")]
    elif "regex" in message or "lookaround" in message:
        found += [(p[-1] if p[-1] == "pattern" else "patternProperties", p) for p in _bad_patterns(schema)]
        found = found or [("pattern", p) for p in keyword_paths(schema, "pattern")]  # a combination fails
    elif "intersection" in message:
        found += [("allOf", p) for p in keyword_paths(schema, "allOf")]
    elif any(w in message for w in ("Resource", "Pointer", "$ref", "references")):
        refs = [(p, get(schema, p)) for p in keyword_paths(schema, "$ref")]
        # the message names the resolved URI; a relative ref is a suffix of it, a remote one is not local
        found += [("$ref", p) for p, ref in refs if str(ref) in message] or [
            ("$ref", p) for p, ref in refs if not str(ref).startswith("#")
        ][:1]
    return [(kw, pointer(p)) for kw, p in found] or [("", "")]


def _engine_error(matcher: LLMatcher) -> str:
    """The engine's error, without its verbosity marker or a panic's backtrace."""
    message = matcher.get_error().replace("<non-verbose/>", "").split("<backtrace>")[0]
    return message.removeprefix("panic: ").strip()


# Engine messages that mean a limit was exceeded (llguidance `LLParserLimits`, its grammar builder's
# symbol ids, serde_json's recursion limit, the regex crate's size limits) -> what to tell the user.
_LIMITS = (
    ("u16::MAX", "limit of 65,535 grammar symbols (fewer choices, alternatives or properties)"),
    ("number of symbols) too big", "grammar size limit (symbols)"),
    ("lexer configuration (grammar) too big", "lexer size limit (too many or too large strings, enums or patterns)"),
    ("schema too large", "schema size limit"),
    ("Too many items", "limit of Earley items per step"),
    ("fuel", "lexer work limit (fuel)"),
    ("too many states", "limit of lexer states"),
    ("recursion limit exceeded", "nesting depth limit"),
    ("too deeply nested", "nesting depth limit"),
    ("too many expressions", "limit of expressions"),
    ("size limit", "regex size limit"),
    ("nest limit", "regex nesting limit"),
)


def _limit(message: str) -> str | None:
    """What limit an engine message reports, or None if it is about something else."""
    return next((what for needle, what in _LIMITS if needle in message), None)


def _short(message: str, length: int = 200) -> str:
    message = " ".join(message.split())
    return message if len(message) <= length else message[:length] + "..."


def _refusal(spec: GrammarSpec, message: str) -> GrammarError | None:
    """The error for an engine message about a limit, a grammar with no finite output or a dangling
    `$ref`; None for other messages (unsupported keywords, syntax errors)."""
    is_json = spec.kind in JSON_KINDS
    if (what := _limit(message)) is not None:
        text = f"the {spec.kind} grammar is over the engine's {what}: {_short(message)}"
        return SchemaError(text) if is_json else GrammarError(text)
    if "NoExtension" in message:
        if not is_json:
            return GrammarError(
                f"the {spec.kind} grammar can produce no finite text (a rule that only refers to itself?)"
            )
        # The common cases (a $ref cycle with nothing in between) are refused earlier, with a pointer,
        # by `guided.schema.checks.check_finite`.
        return SchemaError(
            "no finite JSON value satisfies the schema: it refers to itself without ever reaching a value"
        )
    if is_json and (m := re.search(r"Pointer '([^']*)' does not exist", message)):
        refs = [
            p
            for p in keyword_paths(spec.schema, "$ref")
            if local_ref(get(spec.schema, p)) == local_ref("#" + m.group(1))
        ]
        where = pointer(refs[0]) if refs else ""
        return SchemaError(
            f"a $ref{' at ' + where if where else ''} points to {m.group(1)!r}, which does not exist in the schema",
            where,
        )
    return None


def compile_grammar(
    spec: GrammarSpec, tokenizer: TokenizerInfo, limits: LLParserLimits | None = None
) -> CompiledGrammar:
    """Compile `spec` for `tokenizer` (milliseconds for typical schemas; bounded by `limits`).

    A JSON Schema keyword the engine cannot express is enforced by validate-and-rollback when
    `jsonschema` checks it (`CompiledGrammar.validated`, `guided.checker`): the engine compiles the
    schema without it (as in lenient mode) and the decoder validates each value it governs.

    Raises UnsupportedSchemaFeature (JSON kinds, not lenient): a keyword neither the engine nor the
    validator can enforce, with its keyword and pointer (the first one when several).
    SchemaError: no JSON value satisfies the schema (e.g. `minProperties` beyond the declared
    properties under strict mode).
    SchemaError also for a schema over an engine limit (depth, size, lexer), one that refers to
    itself without reaching a value, or a dangling `$ref` (with the pointer where known).
    GrammarError: invalid regex or Lark, a grammar over the engine's limits (the message names the
    limit), one that can produce no finite text, or one with a reachable rule that never ends
    (`guided.productive`).
    """
    t0 = time.perf_counter()
    try:
        compiled = _compile(spec, tokenizer, limits)
    except UnsupportedSchemaFeature as refusal:
        # Compile the superset the engine can express; refuse only what the validator cannot check either.
        # An error here (a keyword refused even in lenient mode, no satisfying value, a limit) is what
        # really blocks the schema, not the keyword the validator would have checked.
        try:
            compiled = _compile(spec.as_lenient(), tokenizer, limits)
        except GrammarError as blocker:
            raise blocker from refusal
        # Name what nothing enforces, not the keyword the engine happened to report first (a
        # `uniqueItems` the validator checks, beside an unknown format).
        if unchecked := [n for n in compiled.not_enforced if not _can_validate(spec.schema, n)]:
            raise _unsupported(unchecked[0].keyword, unchecked[0].pointer, unchecked[0].message) from None
    if spec.kind == "lark":  # llguidance compiles a grammar with no finite output; it would never accept
        check_ends(spec.grammar)
    checked = [n for n in compiled.not_enforced if _can_validate(spec.schema, n)]
    compiled.not_enforced = tuple(n for n in compiled.not_enforced if n not in checked)
    # Numeric keywords the spec left out of the grammar (the engine would round them).
    checked += [NotEnforced(parse_pointer(p)[-1], p, _INEXACT) for p in spec.validated]
    compiled.validated = tuple(checked)
    if checked:
        paths = frozenset(path_of(spec.schema, n.pointer) for n in checked)
        compiled.checks = CheckPlan(spec.schema, paths)
    compiled.compile_seconds = time.perf_counter() - t0
    return compiled


_INEXACT = "the engine would judge this number in floating point, not as the exact decimal"


def _can_validate(schema, gap: NotEnforced) -> bool:
    """True if validate-and-rollback can enforce the keyword the engine left out (located, and checked
    by `jsonschema`; a format only if the validator knows it)."""
    if not gap.keyword or not gap.pointer:
        return False
    value = get(schema, path_of(schema, gap.pointer)) if gap.keyword == "format" else None
    return can_validate(schema, gap.keyword, value)


def _unsupported(keyword: str, where: str, message: str) -> UnsupportedSchemaFeature:
    """The refusal of `keyword` at JSON pointer `where` ("" and "" when the engine's `message` could
    not be located in the schema)."""
    where_text = f" at {where or '/'}" if keyword else ""
    return UnsupportedSchemaFeature(f"cannot enforce {keyword or 'the schema'}{where_text}: {message}", keyword, where)


def _compile(spec: GrammarSpec, tokenizer: TokenizerInfo, limits: LLParserLimits | None) -> CompiledGrammar:
    """One engine compile of `spec`; lenient-mode gaps in `not_enforced` (see `compile_grammar`)."""
    limits = limits or default_limits()
    t0 = time.perf_counter()
    # One build: the matcher reports the grammar's compile error and warnings itself.
    template = LLMatcher(tokenizer.ll_tokenizer, spec.grammar, log_level=0, limits=limits)
    is_error = template.is_error()
    messages = [_engine_error(template)] if is_error else list(template.get_grammar_warnings())
    is_json = spec.kind in JSON_KINDS
    if is_error or (is_json and messages and not spec.lenient):
        # Not lenient: a warning from the JSON compiler also means something would not be enforced.
        message = messages[0] or "the engine refused the grammar"
        if (error := _refusal(spec, message)) is not None:
            raise error
        if not is_json:
            raise GrammarError(f"cannot compile the {spec.kind} grammar: {message}")
        if "Unsatisfiable" in message:
            closed = (
                spec.options.get("strict")
                and isinstance(spec.schema, dict)
                and close_objects(spec.schema) != spec.schema
            )
            hint = " under strict mode (strict=False allows undeclared properties)" if closed else ""
            raise UnsatisfiableSchema(f"no JSON value satisfies the schema{hint}: {message}")
        raise _unsupported(*locate(spec.schema, message)[0], message)
    # The lexer is built lazily: the first mask is where most limits (lexer states, fuel, Earley
    # items) are hit. Computing it here turns that into a compile error, and every matcher copied
    # from the template starts with the work done.
    template.compute_bitmask()
    if template.is_error():
        message = _engine_error(template)
        if (error := _refusal(spec, message)) is not None:
            raise error
        error_class = SchemaError if is_json else GrammarError
        raise error_class(f"cannot compile the {spec.kind} grammar: {_short(message)}")
    not_enforced: list[NotEnforced] = []
    warnings: list[str] = []
    for message in messages:
        if is_json:
            not_enforced += [NotEnforced(kw, p, message) for kw, p in locate(spec.schema, message)]
        else:
            warnings.append(message)
    return CompiledGrammar(spec, tokenizer, template, tuple(not_enforced), tuple(warnings), time.perf_counter() - t0)


class GrammarBackend(Protocol):
    """A grammar engine: compiles a spec for a tokenizer; the result makes per-generation matchers."""

    name: str

    def compile(self, spec: GrammarSpec, tokenizer: TokenizerInfo) -> CompiledGrammar:
        """Raises SchemaError / UnsupportedSchemaFeature / GrammarError (guided.errors)."""


class LLGuidanceBackend:
    """The llguidance engine behind the `GrammarBackend` interface."""

    name = "llguidance"

    def compile(self, spec: GrammarSpec, tokenizer: TokenizerInfo) -> CompiledGrammar:
        return compile_grammar(spec, tokenizer)

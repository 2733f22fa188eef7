"""Turn the user's constraint (JSON Schema, JSON object, regex, choices, Lark, GBNF) into a `GrammarSpec`:
one canonical llguidance grammar text plus what is needed to check the final output.

Options (the same for every input kind that uses them):

- `whitespace` (`WHITESPACES`), the JSON layout the grammar allows between tokens, always bounded
  so a model cannot pad its output with runaway whitespace:
  - "pretty" (the default, `DEFAULT_WHITESPACE`): between any two tokens nothing, one space, or one
    line break followed by at most `PRETTY_INDENT` spaces/tabs (`PRETTY_PATTERN`): the model's own
    pretty-printing (`{\n  "key": "value",\n  ...\n}`, or `{"a": 1, "b": [2, 3]}`) fits, a blank
    line or a run of spaces before a comma does not (docs/reports/quality.md measured it);
  - "compact": `{"a":1,"b":[2,3]}` (separators "," and ":", no other whitespace);
  - "any": any JSON whitespace in any order, in bounded runs: at most 2 line breaks and at most 64
    spaces/tabs before, between and after them (`WHITESPACE_PATTERN`).
  `any_whitespace` (the older option) is still taken where `whitespace` is not given: True is
  "any", False is "compact".
- `strict=True`: like OpenAI's strict mode, an object schema that declares `properties` and says
  nothing about other keys (no `additionalProperties`, `patternProperties` or
  `unevaluatedProperties`) gets `additionalProperties: false`: the output has only declared keys.
  Schemas that take part in an `allOf` intersection (directly, through anyOf/oneOf or a `$ref`)
  are left alone, since closing each part would forbid the other parts' keys, and so is an object
  whose `required` names an undeclared key. A schema that explicitly allows more keys
  keeps them. Outputs under strict mode are valid against the original schema too.
- `lenient=False`: a keyword the engine cannot enforce raises `UnsupportedSchemaFeature` (see
  `guided.compiler`). With True the grammar enforces what it can, `CompiledGrammar.not_enforced`
  lists the rest, and the final output is checked with `jsonschema`.

Property order follows the schema (JSON text is parsed into an insertion-ordered dict; the canonical
text keeps that order).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llguidance import LLMatcher
from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

from guided.errors import GrammarError, SchemaError, UnsatisfiableSchema
from guided.schema.checks import check_depth, check_finite, check_metaschema, check_property_patterns
from guided.schema.numbers import engine_numbers
from guided.schema.pointer import pointer
from guided.schema.rewrite import close_objects, exact_formats
from runtime.errors import InputError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # the stub's TypedDict; not exported at run time

JSON_KINDS = ("json_schema", "json_object")


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint ready to compile.

    kind: "json_schema", "json_object", "regex", "choices" or "lark" (GBNF arrives here as Lark).
    grammar: the llguidance grammar text (JSON), the cache's canonical key.
    schema: the JSON Schema as given (after parsing, before strict mode), for the final output check;
        None for non-JSON kinds.
    options: the options that shaped `grammar` (whitespace, strict, lenient), for reports.
    """

    kind: str
    grammar: str
    schema: Any = None
    options: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def lenient(self) -> bool:
        return bool(self.options.get("lenient"))

    @property
    def validated(self) -> tuple[str, ...]:
        """JSON pointers (into `schema`) of the numeric keywords `grammar` widens or leaves out because
        the engine would judge them inexactly (`guided.schema.numbers.engine_numbers`); the decoder
        enforces them by validate-and-rollback. A function of `schema` alone, so a spec read back
        from the grammar journal has them too."""
        if self.kind not in JSON_KINDS or not isinstance(self.schema, dict):
            return ()
        return tuple(pointer(p) for p in engine_numbers(self.schema)[1])

    def as_lenient(self) -> GrammarSpec:
        """The same JSON Schema with the same whitespace and strict options, compiled in the engine's
        lenient mode (keywords it cannot express are left out: a superset). `self` if already lenient.

        Raises ValueError for a non-JSON kind (a regex or grammar has no lenient form)."""
        if self.kind not in JSON_KINDS:
            raise InputError(f"a {self.kind} grammar has no lenient form")
        if self.lenient:
            return self
        # a spec from an older grammar journal has `any_whitespace` in its options
        ws = resolve_whitespace(self.options.get("whitespace"), self.options.get("any_whitespace"))
        strict = bool(self.options.get("strict", True))
        return json_spec(json.dumps(self.schema, ensure_ascii=False), self.kind, ws, strict, True)


def _is_json_text(text: str) -> bool:
    text = text.strip()
    return text.startswith("{") or text in ("true", "false")


def load_schema(schema) -> Any:
    """A JSON Schema from a dict/bool, JSON text, a file path (str or PathLike) or a pydantic model class.

    Raises SchemaError for unreadable files and text that is not JSON (pointer "").
    """
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):  # pydantic v2 model class
        return schema.model_json_schema()
    if isinstance(schema, os.PathLike) or (
        isinstance(schema, str) and not _is_json_text(schema) and not _parses(schema)
    ):
        try:
            with open(schema, encoding="utf-8") as f:
                schema = f.read()
        except OSError as exc:
            raise SchemaError(f"cannot read the schema file {os.fspath(schema)!r}: {exc.strerror}") from None
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"the schema is not valid JSON: {exc}") from None
    if isinstance(schema, (dict, bool)):
        return schema
    if isinstance(schema, (list, int, float, str)) or schema is None:  # JSON, but not a schema
        raise SchemaError(f"a schema must be a JSON object or a boolean, not {json.dumps(schema)[:60]}")
    raise SchemaError(
        f"a schema must be a dict, JSON text, a file path or a pydantic model class, not {type(schema).__name__}"
    )


def _parses(text: str) -> bool:
    """`text` is JSON (e.g. an inline array or number given where a schema or file name was expected)."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


# Whitespace between JSON tokens under "any": any order of space, tab, CR and LF (JSON's `ws`),
# bounded: at most 2 line breaks (LF, CR, or CRLF counted as one) and at most 64 spaces/tabs before,
# between and after them. JSON's own rule is unbounded, which lets a model spend its whole budget on
# whitespace. Longest run: 3 * 64 + 2 * 2 = 196 characters.
WHITESPACE_PATTERN = r"[ \t]{0,64}(?:(?:\r\n|\r|\n)[ \t]{0,64}){0,2}"
# Under "pretty": what a pretty-printer writes between two tokens and no more. One line break, so no
# blank lines; indentation after it only, up to PRETTY_INDENT (10 levels at indent 2, 5 at indent 4;
# deeper values can still be written compact). The same bound as llama.cpp's JSON grammars
# (`space ::= | " " | "\n"{1,2} [ \t]{0,20}`, json_schema_to_grammar), with one line break, not two.
# Whitespace is what a model has left when it wants to close an object before a required key: under
# "any" that was a blank line and 64 spaces (docs/reference/guided-numbers-whitespace.md); here 21 characters.
PRETTY_INDENT = 20
PRETTY_PATTERN = rf"(?: |(?:\r\n|\r|\n)[ \t]{{0,{PRETTY_INDENT}}})?"
WHITESPACES = ("pretty", "compact", "any")
DEFAULT_WHITESPACE = "pretty"


def resolve_whitespace(whitespace: str | None, any_whitespace: bool | None) -> str:
    """The `whitespace` option from the two ways of giving it: `whitespace` (one of `WHITESPACES`)
    wins; else `any_whitespace` True is "any", False "compact"; neither is `DEFAULT_WHITESPACE`.

    Raises ValueError for an unknown `whitespace`, or both given and disagreeing."""
    if whitespace is not None and whitespace not in WHITESPACES:
        raise InputError(f"whitespace must be one of {', '.join(WHITESPACES)}, not {whitespace!r}")
    if any_whitespace is None:
        return whitespace or DEFAULT_WHITESPACE
    implied = "any" if any_whitespace else "compact"
    if whitespace is not None and whitespace != implied:
        raise InputError(f"any_whitespace={any_whitespace} contradicts whitespace={whitespace!r}")
    return implied


def json_grammar(schema, whitespace: str, lenient: bool) -> str:
    """llguidance grammar text for a JSON Schema with a `whitespace` layout (one of `WHITESPACES`)
    and the lenient option."""
    options: JsonCompileOptions = {"whitespace_flexible": whitespace != "compact", "lenient": lenient}
    if whitespace == "compact":
        options.update({"item_separator": ",", "key_separator": ":"})
    else:
        options["whitespace_pattern"] = PRETTY_PATTERN if whitespace == "pretty" else WHITESPACE_PATTERN
    try:
        return LLMatcher.grammar_from_json_schema(json.dumps(schema, ensure_ascii=False), overrides=options)
    except ValueError as exc:  # serde_json's recursion limit, or a schema the converter cannot read
        raise SchemaError(f"the engine cannot read the schema: {exc}") from None


def read_grammar_text(grammar: str) -> tuple[str, str | None]:
    """(text, file extension or None): a grammar given inline or as a path to a .lark / .gbnf file."""
    if isinstance(grammar, os.PathLike) or ("\n" not in grammar and os.path.splitext(grammar)[1] in (".lark", ".gbnf")):
        try:
            with open(grammar, encoding="utf-8") as f:
                return f.read(), os.path.splitext(os.fspath(grammar))[1]
        except OSError as exc:
            raise GrammarError(f"cannot read the grammar file {os.fspath(grammar)!r}: {exc.strerror}") from None
    return grammar, None


def lark_text(grammar: str) -> str:
    """Lark text from Lark (optionally with llama.cpp's `%llguidance {}` first line, which llguidance
    itself understands) or GBNF (llama.cpp's format; converted by llguidance's `gbnf_to_lark`).

    Raises GrammarError when the grammar is empty or a GBNF grammar cannot be converted.
    """
    text, ext = read_grammar_text(grammar)
    if not text.strip():  # the engine's own message ("No 'root' rule found") would not say so
        raise GrammarError("the grammar is empty: give Lark rules (from `start:`) or GBNF rules (from `root ::=`)")
    if ext == ".lark":
        return text
    try:
        return any_to_lark(text)  # detects Lark syntax and returns it unchanged
    except GbnfToLarkError as exc:
        raise GrammarError(f"invalid GBNF grammar: {exc}") from None
    except Exception as exc:  # the converter raises a plain Exception for an undefined rule, a missing root
        raise GrammarError(f"invalid GBNF grammar: {exc}") from None


@functools.lru_cache(maxsize=256)
def json_spec(text: str, kind: str, whitespace: str, strict: bool, lenient: bool) -> GrammarSpec:
    """The `GrammarSpec` of a schema given as canonical JSON text, memoized: the metaschema check and
    the grammar conversion take milliseconds (hundreds for large schemas), so a session made again
    for the same schema would not get a cache hit for free without this. Errors are not memoized.
    The schema is parsed from `text`, so no caller's dict is shared."""
    schema = json.loads(text)
    check_metaschema(schema)
    check_property_patterns(schema)
    if schema is False:
        raise UnsatisfiableSchema("the schema `false` accepts no value")
    check_finite(schema)
    # llguidance applies options only to object schemas; {} means the same as true
    compiled = {} if schema is True else engine_schema(schema, strict)
    options = {"whitespace": whitespace, "strict": strict, "lenient": lenient}
    return GrammarSpec(kind, json_grammar(compiled, whitespace, lenient), schema, options)


def engine_schema(schema, strict: bool):
    """The copy of a JSON Schema (a dict) the engine compiles: numeric keywords it would judge
    inexactly widened or left out (`guided.schema.numbers.engine_numbers`; validate-and-rollback
    enforces them), objects closed under `strict`, exact patterns for the formats the engine
    writes loosely (`guided.schema.rewrite.exact_formats`)."""
    compiled = engine_numbers(schema)[0]
    return exact_formats(close_objects(compiled) if strict else compiled)


def make_spec(
    *,
    schema=None,
    json_object: bool = False,
    regex: str | None = None,
    choices=None,
    grammar: str | None = None,
    whitespace: str | None = None,
    any_whitespace: bool | None = None,
    strict: bool = True,
    lenient: bool = False,
) -> GrammarSpec:
    """Build the `GrammarSpec` for exactly one of `schema`, `json_object`, `regex`, `choices`, `grammar`.

    schema: dict / bool / JSON text / file path / pydantic model class (see `load_schema`).
    json_object: True for any JSON object (OpenAI's `json_object` response format).
    regex: a regular expression the whole output must match (Rust `regex` syntax, anchored).
    choices: a non-empty list of strings; the output is exactly one of them.
    grammar: Lark or GBNF text, or a path to a .lark / .gbnf file.
    whitespace / any_whitespace: the JSON layout (see the module docstring, `resolve_whitespace`).
    Raises ValueError when not exactly one is given or for a bad whitespace option, SchemaError for a
    bad schema (with pointer), GrammarError for empty choices or an unconvertible GBNF grammar. Regex
    and Lark syntax errors, unsupported keywords and limits are raised when compiling
    (`guided.compiler.compile_grammar`).
    """
    given = [
        n
        for n, v in (
            ("schema", schema),
            ("json_object", json_object or None),
            ("regex", regex),
            ("choices", choices),
            ("grammar", grammar),
        )
        if v is not None
    ]
    if len(given) != 1:
        raise InputError(f"give exactly one of schema, json_object, regex, choices, grammar (got {given or 'none'})")
    whitespace = resolve_whitespace(whitespace, any_whitespace)
    options = {"whitespace": whitespace, "strict": strict, "lenient": lenient}
    if json_object:
        schema = {"type": "object"}
    if schema is not None:
        schema = load_schema(schema)
        check_depth(schema)  # before json.dumps, which recurses
        text = json.dumps(schema, ensure_ascii=False)  # canonical: key order kept
        return json_spec(text, "json_object" if json_object else "json_schema", whitespace, strict, lenient)
    if regex is not None:
        return GrammarSpec("regex", LLMatcher.grammar_from_regex(regex), None, options)
    if choices is not None:
        if isinstance(choices, (str, bytes)):
            raise GrammarError("choices must be a list of strings, not a single string")
        choices = list(choices)
        if not choices or not all(isinstance(c, str) for c in choices):
            raise GrammarError("choices must be a non-empty list of strings")
        # JSON string escapes are valid Lark string literal escapes.
        lark = "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
        return GrammarSpec("choices", LLMatcher.grammar_from_lark(lark), None, options)
    assert grammar is not None  # exactly one was given, and it is none of the others
    return GrammarSpec("lark", LLMatcher.grammar_from_lark(lark_text(grammar)), None, options)

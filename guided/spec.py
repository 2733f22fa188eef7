"""Turn the user's constraint (JSON Schema, JSON object, regex, choices, Lark, GBNF) into a `GrammarSpec`:
one canonical llguidance grammar text plus what is needed to check the final output.

Options (the same for every input kind that uses them):

- `any_whitespace=False`: JSON is compact (`{"a":1,"b":[2,3]}`: separators "," and ":", no other
  whitespace), so a model cannot pad its output with runaway newlines. True allows any JSON
  whitespace between tokens (llguidance's `whitespace_flexible`), in bounded runs: at most 2 line
  breaks then at most 64 spaces/tabs (`WHITESPACE_PATTERN`).
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
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema_rs
from llguidance import LLMatcher
from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

from guided.errors import GrammarError, SchemaError, UnsupportedSchemaFeature

JSON_KINDS = ("json_schema", "json_object")

# Keywords whose value is one subschema / a list of subschemas / a map of name -> subschema (draft 7 and
# 2020-12 applicators). Used to walk a schema: strict mode and error pointers.
SUBSCHEMA = (
    "additionalProperties",
    "items",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
SUBSCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")  # "items" as a list: draft 4-7 tuples
SUBSCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")

# The deepest nesting of JSON objects/arrays a schema document may have. llguidance parses the schema
# and the grammar built around it with serde_json, whose recursion limit is 128 levels; our rewrites
# (exact formats: +2) and llguidance's wrapping (+3) need the rest. Also keeps Python's own recursion
# (json.dumps, the subschema walks) far from its limit.
MAX_SCHEMA_DEPTH = 120


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint ready to compile.

    kind: "json_schema", "json_object", "regex", "choices" or "lark" (GBNF arrives here as Lark).
    grammar: the llguidance grammar text (JSON), the cache's canonical key.
    schema: the JSON Schema as given (after parsing, before strict mode), for the final output check;
        None for non-JSON kinds.
    options: the options that shaped `grammar` (any_whitespace, strict, lenient), for reports.
    """

    kind: str
    grammar: str
    schema: Any = None
    options: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def lenient(self) -> bool:
        return bool(self.options.get("lenient"))


def pointer(path) -> str:
    """JSON pointer (RFC 6901) of a path of keys and indexes: ("a/b", 0) -> "/a~1b/0"."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def subschemas(schema, path=()):
    """Yield (path, subschema) for `schema` and every schema nested in it through applicator keywords."""
    yield path, schema
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key in SUBSCHEMA and isinstance(value, (dict, bool)):
            yield from subschemas(value, path + (key,))
        elif key in SUBSCHEMA_LIST and isinstance(value, list):
            for i, item in enumerate(value):
                yield from subschemas(item, path + (key, i))
        elif key in SUBSCHEMA_MAP and isinstance(value, dict):
            for name, item in value.items():
                if isinstance(item, (dict, bool)):  # "dependencies" also maps names to lists of names
                    yield from subschemas(item, path + (key, name))


def check_depth(schema) -> None:
    """Raise SchemaError (with the pointer of the first location too deep) when the schema document
    nests objects/arrays more than `MAX_SCHEMA_DEPTH` levels. Iterative: any depth is safe."""
    stack = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if len(path) >= MAX_SCHEMA_DEPTH:
            where = pointer(path)
            raise SchemaError(
                f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels of JSON objects and arrays "
                f"(at {where}); the engine's limit is {MAX_SCHEMA_DEPTH}",
                where,
            )
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack += [(value, path + (key,)) for key, value in items]


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


_BUNDLED_METASCHEMAS = {
    "",
    "http://json-schema.org/draft-04/schema",
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "https://json-schema.org/draft/2020-12/schema",
}


def check_metaschema(schema) -> None:
    """Validate `schema` against its metaschema (`$schema`, default draft 2020-12).

    Raises SchemaError with the JSON pointer of the offending location in the schema (also for a
    schema nested deeper than `MAX_SCHEMA_DEPTH`).
    """
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a schema must be a JSON object or boolean, not {type(schema).__name__}")
    check_depth(schema)
    # jsonschema-rs checks in microseconds what jsonschema takes up to hundreds of milliseconds for
    # (most of a cold compile); jsonschema then explains an invalid schema. Only for the drafts
    # jsonschema-rs bundles: any other `$schema` it would try to fetch over the network.
    if not isinstance(schema, dict) or schema.get("$schema", "").rstrip("#") in _BUNDLED_METASCHEMAS:
        if jsonschema_rs.meta.is_valid(schema):
            return
    import jsonschema  # here: its format checkers take seconds to import (rfc3987_syntax builds Lark parsers)

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(schema))
    if error is not None:
        where = pointer(error.absolute_path)
        raise SchemaError(f"invalid schema at {where or '/'}: {error.message}", where)


def resolve_local_ref(root, ref) -> tuple[tuple, Any] | None:
    """(schema path, subschema) a local `$ref` ("#", "#/$defs/a~1b", "#/allOf/0") points to in
    `root`; None for any other ref or a pointer to nothing."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    node, path = root, ()
    for part in ref[2:].split("/") if ref != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            part = int(part)
        elif not isinstance(node, dict) or part not in node:
            return None
        node, path = node[part], path + (part,)
    return path, node


def _ref_node(root, node):
    """The subschema a subschema's local `$ref` points to, or None."""
    target = resolve_local_ref(root, node.get("$ref"))
    return target and target[1]


def _intersected(root) -> set[int]:
    """ids of the subschemas that take part in an intersection: `allOf` members, `anyOf`/`oneOf`
    members beside `properties` (the engine intersects each with its parent), and everything applied
    at the same instance location below them (anyOf/oneOf/allOf members, then/else, local `$ref` targets)."""
    stack = []
    for _, sub in subschemas(root):
        if isinstance(sub, dict):
            for key in ("allOf", "anyOf", "oneOf") if "properties" in sub else ("allOf",):
                stack += sub[key] if isinstance(sub.get(key), list) else []
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        for key in ("allOf", "anyOf", "oneOf"):
            stack += node.get(key, []) if isinstance(node.get(key), list) else []
        stack += [node.get("then"), node.get("else"), _ref_node(root, node)]
    return seen


def _under_exclusion(root) -> set[int]:
    """ids of the subschemas inside `oneOf` members, `not` and `if` (also through local `$ref`s).
    There a narrower subschema can make an instance valid that the schema as given rejects: closing
    one oneOf branch can make overlapping branches look exclusive; closing inside `not` widens it."""
    stack = []
    for _, sub in subschemas(root):
        if isinstance(sub, dict):
            stack += sub["oneOf"] if isinstance(sub.get("oneOf"), list) else []
            stack += [sub.get("not"), sub.get("if")]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        for _, sub in subschemas(node):
            if isinstance(sub, dict) and id(sub) not in seen:
                seen.add(id(sub))
                stack.append(_ref_node(root, sub))
    return seen


def close_objects(schema):
    """Strict mode: a copy of `schema` where object schemas with `properties` and no say on other keys
    get `additionalProperties: false`. Left open (closing would forbid keys that another part of the
    schema allows, or make a required key impossible): parts of an intersection (`_intersected`),
    subschemas under oneOf/not/if (`_under_exclusion`),
    schemas with allOf/anyOf/oneOf or a `$ref` beside their `properties`, and objects whose
    `required` names a key they do not declare."""
    schema = json.loads(json.dumps(schema))  # deep copy that keeps key order
    intersected = _intersected(schema)
    exclusive = _under_exclusion(schema)
    for _, sub in subschemas(schema):
        if not isinstance(sub, dict) or not isinstance(sub.get("properties"), dict) or id(sub) in intersected:
            continue
        if id(sub) in exclusive:
            continue
        if any(
            k in sub
            for k in (
                "allOf",
                "anyOf",
                "oneOf",
                "$ref",
                "additionalProperties",
                "patternProperties",
                "unevaluatedProperties",
            )
        ):
            continue
        required = sub.get("required")
        if isinstance(required, list) and set(required) - set(sub["properties"]):
            continue
        sub["additionalProperties"] = False
    return schema


# Formats whose llguidance regex admits strings `jsonschema` rejects (February 29 of any year, year 0000,
# second 60 at any minute, "--" in label positions 3-4, over 253 characters): replaced by patterns with
# exactly the final check's rules (rfc3339-validator, date.fromisoformat, fqdn), where an RFC's leap
# second is refused as they refuse it. Hostnames are plain LDH labels: A-labels ("xn--") are valid only
# if they decode, which no regex checks, so they are never generated.
_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"  # 0001-9999
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    f"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    f"|02-(?:0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_LABEL = (
    "(?:[A-Za-z0-9](?:[A-Za-z0-9]|[A-Za-z0-9-]{2}[A-Za-z0-9]"
    "|[A-Za-z0-9-](?:[A-Za-z0-9][A-Za-z0-9-]|-[A-Za-z0-9])[A-Za-z0-9-]{0,58}[A-Za-z0-9]|[A-Za-z0-9-][A-Za-z0-9])?)"
)
EXACT_FORMATS = {
    "date": {"pattern": f"^{_DATE}$"},
    "time": {"pattern": f"^{_TIME}$"},
    "date-time": {"pattern": f"^{_DATE}[Tt]{_TIME}$"},
    "hostname": {"pattern": f"^{_LABEL}(?:\\.{_LABEL})*$", "maxLength": 253},
}


def exact_formats(schema):
    """A copy of `schema` where `format` keywords listed in `EXACT_FORMATS` become an `allOf` member
    with the exact pattern. Left alone under oneOf/not/if (`_under_exclusion`), where a narrower
    hostname would widen what the enclosing schema admits; the final check covers those."""
    schema = json.loads(json.dumps(schema))
    exclusive = _under_exclusion(schema)
    for _, sub in subschemas(schema):
        if isinstance(sub, dict) and sub.get("format") in EXACT_FORMATS and id(sub) not in exclusive:
            sub["allOf"] = [*sub.get("allOf", []), EXACT_FORMATS[sub.pop("format")]]
    return schema


# Whitespace between JSON tokens under `any_whitespace`: at most 2 line breaks, then at most 64 spaces
# or tabs (indentation of 16 levels at indent 4). llama.cpp's JSON grammars bound it the same way
# (`space ::= | " " | "\n"{1,2} [ \t]{0,20}`, json_schema_to_grammar); JSON's own rule is unbounded,
# which lets a model spend its whole budget on whitespace.
WHITESPACE_PATTERN = r"(?:\r?\n){0,2}[ \t]{0,64}"


def json_grammar(schema, any_whitespace: bool, lenient: bool) -> str:
    """llguidance grammar text for a JSON Schema with our whitespace and lenient options."""
    options = {"whitespace_flexible": any_whitespace, "lenient": lenient}
    if any_whitespace:
        options["whitespace_pattern"] = WHITESPACE_PATTERN
    else:
        options.update(item_separator=",", key_separator=":")
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


def check_property_patterns(schema) -> None:
    """Refuse a `patternProperties` name Python's `re` cannot read (ECMA 262's `\\p{L}` or
    `(?<name>...)`): jsonschema, the final check, matches property names with `re` (also for
    `additionalProperties`), so the output could not be checked. `pattern` values are checked with
    the `regex` module instead (`guided.validation`). Raises UnsupportedSchemaFeature (keyword, pointer)."""
    for path, sub in subschemas(schema):
        names = sub.get("patternProperties") if isinstance(sub, dict) else None
        for name in names if isinstance(names, dict) else ():
            try:
                re.compile(name)
            except re.error as exc:
                where = pointer(path + ("patternProperties", name))
                raise UnsupportedSchemaFeature(
                    f"cannot check patternProperties at {where}: Python's re, which the final check matches "
                    f"property names with, cannot read {name!r} ({exc})",
                    "patternProperties",
                    where,
                ) from None


def _list(node: dict, key: str) -> list:
    value = node.get(key)
    return value if isinstance(value, list) else []


def check_finite(schema) -> None:
    """Refuse a schema that no finite JSON value satisfies because every value of it must hold
    another value of a schema it is already inside: a required property, or a required array item,
    that refers back through `$ref` (`{"type": "object", "properties": {"next": {"$ref": "#"}},
    "required": ["next"]}`), and `{"not": {}}`. The engine compiles such a grammar, and decoding could
    only fail. Sound, not complete: a smallest value never holds, on one path, two values of the same
    subschema (the inner one could replace the outer one), so a cycle counts as no value; anything not
    understood here counts as satisfiable. Raises SchemaError with the pointer of the keyword to blame."""
    known: set[int] = set()  # ids of subschemas that have a finite value (sound whatever the path)
    legacy = isinstance(schema, dict) and "draft-0" in str(schema.get("$schema", ""))
    budget = [100_000]  # subschema visits; past it the schema is left to the engine

    def finite(node, path: tuple, active: frozenset) -> tuple | None:
        """None when `node` may have a finite value, else the schema path to blame (`false` is left to
        the engine, which names it)."""
        if not isinstance(node, dict) or id(node) in known:
            return None
        budget[0] -= 1
        if budget[0] < 0:
            raise RecursionError("too many subschemas to follow")
        blame = members(node, path, active | {id(node)})
        if blame is None:
            known.add(id(node))
        return blame

    def members(node: dict, path: tuple, active: frozenset) -> tuple | None:
        if node.get("not") is True or node.get("not") == {}:
            return path + ("not",)
        target = resolve_local_ref(schema, node.get("$ref"))
        if target is not None:
            if id(target[1]) in active:  # a value of it inside a value of it: the cycle closes here
                return path + ("$ref",)
            if (blame := finite(target[1], target[0], active)) is not None:
                return blame
            if legacy:  # before draft 2019-09, keywords beside a $ref are ignored
                return None
        for i, sub in enumerate(_list(node, "allOf")):
            if (blame := finite(sub, path + ("allOf", i), active)) is not None:
                return blame
        for key in ("anyOf", "oneOf"):
            blames = [finite(sub, path + (key, i), active) for i, sub in enumerate(_list(node, key))]
            if blames and all(b is not None for b in blames):
                return blames[0]
        types = node.get("type", [])
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
        blames = []
        if "object" in types:
            blames.append(required_properties(node, path, active))
        if "array" in types:
            blames.append(required_items(node, path, active))
        # Without "type", or with a scalar type beside, a scalar value may satisfy it.
        return blames[0] if blames and len(blames) == len(types) and all(b is not None for b in blames) else None

    def required_properties(node: dict, path: tuple, active: frozenset) -> tuple | None:
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        for name in _list(node, "required"):
            blame = finite(properties[name], path + ("properties", name), active) if name in properties else None
            if blame is not None:
                return blame
        return None

    def required_items(node: dict, path: tuple, active: frozenset) -> tuple | None:
        least = node.get("minItems", 0)
        prefix_key = "prefixItems" if isinstance(node.get("prefixItems"), list) else "items"
        prefix = _list(node, prefix_key)
        for i, sub in enumerate(prefix[:least] if isinstance(least, int) else []):
            if (blame := finite(sub, path + (prefix_key, i), active)) is not None:
                return blame
        rest = node.get("items") if prefix_key == "prefixItems" or not prefix else node.get("additionalItems")
        if isinstance(least, int) and least > len(prefix) and isinstance(rest, (dict, bool)):
            return finite(rest, path + ("items" if rest is node.get("items") else "additionalItems",), active)
        return None

    try:
        blame = finite(schema, (), frozenset())
    except RecursionError:  # too long a chain of references, or too many: left to the engine
        return
    if blame is not None:
        where = pointer(blame)
        reason = (
            f"`not` at {where} excludes every value"
            if blame[-1] == "not"
            else f"it refers to itself through the $ref at {where} without ever reaching a value (every value "
            "would need another value of that schema inside it)"
        )
        raise SchemaError(f"no finite JSON value satisfies the schema: {reason}", where)


@functools.lru_cache(maxsize=256)
def json_spec(text: str, kind: str, any_whitespace: bool, strict: bool, lenient: bool) -> GrammarSpec:
    """The `GrammarSpec` of a schema given as canonical JSON text, memoized: the metaschema check and
    the grammar conversion take milliseconds (hundreds for large schemas), so a session made again
    for the same schema would not get a cache hit for free without this. Errors are not memoized.
    The schema is parsed from `text`, so no caller's dict is shared."""
    schema = json.loads(text)
    check_metaschema(schema)
    check_property_patterns(schema)
    if schema is False:
        raise SchemaError("the schema `false` accepts no value")
    check_finite(schema)
    compiled = close_objects(schema) if strict and isinstance(schema, dict) else schema
    compiled = exact_formats(compiled) if isinstance(compiled, dict) else compiled
    if compiled is True:  # llguidance applies options only to object schemas; {} means the same as true
        compiled = {}
    options = {"any_whitespace": any_whitespace, "strict": strict, "lenient": lenient}
    return GrammarSpec(kind, json_grammar(compiled, any_whitespace, lenient), schema, options)


def make_spec(
    *,
    schema=None,
    json_object: bool = False,
    regex: str | None = None,
    choices=None,
    grammar: str | None = None,
    any_whitespace: bool = False,
    strict: bool = True,
    lenient: bool = False,
) -> GrammarSpec:
    """Build the `GrammarSpec` for exactly one of `schema`, `json_object`, `regex`, `choices`, `grammar`.

    schema: dict / bool / JSON text / file path / pydantic model class (see `load_schema`).
    json_object: True for any JSON object (OpenAI's `json_object` response format).
    regex: a regular expression the whole output must match (Rust `regex` syntax, anchored).
    choices: a non-empty list of strings; the output is exactly one of them.
    grammar: Lark or GBNF text, or a path to a .lark / .gbnf file.
    Raises ValueError when not exactly one is given, SchemaError for a bad schema (with pointer),
    GrammarError for empty choices or an unconvertible GBNF grammar. Regex and Lark syntax errors,
    unsupported keywords and limits are raised when compiling (`guided.compiler.compile_grammar`).
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
        raise ValueError(f"give exactly one of schema, json_object, regex, choices, grammar (got {given or 'none'})")
    options = {"any_whitespace": any_whitespace, "strict": strict, "lenient": lenient}
    if json_object:
        schema = {"type": "object"}
    if schema is not None:
        schema = load_schema(schema)
        check_depth(schema)  # before json.dumps, which recurses
        text = json.dumps(schema, ensure_ascii=False)  # canonical: key order kept
        return json_spec(text, "json_object" if json_object else "json_schema", any_whitespace, strict, lenient)
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
    return GrammarSpec("lark", LLMatcher.grammar_from_lark(lark_text(grammar)), None, options)

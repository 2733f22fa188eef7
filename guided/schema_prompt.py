"""The expected output said in words, for the prompt (issue 27): a compact description of a JSON Schema
with its formats, enums, ranges and descriptions written out ("a date written YYYY-MM-DD", "one of
"EUR", "USD"").

A grammar makes the output valid, not right: a model that has not been told that `invoice_date` is
`format: date` writes the day first and the grammar then makes it invent a year ("1434-03-14" for
"14 March 2024"). Telling it the schema is how OpenAI's chat format does it (a "Response Formats"
section in the developer message); Ollama's docs ask users to do it by hand. The rendering is plain
text, not the schema itself: a 0.5B model follows "a date written YYYY-MM-DD" better than
`{"format": "date"}`, and the text is shorter (fewer prompt tokens).

    describe_schema(schema, style=None) -> str
    with_schema_description(prompt, schema, style=None) -> chat messages with the description in the system message

Two styles: "schema" says every key in order with its type; "hints" says only the keys whose form
the grammar fixes and a model could not guess (formats, patterns, enums, consts, ranges, lengths):
the grammar already writes the keys, so the rest is noise a small model copies into its values.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from guided.schema.pointer import resolve_local_ref
from runtime.errors import InputError

# JSON Schema formats (2020-12 section 7.3) in words; a format not listed is named as it is.
FORMATS = {
    "date": "a date written YYYY-MM-DD",
    "time": "a time written HH:MM:SS with a UTC offset, e.g. 14:30:00Z",
    "date-time": "a date and time written YYYY-MM-DDTHH:MM:SS with a UTC offset, e.g. 2024-03-14T09:30:00Z",
    "duration": "an ISO 8601 duration, e.g. P3DT4H",
    "email": "an email address",
    "idn-email": "an email address",
    "hostname": "a host name",
    "idn-hostname": "a host name",
    "ipv4": "an IPv4 address",
    "ipv6": "an IPv6 address",
    "uri": "an absolute URI",
    "uri-reference": "a URI or relative reference",
    "iri": "an absolute IRI",
    "uuid": "a UUID, e.g. 123e4567-e89b-12d3-a456-426614174000",
    "json-pointer": "a JSON pointer",
    "regex": "a regular expression",
}
# The default of `ConstrainedSession(schema_in_prompt=...)`, the CLI and the server, and the description
# it renders: measured by benchmarks/quality.py (docs/reports/quality.md). "hints" with the default pretty
# layout is the one setting at least as accurate as unconstrained on every domain (the model cannot
# know an enum's values or a date's form unless told); the full "schema" description lowered accuracy.
# A schema without such keywords gets no description, so its prompt is unchanged.
SCHEMA_IN_PROMPT = True
SCHEMA_PROMPT_STYLE = "hints"
STYLES = ("schema", "hints")
# The token budget of a description (issue 39): a schema with an enum of thousands of product codes
# would otherwise put every one into the system message (25,000 prompt tokens for a ten-word
# question). A few hundred tokens hold the hints of every schema of the labelled set whole.
SCHEMA_HINT_BUDGET = 400
ENUM_SHOWN = (16, 4)  # members named of an enum too large for the budget, tried in this order
LEFT_TO_GRAMMAR = "(the form of {} more keys is left to the output's grammar)"
# Keywords that fix the form of a value beyond its type: the keys a "hints" description names.
_FORM_KEYWORDS = frozenset(
    ("const", "enum", "format", "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum")
    + ("exclusiveMaximum", "multipleOf", "minItems", "maxItems", "uniqueItems")
)
_PLURAL = {
    "object": "objects",
    "array": "arrays",
    "string": "strings",
    "number": "numbers",
    "integer": "integers",
    "boolean": "booleans",
    "null": "nulls",
}
MAX_DEPTH = 8  # deeper nesting is described as its type only; keeps recursive and huge schemas bounded


def describe_schema(
    schema: dict | bool, style: str | None = None, budget: int | None = None, count: Callable[[str], int] | None = None
) -> str:
    """A description of the JSON value `schema` asks for, to put in a prompt: a lead line, then (for an
    object) one line per property in declaration order, nested objects indented, optional properties
    marked. `schema`: a JSON Schema as a dict or bool (e.g. `GrammarSpec.schema`); local `$ref`s are
    followed, a recursive one is named instead of expanded. Never raises for a schema the engine
    accepts; keywords it does not know are left out.

    style: "schema" (every key), "hints" (only keys with a format, pattern, enum, const, range or
    length, under a "Write these values in this form:" lead; "" when there are none, or for a root without
    such keywords), None for `SCHEMA_PROMPT_STYLE`. Raises ValueError for another style.

    budget: at most this many tokens, as `count(text)` counts them (None: no limit). A description
    over it is shortened, never the schema: enums are said by their size and a few members
    (`ENUM_SHOWN`), then the lines past the budget are left out with a note (`LEFT_TO_GRAMMAR`); the
    grammar enforces all of it either way. Within the budget the description is the full one.

    >>> print(describe_schema({"type": "object", "properties": {"d": {"type": "string", "format": "date"}},
    ...                        "required": ["d"]}))
    Respond with only a JSON object with these keys, in this order:
    - "d" (string, a date written YYYY-MM-DD)
    """
    style = SCHEMA_PROMPT_STYLE if style is None else style
    if style not in STYLES:
        raise InputError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    text = _Describer(schema, hints=style == "hints").root()
    if budget is None or count is None or count(text) <= budget:
        return text  # within the budget: the whole description, unchanged
    for shown in ENUM_SHOWN:  # first, large enums by their size and a few members
        text = _Describer(schema, hints=style == "hints", enum_shown=shown).root()
        if count(text) <= budget:
            return text
    return _cut_lines(text, budget, count)


def _cut_lines(text: str, budget: int, count: Callable[[str], int]) -> str:
    """The lead line (always) and as many of the next lines as fit in `budget` tokens beside the
    closing note that says how many were left to the grammar."""
    lines = text.split("\n")
    kept, used = lines[:1], count(lines[0])
    for line in lines[1:]:
        note = LEFT_TO_GRAMMAR.format(len(lines) - len(kept))
        if used + count(line) + count(note) + 2 > budget:
            return "\n".join([*kept, note])
        kept.append(line)
        used += count(line) + 1
    return "\n".join(kept)


def with_schema_description(
    prompt, schema, style: str | None = None, budget: int | None = None, count: Callable[[str], int] | None = None
) -> list[dict]:
    """Chat messages for `prompt` (text, or a list of chat messages) with `describe_schema(schema, style,
    budget, count)`
    at the start of the system message: prepended to the first message if it is a system (or
    developer) message, else a system message is added before the others; an empty description adds
    nothing. The input is not changed. Raises ValueError for a prompt of token ids (there is no
    message to add text to) or an unknown style."""
    description = describe_schema(schema, style, budget, count)
    if not description and isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, str):
        return [{"role": "system", "content": description}, {"role": "user", "content": prompt}]
    if not prompt or not all(isinstance(m, dict) for m in prompt):
        raise InputError("schema_in_prompt needs a text prompt or chat messages, not token ids")
    messages = [dict(m) for m in prompt]
    if not description:
        return messages
    first = messages[0]
    if first.get("role") in ("system", "developer") and isinstance(first.get("content"), str):
        first["content"] = f"{description}\n\n{first['content']}" if first["content"] else description
        return messages
    return [{"role": "system", "content": description}, *messages]


class _Describer:
    def __init__(self, root, hints: bool = False, enum_shown: int | None = None):
        self.root_schema = root
        self.hints = hints  # only the keys whose form a model could not guess (see `describe_schema`)
        self.enum_shown = enum_shown  # name at most this many members of an enum (None: all)

    def root(self) -> str:
        node = self._resolve(self.root_schema, set())[0]
        what, lines = self.value(self.root_schema, 0, set())
        if self.hints:
            if lines:
                return "\n".join(["Write these values in this form:", *lines])
            return f"Respond with only {_article(what)}." if self.fixes_form(self.root_schema, set()) else ""
        if lines:
            lead = f"Respond with only {_article(what)} with these keys, in this order:"
        else:
            lead = f"Respond with only {_article(what)}."
        desc = node.get("description") if isinstance(node, dict) else None
        return "\n".join([lead, *([desc] if isinstance(desc, str) and desc else []), *lines])

    def _resolve(self, node, active: set) -> tuple[Any, str | None]:
        """(the node after following local $refs, the name of a recursive ref or None)."""
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if ref in active:
                return node, "the top-level value" if ref == "#" else ref.rsplit("/", 1)[-1]
            target = resolve_local_ref(self.root_schema, ref)
            if target is None:
                return node, None
            active.add(ref)
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = {**target[1], **rest} if isinstance(target[1], dict) else target[1]
        return node, None

    def fixes_form(self, node, active: set, depth: int = 0) -> bool:
        """Whether `node` (or an alternative or array item of it) has a keyword of `_FORM_KEYWORDS`."""
        node = self._resolve(node, set(active))[0]
        if not isinstance(node, dict) or depth > MAX_DEPTH:
            return False
        if _FORM_KEYWORDS & node.keys():
            return True
        options = [o for k in ("anyOf", "oneOf") if isinstance(node.get(k), list) for o in node[k]]
        items = self._resolve(node.get("items"), set(active))[0]
        if isinstance(items, dict) and "properties" not in items:  # an array of scalars: its items' form is its own
            options.append(items)
        return any(self.fixes_form(o, active, depth + 1) for o in options)

    def value(self, node, depth: int, active: set) -> tuple[str, list[str]]:
        """(a phrase for the value: "string, a date written YYYY-MM-DD"; indented lines for its keys)."""
        active = set(active)
        node, recursive = self._resolve(node, active)
        if recursive:
            return f"a value like {recursive}", []
        if node is True or node == {}:
            return "any JSON value", []
        if node is False:
            return "no value (not allowed)", []
        if not isinstance(node, dict):
            return "any JSON value", []
        if "const" in node:
            return f"exactly {_json(node['const'])}", []
        if "enum" in node and isinstance(node["enum"], list):
            values = node["enum"]
            if self.enum_shown is not None and len(values) > self.enum_shown:
                shown = ", ".join(_json(v) for v in values[: self.enum_shown])
                return f"one of {len(values)} values, such as {shown}", []
            return "one of " + ", ".join(_json(v) for v in values), []
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and node[key]:
                return self.alternatives(node[key], depth, active), []
        types = node.get("type")
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
        if not types:
            types = [t for t, keys in _IMPLIED.items() if any(k in node for k in keys)][:1]
        parts = [" or ".join(types)] if types else []
        lines: list[str] = []
        if "object" in types and depth < MAX_DEPTH:
            lines = self.properties(node, depth, active)
        if "array" in types:
            phrase, lines = self.array(node, depth, active, types)
            parts = [phrase]
        parts += _constraints(node)
        return ", ".join(p for p in parts if p) or "any JSON value", lines

    def alternatives(self, options: list, depth: int, active: set) -> str:
        phrases = [self.value(o, MAX_DEPTH, active)[0] for o in options]  # inline: no nested key lines
        if phrases[-1] == "null" and len(phrases) > 1:  # the optional-value idiom: {"anyOf": [X, {"type": "null"}]}
            rest = " or ".join(phrases[:-1])
            return f"{rest}, or null" if "," in rest else f"{rest} or null"
        return "one of: " + " | ".join(phrases)

    def array(self, node: dict, depth: int, active: set, types: list) -> tuple[str, list[str]]:
        """("array of strings (a date written YYYY-MM-DD), at least 1 item", key lines of object items)."""
        items = node.get("items")
        lines: list[str] = []
        what = "array"
        if isinstance(items, (dict, bool)) and items not in (True, {}):
            phrase, lines = self.value(items, depth, active)
            head, _, rest = phrase.partition(", ")
            if head in _PLURAL:
                what = f"array of {_PLURAL[head]}" + (f" ({rest})" if rest else "")
            else:
                what = f"array, each item {phrase}"
            if lines:
                what += " with these keys"
        lo, hi = node.get("minItems"), node.get("maxItems")
        if isinstance(lo, int) and isinstance(hi, int):
            what += f", {lo} to {hi} items" if lo != hi else f", exactly {lo} items"
        elif isinstance(lo, int) and lo > 0:
            what += f", at least {lo} item{'s' * (lo != 1)}"
        elif isinstance(hi, int):
            what += f", at most {hi} item{'s' * (hi != 1)}"
        if node.get("uniqueItems") is True:
            what += ", no duplicates"
        return " or ".join([what, *(t for t in types if t != "array")]), lines

    def properties(self, node: dict, depth: int, active: set) -> list[str]:
        props = node.get("properties")
        if not isinstance(props, dict):
            return []
        required = node["required"] if isinstance(node.get("required"), list) else []
        lines = []
        indent = "  " * depth
        for name, sub in props.items():
            phrase, sublines = self.value(sub, depth + 1, active)
            if self.hints and not sublines and not self.fixes_form(sub, active):
                continue  # the grammar writes the key; its type says the rest
            resolved = self._resolve(sub, set(active))[0]
            desc = resolved.get("description") if isinstance(resolved, dict) else None
            optional = ", optional" if name not in required else ""
            head = f"{indent}- {_json(name)} ({phrase}{optional})"
            if isinstance(desc, str) and desc.strip():
                head += f": {' '.join(desc.split())}"
            lines += [head + (":" if sublines and not desc else ""), *sublines]
        return lines


# Keywords that say the type when `type` is absent.
_IMPLIED = {
    "object": ("properties", "required", "additionalProperties"),
    "array": ("items", "prefixItems", "minItems", "maxItems"),
    "string": ("format", "pattern", "minLength", "maxLength"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}


def _constraints(node: dict) -> list[str]:
    """Phrases for a node's format, pattern, length and range keywords, in that order."""
    out = []
    fmt = node.get("format")
    if isinstance(fmt, str):
        out.append(FORMATS.get(fmt, f"format {fmt}"))
    if isinstance(node.get("pattern"), str):
        out.append(f"matching the regular expression {node['pattern']}")
    lo, hi = node.get("minLength"), node.get("maxLength")
    if isinstance(lo, int) and isinstance(hi, int):
        out.append(f"{lo} to {hi} characters" if lo != hi else f"exactly {lo} characters")
    elif isinstance(lo, int) and lo > 0:
        out.append(f"at least {lo} character{'s' * (lo != 1)}")
    elif isinstance(hi, int):
        out.append(f"at most {hi} character{'s' * (hi != 1)}")
    bounds = [
        (">=", node.get("minimum")),
        (">", node.get("exclusiveMinimum")),
        ("<=", node.get("maximum")),
        ("<", node.get("exclusiveMaximum")),
    ]
    bounds = [(op, v) for op, v in bounds if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if [op for op, _ in bounds] == [">=", "<="]:
        out.append(f"from {_json(bounds[0][1])} to {_json(bounds[1][1])}")
    else:
        out += [f"{op} {_json(v)}" for op, v in bounds]
    if isinstance(node.get("multipleOf"), (int, float)) and not isinstance(node.get("multipleOf"), bool):
        out.append(f"a multiple of {_json(node['multipleOf'])}")
    if isinstance(node.get("examples"), list) and node["examples"]:
        out.append(f"e.g. {_json(node['examples'][0])}")
    return out


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _article(what: str) -> str:
    """ "a JSON object", "a JSON value: one of ..." (phrases that are not a type name)."""
    if what.startswith(("one of", "exactly", "a value", "no value")):
        return f"a JSON value: {what}"
    return "a JSON value" if what.startswith("any ") else f"a JSON {what}"

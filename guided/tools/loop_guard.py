"""The loop guard: a tool's parameter schema narrowed so that the grammar excludes the calls already
answered in the conversation (the same name and the same arguments), so that a small model that
would repeat a call must answer or call something new.

`excluding(schema, inputs)` is the parameters' object schema with each of `inputs` (argument
objects) left out: an `anyOf` of the ways an object of the schema can differ from all of them, each
the schema with one property narrowed:

- a property every input gives: a value none of them has (strings: a `pattern` matching every
  string but those, anchored; integers: the ranges between them; booleans: the other one; an
  `enum`: its other members; a `const` they share: no branch);
- a property every input gives that the schema does not require: absent (`false`);
- a property no input gives: present (added to `required`).

With one input (the repeated call) this is exact: every other object of the schema is admitted.
With several, a branch must differ from all of them at one property, so an object that differs
from each at a different property is excluded too (the narrowing never admits an excluded call).
A property whose schema cannot be narrowed so (numbers, objects, arrays, a string with its own
`pattern` or `format`, more than `MAX_VALUES` strings or one over `MAX_LENGTH` characters) gives no
branch. No branch at all: None when no call of the tool is left, else the schema unchanged (the
guard steps aside rather than exclude calls that differ).
"""

from __future__ import annotations

import json
from typing import Any

ANY = r"[\s\S]"  # any character, line breaks included
MAX_VALUES, MAX_LENGTH = 8, 200  # string values a pattern excludes at most (its size grows with their length squared)
META = set(r"\.+*?()|[]{}^$-&~#")
CLASS_META = set("\\]^-[")


def canonical(arguments: dict) -> str:
    """The arguments object as one text for comparing calls (keys sorted, compact)."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _escape(text: str, meta: set[str] = META) -> str:
    return "".join("\\" + c if c in meta else c for c in text)


def _trie(words: list[str]) -> dict:
    root: dict = {}
    for word in words:
        node = root
        for c in word:
            node = node.setdefault(c, {})
        node[""] = {}  # the end of a word
    return root


def _alternatives(node: dict, prefix: str = "") -> list[str]:
    """Flat regex alternatives of every string that does not spell a word of the trie from `node`
    (reached by `prefix`, escaped) on: one per trie node, no nesting (the regex engine bounds it)."""
    nexts = sorted(c for c in node if c)
    out = [] if "" in node else [prefix]  # the string may stop here unless a word does
    out.append(prefix + (f"[^{''.join(_escape(c, CLASS_META) for c in nexts)}]" if nexts else ANY) + ANY + "*")
    for c in nexts:
        out += _alternatives(node[c], prefix + _escape(c))
    return out


def string_other_than(values: list[str]) -> str:
    """An anchored regex (a JSON Schema `pattern`) matching every string but `values`."""
    return "^(?:" + "|".join(_alternatives(_trie(values))) + ")$"


def _differing(sub: Any, values: list) -> list[dict] | None:
    """Schemas of the property values of `sub` (a property's schema) other than `values` ([]: there
    is none; None: this module cannot write them)."""
    if not isinstance(sub, dict):
        return None
    if "const" in sub:
        return [] if sub["const"] in values else [sub]
    if "enum" in sub:
        rest = [v for v in sub["enum"] if v not in values]
        return [{**sub, "enum": rest}] if rest else []
    kind = sub.get("type")
    if kind == "string" and all(isinstance(v, str) for v in values) and not {"pattern", "format"} & sub.keys():
        if len(values) > MAX_VALUES or max(map(len, values)) > MAX_LENGTH:
            return None  # the pattern would be over the regex engine's nesting and size bounds
        return [{**sub, "pattern": string_other_than(values)}]
    if kind == "boolean" and all(isinstance(v, bool) for v in values):
        left = [b for b in (True, False) if b not in values]
        return [{**sub, "const": left[0]}] if left else []
    if kind == "integer" and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        cuts = sorted(set(values))
        ranges = [
            {"maximum": cuts[0] - 1},
            *({"minimum": a + 1, "maximum": b - 1} for a, b in zip(cuts, cuts[1:], strict=False)),
            {"minimum": cuts[-1] + 1},
        ]
        return [{**sub, **r} for r in ranges if r.get("minimum", -(2**63)) <= r.get("maximum", 2**63)]
    return None


def excluding(schema: dict, inputs: list[dict]) -> dict | None:
    """`schema` (a tool's parameters: an object schema with `properties`) with every object of
    `inputs` excluded (see the module docstring); None when no object is left to admit. A schema
    without `properties` is returned as it is (nothing to narrow)."""
    properties = schema.get("properties")
    if not inputs or not isinstance(properties, dict):
        return schema
    required = list(schema.get("required") or [])
    branches, inexpressible = [], False
    for name, sub in properties.items():
        given = [a[name] for a in inputs if name in a]
        if len(given) == len(inputs):  # every input gives it: another value, or (optional) none
            differing = _differing(sub, given)
            inexpressible |= differing is None
            branches += [
                {**schema, "properties": {**properties, name: d}, "required": sorted({*required, name})}
                for d in differing or []
            ]
            if name not in required:
                branches.append({**schema, "properties": {**properties, name: False}})
        elif not given:  # no input gives it: present
            branches.append({**schema, "required": [*required, name]})
    if not branches:
        return schema if inexpressible else None  # a call may be left that this module cannot write: no guard
    return branches[0] if len(branches) == 1 else {"anyOf": branches}

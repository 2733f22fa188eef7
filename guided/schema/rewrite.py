"""Schema-to-schema rewrites applied before compiling: strict mode's closed objects
(`close_objects`), formats replaced by exact patterns or bounded (`exact_formats`). Each returns a copy
(key order kept) and leaves the caller's schema alone."""

from __future__ import annotations

import json

from guided.schema.pointer import resolve_local_ref
from guided.schema.walk import subschemas


def _ref_node(root, node):
    """The subschema a subschema's local `$ref` points to, or None."""
    target = resolve_local_ref(root, node.get("$ref"))
    return target and target[1]


def _intersected(root) -> set[int]:
    """ids of the subschemas that take part in an intersection: `allOf` members, `anyOf`/`oneOf`
    members beside `properties` (the engine intersects each with its parent), and everything applied
    at the same instance location below them (anyOf/oneOf/allOf members, then/else, local `$ref` targets)."""
    stack: list = []
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


def under_exclusion(root) -> set[int]:
    """ids of the subschemas inside `oneOf` members, `not` and `if` (also through local `$ref`s).
    There a narrower subschema can make an instance valid that the schema as given rejects: closing
    one oneOf branch can make overlapping branches look exclusive; closing inside `not` widens it."""
    stack: list = []
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
    subschemas under oneOf/not/if (`under_exclusion`),
    schemas with allOf/anyOf/oneOf or a `$ref` beside their `properties`, and objects whose
    `required` names a key they do not declare."""
    schema = json.loads(json.dumps(schema))  # deep copy that keeps key order
    intersected = _intersected(schema)
    exclusive = under_exclusion(schema)
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


# Formats the engine enforces without a length bound, where a small model can loop inside one string
# until max_tokens: an `allOf` member beside the format bounds them. email: RFC 5321 section 4.5.3.1
# (local part at most 64 octets, a path at most 256 octets with its angle brackets: an address at most
# 254). The engine's email pattern is ASCII only, without quoted local parts, so characters are octets
# and the local part is everything before the one "@".
BOUNDED_FORMATS = {
    "email": {"pattern": "^[^@]{1,64}@", "maxLength": 254},
}


def exact_formats(schema):
    """A copy of `schema` where `format` keywords listed in `EXACT_FORMATS` become an `allOf` member
    with the exact pattern, and those in `BOUNDED_FORMATS` get their bounds as an `allOf` member beside
    them. Left alone under oneOf/not/if (`under_exclusion`), where a narrower string would widen what
    the enclosing schema admits; the final check covers those."""
    schema = json.loads(json.dumps(schema))
    exclusive = under_exclusion(schema)
    for _, sub in subschemas(schema):
        if not isinstance(sub, dict) or id(sub) in exclusive:
            continue
        if sub.get("format") in EXACT_FORMATS:
            sub["allOf"] = [*sub.get("allOf", []), EXACT_FORMATS[sub.pop("format")]]
        elif sub.get("format") in BOUNDED_FORMATS:
            sub["allOf"] = [*sub.get("allOf", []), BOUNDED_FORMATS[sub["format"]]]
    return schema

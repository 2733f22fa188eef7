"""Static checks of a JSON Schema before it is compiled: nesting depth, the metaschema,
property-name patterns the final check can read, and whether any finite value satisfies it.
Each raises `SchemaError` or `UnsupportedSchemaFeature` with the JSON pointer to blame."""

from __future__ import annotations

import re

import jsonschema_rs

from guided.errors import SchemaError, UnsatisfiableSchema, UnsupportedSchemaFeature
from guided.schema.pointer import pointer, resolve_local_ref
from guided.schema.walk import subschemas

# The deepest nesting of JSON objects/arrays a schema document may have. llguidance parses the schema
# and the grammar built around it with serde_json, whose recursion limit is 128 levels; our rewrites
# (exact formats: +2) and llguidance's wrapping (+3) need the rest. Also keeps Python's own recursion
# (json.dumps, the subschema walks) far from its limit.
MAX_SCHEMA_DEPTH = 120


def check_depth(schema) -> None:
    """Raise SchemaError (with the pointer of the first location too deep) when the schema document
    nests objects/arrays more than `MAX_SCHEMA_DEPTH` levels. Iterative: any depth is safe."""
    stack: list[tuple[object, tuple]] = [(schema, ())]
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
        properties = node["properties"] if isinstance(node.get("properties"), dict) else {}
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
        raise UnsatisfiableSchema(f"no finite JSON value satisfies the schema: {reason}", where)

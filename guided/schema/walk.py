"""Walks over a JSON Schema document: the subschemas reached through applicator keywords, every
node of the document, and where a keyword occurs."""

from __future__ import annotations

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


def subschemas(schema, path=()):
    """Yield (path, subschema) for `schema` and every schema nested in it through applicator keywords
    (depth first, schema order)."""
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


def nodes(node, path=()):
    """Every (path, value) in a JSON document, depth first."""
    yield path, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield from nodes(value, path + (key,))


def keyword_paths(schema, keyword: str, value=None) -> list[tuple]:
    """Paths (to the keyword itself) of every subschema having `keyword` (with `value`, if given).
    If the applicator walk finds none (a keyword under a non-standard key), any object in the
    document having it."""

    def has(node):
        return isinstance(node, dict) and keyword in node and (value is None or node[keyword] == value)

    found = [path + (keyword,) for path, sub in subschemas(schema) if has(sub)]
    if not found:
        found = [path + (keyword,) for path, node in nodes(schema) if has(node)]
    return found

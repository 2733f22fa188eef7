"""The JSON Schema toolkit (`guided.schema`): one pointer parser/formatter (RFC 6901), local `$ref`
resolution, and `GrammarSpec.as_lenient`. No model needed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guided.schema.pointer import local_ref, parse_pointer, path_of, pointer, resolve_local_ref, resolve_pointer
from guided.spec import GrammarSpec, make_spec

# RFC 6901 section 5's document and its pointers.
RFC_DOC = {"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4, "i\\j": 5, 'k"l': 6, " ": 7, "m~n": 8}
RFC_CASES = [
    ("", RFC_DOC),
    ("/foo", ["bar", "baz"]),
    ("/foo/0", "bar"),
    ("/", 0),
    ("/a~1b", 1),
    ("/c%d", 2),
    ("/e^f", 3),
    ("/g|h", 4),
    ("/i\\j", 5),
    ('/k"l', 6),
    ("/ ", 7),
    ("/m~0n", 8),
]


@pytest.mark.parametrize("text, value", RFC_CASES)
def test_rfc6901_examples_resolve(text, value):
    path, found = resolve_pointer(RFC_DOC, text)
    assert found == value
    assert pointer(path) == text


@given(st.lists(st.text(alphabet="ab~/01", max_size=6), max_size=4))
def test_format_then_parse_is_identity(tokens):
    assert parse_pointer(pointer(tokens)) == tuple(tokens)


def test_tilde_one_is_read_before_tilde_zero():
    assert parse_pointer("/~01") == ("~1",)
    assert parse_pointer("/~10") == ("/0",)


def test_bad_pointer_is_a_value_error():
    with pytest.raises(ValueError, match="starts with '/'"):
        parse_pointer("foo")


def test_local_refs():
    schema = {"$defs": {"a/b": {"type": "string"}}, "allOf": [{"type": "integer"}]}
    assert resolve_local_ref(schema, "#/$defs/a~1b") == (("$defs", "a/b"), {"type": "string"})
    assert resolve_local_ref(schema, "#/allOf/0") == (("allOf", 0), {"type": "integer"})
    assert resolve_local_ref(schema, "#") == ((), schema)
    assert resolve_local_ref(schema, "#/allOf/1") is None
    assert resolve_local_ref(schema, "other.json#/x") is None
    assert local_ref("#anchor") is None
    assert path_of(schema, "/allOf/0/type") == ("allOf", 0, "type")
    assert path_of(schema, "/allOf/7") == ("allOf", "7")


def test_lenient_form_keeps_the_options():
    spec = make_spec(schema={"type": "array", "uniqueItems": True}, whitespace="any", strict=False)
    lenient = spec.as_lenient()
    assert lenient.lenient and lenient.schema == spec.schema
    assert lenient.options == {"whitespace": "any", "strict": False, "lenient": True}
    assert make_spec(schema={"type": "array", "uniqueItems": True}).as_lenient().options["whitespace"] == "pretty"
    old = GrammarSpec(
        spec.kind, spec.grammar, spec.schema, {"any_whitespace": False, "strict": True}
    )  # an old journal's
    assert old.as_lenient().options == {"whitespace": "compact", "strict": True, "lenient": True}
    assert lenient.as_lenient() is lenient
    with pytest.raises(ValueError, match="no lenient form"):
        make_spec(regex="a+").as_lenient()

"""Every engine limit a client can hit (schema depth, grammar size, recursion without a base case,
regex size) surfaces as `SchemaError` / `GrammarError` saying what was exceeded, with the JSON
pointer where there is one; never a bare ValueError, RecursionError or an engine panic text."""

from __future__ import annotations

import pytest

from coreai import ConstrainedSession
from guided import GrammarError, SchemaError, UnsupportedSchemaFeature, compile_grammar, get_tokenizer_info, make_spec
from guided.schema.checks import MAX_SCHEMA_DEPTH


def nested_objects(levels: int) -> dict:
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


def nested_arrays(levels: int) -> dict:
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.fixture(scope="module")
def info(tiny_model):
    return get_tokenizer_info(tiny_model.tokenizer.hf, tiny_model.vocab_size, tiny_model.tokenizer.eos_ids)


def compile_(info, **spec):
    return compile_grammar(make_spec(**spec), info)


def test_schema_depth_limit(info):
    # 59 object levels is 119 levels of JSON: within the limit; with exact formats added, still compiles.
    compile_(info, schema=nested_objects(59))
    leaf = nested_objects(58)
    node = leaf
    while "properties" in node:
        node = node["properties"]["x"]
    node["format"] = "date"
    compile_(info, schema=leaf)
    for schema, deep in ((nested_objects(64), 2 * 60), (nested_arrays(130), 120), (nested_objects(600), 2 * 60)):
        with pytest.raises(SchemaError) as e:
            compile_(info, schema=schema)
        assert type(e.value) is SchemaError and f"limit is {MAX_SCHEMA_DEPTH}" in str(e.value)
        assert e.value.pointer.count("/") == deep  # the first location past the limit


def test_schema_depth_limit_in_a_session(tiny_model):
    with pytest.raises(SchemaError, match="nests deeper"):
        ConstrainedSession(tiny_model, schema=nested_objects(64))


@pytest.mark.parametrize(
    "schema, where",
    [
        ({"$ref": "#"}, "/$ref"),
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "/$defs/a/$ref"),
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "/$defs/b/$ref"),
    ],
)
def test_self_reference_without_a_value(info, schema, where):
    with pytest.raises(SchemaError) as e:
        compile_(info, schema=schema)
    assert not isinstance(e.value, UnsupportedSchemaFeature)
    assert "refers to itself" in str(e.value) and "NoExtensionBias" not in str(e.value)
    assert e.value.pointer == where


def test_recursive_schema_with_a_base_case_compiles(info):
    compile_(
        info,
        schema={"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
    )


def test_lark_rule_without_a_base_case(info):
    with pytest.raises(GrammarError, match="no finite text"):
        compile_(info, grammar='start: a\na: a "x"')


@pytest.mark.parametrize(
    "grammar, rule",
    [
        ('start: "a" start', "start"),  # right recursion: llguidance compiles it, and it never accepts
        ('start: x\nx: "(" x ")"', "start"),
        ('start: "a" | b\nb: "c" b', "b"),  # a branch the output could enter and never leave
        ('start: x? "b"\nx: "a" x', "x"),
        ('root ::= "a" root', "start"),  # GBNF, converted to Lark (root is start)
        ('start: item+\nitem: "(" item ")" | block\nblock: "{" block "}"', "block"),
        ('start: a\na: "x" | b\nb: "y" b', "b"),
        ('start: x ~ 2..3\nx: "a" x', "start"),  # a repetition needs its item
        ('start: a // the only rule\n%ignore " "\na: "x" a', "start"),
    ],
)
def test_grammar_rules_that_never_end_are_refused(info, grammar, rule):
    with pytest.raises(GrammarError) as e:
        compile_(info, grammar=grammar)
    assert "never ends" in str(e.value) and repr(rule) in str(e.value), e.value


@pytest.mark.parametrize(
    "grammar",
    [
        'start: "a" start | "b"',
        "start: URL // a comment\nURL: /https?:\\/\\/[a-z]+/",
        'start: a -> named\n?a: "q" start | "r"',
        'start: "a".."z" start | "0"',
        'start: x+\nx: "a" | "(" x ")"',
        'start: x{0,3} "b"\nx: "a"',
        'start: TEXT\nTEXT: /(.|\\n)+/ & ~(/(.|\\n)*/ "<x>" /(.|\\n)*/)',
        '%llguidance {}\nstart: j\nj: %json {"type": "object", "properties": {"a": {"pattern": "}"}}}',
    ],
)
def test_grammars_that_can_end_compile(info, grammar):
    compile_(info, grammar=grammar)


@pytest.mark.parametrize(
    "spec, what",
    [
        (dict(choices=[f"c{i}" for i in range(70_000)]), "grammar symbols"),
        (dict(grammar="start: " + " | ".join(f'"w{i}"' for i in range(70_000))), "grammar symbols"),
        (dict(schema={"enum": [f"v{i}" for i in range(200_000)]}), "size limit"),
        (
            dict(schema={"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}),
            "size limit",
        ),
    ],
)
def test_size_limits(info, spec, what):
    with pytest.raises(GrammarError) as e:
        compile_(info, **spec)
    message = str(e.value)
    assert "over the engine's" in message and what in message
    assert "backtrace" not in message and "panic" not in message and len(message) < 400
    if "schema" in spec:
        assert type(e.value) is SchemaError

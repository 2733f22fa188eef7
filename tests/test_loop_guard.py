"""The loop guard (`--loop-guard`, `guided.tools.loop_guard`): a tool call identical to one the
conversation already answered is excluded by the grammar. The narrowed schema checked against
jsonschema (exact for one excluded input, never admitting an excluded one), then a real server on
loopback with the `anthropic` SDK: the forced repeat of an answered call cannot come out again,
while the prompt is the one rendered without the guard."""

from __future__ import annotations

import anthropic
import jsonschema
import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from guided.tools.loop_guard import excluding, string_other_than

READ = {
    "type": "object",
    "properties": {
        "file_path": {"type": "string"},
        "limit": {"type": "integer"},
        "all": {"type": "boolean"},
        "mode": {"enum": ["text", "bytes"]},
    },
    "required": ["file_path"],
    "additionalProperties": False,
}
VALUES = [
    {"file_path": "/w/hello.py"},
    {"file_path": "/w/hello.p"},
    {"file_path": "/w/hello.pyc"},
    {"file_path": ""},
    {"file_path": "/w/hello.py", "limit": 3},
    {"file_path": "/w/hello.py", "all": True},
    {"file_path": "/w/hello.py", "mode": "bytes"},
    {"file_path": "/w/a.py", "limit": 3, "all": False, "mode": "text"},
    {"file_path": "/w/a.py", "limit": 4},
]


def _valid(schema, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


@pytest.mark.parametrize("excluded", [[VALUES[0]], [VALUES[4]], [VALUES[7]], [VALUES[0], VALUES[8]]])
def test_the_narrowed_schema_excludes_exactly_the_answered_inputs(excluded):
    narrowed = excluding(READ, excluded)
    for value in VALUES:
        expected = _valid(READ, value) and value not in excluded
        if len(excluded) == 1 or not expected:  # one input: exact; several: never admits an excluded one
            assert _valid(narrowed, value) == expected, (value, excluded)


def test_strings_other_than_and_a_call_with_nothing_left():
    pattern = string_other_than(["a.b", "a"])
    assert [
        bool(jsonschema.Draft202012Validator({"pattern": pattern}).is_valid(s))
        for s in ["a.b", "a", "", "a.", "a.bc", "ab", "\n"]
    ] == [
        False,
        False,
        True,
        True,
        True,
        True,
        True,
    ]
    assert excluding({"type": "object", "properties": {}}, [{}]) is None
    assert excluding({"type": "object", "properties": {"x": {"const": 1}}, "required": ["x"]}, [{"x": 1}]) is None


WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"enum": ["Oslo", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def _asked_twice(city: str) -> list[dict]:
    return [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": city}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rain"}]},
    ]


def test_the_server_excludes_an_answered_call(tiny_model):
    kw = dict(model="tiny", max_tokens=40, tools=[WEATHER], tool_choice={"type": "any"})
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", temperature=0.0, loop_guard=True)) as base:
        client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        for answered, other in (("Oslo", "Rome"), ("Rome", "Oslo")):
            reply = client.messages.create(messages=_asked_twice(answered), **kw)
            calls = [b.input for b in reply.content if b.type == "tool_use"]
            assert calls and all(c == {"city": other} for c in calls), reply
            counted = client.messages.count_tokens(model="tiny", messages=_asked_twice(answered), tools=[WEATHER])
        guarded = counted.input_tokens
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", temperature=0.0)) as base:
        client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        assert (
            client.messages.count_tokens(model="tiny", messages=_asked_twice("Rome"), tools=[WEATHER]).input_tokens
            == guarded
        )


def test_long_answered_values_compile(tiny_model):
    """Claude Code's absolute paths: the pattern stays flat (a nested one was over the regex
    engine's nesting bound from about 50 characters on, a 400 for the request)."""
    from guided import Constraint

    read = {"type": "function", "function": {"name": "Read", "parameters": READ}}
    paths = [
        {"file_path": f"/tmp/pytest-of-root/pytest-{i}/test_a_claude_code_turn0/workspace/" + "d/" * 40}
        for i in range(8)
    ]
    constraint = Constraint(tiny_model, tools=[read], excluded_calls={"Read": paths})
    assert constraint.tools is not None and [t.name for t in constraint.tools.tools] == ["Read"]

"""A response format beside tools (OpenAI accepts both): under tool_choice "auto" the model either
calls a tool or answers in the format, the answer constrained by its JSON Schema; under "required"
or a named function only calls; under "none" only the answer. Through `ConstrainedSession` and the
server with the official `openai` client (chat and Responses), on the tiny random-weight model (Qwen's
tokenizer and template: `<tool_call>` is a special token)."""

from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest

from coreai import ConstrainedSession
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from guided.errors import UnsupportedSchemaFeature
from tests.tool_defs import TOGGLE, UNIT, track

USER = [{"role": "user", "content": "Hi"}]
ANSWER = {
    "type": "object",
    "properties": {"mood": {"enum": ["happy", "sad"]}, "score": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["mood", "score"],
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}


def _accepts(session, text: str) -> bool:
    """Whether the session's grammar accepts `text` whole, its tool markers fed as their special tokens."""
    hf, ll = session.model.tokenizer.hf, session.tokenizer_info.ll_tokenizer
    ids = []
    for piece in re.split("(<tool_call>|</tool_call>)", text):
        ids += [hf.convert_tokens_to_ids(piece)] if piece in ("<tool_call>", "</tool_call>") else ll.tokenize_str(piece)
    matcher = session.compiled.matcher()
    return matcher.accept_tokens(ids) and matcher.is_accepting()


def _no_calls(model) -> dict[int, float]:
    """A logit bias that keeps every call from starting, so the random model answers: the call marker,
    fences, and every token with an "n" (a JSON call's head is `{"name"`; ANSWER's JSON has no "n")."""
    hf = model.tokenizer.hf
    banned = [i for i in range(len(hf)) if any(s in hf.decode([i]) for s in ("n", "`", "<tool_call>"))]
    return {i: -100.0 for i in banned if i < model.vocab_size}


def test_auto_is_a_call_or_an_answer_in_the_schema(tiny_model):
    session = ConstrainedSession(tiny_model, tools=[UNIT, TOGGLE], schema=ANSWER)
    assert session.tools.mode == "auto"
    assert _accepts(session, '{"mood":"happy","score":3}')
    call = '<tool_call>\n{"name": "toggle", "arguments": {"on": true}}\n</tool_call>'
    assert _accepts(session, call)
    # The bare and fenced JSON calls small models write are calls too (told from an answer by their head).
    assert _accepts(session, '{"name": "toggle", "arguments": {"on": true}}')
    assert _accepts(session, '```json\n{"name": "toggle", "arguments": {"on": true}}\n```')
    for text in ["Hi", '{"mood":"angry","score":3}', '{"score":3}', '{"name": "nope", "arguments": {}}']:
        assert not _accepts(session, text), text
    assert not _accepts(session, 'Hi <tool_call>\n{"name": "toggle", "arguments": {"on": true}}\n</tool_call>')
    # No call can open: the answer comes back as content, valid against the schema.
    result = session.generate(USER, max_tokens=60, logit_bias=_no_calls(tiny_model))
    assert result.valid, result.errors
    assert result.tool_calls == [] and result.value == json.loads(result.content)
    jsonschema.validate(result.value, ANSWER)


def test_a_bare_json_call_is_a_call_and_an_answer_is_content(tiny_model):
    """The tracker holds the output's start until it is a call's head (`{"name": "<tool>"`) or
    cannot be one: a bare call comes back in `tool_calls`, an answer whole in `content`."""
    session = ConstrainedSession(tiny_model, tools=[UNIT, TOGGLE], schema=ANSWER)
    ll = session.tokenizer_info.ll_tokenizer
    cases = [('{"name": "toggle", "arguments": {"on": true}}', ["toggle"]), ('{"mood":"sad","score":2}', [])]
    for text, calls in cases:
        found, labels = track(session, ll.tokenize_str(text))
        assert [c.name for c in found] == calls
        assert (None in labels) == (not calls) and (set(labels) == {None} or not any(x is None for x in labels))


def test_required_and_named_are_calls_only_and_none_is_the_answer_only(tiny_model):
    required = ConstrainedSession(tiny_model, tools=[UNIT, TOGGLE], tool_choice="required", schema=ANSWER)
    assert not _accepts(required, '{"mood":"happy","score":3}')
    named = {"type": "function", "function": {"name": "toggle"}}
    result = ConstrainedSession(tiny_model, tools=[UNIT, TOGGLE], tool_choice=named, json_object=True).generate(
        USER, max_tokens=60
    )
    assert result.valid and [c.name for c in result.tool_calls] == ["toggle"], result.errors
    none = ConstrainedSession(tiny_model, tools=[UNIT], tool_choice="none", schema=ANSWER)
    assert _accepts(none, '{"mood":"sad","score":1}') and not _accepts(none, "Hi")
    result = none.generate(USER, max_tokens=60)
    assert result.valid and result.tool_calls == [], result.errors
    jsonschema.validate(json.loads(result.content), ANSWER)


def test_generic_envelope_answers_in_the_schema(tiny_model):
    session = ConstrainedSession(tiny_model, tools=[UNIT], schema=ANSWER, tool_format="generic")
    assert _accepts(session, '{"response": {"mood":"happy","score":3}}')
    assert not _accepts(session, '{"response": "happy"}')
    assert _accepts(session, '{"tool_calls": [{"name": "set_unit", "arguments": {"unit": "celsius"}}]}')
    answer = ConstrainedSession(tiny_model, tools=[UNIT], tool_choice="none", schema=ANSWER, tool_format="generic")
    result = answer.generate(USER, max_tokens=60)
    assert result.valid and result.tool_calls == [], result.errors
    jsonschema.validate(json.loads(result.content), ANSWER)


def test_answer_keywords_the_grammar_cannot_express_are_refused(tiny_model):
    """Validate-and-rollback follows tool calls only: a keyword of the answer's schema it would need
    is refused by name (never dropped)."""
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(UnsupportedSchemaFeature) as error:
        ConstrainedSession(tiny_model, tools=[UNIT], schema=unique)
    assert (error.value.keyword, error.value.pointer) == ("uniqueItems", "/uniqueItems")
    ConstrainedSession(tiny_model, tools=[UNIT], tool_choice="required", schema=unique)  # the answer is not used


# -- the server, with the official openai client ----------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_model):
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", max_tokens=200, temperature=0.0)) as base:
        yield base


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def test_server_auto_answers_in_the_format_or_calls(tiny, tiny_model):
    banned = {str(i): v for i, v in _no_calls(tiny_model).items()}
    body = dict(model="tiny", messages=USER, tools=[UNIT, TOGGLE], response_format=FORMAT, max_tokens=60)
    answer = _client(tiny).chat.completions.create(**body, logit_bias=banned).choices[0]
    assert answer.finish_reason == "stop" and answer.message.tool_calls is None
    jsonschema.validate(json.loads(answer.message.content), ANSWER)
    chunks = [c for c in _client(tiny).chat.completions.create(**body, logit_bias=banned, stream=True) if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer.message.content
    reply = _client(tiny).chat.completions.create(**{**body, "tool_choice": "required"})
    called = reply.choices[0]
    cut = reply.usage.completion_tokens >= 60  # the random network may list calls up to the budget
    assert called.finish_reason == ("length" if cut else "tool_calls")
    assert called.message.tool_calls and not called.message.content
    for call in called.message.tool_calls:
        assert call.function.name in ("set_unit", "toggle")


def test_server_unenforceable_answer_keyword_is_a_400(tiny):
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "array", "uniqueItems": True}}}
    body = dict(model="tiny", messages=USER, tools=[UNIT], response_format=fmt, max_tokens=8)
    r = httpx.post(tiny + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format.json_schema.schema" and "uniqueItems" in error["message"]


def test_responses_text_format_beside_tools(tiny):
    tool = {"type": "function", "name": "toggle", "parameters": TOGGLE["function"]["parameters"]}
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}}
    response = _client(tiny).responses.create(model="tiny", input="Hi", tools=[tool], text=fmt, max_output_tokens=60)
    assert response.status == "completed", response
    if response.output_text:  # the random model either answers (valid JSON) or calls
        jsonschema.validate(json.loads(response.output_text), ANSWER)
    else:
        assert response.output and {item.type for item in response.output} == {"function_call"}


def test_the_answer_schema_is_described_in_the_prompt(tiny_model, tiny):
    """schema_in_prompt describes the answer's whole schema beside tools (the "schema" style, not the
    default hints: the model chooses between a call and the answer, so it must know the answer's shape)."""
    from guided.schema_prompt import describe_schema

    session = ConstrainedSession(tiny_model, tools=[UNIT], schema=ANSWER, schema_in_prompt=True)
    assert describe_schema(ANSWER, "schema") in session.prompt(USER)[0]["content"]
    required = ConstrainedSession(tiny_model, tools=[UNIT], tool_choice="required", schema=ANSWER)
    assert not required.schema_in_prompt  # calls only: the answer's format is not used
    body = dict(model="tiny", messages=USER, tools=[UNIT], response_format=FORMAT, max_tokens=1)
    described = httpx.post(tiny + "/v1/chat/completions", json={**body, "schema_in_prompt": True}, timeout=60)
    plain = httpx.post(tiny + "/v1/chat/completions", json={**body, "schema_in_prompt": False}, timeout=60)
    assert described.status_code == plain.status_code == 200, described.text
    assert described.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"]


def test_a_pydantic_answer_beside_tools(tiny_model):
    """A pydantic model class as the answer's format: the answer parses into it; a reply of calls
    is valid with nothing to parse."""
    import pydantic

    class Mood(pydantic.BaseModel):
        mood: Literal["happy", "sad"]

    calls = ConstrainedSession(tiny_model, tools=[UNIT], tool_choice="required", schema=Mood, parallel_tool_calls=False)
    result = calls.generate(USER, max_tokens=60)
    assert result.valid and result.tool_calls and result.parsed is None, result.errors
    # compact: the random tiny model would spend its 30 tokens on whitespace under the default layout
    only_json = ConstrainedSession(tiny_model, tools=[UNIT], tool_choice="none", schema=Mood, whitespace="compact")
    answer = only_json.generate(USER, max_tokens=30)
    assert answer.valid and answer.parsed == Mood.model_validate_json(answer.content), answer.errors

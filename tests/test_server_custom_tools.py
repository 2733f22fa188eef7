"""Custom tools over HTTP with the official `openai` SDK (issue #37): Responses `custom_tool_call`
items and `response.custom_tool_call_input.*` events, chat's `tool_calls[].type == "custom"`, the
history (`custom_tool_call` / `custom_tool_call_output`, `previous_response_id`), the enforcement
header and the 400s of a broken or endless grammar. Tiny model for shapes; a few short tests on the
real Qwen model. Inputs are checked by a second matcher (`re.fullmatch`, a fresh Lark matcher)."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai import ConstrainedSession
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from tests.test_tools_custom import DATE, SQL

SQL_TOOL = {
    "type": "custom",
    "name": "sql",
    "description": "Run a SQL query.",
    "format": {"type": "grammar", "syntax": "lark", "definition": SQL},
}
DATE_TOOL = {
    "type": "custom",
    "name": "date",
    "description": "Look up a date.",
    "format": {"type": "grammar", "syntax": "regex", "definition": DATE},
}
CHAT_DATE = {
    "type": "custom",
    "custom": {
        "name": "date",
        "description": "Look up a date.",
        "format": {"type": "grammar", "grammar": {"syntax": "regex", "definition": DATE}},
    },
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def lark_accepts(model, text: str) -> bool:
    matcher = ConstrainedSession(model, grammar=SQL).compiled.matcher()
    return matcher.accept_tokens(model.tokenizer.encode(text, add_special_tokens=False)) and matcher.is_accepting()


@pytest.fixture(scope="module")
def tiny(tiny_model):
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", max_tokens=160, temperature=0.0)) as base:
        yield base


def test_responses_custom_call_whole_streamed_and_replayed(tiny, tiny_model):
    c = client(tiny)
    kw = dict(model="tiny", input="Query it.", tools=[WEATHER, SQL_TOOL], tool_choice={"type": "custom", "name": "sql"})
    raw = c.responses.with_raw_response.create(**kw)
    assert "grammar lark (tool sql)" in raw.headers["x-coreai-enforcement"]
    r = raw.parse()
    [call] = r.output
    assert r.status == "completed" and call.type == "custom_tool_call" and call.name == "sql"
    assert call.call_id.startswith("call_") and lark_accepts(tiny_model, call.input), call.input
    with c.responses.stream(**kw) as stream:
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    [done] = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    final = events[-1].response
    assert "".join(deltas) == done.input == final.output[0].input == call.input  # greedy: the same call
    # The call and its output replayed as input items, then continued through previous_response_id.
    turn = c.responses.create(
        model="tiny",
        tools=[SQL_TOOL],
        max_output_tokens=8,
        input=[
            {"role": "user", "content": "Query it."},
            {"type": "custom_tool_call", "call_id": call.call_id, "name": "sql", "input": call.input},
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "3 rows"},
        ],
    )
    assert turn.status in ("completed", "incomplete")
    items = c.responses.input_items.list(turn.id, order="asc").data
    assert [i.type for i in items] == ["message", "custom_tool_call", "custom_tool_call_output"]
    assert items[1].input == call.input
    answer = [{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "3 rows"}]
    follow = c.responses.create(model="tiny", input=answer, previous_response_id=r.id, max_output_tokens=4)
    assert follow.status in ("completed", "incomplete")


def test_chat_custom_call_whole_streamed_and_replayed(tiny):
    c = client(tiny)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "When?"}], tools=[CHAT_DATE])
    choice = {"type": "custom", "custom": {"name": "date"}}
    message = c.chat.completions.create(**kw, tool_choice=choice).choices[0].message
    [call] = message.tool_calls
    assert call.type == "custom" and call.custom.name == "date" and re.fullmatch(DATE, call.custom.input)
    chunks = list(c.chat.completions.create(**kw, tool_choice=choice, stream=True))
    calls = [t for ch in chunks for t in (ch.choices[0].delta.tool_calls or [])]
    assert calls[0].type == "custom" and calls[0].id.startswith("call_") and calls[0].custom["name"] == "date"
    assert "".join(t.custom["input"] for t in calls) == call.custom.input
    history = kw["messages"] + [
        {"role": "assistant", "tool_calls": [{"id": call.id, "type": "custom", "custom": call.custom.model_dump()}]},
        {"role": "tool", "tool_call_id": call.id, "content": "a Friday"},
    ]
    again = c.chat.completions.create(model="tiny", messages=history, tools=[CHAT_DATE], max_tokens=4)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(("definition", "words"), [('start: "a" (', "1(13)"), ('start: "a" start', "never")])
def test_a_broken_or_endless_grammar_is_a_400_naming_the_tool(tiny, definition, words):
    fmt = {"type": "grammar", "syntax": "lark", "definition": definition}
    responses = httpx.post(
        tiny + "/v1/responses",
        json={"model": "tiny", "input": "x", "tools": [WEATHER, {"type": "custom", "name": "bad", "format": fmt}]},
        timeout=60,
    )
    chat_fmt = {"type": "grammar", "grammar": {"syntax": "lark", "definition": definition}}
    chat = httpx.post(
        tiny + "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "custom", "custom": {"name": "bad", "format": chat_fmt}}],
        },
        timeout=60,
    )
    for response, param in ((responses, "tools[1].format"), (chat, "tools[0].custom.format")):
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == param, error
        assert "tool 'bad'" in error["message"] and words in error["message"].lower(), error


# ---- the real model --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(qwen_model):
    with serve_in_thread(qwen_model, ServerConfig(model_name="qwen", max_tokens=96, temperature=0.0)) as base:
        yield base


def test_qwen_custom_tools_on_both_routes(qwen, qwen_model):
    c = client(qwen)
    ask = "List the names of all users older than 30 from the users table."
    forced = {"type": "custom", "name": "sql"}
    with c.responses.stream(model="qwen", input=ask, tools=[WEATHER, SQL_TOOL], tool_choice=forced) as stream:
        events = list(stream)
    final = events[-1].response
    [call] = [o for o in final.output if o.type == "custom_tool_call"]
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    assert deltas == call.input and lark_accepts(qwen_model, call.input), call.input
    print("qwen sql input:", call.input)
    # Under auto, beside a function tool: a call, if the model makes one, is the date tool's and matches.
    chat = c.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": "Use the date tool to look up the date of Christmas 2025."}],
        tools=[CHAT_DATE, {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
    )
    message = chat.choices[0].message
    print("qwen auto chat:", message.content, message.tool_calls)
    for made in message.tool_calls or []:
        assert made.type != "custom" or re.fullmatch(DATE, made.custom.input), made
    # The round trip: the custom call's output answers it, and the model answers in text.
    turn = c.responses.create(
        model="qwen",
        tools=[SQL_TOOL],
        previous_response_id=final.id,
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "alice, bob"}],
        tool_choice="none",
        max_output_tokens=40,
    )
    print("qwen answer after the output:", turn.output_text)
    assert turn.output_text and turn.status in ("completed", "incomplete")


def test_qwen_regex_forced_on_chat_and_lark_under_auto_on_responses(qwen, qwen_model):
    """The two cases the first real-model test does not cover: the regex date tool forced on chat,
    streamed (the deltas join to the final input, which `re` accepts); the Lark SQL tool under
    `auto` on Responses (a call, if made, is accepted by a fresh Lark matcher)."""
    c = client(qwen)
    ask = [{"role": "user", "content": "What is the date of Christmas Day 2025?"}]
    choice = {"type": "custom", "custom": {"name": "date"}}
    chunks = list(
        c.chat.completions.create(model="qwen", messages=ask, tools=[CHAT_DATE], tool_choice=choice, stream=True)
    )
    pieces = [t for ch in chunks for t in (ch.choices[0].delta.tool_calls or [])]
    streamed = "".join(t.custom["input"] for t in pieces if t.custom)
    whole = c.chat.completions.create(model="qwen", messages=ask, tools=[CHAT_DATE], tool_choice=choice)
    [call] = whole.choices[0].message.tool_calls
    assert streamed == call.custom.input and re.fullmatch(DATE, call.custom.input), (streamed, call)
    assert whole.choices[0].finish_reason == "tool_calls"
    print("qwen forced date:", call.custom.input)
    reply = c.responses.create(
        model="qwen", input="Query the users table for the names of users older than 30.", tools=[SQL_TOOL]
    )
    made = [o for o in reply.output if o.type == "custom_tool_call"]
    print("qwen auto sql:", [o.input for o in made] or reply.output_text)
    assert all(o.name == "sql" and lark_accepts(qwen_model, o.input) for o in made), made

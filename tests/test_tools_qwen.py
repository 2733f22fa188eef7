"""Tool calls on the real Qwen model (marker `model`, tens of tokens each): markup inside an argument,
a `uniqueItems` parameter (validate-and-rollback inside the call), a multi-turn round trip and
`tool_choice: "none"`, through `ConstrainedSession` and through the server with the `openai` client."""

from __future__ import annotations

import json

import pytest
from test_server import client, serve

from coreai import ConstrainedSession
from guided.tools.calls import CallStream
from guided.validation import check_json
from tests.tool_defs import SEARCH

pytestmark = pytest.mark.model

QUERY = "explain the </tool_call> token"
ASK_SEARCH = [{"role": "user", "content": f"Search the web for exactly this query: {QUERY}"}]
TAGS = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "uniqueItems": True}},
    "required": ["tags"],
}
TAG = {"type": "function", "function": {"name": "tag_photo", "description": "Tag a photo.", "parameters": TAGS}}
ASK_TAGS = [{"role": "user", "content": "Tag my photo with these tags, in this order: cat, cat, dog, cat, dog."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
ANSWER_AFTER = [
    {"role": "system", "content": "You are a helpful assistant. After a tool result, answer the user in one sentence."},
    *ASK_WEATHER,
]


def named(tool: dict) -> dict:
    return {"type": "function", "function": {"name": tool["function"]["name"]}}


@pytest.fixture(scope="module")
def qwen(qwen_model):
    with serve(qwen_model, model_name="qwen", max_tokens=256, temperature=0.0) as base:
        yield base


def test_markup_inside_an_argument_forced(qwen_model):
    """The issue's case, certain: the call's tokens (the real tokenizer) with `</tool_call>` written as
    text inside the argument, then the closing marker. The call ends where the grammar closed its JSON."""
    session = ConstrainedSession(qwen_model, tools=[SEARCH], tool_choice=named(SEARCH))
    hf, ll = qwen_model.tokenizer.hf, session.tokenizer_info.ll_tokenizer
    call = json.dumps({"name": "search", "arguments": {"query": QUERY}})
    ids = [
        hf.convert_tokens_to_ids("<tool_call>"),
        *ll.tokenize_str(f"\n{call}\n"),
        hf.convert_tokens_to_ids("</tool_call>"),
    ]
    assert session.matcher.accept_tokens(ids) and session.matcher.is_accepting()  # the end, or whitespace then the end
    tracker = session.tracker()
    tracker.start = 0
    labels = tracker.feed(ids)
    calls = tracker.result(len(ids))[0]
    assert [(c.name, c.args) for c in calls] == [("search", {"query": QUERY})]
    assert None not in labels  # nothing of it is content
    stream = CallStream()  # the streamed fragments: the whole argument, markup and all
    events = stream.feed([(label, ll.decode_str([t])) for t, label in zip(ids, labels, strict=False)]) + stream.finish(
        calls
    )
    assert "".join(e[2] for e in events if e[0] == "args") == calls[0].arguments == json.dumps({"query": QUERY})


def test_markup_inside_an_argument_through_the_server(qwen):
    """Named tool_choice, the query with `</tool_call>` in it, whole and streamed: one call whose
    arguments parse, no call markup in content, finish_reason "tool_calls"."""
    body = dict(model="qwen", messages=ASK_SEARCH, tools=[SEARCH], tool_choice=named(SEARCH), max_tokens=40)
    whole = client(qwen).chat.completions.create(**body).choices[0]
    assert whole.finish_reason == "tool_calls" and not whole.message.content
    [call] = whole.message.tool_calls
    assert call.function.name == "search" and "query" in json.loads(call.function.arguments)
    chunks = [c for c in client(qwen).chat.completions.create(**body, stream=True) if c.choices]
    deltas = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert [d.id for d in deltas if d.id] and "".join(d.function.arguments for d in deltas) == call.function.arguments


def test_unique_items_parameter(qwen, qwen_model):
    """A parameter with `uniqueItems`, which the grammar cannot express: the prompt asks for repeated
    tags; the call's arguments validate (the session's retries show the rollback), also through the server."""
    session = ConstrainedSession(qwen_model, tools=[TAG], tool_choice=named(TAG))
    result = session.generate(ASK_TAGS, max_tokens=40)
    assert result.valid, (result.text, result.errors)
    [call] = result.tool_calls
    assert check_json(call.arguments, TAGS)[1] == [] and len(call.args["tags"]) >= 2
    assert result.stats.retries >= 1, result.text  # the model repeated a tag; the repeat was rolled back
    r = client(qwen).chat.completions.create(
        model="qwen", messages=ASK_TAGS, tools=[TAG], tool_choice=named(TAG), max_tokens=40
    )
    assert r.choices[0].finish_reason == "tool_calls"
    assert check_json(r.choices[0].message.tool_calls[0].function.arguments, TAGS)[1] == []


@pytest.mark.parametrize("stream", [False, True])
def test_required_with_parallel_calls_ends_after_the_call(qwen, stream):
    """`tool_choice: "required"` with parallel calls allowed (OpenAI's default): Qwen writes a newline
    after `</tool_call>`, and the grammar lets it end there, so the reply is the one call asked for,
    not calls repeated until max_tokens."""
    body = dict(model="qwen", messages=ASK_WEATHER, tools=[WEATHER, SEARCH], tool_choice="required", max_tokens=120)
    if stream:
        chunks = list(client(qwen).chat.completions.create(**body, stream=True))
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        indexes = {t.index for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []}
        assert finish == ["tool_calls"] and indexes == {0}
        assert chunks[-1].usage is None or chunks[-1].usage.completion_tokens < 120
        return
    r = client(qwen).chat.completions.create(**body)
    assert r.choices[0].finish_reason == "tool_calls" and r.usage.completion_tokens < 120
    [call] = r.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})


def test_multi_turn_round_trip(qwen, qwen_model):
    """Call -> the tool's result (`role: tool`, its `tool_call_id`) -> an answer in content. Qwen's
    template renders a call's arguments with `tojson`, so the server passes them as a dict, never as
    the JSON text (which it would quote again). The answer turn says `tool_choice: "none"`: under
    "auto" the 0.5B model calls the tool again after its result (so does it unconstrained)."""
    c = client(qwen)
    first = c.chat.completions.create(model="qwen", messages=ANSWER_AFTER, tools=[WEATHER], max_tokens=40).choices[0]
    assert first.finish_reason == "tool_calls", first
    [call] = first.message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages = [
        *ANSWER_AFTER,
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees Celsius and sunny"},
    ]
    body = dict(model="qwen", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=30)
    second = c.chat.completions.create(**body).choices[0]
    assert second.finish_reason == "stop" and not second.message.tool_calls, second
    assert "18" in second.message.content and "<tool_call>" not in second.message.content
    # The prompt the server rendered: the call as the template writes it, then the result.
    from coreai.server.openai.request import template_message
    from coreai.server.openai.schemas import ChatCompletionRequest

    req = ChatCompletionRequest(model="qwen", messages=messages)
    rendered = qwen_model.tokenizer.hf.decode(
        qwen_model.prompt_ids([template_message(m, i) for i, m in enumerate(req.messages)])
    )
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert "<tool_response>\n18 degrees Celsius and sunny\n</tool_response>" in rendered


def test_none_writes_no_call_markup(qwen, qwen_model):
    """Under `tool_choice: "none"` a model that has just called a tool and is asked again writes no
    `<tool_call>` (the special token is outside the text grammar), whole and streamed."""
    history = [
        *ASK_WEATHER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        {"role": "user", "content": "And in Rome? Call the tool again."},
    ]
    body = dict(model="qwen", messages=history, tools=[WEATHER], tool_choice="none", max_tokens=30)
    whole = client(qwen).chat.completions.create(**body).choices[0]
    assert not whole.message.tool_calls and "<tool_call>" not in (whole.message.content or "")
    chunks = [c for c in client(qwen).chat.completions.create(**body, stream=True) if c.choices]
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks)
    session = ConstrainedSession(qwen_model, tools=[WEATHER], tool_choice="none")
    open_id = qwen_model.tokenizer.hf.convert_tokens_to_ids("<tool_call>")
    result = session.generate(history, max_tokens=30)
    assert open_id not in result.token_ids and not result.tool_calls
    stream = CallStream()
    assert stream.feed(result.parts) == []


def test_response_format_beside_tools(qwen):
    """Tools and a response format in one request (auto): the weather question is a call (the bare
    JSON call the model writes), a question no tool serves is answered in the format's JSON."""
    mood = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 80}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": mood}}
    body = dict(model="qwen", tools=[WEATHER], response_format=fmt, max_tokens=60)
    called = client(qwen).chat.completions.create(messages=ASK_WEATHER, **body).choices[0]
    assert called.finish_reason == "tool_calls", called
    assert called.message.tool_calls[0].function.name == "get_weather"
    assert "paris" in json.loads(called.message.tool_calls[0].function.arguments)["city"].lower()
    ask = [{"role": "user", "content": "Who wrote Hamlet?"}]
    # The answer's schema described in the prompt (the extension field), so the model knows the format.
    answered = client(qwen).chat.completions.create(messages=ask, **body, extra_body={"schema_in_prompt": True})
    answered = answered.choices[0]
    assert answered.finish_reason == "stop" and answered.message.tool_calls is None, answered
    assert check_json(answered.message.content, mood)[1] == []
    assert "Shakespeare" in json.loads(answered.message.content)["answer"]

"""`POST /v1/responses` against real uvicorn servers on loopback, with the official `openai` client
(and the OpenAI Agents SDK). The tiny random model covers shapes, events and errors (its text is
noise, but constrained output is valid by construction); the real Qwen model covers behaviour."""

from __future__ import annotations

import json
import logging

import httpx
import jsonschema
import openai
import pydantic
import pytest
from test_reasoning import SCHEMA as OK_SCHEMA, qwen3  # noqa: F401 - the tiny reasoning model fixture

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from coreai.server.responses.store import ResponseStore, output_messages
from coreai.server.responses.reply import ResponseBuilder
from coreai.server.responses.schemas import OutputMessage, OutputTextPart, ResponseCreateRequest
from runtime import GenerationResult, Timings, Usage

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]},
}


class Person(pydantic.BaseModel):
    name: str
    age: int


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tiny(tiny_model):
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", max_tokens=480, temperature=0.0)) as base:
        yield base


@pytest.fixture(scope="module")
def qwen(qwen_model):
    with serve_in_thread(qwen_model, ServerConfig(model_name="qwen", max_tokens=256, temperature=0.0)) as base:
        yield base


# ---- tiny model: shapes, events, errors ------------------------------------------------------------


def test_text_cut_by_max_output_tokens_is_incomplete(tiny):
    r = client(tiny).responses.create(
        model="tiny", input="Say something.", instructions="Be brief.", max_output_tokens=5, metadata={"k": "v"}
    )
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.usage.total_tokens == r.usage.input_tokens + 5
    assert r.usage.output_tokens_details.reasoning_tokens == 0 and r.metadata == {"k": "v"}
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and r.output_text == message.content[0].text


def test_json_schema_format_is_valid(tiny):
    r = client(tiny).responses.create(
        model="tiny",
        input="A person, please.",
        max_output_tokens=120,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
    )
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), PERSON)


def test_stream_events_in_order_assemble_the_whole_text(tiny):
    kw = dict(model="tiny", input="Say something.", max_output_tokens=12)
    with client(tiny).responses.stream(**kw) as stream:
        events = list(stream)
    final = events[-1].response  # the SDK's get_final_response() wants response.completed
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * (len(kinds) - 8),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # cut by max_output_tokens, as OpenAI ends such a stream
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == client(tiny).responses.create(**kw).output_text
    assert final.status == "incomplete" and final.usage.output_tokens == 12


def test_forced_function_call_streams_its_arguments(tiny):
    response = httpx.post(
        tiny + "/v1/responses",
        json={
            "model": "tiny",
            "input": "Weather in Paris?",
            "tools": [WEATHER],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "stream": True,
        },
        timeout=120,
    )
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    fragments = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    n = len(fragments)
    assert n >= 1 and kinds[2 : 5 + n] == [
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * n,
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    done = events[4 + n]["item"]
    assert done["type"] == "function_call" and done["name"] == "get_weather" and done["call_id"].startswith("call_")
    assert "".join(fragments) == done["arguments"] == events[3 + n]["arguments"]  # the fragments make the call
    jsonschema.validate(json.loads(done["arguments"]), WEATHER["parameters"])
    assert kinds[-1] == "response.completed" and events[-1]["response"]["output"][0]["arguments"] == done["arguments"]


def test_input_items_are_rendered(tiny):
    """Messages of every role, parts, a function call and its output, a reasoning item passed back."""
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
        {"role": "user", "content": "Thanks."},
    ]
    r = client(tiny).responses.create(model="tiny", input=items, tools=[WEATHER], max_output_tokens=3)
    assert r.usage.input_tokens > 40 and r.status == "incomplete"


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice.type", "hosted tool"),
        ({"tools": [{"type": "shell_2099"}]}, "tools[0].type", "built-in tool 'shell_2099'"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id", "Missing"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]", "input_image"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]", "function_call_output"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "user"),
        ({"input": []}, "input", "at least one item"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]},
            "input",
            "a response to a preceding message with 'tool_calls'",
        ),
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "call_9", "output": "x"},
                ]
            },
            "input",
            "'tool_call_id' of 'call_9' not found",
        ),
        (  # every function_call is answered by its function_call_output, as OpenAI checks (issue 39)
            {
                "input": [
                    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
                    {"role": "user", "content": "And?"},
                ]
            },
            "input",
            "not answered: call_1",
        ),
        ({"background": True}, "background", "does not support"),
        ({"tools": [{"type": "local_shell", "bogus": 1}]}, "tools[0].bogus", "does not support"),
        ({"include": ["file_search_call.bogus"]}, "include[0]", "message.output_text.logprobs"),
        ({"tool_choice": "required"}, "tool_choice", "only allowed when tools"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}},
            "text.format.schema",
            "",
        ),
        ({"tools": [{**WEATHER, "parameters": {"type": "array"}}]}, "tools[0].parameters", "object"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort", "does not reason"),
    ],
)
def test_bad_requests_are_400_naming_the_field(tiny, body, param, words):
    response = httpx.post(tiny + "/v1/responses", json={"model": "tiny", "input": "Hi.", **body}, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and words in error["message"], error


def test_a_failed_constrained_generation_is_failed_without_output(tiny_model):
    """The chat path's verdict "error" (the output broke its constraint) is never a completed
    response: status failed, the reason in `error`, no output items."""
    req = ResponseCreateRequest.model_validate(
        {"model": "tiny", "input": "Hi.", "text": {"format": {"type": "json_object"}}}
    )
    result = GenerationResult(
        '{"a": tru', [1, 2, 3], "error", Usage(10, 3), Timings(), error="the output is not valid JSON"
    )
    part = OutputTextPart(text='{"a": tru')
    output = [OutputMessage(id="msg_1", status="completed", content=[part])]
    response = ResponseBuilder(req, "tiny", tiny_model.tokenizer).finished(output, "error", result, 0)
    assert response.status == "failed" and response.output == [] and response.output_text == ""
    assert response.error.message == "the output is not valid JSON" and response.usage.output_tokens == 3


def test_unknown_model_is_404(tiny):
    with pytest.raises(openai.NotFoundError):
        client(tiny).responses.create(model="gpt-4o", input="Hi.")


def test_reasoning_item_on_a_thinking_model(qwen3):  # noqa: F811 - the fixture imported above
    with serve_in_thread(qwen3, ServerConfig(model_name="qwen3", max_tokens=400, temperature=0.0)) as base:
        text = {"format": {"type": "json_schema", "name": "ok", "schema": OK_SCHEMA}}
        kw = dict(model="qwen3", input="Is it ok? Answer as JSON.", reasoning={"effort": "low"}, text=text)
        r = client(base).responses.create(**kw)
        with client(base).responses.stream(**kw) as stream:
            events = list(stream)
    kinds = [e.type for e in events]
    streamed = events[-1].response
    reasoning = r.output[0]
    assert reasoning.type == "reasoning" and reasoning.content[0].text
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= 256
    assert r.status == "completed" and json.loads(r.output_text) == json.loads(streamed.output_text)
    assert "response.reasoning_text.delta" in kinds
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert streamed.output[0].content[0].text == reasoning.content[0].text and streamed.output_text == r.output_text


# ---- the real Qwen model ---------------------------------------------------------------------------


@pytest.mark.model
def test_qwen_parse_pydantic_and_function_round_trip(qwen):
    c = client(qwen)
    r = c.responses.parse(model="qwen", input="Ada Lovelace was 36.", text_format=Person, max_output_tokens=40)
    assert isinstance(r.output_parsed, Person) and r.output_parsed.age == 36

    ask = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
    first = c.responses.create(
        model="qwen",
        input=ask,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=40,
    )
    [call] = first.output
    assert call.type == "function_call" and json.loads(call.arguments)["city"] == "Paris"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 18}'}
    # tool_choice "none": the 0.5B model tends to call again under "auto" (docs/reference/responses.md).
    second = c.responses.create(
        model="qwen", input=ask + first.output + [result], tools=[WEATHER], tool_choice="none", max_output_tokens=40
    )
    assert second.status == "completed" and second.output[0].type == "message" and "18" in second.output_text
    # The same round trip as OpenAI's docs write it: the tool's output continues the stored call.
    third = c.responses.create(
        model="qwen",
        previous_response_id=first.id,
        input=[result],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=40,
    )
    assert third.usage.input_tokens == second.usage.input_tokens  # the conversation sent in full, rendered alike
    assert third.output_text == second.output_text  # the same prompt, greedy
    assert third.usage.input_tokens_details.cached_tokens >= third.usage.input_tokens - 1  # from the prefix cache


@pytest.mark.model
def test_qwen_agents_sdk_structured_output(qwen):
    import agents

    model = agents.OpenAIResponsesModel(
        model="qwen", openai_client=openai.AsyncOpenAI(base_url=qwen + "/v1", api_key="x")
    )
    agent = agents.Agent(name="extract", instructions="Extract the person.", model=model, output_type=Person)
    agents.set_tracing_disabled(True)
    result = agents.Runner.run_sync(agent, "Ada Lovelace was 36.")
    assert isinstance(result.final_output, Person) and result.final_output.age == 36


# ---- the store: previous_response_id, GET and DELETE ---------------------------------------------


def test_a_stored_response_is_retrieved_continued_and_deleted(tiny):
    """A response is stored by default: GET gives it back as sent, a follow-up with
    `previous_response_id` renders the earlier turn (more input tokens, the conversation's prefix
    from the prefix cache), DELETE forgets it, and its id is then a 404 in the OpenAI shape."""
    api = client(tiny)
    first = api.responses.create(model="tiny", input="Name a colour.", max_output_tokens=8)
    assert first.store and api.responses.retrieve(first.id).model_dump() == first.model_dump()
    follow = api.responses.create(
        model="tiny", input="And another one?", previous_response_id=first.id, max_output_tokens=8
    )
    assert follow.previous_response_id == first.id
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert follow.usage.input_tokens_details.cached_tokens > first.usage.input_tokens // 2
    api.responses.delete(first.id)
    for call in (lambda: api.responses.retrieve(first.id), lambda: api.responses.delete(first.id)):
        with pytest.raises(openai.NotFoundError) as error:
            call()
        assert error.value.body["code"] == "response_not_found"
    gone = httpx.post(
        tiny + "/v1/responses", json={"model": "tiny", "input": "x", "previous_response_id": first.id}, timeout=60
    )
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "previous_response_id"


def test_store_false_keeps_nothing(tiny):
    r = client(tiny).responses.create(model="tiny", input="Hi.", max_output_tokens=2, store=False)
    assert not r.store
    assert httpx.get(tiny + f"/v1/responses/{r.id}", timeout=60).status_code == 404


def test_a_streamed_response_is_stored_too(tiny):
    events = list(client(tiny).responses.create(model="tiny", input="Hi.", max_output_tokens=4, stream=True))
    final = events[-1].response
    assert client(tiny).responses.retrieve(final.id).output_text == final.output_text


def test_the_store_is_bounded_by_count_and_bytes():
    store = ResponseStore(max_count=2, max_bytes=10_000)
    for i in range(3):
        store.put({"id": f"r{i}", "output": []}, [{"role": "user", "content": "x"}])
    assert store.get("r0") is None and store.get("r1") and store.get("r2") and len(store) == 2
    store.get("r1")  # now the most recently used: r2 goes first
    store.put({"id": "r3", "output": []}, [])
    assert store.get("r2") is None and store.get("r1") and store.get("r3")
    store.put({"id": "big", "output": []}, [{"role": "user", "content": "y" * 20_000}])
    assert store.get("big") is None and len(store) == 2  # larger than the bound alone: not kept
    store.put({"id": "half", "output": []}, [{"role": "user", "content": "z" * 9_920}])
    assert store.get("half") and len(store) == 1  # the bytes bound evicted the others
    assert output_messages(
        [
            {"type": "reasoning", "content": []},
            {"type": "message", "content": [{"type": "output_text", "text": "ok"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        ]
    ) == [
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        }
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_output_tokens_is_never_sent(tiny, stream, caplog):
    """A function call cut by the budget is not output, streamed or not (its events are held until
    the call is complete): the response is `incomplete`, the log names the call, and replaying its
    output as the next request's input, as Codex does, is accepted (a cut call's arguments are not
    JSON text)."""
    body = {"model": "tiny", "input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": "required"}
    body |= {"max_output_tokens": 24, "parallel_tool_calls": False, "stream": stream, "store": False}
    with caplog.at_level(logging.INFO, logger="coreai.service"):
        response = httpx.post(tiny + "/v1/responses", json=body, timeout=120)
    assert "the token budget (24 tokens) cut tool call 'get_weather'" in caplog.text
    if stream:
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        assert not [
            e for e in events if "function_call" in e["type"] or e.get("item", {}).get("type") == "function_call"
        ]
        final = events[-1]["response"]
        assert events[-1]["type"] == "response.incomplete"
    else:
        final = response.json()
    assert final["status"] == "incomplete" and final["usage"]["output_tokens"] == 24
    assert [item for item in final["output"] if item["type"] == "function_call"] == []
    replay = {**body, "stream": False, "max_output_tokens": 4}
    replay["input"] = [{"role": "user", "content": "Weather in Paris?"}, *final["output"]]
    replay["input"].append({"role": "user", "content": "Go on."})
    assert httpx.post(tiny + "/v1/responses", json=replay, timeout=120).status_code == 200


def test_input_items_of_a_stored_response(tiny):
    """`client.responses.input_items.list`: a stored response's input items with ids, newest first
    by default, paged with `limit` / `after` / `order`; a 404 for an unknown response."""
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
    ]
    r = client(tiny).responses.create(model="tiny", input=items, tools=[WEATHER], max_output_tokens=3)
    listed = client(tiny).responses.input_items.list(r.id)
    assert [i.type for i in listed.data] == ["function_call_output", "function_call", "message"]
    assert all(i.id for i in listed.data) and listed.data[2].content[0].text == "Weather in Paris?"
    first = client(tiny).responses.input_items.list(r.id, order="asc", limit=1)
    assert [i.type for i in first.data] == ["message"] and first.has_more
    rest = client(tiny).responses.input_items.list(r.id, order="asc", after=first.data[0].id)
    assert [i.type for i in rest.data] == ["function_call", "function_call_output"] and not rest.has_more
    text = client(tiny).responses.create(model="tiny", input="Hi.", max_output_tokens=2)
    [message] = client(tiny).responses.input_items.list(text.id).data
    assert message.role == "user" and message.content[0].text == "Hi."
    with pytest.raises(openai.NotFoundError):
        client(tiny).responses.input_items.list("resp_unknown")


def test_a_local_shell_call_and_its_output_round_trip(qwen):
    """The real model, asked to list files with only `local_shell`: a `local_shell_call` whose
    `exec` command is an argument vector, whole and streamed (added and done, as OpenAI streams it);
    the call and its output passed back are answered."""
    c = client(qwen)
    ask = "List the files in the current directory."
    tools = [{"type": "local_shell"}]
    first = c.responses.create(model="qwen", input=ask, tools=tools, tool_choice="required", max_output_tokens=60)
    [call] = [item for item in first.output if item.type == "local_shell_call"]
    assert call.action.type == "exec" and call.action.command and all(isinstance(a, str) for a in call.action.command)
    assert "ls" in " ".join(call.action.command)
    with c.responses.stream(model="qwen", input=ask, tools=tools, tool_choice="required", max_output_tokens=60) as s:
        kinds = [(e.type, getattr(getattr(e, "item", None), "type", None)) for e in s]
    assert ("response.output_item.done", "local_shell_call") in kinds
    output = {"type": "local_shell_call_output", "id": call.call_id, "output": "notes.txt\nmain.py"}
    items = [{"role": "user", "content": ask}, call.model_dump(exclude_none=True), output]
    answer = c.responses.create(model="qwen", input=items, tools=tools, max_output_tokens=40)
    assert answer.status in ("completed", "incomplete") and answer.output

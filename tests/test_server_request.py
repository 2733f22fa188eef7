"""The server's one request and one outcome: a Responses body is mapped once into a
`GenerationRequest` whose errors name the Responses fields, and a streamed reply ends with the
outcome a whole reply is rendered from (`coreai.service.events`)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from coreai.server.config import ServerConfig
from coreai.server.dispatch import prepared
from coreai.server.errors import APIError
from coreai.server.openai import schemas
from coreai.server.openai.reply import ChatReply
from coreai.server.responses.reply import ResponseBuilder
from coreai.server.responses.request import RESPONSES_NAMES, generation_request
from coreai.server.responses.schemas import ResponseCreateRequest
from coreai.server.responses.stream import events
from coreai.service import Job, ReplyEvents, Service
from coreai.service import finish_of as outcome_of
from coreai.service.engine import Piece
from guided import Constraint, GrammarCache, GuidedResult
from guided.outcome import decide
from guided.tools.calls import ToolCall
from runtime import Timings, Usage

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def responses_body(**fields) -> ResponseCreateRequest:
    return ResponseCreateRequest.model_validate({"model": "tiny", "input": "Hi.", **fields})


def test_a_responses_body_is_mapped_once_in_the_template_form():
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
    ]
    text = {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}}
    req = responses_body(input=items, instructions="Sys.", tools=[WEATHER], text=text, max_output_tokens=9)
    generation, conversation = generation_request(req)
    assert generation.messages == [
        {"role": "system", "content": "Sys."},
        {"role": "system", "content": "Be brief."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": "18 C", "tool_call_id": "c1"},
    ]
    assert conversation[0] == {"role": "developer", "content": "Be brief."}  # stored as sent, no instructions
    assert conversation[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert generation.answer == ("text.format.schema", {"schema": {"type": "object"}, "strict": True})
    assert generation.tools == [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
    assert generation.names == RESPONSES_NAMES and generation.max_tokens == 9


@pytest.mark.parametrize(
    "fields, param, words",
    [
        (
            {
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"},
                    {"type": "function_call_output", "call_id": "c", "output": "ok"},
                ]
            },
            "input[1].arguments",
            "JSON text",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "no message to answer"),
        (
            {"text": {"format": {"type": "json_object"}}, "structured_outputs": {"regex": "a+"}},
            "structured_outputs",
            "give either text.format or structured_outputs",
        ),
    ],
)
def test_mapping_errors_name_the_responses_fields(fields, param, words):
    with pytest.raises(APIError) as error:
        generation_request(responses_body(**fields))
    assert error.value.status == 400 and error.value.param == param and words in error.value.message


@pytest.fixture(scope="module")
def preparer(tiny_model):
    service = Service(tiny_model, ServerConfig(max_tokens=100).settings(), GrammarCache())
    return SimpleNamespace(prepare=lambda generation: prepared(service, generation))  # as a request runs it


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"tools": [{**WEATHER, "parameters": {"type": "array"}}]}, "tools[0].parameters", "object"),
        ({"reasoning": {"effort": "low"}}, "reasoning.effort", "reasoning.effort: this model does not reason"),
        ({"input": "x " * 5000}, "input", "context"),
    ],
)
def test_prepare_errors_name_the_responses_fields(preparer, fields, param, words):
    """The prepare step's own checks spell the parameters as the front end's mapping says."""
    generation, _ = generation_request(responses_body(**fields))
    with pytest.raises(APIError) as error:
        preparer.prepare(generation)
    assert error.value.param == param and words in error.value.message, error.value.message


class ListJob:
    """A job whose generation already ran: its pieces, then its result."""

    cancel = threading.Event()

    def __init__(self, items):
        self.items = [*items, Job.END]

    def release(self):
        self.cancel.set()

    async def get(self):
        return self.items.pop(0)


def cut_call():
    """The pieces and result of a forced call cut by the budget: its name and part of its arguments."""
    parts = [("markup", "<tool_call>\n"), ("call:0", '{"name": "get_weather", "arguments": {"city": "Par')]
    pieces = [Piece("<tool_call>\n" + parts[1][1], parts=parts, call_ids=("call_a",))]
    result = GuidedResult(pieces[0].text, [1] * 12, "length", Usage(10, 12), Timings(), tool_calls=[])
    result.outcome = decide(result, "", [], None, None, constrained=True)  # as the verdict decides it
    return pieces, result


def test_the_responses_stream_and_the_whole_response_agree_on_a_cut_call(tiny_model):
    """One outcome: the cut call is in neither the stream (its events were held) nor its final
    response nor the whole response, all `incomplete`; chat says "length"."""
    pieces, result = cut_call()
    constraint = Constraint(tiny_model, tools=[WEATHER], tool_choice="required")
    req = responses_body(tools=[WEATHER], tool_choice="required")
    builder = ResponseBuilder(req, "tiny", tiny_model.tokenizer)
    whole = builder.render(outcome_of(pieces, result, ReplyEvents(constraint, None))).model_dump()

    async def stream():
        return [e async for e in events(builder, ReplyEvents(constraint, None), ListJob([*pieces, result]))]

    streamed = asyncio.run(stream())
    final = streamed[-1]
    assert final["type"] == "response.incomplete" and whole["status"] == "incomplete"
    assert [e for e in streamed if e["type"].startswith("response.output_item")] == []
    assert final["response"]["output"] == whole["output"] == []
    chat = ChatReply(
        schemas.ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "x"}], stream=True),
        constraint,
        tiny_model,
        "t",
    )
    assert chat.complete([(pieces, result)]).choices[0].finish_reason == "length"
    chunks = asyncio.run(collect(chat.stream([ListJob([*pieces, result])])))
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def collect(stream):
    return [item async for item in stream]


def test_a_cut_after_complete_calls_is_a_cut_on_every_front_end(tiny_model):
    """A complete call, then one cut by the budget: chat keeps the complete call and says "length"
    (stream and whole alike: the stream sends no fragment of the cut call); Responses is
    `incomplete` (max_output_tokens) with the complete call `completed`, streamed whole, and the cut
    one never sent."""
    done = ToolCall("call_a", "get_weather", '{"city": "Paris"}', {"city": "Paris"}, 0)
    parts = [
        ("markup", "<tool_call>\n"),
        ("call:0", done.arguments.join(['{"name": "get_weather", "arguments": ', "}"])),
        ("markup", "\n</tool_call>\n<tool_call>\n"),
        ("call:1", '{"name": "get_weather", "arguments": {"city": "Ro'),
    ]
    pieces = [Piece("".join(t for _, t in parts), parts=parts, call_ids=("call_a", "call_b"))]
    result = GuidedResult(pieces[0].text, [1] * 30, "length", Usage(10, 30), Timings(), tool_calls=[done])
    result.outcome = decide(result, "", [done], None, None, constrained=True)
    constraint = Constraint(tiny_model, tools=[WEATHER], tool_choice="required")
    request = schemas.ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "x"}], stream=True)
    chat = ChatReply(request, constraint, tiny_model, "t")
    choice = chat.complete([(pieces, result)]).choices[0]
    assert choice.finish_reason == "length" and [c.id for c in choice.message.tool_calls] == ["call_a"]
    chunks = asyncio.run(collect(chat.stream([ListJob([*pieces, result])])))
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    streamed_calls = [t for c in chunks for t in c["choices"][0]["delta"].get("tool_calls") or []]
    assert {t["index"] for t in streamed_calls} == {0}  # the complete call only
    assert "".join(t["function"]["arguments"] for t in streamed_calls) == done.arguments
    builder = ResponseBuilder(responses_body(tools=[WEATHER], tool_choice="required"), "tiny", tiny_model.tokenizer)
    whole = builder.render(outcome_of(pieces, result, ReplyEvents(constraint, None))).model_dump()
    assert whole["status"] == "incomplete" and whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [(i["call_id"], i["status"]) for i in whole["output"]] == [("call_a", "completed")]
    streamed = asyncio.run(collect(events(builder, ReplyEvents(constraint, None), ListJob([*pieces, result]))))
    done = [e["item"] for e in streamed if e["type"] == "response.output_item.done"]
    deltas = "".join(e["delta"] for e in streamed if e["type"] == "response.function_call_arguments.delta")
    assert [(i["call_id"], i["status"]) for i in done] == [("call_a", "completed")] and deltas == done[0]["arguments"]
    assert streamed[-1]["response"]["output"] == done


def test_local_shell_is_a_tool_the_model_sees_and_its_calls_come_back_as_local_shell_calls():
    """Responses' client-run `local_shell` tool: shown to the model as the `local_shell` function
    (its `exec` action's fields), a call of it rendered as a `local_shell_call` item, and a call and
    output passed back rendered as the same call and its result."""
    from coreai.server.responses import local_shell

    call = {"type": "local_shell_call", "id": "lsh_1", "call_id": "c1", "status": "completed"}
    call["action"] = {"type": "exec", "command": ["ls", "-la"], "env": {}, "working_directory": "/tmp"}
    output = {"type": "local_shell_call_output", "id": "c1", "output": "a.txt"}
    req = responses_body(input=[call, output, {"role": "user", "content": "And?"}], tools=[{"type": "local_shell"}])
    generation, _ = generation_request(req)
    assert generation.tools == [{"type": "function", "function": {**local_shell.tool().model_dump(exclude={"type"})}}]
    assistant, result = generation.messages[0], generation.messages[1]
    arguments = {"command": ["ls", "-la"], "working_directory": "/tmp"}
    assert assistant["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "local_shell", "arguments": arguments}}
    ]
    assert result == {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}
    builder = ResponseBuilder(req, "tiny", None)
    item = builder.function_call("lsh_2", "c2", "local_shell", '{"command": ["pwd"]}', "completed")
    assert item.model_dump() == {
        "type": "local_shell_call",
        "id": "lsh_2",
        "call_id": "c2",
        "action": {
            "type": "exec",
            "command": ["pwd"],
            "env": {},
            "timeout_ms": None,
            "user": None,
            "working_directory": None,
        },
        "status": "completed",
    }
    plain = ResponseBuilder(responses_body(tools=[WEATHER]), "tiny", None)  # no local_shell tool: a function call
    assert plain.function_call("fc_1", "c3", "local_shell", "{}", "completed").type == "function_call"

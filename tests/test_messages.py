"""The Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`) with the official
`anthropic` SDK against a real server on loopback: the tiny models for shapes, events and errors,
the real Qwen model for what users do (structured outputs, parse, forced tools, a tool round trip,
streams, a Claude Code-shaped request)."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pydantic
import pytest
from test_reasoning import qwen3  # noqa: F401 - the tiny reasoning model fixture

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread

USER = [{"role": "user", "content": "Say something."}]
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


class City(pydantic.BaseModel):
    name: str
    country: str


def client(base: str, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)


@pytest.fixture(scope="module")
def tiny(tiny_model):
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", max_tokens=480, temperature=0.0)) as base:
        yield base


@pytest.fixture(scope="module")
def qwen(qwen_model):
    with serve_in_thread(qwen_model, ServerConfig(model_name="qwen", max_tokens=256, temperature=0.0)) as base:
        yield base


# ---- tiny model: shapes, events, errors ------------------------------------------------------------


def test_a_cut_reply_and_its_usage(tiny):
    r = client(tiny).messages.create(model="tiny", max_tokens=5, system="Be brief.", messages=USER)
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant" and r.model == "tiny"
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None and r.usage.output_tokens == 5
    [block] = r.content
    assert block.type == "text" and block.text
    counted = client(tiny).messages.count_tokens(model="tiny", system="Be brief.", messages=USER)
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == counted.input_tokens


def test_the_stream_is_the_sdk_event_order_and_agrees_with_the_whole_reply(tiny):
    kw = dict(model="tiny", max_tokens=12, messages=USER)
    whole = client(tiny).messages.create(**kw)
    with client(tiny).messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason == "max_tokens"
    assert final.usage.output_tokens == whole.usage.output_tokens == 12
    raw = httpx.post(tiny + "/v1/messages", json={**kw, "stream": True}, timeout=60).text
    assert [line.split(": ", 1)[1] for line in raw.splitlines() if line.startswith("event: ")][:3] == [
        "message_start",
        "ping",
        "content_block_start",
    ]


def test_a_stream_waiting_on_its_prefill_sends_pings(slow_tiny_model, monkeypatch):
    """While a prompt prefills, the stream is not silent: Claude Code aborts a Messages stream with
    no event for 300 s and retries it from scratch (seen with its full default prompt on this CPU).
    Here every forward pass is 5 ms slower and a ping is due after 1 ms without an event."""
    from coreai.server.anthropic import reply

    monkeypatch.setattr(reply, "PING_SECONDS", 0.001)
    kw = dict(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Say something. " * 150}])
    config = ServerConfig(model_name="tiny", max_tokens=480, temperature=0.0)
    with serve_in_thread(slow_tiny_model, config) as base:
        raw = httpx.post(base + "/v1/messages", json={**kw, "stream": True}, timeout=60).text
        with client(base).messages.stream(**kw) as stream:  # the SDK reads the pings as Anthropic's
            final = stream.get_final_message()
    kinds = [line.split(": ", 1)[1] for line in raw.splitlines() if line.startswith("event: ")]
    first_block = kinds.index("content_block_start")
    assert kinds[0] == "message_start" and kinds[1:first_block].count("ping") >= 2, kinds[:first_block]
    assert kinds[-1] == "message_stop" and final.usage.output_tokens == 4


def test_a_stop_sequence_is_reported(tiny):
    whole = client(tiny).messages.create(model="tiny", max_tokens=40, messages=USER)
    text = whole.content[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    r = client(tiny).messages.create(model="tiny", max_tokens=40, messages=USER, stop_sequences=[stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop and stop not in r.content[0].text


def test_a_failed_constrained_output_is_a_refusal_never_end_turn(tiny):
    """The grammar forces "red", the final check refuses it: `stop_reason: "refusal"`, the text not
    presented, the reason in `stop_details`, whole and streamed; `parse` never parses it."""
    schema = {"type": "object", "properties": {"c": {"enum": ["red"], "not": {"const": "red"}}}, "required": ["c"]}
    kw = dict(
        model="tiny", max_tokens=20, messages=USER, output_config={"format": {"type": "json_schema", "schema": schema}}
    )
    r = client(tiny).messages.create(**kw)
    assert r.stop_reason == "refusal" and r.content == [] and "not valid" in r.stop_details.explanation
    with client(tiny).messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "refusal" and final.stop_details.explanation == r.stop_details.explanation


def test_thinking_blocks_on_a_reasoning_model(qwen3):  # noqa: F811 - the fixture imported above
    config = ServerConfig(model_name="qwen3", max_tokens=400, temperature=0.0)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    kw = dict(
        model="qwen3",
        max_tokens=80,
        messages=[{"role": "user", "content": "Is it ok?"}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    with serve_in_thread(qwen3, config) as base:
        kw["thinking"] = {"type": "enabled", "budget_tokens": 8}  # the budget forces the end marker
        r = client(base).messages.create(**kw)
        with client(base).messages.stream(**kw) as stream:
            kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
            final = stream.get_final_message()
        off = client(base).messages.create(**{**kw, "thinking": {"type": "disabled"}})
    thinking, answer = r.content
    assert thinking.type == "thinking" and thinking.thinking and answer.type == "text"
    assert json.loads(answer.text).keys() == {"ok"}
    assert ("content_block_delta", "thinking_delta") in kinds and final.content[0].thinking == thinking.thinking
    assert [b.type for b in off.content] == ["text"]


def test_models_in_the_anthropic_shape_and_the_api_key_header(tiny_model):
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", api_key="k")) as base:
        page = client(base, api_key="k").models.list()
        assert [m.id for m in page.data] == ["tiny"] and page.data[0].type == "model"
        assert client(base, api_key="k").models.retrieve("tiny").display_name == "tiny"
        with pytest.raises(anthropic.AuthenticationError) as error:
            client(base, api_key="wrong").messages.create(model="tiny", max_tokens=2, messages=USER)
        assert error.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": error.value.body["error"]["message"]},
        }
        openai_shape = httpx.get(base + "/v1/models", headers={"authorization": "Bearer k"}).json()
        assert openai_shape["object"] == "list"


BAD = [
    ({"messages": USER}, 400, "max_tokens"),  # missing
    (
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
        400,
        "messages[0].content[0].text",
    ),
    (
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        400,
        "image blocks",
    ),
    (
        {"max_tokens": 5, "messages": USER, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
        400,
        "'nope'",
    ),
    (
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]},
        400,
        "tool_use_id 't1'",
    ),
    (
        {
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
                },
                {"role": "user", "content": "And?"},
            ],
            "tools": [WEATHER],
        },
        400,
        "not answered: t1",
    ),
    (
        {
            "max_tokens": 5,
            "messages": USER,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "tool", "name": "web_search"},
        },
        400,
        "web_search_20250305",
    ),
    ({"max_tokens": 5, "messages": USER, "container": "c1"}, 400, "container"),
    ({"max_tokens": 5, "messages": USER, "tool_choice": {"type": "any"}}, 400, "only allowed when tools are given"),
    (
        {
            "max_tokens": 5,
            "messages": USER,
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "nope"}}},
        },
        400,
        "output_config.format",
    ),
    ({"max_tokens": 5, "messages": USER, "model": "claude-x"}, 404, "claude-x"),
    ({"max_tokens": 5, "messages": [*USER, {"role": "assistant", "content": "Sure"}]}, 400, "prefilled"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": ""}]}, 400, "messages[0].content"),
    ({"max_tokens": 5, "messages": [*USER, {"role": "assistant", "content": []}, *USER]}, 400, "messages[1].content"),
    (
        {
            "max_tokens": 5,
            "messages": USER,
            "stop_sequences": ["}"],
            "output_format": {"type": "json_schema", "schema": {}},
        },
        400,
        "stop_sequences",
    ),
]


@pytest.mark.parametrize("body, status, words", BAD)
def test_bad_requests_get_anthropic_errors(tiny, body, status, words):
    r = httpx.post(tiny + "/v1/messages", json={"model": "tiny", **body}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    assert error["type"] == "error" and error["error"]["type"] == kind and words in error["error"]["message"], error


# ---- Claude Code's protocol: deferred tools and tool search, the probe, ?beta=true, a cut call -------

SEARCH = {
    "name": "ToolSearch",
    "description": "Loads deferred tools.",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
}
DEFERRED = {**WEATHER, "defer_loading": True}


def _searched(reference: str = "get_weather") -> list[dict]:
    """A conversation whose tool search answered with a `tool_reference` to `reference`."""
    return [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {"query": "select:get_weather"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "tool_reference", "tool_name": reference}],
                }
            ],
        },
    ]


def _prompt(base: str, body: dict) -> str:
    """The rendered prompt's length in tokens (count_tokens, as Claude Code asks: `?beta=true`)."""
    r = httpx.post(base + "/v1/messages/count_tokens?beta=true", json={"model": "tiny", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["input_tokens"]


def test_a_deferred_tool_is_hidden_until_a_tool_reference_loads_it(tiny):
    plain = _prompt(tiny, {"messages": USER, "tools": [SEARCH]})
    assert _prompt(tiny, {"messages": USER, "tools": [SEARCH, DEFERRED]}) == plain  # not rendered
    forced = {"max_tokens": 30, "tool_choice": {"type": "tool", "name": "get_weather"}}
    r = httpx.post(
        tiny + "/v1/messages", json={"model": "tiny", "messages": USER, "tools": [SEARCH, DEFERRED], **forced}
    )
    assert r.status_code == 400 and "defer_loading" in r.json()["error"]["message"]  # not callable either
    # Loaded: the reference expands to the definition in the tool result, the tool list stays as it was.
    loaded = {"messages": _searched(), "tools": [SEARCH, DEFERRED]}
    entry = {"description": WEATHER["description"], "name": "get_weather", "parameters": WEATHER["input_schema"]}
    expanded = _searched()
    expanded[2]["content"][0]["content"] = f"<functions>\n<function>{json.dumps(entry)}</function>\n</functions>"
    assert _prompt(tiny, loaded) == _prompt(tiny, {"messages": expanded, "tools": [SEARCH]})
    r = client(tiny).messages.create(model="tiny", **loaded, **forced)
    assert r.stop_reason in ("tool_use", "max_tokens"), r
    assert all(b.name == "get_weather" for b in r.content if b.type == "tool_use")


def test_a_tool_reference_to_no_tool_of_the_request_is_a_400(tiny):
    body = {"model": "tiny", "max_tokens": 5, "messages": _searched("nope"), "tools": [SEARCH, DEFERRED]}
    r = httpx.post(tiny + "/v1/messages?beta=true", json=body, timeout=60)
    assert r.status_code == 400 and "messages[2].content[0].content[0].tool_name" in r.json()["error"]["message"]


def test_the_start_up_probe_and_the_beta_query(tiny):
    assert httpx.head(tiny + "/api/hello").status_code == 200  # Claude Code's HEAD /api/hello
    body = {
        "model": "tiny",
        "max_tokens": 3,
        "messages": USER,
        "thinking": {"type": "enabled", "budget_tokens": 9, "display": "updates"},
    }
    r = httpx.post(tiny + "/v1/messages?beta=true", json=body, timeout=60)
    assert r.status_code == 200 and "thinking.display" in r.headers["x-coreai-ignored"]


def test_a_call_cut_by_the_budget_is_never_a_partial_tool_use(tiny):
    kw = dict(
        model="tiny", max_tokens=16, messages=USER, tools=[WEATHER], tool_choice={"type": "any"}
    )  # opened, then cut
    whole = client(tiny).messages.create(**kw)
    assert whole.stop_reason == "max_tokens" and all(b.type != "tool_use" for b in whole.content)
    with client(tiny).messages.stream(**kw) as stream:
        starts = [e.content_block.type for e in stream if e.type == "content_block_start"]
        final = stream.get_final_message()
    assert "tool_use" not in starts and final.stop_reason == "max_tokens" and final.content == whole.content


# ---- the real model: what users do -----------------------------------------------------------------


def test_create_structured_and_parse(qwen):
    c = client(qwen)
    plain = c.messages.create(
        model="qwen", max_tokens=30, messages=[{"role": "user", "content": "Say hello in French."}]
    )
    assert plain.stop_reason == "end_turn" and "bonjour" in plain.content[0].text.lower()
    schema = City.model_json_schema()
    fmt = {"format": {"type": "json_schema", "schema": schema}}
    r = c.messages.create(
        model="qwen", max_tokens=60, messages=[{"role": "user", "content": "Paris"}], output_config=fmt
    )
    jsonschema.validate(json.loads(r.content[0].text), schema)
    assert r.stop_reason == "end_turn"
    parsed = c.messages.parse(
        model="qwen", max_tokens=60, messages=[{"role": "user", "content": "Oslo"}], output_format=City
    )
    assert parsed.parsed_output == City(name="Oslo", country="Norway")


def test_tools_forced_any_none_and_a_round_trip(qwen):
    c = client(qwen)
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    strict = {**WEATHER, "strict": True}
    forced = c.messages.create(
        model="qwen", max_tokens=60, messages=ask, tools=[strict], tool_choice={"type": "tool", "name": "get_weather"}
    )
    [call] = forced.content
    assert forced.stop_reason == "tool_use" and call.type == "tool_use" and call.input == {"city": "Oslo"}
    anyone = c.messages.create(
        model="qwen",
        max_tokens=60,
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    assert [b.type for b in anyone.content] == ["tool_use"] and anyone.stop_reason == "tool_use"
    none = c.messages.create(model="qwen", max_tokens=20, messages=ask, tools=[WEATHER], tool_choice={"type": "none"})
    assert [b.type for b in none.content] == ["text"] and "<tool_call>" not in none.content[0].text
    history = [
        *ask,
        {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "12 degrees and rain"}],
        },
    ]
    # The 0.5B model asks for the weather again under auto (so does it without a grammar): "none" lets it answer.
    answer = c.messages.create(
        model="qwen", max_tokens=40, messages=history, tools=[WEATHER], tool_choice={"type": "none"}
    )
    assert answer.stop_reason == "end_turn" and "12" in answer.content[0].text
    assert answer.usage.cache_read_input_tokens > 0  # the first turn's prefix, from the prefix cache
    cut = c.messages.create(model="qwen", max_tokens=14, messages=ask, tools=[strict], tool_choice={"type": "any"})
    assert cut.stop_reason == "max_tokens" and all(b.type != "tool_use" for b in cut.content)  # no partial call


def test_streamed_tool_input_joins_to_the_final_input(qwen):
    kw = dict(
        model="qwen",
        max_tokens=60,
        messages=[{"role": "user", "content": "What is the weather in Rome?"}],
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    with client(qwen).messages.stream(**kw) as stream:
        pieces = [e.delta.partial_json for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    [call] = final.content
    assert len(pieces) > 1 and json.loads("".join(pieces)) == call.input == {"city": "Rome"}
    [whole] = client(qwen).messages.create(**kw).content
    assert final.stop_reason == "tool_use" and (whole.name, whole.input) == (call.name, call.input)


def test_a_claude_code_shaped_request(qwen):
    """As Claude Code sends it: always streaming, system blocks with cache_control, a dozen tools,
    metadata, temperature 1 and a large max_tokens; answered 200, twice, the second reading the
    first's prefix from the cache."""
    tools = [
        {
            "name": f"Tool{i}",
            "description": f"Tool number {i}.",
            "input_schema": {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": False,
            },
        }
        for i in range(12)
    ]
    system = [
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be concise.", "cache_control": {"type": "ephemeral"}},
    ]
    body = dict(
        model="qwen",
        max_tokens=32000,
        system=system,
        tools=tools,
        metadata={"user_id": "user_abc"},
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
        ],
    )
    usages = []
    for _ in range(2):
        # SDK 2.x has no sampling arguments; older SDKs and Claude Code send temperature in the body.
        with client(qwen).messages.stream(**body, extra_body={"temperature": 1}) as stream:
            final = stream.get_final_message()
        usages.append(final.usage)
        assert final.stop_reason in ("end_turn", "tool_use", "max_tokens")
    assert usages[1].cache_read_input_tokens > 0.9 * (usages[0].input_tokens + usages[0].cache_read_input_tokens)


def test_a_fault_mid_stream_is_the_api_error_event():
    """After the first event the status is sent: a bug is its API's `error` event, numbered on
    Responses, Anthropic's shape on Messages (the traceback logged, not sent)."""
    import asyncio

    from coreai.server.anthropic.reply import sse as messages_sse
    from coreai.server.responses.stream import sse_events as responses_sse

    async def broken():
        yield {"type": "message_start"}
        raise RuntimeError("a bug")

    async def frames(render):
        return [frame async for frame in render(broken())]

    first, fault = asyncio.run(frames(messages_sse))
    assert first.startswith("event: message_start\n") and fault.startswith("event: error\n")
    assert json.loads(fault.split("data: ", 1)[1]) == {
        "type": "error",
        "error": {"type": "api_error", "message": "internal server error (RuntimeError)"},
    }
    first, fault = asyncio.run(frames(responses_sse))
    assert json.loads(first.split("data: ", 1)[1])["sequence_number"] == 0
    assert json.loads(fault.split("data: ", 1)[1])["sequence_number"] == 1


def test_client_run_tool_types_are_shown_to_the_model_and_not_named(tiny):
    """Anthropic's client-run types (`bash_20250124`, `text_editor_*`, `memory_*`) carry no
    `input_schema`: the model sees them with their published schemas (the prompt grows by them) and
    the header does not name them as left out; computer use (screenshots) still is."""
    c = client(tiny)
    bash = {"type": "bash_20250124", "name": "bash"}
    computer = {"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768}
    bare = c.messages.count_tokens(model="tiny", messages=USER).input_tokens
    raw = c.messages.with_raw_response.count_tokens(model="tiny", messages=USER, tools=[bash, computer])
    with_tools = raw.parse().input_tokens
    assert with_tools > bare + 40, (bare, with_tools)  # the bash schema's tokens (the tiny context is 512)
    assert raw.headers.get("x-coreai-ignored") == "tools[1] (computer_20250124)"
    with pytest.raises(anthropic.BadRequestError, match="computer"):  # forced, it is still not run here
        c.messages.create(
            model="tiny",
            max_tokens=5,
            messages=USER,
            tools=[computer],
            tool_choice={"type": "tool", "name": "computer"},
        )


def test_a_forced_bash_call_validates_against_its_published_schema(qwen):
    from coreai.server.anthropic.client_tools import BASH

    c = client(qwen)
    ask = [{"role": "user", "content": "List the files in /tmp."}]
    tools = [{"type": "bash_20250124", "name": "bash"}]
    reply = c.messages.create(model="qwen", max_tokens=60, messages=ask, tools=tools, tool_choice={"type": "any"})
    [call] = [b for b in reply.content if b.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and call.name == "bash"
    jsonschema.validate(call.input, BASH)
    assert "ls" in call.input["command"]


@pytest.mark.parametrize(
    "kind, name, sample",
    [
        ("bash_20250124", "bash", {"command": "ls -la"}),
        ("text_editor_20250124", "str_replace_editor", {"command": "undo_edit", "path": "/a.py"}),
        (
            "text_editor_20250728",
            "str_replace_based_edit_tool",
            {"command": "view", "path": "/a", "view_range": [1, 9]},
        ),
        ("memory_20250818", "memory", {"command": "rename", "old_path": "/memories/a", "new_path": "/memories/b"}),
    ],
)
def test_each_client_run_type_maps_to_its_published_schema(kind, name, sample):
    from coreai.server.anthropic import schemas as m
    from coreai.server.anthropic.request import hosted_tools, model_tools

    tools = [m.ClientRunTool.model_validate({"type": kind, "name": name})]
    [tool] = model_tools(tools)
    assert tool.name == name and not hosted_tools(tools)
    jsonschema.Draft202012Validator.check_schema(tool.input_schema)
    jsonschema.validate(sample, tool.input_schema)
    if kind == "text_editor_20250728":  # no undo_edit in the newer editor
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"command": "undo_edit", "path": "/a"}, tool.input_schema)


def test_a_client_run_tool_is_a_strict_body_with_a_valid_name_and_can_be_deferred(tiny):
    """A client-run tool is validated as a client tool: a bad name or an unknown field is a 400
    naming it (not a 500), and `defer_loading` hides it until a reference loads it, as for any tool."""
    for tool, param in (
        ({"type": "bash_20250124", "name": "my bash!"}, "tools[0].name"),
        ({"type": "bash_20250124", "name": "bash", "bogus": 1}, "tools[0].bogus"),
    ):
        r = httpx.post(
            tiny + "/v1/messages", json={"model": "tiny", "max_tokens": 5, "messages": USER, "tools": [tool]}
        )
        assert r.status_code == 400 and param in r.json()["error"]["message"], r.text
    deferred = {"type": "bash_20250124", "name": "bash", "defer_loading": True}
    body = {"model": "tiny", "max_tokens": 5, "messages": USER, "tools": [deferred]}
    forced = httpx.post(tiny + "/v1/messages", json={**body, "tool_choice": {"type": "tool", "name": "bash"}})
    assert forced.status_code == 400 and "deferred" in forced.text, forced.text

"""Codex CLI end to end against `coreai serve` (issue #47), and the parts of the Responses dialect
Codex needs, each with the real client: the Codex CLI (`tests/codex_cli.py`), the `openai` SDK and
the `websockets` client, against real uvicorn servers on loopback.

Fast lane: a tiny network that ends its turn at once (its context long enough for Codex's ~16k-token
request) runs a whole Codex turn over the WebSocket and over HTTP; namespace tools, reasoning
capsules and the WebSocket's rules on the tiny models. Model lane: the real Qwen model answers
"What does hello.py print?" through Codex, which executes a tool call the model made."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import openai
import pydantic
import pytest
import websockets.exceptions
import websockets.sync.client as ws_client
from codex_cli import apply_patch, codex_exec, codex_missing, short_config
from test_reasoning import SCHEMA as OK_SCHEMA
from test_reasoning import qwen3  # noqa: F401 - the tiny reasoning model fixture
from test_tools_escaped import lark_accepts

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from coreai.server.responses.capsule import open_capsule

# Codex's own warning for a model missing from its catalog: not an API error.
CATALOG_WARNING = "Model metadata for"


def api_errors(run) -> list[str]:
    return [e for e in run.errors if not e.startswith(CATALOG_WARNING)]


@pytest.fixture(scope="module")
def ending_model(ending_model_dir):
    """A tiny qwen2 network with a 128k-token context that writes <|im_end|> first, always
    (conftest's `ending_model_dir`)."""
    from runtime import load_model

    return load_model(ending_model_dir)


@pytest.fixture(scope="module")
def ending(ending_model):
    # 2048 tokens: a compaction's summary (at most 1,200 characters) is written in full.
    with serve_in_thread(ending_model, ServerConfig(model_name="tiny", max_tokens=2048, temperature=0.0)) as base:
        yield base


@pytest.fixture(scope="module")
def tiny(tiny_model):
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", max_tokens=48, temperature=0.0)) as base:
        yield base


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


# ---- the CLI on the tiny model ----------------------------------------------------------------------


@pytest.mark.parametrize("websockets", [True, False], ids=["websocket", "http"])
def test_codex_turn_completes_on_the_tiny_model(ending, tmp_path, websockets):
    """Codex's whole first request (namespace and web_search tools, encrypted reasoning, store false,
    its hints) is accepted and the turn completes: over the WebSocket with no fallback to HTTP."""
    assert codex_missing() is None, codex_missing()
    run = codex_exec(ending, "tiny", "Say hi.", tmp_path, websockets=websockets, timeout=300)
    assert run.returncode == 0, (run.errors, run.stderr[-2000:])
    assert run.completed and api_errors(run) == [], run.errors
    usage = next(e["usage"] for e in run.events if e.get("type") == "turn.completed")
    assert usage["input_tokens"] > 4000  # Codex's instructions and tools reached the model


def test_codex_compacts_and_carries_on(ending, tmp_path):
    """With a low auto-compact limit, Codex's second turn first compacts (Codex 0.171.0 with a custom
    provider compacts inline: its summarization prompt as a request with `tool_choice: "auto"` and no
    tools, refused with a 400 before #47), then the turn completes on the summary."""
    low = "model_auto_compact_token_limit = 2000"
    first = codex_exec(ending, "tiny", "Say hi.", tmp_path, extra_config=low, timeout=300)
    assert first.returncode == 0 and first.completed, first.errors
    second = codex_exec(ending, "tiny", "And again.", tmp_path, extra_config=low, timeout=300, resume=True)
    assert second.returncode == 0 and second.completed and api_errors(second) == [], second.errors
    rollouts = "".join(p.read_text() for p in (tmp_path / "home" / ".codex" / "sessions").rglob("*.jsonl"))
    assert '"compaction_response_id":"resp_' in rollouts  # Codex recorded the compaction it got


# ---- recorded traffic -----------------------------------------------------------------------------

# A Codex 0.171.0 session recorded through `codex_cli.recording_proxy` (HTTP transport, the tiny ending
# model): three turns (`exec`, then `exec resume --last` twice) with a compaction before each later
# turn (auto-compact limit 2,000 tokens): five requests of ~23-42 KB, in order.
SESSION = Path(__file__).parent / "data" / "codex" / "session.jsonl.gz"


def recorded() -> list[dict]:
    with gzip.open(SESSION, "rt") as f:
        return [json.loads(line) for line in f]


def test_recorded_codex_session_replays_and_parses_with_the_sdk(ending):
    from openai.types.responses import Response, ResponseStreamEvent

    events_of = pydantic.TypeAdapter(ResponseStreamEvent)
    requests = recorded()
    assert len(requests) == 5 and sum(not r["body"].get("tools") for r in requests) == 2  # two compactions
    for request in requests:
        assert request["path"] == "/v1/responses"
        body = request["body"] | {"model": "tiny"}
        with httpx.stream("POST", f"{ending}/v1/responses", json=body, timeout=300) as r:
            assert r.status_code == 200, r.read()
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        events = [events_of.validate_python(json.loads(line)) for line in lines]
        assert events[-1].type == "response.completed", events[-1]
        Response.model_validate(events[-1].response.model_dump())
        whole = httpx.post(f"{ending}/v1/responses", json=body | {"stream": False}, timeout=300)
        assert Response.model_validate(whole.json()).status == "completed"


# ---- namespace tools ------------------------------------------------------------------------------

AGENTS = {
    "type": "namespace",
    "name": "agents",
    "description": "Sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "close_agent",
            "description": "Close an agent.",
            "parameters": {
                "type": "object",
                "properties": {"target": {"type": "string", "maxLength": 8}},
                "required": ["target"],
                "additionalProperties": False,
            },
        }
    ],
}


def test_namespace_tool_call_comes_back_with_its_namespace(tiny):
    c = client(tiny)
    forced = {"type": "function", "name": "agents__close_agent"}
    tools = [AGENTS, {"type": "web_search", "external_web_access": False}]
    r = c.responses.create(model="tiny", input="Close agent 7.", tools=tools, tool_choice=forced)
    [call] = [item for item in r.output if item.type == "function_call"]
    assert (call.name, call.namespace) == ("close_agent", "agents")
    assert "target" in json.loads(call.arguments)
    with c.responses.stream(model="tiny", input="Close agent 7.", tools=tools, tool_choice=forced) as stream:
        events = list(stream)
    added = next(e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call")
    assert (added.name, added.namespace) == ("close_agent", "agents")
    # Passed back as Codex stores it: the model sees the flat name again, the pairing holds.
    back = [
        {"role": "user", "content": "Close agent 7."},
        call.model_dump(exclude_none=True, exclude={"status", "id"}),
        {"type": "function_call_output", "call_id": call.call_id, "output": "closed"},
    ]
    follow = c.responses.create(model="tiny", input=back, tools=tools, max_output_tokens=4)
    assert follow.status in ("completed", "incomplete")


def test_namespace_tools_colliding_with_a_function_are_a_400(tiny):
    flat = {"type": "function", "name": "agents__close_agent", "parameters": {"type": "object"}}
    r = httpx.post(f"{tiny}/v1/responses", json={"model": "tiny", "input": "x", "tools": [AGENTS, flat]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[1].name"


# ---- reasoning capsules ---------------------------------------------------------------------------


def test_reasoning_encrypted_content_round_trips(qwen3):  # noqa: F811 - the fixture imported above
    text = {"format": {"type": "json_schema", "name": "ok", "schema": OK_SCHEMA}}
    kw = dict(model="qwen3", input="Is it ok? Answer as JSON.", reasoning={"effort": "low"}, text=text)
    with serve_in_thread(qwen3, ServerConfig(model_name="qwen3", max_tokens=300, temperature=0.0)) as base:
        c = client(base)
        r = c.responses.create(**kw, include=["reasoning.encrypted_content"], store=False)
        with c.responses.stream(**kw, include=["reasoning.encrypted_content"]) as stream:
            streamed = stream.get_final_response()
        plain = c.responses.create(**kw)
        reasoning = r.output[0]
        assert open_capsule("reasoning", reasoning.encrypted_content) == {"text": reasoning.content[0].text}
        assert streamed.output[0].encrypted_content and plain.output[0].encrypted_content is None
        # Sent back (as Codex does with store false): accepted; a damaged capsule is a 400 naming it.
        item = reasoning.model_dump(exclude_none=True, exclude={"status"})
        turn = [{"role": "user", "content": "Is it ok?"}, item, {"role": "user", "content": "Again, as JSON."}]
        again = c.responses.create(model="qwen3", input=turn, text=text, max_output_tokens=300)
        assert again.status == "completed"
        turn[1] = item | {"encrypted_content": item["encrypted_content"][:-6] + "!!!!!!"}
        with pytest.raises(openai.BadRequestError) as bad:
            c.responses.create(model="qwen3", input=turn, text=text)
        assert bad.value.body["param"] == "input[1].encrypted_content"


# ---- local compaction ----------------------------------------------------------------------------

TURNS = [
    {"role": "user", "content": "What does hello.py print?"},
    {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "cat hello.py"}'},
    {"type": "function_call_output", "call_id": "c1", "output": 'print("Hello, Ada!")'},
    {"role": "assistant", "content": "It prints Hello, Ada!"},
]


def test_a_compaction_trigger_is_answered_with_one_compaction_item(ending):
    c = client(ending)
    r = c.responses.create(model="tiny", input=[*TURNS, {"type": "compaction_trigger"}], store=False)
    [item] = r.output
    assert r.status == "completed" and item.type == "compaction" and item.encrypted_content
    assert open_capsule("compaction", item.encrypted_content)["summary"]
    with c.responses.stream(model="tiny", input=[*TURNS, {"type": "compaction_trigger"}]) as stream:
        events = list(stream)
    assert not [e for e in events if e.type.startswith("response.output_text")]  # the summary is not streamed
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == ["compaction"] and events[-1].response.output[0].id == done[0].id
    # Replayed in a later request (on any instance: the capsule is self-contained), it expands.
    compacted = item.model_dump(exclude_none=True)
    later = c.responses.create(model="tiny", input=[compacted, {"role": "user", "content": "And now?"}])
    assert later.status == "completed" and later.usage.input_tokens > 20
    bad = compacted | {"encrypted_content": "gAAAA-openai-sealed"}
    with pytest.raises(openai.BadRequestError) as refused:
        c.responses.create(model="tiny", input=[bad, {"role": "user", "content": "And now?"}])
    assert refused.value.body["param"] == "input[0].encrypted_content"


def test_responses_compact_endpoint(ending):
    compacted = client(ending).responses.compact(model="tiny", input=TURNS)
    assert compacted.object == "response.compaction"
    assert [i.type for i in compacted.output] == ["message", "compaction"]
    assert compacted.output[0].content[0].text == TURNS[0]["content"]
    assert open_capsule("compaction", compacted.output[-1].encrypted_content)["summary"]


# ---- the WebSocket --------------------------------------------------------------------------------


def socket(base: str, **kw):
    return ws_client.connect(base.replace("http://", "ws://") + "/v1/responses", **kw)


def answer(conn) -> list[dict]:
    """The events of one request, up to its final one (or an error)."""
    events = []
    while True:
        event = json.loads(conn.recv(timeout=120))
        events.append(event)
        if event["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
            return events


def test_websocket_answers_as_the_sse_stream_does(tiny):
    body = {"model": "tiny", "input": "Say hi.", "max_output_tokens": 6, "store": False}
    with httpx.stream("POST", f"{tiny}/v1/responses", json=body | {"stream": True}) as r:
        sse_kinds = [json.loads(line[6:])["type"] for line in r.iter_lines() if line.startswith("data: ")]
    with socket(tiny) as conn:
        conn.send(json.dumps({"type": "response.create", **body, "generate": False}))
        warm = answer(conn)
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        assert warm[-1]["response"]["output"] == []
        conn.send(json.dumps({"type": "response.create", **body}))
        events = answer(conn)
        assert [e["type"] for e in events] == sse_kinds
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        first = events[-1]["response"]
        # store false: the connection still knows it, so the next request sends only the new item.
        follow = {"model": "tiny", "input": [{"role": "user", "content": "More."}], "max_output_tokens": 4}
        conn.send(json.dumps({"type": "response.create", **follow, "previous_response_id": first["id"]}))
        assert answer(conn)[-1]["type"] == "response.incomplete"
        # A bad request is an error event in OpenAI's shape; the connection stays open.
        conn.send(json.dumps({"type": "response.create", "model": "tiny", "input": "x", "temperature": 9}))
        [error] = answer(conn)
        assert error["type"] == "error" and error["status"] == 400 and error["error"]["param"] == "temperature"
        conn.send(json.dumps({"type": "response.create", **body}))
        assert answer(conn)[-1]["type"] == "response.incomplete"
        # A prewarm names the model as every request does: an unknown one is the same 404.
        conn.send(json.dumps({"type": "response.create", **body, "model": "nope", "generate": False}))
        [error] = answer(conn)
        assert error["status"] == 404 and error["error"]["code"] == "model_not_found"
    missing = httpx.get(f"{tiny}/v1/responses/{first['id']}")
    assert missing.status_code == 404  # store false: never in the server's store


def test_websocket_keeps_the_http_shells_rules(tiny_model):
    config = ServerConfig(model_name="tiny", max_tokens=8, api_key="k", max_body_bytes=2048)
    with serve_in_thread(tiny_model, config) as base:
        with pytest.raises(websockets.exceptions.InvalidStatus):
            socket(base).close()  # no key: refused at the handshake
        with socket(base, additional_headers={"Authorization": "Bearer k"}) as conn:
            conn.send(json.dumps({"type": "response.create", "model": "tiny", "input": "x" * 4000}))
            [error] = answer(conn)
            assert error["status"] == 413
            conn.send(json.dumps({"type": "response.cancel"}))
            assert answer(conn)[0]["error"]["param"] == "type"


# ---- the CLI on the real model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(qwen_model):
    config = ServerConfig(model_name="qwen2.5-coder-0.5b-instruct", max_tokens=1024, temperature=0.0)
    with serve_in_thread(qwen_model, config) as base:
        yield base


@pytest.mark.model
def test_codex_runs_a_tool_call_of_the_real_model(qwen, tmp_path):
    """ "What does hello.py print?" on Qwen2.5-Coder-0.5B through Codex (its prompt shortened by its own
    configuration, `codex_cli.short_config`): the CLI executes a shell command the model wrote, and
    the turn ends without an API error."""
    assert codex_missing() is None, codex_missing()
    model = "qwen2.5-coder-0.5b-instruct"
    files = {"hello.py": 'print("Hello, Ada!")\n'}
    run = codex_exec(
        qwen, model, "What does hello.py print?", tmp_path, extra_config=short_config(tmp_path, model), files=files
    )
    commands = [c for c in run.items("command_execution") if c.get("status") == "completed"]
    assert commands, run.events
    # Every request was accepted and answered (no 4xx/5xx, no fallback from the WebSocket). Known gap
    # (issue #47, docs/reports/codex.md): the 0.5B model, once it has the command's output, often runs
    # away inside a call's arguments until its budget ends, and Codex fails the turn on that
    # incomplete response; that is the only error allowed.
    cut = "Incomplete response returned, reason: max_output_tokens"
    assert [e for e in api_errors(run) if e and e != cut] == [], (run.errors, run.stderr[-2000:])
    assert run.completed or cut in run.errors, run.events


APPLY_PATCH_TOOL = json.loads((Path(__file__).parent / "data" / "codex" / "apply_patch_tool.json").read_text())


@pytest.mark.model
def test_a_forced_apply_patch_of_the_real_model_parses_and_applies(qwen, tmp_path):
    """Codex's freeform `apply_patch` (its Lark grammar, captured from the CLI), forced on the real
    model: the input carried JSON-escaped decodes to a patch holding real newlines that Codex's
    grammar parses and Codex's own apply_patch applies."""
    (tmp_path / "hello.py").write_text('print("Hello, world!")\n')
    ask = 'In hello.py, which holds print("Hello, world!"), make it print "Hello, Ada!" instead.'
    r = client(qwen).responses.create(
        model="qwen2.5-coder-0.5b-instruct",
        input=ask,
        tools=[APPLY_PATCH_TOOL],
        tool_choice={"type": "custom", "name": "apply_patch"},
        max_output_tokens=200,
    )
    [call] = [item for item in r.output if item.type == "custom_tool_call"]
    patch = call.input
    assert "\n" in patch and "\\n" not in patch, patch
    assert lark_accepts(APPLY_PATCH_TOOL["format"]["definition"], patch), patch
    done = apply_patch(patch, tmp_path)
    assert done.returncode == 0, (patch, done.stderr)

"""Responses streams stay alive while a long prompt prefills: `response.in_progress` is sent again
after every `coreai.server.responses.stream.KEEPALIVE_SECONDS` without an event, on the SSE stream
and on the WebSocket. Codex aborts a stream with no parsed event for its `stream_idle_timeout_ms`
(300 s by default; SSE comments do not reset it) and sends the request again, and a CPU prefill of
its prompt can take longer than that. Real servers on loopback; the `openai` SDK reads the SSE
stream, the `websockets` client the socket."""

from __future__ import annotations

import json
import time

import openai
import pytest
import websockets.sync.client as ws_client

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from coreai.server.responses import stream

FINAL = ("response.completed", "response.incomplete", "response.failed", "error")


class SlowPrefill:
    """A network whose every pass over more than one token (a prefill chunk) takes `per_token`
    seconds longer per token: a prefill as slow as a CPU's on a long prompt, decoding unchanged."""

    def __init__(self, network, per_token: float):
        self.network, self.per_token = network, per_token

    def __call__(self, ids, *args, **kwargs):
        if ids.shape[-1] > 1:
            time.sleep(self.per_token * ids.size)
        return self.network(ids, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.network, name)


@pytest.fixture
def slow_prefill_model(tiny_model_dir):
    """The tiny model (a fresh copy) with prefill 2.5 ms a token: some 1.2 s for `PROMPT`."""
    from runtime import load_model

    model = load_model(tiny_model_dir)
    model.network = SlowPrefill(model.network, 0.0025)
    return model


PROMPT = "Say something. " * 150  # some 450 tokens
CONFIG = ServerConfig(model_name="tiny", max_tokens=480, temperature=0.0, prompt_cache_bytes=0)


def before_output(kinds: list[str]) -> list[str]:
    """The event types before the first output item."""
    return kinds[: kinds.index("response.output_item.added")]


def test_an_sse_stream_waiting_on_its_prefill_sends_in_progress_again(slow_prefill_model, monkeypatch):
    """While the prompt prefills (over a second here), `response.in_progress` comes again every
    0.2 s, numbered in order with the other events, and the `openai` SDK's stream helper (which
    checks that each lifecycle event names the response it began with) reads every event."""
    monkeypatch.setattr(stream, "KEEPALIVE_SECONDS", 0.2)
    with serve_in_thread(slow_prefill_model, CONFIG) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        with client.responses.stream(model="tiny", input=PROMPT, max_output_tokens=4) as events:
            seen = list(events)
    final = seen[-1].response
    kinds = [e.type for e in seen]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    waiting = before_output(kinds)
    assert waiting.count("response.in_progress") >= 3, waiting
    assert set(waiting[1:]) == {"response.in_progress"}, waiting
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    again = [e for e in seen if e.type == "response.in_progress"]
    assert all(e.response.id == final.id and e.response.status == "in_progress" for e in again)
    assert all(e.response.output == [] for e in again)
    assert kinds[-1] == "response.incomplete" and final.status == "incomplete"
    assert final.output_text and final.usage.output_tokens == 4


def test_a_websocket_waiting_on_its_prefill_sends_in_progress_again(slow_prefill_model, monkeypatch):
    """The same on the WebSocket (Codex's transport): its idle timer counts every message."""
    monkeypatch.setattr(stream, "KEEPALIVE_SECONDS", 0.2)
    body = {"type": "response.create", "model": "tiny", "input": PROMPT, "max_output_tokens": 4}
    with serve_in_thread(slow_prefill_model, CONFIG) as base:
        with ws_client.connect(base.replace("http://", "ws://") + "/v1/responses") as conn:
            conn.send(json.dumps(body))
            events = []
            while not events or events[-1]["type"] not in FINAL:
                events.append(json.loads(conn.recv(timeout=60)))
    kinds = [e["type"] for e in events]
    waiting = before_output(kinds)
    assert waiting[0] == "response.created" and waiting.count("response.in_progress") >= 3, waiting
    assert set(waiting[1:]) == {"response.in_progress"}, waiting
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert kinds[-1] == "response.incomplete" and events[-1]["response"]["usage"]["output_tokens"] == 4

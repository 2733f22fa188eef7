"""Responses streams stay alive while a long prompt prefills: `response.in_progress` is sent again
after every `coreai.server.responses.stream.KEEPALIVE_SECONDS` without an event, on the SSE stream
and on the WebSocket. Codex aborts a stream with no parsed event for its `stream_idle_timeout_ms`
(300 s by default; SSE comments do not reset it) and sends the request again, and a CPU prefill of
its prompt can take longer than that. Real servers on loopback; the `openai` SDK reads the SSE
stream, the `websockets` client the socket, and the real Codex CLI (`tests/codex_cli.py`) runs a
turn whose prefill outlasts its idle timeout."""

from __future__ import annotations

import json
import time

import openai
import pytest
import websockets.sync.client as ws_client
from codex_cli import codex_exec, codex_missing, config_toml, short_config
from test_agent_codex import api_errors, ending_model  # noqa: F401 - the tiny model that ends at once

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from coreai.server.responses import stream
from coreai.service.service import Service

FINAL = ("response.completed", "response.incomplete", "response.failed", "error")


class SlowPrefill:
    """A network whose every pass over more than one token (a prefill chunk) takes `per_token`
    seconds longer per token: a prefill as slow as a CPU's on a long prompt, decoding unchanged.
    `slept`: the seconds added so far."""

    def __init__(self, network, per_token: float):
        self.network, self.per_token, self.slept = network, per_token, 0.0

    def __call__(self, ids, *args, **kwargs):
        if ids.shape[-1] > 1:
            time.sleep(self.per_token * ids.size)
            self.slept += self.per_token * ids.size
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


# ---- the real Codex CLI -----------------------------------------------------------------------------

IDLE_MS = 3000  # Codex's stream_idle_timeout_ms here (its default: 300,000)
PREFILL_S = 7.0  # the prefill of Codex's prompt here: over twice the idle timeout
CODEX_PROMPT = 1840  # tokens of Codex 0.171.0's first request (`short_config`) on the tiny tokenizer


@pytest.fixture
def submitted(monkeypatch) -> list[int]:
    """The prompt lengths of the generations the server was asked for (each request, retries too)."""
    out: list[int] = []
    submit = Service.submit

    def counting(self, job, names=None):
        out.append(len(job.prompt_ids))
        return submit(self, job, names)

    monkeypatch.setattr(Service, "submit", counting)
    return out


def short_idle_timeout(monkeypatch) -> None:
    """Codex's provider with `stream_idle_timeout_ms = IDLE_MS` and two stream retries (a stream it
    gives up on is sent again, and counted)."""

    def patched(*args, **kwargs) -> str:
        lines = config_toml(*args, **kwargs).splitlines()
        assert [line for line in lines if line.startswith("[")][-1] == "[model_providers.coreai]", lines
        lines = [line for line in lines if not line.startswith(("stream_idle_timeout_ms", "stream_max_retries"))]
        return "\n".join([*lines, f"stream_idle_timeout_ms = {IDLE_MS}", "stream_max_retries = 2", ""])

    monkeypatch.setattr("codex_cli.config_toml", patched)  # what `codex_exec` writes


@pytest.mark.parametrize("websockets", [True, False], ids=["websocket", "http"])
def test_codex_waits_out_a_prefill_longer_than_its_idle_timeout(
    ending_model,  # noqa: F811 - the fixture imported above
    submitted,
    monkeypatch,
    tmp_path,
    websockets,
):
    """Codex with `stream_idle_timeout_ms` 3 s, a prefill of its prompt of some 7 s and the
    keepalive every second: the turn completes on its first request, with no reconnect. Without the
    keepalive (seen with it at 3,600 s), each stream is cut after 3 s ("Reconnecting... 1/2
    (stream disconnected before completion: idle timeout waiting for SSE)", over the WebSocket
    "...waiting for websocket", then a fall back to HTTP): 3 requests over HTTP, 6 over the
    WebSocket; with Codex's retries at 0, the turn fails."""
    assert codex_missing() is None, codex_missing()
    short_idle_timeout(monkeypatch)
    monkeypatch.setattr(stream, "KEEPALIVE_SECONDS", 1.0)
    slow = SlowPrefill(ending_model.network, PREFILL_S / CODEX_PROMPT)
    monkeypatch.setattr(ending_model, "network", slow)
    config = ServerConfig(model_name="tiny", max_tokens=64, temperature=0.0, prompt_cache_bytes=0)
    with serve_in_thread(ending_model, config) as base:
        short = short_config(tmp_path, "tiny")
        run = codex_exec(base, "tiny", "Say hi.", tmp_path, websockets=websockets, extra_config=short, timeout=120)
    assert run.returncode == 0 and run.completed, (run.errors, run.stderr[-2000:])
    assert api_errors(run) == [], run.errors
    assert "idle timeout" not in run.stderr and "stream disconnected" not in run.stderr, run.stderr[-2000:]
    assert len(submitted) == 1, submitted
    assert slow.slept > 2 * IDLE_MS / 1000, slow.slept  # the stream waited on the prefill that long

"""One prefill of an agent's prompt per machine, not per session (`coreai.service.markers`,
`coreai.service.resend`), on a tiny model with a long context and a real server on loopback:

- the volatile markers of Claude Code's real requests (tests/data/claude_code/, captured from the
  pinned CLI by tests/capture_claude_code.py) are removed by the rule table, and nothing else is;
- two recorded sessions with different first questions, replayed: the second's first request reads
  its shared prefix from the cache (>= 95 % of its prompt), names the removal in `x-coreai-ignored`
  and is counted in `/health`'s stats; with the rules off, it does not (the rules are what do it);
- a client that leaves a stream while its prompt prefills and sends the same request again gets the
  running prefill (one prefill: the engine's count), and a client that leaves for good frees its row;
- every dialect's usage, streamed and whole, reports the tokens read from the cache.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import websockets.sync.client as ws_client
from conftest import SlowNetwork
from test_agent_cli import tiny_long  # noqa: F401 - the tiny network with a long context

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from coreai.service.markers import RULES, strip_markers

DATA = Path(__file__).parent / "data" / "claude_code"
BILLING, COUNTDOWN = (rule.name for rule in RULES)


def _posts(name: str) -> list[dict]:
    recorded = json.loads((DATA / name).read_text())
    return [r for r in recorded["requests"] if r["method"] == "POST" and r["body"].get("system")]


def _system(body: dict) -> str:
    return "\n\n".join(block["text"] for block in body["system"])


def test_the_rules_remove_claude_codes_markers_and_nothing_else():
    first, other = _posts("session.json")[0]["body"], _posts("other_question.json")[0]["body"]
    a, b = _system(first), _system(other)
    assert a != b and a.startswith("x-anthropic-billing-header: cc_version=2.1.332.")  # the real capture
    (sa, sb), removed = [strip_markers([{"role": "system", "content": t}])[0][0]["content"] for t in (a, b)], None
    assert sa == sb and sa.startswith("You are a Claude agent")  # identical once the markers are out
    _, removed = strip_markers([{"role": "system", "content": a}])
    assert removed == [BILLING, COUNTDOWN]  # the billing line, and the countdown at the system's end
    assert "<total_tokens>" not in sa and len(a) - len(sa) < 200  # the markers only
    # The later form with a `cch=` field, alone as the first block, in its own words.
    cch = "x-anthropic-billing-header: cc_version=2.1.37.3a1; cc_entrypoint=cli; cch=4f2e1;\n\nYou are Claude."
    assert strip_markers([{"role": "system", "content": cch}])[0][0]["content"] == "You are Claude."
    # A countdown in its own reminder block goes with the block; in a tool result too.
    tool = {
        "role": "tool",
        "content": "No tasks\n\n<system-reminder>\n<total_tokens>42 tokens left</total_tokens>\n</system-reminder>",
    }
    assert strip_markers([tool]) == ([{"role": "tool", "content": "No tasks"}], [COUNTDOWN])
    # Windows line endings: the line and its blank line go whole.
    crlf = "x-anthropic-billing-header: cc_version=2.1.332.862; cc_entrypoint=sdk-cli;\r\n\r\nYou are Claude."
    assert strip_markers([{"role": "system", "content": crlf}])[0][0]["content"] == "You are Claude."
    # Quoted elsewhere (not at the start of the system message, nor a system message; a countdown
    # mid-sentence, outside a reminder of its own): kept.
    quoted = [
        {"role": "system", "content": "Rules.\nx-anthropic-billing-header: cc_version=1; cc_entrypoint=cli;"},
        {"role": "user", "content": "x-anthropic-billing-header: cc_version=1; what is this line?"},
        {"role": "user", "content": "Why does the log show <total_tokens>12 tokens left</total_tokens> here?"},
    ]
    assert strip_markers(quoted) == (quoted, [])


@pytest.fixture(scope="module")
def agent_server(tiny_long):  # noqa: F811
    config = ServerConfig(model_name="tiny", aliases=("claude-*",), max_tokens=4, temperature=0.0)
    with serve_in_thread(tiny_long, config) as base:
        yield base


def _first_request(base: str, post: dict) -> httpx.Response:
    """The recorded request sent as the CLI sent it (streamed), read whole."""
    headers = {"anthropic-beta": post["headers"].get("anthropic-beta", ""), "x-api-key": "unused"}
    return httpx.post(base + "/v1/messages?beta=true", json=post["body"], headers=headers, timeout=600)


def _final_usage(reply: httpx.Response) -> dict:
    events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
    return next(e["usage"] for e in reversed(events) if e["type"] == "message_delta")


def test_a_second_session_with_another_question_reads_the_shared_prefix(agent_server):
    """Session A's first request, then session B's (another first question, same workspace): B's
    prompt is read from the cache but for its own question; both name the removed markers."""
    a, b = _first_request(agent_server, _posts("session.json")[0]), None
    assert a.status_code == 200, a.text
    assert f"{BILLING} (removed from the prompt)" in a.headers["x-coreai-ignored"]
    b = _first_request(agent_server, _posts("other_question.json")[0])
    usage = _final_usage(b)
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert prompt > 20_000 and usage["cache_read_input_tokens"] >= 0.95 * prompt, usage
    stats = httpx.get(agent_server + "/health").json()["stats"]
    assert stats["markers_removed"][BILLING] >= 2 and stats["markers_removed"][COUNTDOWN] >= 2, stats


def test_without_the_rules_the_second_session_prefills_again(tiny_long):  # noqa: F811
    config = ServerConfig(model_name="tiny", aliases=("claude-*",), max_tokens=4, temperature=0.0, strip_markers=False)
    with serve_in_thread(tiny_long, config) as base:
        _first_request(base, _posts("session.json")[0])
        b = _first_request(base, _posts("other_question.json")[0])
    usage = _final_usage(b)
    assert "x-coreai-ignored" not in b.headers or BILLING not in b.headers["x-coreai-ignored"]
    assert usage["cache_read_input_tokens"] < 100, usage  # the billing line is a few tokens in


@pytest.fixture
def slow_long(tiny_long):  # noqa: F811
    """`tiny_long` with every forward pass 0.1 s slower: a 3,000-token prompt prefills for seconds."""
    network = tiny_long.network
    tiny_long.network = SlowNetwork(network, 0.1)
    yield tiny_long
    tiny_long.network = network


LONG = {
    "model": "tiny",
    "max_tokens": 4,
    "stream": True,
    "messages": [{"role": "user", "content": "Tell me about the sea and the ships that sail on it. " * 250}],
}


def _leave_while_prefilling(base: str, seconds: float) -> None:
    """Open the stream, read its first event, leave after `seconds` (as a CLI's idle watchdog does)."""
    with httpx.stream("POST", base + "/v1/messages", json=LONG, headers={"x-api-key": "unused"}, timeout=60) as r:
        next(r.iter_lines())
        time.sleep(seconds)


def _stats(base: str) -> dict:
    return httpx.get(base + "/health").json()


def test_a_resend_while_prefilling_attaches_to_the_running_prefill(slow_long):
    config = ServerConfig(model_name="tiny", max_tokens=4, temperature=0.0, prompt_cache_bytes=0)
    with serve_in_thread(slow_long, config) as base:
        before = _stats(base)["stats"]
        _leave_while_prefilling(base, 1.0)
        time.sleep(0.3)  # the server saw the client leave
        resent = httpx.post(
            base + "/v1/messages", json={**LONG, "stream": False}, headers={"x-api-key": "unused"}, timeout=120
        )
        after = _stats(base)["stats"]
    assert resent.status_code == 200 and resent.json()["stop_reason"] == "max_tokens", resent.text
    assert after["prefills"] - before["prefills"] == 1, (before, after)  # one prefill, not two
    assert after["resends"]["attached"] - before["resends"]["attached"] == 1, after
    prompt = resent.json()["usage"]["input_tokens"]
    assert after["prefill_tokens"] - before["prefill_tokens"] < 1.05 * prompt, (after, prompt)


def test_a_client_that_leaves_for_good_frees_its_row(slow_long, monkeypatch):
    from coreai.service import resend

    monkeypatch.setattr(resend, "RESEND_GRACE", 0.5)
    config = ServerConfig(model_name="tiny", max_tokens=4, temperature=0.0, prompt_cache_bytes=0)
    with serve_in_thread(slow_long, config) as base:
        _leave_while_prefilling(base, 0.5)
        deadline = time.monotonic() + 10
        while (health := _stats(base))["running"] and time.monotonic() < deadline:
            time.sleep(0.1)
        elapsed = 10 - (deadline - time.monotonic())
    assert health["running"] == 0 and health["stats"]["resends"]["expired"] == 1, health
    assert elapsed < 5  # cancelled at the grace's end, not after its whole prefill (~25 passes of 0.1 s)
    assert health["memory"]["kv_bytes"] == 0


def test_two_live_identical_requests_are_not_joined(slow_long):
    """Two clients asking the same thing at once each get a generation of their own."""
    config = ServerConfig(model_name="tiny", max_tokens=4, temperature=0.0, prompt_cache_bytes=0)
    with serve_in_thread(slow_long, config) as base:
        before = _stats(base)["stats"]["prefills"]
        body = {**LONG, "stream": False}
        replies: list = []
        threads = [
            threading.Thread(target=lambda: replies.append(httpx.post(base + "/v1/messages", json=body, timeout=120)))
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = _stats(base)["stats"]
    assert [r.status_code for r in replies] == [200, 200]
    assert after["prefills"] - before == 2 and after["resends"]["attached"] == 0


ASK = "Tell me about the sea and the ships on it, and their long journeys. " * 8


def test_every_dialect_reports_the_cached_prompt_streamed_and_whole(tiny_model):
    """The same prompt twice per dialect and mode: the second reads all but its last token from the
    cache, and says so (Messages `cache_read_input_tokens`, chat `prompt_tokens_details.cached_tokens`,
    Responses `input_tokens_details.cached_tokens`)."""
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", temperature=0.0)) as base:
        messages = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0).messages
        oa = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        kw = dict(model="tiny", max_tokens=4)
        seen = {}
        for stream in (False, True):
            for dialect in ("messages", "chat", "responses"):
                system = f"{dialect} {stream}: you are brief."
                for _ in range(2):
                    if dialect == "messages":
                        ask = dict(**kw, system=system, messages=[{"role": "user", "content": ASK}])
                        if stream:
                            with messages.stream(**ask) as s:
                                u = s.get_final_message().usage
                        else:
                            u = messages.create(**ask).usage
                        total, cached = u.input_tokens + u.cache_read_input_tokens, u.cache_read_input_tokens
                    elif dialect == "chat":
                        chat = [{"role": "system", "content": system}, {"role": "user", "content": ASK}]
                        if stream:
                            chunks = list(
                                oa.chat.completions.create(
                                    model="tiny",
                                    max_tokens=4,
                                    messages=chat,
                                    stream=True,
                                    stream_options={"include_usage": True},
                                )
                            )
                            cu = chunks[-1].usage
                        else:
                            cu = oa.chat.completions.create(model="tiny", max_tokens=4, messages=chat).usage
                        total, cached = cu.prompt_tokens, cu.prompt_tokens_details.cached_tokens
                    else:
                        ask = dict(model="tiny", max_output_tokens=16, instructions=system, input=ASK)
                        if stream:
                            events = list(oa.responses.create(**ask, stream=True))
                            ends = ("response.completed", "response.incomplete")  # the budget may cut it
                            ru = next(e for e in events if e.type in ends).response.usage
                        else:
                            ru = oa.responses.create(**ask).usage
                        total, cached = ru.input_tokens, ru.input_tokens_details.cached_tokens
                    seen.setdefault((dialect, stream), []).append((total, cached))
    for key, ((total1, cached1), (total2, cached2)) in seen.items():
        assert total1 == total2 > 100 and cached1 < 10, (key, seen[key])  # the template's first tokens at most
        assert cached2 == total2 - 1, (key, seen[key])  # all but the token fed again


def test_a_prefix_shared_with_a_request_prefilling_beside_it_is_reported_cached(slow_long):
    """Two requests with one long prefix arriving together: the second copies the first's prefill
    (`KVBatch._share_prefill`) and its usage says so, as `/health`'s counter does."""
    config = ServerConfig(model_name="tiny", max_tokens=4, temperature=0.0, prompt_cache_bytes=0)
    with serve_in_thread(slow_long, config) as base:
        replies: list = []

        def ask(tail: str) -> None:
            text = LONG["messages"][0]["content"] + tail
            body = {**LONG, "stream": False, "messages": [{"role": "user", "content": text}]}
            replies.append(httpx.post(base + "/v1/messages", json=body, timeout=120).json()["usage"])

        first = threading.Thread(target=ask, args=("First?",))
        first.start()
        time.sleep(1.0)  # the first is prefilling
        ask("Second?")
        first.join()
        stats = _stats(base)["stats"]
    cached = sorted(u["cache_read_input_tokens"] for u in replies)
    assert cached[0] == 0 and cached[1] > 1000, replies
    assert stats["cached_tokens"] >= cached[1], stats


def test_a_non_streaming_resend_attaches_too(slow_long):
    """A client that gives up on a whole (non-streaming) reply while it prefills (a read timeout)
    and asks again gets the running job: its leaving is seen by the disconnect poll and released once."""
    config = ServerConfig(model_name="tiny", max_tokens=4, temperature=0.0, prompt_cache_bytes=0)
    body = {**LONG, "stream": False}
    with serve_in_thread(slow_long, config) as base:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(base + "/v1/messages", json=body, timeout=httpx.Timeout(60, read=1.0))
        time.sleep(1.0)  # the disconnect poll (every 0.5 s) saw it
        resent = httpx.post(base + "/v1/messages", json=body, timeout=120)
        stats = _stats(base)["stats"]
    assert resent.status_code == 200 and resent.json()["stop_reason"] == "max_tokens", resent.text
    assert stats["prefills"] == 1 and stats["resends"] == {"held": 1, "attached": 1, "expired": 0}, stats


def test_a_websocket_resend_attaches_and_gets_the_whole_answer(slow_long):
    """Codex's transport: the socket drops while its answer prefills, a new socket sends the same
    `response.create`: one prefill, and the new socket gets the whole answer (its first output item
    and its end), not what the old reader had begun to take."""
    config = ServerConfig(model_name="tiny", max_tokens=4, temperature=0.0, prompt_cache_bytes=0)
    body = {"type": "response.create", "model": "tiny", "input": LONG["messages"][0]["content"], "max_output_tokens": 4}
    with serve_in_thread(slow_long, config) as base:
        url = base.replace("http://", "ws://") + "/v1/responses"
        with ws_client.connect(url) as conn:
            conn.send(json.dumps(body))
            assert json.loads(conn.recv(timeout=60))["type"] == "response.created"
            time.sleep(1.0)
        time.sleep(0.3)
        events = []
        with ws_client.connect(url) as conn:
            conn.send(json.dumps(body))
            while not events or events[-1]["type"] not in ("response.completed", "response.incomplete", "error"):
                events.append(json.loads(conn.recv(timeout=120)))
        stats = _stats(base)["stats"]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "response.incomplete" and "response.output_item.added" in kinds, kinds
    assert events[-1]["response"]["usage"]["output_tokens"] == 4
    assert stats["prefills"] == 1 and stats["resends"]["attached"] == 1, stats

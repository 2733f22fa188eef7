"""Validate-and-rollback inside tool calls (`guided.tools.check`), and one id per call from the
tracker to the streamed delta and the result, on the tiny random-weight model (Qwen2.5's markup:
`<tool_call>` is a special token). Each generation is pushed toward a violation with a logit bias,
as in tests/test_rollback.py; forced token sequences pin down where the checker finds a call."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from test_rollback import bias
from test_server import chat_body, client, serve

from coreai import ConstrainedSession
from guided.errors import UnsupportedSchemaFeature
from guided.tools.calls import CallStream
from guided.validation import check_json
from runtime import SamplingParams
from tests.tool_defs import TOGGLE

COLORS = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 3, "maxItems": 3}
TAGS = {"type": "object", "properties": {"tags": {**COLORS, "uniqueItems": True}}, "required": ["tags"]}
TAG = {"type": "function", "function": {"name": "tag", "parameters": TAGS}}
NAMED = {"type": "function", "function": {"name": "tag"}}
PAINT = {
    "type": "function",
    "function": {
        "name": "paint",
        "parameters": {
            "type": "object",
            "properties": {"color": {"enum": ["red", "green"], "not": {"const": "red"}}},
            "required": ["color"],
        },
    },
}
USER = [{"role": "user", "content": "Hi"}]


def _check(session, pieces):
    """Feed `pieces` (text, tokenized; or a marker's text, as its special token) to a fresh tracker and
    the session's call checker, token by token as the strategy does (the tracker first): the first
    violation (None if none) and the answer bytes so far."""
    ll, hf = session.tokenizer_info.ll_tokenizer, session.model.tokenizer.hf
    ids = []
    for piece in pieces:
        ids += [hf.convert_tokens_to_ids(piece)] if piece in ("<tool_call>", "</tool_call>") else ll.tokenize_str(piece)
    tracker = session.tracker()
    tracker.start = 0
    checker = session.call_checker(tracker)
    for token in ids:
        tracker.feed([token])
        if (violation := checker.feed(ll.decode_bytes([token]))) is not None:
            return violation, bytes(checker.text)
    return None, bytes(checker.text)


def test_the_checker_finds_each_call_and_checks_its_arguments(tiny_model):
    session = ConstrainedSession(tiny_model, tools=[TOGGLE, TAG])
    call = '\n{"name": "tag", "arguments": {"tags": ["red", "green", "blue"]}}\n'
    bad = '\n{"name": "tag", "arguments": {"tags": ["blue", "blue"'
    violation, text = _check(session, ["<tool_call>", call, "</tool_call>", "\n", "<tool_call>", bad])
    assert violation.keyword == "uniqueItems" and violation.pointer == "/tags"
    assert "tool 'tag', call 1" in violation.message
    # The member just added, in the answer's offsets: the planner retries from there.
    assert text[violation.start : violation.end] == b'"blue"' and text[: violation.start].endswith(b'["blue", ')
    # Text the model wrote is never a call, however it looks; a call of another tool is not checked.
    prose = 'Use {"name": "tag", "arguments": {"tags": ["red", "red", "red"]}} here.'
    toggle = '\n{"name": "toggle", "arguments": {"on": true}}\n'
    assert _check(session, [prose, "<tool_call>", toggle, "</tool_call>", "\n", "<tool_call>", call])[0] is None


def test_the_checker_in_the_generic_envelope(tiny_model):
    session = ConstrainedSession(tiny_model, tools=[TAG], tool_format="generic")
    good = '{"name": "tag", "arguments": {"tags": ["red", "green", "blue"]}}'
    violation, _ = _check(
        session, ['{"tool_calls": [', good, ", ", '{"name": "tag", "arguments": {"tags": ["red", "red"']
    )
    assert violation.keyword == "uniqueItems" and "call 1" in violation.message
    answer = json.dumps({"response": json.dumps({"name": "tag", "arguments": {"tags": ["red", "red"]}})})
    assert _check(session, [answer])[0] is None  # the text answer holds no call


@pytest.mark.parametrize("tool_choice", [NAMED, "required", "auto"])
def test_a_duplicate_in_a_call_is_rolled_back(tiny_model, tool_choice):
    """The bias writes "red" at every item; validate-and-rollback bans it where it would repeat. The
    text streamed is never taken back: what was retried was held until its array closed."""
    session = ConstrainedSession(tiny_model, tools=[TAG], tool_choice=tool_choice, parallel_tool_calls=False)
    open_id = tiny_model.tokenizer.hf.convert_tokens_to_ids("<tool_call>")  # under auto: a call, not text
    push = {**bias(tiny_model, "red"), open_id: 60.0}
    deltas = list(session.stream(USER, max_tokens=60, logit_bias=push))
    result = deltas[-1].result
    assert result.finish_reason == "stop" and result.valid, (result.text, result.errors, result.stats.violations)
    assert result.stats.retries >= 1 and all("uniqueItems at /tags" in v for v in result.stats.violations)
    [call] = result.tool_calls
    assert check_json(call.arguments, TAGS)[1] == [] and call.args["tags"][0] == "red"
    assert "".join(d.text for d in deltas) == result.text
    stream = CallStream()
    events = [e for d in deltas for e in stream.feed(d.parts)] + stream.finish(result.tool_calls)
    assert "".join(e[2] for e in events if e[0] == "args") == call.arguments
    # The outcome carries the one enforcement report, the keyword checked in calls naming its tool.
    checked = [e for e in result.outcome.enforcement if e.how == "validate-and-rollback"]
    assert result.outcome.enforcement == session.report and [(e.keyword, e.pointer, e.tool) for e in checked] == [
        ("uniqueItems", "/properties/tags/uniqueItems", "tag")
    ]


def test_not_in_a_call_is_rolled_back(tiny_model):
    session = ConstrainedSession(tiny_model, tools=[PAINT], tool_choice="required", parallel_tool_calls=False)
    result = session.generate(USER, max_tokens=40, logit_bias=bias(tiny_model, "red"))
    assert result.valid and result.stats.retries >= 1, (result.text, result.errors)
    assert [c.args for c in result.tool_calls] == [{"color": "green"}]


def test_past_the_budget_the_call_ends_in_error(tiny_model):
    session = ConstrainedSession(tiny_model, tools=[TAG], tool_choice=NAMED, max_retries=0)
    result = session.generate(USER, max_tokens=60, logit_bias=bias(tiny_model, "red"))
    assert result.finish_reason == "error" and not result.valid
    assert "uniqueItems at /tags" in result.error and "tool 'tag', call 0" in result.error


def test_what_nothing_can_enforce_is_still_refused_by_name(tiny_model):
    odd = {"type": "object", "properties": {"x": {"type": "string", "format": "no-such-format"}}}
    tool = {"type": "function", "function": {"name": "odd", "parameters": odd}}
    with pytest.raises(UnsupportedSchemaFeature) as error:
        ConstrainedSession(tiny_model, tools=[TOGGLE, tool])
    e = error.value
    assert (e.keyword, e.pointer, e.tool) == ("format", "/properties/x/format", "odd") and "tool 'odd'" in str(e)
    # Tool definitions are checked once, the same under every tool_choice (the server always did so;
    # guided used to skip them under "none", whose calls are not constrained).
    with pytest.raises(UnsupportedSchemaFeature):
        ConstrainedSession(tiny_model, tools=[tool], tool_choice="none")
    assert ConstrainedSession(tiny_model, tools=[TOGGLE], tool_choice="none").tools.mode == "none"


def test_streamed_call_ids_are_the_result_ids(tiny_model):
    """The server streams each call's first delta with the id the call's `ToolCall` has: the real
    engine, job and chat reply, the result's calls beside the chunks."""
    from coreai.server.openai import schemas
    from coreai.server.openai.reply import ChatReply
    from coreai.service import Job
    from coreai.service.engine import Engine
    from coreai.service.job import GenerationJob as GenerationParams

    plain = {
        "type": "function",
        "function": {"name": "colors", "parameters": {"type": "object", "properties": {"c": COLORS}}},
    }
    session = ConstrainedSession(tiny_model, tools=[TOGGLE, plain], tool_choice="required")
    sampling = SamplingParams(temperature=0.0, logit_bias={e: 6.0 for e in tiny_model.tokenizer.eos_ids})
    prompt = tiny_model.prompt_ids(USER, tools=session.tools.template_tools)
    params = GenerationParams(prompt, sampling, max_tokens=160, stop=[], constraint=session)
    engine = Engine(tiny_model, max_batch=1, prompt_cache_bytes=0)
    req = schemas.ChatCompletionRequest(model="tiny", messages=USER, stream=True)
    reply = ChatReply(req, session, tiny_model, "tiny")

    async def run():
        job = Job(params, asyncio.get_running_loop())

        def work():  # the worker thread's part (`coreai.server.queue.Worker`)
            engine.start(job)
            while not engine.step():
                pass
            job.put(Job.END)

        worker = threading.Thread(target=work)
        worker.start()
        results = [None]
        chunks = [c async for c in reply.stream_choice(job, 0, results)]
        worker.join()
        return chunks, results[0]

    chunks, result = asyncio.run(run())
    deltas = [t for c in chunks for t in c["choices"][0]["delta"].get("tool_calls") or []]
    opened = [(t["index"], t["id"]) for t in deltas if t.get("id")]
    assert result.tool_calls and opened == [(c.index, c.id) for c in result.tool_calls]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    with serve(tiny_model, model_name="tiny", max_tokens=480, temperature=0.0) as base:
        yield base


def test_the_server_enforces_such_parameters(tiny, tiny_model):
    """A tool whose parameters only validate-and-rollback enforces is no longer a 400: its calls
    validate, also pushed toward a duplicate, whole and streamed."""
    push = {str(t): v for t, v in bias(tiny_model, "red").items()}
    body = dict(model="tiny", messages=USER, tools=[TAG], tool_choice=NAMED, max_tokens=60, logit_bias=push)
    whole = client(tiny).chat.completions.create(**body).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    [call] = whole.message.tool_calls
    assert check_json(call.function.arguments, TAGS)[1] == [] and whole.message.content is None
    chunks = [c for c in client(tiny).chat.completions.create(**body, stream=True) if c.choices]
    fragments = [t.function.arguments for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and "".join(fragments) == call.function.arguments


def test_the_server_still_refuses_what_nothing_enforces(tiny):
    odd = {"type": "object", "properties": {"x": {"type": "string", "format": "no-such-format"}}}
    tools = [TOGGLE, {"type": "function", "function": {"name": "odd", "parameters": odd}}]
    for tool_choice in ("auto", "required"):
        r = httpx.post(tiny + "/v1/chat/completions", json=chat_body(tools=tools, tool_choice=tool_choice))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "tools[1].function.parameters" and error["code"] == "unsupported_schema_feature"
        assert "format" in error["message"] and "/properties/x/format" in error["message"]


def test_none_writes_no_call_marker_even_as_text(tiny_model):
    """Under "none" the marker's special token is outside the text grammar, and so is its text spelled
    with ordinary tokens: no call markup reaches content. Other text stays free."""
    session = ConstrainedSession(tiny_model, tools=[TOGGLE], tool_choice="none")
    ll = session.tokenizer_info.ll_tokenizer
    open_id = tiny_model.tokenizer.hf.convert_tokens_to_ids("<tool_call>")
    assert not session.matcher.accept_token(open_id)
    spelled = ll.tokenize_str("Hi <tool_call> there")
    assert open_id not in spelled
    session.reset()
    assert not session.matcher.accept_tokens(spelled)
    session.reset()
    assert session.matcher.accept_tokens(ll.tokenize_str('Hi <tool_cal </tool_call> {"name": 1}'))


def test_the_enforcement_header_names_the_keywords_checked_in_calls(tiny):
    body = chat_body(tools=[TOGGLE, TAG], tool_choice="required", parallel_tool_calls=False, max_tokens=40)
    r = httpx.post(tiny + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert (
        r.headers["x-coreai-enforcement"] == "validate-and-rollback uniqueItems /properties/tags/uniqueItems (tool tag)"
    )
    plain = httpx.post(tiny + "/v1/chat/completions", json={**body, "tools": [TOGGLE]}, timeout=60)
    assert plain.headers["x-coreai-enforcement"] == "grammar"


def test_the_checker_finds_a_bare_call_beside_a_json_answer(tiny_model):
    """Beside a response format the output's start is held until it is a call's head or cannot be one;
    the checker still finds a bare JSON call there, and an answer is never read as a call."""
    answer = {"type": "object", "properties": {"tags": COLORS}, "required": ["tags"]}
    session = ConstrainedSession(tiny_model, tools=[TAG], schema=answer)
    violation, _ = _check(session, ['{"name": "tag", "arguments": {"tags": ["blue", "blue"'])
    assert violation is not None and violation.keyword == "uniqueItems", violation
    assert _check(session, ['{"tags":["blue","blue","red"]}'])[0] is None


def _doom_loop(model) -> dict[int, float]:
    """A bias that writes `paint(green)` again and again: the call's words, `<tool_call>` after each
    call (a newline first) and never the end."""
    open_id = model.tokenizer.hf.convert_tokens_to_ids("<tool_call>")
    newline = model.tokenizer.encode("\n", add_special_tokens=False)
    push = {**bias(model, "paint", "green"), open_id: 60.0, **{t: 30.0 for t in newline}}
    return push | {t: -100.0 for t in model.tokenizer.eos_ids}


def test_a_call_repeated_in_one_reply_ends_the_reply(tiny_model):
    """With `end_at_repeated_call` the first repeat ends the reply at once, left out of its calls (a
    small model's doom loop: 25 identical calls in one reply in the agent benchmark,
    docs/reports/agents.md); without it the same call twice is two calls, to the budget."""
    push = _doom_loop(tiny_model)
    session = ConstrainedSession(tiny_model, tools=[PAINT, TOGGLE], tool_choice="required", end_at_repeated_call=True)
    result = session.generate(USER, max_tokens=200, logit_bias=push)
    assert result.valid and result.finish_reason == "stop", (result.text, result.errors)
    assert [(c.name, c.args) for c in result.tool_calls] == [("paint", {"color": "green"})], result.text
    assert result.text.count("<tool_call>") == 2 and len(result.token_ids) < 200  # ended at the repeat
    assert result.stats.repeated_calls == 1
    loose = ConstrainedSession(tiny_model, tools=[PAINT, TOGGLE], tool_choice="required")
    looped = loose.generate(USER, max_tokens=200, logit_bias=push)
    assert looped.finish_reason == "length" and len(looped.tool_calls) > 2
    assert {c.arguments for c in looped.tool_calls} == {'{"color": "green"}'} and looped.stats.repeated_calls == 0


@pytest.fixture(scope="module")
def guarded(tiny_model):
    with serve(tiny_model, model_name="tiny", max_tokens=480, temperature=0.0, loop_guard=True) as base:
        yield base


def test_the_server_never_sends_a_repeated_call(guarded, tiny_model):
    """The same doom loop through a server with `--loop-guard`, whole and streamed (Anthropic's and
    Responses' streams read the same events, `events.whole_calls`): one call, the repeat never sent."""
    body = dict(model="tiny", messages=USER, tools=[PAINT, TOGGLE], tool_choice="required", max_tokens=200)
    body["logit_bias"] = {str(t): v for t, v in _doom_loop(tiny_model).items()}
    whole = client(guarded).chat.completions.create(**body).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == [
        ("paint", '{"color": "green"}')
    ]
    chunks = [c for c in client(guarded).chat.completions.create(**body, stream=True) if c.choices]
    streamed = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert [t.function.name for t in streamed if t.function.name] == ["paint"], streamed
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

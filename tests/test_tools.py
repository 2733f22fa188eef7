"""The tools constraint (`guided.tools.constraint`, `guided.tools.calls`) through `ConstrainedSession`, on the tiny
random-weight model (Qwen's tokenizer and chat template: `<tool_call>` is a special token)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel

from coreai import ConstrainedSession
from guided import SchemaError
from guided.tools.calls import CallStream
from guided.tools.constraint import tool_constraint
from guided.tools.definitions import make_tool
from guided.tools.syntax import text_not_starting_with
from tests.tool_defs import SEARCH, UNIT

TOGGLE = {
    "type": "function",
    "name": "toggle",
    "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
}
USER = [{"role": "user", "content": "Hi"}]
SCHEMAS = {"set_unit": UNIT["function"]["parameters"], "toggle": TOGGLE["parameters"]}


def _stream(session, **kwargs):
    deltas = list(session.stream(USER, **kwargs))
    return deltas, deltas[-1].result


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_parse_validate_and_stream(tiny_model, parallel):
    session = ConstrainedSession(tiny_model, tools=[UNIT, TOGGLE], tool_choice="required", parallel_tool_calls=parallel)
    # The random network rarely picks an end id (its head rows are zero); a bias lets it end where the
    # grammar allows (after a call), so several calls may come but the turn ends within the budget.
    end = {e: 6.0 for e in tiny_model.tokenizer.eos_ids}
    deltas, result = _stream(session, max_tokens=160, logit_bias=end)
    assert result.finish_reason == "stop" and result.valid, result.errors
    assert result.tool_calls and result.content is None
    assert parallel or len(result.tool_calls) == 1
    for i, call in enumerate(result.tool_calls):
        assert call.index == i and call.id.startswith("call_") and call.name in SCHEMAS
        assert json.loads(call.arguments) == call.args
        jsonschema.validate(call.args, SCHEMAS[call.name])
    # The streamed labels: call JSON under "call:<i>", the tags as markup, no content.
    parts = [p for d in deltas for p in d.parts]
    assert {label for label, _ in parts} <= {"markup"} | {f"call:{i}" for i in range(len(result.tool_calls))}
    stream = CallStream()
    events = [e for d in deltas for e in stream.feed(d.parts)] + stream.finish(result.tool_calls)
    for call in result.tool_calls:
        assert ("open", call.index, call.name) in events
        assert "".join(e[2] for e in events if e[0] == "args" and e[1] == call.index) == call.arguments


def test_named_function_is_exactly_one_call(tiny_model):
    session = ConstrainedSession(
        tiny_model, tools=[UNIT, TOGGLE], tool_choice={"type": "function", "function": {"name": "toggle"}}
    )
    result = session.generate(USER, max_tokens=120)
    assert result.valid and [c.name for c in result.tool_calls] == ["toggle"]


def test_none_cannot_produce_the_call_marker(tiny_model):
    session = ConstrainedSession(tiny_model, tools=[UNIT], tool_choice="none")
    open_id = tiny_model.tokenizer.hf.convert_tokens_to_ids("<tool_call>")
    assert not session.matcher.accept_token(open_id)
    result = session.generate(USER, max_tokens=8)
    assert result.tool_calls == [] and "<tool_call>" not in result.text


def _feed(session, text_ids):
    """Feed token ids to a session's tracker as final answer tokens: (labels, captures-based calls)."""
    tracker = session.tracker()
    tracker.start = 0
    labels = tracker.feed(text_ids)
    return tracker, labels


def test_markup_inside_a_string_argument_does_not_split_the_call(tiny_model):
    """The issue's case: `</tool_call>` inside the argument. The boundaries are the grammar's."""
    session = ConstrainedSession(
        tiny_model, tools=[SEARCH], tool_choice={"type": "function", "function": {"name": "search"}}
    )
    ll = session.tokenizer_info.ll_tokenizer
    hf = tiny_model.tokenizer.hf
    ids = (
        [hf.convert_tokens_to_ids("<tool_call>")]
        + ll.tokenize_str('\n{"name": "search", "arguments": {"query": "explain the </tool_call> token"}}\n')
        + [hf.convert_tokens_to_ids("</tool_call>")]
    )
    assert session.matcher.accept_tokens(ids) and session.matcher.is_accepting()
    tracker, labels = _feed(session, ids)
    calls = tracker.result(len(ids))[0]
    assert [(c.name, c.args) for c in calls] == [("search", {"query": "explain the </tool_call> token"})]
    assert labels[0] == "markup" and labels[-1] == "markup" and "call:0" in labels


def test_auto_fenced_call_is_held_then_relabelled(tiny_model):
    """Under auto a fenced JSON object at the start is a call: its tokens are held until the grammar
    committed, then the fence is markup and the JSON is call 0."""
    session = ConstrainedSession(tiny_model, tools=[SEARCH])
    ll = session.tokenizer_info.ll_tokenizer
    ids = ll.tokenize_str('```json\n{"name": "search", "arguments": {"query": "x"}}\n```')
    tracker = session.tracker()
    tracker.start = 0
    holds = []
    labels = []
    for t in ids:
        out = tracker.feed([t])
        labels[len(labels) - (len(out) - 1) :] = out
        holds.append(tracker.hold)
    assert holds[0] > 0 and holds[-1] == 0

    def text(label):
        return b"".join(ll.decode_bytes([t]) for t, lab in zip(ids, labels, strict=False) if lab == label).decode()

    assert text("markup").startswith("```json") and text("call:0").strip().startswith('{"name": "search"')
    calls = tracker.result(len(ids))[0]
    assert calls[0].args == {"query": "x"}
    # Text that is not a trigger is released as content.
    plain = session.tracker()
    plain.start = 0
    assert plain.feed(ll.tokenize_str("```python\nprint(1)")) and plain.hold == 0


def test_auto_text_grammar():
    """The free text of auto starts with none of the triggers; anything else is allowed."""
    import re

    regex = re.compile(text_not_starting_with(["{", "```json\n{"]).replace("(.|\\n)", "[\\s\\S]"), re.S)
    for text in ["", "Hi", "```", "```json\n", "```json\n[1]", "```python\nx", " {"]:
        assert regex.fullmatch(text), text
    for text in ["{", '{"a": 1}', '```json\n{"name": 1}']:
        assert not regex.fullmatch(text), text


def test_generic_format_envelope(tiny_model):
    session = ConstrainedSession(
        tiny_model, tools=[UNIT], tool_choice="required", tool_format="generic", parallel_tool_calls=False
    )
    assert session.tools.template_tools is None and "set_unit" in session.tools.system_prompt
    assert session.tools.prompt(USER)[0]["role"] == "system"
    result = session.generate(USER, max_tokens=60)
    assert result.valid, result.errors
    assert result.text.startswith('{"tool_calls": [') and result.tool_calls[0].name == "set_unit"


def test_tool_shapes():
    class Weather(BaseModel):
        """The weather in a city."""

        city: str

    def forecast(city: str, days: int = 3) -> str:
        """A forecast."""
        return ""

    assert make_tool(Weather).name == "Weather" and make_tool(Weather).parameters["required"] == ["city"]
    tool = make_tool(forecast)
    assert (
        tool.name == "forecast"
        and tool.description == "A forecast."
        and tool.parameters["properties"]["days"]["type"] == "integer"
    )
    # The prompt shows the parameters as given; the grammar enforces them closed (strict by default).
    given = TOGGLE["parameters"]  # the flat (Responses) shape
    assert make_tool(TOGGLE).template == {"type": "function", "function": {"name": "toggle", "parameters": given}}
    assert make_tool(TOGGLE).parameters == {**given, "additionalProperties": False}
    with pytest.raises(ValueError, match="not in tools"):
        tool_constraint([TOGGLE], {"type": "function", "function": {"name": "nope"}}, True, "generic", None, None)
    # A function's name as tool_choice is the named choice (the Python API's convenience, as the CLI's).
    named = tool_constraint([TOGGLE, UNIT], "toggle", True, "generic", None, None)
    as_dict = tool_constraint([TOGGLE, UNIT], {"type": "function", "name": "toggle"}, True, "generic", None, None)
    assert (named.mode, named.parallel, named.grammar) == ("required", False, as_dict.grammar)
    assert "set_unit" not in named.grammar
    # Names are OpenAI's function names: a lambda's "<lambda>" is refused, not called by that name.
    for bad in (lambda x: x, {"type": "function", "function": {"name": "a b"}}, {"type": "function", "name": "x" * 65}):
        with pytest.raises(ValueError, match="name"):
            make_tool(bad)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_apply_to_content_never_inside_a_call(tiny_model, stream):
    """Under auto a stop string is for the text answer: one that occurs inside a call's JSON (here
    `"name"`, in every call's envelope) does not cut it. The bias makes the random network open a
    call at once and end after it."""
    hf = tiny_model.tokenizer.hf
    bias = {hf.convert_tokens_to_ids("<tool_call>"): 100.0} | {e: 6.0 for e in tiny_model.tokenizer.eos_ids}
    session = ConstrainedSession(tiny_model, tools=[UNIT], tool_choice="auto", parallel_tool_calls=False)
    kwargs = dict(max_tokens=80, logit_bias=bias, stop=['"name"', "unit"])
    result = _stream(session, **kwargs)[1] if stream else session.generate(USER, **kwargs)
    assert result.valid, result.errors
    assert result.finish_reason == "stop" and result.stop_string is None
    assert [c.name for c in result.tool_calls] == ["set_unit"] and result.content is None
    assert '"name"' in result.text  # the call's text is whole


def test_stop_strings_still_cut_content_under_tools(tiny_model):
    """The text answer is still cut at a stop string (here forced by a bias: "Hello" again and again)."""
    hello = tiny_model.tokenizer.encode("Hello", add_special_tokens=False)[0]
    session = ConstrainedSession(tiny_model, tools=[UNIT], tool_choice="none")
    result = session.generate(USER, max_tokens=12, logit_bias={hello: 100.0}, stop=["lloHe"])
    assert result.finish_reason == "stop" and result.stop_string == "lloHe"
    assert result.text == "He" and result.tool_calls == []


def test_stop_strings_do_not_cut_calls_through_the_server(tiny_model):
    """The same through the server with the official `openai` client, whole and streamed: the call
    comes back in `tool_calls` (finish_reason `tool_calls`), not cut by a stop string inside it."""
    import openai

    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    hf = tiny_model.tokenizer.hf
    bias = {str(hf.convert_tokens_to_ids("<tool_call>")): 100} | {str(e): 6 for e in tiny_model.tokenizer.eos_ids}
    request = dict(
        model="tiny",
        messages=USER,
        tools=[UNIT],
        tool_choice="auto",
        parallel_tool_calls=False,
        stop=['"name"', "unit"],
        logit_bias=bias,
        max_tokens=80,
    )
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", temperature=0.0)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="-", max_retries=0)
        whole = client.chat.completions.create(**request).choices[0]
        chunks = [c for c in client.chat.completions.create(**request, stream=True) if c.choices]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    [call] = whole.message.tool_calls
    assert call.function.name == "set_unit" and json.loads(call.function.arguments)["unit"] in ("celsius", "fahrenheit")
    streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "".join(tc.function.arguments or "" for tc in streamed) == call.function.arguments


@pytest.mark.parametrize(
    "parameters, kind, pointer",
    [
        ({"type": "object", "properties": {"n": {"type": "integr"}}}, SchemaError, "/properties/n/type"),
        ({"type": "array"}, SchemaError, ""),  # arguments are an object
        ({"type": "object", "properties": {"x": {"type": "string", "format": "zzz"}}}, SchemaError, None),
    ],
)
@pytest.mark.parametrize("choice", ["auto", "none"])
def test_tool_definitions_are_checked_in_one_place(tiny_model, parameters, kind, pointer, choice):
    """A tool whose parameters the engine cannot take is refused by guided alone, under every
    tool_choice ("none" too), with a typed error naming the tool, its index among the tools and
    the pointer into its parameters (the server turns the index into `tools[i]...`)."""
    bad = {"type": "function", "function": {"name": "bad", "parameters": parameters}}
    with pytest.raises(kind) as caught:
        ConstrainedSession(tiny_model, tools=[SEARCH, bad], tool_choice=choice)
    e = caught.value
    assert (e.tool, e.tool_index) == ("bad", 1) and str(e).startswith("tool 'bad': ")
    assert pointer is None or e.pointer == pointer

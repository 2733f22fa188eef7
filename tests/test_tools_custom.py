"""Custom tools (`guided.tools.custom`, OpenAI's `type: "custom"`): raw text inputs held to a Lark or
regex grammar inside the call's JSON envelope, or raw in Qwen3-Coder's parameter slot, on the tiny
random-weight model (Qwen's markup). The
inputs are checked by a second matcher: Python's `re.fullmatch` for the regex tool, a fresh
llguidance matcher of the Lark grammar alone for the Lark tool, never by the code under test."""

from __future__ import annotations

import json
import re

import pytest

from coreai import ConstrainedSession
from guided import GrammarError
from guided.tools.calls import CallStream
from guided.tools.formats import FORMATS
from runtime.errors import InputError
from tests.tool_defs import SEARCH, track

# Bounded terminals: the random network would write an unbounded name until the budget ends.
SQL = (
    'start: "SELECT " COLS " FROM " NAME (" WHERE " NAME " = " VALUE)? ";"\n'
    "COLS: /[a-z_]{1,8}(, [a-z_]{1,8}){0,3}/\nNAME: /[a-z_]{1,8}/\nVALUE: /[0-9]{1,4}|'[^'\\n]{0,12}'/\n"
)
DATE = r"\d{4}-\d{2}-\d{2}"
SQL_TOOL = {
    "type": "custom",
    "name": "sql",
    "description": "Run a query.",
    "format": {"type": "grammar", "syntax": "lark", "definition": SQL},
}
DATE_TOOL = {
    "type": "custom",
    "custom": {"name": "date", "format": {"type": "grammar", "grammar": {"syntax": "regex", "definition": DATE}}},
}
NOTE_TOOL = {"type": "custom", "name": "note"}  # format text: any input
USER = [{"role": "user", "content": "Hi"}]
END = 6.0  # the tiny network's end ids have zero logits: a bias lets it end where the grammar allows


def lark_accepts(session, grammar: str, text: str) -> bool:
    """A second matcher: the Lark grammar alone (llguidance, compiled afresh), fed `text`'s tokens."""
    alone = ConstrainedSession(session.model, grammar=grammar)
    matcher = alone.compiled.matcher()
    ids = session.model.tokenizer.encode(text, add_special_tokens=False)
    return matcher.accept_tokens(ids) and matcher.is_accepting()


def ids_of(session, text: str) -> list[int]:
    return session.model.tokenizer.hf.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
@pytest.mark.parametrize(
    ("tool", "check"),
    [
        (SQL_TOOL, lambda s, text: lark_accepts(s, SQL, text)),
        (DATE_TOOL, lambda s, text: re.fullmatch(DATE, text) is not None),
    ],
)
def test_a_forced_custom_call_matches_its_grammar_and_streams_its_input(tiny_model, tool, check, fmt):
    """In a JSON envelope (hermes) and in Qwen3-Coder's raw `<parameter=input>` slot."""
    name = tool.get("custom", tool)["name"]
    session = ConstrainedSession(
        tiny_model, tools=[SEARCH, tool], tool_choice={"type": "custom", "custom": {"name": name}}, tool_format=fmt
    )
    end = {e: END for e in tiny_model.tokenizer.eos_ids}
    deltas = list(session.stream(USER, max_tokens=120, logit_bias=end))
    result = deltas[-1].result
    assert result.finish_reason == "stop" and result.valid, result.errors
    [call] = result.tool_calls
    assert (call.kind, call.name) == ("custom", name) and call.input is not None
    assert check(session, call.input), call.input
    assert json.loads(call.arguments) == call.args == {"input": call.input}
    stream = CallStream(session.tools)
    events = [e for d in deltas for e in stream.feed(d.parts)] + stream.finish(result.tool_calls)
    assert ("open", 0, name) in events
    assert "".join(e[2] for e in events if e[0] == "args") == call.input


# The input as the hermes envelope carries it: JSON-escaped for regex and text, raw for Lark.
WRITTEN = [
    (SQL_TOOL, "SELECT a, b FROM t WHERE c = 'x \"y\"';", json.dumps("SELECT a, b FROM t WHERE c = 'x \"y\"';")),
    (DATE_TOOL, "2024-02-29", '"2024-02-29"'),
    (NOTE_TOOL, 'two\nlines "quoted" \\ é', json.dumps('two\nlines "quoted" \\ é', ensure_ascii=False)),
]


def xml_call(name: str, value: str) -> str:
    return f"<tool_call>\n<function={name}>\n<parameter=input>\n{value}\n</parameter>\n</function>\n</tool_call>"


def hermes_call(name: str, written: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"input": {written}}}}}\n</tool_call>'


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
@pytest.mark.parametrize(("tool", "value", "written"), WRITTEN)
def test_written_calls_read_back_unescaped_and_stream_exactly(tiny_model, tool, value, written, fmt):
    """Hermes carries the input in its JSON envelope (`written`); Qwen3-Coder's XML unescaped between
    `<parameter=input>` and `</parameter>` (streamed whole when the call is complete)."""
    name = tool.get("custom", tool)["name"]
    session = ConstrainedSession(tiny_model, tools=[SEARCH, tool], tool_choice="required", tool_format=fmt)
    if fmt == "hermes":
        text = hermes_call(name, written)
    else:
        text = xml_call(name, value)
    ids = ids_of(session, text)
    matcher = session.compiled.matcher()
    assert matcher.accept_tokens(ids) and matcher.is_accepting()
    calls, labels = track(session, ids)
    assert [(c.kind, c.name, c.input) for c in calls] == [("custom", name, value)]
    # Token by token, as streamed: the fragments join to exactly the input.
    stream = CallStream(session.tools)
    pieces = [(label, tiny_model.tokenizer.hf.decode([t])) for t, label in zip(ids, labels, strict=False)]
    events = [e for p in pieces for e in stream.feed([p])] + stream.finish(calls)
    assert "".join(e[2] for e in events if e[0] == "args") == value


def test_qwen3_coder_refuses_inputs_its_grammar_does_not_match(tiny_model):
    session = ConstrainedSession(
        tiny_model, tools=[SQL_TOOL, DATE_TOOL], tool_choice="required", tool_format="qwen3_coder"
    )
    for name, bad in (("date", "2024-2-29"), ("sql", "DROP TABLE t;"), ("date", '"2024-02-29"')):
        matcher = session.compiled.matcher()
        assert not (matcher.accept_tokens(ids_of(session, xml_call(name, bad))) and matcher.is_accepting()), bad


def test_the_grammar_refuses_inputs_it_does_not_match(tiny_model):
    session = ConstrainedSession(tiny_model, tools=[SQL_TOOL, DATE_TOOL], tool_choice="required")
    for bad in (
        '{"name": "date", "arguments": {"input": "2024-2-29"}}',
        '{"name": "sql", "arguments": {"input": "DROP TABLE t;"}}',
    ):
        matcher = session.compiled.matcher()
        assert not (
            matcher.accept_tokens(ids_of(session, f"<tool_call>\n{bad}\n</tool_call>")) and matcher.is_accepting()
        )


@pytest.mark.parametrize(
    ("definition", "syntax", "message"),
    [
        ('start: "a" (', "lark", "1(13)"),
        ('start: "a" start', "lark", "never"),
        ("a(b", "regex", "regex"),
    ],
)
def test_a_broken_or_endless_grammar_is_an_error_naming_the_tool(tiny_model, definition, syntax, message):
    tool = {"type": "custom", "name": "bad", "format": {"type": "grammar", "syntax": syntax, "definition": definition}}
    with pytest.raises(GrammarError) as info:
        ConstrainedSession(tiny_model, tools=[SEARCH, tool])
    assert "tool 'bad'" in str(info.value) and message in str(info.value).lower(), str(info.value)
    assert (info.value.tool, info.value.tool_index, info.value.tool_field) == ("bad", 1, "format")


def test_formats_without_a_json_envelope_or_raw_slot_refuse_custom_tools(tiny_model):
    non_json = [name for name, f in FORMATS.items() if f is not None and not (f.json_calls or f.raw_slot)]
    assert non_json and "qwen3_coder" not in non_json
    for fmt in non_json:
        with pytest.raises(InputError, match="custom tool 'sql'"):
            ConstrainedSession(tiny_model, tools=[SQL_TOOL], tool_format=fmt)


def test_tool_choice_must_name_the_tool_by_its_kind(tiny_model):
    with pytest.raises(InputError, match="custom tool 'search'"):
        ConstrainedSession(tiny_model, tools=[SEARCH, SQL_TOOL], tool_choice={"type": "custom", "name": "search"})

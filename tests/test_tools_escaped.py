"""Custom-tool inputs carried JSON-escaped (`guided.tools.escaped`): a Lark grammar mapped to the
grammar of its language's JSON-escaped texts, checked with llguidance (the engine that runs it) on
the tiny tokenizer and with the `lark` library (the original language), on Codex's own `apply_patch`
grammar (captured from Codex CLI 0.171.0's request, tests/data/codex/)."""

from __future__ import annotations

import json
from pathlib import Path

import lark
import pytest

from coreai import ConstrainedSession
from guided.tools.escaped import escape, escaped_lark, escaped_regex
from runtime.errors import InputError

APPLY_PATCH = (Path(__file__).parent / "data" / "codex" / "apply_patch.lark").read_text()
PATCH = (
    "*** Begin Patch\n"
    "*** Update File: hello.py\n"
    "@@\n"
    "-print('hello')\n"
    '+print("Hello, \\"Ada\\"\\tC:\\\\path")\n'
    "*** End Patch\n"
)


def engine_accepts(model, grammar: str, text: str) -> bool:
    matcher = ConstrainedSession(model, grammar=grammar).compiled.matcher()
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    return matcher.accept_tokens(ids) and matcher.is_accepting()


def lark_accepts(grammar: str, text: str) -> bool:
    """The `lark` library's parse (Earley); its lexer refuses a terminal that may be empty, so
    `/(.*)/` (Codex's grammar) is read as the same language `/(.+)/?`."""
    grammar = grammar.replace("/(.*)/", "/(.+)/?")
    try:
        lark.Lark(grammar, start="start", parser="earley", lexer="dynamic").parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


def test_apply_patch_is_accepted_escaped_and_only_so(tiny_model):
    escaped = escaped_lark(APPLY_PATCH)
    assert lark_accepts(APPLY_PATCH, PATCH)
    assert engine_accepts(tiny_model, escaped, escape(PATCH))
    assert json.loads('"' + escape(PATCH) + '"') == PATCH
    assert not engine_accepts(tiny_model, escaped, PATCH)  # real newlines: not inside a JSON string
    # What the model wrote before (issue #47): a grammar newline as text, a quote unescaped.
    assert not engine_accepts(tiny_model, escaped, PATCH.replace("\n", "\\n"))
    assert not engine_accepts(tiny_model, escaped, escape(PATCH).replace('\\"', '"'))


@pytest.mark.parametrize(
    ("pattern", "samples"),
    [
        ("[^\\n]+", ["a b", 'say "hi"', "tab\there", "back\\slash", "new\nline", ""]),
        ("(.+)", ["x", 'q"q', "\x01", "a\nb"]),
        ('[a-z"]{2,3}', ['a"', "abc", "abcd", "A", '""']),
        ("\\s*\\d+", [" \t12", "\n3", "x"]),
        ("(?s:.)+", ["a\nb", "\x00"]),
    ],
)
def test_a_regex_accepts_the_escaped_texts_of_its_strings(tiny_model, pattern, samples):
    grammar = f"start: /{pattern}/"
    for text in samples:
        expected = lark_accepts(grammar, text)
        assert engine_accepts(tiny_model, escaped_lark(grammar), escape(text)) == expected, (pattern, text)


def test_what_cannot_be_escaped_is_refused():
    with pytest.raises(InputError):
        escaped_regex("(a)\\1")

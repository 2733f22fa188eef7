"""Tool calls out of a tools-constrained generation (`guided.tools`): where each call is, from the
grammar, and what the reply carries.

The call boundaries are the grammar's captures (`call_json[capture]`): llguidance reports a call's
exact JSON when the grammar closes it, so `</tool_call>` inside a string argument never ends a call.
Captures survive a matcher's rollback, and the decoding matcher is fed draft tokens it then rolls
back, so they are read from a shadow matcher fed only the tokens that are final (`CallTracker`).

`CallTracker` also labels every answer token for streaming (`Step.channels`): None for content,
"call:<i>" for the JSON of call i, "markup" for markers and separators. A call opened by a special
token is known at that token; a text trigger under auto (a bare or fenced JSON object at the
output's start) is held back (`Step.hold`) until the grammar has committed to it, then relabelled.
`CallStream` turns the labelled text into OpenAI's streamed call deltas.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Callable

from guided.matcher import GrammarMatcher
from guided.tools import args_key, auto_triggers

MARKUP = "markup"
_HEAD = re.compile(r'\s*\{"name": "((?:[^"\\]|\\.)*)", "(?:arguments|parameters)": ')


@dataclass
class ToolCall:
    """One call: `arguments` is its JSON text exactly as generated, `args` the parsed dict; index:
    its place among the reply's calls (OpenAI's streamed `tool_calls[].index`)."""

    id: str
    name: str
    arguments: str
    args: dict = field(default_factory=dict)
    index: int = 0


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def call_head(text: str) -> tuple[str, int] | None:
    """(name, length of the head) of a call JSON's text as the grammar writes it, once its head
    (`{"name": ..., "arguments": ` or `"parameters": `) is complete; else None."""
    head = _HEAD.match(text)
    return None if head is None else (json.loads(f'"{head.group(1)}"'), head.end())


def split_call(text: str) -> tuple[str, str] | None:
    """(name, arguments text) of a complete call JSON as the grammar writes it, else None."""
    head = _HEAD.match(text)
    body = text.rstrip()
    if head is None or not body.endswith("}"):
        return None
    return json.loads(f'"{head.group(1)}"'), body[head.end() : -1]


def calls_from_captures(
    captures: list[tuple[str, bytes]], fmt: str, call_id: Callable[[int], str]
) -> tuple[list[ToolCall], str | None]:
    """The calls among `captures` (`GrammarMatcher.captures()`), each with the id `call_id(index)`,
    and the text answer of the generic envelope (`{"response": ...}`; None otherwise)."""
    calls, response = [], None
    for name, value in captures:
        text = value.decode("utf-8", errors="replace")
        if name == "response":
            response = json.loads(text)
        elif name == "call_json" and (split := split_call(text)) is not None:
            data = json.loads(text)
            calls.append(ToolCall(call_id(len(calls)), split[0], split[1], data[args_key(fmt)], len(calls)))
    return calls, response


class CallTracker:
    """Labels the answer tokens of one generation (see the module docstring) and keeps the calls.

    matcher: a fresh matcher of the tools grammar (the shadow, fed final answer tokens only).
    decode: token id -> its bytes. fmt, mode: the constraint's format and mode. markers: the
    special-token ids that open calls after text (`<tool_call>`, `<|python_tag|>`).
    """

    def __init__(self, matcher: GrammarMatcher, decode, fmt: str, mode: str, markers: frozenset[int]):
        self.shadow, self.decode, self.fmt, self.markers = matcher, decode, fmt, markers
        if mode == "none":
            self.first_state = "text"
        elif fmt == "generic":
            self.first_state = "generic"  # the envelope is JSON throughout; calls come from the captures
        else:
            self.first_state = {"required": MARKUP, "auto": "maybe"}.get(mode, "text")
        self.triggers = [t.encode() for t in auto_triggers(fmt)]
        self.start: int | None = None  # the output index of the first answer token
        self.ids: list[str] = []  # the id of each call, made once (`call_id`)
        self._reset()

    def _reset(self) -> None:
        self.state = self.first_state
        self.calls = 0
        self.ends: list[int] = []  # answer tokens fed when each capture appeared
        self.tokens: list[int] = []  # the answer tokens fed
        self.labels: list[str | None] = []  # the label of each (held ones may still change)
        self._held: list[bytes] = []  # tokens of a possible trigger, not streamed yet

    @property
    def hold(self) -> int:
        return len(self._held)

    @property
    def fed(self) -> int:
        """Answer tokens fed."""
        return len(self.tokens)

    def call_id(self, index: int) -> str:
        """The id of call `index` (`new_call_id()`, made on first use): the one source of a call's
        id, for its first streamed delta and for the result's `ToolCall`."""
        while len(self.ids) <= index:
            self.ids.append(new_call_id())
        return self.ids[index]

    def feed(self, tokens: list[int]) -> list[str | None]:
        """Labels of the held tokens before `tokens` (which this call may relabel) and of `tokens`."""
        labels: list[str | None] = [None] * len(self._held)
        kept = len(self.labels) - len(self._held)
        for t in tokens:
            self.shadow.accept_token(t)
            self.tokens.append(t)
            labels.append(self._label(t, labels))
            if self.state == "call":
                self.call_id(self.calls)  # made when its first token is labelled, before it streams
            captures = len(self.shadow.captures())
            if captures > len(self.ends):
                self.ends.append(self.fed)
                if self.state == "call":
                    self.calls += 1
                    self.state = MARKUP
        self.labels[kept:] = labels
        return labels

    def forget(self, n: int) -> None:
        """Take the last `n` answer tokens back (validate-and-rollback retried them): the shadow
        starts over and is fed the others again, since a rollback does not undo its captures. The
        ids made are kept: call i keeps its id."""
        if n <= 0:
            return
        kept = self.tokens[: len(self.tokens) - n]
        self.shadow.reset()
        self._reset()
        self.feed(kept)

    def _label(self, token: int, labels: list) -> str | None:
        data = self.decode(token)
        if self.state == "maybe":
            self._held.append(data)
            text = b"".join(self._held)
            if any(t.startswith(text) and t != text for t in self.triggers):
                return None  # still held
            trigger = next((t for t in self.triggers if text.startswith(t)), None)
            held, self._held = self._held, []
            if trigger is None:
                self.state = "text"
                return self._label_text(token)
            # The grammar committed to a call: the bytes before its JSON are markup.
            self.state, offset, json_at = "call", 0, len(trigger) - 1
            mine = []
            for piece in held:
                offset += len(piece)
                mine.append(MARKUP if offset <= json_at else f"call:{self.calls}")
            if len(held) > 1:
                labels[len(labels) - len(held) + 1 :] = mine[:-1]
            return mine[-1]
        if self.state == "text":
            return self._label_text(token)
        if self.state == MARKUP and b"{" in data:
            self.state = "call"
        if self.state == "call":
            return f"call:{self.calls}"
        return MARKUP

    def _label_text(self, token: int) -> str | None:
        if token in self.markers:
            self.state = MARKUP
            return MARKUP
        return None

    def result(self, kept: int) -> tuple[list[ToolCall], str | None]:
        """The calls (and generic text answer) among the first `kept` answer tokens (the output may
        have been cut after the strategy saw it: max_tokens, a stop string)."""
        captures = [c for c, end in zip(self.shadow.captures(), self.ends) if end <= kept]
        return calls_from_captures(captures, self.fmt, self.call_id)


class CallStream:
    """OpenAI-style streamed call events from labelled text (`Delta.parts`): `feed(parts)` returns
    ("open", index, name) once a call's name is complete, then ("args", index, fragment) as its
    arguments arrive. The envelope's closing brace and trailing whitespace are held back (they may
    yet be arguments text); `finish(calls)` sends what the final calls add, so the fragments of a
    call always concatenate to its `arguments`."""

    def __init__(self):
        self.text: dict[int, str] = {}
        self.sent: dict[int, str] = {}  # index -> arguments sent
        self.names: dict[int, str] = {}

    def feed(self, parts: list[tuple[str | None, str]]) -> list[tuple]:
        events = []
        for label, text in parts:
            if label is None or not label.startswith("call:"):
                continue
            i = int(label[5:])
            self.text[i] = self.text.get(i, "") + text
            head = _HEAD.match(self.text[i])
            if head is None:
                continue
            if i not in self.names:
                self.names[i] = json.loads(f'"{head.group(1)}"')
                self.sent[i] = ""
                events.append(("open", i, self.names[i]))
            args = re.sub(r"\}?\s*$", "", self.text[i][head.end() :])
            if len(args) > len(self.sent[i]):
                events.append(("args", i, args[len(self.sent[i]) :]))
                self.sent[i] = args
        return events

    def finish(self, calls: list[ToolCall]) -> list[tuple]:
        events = []
        for call in calls:
            if call.index not in self.names:
                events.append(("open", call.index, call.name))
                self.sent[call.index] = ""
            rest = call.arguments[len(self.sent[call.index]) :]
            if rest:
                events.append(("args", call.index, rest))
        return events

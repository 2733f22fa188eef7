"""Tool calls out of a tools-constrained generation (`guided.tools.constraint`): where each call is, from the
grammar, and what the reply carries.

The call boundaries are the grammar's captures (`call_json[capture]`): llguidance reports a call's
exact JSON when the grammar closes it, so `</tool_call>` inside a string argument never ends a call.
Captures survive a matcher's rollback, and the decoding matcher is fed draft tokens it then rolls
back, so they are read from a shadow matcher fed only the tokens that are final (`CallTracker`).

`CallTracker` also labels every answer token for streaming (`Step.channels`): None for content,
"call:<i>" for the text of call i, "markup" for markers and separators. A call opened by a special
token is known at that token; a text trigger under auto (a bare, fenced or listed JSON call, a
pythonic call at the output's start) is held back (`Step.hold`) until the grammar has committed to
it, then relabelled. `CallStream` turns the labelled text into OpenAI's streamed call deltas.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from guided.matcher import GrammarMatcher
from guided.tools.capture import CALL_HEAD, read_capture
from guided.tools.constraint import ANSWER_JSON, ToolConstraint
from guided.tools.custom import CUSTOM, INPUT, input_so_far
from guided.tools.formats import CALL_ID, FORMATS
from guided.tools.loop_guard import canonical
from guided.tools.syntax import APPEND

MARKUP = "markup"
_MISTRAL_HEAD = re.compile(r"\s*([\w.-]+)(?:\[ARGS\])?(?=\{)")  # [ARGS] is not shown where it is special


@dataclass
class ToolCall:
    """One call: `arguments` is its JSON text exactly as generated (converted to JSON for the
    pythonic and qwen3_coder formats, `guided.tools.formats`), `args` the parsed dict; index: its
    place among the reply's calls (OpenAI's streamed `tool_calls[].index`). kind: "function", or
    "custom" for a custom tool's call, whose `input` is its raw text input (unescaped; `arguments`
    and `args` then carry it as `{"input": input}`, the shape the chat template is shown)."""

    id: str
    name: str
    arguments: str
    args: dict = field(default_factory=dict)
    index: int = 0
    kind: str = "function"
    input: str | None = None

    @property
    def payload(self) -> str:
        """What the call's streamed fragments join to: its input (custom) or its arguments."""
        return self.input if self.input is not None else self.arguments


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def call_head(text: str) -> tuple[str, int] | None:
    """(name, length of the head) of a call JSON's text as the grammar writes it, once its head
    (`{"name": ..., "arguments": ` or `"parameters": `) is complete; else None."""
    head = CALL_HEAD.match(text)
    return None if head is None else (json.loads(f'"{head.group(1)}"'), head.end())


def calls_from_captures(
    captures: list[tuple[str, bytes]], tools: ToolConstraint, call_id: Callable[[int], str]
) -> tuple[list[ToolCall], str | None]:
    """The calls among `captures` (`GrammarMatcher.captures()`), each with the id `call_id(index)`,
    and the text answer of the generic envelope (`{"response": ...}`; None otherwise)."""
    calls: list[ToolCall] = []
    response = None
    by_name = {t.name: t for t in tools.tools}
    for name, value in captures:
        text = value.decode("utf-8", errors="replace")
        if name == "response":
            response = json.loads(text)
        elif name == ANSWER_JSON:  # a response format's answer: its JSON text is the content
            response = text
        elif (call := read_capture(name, text, tools.fmt, by_name)) is not None:
            kind = by_name[call[0]].kind
            given = call[2].get(INPUT) if kind == CUSTOM else None
            calls.append(ToolCall(call_id(len(calls)), call[0], call[1], call[2], len(calls), kind, given))
    return calls, response


class CallTracker:
    """Labels the answer tokens of one generation (see the module docstring) and keeps the calls.

    matcher: a fresh matcher of the tools grammar (the shadow, fed final answer tokens only).
    decode: token id -> its bytes. tools: the constraint (its format, mode, marker ids, triggers).
    """

    def __init__(self, matcher: GrammarMatcher, decode, tools: ToolConstraint):
        self.shadow, self.decode, self.tools = matcher, decode, tools
        self.format = FORMATS.get(tools.fmt)
        self.by_name = {t.name: t for t in tools.tools}
        if tools.mode == "none":
            self.first_state = "text"
        elif self.format is None:
            self.first_state = "generic"  # the envelope is JSON throughout; calls come from the captures
        else:
            self.first_state = {"required": MARKUP, "auto": "maybe"}.get(tools.mode, "text")
        self.triggers = [(t.encode(), len(t[:at].encode())) for t, at in tools.triggers]
        self.start: int | None = None  # the output index of the first answer token
        self.ids: list[str] = []  # the id of each call, made once (`call_id`)
        self._reset()

    def _reset(self) -> None:
        self.state = self.first_state
        self.calls = 0
        self.ends: list[int] = []  # answer tokens fed when each capture's last byte was fed
        self.tokens: list[int] = []  # the answer tokens fed
        self.bytes = bytearray()  # their bytes
        self.cursor = 0  # the byte offset after the last capture found in them
        self.labels: list[str | None] = []  # the label of each (held ones may still change)
        self._held: list[bytes] = []  # tokens of a possible trigger, not streamed yet
        self.keys: set[tuple[str, str]] = set()  # (name, arguments) of each call closed
        self.repeated = False  # a call closed identical to an earlier one (`first_repeat`)

    @property
    def hold(self) -> int:
        return len(self._held)

    @property
    def fed(self) -> int:
        """Answer tokens fed."""
        return len(self.tokens)

    def call_id(self, index: int) -> str:
        """The id of call `index` (`new_call_id()`, made on first use, or the id the model wrote, in
        formats where it writes one: Kimi K2's `functions.name:idx`): the one source of a call's id,
        for its first streamed delta and for the result's `ToolCall`."""
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
            data = self.decode(t)
            labels.append(self._label(t, data, labels))
            self.bytes += data
            if self.state == "call":
                self.call_id(self.calls)  # made when its first token is labelled, before it streams
            self._end_captures()
        self.labels[kept:] = labels
        return labels

    def _end_captures(self) -> None:
        """Close the captures whose whole text has now been fed. llguidance may report a capture
        before its tokens come (when the rest of the call is forced, e.g. a tool without
        parameters), so a capture ends at the token that brings its last byte, not when it appears."""
        captures = self.shadow.captures()
        while len(self.ends) < len(captures):
            name, value = captures[len(self.ends)]
            at = self.bytes.find(value, self.cursor)
            if at < 0:
                return
            self.cursor = at + len(value)
            self.ends.append(self.fed)
            if name.removeprefix(APPEND) == CALL_ID:  # the model named the call it is writing
                self.call_id(self.calls)
                self.ids[self.calls] = value.decode("utf-8", errors="replace")
            elif self.state == "call":
                self.calls += 1
                self.state = MARKUP
                read = read_capture(name, value.decode("utf-8", errors="replace"), self.tools.fmt, self.by_name)
                if read is not None and self.tools.end_at_repeat:
                    key = call_key(read[0], read[2])
                    self.repeated |= key in self.keys
                    self.keys.add(key)

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

    def _label(self, token: int, data: bytes, labels: list) -> str | None:
        if self.state == "maybe":
            self._held.append(data)
            text = b"".join(self._held)
            if any(t.startswith(text) and t != text for t, _ in self.triggers):
                return None  # still held
            trigger = next(((t, at) for t, at in self.triggers if text.startswith(t)), None)
            held, self._held = self._held, []
            if trigger is None:
                self.state = "text"
                return self._label_text(token)
            # The grammar committed to a call: the bytes before the call itself are markup.
            self.state, offset, call_at = "call", 0, trigger[1]
            mine = []
            for piece in held:
                offset += len(piece)
                mine.append(MARKUP if offset <= call_at else f"call:{self.calls}")
            if len(held) > 1:
                labels[len(labels) - len(held) + 1 :] = mine[:-1]
            return mine[-1]
        if self.state == "text":
            return self._label_text(token)
        if self.state == MARKUP and token not in self.tools.marker_ids and self._starts_call(data):
            self.state = "call"
        if self.state == "call":
            return f"call:{self.calls}"
        return MARKUP

    def _starts_call(self, data: bytes) -> bool:
        if not data.strip():  # whitespace (after the last call, before the end) starts no call in any format
            return False
        return self.format.starts_call(data) if self.format is not None else b"{" in data

    def _label_text(self, token: int) -> str | None:
        if token in self.tools.markers:
            self.state = MARKUP
            return MARKUP
        return None

    def result(self, kept: int) -> tuple[list[ToolCall], str | None, int]:
        """The calls (and generic text answer) among the first `kept` answer tokens (the output may
        have been cut after the strategy saw it: max_tokens, a stop string), with `end_at_repeat` the
        calls before the first repeat (`first_repeat`), and how many calls that left out."""
        captures = [c for c, end in zip(self.shadow.captures(), self.ends, strict=False) if end <= kept]
        calls, response = calls_from_captures(captures, self.tools, self.call_id)
        cut = first_repeat(calls) if self.tools.end_at_repeat else len(calls)
        return calls[:cut], response, len(calls) - cut


def call_key(name: str, args: dict) -> tuple[str, str]:
    """What makes two calls the same: the tool's name and the arguments (`loop_guard.canonical`)."""
    return name, canonical(args)


def first_repeat(calls: list[ToolCall]) -> int:
    """The index of the first call identical (`call_key`) to an earlier one of `calls`, else its
    length. A reply ends at its first repeat: running the same call twice in one turn tells the client
    nothing new (a small model in a doom loop writes one call until the budget ends)."""
    seen: set[tuple[str, str]] = set()
    for i, call in enumerate(calls):
        key = call_key(call.name, call.args)
        if key in seen:
            return i
        seen.add(key)
    return len(calls)


def _arguments_so_far(text: str, start: int) -> str:
    """The arguments JSON of a call's text from `start`: exactly the value once it is complete (the
    json module's decoder finds its end, so whatever markup the same tokens carry after it is left
    out), else the text so far less what may yet close the envelope (a brace, separators)."""
    try:
        return text[start : _DECODER.raw_decode(text, start)[1]]
    except json.JSONDecodeError:
        return re.sub(r"\}?[\s,\]]*$", "", text[start:])


_DECODER = json.JSONDecoder()


class CallStream:
    """OpenAI-style streamed call events from labelled text (`Delta.parts`): `feed(parts)` returns
    ("open", index, name) once a call's name is complete, then ("args", index, fragment) as its
    arguments arrive (a custom tool's call: its input, decoded, `guided.tools.custom.input_so_far`).
    The envelope's closing brace and trailing separators are held back (they may yet be arguments
    text); `finish(calls)` sends what the final calls add, so the fragments of a call always
    concatenate to its `arguments` (its `input`: `ToolCall.payload`). tools: the constraint, for formats whose arguments
    are not JSON as generated (pythonic, qwen3_coder: a call's arguments are sent whole when its
    text is complete); None reads JSON envelopes only."""

    def __init__(self, tools: ToolConstraint | None = None):
        self.text: dict[int, str] = {}
        self.sent: dict[int, str] = {}  # index -> arguments sent
        self.names: dict[int, str] = {}
        self.tools = tools
        self.format = FORMATS.get(tools.fmt) if tools is not None else None
        self.by_name = {t.name: t for t in tools.tools} if tools is not None else {}

    def feed(self, parts: list[tuple[str | None, str]]) -> list[tuple]:
        events = []
        for label, text in parts:
            if label is None or not label.startswith("call:"):
                continue
            i = int(label[5:])
            self.text[i] = self.text.get(i, "") + text
            if i in self.names and i not in self.sent:
                continue  # sent whole already
            events += self._read(i)
        return events

    def _read(self, i: int) -> list[tuple]:
        text, events = self.text[i], []
        head = CALL_HEAD.match(text)
        if head is None and self.tools is not None and self.tools.fmt == "mistral_names":
            head = _MISTRAL_HEAD.match(text)
        if head is not None:
            tool = self.by_name.get(json.loads(f'"{head.group(1)}"'))
            if tool is not None and tool.format is not None:  # a custom tool's
                args = input_so_far(text[head.end() :], tool.format)
            else:
                args = _arguments_so_far(text, head.end())
        elif self.format is not None and self.format.read is not None:
            call = self.format.read(text, self.by_name)
            if call is None:
                return []
            self.names[i] = call[0]
            tool = self.by_name[call[0]]
            args = call[1][INPUT] if tool.kind == CUSTOM else json.dumps(call[1], ensure_ascii=False)
            return [("open", i, call[0]), ("args", i, args)]
        else:
            return []
        if i not in self.names:
            self.names[i] = json.loads(f'"{head.group(1)}"')
            self.sent[i] = ""
            events.append(("open", i, self.names[i]))
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
            elif call.index not in self.sent:
                continue  # sent whole when its text was complete
            rest = call.payload[len(self.sent[call.index]) :]
            if rest:
                events.append(("args", call.index, rest))
        return events

"""Validate-and-rollback inside tool calls: the keywords a tool's parameters use that the grammar
cannot express (`uniqueItems`, `not`, `if`/`then`, formats the engine lacks, ...), checked while the
call's arguments are decoded, with the same `guided.rollback.RollbackPlanner` as `response_format`.

`CallChecker` has the interface of `guided.checker.ValueChecker` (`text`, `feed`, `end`,
`truncate`, `hold_from`) over the whole answer of a tools generation, so the planner's byte offsets,
bans and hold-back work unchanged. Inside, it finds each call's arguments and hands their bytes to a
`ValueChecker` of that call's tool (chosen by the call's name, which the grammar writes first):

- a call begins at a `{` outside a call, in a token the `guided.tools.calls.CallTracker` did not
  label content (text the model wrote, which is never a call however it looks); the generic
  envelope's own `{` (and its text answer, `{"response": ...}`) is skipped;
- its head, `{"name": "<name>", "arguments": ` (or `"parameters"`), is fixed by the grammar; the
  arguments (a JSON object) follow, and the call ends when that object closes.

Violations come back with offsets into the answer and the message naming the tool and the call.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping

from guided.cache import GrammarCache
from guided.checker import CheckPlan, ValueChecker, Violation
from guided.enforcement import ROLLBACK, enforcement
from guided.errors import GrammarError, SchemaError, UnsupportedSchemaFeature
from guided.spec import make_spec
from guided.tokenizer_info import TokenizerInfo
from guided.tools.calls import CallTracker, call_head
from guided.tools.constraint import ToolConstraint
from guided.tools.custom import CUSTOM, alone
from guided.tools.formats import FORMATS

_NOTHING = CheckPlan({})  # a tool whose grammar enforces every keyword: its checker only finds the call's end
_ANSWER = b'{"r'  # how the generic envelope's text answer, `{"response": ...}`, begins: no call in it


@dataclasses.dataclass
class _Call:
    """A call seen in the answer: its index, its tool's name, where its arguments begin (answer
    byte offset) and their checker."""

    index: int
    name: str
    base: int
    checker: ValueChecker


class CallChecker:
    """One tools generation's validate-and-rollback state (see the module docstring).

    plans: tool name -> the `CheckPlan` of its parameters (None or missing: nothing to check).
    tracker: the generation's `CallTracker`, fed each answer token before this checker is; its
        labels say which tokens are content. generic: the format is the generic JSON envelope.
    Each `feed` is one answer token's bytes, in the tracker's order.
    """

    def __init__(self, plans: Mapping[str, CheckPlan | None], tracker: CallTracker, generic: bool):
        self.plans, self.tracker = plans, tracker
        self.text = bytearray()  # the answer's bytes
        self.calls: list[_Call] = []
        # (state, where the current call's JSON begins, calls seen): state is "envelope" (the generic
        # envelope's opening), "out" (between calls), "head", "args" or "done" (the generic text answer)
        self.start = ("envelope" if generic else "out", 0, 0)
        self.state, self.head, _ = self.start
        self.ends: list[int] = []  # per token fed: the answer offset after it
        self.states: list[tuple[str, int, int]] = []  # per token fed: (state, head, calls) after it

    def feed(self, data: bytes) -> Violation | None:
        """One answer token's bytes; the first violation of a value they close, or None (on a
        violation the bytes after it are not taken, as `ValueChecker.feed`)."""
        # A held token (the tracker cannot tell yet whether a call starts here) may begin a call: its
        # `{` opens a head, which an answer or text never completes.
        content = self.tracker.labels[len(self.ends)] is None and not self.tracker.hold
        violation = None
        for byte in data:
            pos = len(self.text)
            self.text.append(byte)
            if (violation := self._byte(byte, pos, content)) is not None:
                break
        self.ends.append(len(self.text))
        self.states.append((self.state, self.head, len(self.calls)))
        return violation

    def _byte(self, byte: int, pos: int, content: bool) -> Violation | None:
        if self.state == "args":
            call = self.calls[-1]
            violation = call.checker.feed(bytes((byte,)))
            if call.checker.done:
                self.state = "out"  # the call's closing brace follows
            if violation is None:
                return None
            start, end = violation.start + call.base, violation.end + call.base
            message = f"{violation.message} (tool {call.name!r}, call {call.index})"
            return dataclasses.replace(violation, start=start, end=end, message=message)
        if self.state == "envelope":
            if byte == ord("["):  # `{"tool_calls": [`: the calls follow
                self.state = "out"
            elif self.text == _ANSWER:
                self.state = "done"
        elif self.state == "out" and byte == ord("{") and not content:
            self.state, self.head = "head", pos
        elif self.state == "head":
            head = call_head(self.text[self.head :].decode("utf-8", errors="replace"))
            if head is not None:  # it ends at this byte: the arguments begin at the next one
                plan = self.plans.get(head[0]) or _NOTHING
                self.calls.append(_Call(len(self.calls), head[0], pos + 1, plan.checker()))
                self.state = "args"
        return None

    def end(self) -> Violation | None:
        """The answer ended: nothing left to check (arguments are objects, which close themselves)."""
        return None

    def truncate(self, length: int) -> None:
        """Forget the answer after its first `length` bytes (a token boundary: a rollback)."""
        kept = bisect.bisect_right(self.ends, length)
        del self.ends[kept:], self.states[kept:], self.text[length:]
        self.state, self.head, calls = self.states[-1] if kept else self.start
        del self.calls[calls:]
        if self.state == "args":
            call = self.calls[-1]
            call.checker.truncate(length - call.base)

    def hold_from(self) -> int | None:
        """Answer offset from which the output may still be rolled back (inside the current call's
        arguments), or None."""
        if self.state != "args":
            return None
        call = self.calls[-1]
        held = call.checker.hold_from()
        return None if held is None else held + call.base


def call_plans(tools: ToolConstraint, tokenizer: TokenizerInfo, cache: GrammarCache) -> dict[str, CheckPlan]:
    """What validate-and-rollback checks inside the calls of each tool whose parameters use a
    keyword the grammar cannot express (the tools grammar leaves it out), by tool name; {} under
    "none", whose calls are not constrained. Every tool's parameters are compiled alone (cached; under
    "none" too), the one check of tool definitions against the engine, so a keyword neither the
    grammar nor validate-and-rollback enforces raises UnsupportedSchemaFeature naming the keyword, its
    pointer and the tool (`.tool`, `.tool_index`), as any other SchemaError about them does; a
    custom tool's grammar is compiled alone too, a GrammarError about it naming the tool
    (`.tool_field` "format": a Lark or regex error, with llguidance's line and column, or a Lark
    grammar that can never end);
    so does a keyword left to validate-and-rollback in a format whose calls are not JSON envelopes
    (pythonic, qwen3_coder, mistral_names: `ToolFormat.json_calls`), which this checker cannot follow."""
    fmt = FORMATS.get(tools.fmt)
    plans = {}
    for index, tool in enumerate(tools.tools):
        if tool.kind == CUSTOM:  # its grammar compiled alone: the engine's own message, line and column
            assert tool.format is not None  # a custom tool has its format
            if (options := alone(tool.format)) is not None:
                try:
                    cache.get(make_spec(**options), tokenizer)
                except GrammarError as exc:
                    raise exc.about_tool(tool.name, index, "format") from None
            continue
        try:
            compiled = cache.get(make_spec(schema=tool.parameters, strict=False), tokenizer)
        except SchemaError as exc:
            raise exc.about_tool(tool.name, index) from None
        if tools.mode == "none":
            continue  # checked, but its calls are not constrained
        if compiled.checks is None:
            continue
        if fmt is not None and not fmt.json_calls:
            e = next(e for e in enforcement(compiled) if e.how == ROLLBACK)
            raise UnsupportedSchemaFeature(
                f"cannot enforce {e.keyword} at {e.pointer} in a {tools.fmt} call: the grammar cannot express "
                "it, and validate-and-rollback follows JSON calls only (use tool_format='generic')",
                e.keyword,
                e.pointer,
            ).about_tool(tool.name, index)
        plans[tool.name] = compiled.checks
    return plans

"""Validate-and-rollback: schema keywords a grammar cannot express (`uniqueItems`, `not`,
`if`/`then`/`else`, `dependentRequired`, `contains`, formats the engine lacks, ...), checked with
`jsonschema` when the value they govern closes during decoding.

The grammar enforces a superset (the engine ignores those keywords). `ValueChecker` follows the
output byte by byte (`JsonTracker`: the stack of open objects and arrays and where each value
starts), and when a value closes at an instance path some validated keyword governs, it validates
the document so far: the text up to the value's end with the open containers closed (`{"a":[1,1]` is
checked as `{"a":[1,1]}`). It reports a `Violation` when

- an error lies at or below the closed value: the value is complete, so the error stands; the
  decoder rolls back to the value's start;
- an error lies on the enclosing object or array and its keyword can only stay violated as members
  are added (`MONOTONE`: a duplicate item stays a duplicate): the decoder rolls back to the start of
  the member just added (its key, in an object).

Errors on containers still open are left until they close (a missing `dependentRequired` key may
still come). What this misses (an `if` on an enclosing object decided by keys not yet written) the
session's final check still reports: never invalid output presented as valid.

Which values are checked is decided from the schema (`CheckPlan.patterns`): the instance paths
(keys, `*` for any key or index, `**` for any path below, after a recursive `$ref`) of the schemas
that carry a validated keyword, found by walking the schema from its root through its applicators
and local `$ref`s. The decoder holds back the text of such values while they are open, since it
may still be rolled back (`ValueChecker.hold_from`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from guided.schema.numbers import loads_exact
from guided.schema.pointer import pointer, resolve_local_ref
from guided.schema.walk import SUBSCHEMA_LIST, SUBSCHEMA_MAP
from guided.validation import validator_for

# Keywords whose error on an object or array stays as members are added (an excess or a duplicate is
# never undone by more members), so it may be acted on before the container closes.
MONOTONE = frozenset({"uniqueItems", "maxItems", "maxProperties", "maxContains", "propertyNames"})

# Applicators whose subschemas apply to the same instance as the schema holding them.
_SAME_INSTANCE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies")
# ... to any property value / any array item of it.
_ANY_PROPERTY = ("patternProperties", "additionalProperties", "unevaluatedProperties")
_ANY_ITEM = ("items", "prefixItems", "additionalItems", "unevaluatedItems", "contains")


@dataclass(frozen=True)
class Violation:
    """A closed value that breaks the schema: the validator's `keyword` and `message`, the instance
    `pointer` of the error, `start`, the byte offset of the output to roll back to, and `end`, the
    offset where the offending value (or member) ends."""

    keyword: str
    pointer: str
    message: str
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.keyword} at {self.pointer or '/'}: {self.message}"


def _matches(pattern: tuple, path: tuple) -> bool:
    for i, p in enumerate(pattern):
        if p == "**":
            return True
        if i >= len(path) or (p != "*" and p != path[i]):
            return False
    return len(pattern) == len(path)


def instance_patterns(schema, keyword_paths: set[tuple]) -> set[tuple]:
    """The instance-path patterns of the schemas that hold a keyword in `keyword_paths` (schema paths
    of the keywords themselves, e.g. ("properties", "tags", "uniqueItems")). A `$ref` that cannot be
    resolved locally, or that recurses, makes everything below its instance path a candidate."""
    holders = {p[:-1] for p in keyword_paths}
    patterns: set[tuple] = set()

    def walk(node, spath: tuple, ipath: tuple, active: frozenset):
        if not isinstance(node, dict):
            return
        if spath in holders:
            patterns.add(ipath)
        if "$ref" in node:
            target = resolve_local_ref(schema, node["$ref"])
            if target is None or target[0] in active:
                patterns.add(ipath + ("**",))
            else:
                walk(target[1], target[0], ipath, active | {target[0]})
        for key, value in node.items():
            if key in _SAME_INSTANCE or key in _ANY_PROPERTY or key in _ANY_ITEM or key == "properties":
                child_ipath = ipath
                if key in _ANY_PROPERTY or key in _ANY_ITEM:
                    child_ipath = ipath + ("*",)
                if isinstance(value, dict) and (key in SUBSCHEMA_MAP or key == "properties"):
                    for name, sub in value.items():
                        walk(sub, spath + (key, name), child_ipath + ((name,) if key == "properties" else ()), active)
                elif isinstance(value, list) and key in SUBSCHEMA_LIST:
                    for i, sub in enumerate(value):
                        walk(sub, spath + (key, i), child_ipath, active)
                else:
                    walk(value, spath + (key,), child_ipath, active)

    walk(schema, (), (), frozenset({()}))
    return patterns


@dataclass(frozen=True)
class CheckPlan:
    """What to check during decoding for one schema: the schema as given and the schema paths of the
    keywords enforced by validate-and-rollback (`keyword_paths`). Shared and read-only; each
    generation gets its own `ValueChecker` from `checker()`."""

    schema: object
    keyword_paths: frozenset = field(default_factory=frozenset)

    @cached_property
    def patterns(self) -> frozenset:
        return frozenset(instance_patterns(self.schema, set(self.keyword_paths)))

    @cached_property
    def validator(self):
        return validator_for(self.schema)

    def checked(self, path: tuple) -> bool:
        return any(_matches(p, path) for p in self.patterns)

    def checker(self) -> ValueChecker:
        return ValueChecker(self)


@dataclass
class _Frame:
    """An open object ("{") or array ("[") and its current member."""

    kind: str
    start: int  # byte offset of the bracket
    path: tuple  # instance path of the container
    checked: bool
    member: Any = None  # current key (object) or index (array)
    member_start: int = 0  # where the current member begins: its key in an object, its value in an array
    choice: int = 0  # where the choice of the current member was made: after the bracket or the last member
    state: str = "value"  # object: key / colon / value / comma; array: value / comma


_LITERALS = {ord("t"): 4, ord("f"): 5, ord("n"): 4}
_NUMBER = frozenset(b"0123456789+-.eE")
_SPACE = frozenset(b" \t\r\n")


class ValueChecker:
    """One generation's validate-and-rollback state over the output bytes (see the module docstring).

    Assumes the grammar keeps the output well-formed JSON; bytes after the root value are ignored.
    """

    def __init__(self, plan: CheckPlan):
        self.plan = plan
        self.text = bytearray()
        self._reset()

    def _reset(self):
        self.stack: list[_Frame] = []
        self.scalar: tuple[str, int, bool] | None = None  # (kind "s"/"n"/"l", start, is a key)
        self.escape = False
        self.done = False
        self.root_start: int | None = None

    def feed(self, data: bytes) -> Violation | None:
        """Append output bytes; the first violation of a value they close, or None."""
        for byte in data:
            pos = len(self.text)
            self.text.append(byte)
            violation = self._byte(byte, pos)
            if violation is not None:
                return violation
        return None

    def end(self) -> Violation | None:
        """The output ended: close a root number (it ends only here) and check it."""
        if self.scalar is not None and self.scalar[0] == "n" and not self.stack:
            _, start, _ = self.scalar
            self.scalar = None
            return self._closed(start, len(self.text), ())
        return None

    def truncate(self, length: int) -> None:
        """Forget the output after its first `length` bytes (a rollback)."""
        text = bytes(self.text[:length])
        self.text = bytearray()
        self._reset()
        for byte in text:  # nothing to check: these values were checked when they closed
            pos = len(self.text)
            self.text.append(byte)
            self._byte(byte, pos, check=False)

    def hold_from(self) -> int | None:
        """Byte offset from which the output may still be rolled back, or None: the outermost open
        value that is checked, from where its container chose to write it (after the bracket or the
        previous member: a retry may leave the member out)."""
        for depth, frame in enumerate(self.stack):
            if frame.checked:
                return self.stack[depth - 1].choice if depth else frame.start
        if self.scalar is not None and not self.scalar[2]:
            if self.plan.checked(self._child_path()):
                return self.stack[-1].choice if self.stack else self.scalar[1]
        return None

    # -- the tracker ------------------------------------------------------------------------------

    def _child_path(self) -> tuple:
        return self.stack[-1].path + (self.stack[-1].member,) if self.stack else ()

    def _byte(self, byte: int, pos: int, check: bool = True) -> Violation | None:
        if self.done:
            return None
        if self.scalar is not None:
            kind, start, is_key = self.scalar
            if kind == "s":
                if self.escape:
                    self.escape = False
                elif byte == 0x5C:  # backslash
                    self.escape = True
                elif byte == 0x22:  # closing quote
                    self.scalar = None
                    if is_key:
                        self.stack[-1].member = json.loads(self.text[start : pos + 1])
                        self.stack[-1].state = "colon"
                        return None
                    return self._value_end(start, pos + 1, check)
                return None
            if kind == "l":
                if pos + 1 - start == _LITERALS[self.text[start]]:
                    self.scalar = None
                    return self._value_end(start, pos + 1, check)
                return None
            if byte in _NUMBER:
                return None
            self.scalar = None  # a number ends at the first byte that cannot continue it
            violation = self._value_end(start, pos, check)
            if violation is not None:
                return violation
        if byte in _SPACE:
            return None
        frame = self.stack[-1] if self.stack else None
        if frame is None and byte in (0x3A, 0x2C, 0x7D, 0x5D):  # not JSON: left to the final check
            self.done = True
            return None
        if byte == 0x22 and frame is not None and frame.kind == "o" and frame.state == "key":
            frame.member_start = pos
            self.scalar = ("s", pos, True)
        elif frame is not None and byte == 0x3A:  # colon (with no frame these bytes ended above)
            frame.state = "value"
        elif frame is not None and byte == 0x2C:  # comma
            if frame.kind == "o":
                frame.state = "key"
            else:
                frame.member += 1
                frame.state = "value"
        elif frame is not None and byte in (0x7D, 0x5D):  # closing brace / bracket
            self.stack.pop()
            return self._value_end(frame.start, pos + 1, check, frame.path)
        else:
            self._value_start(pos)
            if byte in (0x7B, 0x5B):  # opening brace / bracket
                path = self._child_path()
                kind = "o" if byte == 0x7B else "a"
                frame = _Frame(
                    kind, pos, path, self.plan.checked(path), member=0 if kind == "a" else None, choice=pos + 1
                )
                self.stack.append(frame)
                if kind == "o":
                    self.stack[-1].state = "key"
            elif byte == 0x22:
                self.scalar = ("s", pos, False)
            elif byte in _LITERALS:
                self.scalar = ("l", pos, False)
            else:
                self.scalar = ("n", pos, False)
        return None

    def _value_start(self, pos: int) -> None:
        if not self.stack:
            self.root_start = pos
        elif self.stack[-1].kind == "a":
            self.stack[-1].member_start = pos

    def _value_end(self, start: int, end: int, check: bool, path: tuple | None = None) -> Violation | None:
        path = self._child_path() if path is None else path
        if self.stack:
            self.stack[-1].state = "comma"
            self.stack[-1].choice = end
        else:
            self.done = True
        return self._closed(start, end, path) if check else None

    # -- the check ------------------------------------------------------------------------------

    def _closed(self, start: int, end: int, path: tuple) -> Violation | None:
        parent = self.stack[-1] if self.stack else None
        own = self.plan.checked(path)
        if not own and not (parent is not None and parent.checked):
            return None
        closers = "".join("}" if f.kind == "o" else "]" for f in reversed(self.stack))
        try:
            document = loads_exact(self.text[:end].decode("utf-8") + closers)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None  # not JSON the tracker understands: left to the final check
        for error in self.plan.validator.iter_errors(document):
            where = tuple(error.absolute_path)
            # a property name's error is the name's own ("pattern"), reported on the object
            keyword = "propertyNames" if "propertyNames" in error.relative_schema_path else str(error.validator)
            if own and where[: len(path)] == path:
                return Violation(keyword, pointer(where), error.message, start, end)
            if parent is not None and parent.checked and where == parent.path and keyword in MONOTONE:
                return Violation(keyword, pointer(where), error.message, parent.member_start, end)
        return None

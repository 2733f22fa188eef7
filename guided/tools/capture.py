"""Reading a call back from its llguidance capture (the grammar's `guided.tools.formats` rules
capture every call exactly once). The capture's name (after llguidance's `__LIST_APPEND:` prefix,
which keeps two identical calls in a row as two captures) says how to read it:

- "call_json": a JSON envelope `{"name": N, "<args key>": A}` (hermes, llama3, mistral, phi4,
  generic, and the fenced / bare / array JSON calls small models write under auto): the arguments
  are A's JSON text as generated.
- "call": the format's own text of one call (pythonic `fn(a=1)`, also inside LFM2's markers;
  Qwen3-Coder `<function=f>...`; GLM-4.5 `name\n<arg_key>...</tool_call>`), converted by the
  format's `read` to JSON arguments (`json.dumps`, the templates' separators).
- "custom": a custom tool's JSON envelope `{"name": N, "<args key>": {"input": S}}`
  (`guided.tools.custom`), read to its input, given as the arguments `{"input": input}`.
- "args:<name>": the arguments JSON of a call of <name> (Mistral's `[TOOL_CALLS]name[ARGS]{...}`,
  Kimi K2's `functions.name:0<|tool_call_argument_begin|>{...}`).

A "call_id" capture (`guided.tools.formats.CALL_ID`) is not a call: `guided.tools.calls` takes it as
the id of the call that follows.
"""

from __future__ import annotations

import json
import re

from guided.tools.custom import CUSTOM, INPUT, read_custom
from guided.tools.formats import FORMATS, args_key
from guided.tools.syntax import APPEND

CALL_HEAD = re.compile(r'[\s\[,]*\{"name": "((?:[^"\\]|\\.)*)", "(?:arguments|parameters)": ')


def split_call(text: str) -> tuple[str, str] | None:
    """(name, arguments text) of a complete call JSON envelope as the grammar writes it, else None."""
    head = CALL_HEAD.match(text)
    if head is None:
        return None
    try:
        _, end = json.JSONDecoder().raw_decode(text, head.end())
    except json.JSONDecodeError:
        return None
    return json.loads(f'"{head.group(1)}"'), text[head.end() : end]


def read_capture(name: str, text: str, fmt: str, tools: dict) -> tuple[str, str, dict] | None:
    """(name, arguments JSON text, arguments dict) of one capture of a call (see the module
    docstring), or None for a capture that is not a call. tools: {name: guided.tools.Tool}."""
    name = name.removeprefix(APPEND)
    if name == "call_json":
        split = split_call(text)
        return None if split is None else (split[0], split[1], json.loads(text)[args_key(fmt)])
    if name == CUSTOM and (head := CALL_HEAD.match(text)) is not None:
        called = json.loads(f'"{head.group(1)}"')
        tool = tools.get(called)
        value = None if tool is None else read_custom(text[head.end() :], tool.format)
        return None if value is None else (called, json.dumps({INPUT: value}, ensure_ascii=False), {INPUT: value})
    if name.startswith("args:"):
        return name[5:], text, json.loads(text)
    f = FORMATS.get(fmt)
    if name == "call" and f is not None and f.read is not None and (call := f.read(text, tools)) is not None:
        return call[0], json.dumps(call[1], ensure_ascii=False), call[1]
    return None

"""Custom tools (OpenAI's `type: "custom"`): a tool whose input is raw text, free or constrained by a
grammar, instead of JSON arguments.

A custom tool is given in the Responses shape `{"type": "custom", "name", "description", "format"}`
or the chat shape `{"type": "custom", "custom": {"name", "description", "format"}}`; its format is
`{"type": "text"}` (any text), `{"type": "grammar", "syntax": "lark" | "regex", "definition"}`
(Responses) or `{"type": "grammar", "grammar": {"syntax", "definition"}}` (chat). `input_format`
reads both into one dict `{"type": "text"}` / `{"type": "grammar", "syntax", "definition"}`.

How the input is carried (the formats whose calls are JSON envelopes: hermes, llama3, mistral,
phi4, generic and the JSON calls small models write): the template is shown a function with one
string parameter, `input`, and a call is `{"name": N, "<args key>": {"input": S}}`:

- text and regex: S is a JSON string, escaped as JSON escapes it; the engine constrains its
  *decoded* content (llguidance's JSON string `pattern`, anchored `^(?:R)$`, in llguidance's regex
  dialect, Rust's `regex` crate). The input is S decoded.
- lark: S is a JSON string too, escaped as JSON escapes it (a newline written `\\n`, a quote `\\"`,
  a backslash `\\\\`): llguidance applies a regex through JSON escaping (a lexeme), not a
  context-free grammar, so the grammar is mapped to the grammar of its language's JSON-escaped
  texts (`guided.tools.escaped.escaped_lark`, an inline `%lark { ... }` subgrammar between the
  quotes). The input is S decoded, a string of the grammar's own language.

Each custom call is one capture (`CUSTOM`, the whole envelope), read by `read_custom`.

Qwen3-Coder's XML calls have a raw text slot: a custom call is `<function=N>` then `<parameter=input>`,
the input written raw (unescaped) and `</parameter>`, the grammar (`raw_lark`: a Lark regex lexeme, or
the Lark grammar inline) constraining exactly that text; text inputs run to the first
`\n</parameter>\n`, as the format's string parameters do. The other formats whose calls are not JSON
envelopes (pythonic, LFM2, GLM-4.5, Kimi K2, Mistral's named calls) refuse custom tools
(`guided.tools.constraint`).
"""

from __future__ import annotations

import json
import re

from guided.tools.escaped import escaped_lark
from runtime.errors import InputError

CUSTOM = "custom"  # the capture name of a custom call's envelope (after `APPEND`)
INPUT = "input"  # the one parameter a custom tool is shown with
INPUT_OPEN = '{"input": '  # how a custom call's arguments begin, as the grammar writes them
SYNTAXES = ("lark", "regex")


def input_format(tool: dict) -> dict:
    """The format of a custom tool definition (`tool` is its Responses or chat dict) as one dict:
    {"type": "text"} or {"type": "grammar", "syntax": "lark" | "regex", "definition": str}. Raises
    InputError ("tools") for an unknown format type or syntax, or a grammar without a definition."""
    spec = tool.get("custom", tool)
    fmt = spec.get("format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise InputError(f"custom tool {spec.get('name')!r}: format.type must be text or grammar, got {fmt!r}", "tools")
    if fmt["type"] == "text":
        return {"type": "text"}
    grammar = fmt.get("grammar", fmt)  # chat nests it under "grammar"; Responses is flat
    syntax, definition = grammar.get("syntax"), grammar.get("definition")
    if syntax not in SYNTAXES or not isinstance(definition, str) or not definition.strip():
        raise InputError(
            f"custom tool {spec.get('name')!r}: a grammar format needs syntax lark or regex and a definition", "tools"
        )
    return {"type": "grammar", "syntax": syntax, "definition": definition}


def input_schema(fmt: dict) -> dict:
    """The parameters a custom tool is shown with in the chat template (one string, `input`), its
    description saying what the grammar asks for, so the model sees the rule it is held to."""
    if fmt["type"] == "text":
        about = "the tool's input, as raw text"
    else:
        about = f"the tool's input, raw text matching this {fmt['syntax']} grammar:\n{fmt['definition']}"
    return {"type": "object", "properties": {INPUT: {"type": "string", "description": about}}, "required": [INPUT]}


def input_lark(fmt: dict) -> str:
    """The Lark expression (llguidance dialect) of S in `{"input": S}`: see the module docstring."""
    if fmt["type"] == "text":
        return '%json {"type": "string"}'
    if fmt["syntax"] == "regex":
        return "%json " + json.dumps({"type": "string", "pattern": f"^(?:{fmt['definition']})$"}, ensure_ascii=False)
    return '"\\"" %lark {\n' + escaped_lark(fmt["definition"]).strip() + '\n} "\\""'


def raw_lark(fmt: dict) -> str | None:
    """The Lark expression (llguidance dialect) of a raw input, not inside a JSON string: a regex
    lexeme `/R/` (R's unescaped slashes escaped) or the Lark grammar inline; None for text."""
    if fmt["type"] == "text":
        return None
    if fmt["syntax"] == "lark":
        return "%lark {\n" + fmt["definition"].strip() + "\n}"
    return "/" + re.sub(r"(?<!\\)((?:\\\\)*)/", r"\1\\/", fmt["definition"]) + "/"


def alone(fmt: dict) -> dict | None:
    """The options of `guided.spec.make_spec` that compile a custom tool's grammar alone (its own
    error, with line and column, before the tools grammar embeds it): {"grammar": ...} or
    {"regex": ...}; None for free text."""
    if fmt["type"] == "text":
        return None
    return {"grammar": fmt["definition"]} if fmt["syntax"] == "lark" else {"regex": fmt["definition"]}


def read_custom(arguments: str, fmt: dict) -> str | None:
    """The input of a complete custom call, from its arguments text `{"input": S}}` (the
    envelope's closing brace included, as captured): S decoded; None if it is not one."""
    if not arguments.startswith(INPUT_OPEN):
        return None
    try:
        value = json.loads(arguments[:-1])
    except ValueError:
        return None
    return value.get(INPUT) if isinstance(value, dict) else None


def input_so_far(arguments: str, fmt: dict) -> str:
    """The input decoded from the arguments text of a call being written (`{"input": S` so far):
    only what is certainly input, so that what follows extends it: S's complete characters (an
    escape is taken once whole, a high surrogate once its pair has come)."""
    if not arguments.startswith(INPUT_OPEN + '"'):
        return ""
    body = arguments[len(INPUT_OPEN) + 1 :]
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == '"':
            break
        if c != "\\":
            out.append(c)
            i += 1
            continue
        size = 2
        if body[i + 1 : i + 2] == "u":  # \uXXXX; a high surrogate is decoded with the low one after it
            size = 12 if body[i + 2 : i + 4].lower() in ("d8", "d9", "da", "db") else 6
        if i + size > len(body):
            break
        try:
            out.append(json.loads('"' + body[i : i + size] + '"'))
        except ValueError:
            break
        i += size
    return "".join(out)

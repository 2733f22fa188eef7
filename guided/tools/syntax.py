"""Lark building blocks of tool-call grammars (llguidance dialect) beside the JSON envelopes of
`guided.tools.formats`: `Pieces` (what a format's rules are built from), `in_order` (parameters in
order, the optional ones possibly left out), and the three call syntaxes whose arguments are not
JSON as generated: pythonic `[fn(a=1, b="x")]`, Qwen3-Coder's XML `<function=f><parameter=p>` and
GLM-4.5's `<arg_key>k</arg_key><arg_value>v</arg_value>`, each with its reader (one whole call's text
-> (name, arguments dict))."""

from __future__ import annotations

import ast
import json
import keyword
import re
from dataclasses import dataclass

from guided.tools.custom import CUSTOM, raw_lark
from runtime.errors import InputError

# The templates render calls with json.dumps' default separators; the constraint matches them.
CALL_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
NEWLINE = "\n"
# llguidance drops a capture equal to the last one of its name (one completion seen twice) unless the
# name has this prefix: two identical calls in a row are two calls, so call captures carry it.
APPEND = "__LIST_APPEND:"
COMMA = '", "'  # the Lark literal of the separator of arguments, list items and dict entries


@dataclass
class Pieces:
    """What a format's rules are built from: the allowed tools (`guided.tools.Tool`), whether several
    calls may come, and the Lark spelling of each marker (`guided.tools.token_ref`)."""

    tools: list
    parallel: bool
    refs: dict[str, str]

    def more(self, item: str) -> str:
        """`item` repeated (the next calls with their separator) when parallel, else nothing."""
        return f" ({item})*" if self.parallel else ""


def in_order(name: str, items: list[tuple[str, bool]], sep: str, rules: list[str]) -> str:
    """An expression of `items` ((Lark expression, required)) in their order, each optional one
    possibly left out, `sep` (a Lark literal, or "") between them; helper rules `<name>_f<k>` /
    `<name>_r<k>` go to `rules`. Returns "" for no items (the empty sequence)."""
    n = len(items)
    empty_from = [all(not req for _, req in items[k:]) for k in range(n + 1)]

    def tail(kind: str, k: int) -> str:
        return "" if k == n else f" {name}_{kind}{k}{'?' if empty_from[k] else ''}"

    for k in range(n - 1, -1, -1):
        expr, required = items[k]
        for kind, lead in (("f", ""), ("r", f"{sep} " if sep else "")):
            options = [f"{lead}{expr}{tail('r', k + 1)}"]
            if not required and k + 1 < n:
                options.append(f"{name}_{kind}{k + 1}")
            rules.append(f"{name}_{kind}{k}: {' | '.join(options)}\n")
    if n == 0:
        return ""
    return f"{name}_f0{'?' if empty_from[0] else ''}"


def _regex_escape(text: str) -> str:
    return "".join(c if c.isalnum() or c in " _" else "\\n" if c == "\n" else "\\" + c for c in text)


def text_not_starting_with(prefixes: list[str]) -> str:
    """A regex (llguidance syntax) of every text, also "", that starts with none of `prefixes`: for
    each proper prefix p of a prefix (a trie node), p then the end or a character that does not
    continue any prefix. The alternatives are disjoint (the longest node that is a prefix of the
    text is unique)."""
    nodes: dict[str, set[str]] = {}
    for prefix in prefixes:
        for i in range(len(prefix)):
            nodes.setdefault(prefix[:i], set()).add(prefix[i])
    complete = set(prefixes)
    alternatives = []
    for node, following in nodes.items():
        if node in complete:
            continue
        banned = "".join(_regex_escape(c) for c in sorted(following))
        alternatives.append(f"{_regex_escape(node)}([^{banned}](.|\\n)*)?")
    return "(" + "|".join(alternatives) + ")"


# -- pythonic calls: [fn(a=1, b="x"), g()] -----------------------------------------------------------

PY_TERMINALS = r"""PYSTR: /"([^"\\\n]|\\["\\'nrt]|\\u[0-9a-fA-F]{4})*"|'([^'\\\n]|\\["\\'nrt]|\\u[0-9a-fA-F]{4})*'/
INT: /-?(0|[1-9][0-9]*)/
NUM: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/
pyany: PYSTR | NUM | "True" | "False" | "None" | "[" (pyany (", " pyany)*)? "]" | "{" (entry (", " entry)*)? "}"
entry: PYSTR ": " pyany
"""
_PY_CALL = re.compile(r"([^\s(\[,]+)\((.*)\)", re.S)


def _py_literal(value) -> str:
    """`value` (JSON data) as a Python literal, as the grammar writes it."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_py_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)  # strings (double-quoted, JSON escapes are Python's too) and numbers


def py_value(schema, rules: list[str]) -> str:
    """A Lark expression of the Python literals of a JSON Schema: its type (strings as Python string
    literals, True/False, None, numbers, lists, dicts with its properties in order), enum, const,
    anyOf / oneOf; anything else (a $ref, no type) is any literal, checked against the schema after
    the call. Helper rules go to `rules`."""
    if not isinstance(schema, dict):
        return "pyany"
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        return "(" + " | ".join(json.dumps(_py_literal(v)) for v in values) + ")"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return "(" + " | ".join(py_value(s, rules) for s in schema[key]) + ")"
    kind = schema.get("type")
    if isinstance(kind, list):
        return "(" + " | ".join(py_value({**schema, "type": k}, rules) for k in kind) + ")"
    simple = {"string": "PYSTR", "integer": "INT", "number": "NUM", "boolean": '("True" | "False")', "null": '"None"'}
    if kind in simple:
        return simple[kind]
    if kind == "array":
        item = py_value(schema.get("items", {}), rules)
        return f'"[" ({item} (", " {item})*)? "]"'
    if kind == "object" and schema.get("properties"):
        required = set(schema.get("required", []))
        items = [
            (f"{json.dumps(json.dumps(k) + ': ')} {py_value(v, rules)}", k in required)
            for k, v in schema["properties"].items()
        ]
        return f'"{{" {in_order(f"pyobj{len(rules)}", items, COMMA, rules)} "}}"'
    return "pyany"


def pythonic_rules(p: Pieces) -> str:
    # The first call's opening "[name(" is one literal: free text (auto) dies at its "(", and the lexer
    # can end only one lexeme there. That call's capture starts with the "[".
    count = range(len(p.tools))
    rules = [
        f'calls: pfirst{p.more(COMMA + " pcall")} "]"\n',
        "pfirst: " + " | ".join(f"pyf{i}" for i in count) + "\npcall: " + " | ".join(f"py{i}" for i in count) + "\n",
    ]
    for i, tool in enumerate(p.tools):
        required = set(tool.parameters.get("required", []))
        properties = tool.parameters.get("properties", {})
        if bad := [k for k in properties if not k.isidentifier() or keyword.iskeyword(k)]:
            raise InputError(f"tool {tool.name!r}: parameter {bad[0]!r} cannot be a Python keyword argument")
        items = [(f"{json.dumps(k + '=')} {py_value(v, rules)}", k in required) for k, v in properties.items()]
        args = in_order(f"pya{i}", items, COMMA, rules)
        rules.append(f'py{i}[capture="{APPEND}call"]: {json.dumps(tool.name + "(")} {args} ")"\n')
        rules.append(f'pyf{i}[capture="{APPEND}call"]: {json.dumps("[" + tool.name + "(")} {args} ")"\n')
    return "".join(rules) + PY_TERMINALS


def read_pythonic(text: str, tools: dict) -> tuple[str, dict] | None:
    """(name, arguments) of one whole call `fn(a=1, b="x")` (markup around it, `[`, `, `, `]`, is
    ignored), each value by `ast.literal_eval`; None while the call is not complete."""
    match = _PY_CALL.fullmatch(text.strip().lstrip("[, ").rstrip("], \n"))
    if match is None:
        return None
    try:
        # Not always one call: "f(a=1), g(b=2)" parses to a tuple, "f(a) or g(b)" to a BoolOp.
        node = ast.parse(f"f({match.group(2)})", mode="eval").body
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            return None
        return match.group(1), {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except (SyntaxError, ValueError):
        return None


# -- Qwen3-Coder XML: <function=f>\n<parameter=p>\nvalue\n</parameter>\n</function> ----------------

PARAM_END = "\n</parameter>\n"
_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>\n")
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n")


def is_text(schema) -> bool:
    """Whether the template writes this parameter's values as raw text (strings), not JSON."""
    if not isinstance(schema, dict):
        return False
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if values is not None:
        return all(isinstance(v, str) for v in values)
    return schema.get("type") == "string"


def qwen3_coder_rules(p: Pieces) -> str:
    block = f'{p.refs[HERMES_OPEN]} "\\n" xcall "\\n" {p.refs[HERMES_CLOSE]}'
    rules = [f"calls: block{p.more('NL block')}\nblock: {block}\n"]
    rules.append("xcall: " + " | ".join(f"x{i}" for i in range(len(p.tools))) + "\n")
    end = json.dumps(PARAM_END)
    for i, tool in enumerate(p.tools):
        required = set(tool.parameters.get("required", []))
        items = []
        for k, v in tool.parameters.get("properties", {}).items():
            if ">" in k or "\n" in k:
                raise InputError(f"tool {tool.name!r}: parameter {k!r} cannot be written as <parameter={k}>")
            if tool.kind == CUSTOM and (raw := raw_lark(tool.format)) is not None:
                value = f"{raw} {end}"  # a custom tool's input, raw in its slot (`guided.tools.custom`)
            elif is_text(v) and ("enum" in v or "const" in v):
                words = [v["const"]] if "const" in v else v["enum"]
                value = "(" + " | ".join(json.dumps(w) for w in words) + f") {end}"
            elif is_text(v):
                value = "xstr"  # raw text up to the first "\n</parameter>\n", which it includes (lazy)
            else:
                value = f"%json {json.dumps({**v, 'x-guidance': CALL_JSON_STYLE}, ensure_ascii=False)} {end}"
            items.append((f"{json.dumps(f'<parameter={k}>' + NEWLINE)} {value}", k in required))
        params = in_order(f"xa{i}", items, "", rules)
        opening = json.dumps(f"<function={tool.name}>\n")
        rules.append(f'x{i}[capture="{APPEND}call"]: {opening} {params} "</function>"\n')
    return "".join(rules) + "xstr[lazy]: /(.|\\n)*\\n<\\/parameter>\\n/\n"


def read_qwen3_coder(text: str, tools: dict) -> tuple[str, dict] | None:
    """(name, arguments) of one whole `<function=...>...</function>` call: raw-text values for string
    parameters, JSON for the others; None while the call is not complete."""
    text = text.strip()
    match = _XML_FUNCTION.match(text)
    if match is None or match.group(1) not in tools:
        return None
    properties = tools[match.group(1)].parameters.get("properties", {})
    position, args = match.end(), {}
    while (parameter := _XML_PARAMETER.match(text, position)) is not None:
        end = text.find(PARAM_END, parameter.end())
        if end < 0:
            return None
        key, raw = parameter.group(1), text[parameter.end() : end]
        try:
            args[key] = raw if is_text(properties.get(key)) else json.loads(raw)
        except json.JSONDecodeError:
            return None
        position = end + len(PARAM_END)
    return (match.group(1), args) if text[position:] == "</function>" else None


# -- GLM-4.5: <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call> --------

GLM_KEY, GLM_KEY_END, GLM_VALUE, GLM_VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


def glm45_rules(p: Pieces) -> str:
    """GLM-4.5 / 4.6: `<tool_call>name\n` then per parameter, in schema order (required ones always),
    `<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n`, then `</tool_call>` (all six markers special
    tokens); v raw text for string parameters (as the template writes them), JSON otherwise. The
    capture ends with `</tool_call>`, so `read_glm45` knows when a call is complete."""
    r = p.refs
    rules = [f"calls: gblock{p.more('NL? gblock')}\ngblock: {r[HERMES_OPEN]} gcall\n"]
    rules.append("gcall: " + " | ".join(f"g{i}" for i in range(len(p.tools))) + "\n")
    for i, tool in enumerate(p.tools):
        required, items = set(tool.parameters.get("required", [])), []
        for k, v in tool.parameters.get("properties", {}).items():
            if "<" in k or "\n" in k:
                raise InputError(f"tool {tool.name!r}: parameter {k!r} cannot be written as <arg_key>{k}</arg_key>")
            if is_text(v) and ("enum" in v or "const" in v):
                value = "(" + " | ".join(json.dumps(w) for w in ([v["const"]] if "const" in v else v["enum"])) + ")"
            elif is_text(v):
                value = "GSTR?"
            else:
                value = f"%json {json.dumps({**v, 'x-guidance': CALL_JSON_STYLE}, ensure_ascii=False)}"
            key = f'{r[GLM_KEY]} {json.dumps(k)} {r[GLM_KEY_END]} "\\n" {r[GLM_VALUE]}'
            items.append((f'{key} {value} {r[GLM_VALUE_END]} "\\n"', k in required))
        params = in_order(f"ga{i}", items, "", rules)
        rules.append(f'g{i}[capture="{APPEND}call"]: {json.dumps(tool.name + NEWLINE)} {params} {r[HERMES_CLOSE]}\n')
    # Raw text that cannot spell the closing marker with ordinary tokens either (the reader splits on it).
    return "".join(rules) + f'GSTR: /(.|\\n)+/ & ~(/(.|\\n)*/ "{GLM_VALUE_END}" /(.|\\n)*/)\n'


def read_glm45(text: str, tools: dict) -> tuple[str, dict] | None:
    """(name, arguments) of one whole GLM call `name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n...
    </tool_call>`: raw text for string parameters, JSON for the others; None while incomplete."""
    name, newline, body = text.lstrip().partition(NEWLINE)
    if not newline or name not in tools or not body.endswith(HERMES_CLOSE):
        return None
    body, properties, args, pos = body[: -len(HERMES_CLOSE)], tools[name].parameters.get("properties", {}), {}, 0
    opening, closing = f"{GLM_KEY_END}\n{GLM_VALUE}", f"{GLM_VALUE_END}\n"
    while body.startswith(GLM_KEY, pos):
        middle = body.find(opening, pos)
        key, pos = body[pos + len(GLM_KEY) : middle], middle + len(opening)
        try:
            if is_text(properties.get(key)):
                end = body.index(closing, pos)
                args[key] = body[pos:end]
            else:
                args[key], end = json.JSONDecoder().raw_decode(body, pos)
        except ValueError:
            return None
        if not body.startswith(closing, end):
            return None
        pos = end + len(closing)
    return (name, args) if pos == len(body) else None

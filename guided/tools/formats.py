"""The tool-call formats of model families, one `ToolFormat` each, in the registry `FORMATS`: its
markers, how a chat template reveals it (`detect_format`), the Lark rules (llguidance dialect) of its
calls, and how its captured calls become (name, arguments). `guided.tools.constraint` assembles a
reply's grammar around these pieces; `guided.tools.capture` reads a call back from its capture and
`guided.tools.calls` streams the calls. The call syntaxes that are not JSON (pythonic, Qwen3-Coder's
XML, GLM-4.5's) are built, and read, in `guided.tools.syntax`. docs/reference/tools.md has the table.

Every call is exactly one llguidance capture, so the grammar, not a text search, gives its
boundaries; the capture names are listed in `guided.tools.capture`. Beside the call, "call_id"
(`CALL_ID`) captures an id the model writes itself before the call (Kimi K2's `functions.name:idx`),
which becomes the call's id: its template puts the history's ids there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from guided.tools.syntax import (
    APPEND,
    CALL_JSON_STYLE,
    GLM_KEY,
    GLM_KEY_END,
    GLM_VALUE,
    GLM_VALUE_END,
    HERMES_CLOSE,
    HERMES_OPEN,
    Pieces,
    glm45_rules,
    pythonic_rules,
    qwen3_coder_rules,
    read_glm45,
    read_pythonic,
    read_qwen3_coder,
)

FENCE = "```json\n"  # what small models write before a call under auto (the BFCL finding)
ARRAY_OPENS = ("[", "[\n", "[\n  ", "[\n    ")  # how small models open a JSON array of calls
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
PHI_OPEN, PHI_CLOSE = "<|tool_call|>", "<|/tool_call|>"
KIMI_SECTION, KIMI_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KIMI_CALL, KIMI_ARGS, KIMI_CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
LFM2_OPEN, LFM2_CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"


@dataclass(frozen=True)
class ToolFormat:
    """One family's call format (`FORMATS` has them all, in detection order).

    detect: chat template text -> whether the template speaks this format. opener: the marker that
    opens calls after text (when it is a special token of the tokenizer); args_key: the key of the
    arguments in its JSON envelope.
    rules: Pieces -> the Lark rules defining `calls` (the format's own markup, at the output's start)
        and the rule named `after_text` (calls that may follow free text under auto, which must
        begin with the `opener` special token). markers: the marker texts the rules use; special:
        those that must be one special token of the tokenizer (else the format cannot be used).
    triggers: Pieces -> the texts (with the offset where the call itself begins) that start this
        format's own calls at the output's start, which free text may not begin with under auto.
    json_text: under auto also accept the fenced / bare / array JSON calls small models write
        (`json_text_forms`); bare: include the bare form (llama3's own calls are bare already).
    starts_call: a token's bytes -> whether it begins a call's text after markup (labels).
    read: (a call's text, {name: Tool}) -> (name, arguments dict), None while it is incomplete: for
        the "call" captures of formats whose arguments are not JSON as generated, whose calls
        `guided.tools.calls.CallStream` then streams whole, when their text is complete.
    json_calls: its calls are JSON envelopes `{"name": ..., args_key: {...}}` (`call_json`), whose
        arguments validate-and-rollback follows as they are decoded (`guided.tools.check`).
    raw_slot: its calls carry a custom tool's input raw in a slot of their own (Qwen3-Coder's
        `<parameter=input>`); custom tools need this or `json_calls` (`guided.tools.custom`).
    """

    name: str
    detect: Callable[[str], bool]
    rules: Callable[[Pieces], str]
    markers: tuple[str, ...] = ()
    special: tuple[str, ...] = ()
    opener: str | None = None
    after_text: str = "calls"
    args_key: str = "arguments"
    triggers: Callable[[Pieces], list[tuple[str, int]]] = field(default=lambda p: [])
    json_text: bool = True
    bare: bool = True
    starts_call: Callable[[bytes], bool] = field(default=lambda data: b"{" in data)
    read: Callable[[str, dict], tuple[str, dict] | None] | None = None
    json_calls: bool = True
    raw_slot: bool = False


def json_text_forms(p: Pieces, bare: bool) -> tuple[list[str], str, list[tuple[str, int]]]:
    """The JSON calls small models write under auto instead of their markup: fenced blocks separated
    by blank lines, each with a call per line, a (fenced) JSON array of calls, bare objects on
    separate lines (`bare`); one call unless parallel. Returns (start options, Lark rules, triggers
    with the offset of the first call)."""
    rules = (
        # A call per line inside one fence: the 0.5B model's first choice after its first call
        # (docs/reports/bfcl.md). `NL` before another call, `\n```` to close: one lexer lookahead tells them apart.
        f'fenced: "```json\\n" call_json{p.more("NL call_json")} "\\n```"\nfenced_calls: fenced{p.more("NL fenced")}\n'
        f"array: AOPEN call_json{p.more('ASEP call_json')} ACLOSE\n"
        f'fenced_array: FOPEN call_json{p.more("ASEP call_json")} ACLOSE "\\n```"\n'
        # The fence and the bracket are one lexeme: free text dies at the call's `{`, and the lexer
        # can end only one lexeme there (it does not backtrack over two).
        "AOPEN: /\\[(\\n(  |    )?)?/\nFOPEN: /```json\\n\\[(\\n(  |    )?)?/\n"
        "ASEP: /,[ \\n]*/\nACLOSE: /[ \\n]*\\]/\n"
    )
    options = ["fenced_calls", "array", "fenced_array"]
    triggers = [(FENCE + "{", len(FENCE))]
    triggers += [(prefix + opening + "{", len(prefix + opening)) for prefix in ("", FENCE) for opening in ARRAY_OPENS]
    if bare:
        rules += f"bare_calls: call_json{p.more('NL call_json')}\n"
        options.append("bare_calls")
        triggers.append(("{", 0))
    return options, rules, triggers


# -- the formats -----------------------------------------------------------------------------------


def _hermes(p: Pieces) -> str:
    block = f'{p.refs[HERMES_OPEN]} "\\n" call_json "\\n" {p.refs[HERMES_CLOSE]}'
    return f"calls: block{p.more('NL block')}\nblock: {block}\n"


def _llama3(p: Pieces) -> str:
    tag = p.refs.get(PYTHON_TAG)
    more = p.more('"; " call_json')
    rules = f"calls: {tag + '? ' if tag else ''}call_json{more}\n"
    return rules + (f"tagged: {tag} call_json{more}\n" if tag else "")


def _mistral_list(p: Pieces) -> str:
    more = p.more('", " call_json')
    return f'calls: {p.refs[MISTRAL_CALLS]} " "? "[" call_json{more} "]"\n'


def _mistral_names(p: Pieces) -> str:
    """`[TOOL_CALLS]name[ARGS]{...}`, the marker before each call (Mistral's v11+ templates)."""
    names = " | ".join(f"m{i}" for i in range(len(p.tools)))
    rules = [f"calls: mcall{p.more('mcall')}\nmcall: {p.refs[MISTRAL_CALLS]} ({names})\n"]
    for i, tool in enumerate(p.tools):
        body = json.dumps({**tool.parameters, "x-guidance": CALL_JSON_STYLE}, ensure_ascii=False)
        rules.append(f"m{i}: {json.dumps(tool.name)} {p.refs[MISTRAL_ARGS]} margs{i}\n")
        rules.append(f"margs{i}[capture={json.dumps(APPEND + 'args:' + tool.name)}]: %json {body}\n")
    return "".join(rules)


def _phi4(p: Pieces) -> str:
    """`<|tool_call|>[call, ...]<|/tool_call|>` (a bare call inside the markers is accepted too)."""
    listed = '"[" call_json' + p.more('", " call_json') + ' "]"'
    block = f"{p.refs[PHI_OPEN]} ({listed} | call_json) {p.refs[PHI_CLOSE]}"
    return f"calls: block{p.more('NL? block')}\nblock: {block}\n"


CALL_ID = "call_id"  # the capture of a call id the model writes itself (Kimi K2), before its call


def _kimi_k2(p: Pieces) -> str:
    """Kimi K2: `<|tool_calls_section_begin|>`, per call `<|tool_call_begin|>functions.name:idx
    <|tool_call_argument_begin|>{...}<|tool_call_end|>`, `<|tool_calls_section_end|>`."""
    r = p.refs
    names = " | ".join(f"k{i}" for i in range(len(p.tools)))
    rules = [f"calls: {r[KIMI_SECTION]} kcall{p.more('kcall')} {r[KIMI_SECTION_END]}\n"]
    rules.append(f"kcall: {r[KIMI_CALL]} ({names}) {r[KIMI_CALL_END]}\n")
    for i, tool in enumerate(p.tools):
        body = json.dumps({**tool.parameters, "x-guidance": CALL_JSON_STYLE}, ensure_ascii=False)
        rules.append(f"k{i}: kid{i} {r[KIMI_ARGS]} kargs{i}\n")
        # The model's own call id, `functions.name:idx`, is the call's id (its template renders the
        # history's ids in that place): captured as `CALL_ID`.
        rules.append(f"kid{i}[capture={json.dumps(APPEND + CALL_ID)}]: {json.dumps(f'functions.{tool.name}:')} KIDX\n")
        rules.append(f"kargs{i}[capture={json.dumps(APPEND + 'args:' + tool.name)}]: %json {body}\n")
    return "".join(rules) + "KIDX: /[0-9]+/\n"


def _lfm2(p: Pieces) -> str:
    """LFM2: pythonic calls inside `<|tool_call_start|>` ... `<|tool_call_end|>`."""
    listed = pythonic_rules(p).replace("calls: ", "pylist: ", 1)  # its first rule is the call list
    return f"calls: {p.refs[LFM2_OPEN]} pylist {p.refs[LFM2_CLOSE]}\n" + listed


# -- the registry, in detection order -------------------------------------------------------------

FORMATS: dict[str, ToolFormat | None] = {
    f.name: f
    for f in (
        ToolFormat(
            "glm45",
            lambda t: GLM_KEY in t and GLM_VALUE in t,
            glm45_rules,
            markers=(HERMES_OPEN, HERMES_CLOSE, GLM_KEY, GLM_KEY_END, GLM_VALUE, GLM_VALUE_END),
            special=(HERMES_OPEN, HERMES_CLOSE, GLM_KEY, GLM_KEY_END, GLM_VALUE, GLM_VALUE_END),
            opener=HERMES_OPEN,
            starts_call=lambda data: re.search(rb"[A-Za-z0-9_{-]", data) is not None,
            read=read_glm45,
            json_calls=False,
        ),
        ToolFormat(
            "kimi_k2",
            lambda t: KIMI_SECTION in t,
            _kimi_k2,
            markers=(KIMI_SECTION, KIMI_SECTION_END, KIMI_CALL, KIMI_ARGS, KIMI_CALL_END),
            special=(KIMI_SECTION, KIMI_SECTION_END, KIMI_CALL, KIMI_ARGS, KIMI_CALL_END),
            opener=KIMI_SECTION,
            starts_call=lambda data: True,  # `functions.name:idx` right after the markers
            json_calls=False,
        ),
        ToolFormat(
            "lfm2",
            lambda t: "<|tool_list_start|>" in t or LFM2_OPEN in t,
            _lfm2,
            markers=(LFM2_OPEN, LFM2_CLOSE),
            special=(LFM2_OPEN, LFM2_CLOSE),
            opener=LFM2_OPEN,
            json_text=False,  # a call starts at a name after markup, as pythonic's
            starts_call=lambda data: re.search(rb"[A-Za-z_]", data) is not None,
            read=read_pythonic,
            json_calls=False,
        ),
        ToolFormat(
            "qwen3_coder",
            lambda t: "<function=" in t and "<parameter=" in t,
            qwen3_coder_rules,
            markers=(HERMES_OPEN, HERMES_CLOSE),
            special=(HERMES_OPEN,),
            opener=HERMES_OPEN,
            starts_call=lambda data: b"<" in data or b"{" in data,
            read=read_qwen3_coder,
            json_calls=False,
            raw_slot=True,
        ),
        ToolFormat(
            "mistral_names",
            lambda t: MISTRAL_CALLS in t and MISTRAL_ARGS in t,
            _mistral_names,
            markers=(MISTRAL_CALLS, MISTRAL_ARGS),
            special=(MISTRAL_CALLS,),
            opener=MISTRAL_CALLS,
            json_text=False,  # its calls start at any token after the marker: fences would read as calls
            starts_call=lambda data: True,
            json_calls=False,
        ),
        ToolFormat(
            "mistral",
            lambda t: MISTRAL_CALLS in t,
            _mistral_list,
            markers=(MISTRAL_CALLS,),
            special=(MISTRAL_CALLS,),
            opener=MISTRAL_CALLS,
        ),
        ToolFormat(
            "phi4",
            lambda t: "<|tool|>" in t or PHI_OPEN in t,
            _phi4,
            markers=(PHI_OPEN, PHI_CLOSE),
            special=(PHI_OPEN, PHI_CLOSE),
            opener=PHI_OPEN,
        ),
        ToolFormat(
            "hermes",
            lambda t: HERMES_OPEN in t,
            _hermes,
            markers=(HERMES_OPEN, HERMES_CLOSE),
            special=(HERMES_OPEN,),
            opener=HERMES_OPEN,
        ),
        ToolFormat(
            "llama3",
            lambda t: "<|start_header_id|>" in t and ('"parameters"' in t or "ipython" in t),
            _llama3,
            markers=(PYTHON_TAG,),
            opener=PYTHON_TAG,
            after_text="tagged",
            args_key="parameters",
            triggers=lambda p: [("{", 0)],
            bare=False,  # its own calls are bare JSON objects already
        ),
        ToolFormat(
            "pythonic",
            lambda t: "func_name1(" in t,
            pythonic_rules,
            triggers=lambda p: [(f"[{t.name}(", 1) for t in p.tools],
            json_text=False,  # a call starts at a name after markup: fences would read as calls
            starts_call=lambda data: re.search(rb"[A-Za-z_]", data) is not None,
            read=read_pythonic,
            json_calls=False,
        ),
    )
} | {"generic": None}  # the JSON envelope for templates without tool markup (`guided.tools.constraint`)


def detect_format(chat_template: str | None) -> str:
    """The tool-call format a chat template speaks (the first in `FORMATS` whose markup it has);
    "generic" when it has none this module knows."""
    template = chat_template or ""
    return next((name for name, f in FORMATS.items() if f is not None and f.detect(template)), "generic")


def args_key(fmt: str) -> str:
    """The key of a call's arguments in its JSON envelope, per format."""
    f = FORMATS.get(fmt)
    return f.args_key if f is not None else "arguments"

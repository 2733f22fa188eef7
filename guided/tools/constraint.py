"""The tools constraint: the one Lark grammar (llguidance dialect) that constrains a reply to text
and/or tool calls in a family's format (`guided.tools.formats`), built over the tools as
`guided.tools.definitions` reads them (`make_tool`: every shape a tool may be given in).

The formats (hermes, llama3, mistral, mistral_names, phi4, pythonic, qwen3_coder, generic) are
detected from the chat template or chosen with `tool_format=`; docs/reference/tools.md has the table. The
"generic" format is for templates with no tool markup: the tools are described in a system message
and the whole reply is one JSON envelope, `{"tool_calls": [call, ...]}` or `{"response": "text"}`
(llama.cpp's generic handler does the same).

Every call is one llguidance capture: the call boundaries come from the grammar (`guided.tools.calls`),
never from searching the text, so markup inside a string argument cannot split a call. Where a
family's marker is one special token, the grammar uses the token (`token_ref`), which no text lexeme
can produce: under "none" the marker cannot appear at all.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from guided.errors import SchemaError
from guided.spec import engine_schema
from guided.tools.custom import CUSTOM, input_lark
from guided.tools.definitions import Tool, given_name, make_tool
from guided.tools.formats import FORMATS, PYTHON_TAG, args_key, detect_format, json_text_forms
from guided.tools.loop_guard import excluding
from guided.tools.syntax import APPEND, CALL_JSON_STYLE, Pieces, text_not_starting_with
from runtime.errors import InputError

# Lenient: keywords the engine cannot express are left out of the call JSON's grammar, for
# validate-and-rollback inside the calls (`guided.tools.check`); the session refuses first what
# neither enforces, and formats whose calls are not JSON envelopes (`guided.tools.check.call_plans`).
LENIENT_CALL_JSON = {**CALL_JSON_STYLE, "lenient": True}
MODES = ("auto", "required", "none")
ANSWER_JSON = "answer_json"  # the capture of the generic envelope's answer in a response format (JSON text)


def call_json_rules(tools: list[Tool], key: str) -> str:
    """The Lark rules of `call_json`, one call's JSON envelope `{"name": N, key: A}`, captured. With
    function tools only, one `%json` of `call_schema`; with custom tools, one alternative per tool
    whose head is a literal (llguidance picks one lexeme class at a shared first byte, so a `%json`
    beside literal alternatives could never start): a function's A a `%json` of its parameters, a
    custom tool's `{"input": S}` (`guided.tools.custom.input_lark`), captured as `CUSTOM`."""
    if all(t.kind != CUSTOM for t in tools):
        body = json.dumps(call_schema(tools, key), ensure_ascii=False)
        return f'call_json[capture="{APPEND}call_json"]: %json {body}\n'
    rules = ["call_json: " + " | ".join(f"cj{i}" for i in range(len(tools))) + "\n"]
    for i, t in enumerate(tools):
        head = json.dumps(f'{{"name": {json.dumps(t.name)}, "{key}": ')
        if t.kind == CUSTOM:
            assert t.format is not None  # a custom tool has its format
            rules.append(f'cj{i}[capture="{APPEND}{CUSTOM}"]: {head} "{{\\"input\\": " {input_lark(t.format)} "}}}}"\n')
        else:
            body = json.dumps({**engine_schema(t.parameters, strict=False), "x-guidance": LENIENT_CALL_JSON})
            rules.append(f'cj{i}[capture="{APPEND}call_json"]: {head} %json {body} "}}"\n')
    return "".join(rules)


def call_schema(tools: list[Tool], key: str = "arguments") -> dict:
    """JSON Schema of one call's JSON: `{"name": const, key: parameters}` for any of `tools`."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, key: engine_schema(t.parameters, strict=False)},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": LENIENT_CALL_JSON}


def token_ref(text: str, hf_tokenizer, ll_tokenizer) -> str:
    """The Lark spelling of a marker: `<[id]>` if it is one token the engine treats as special
    (llguidance counts every added token as special, whatever tokenizer.json says), else a string
    literal."""
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1 and ll_tokenizer.is_special_token(ids[0]):
        return f"<[{ids[0]}]>"
    return json.dumps(text)


def tool_grammar(
    fmt: str, tools: list[Tool], *, mode: str, parallel: bool, refs: dict[str, str], answer: dict | None = None
) -> tuple[str, list[tuple[str, int]]]:
    """The Lark grammar of a reply under `fmt` and `mode` ("auto", "required", "none"), and the
    text triggers of its calls at the output's start ((text, offset where the call begins); free
    text may not start with them).

    tools: the functions a call may use (one for a named tool_choice). parallel: allow several calls.
    refs: the Lark spelling of each marker text the format uses (`token_ref`). answer: the JSON
    Schema (llguidance's, with its `x-guidance` options) of the text answer, a response format beside
    the tools: under auto the reply is its JSON or calls (a JSON call is told from the answer by its
    head, `{"name": "<tool>"`, which the triggers then end with), under none its JSON; None: free
    text. Raises ValueError for an unknown format or mode, or a marker the format needs as a special
    token the tokenizer lacks.
    """
    if fmt not in FORMATS:
        raise InputError(f"tool_format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if mode not in MODES:
        raise InputError(f"tool mode must be one of {', '.join(MODES)}, got {mode!r}")
    # TAIL: bounded whitespace after the last call, before the end (Qwen writes a newline after
    # `</tool_call>`; without TAIL the newline could only start another call). It overlaps NL, the
    # separator before the next call: llguidance's lexer keeps both, the parser takes the one that goes on.
    head = "%llguidance {}\nNL: /\\n\\n?/\nTAIL: /[ \\t]{0,4}\\n\\n?|[ \\t]{1,4}/\n"
    capture = call_json_rules(tools, args_key(fmt))
    f = FORMATS[fmt]
    answer_json = None if answer is None else f"answer_json: %json {json.dumps(answer, ensure_ascii=False)}\n"
    if answer_json and mode == "none":
        return head + "start: answer_json\n" + answer_json, []
    if f is None:  # generic: the whole reply is one JSON envelope
        if mode == "none":
            return head + "start: TEXT?\nTEXT: /(.|\\n)+/\n", []
        more = ' (", " call_json)*' if parallel else ""
        rules = f'calls: "{{\\"tool_calls\\": [" call_json{more} "]}}"\n'
        if answer_json:  # the answer's JSON text is the content (`guided.tools.calls.ANSWER_JSON`)
            rules += f'answer: "{{\\"response\\": " response "}}"\nresponse[capture="{ANSWER_JSON}"]: answer_json\n'
            rules += answer_json
        else:
            rules += 'answer: "{\\"response\\": " response "}"\nresponse[capture]: %json {"type": "string"}\n'
        return head + f"start: calls TAIL?{' | answer' if mode == 'auto' else ''}\n" + rules + capture, []
    pieces = Pieces(tools, parallel, refs)
    triggers = f.triggers(pieces)
    if mode == "none":
        # Free text; a special-token marker cannot come out of a text lexeme, and its text spelled
        # with ordinary tokens is left out too (`&` and `~` are llguidance's lexeme and / not). A
        # format without an opener (pythonic) bans the text its calls start with instead.
        if f.opener is None:
            return head + f"start: TEXT?\nTEXT: /{text_not_starting_with([t for t, _ in triggers])}/\n", []
        banned = f' & ~(/(.|\\n)*/ "{json.dumps(f.opener)[1:-1]}" /(.|\\n)*/)'
        return head + f"start: TEXT?\nTEXT: /(.|\\n)+/{banned}\n", []
    for marker in f.special:
        if not refs[marker].startswith("<["):
            raise InputError(f"{marker} is not a special token of this tokenizer: use tool_format='generic'", "tools")
    rules = f.rules(pieces)
    if mode == "required":
        # Calls only, in the format's markup or in the JSON forms small models write out of habit
        # (under auto the 0.5B model lists parallel calls in a fence; forced into its markup it
        # writes one call and ends: docs/reports/bfcl.md).
        options = ["calls TAIL?"]
        if f.json_text:
            forms, form_rules, _ = json_text_forms(pieces, f.bare)
            options, rules = options + [f"{o} TAIL?" for o in forms], rules + form_rules
        return head + f"start: {' | '.join(options)}\n" + rules + capture, []
    # auto: text (or the answer's JSON), or calls. At the output's start the format's own calls, or
    # the JSON calls small models write (`json_text_forms`); text may not start as those do. A
    # special-token opener after text starts the calls.
    options = ["answer_json" if answer_json else "TEXT", "calls TAIL?"]
    if f.json_text:
        forms, form_rules, form_triggers = json_text_forms(pieces, f.bare)
        options, rules, triggers = options + [f"{o} TAIL?" for o in forms], rules + form_rules, triggers + form_triggers
    if answer_json:
        # A JSON call is told from the answer by its head, `{"name": "<tool>"` as the call grammar writes it.
        heads = [f'"name": {json.dumps(t.name)}' for t in tools]
        triggers = [(t + h, at) for t, at in triggers for h in (heads if t.endswith("{") else [""])]
        return head + f"start: {' | '.join(options)}\n" + answer_json + rules + capture, triggers
    if f.opener in refs and refs[f.opener].startswith("<["):
        options.append(f"TEXT {f.after_text} TAIL?")
    text = text_not_starting_with([t for t, _ in triggers]) if triggers else "(.|\\n)*"
    return head + f"start: {' | '.join(options)}\nTEXT: /{text}/\n" + rules + capture, triggers


def generic_system_prompt(tools: list[Tool], mode: str, answer_format: bool = False) -> str:
    """The system message that describes the tools and the JSON envelope (format "generic");
    answer_format: the answer is JSON in a response format, not text."""
    described = json.dumps([t.template["function"] for t in tools], ensure_ascii=False, indent=2)
    answer = ""
    if mode == "auto":
        answer = (
            ' or {"response": <your answer as JSON>} to answer'
            if answer_format
            else ' or {"response": "<your answer>"} to answer in text'
        )
    return (
        f"You can call these functions:\n{described}\n\n"
        'Respond with one JSON object: {"tool_calls": [{"name": "<function name>", "arguments": {<its arguments>}}]} '
        f"to call functions{answer}."
    )


@dataclass
class ToolConstraint:
    """A tools constraint built for one tokenizer: the grammar and what decoding and the reply
    need. mode: "auto", "required" or "none" (a named function is "required" over one tool,
    `parallel` False). markers: special-token ids that open calls after text; marker_ids: the ids
    of all the format's markers that are special tokens; triggers: the texts that start a call at
    the output's start under auto, with the offset where the call itself begins; answer_format:
    the text answer is JSON in a response format (`tool_grammar`'s `answer`); end_at_repeat: the
    reply ends at its first call identical to an earlier one of it (`guided.tools.calls.first_repeat`)."""

    tools: list[Tool]
    fmt: str
    mode: str
    parallel: bool
    grammar: str
    markers: frozenset[int]
    marker_ids: frozenset[int] = frozenset()
    triggers: tuple[tuple[str, int], ...] = ()
    answer_format: bool = False
    end_at_repeat: bool = False

    @property
    def template_tools(self) -> list[dict] | None:
        """The tools for the chat template (None under "none" and for the generic format, whose
        template has no tool markup: `system_prompt` describes them instead)."""
        return None if self.mode == "none" or self.fmt == "generic" else [t.template for t in self.tools]

    @property
    def system_prompt(self) -> str | None:
        if self.fmt != "generic" or self.mode == "none":
            return None
        return generic_system_prompt(self.tools, self.mode, self.answer_format)

    def prompt(self, messages):
        """`messages` as the format's template needs them: the generic format's system message (the
        tools and the JSON envelope) added; for phi4, the tools as JSON in the system message's
        `tools` field, where Phi-4-mini's template reads them. Other prompts are returned unchanged."""
        if self.mode == "none" or not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
            return messages
        system = messages[0] if messages[0].get("role") == "system" else None
        rest = messages[1:] if system else messages
        if self.fmt == "phi4":
            tools = json.dumps([t.template["function"] for t in self.tools], ensure_ascii=False)
            return [{"role": "system", "content": "", **(system or {}), "tools": tools}, *rest]
        if self.system_prompt is None:
            return messages
        content = f"{(system or {}).get('content') or ''}\n\n{self.system_prompt}".strip()
        return [{**(system or {"role": "system"}), "content": content}, *rest]


def tool_constraint(
    tools,
    tool_choice,
    parallel: bool,
    tool_format: str | None,
    hf_tokenizer,
    ll_tokenizer,
    answer: dict | None = None,
    excluded_calls: dict[str, list[dict]] | None = None,
    end_at_repeat: bool = False,
) -> ToolConstraint:
    """The `ToolConstraint` of `ConstrainedSession(tools=..., tool_choice=..., ...)`. tool_choice:
    "auto" (None), "required", "none" or {"type": "function", "function": {"name": ...}} (also the
    flat {"type": "function", "name": ...}; for a custom tool {"type": "custom", "custom": {"name":
    ...}} or {"type": "custom", "name": ...}). Custom tools need a format whose calls are JSON
    envelopes or have a raw slot (`guided.tools.custom`; InputError otherwise). tool_format: None to
    detect it from the chat template.
    answer: the engine's JSON Schema of a response format for the text answer (see `tool_grammar`).
    excluded_calls: tool name -> argument objects the grammar must not produce again (the loop
    guard, `guided.tools.loop_guard`); the prompt still shows each tool as given. A tool left with no
    call drops out of the grammar, unless that would leave none (then nothing is excluded).
    end_at_repeat: the reply ends at its first call repeating an earlier one (`ToolConstraint`).
    Raises ValueError (no tools, duplicate names, an unknown function in tool_choice, a format the
    tokenizer cannot express) or SchemaError (bad parameters; `.tool`, `.tool_index`, `.pointer`)."""
    if not tools:
        raise InputError("tools must be a non-empty list", "tools")
    parsed = []
    for i, tool in enumerate(tools):
        try:
            parsed.append(make_tool(tool))
        except SchemaError as exc:
            raise exc.about_tool(given_name(tool), i) from None
    names = [t.name for t in parsed]
    if len(set(names)) != len(names):
        raise InputError("tool function names must be unique", "tools")
    template = getattr(hf_tokenizer, "chat_template", None) or ""
    fmt = tool_format or detect_format(template)
    f = FORMATS.get(fmt)
    custom = [t.name for t in parsed if t.kind == CUSTOM]
    if custom and f is not None and not (f.json_calls or f.raw_slot):
        raise InputError(
            f"custom tool {custom[0]!r}: the {fmt} call format has no JSON envelope nor raw slot to carry a custom "
            "input (custom tools run in the hermes, llama3, mistral, phi4, qwen3_coder and generic formats: use "
            "tool_format='generic')",
            "tools",
        )
    choice = tool_choice or "auto"
    allowed, mode = parsed, choice
    if isinstance(choice, dict):
        kind = choice.get("type", "function")
        name = (choice.get(kind) or choice).get("name")
        if name not in names or next(t.kind for t in parsed if t.name == name) != kind:
            raise InputError(f"tool_choice names the {kind} tool {name!r}, which is not in tools", "tool_choice")
        allowed, mode, parallel = [t for t in parsed if t.name == name], "required", False
    elif choice in names and choice not in MODES:  # a bare function name: the named choice
        allowed, mode, parallel = [t for t in parsed if t.name == choice], "required", False
    elif choice not in MODES:
        raise InputError(
            f"tool_choice must be one of {', '.join(MODES)} or a named function, got {choice!r}", "tool_choice"
        )
    # llama3's <|python_tag|> only where the template uses it (Llama 3.1 does, 3.2 does not).
    texts = [m for m in (f.markers if f else ()) if m != PYTHON_TAG or m in template]
    refs = {m: token_ref(m, hf_tokenizer, ll_tokenizer) for m in texts}
    allowed = guarded(allowed, excluded_calls or {})
    grammar, triggers = tool_grammar(fmt, allowed, mode=mode, parallel=parallel, refs=refs, answer=answer)
    ids = {m: int(r[2:-2]) for m, r in refs.items() if r.startswith("<[")}
    markers = frozenset({ids[f.opener]} if f and f.opener in ids else ())
    answer_format = answer is not None and mode != "required"
    return ToolConstraint(
        parsed,
        fmt,
        mode,
        parallel,
        grammar,
        markers,
        frozenset(ids.values()),
        tuple(triggers),
        answer_format,
        end_at_repeat and parallel,
    )


def guarded(tools: list[Tool], excluded: dict[str, list[dict]]) -> list[Tool]:
    """`tools` with each function's parameters narrowed to exclude its `excluded` inputs
    (`loop_guard.excluding`); a function with no call left is dropped, unless none would be left."""
    if not excluded:
        return tools
    out = []
    for tool in tools:
        inputs = excluded.get(tool.name) if tool.kind != CUSTOM else None
        narrowed = excluding(tool.parameters, inputs) if inputs else tool.parameters
        if narrowed is not None:
            out.append(dataclasses.replace(tool, parameters=narrowed))
    return out or tools

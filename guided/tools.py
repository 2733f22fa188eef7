"""The tools constraint: tool definitions, the call formats of model families, and the one Lark
grammar (llguidance dialect) that constrains a reply to text and/or tool calls.

A tool is given in OpenAI's chat shape `{"type": "function", "function": {"name", "description",
"parameters", "strict"}}`, the flat Responses shape `{"type": "function", "name", "parameters", ...}`,
as a pydantic model class (its JSON Schema; the name is the class name) or as a plain Python
function with type hints (pydantic's `TypeAdapter` of the signature; the description is the
docstring). `Tool.template` is the OpenAI chat shape chat templates render.

Formats (see docs/tools.md for the table):

- "hermes": `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks, one per call,
  separated by "\\n" (Qwen2.5, Qwen3, Hermes). Detected by `<tool_call>` in the chat template.
- "llama3": a bare `{"name": ..., "parameters": {...}}`, calls separated by "; ", after
  `<|python_tag|>` where the template uses it (Llama 3.1-3.3). Detected by `<|start_header_id|>`
  with `"parameters"` or `ipython` in the template.
- "generic": for templates with no tool markup: the tools are described in a system message and
  the whole reply is one JSON envelope, `{"tool_calls": [call, ...]}` or `{"response": "text"}`
  (llama.cpp's generic handler does the same).

Every call's JSON is an llguidance capture (`call_json[capture]`): the call boundaries come from
the grammar (`guided.toolcalls`), never from searching the text, so markup inside a string argument
cannot split a call. Where a family's marker is one special token, the grammar uses the token
(`token_ref`), which no text lexeme can produce: under "none" the marker cannot appear at all.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass

from guided.errors import SchemaError
from guided.spec import check_metaschema, close_objects, engine_schema

# The templates render calls with json.dumps' default separators; the constraint matches them. Lenient:
# keywords the engine cannot express are left to validate-and-rollback inside the calls
# (`guided.callcheck`); the session refuses first what neither enforces.
CALL_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}
FORMATS = ("hermes", "llama3", "generic")
MODES = ("auto", "required", "none")
FENCE = "```json\n"  # what small models write before a call under auto (the BFCL finding)
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class Tool:
    """One function a call may use. parameters: its JSON Schema as enforced (an object schema,
    closed unless `strict` is False); shown: the parameters as the caller gave them, which the
    prompt shows (None: none given); template: the OpenAI chat shape given to the chat template."""

    name: str
    parameters: dict
    description: str | None = None
    strict: bool | None = None
    shown: dict | None = None

    @property
    def template(self) -> dict:
        function = {"name": self.name}
        if self.description:
            function["description"] = self.description
        if self.shown is not None:
            function["parameters"] = self.shown
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


def parameters_schema(schema, strict: bool | None = None) -> dict:
    """A function's parameter schema (None: no parameters), closed (`additionalProperties: false`
    on objects that declare properties) unless `strict` is False. Raises SchemaError for a schema
    that is not valid against its metaschema or is not an object schema (arguments are a JSON
    object: clients call fn(**arguments); OpenAI refuses other schemas too)."""
    schema = schema if schema is not None else {"type": "object", "properties": {}}
    check_metaschema(schema)
    if not isinstance(schema, dict) or schema.get("type", "object") not in ("object", ["object"]):
        got = schema.get("type") if isinstance(schema, dict) else schema
        raise SchemaError(f'tool parameters must be a JSON Schema of "type": "object", got {json.dumps(got)}')
    schema = {**schema, "type": "object"}  # without "type", any JSON value would match
    return schema if strict is False else close_objects(schema)


def make_tool(tool) -> Tool:
    """A `Tool` from any accepted shape (see the module docstring). Raises SchemaError (bad
    parameters) or ValueError (an unknown shape, a missing name)."""
    if isinstance(tool, Tool):
        return tool
    if isinstance(tool, type) and hasattr(tool, "model_json_schema"):
        schema = tool.model_json_schema()
        description = schema.get("description") or inspect.getdoc(tool)
        return Tool(tool.__name__, parameters_schema(schema), description, shown=schema)
    if callable(tool) and not isinstance(tool, dict):
        from pydantic import TypeAdapter

        schema = TypeAdapter(tool).json_schema()
        return Tool(tool.__name__, parameters_schema(schema), inspect.getdoc(tool), shown=schema)
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise ValueError(f"a tool is a function definition (dict), a pydantic model class or a function, got {tool!r}")
    function = tool.get("function", tool)  # the chat shape nests it; the Responses shape is flat
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a tool function needs a name")
    strict, shown = function.get("strict"), function.get("parameters")
    return Tool(name, parameters_schema(shown, strict), function.get("description"), strict, shown)


def detect_format(chat_template: str | None) -> str:
    """The tool-call format a chat template speaks (see the module docstring); "generic" when it
    has no tool markup this module knows."""
    template = chat_template or ""
    if HERMES_OPEN in template:
        return "hermes"
    if "<|start_header_id|>" in template and ('"parameters"' in template or "ipython" in template):
        return "llama3"
    return "generic"


def args_key(fmt: str) -> str:
    """The key of a call's arguments in its JSON, per format."""
    return "parameters" if fmt == "llama3" else "arguments"


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
    return {**schema, "x-guidance": CALL_JSON_STYLE}


def token_ref(text: str, hf_tokenizer, ll_tokenizer) -> str:
    """The Lark spelling of a marker: `<[id]>` if it is one token the engine treats as special
    (llguidance counts every added token as special, whatever tokenizer.json says), else a string
    literal."""
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1 and ll_tokenizer.is_special_token(ids[0]):
        return f"<[{ids[0]}]>"
    return json.dumps(text)


def _regex_escape(text: str) -> str:
    return "".join(c if c.isalnum() or c == " " else "\\n" if c == "\n" else "\\" + c for c in text)


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


def auto_triggers(fmt: str) -> list[str]:
    """The texts that begin a call at the start of the output under auto (besides the format's
    special-token markers): a bare JSON object, and a fenced one (what small models write). Text
    starting otherwise is text. Each trigger ends at the byte where the call JSON begins, so the
    free-text lexeme dies exactly where the fence's literal ends (llguidance's lexer is greedy and
    does not backtrack further)."""
    return ["{", FENCE + "{"]


def tool_grammar(fmt: str, tools: list[Tool], *, mode: str, parallel: bool, refs: dict[str, str]) -> str:
    """The Lark grammar of a reply under `fmt` and `mode` ("auto", "required", "none").

    tools: the functions a call may use (one for a named tool_choice). parallel: allow several calls.
    refs: the Lark spelling of each marker text the format uses (`token_ref`).
    Raises ValueError for an unknown format or mode.
    """
    if fmt not in FORMATS:
        raise ValueError(f"tool_format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if mode not in MODES:
        raise ValueError(f"tool mode must be one of {', '.join(MODES)}, got {mode!r}")
    head = "%llguidance {}\n"
    body = json.dumps(call_schema(tools, args_key(fmt)), ensure_ascii=False)
    capture = f"call_json[capture]: %json {body}\n"
    if mode == "none":
        # Free text; a special-token marker cannot come out of a text lexeme, and its text spelled
        # with ordinary tokens is left out too (`&` and `~` are llguidance's lexeme and / not).
        markers = {"hermes": [HERMES_OPEN], "llama3": [PYTHON_TAG]}.get(fmt, [])
        banned = "".join(f' & ~(/(.|\\n)*/ "{_lark_escape(m)}" /(.|\\n)*/)' for m in markers)
        return head + f"start: TEXT?\nTEXT: /(.|\\n)+/{banned}\n"
    if fmt == "generic":
        more = ' (", " call_json)*' if parallel else ""
        rules = f'calls: "{{\\"tool_calls\\": [" call_json{more} "]}}"\n'
        rules += 'answer: "{\\"response\\": " response "}"\nresponse[capture]: %json {"type": "string"}\n'
        return head + f"start: calls{' | answer' if mode == 'auto' else ''}\n" + rules + capture
    if fmt == "hermes":
        open_ref, close_ref = refs[HERMES_OPEN], refs[HERMES_CLOSE]
        block = f'{open_ref} "\\n" call_json "\\n" {close_ref}'
        rules = 'calls: block ("\\n" block)*\n' if parallel else "calls: block\n"
        rules += f"block: {block}\n"
        if not open_ref.startswith("<["):
            raise ValueError(f"{HERMES_OPEN} is not a special token of this tokenizer: use tool_format='generic'")
        marked = True
    else:  # llama3
        tag = refs.get(PYTHON_TAG)
        more = ' ("; " call_json)*' if parallel else ""
        rules = f"calls: {tag + '? ' if tag else ''}call_json{more}\n"
        marked = bool(tag and tag.startswith("<["))
    if mode == "required":
        return head + "start: calls\n" + rules + capture
    # auto: text, or calls. At the output's start a bare or fenced call JSON is a call (`auto_triggers`);
    # text may not start so. A special-token marker after text starts the calls.
    text = text_not_starting_with(auto_triggers(fmt))
    options = ["TEXT", "calls", f'"{_lark_escape(FENCE)}" call_json "\\n```"']
    if fmt == "hermes":
        options.append("call_json")  # the bare call JSON small models write instead of a block
    if marked:
        options.append("TEXT calls")
    return head + f"start: {' | '.join(options)}\nTEXT: /{text}/\n" + rules + capture


def _lark_escape(text: str) -> str:
    return json.dumps(text)[1:-1]


def generic_system_prompt(tools: list[Tool], mode: str) -> str:
    """The system message that describes the tools and the JSON envelope (format "generic")."""
    described = json.dumps([t.template["function"] for t in tools], ensure_ascii=False, indent=2)
    answer = ' or {"response": "<your answer>"} to answer in text' if mode == "auto" else ""
    return (
        f"You can call these functions:\n{described}\n\n"
        'Respond with one JSON object: {"tool_calls": [{"name": "<function name>", "arguments": {<its arguments>}}]} '
        f"to call functions{answer}."
    )


@dataclass
class ToolConstraint:
    """A tools constraint built for one tokenizer: the grammar and what decoding and the reply
    need. mode: "auto", "required" or "none" (a named function is "required" over one tool,
    `parallel` False). markers: special-token ids that open calls after text."""

    tools: list[Tool]
    fmt: str
    mode: str
    parallel: bool
    grammar: str
    markers: frozenset[int]

    @property
    def template_tools(self) -> list[dict] | None:
        """The tools for the chat template (None under "none" and for the generic format, whose
        template has no tool markup: `system_prompt` describes them instead)."""
        return None if self.mode == "none" or self.fmt == "generic" else [t.template for t in self.tools]

    @property
    def system_prompt(self) -> str | None:
        return generic_system_prompt(self.tools, self.mode) if self.fmt == "generic" and self.mode != "none" else None


def tool_constraint(
    tools, tool_choice, parallel: bool, tool_format: str | None, hf_tokenizer, ll_tokenizer
) -> ToolConstraint:
    """The `ToolConstraint` of `ConstrainedSession(tools=..., tool_choice=..., ...)`. tool_choice:
    "auto" (None), "required", "none" or {"type": "function", "function": {"name": ...}} (also the
    flat {"type": "function", "name": ...}). tool_format: None to detect it from the chat template.
    Raises ValueError (no tools, duplicate names, an unknown function in tool_choice, a format the
    tokenizer cannot express) or SchemaError (bad parameters)."""
    if not tools:
        raise ValueError("tools must be a non-empty list")
    parsed = [make_tool(t) for t in tools]
    names = [t.name for t in parsed]
    if len(set(names)) != len(names):
        raise ValueError("tool function names must be unique")
    fmt = tool_format or detect_format(getattr(hf_tokenizer, "chat_template", None))
    choice = tool_choice or "auto"
    allowed, mode = parsed, choice
    if isinstance(choice, dict):
        name = (choice.get("function") or choice).get("name")
        if name not in names:
            raise ValueError(f"tool_choice names the function {name!r}, which is not in tools")
        allowed, mode, parallel = [t for t in parsed if t.name == name], "required", False
    elif choice not in MODES:
        raise ValueError(f"tool_choice must be one of {', '.join(MODES)} or a named function, got {choice!r}")
    refs = {t: token_ref(t, hf_tokenizer, ll_tokenizer) for t in (HERMES_OPEN, HERMES_CLOSE, PYTHON_TAG)}
    if fmt == "llama3" and PYTHON_TAG not in (getattr(hf_tokenizer, "chat_template", None) or ""):
        del refs[PYTHON_TAG]
    grammar = tool_grammar(fmt, allowed, mode=mode, parallel=parallel, refs=refs)
    marker_texts = {"hermes": [HERMES_OPEN], "llama3": [PYTHON_TAG] if PYTHON_TAG in refs else []}.get(fmt, [])
    markers = frozenset(int(refs[m][2:-2]) for m in marker_texts if refs[m].startswith("<["))
    return ToolConstraint(parsed, fmt, mode, parallel, grammar, markers)

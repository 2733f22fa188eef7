"""Tool calls in the Hermes / Qwen2.5 format: the grammar that constrains them and the parser that
turns generated text back into OpenAI `tool_calls`.

Qwen2.5's chat template (and Hermes-style templates) ask the model to answer a tool call with

    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

one block per call, blocks separated by a newline. `<tool_call>` is one added token in Qwen's
vocabulary; the grammar engine treats it as a special token (see `token_ref`), while the
detokenizer renders it as text, which the parser reads back.

Grammars (llguidance Lark, compiled by `guided`):

- `required` / a named function: the whole output is one call block (or several when
  `parallel_tool_calls`), whose JSON is `anyOf` over the allowed functions (`name` const,
  `arguments` = the function's parameter schema), in the separators the template itself renders
  (", " and ": "), so constrained output looks like the calls the model saw in training.
- `auto`: free text until the model starts a call block, from where the call is constrained exactly
  like above. An output that starts with `{` must be one bare call JSON (no tags), which small
  models often write instead of a block. When `<tool_call>` is a special token it ends the text
  lexeme by itself; when it is text, a *lazy* lexeme `TEXT "<tool_call>"` ends at its first
  occurrence. This is the pattern of llguidance's own `StructTag.to_grammar` (llguidance
  `_struct_tag.py`; docs/syntax.md "Tool calling"), written out here because `StructTag` cannot say "at most one call"
  (`parallel_tool_calls: false`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from guided.errors import SchemaError
from guided.spec import check_metaschema, close_objects
from guided.validation import check_json
from runtime.stops import partial_suffix

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# The template renders calls with json.dumps' default separators; the constraint matches them.
CALL_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def template_supports_tools(chat_template: str | None) -> bool:
    """True if the model's chat template uses the `<tool_call>` format this module speaks."""
    return bool(chat_template) and OPEN in chat_template


def parameters_schema(function) -> dict:
    """A function's parameter schema, closed (`additionalProperties: false` on objects that declare
    properties) unless the function says `strict: false`. Raises SchemaError (with pointer) for a
    schema that is not valid against its metaschema."""
    schema = function.parameters if function.parameters is not None else {"type": "object", "properties": {}}
    check_metaschema(schema)
    if not isinstance(schema, dict) or schema.get("type", "object") not in ("object", ["object"]):
        # Arguments are a JSON object (clients call fn(**arguments)); OpenAI refuses other schemas too.
        got = schema.get("type") if isinstance(schema, dict) else schema
        raise SchemaError(f'tool parameters must be a JSON Schema of "type": "object", got {json.dumps(got)}')
    schema = {"type": "object", **schema}  # without "type", any JSON value would match
    return schema if function.strict is False else close_objects(schema)


def call_schema(functions: dict[str, object]) -> dict:
    """JSON Schema of one call's JSON: `{"name": const, "arguments": parameters}` for any of
    `functions` (name -> parameter schema)."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": schema},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, schema in functions.items()
    ]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": CALL_JSON_STYLE}


def tool_grammar(functions: dict[str, object], *, mode: str, parallel: bool, open_ref: str, close_ref: str) -> str:
    """Lark grammar (llguidance dialect) for tool calls.

    functions: name -> parameter schema of the functions a call may use (one for a named tool_choice).
    mode: "required" (the output is call blocks only) or "auto" (text, or calls once `<tool_call>` starts).
    parallel: allow several call blocks.
    open_ref, close_ref: how the grammar spells `<tool_call>` / `</tool_call>`: a special-token
        reference such as `<[151657]>` when the engine sees the tag as one special token (text
        lexemes can never produce those bytes), else a quoted string literal (see `token_ref`).
    """
    body = json.dumps(call_schema(functions), ensure_ascii=False)
    if mode == "required":
        calls = 'call ("\\n" call)*' if parallel else "call"
        return f'%llguidance {{}}\nstart: {calls}\ncall: {open_ref} "\\n" %json {body} "\\n" {close_ref}\n'
    if mode != "auto":
        raise ValueError(f"mode must be 'required' or 'auto', got {mode!r}")
    # Text may not start with "{": an output that does must be one bare call JSON (small models often
    # drop the tags; this is the pattern of llguidance's docs/syntax.md "Inline JSON Schemas").
    # A special-token tag ends the text lexeme by itself; a text tag needs the lazy lexeme.
    lazy = "" if open_ref.startswith("<") else "[lazy]"
    return (
        "%llguidance {}\n"
        f"start: PLAIN | {'call+' if parallel else 'call'} | %json {body}\n"
        "PLAIN: /([^{](.|\\n)*)?/\n"
        f"call_open{lazy}: PLAIN {open_ref}\n"
        f'call: call_open "\\n" %json {body} "\\n" {close_ref}\n'
    )


def token_ref(text: str, hf_tokenizer, ll_tokenizer) -> str:
    """The Lark spelling of a tag: `<[id]>` if it is one token the engine treats as special
    (llguidance counts every added token as special, whatever tokenizer.json says), else a string
    literal."""
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1 and ll_tokenizer.is_special_token(ids[0]):
        return f"<[{ids[0]}]>"
    return json.dumps(text)


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text
    index: int = 0  # its place among the reply's calls (the SSE `tool_calls[].index`)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _parse_call(body: str) -> ParsedCall | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or "arguments" not in data:
        return None
    args = data["arguments"]
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return ParsedCall(new_call_id(), data["name"], json.dumps(args, ensure_ascii=False))


class ToolCallParser:
    """Splits streamed text into content and tool calls.

    `feed(text)` and `finish()` return a list of items, each a `str` (content to emit) or a
    `ParsedCall`. Text that may be the start of `<tool_call>` is held back until it is not;
    whitespace around call blocks is dropped; a closed block whose JSON does not parse stays content;
    a block left open at the end (cut by max_tokens) is dropped unless its JSON is complete, so raw
    markup never reaches content. An
    output whose first non-blank character is `{` is held to the end and is one bare call if it
    parses as one (see `tool_grammar`); else it was cut (the grammar allows nothing else) and is
    dropped likewise.
    """

    def __init__(self):
        self._buf = ""
        self._bare: bool | None = None  # None until the first non-blank character is seen
        self._in_call = False
        self._held_space = ""  # trailing whitespace, emitted only if more content follows
        self._after_call = False
        self.calls: list[ParsedCall] = []

    def feed(self, text: str) -> list:
        self._buf += text
        if self._bare is None and self._buf.strip():
            self._bare = self._buf.lstrip().startswith("{")
        if self._bare is not False:
            return []
        out: list = []
        while True:
            if self._in_call:
                end = self._buf.find(CLOSE)
                if end < 0:
                    return out
                body, self._buf = self._buf[:end], self._buf[end + len(CLOSE) :]
                self._in_call = False
                out += self._call(body, closed=True)
                continue
            start = self._buf.find(OPEN)
            if start >= 0:
                text, self._buf = self._buf[:start], self._buf[start + len(OPEN) :]
                out += self._content(text)
                self._held_space = ""  # whitespace right before a call is not content
                self._in_call = True
                continue
            keep = partial_suffix(self._buf, (OPEN,))
            text, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
            return out + self._content(text)

    def finish(self) -> list:
        """Flush at the end of generation. An unterminated block is a call if its JSON is complete."""
        if self._bare and (call := _parse_call(self._buf.strip())) is not None:
            self._buf = ""
            call.index = len(self.calls)
            self.calls.append(call)
            return [call]
        if self._bare:  # a bare call the grammar left unfinished (cut by max_tokens): dropped, as a cut block
            self._buf, self._bare = "", False
            return []
        if self._bare is None:  # blank: plain content
            self._bare = False
            out = self.feed("")
            return out + self.finish()
        if self._in_call:
            body, self._buf, self._in_call = self._buf, "", False
            out = self._call(body, closed=False) if _parse_call(body.strip()) is not None else []
        else:
            out = self._content(self._buf)
            self._buf = ""
        if not self.calls and self._held_space:
            out.append(self._held_space)
        self._held_space = ""
        return out

    def _call(self, body: str, closed: bool) -> list:
        call = _parse_call(body.strip())
        if call is None:
            return self._content(OPEN + body + (CLOSE if closed else ""))
        call.index = len(self.calls)
        self.calls.append(call)
        self._after_call = True
        return [call]

    def _content(self, text: str) -> list:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return []
            self._after_call = False
        text = self._held_space + text
        stripped = text.rstrip()
        self._held_space = text[len(stripped) :]
        return [stripped] if stripped else []


def call_errors(text: str, functions: dict[str, object]) -> list[str]:
    """Why the tool calls in `text` do not fit `functions` (name -> parameter schema): an unknown
    name, or arguments that do not validate; [] when every call fits. The final check of a tool
    grammar's output (`ConstrainedSession(check=...)`)."""
    parser = ToolCallParser()
    parser.feed(text)
    parser.finish()
    errors = []
    for call in parser.calls:
        if call.name not in functions:
            errors.append(f"unknown function {call.name!r}")
        else:
            errors += [f"{call.name}: {e}" for e in check_json(call.arguments, functions[call.name])[1]]
    return errors

"""Turn a request's `response_format`, `structured_outputs` and `tools` into the one guided object,
a `guided.ConstrainedSession`, which compiles the grammar, drives decoding and gives the verdict.

Sessions are built on the request's thread (compiling is llguidance only, no MLX), so a bad schema is
a 400 before the request queues; it never falls back to free text. Only one constraint applies per
request: a JSON response format beside tools is the format of the text answer (`Constraints.build`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from coreai.errors import GrammarError, SchemaError
from coreai.server.errors import bad_request, from_library_error
from coreai.server.request import GenerationRequest
from coreai.server.schemas import JsonObjectFormat, JsonSchemaFormat, SamplingFields
from guided import ConstrainedSession, GrammarCache, TokenizerInfo
from guided.enforcement import GRAMMAR, ROLLBACK
from guided.schema.pointer import parse_pointer, pointer
from runtime import Model

if TYPE_CHECKING:
    from coreai.server.responses_schemas import ResponseCreateRequest


@dataclass
class Constraint:
    """A request's guided session, and `tool_mode`: None (no tools), "auto", "required" (a named
    function is "required" over one function) or "none", which tells the reply to map tool calls."""

    session: ConstrainedSession
    tool_mode: str | None = None


class Constraints:
    """Builds `Constraint`s for one model. `tokenizer` is the grammar engine's view of the model's
    tokenizer, or None when the engine cannot use it (then every constrained request is a 400).
    `cache`: the compiled grammars of this server (its own, not the process-wide default).
    `whitespace`: the JSON layout of `response_format` / `structured_outputs.json` answers
    (`guided.spec.WHITESPACES`; None: the session's default); tool calls keep their format's own."""

    def __init__(self, model: Model, tokenizer: TokenizerInfo | None, cache: GrammarCache, whitespace=None):
        self.model = model
        self.tokenizer = tokenizer
        self.cache = cache
        self.whitespace = whitespace

    def _session(self, param: str, tool_parameters: str = "", **options) -> ConstrainedSession:
        """The session of `options`; a 400 naming `param` when it cannot be built (or, when the
        session names the tool at fault, `tool_parameters` formatted with that tool's index)."""
        if self.tokenizer is None:
            raise bad_request("guided generation is not available for this model's tokenizer", param)
        if self.whitespace is not None and {"schema", "json_object"} & options.keys():  # a JSON answer: the
            options.setdefault("whitespace", self.whitespace)  # request's layout if it gave one, else the server's
        try:
            return ConstrainedSession(self.model, cache=self.cache, **options)
        except (SchemaError, GrammarError) as exc:
            tool_index = getattr(exc, "tool_index", None)
            if tool_index is not None and tool_parameters:  # guided names the tool at fault
                param = tool_parameters.format(tool_index)
            raise from_library_error(exc, param) from None

    def structured(self, found: tuple[str, dict] | None) -> Constraint | None:
        """The constraint of `structured_options`' answer, or None for free text."""
        return None if found is None else Constraint(self._session(found[0], **found[1]))

    def build(self, req: GenerationRequest) -> Constraint | None:
        """The constraint of a chat generation, or None for free text. Tools go through
        `ConstrainedSession(tools=...)`: the format comes from the chat template (a template with no
        tool markup gets the generic JSON envelope); `tool_choice: "none"` bans the call marker.
        A JSON answer format beside tools (OpenAI accepts both) is the text answer's format under
        "auto", alone under "none", and not used under "required" or a named function (calls only).
        Errors are 400s (`APIError`) naming the front end's parameters (`req.names`)."""
        found, names = req.answer, req.names
        if not req.tools or (req.tool_choice == "none" and found is not None):
            return self.structured(found)
        param, answer = found or ("", {})
        if answer and not ({"schema", "json_object"} & set(answer)):
            raise bad_request(
                f"{param} beside tools: the answer's format must be a JSON Schema or json_object "
                '(or pass tool_choice: "none")',
                param.split(".")[0],
            )
        functions = [t["function"]["name"] for t in req.tools]
        if len(set(functions)) != len(functions):
            raise bad_request("tool function names must be unique", names.tools)
        choice = req.tool_choice or "auto"
        if isinstance(choice, dict) and choice["function"]["name"] not in functions:
            raise bad_request(
                f"tool_choice names the function {choice['function']['name']!r}, which is not in tools",
                names.tool_choice,
            )
        try:
            session = self._session(  # the answer's own schema errors name its field
                param if answer else names.tools,
                names.tool_parameters,
                tools=req.tools,
                tool_choice=choice,
                parallel_tool_calls=req.parallel_tool_calls,
                **answer,
            )
        except ValueError as exc:  # a format the tokenizer cannot express
            raise bad_request(str(exc), names.tools) from None
        assert session.tools is not None  # a session given tools
        return Constraint(session, session.tools.mode)


def structured_options(req: SamplingFields | ResponseCreateRequest, response_format=None) -> tuple[str, dict] | None:
    """(the parameter to name in errors, the `ConstrainedSession` options) of `response_format`
    (chat) or `structured_outputs` (both endpoints); None for free text."""
    if req.structured_outputs is not None and response_format is not None and response_format.type != "text":
        raise bad_request("give either response_format or structured_outputs, not both", "structured_outputs")
    if isinstance(response_format, JsonObjectFormat):
        if response_format.schema_ is not None:  # llama.cpp's json_object with a schema: that schema
            return "response_format.schema", {"schema": response_format.schema_}
        return "response_format", {"json_object": True}
    if isinstance(response_format, JsonSchemaFormat):
        spec = response_format.json_schema
        # OpenAI's `strict: false` allows keys the schema does not declare; otherwise objects are closed.
        return "response_format.json_schema.schema", {"schema": spec.schema_, "strict": spec.strict is not False}
    so = req.structured_outputs
    if so is None:
        return None
    if so.json_ is not None:
        return "structured_outputs.json", {"schema": so.json_}
    if so.regex is not None:
        return "structured_outputs.regex", {"regex": so.regex}
    if so.choice is not None:
        return "structured_outputs.choice", {"choices": so.choice}
    return "structured_outputs.grammar", {"grammar": so.grammar}


def enforcement_headers(session: ConstrainedSession) -> dict[str, str]:
    """The `x-coreai-enforcement` response header of a constrained request: "grammar" when the grammar
    enforces every keyword of the schema (and for regex, choices, grammars), `ANY_JSON` for a schema
    without any asserting keyword, else "; "-separated
    "<how> <keyword> <pointer>" entries for the keywords enforced otherwise (validate-and-rollback;
    not enforced, in lenient mode), pointers percent-encoded to stay ASCII; at most
    `MAX_HEADER_ENTRIES`, then "and N more". Under tools, the entries are those of the keywords
    validate-and-rollback checks inside the calls, "<how> <keyword> <pointer> (tool <name>)", the
    pointer into the tool's parameters."""
    if session.spec.kind == "json_schema" and not session.enforcement:  # true, {}, only annotations
        return {"x-coreai-enforcement": ANY_JSON}
    entries = [f"{e.how} {e.keyword} {quote(e.pointer, safe='/~$')}" for e in session.enforcement if e.how != GRAMMAR]
    for name, plan in session.call_plans.items():
        checked = sorted(pointer(path) for path in plan.keyword_paths)
        entries += [f"{ROLLBACK} {parse_pointer(p)[-1]} {quote(p, safe='/~$')} (tool {name})" for p in checked]
    shown = entries[:MAX_HEADER_ENTRIES]
    if len(entries) > len(shown):  # HTTP clients refuse huge headers (httpx: 64 KiB); the report is the same
        shown.append(f"and {len(entries) - len(shown)} more (coreai check-schema lists them all)")
    return {"x-coreai-enforcement": "; ".join(shown) or GRAMMAR}


MAX_HEADER_ENTRIES = 32
ANY_JSON = "grammar (any JSON value: the schema asserts nothing)"
"""The header of a schema with no asserting keyword (`true`, `{}`, annotations only): a legitimate
request, reported as what it is, so a schema that lost its keywords is seen."""

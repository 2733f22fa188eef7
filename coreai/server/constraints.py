"""The server's side of a request's constraint: the answer format its body asks for
(`structured_options`, which the front ends put in `guided.request.GenerationRequest.answer`) and
the enforcement report a reply carries in its headers (`enforcement_headers`). `guided.request`
compiles the constraint, on the request's thread, so a bad schema is a 400 before the request queues;
it never falls back to free text."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from coreai.server.errors import bad_request
from coreai.server.schemas import JsonObjectFormat, JsonSchemaFormat, SamplingFields
from guided import Constraint
from guided.enforcement import GRAMMAR

if TYPE_CHECKING:
    from coreai.server.responses_schemas import ResponseCreateRequest


def structured_options(req: SamplingFields | ResponseCreateRequest, response_format=None) -> tuple[str, dict] | None:
    """(the parameter to name in errors, the `guided.Constraint` options) of `response_format`
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


def enforcement_headers(constraint: Constraint) -> dict[str, str]:
    """The `x-coreai-enforcement` response header of a constrained request: "grammar" when the grammar
    enforces every keyword of the schema (and for regex, choices, grammars), `ANY_JSON` for a schema
    without any asserting keyword, else "; "-separated
    "<how> <keyword> <pointer>" entries for the keywords enforced otherwise (validate-and-rollback;
    not enforced, in lenient mode), pointers percent-encoded to stay ASCII; at most
    `MAX_HEADER_ENTRIES`, then "and N more". Under tools, the entries are those of the keywords
    validate-and-rollback checks inside the calls, "<how> <keyword> <pointer> (tool <name>)", the
    pointer into the tool's parameters, and one entry per custom tool: "grammar lark (tool <name>)"
    or "grammar regex (tool <name>)" (its input held to its grammar), "free text (tool <name>)"
    (a text format: its input is any text)."""
    if constraint.spec.kind == "json_schema" and not constraint.enforcement:  # true, {}, only annotations
        return {"x-coreai-enforcement": ANY_JSON}
    entries = [
        f"{e.how} {e.keyword} {quote(e.pointer, safe='/~$')}" + (f" (tool {e.tool})" if e.tool else "")
        for e in constraint.report
        if e.how != GRAMMAR
    ]
    tools = constraint.tools
    custom = tools.tools if tools is not None and tools.mode != "none" else []
    for tool in custom:
        if tool.format is not None:
            how = f"{GRAMMAR} {tool.format['syntax']}" if tool.format["type"] == "grammar" else "free text"
            entries.append(f"{how} (tool {tool.name})")
    shown = entries[:MAX_HEADER_ENTRIES]
    if len(entries) > len(shown):  # HTTP clients refuse huge headers (httpx: 64 KiB); the report is the same
        shown.append(f"and {len(entries) - len(shown)} more (coreai check-schema lists them all)")
    return {"x-coreai-enforcement": "; ".join(shown) or GRAMMAR}


MAX_HEADER_ENTRIES = 32
ANY_JSON = "grammar (any JSON value: the schema asserts nothing)"
"""The header of a schema with no asserting keyword (`true`, `{}`, annotations only): a legitimate
request, reported as what it is, so a schema that lost its keywords is seen."""

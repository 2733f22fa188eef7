"""The enforcement report a constrained reply carries in its headers (`enforcement_headers`), in
every dialect: how each keyword of its schema is enforced."""

from __future__ import annotations

from urllib.parse import quote

from guided import GRAMMAR, Constraint


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

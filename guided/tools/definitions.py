"""Tool definitions: each shape a tool may be given in, read once into a `Tool` (`make_tool`) with
its parameters checked and closed (`parameters_schema`).

A tool is given in OpenAI's chat shape `{"type": "function", "function": {"name", "description",
"parameters", "strict"}}`, the flat Responses shape `{"type": "function", "name", "parameters", ...}`,
as a pydantic model class (its JSON Schema; the name is the class name) or as a plain Python
function with type hints (pydantic's `TypeAdapter` of the signature; the description is the
docstring); or as a custom tool, `{"type": "custom", ...}`, whose input is raw text
(`guided.tools.custom`). `Tool.template` is the OpenAI chat shape chat templates render.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from typing import Any

from guided.errors import SchemaError
from guided.spec import check_metaschema, close_objects
from guided.tools.custom import CUSTOM, input_format, input_schema
from runtime.errors import InputError

TOOL_NAME = r"[a-zA-Z0-9_-]{1,64}"  # OpenAI's function names (the server's request schema uses it too)


@dataclass(frozen=True)
class Tool:
    """One tool a call may use. parameters: its JSON Schema as enforced (an object schema,
    closed unless `strict` is False); shown: the parameters as the caller gave them, which the
    prompt shows (None: none given); template: the OpenAI chat shape given to the chat template.
    kind: "function", or "custom" for a tool whose input is raw text (`guided.tools.custom`), in
    `format` ({"type": "text"} or {"type": "grammar", "syntax", "definition"}; None for a function)."""

    name: str
    parameters: dict
    description: str | None = None
    strict: bool | None = None
    shown: dict | None = None
    kind: str = "function"
    format: dict | None = None

    @property
    def template(self) -> dict:
        function: dict[str, Any] = {"name": self.name}
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


def checked_name(name) -> str:
    """`name` if it is an OpenAI function name (`TOOL_NAME`), else ValueError naming it."""
    if not isinstance(name, str) or not re.fullmatch(TOOL_NAME, name):
        raise InputError(
            f"a tool's name must be 1-64 letters, digits, '_' or '-' (OpenAI's rule), got {name!r}", "tools"
        )
    return name


def make_tool(tool) -> Tool:
    """A `Tool` from any accepted shape (see the module docstring). Raises SchemaError (bad
    parameters) or ValueError (an unknown shape, a missing or malformed name)."""
    if isinstance(tool, Tool):
        return tool
    if isinstance(tool, type) and hasattr(tool, "model_json_schema"):
        schema = tool.model_json_schema()
        description = schema.get("description") or inspect.getdoc(tool)
        return Tool(checked_name(tool.__name__), parameters_schema(schema), description, shown=schema)
    if callable(tool) and not isinstance(tool, dict):
        from pydantic import TypeAdapter

        schema = TypeAdapter(tool).json_schema()
        return Tool(checked_name(tool.__name__), parameters_schema(schema), inspect.getdoc(tool), shown=schema)
    if isinstance(tool, dict) and tool.get("type") == CUSTOM:
        spec = tool.get("custom", tool)  # the chat shape nests it; the Responses shape is flat
        fmt = input_format(tool)
        schema = input_schema(fmt)
        name, description = checked_name(spec.get("name")), spec.get("description")
        return Tool(name, schema, description, shown=schema, kind=CUSTOM, format=fmt)
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise InputError(
            "a tool is a function or custom tool definition (dict), a pydantic model class or a function, "
            f"got {tool!r}",
            "tools",
        )
    function = tool.get("function", tool)  # the chat shape nests it; the Responses shape is flat
    if not function.get("name"):
        raise InputError("a tool function needs a name", "tools")
    name = checked_name(function["name"])
    strict, shown = function.get("strict"), function.get("parameters")
    return Tool(name, parameters_schema(shown, strict), function.get("description"), strict, shown)


def given_name(tool) -> str:
    """The name a tool definition gives itself (for errors about it, before it is checked)."""
    if isinstance(tool, dict):
        spec = tool.get("function") or tool.get("custom") or tool
        return str(spec.get("name"))
    return getattr(tool, "__name__", repr(tool))

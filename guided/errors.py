"""Errors raised by guided generation."""

from runtime.errors import CoreAIError


class GrammarError(CoreAIError, ValueError):
    """A grammar (regex, Lark, GBNF, choices) that cannot be compiled, or a compile over its limits.
    `param`: the request field that held it, where a front end gave one (`guided.request`). About a
    tool (`about_tool`): `tool`, `tool_index`, and `tool_field`, the part of the tool at fault
    ("parameters", or "format" for a custom tool's grammar)."""

    param: str | None = None
    tool: str | None = None
    tool_index: int | None = None
    tool_field: str = "parameters"

    def about_tool(self, name: str, index: int, field: str = "parameters") -> "GrammarError":
        """This error, about `field` of tool `name`, the `index`-th of the tools given: its message
        names the tool (a pointer stays the pointer into the parameters)."""
        self.args = (f"tool {name!r}: {self.args[0]}", *self.args[1:])
        self.tool, self.tool_index, self.tool_field = name, index, field
        return self


class SchemaError(GrammarError):
    """A JSON Schema that is not valid against its metaschema, or not JSON at all.

    `pointer` is the JSON pointer of the offending location ("" for the root).
    """

    def __init__(self, message: str, pointer: str = ""):
        super().__init__(message)
        self.pointer = pointer


class UnsatisfiableSchema(SchemaError):
    """A valid schema that no JSON value satisfies (`false`, `not: {}`, a `$ref` cycle that never
    reaches a value, contradictory keywords): refused at compile time, since every output would be
    invalid. `pointer` blames the part that excludes everything where it is known."""


class UnsupportedSchemaFeature(SchemaError):
    """A valid schema using a keyword the engine cannot enforce (raised unless `lenient=True`).

    `keyword` names the keyword and `pointer` its JSON pointer.
    """

    def __init__(self, message: str, keyword: str = "", pointer: str = ""):
        super().__init__(message, pointer)
        self.keyword = keyword

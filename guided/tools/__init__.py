"""Tool calls as a constraint, one module a concern:

| module | its one job |
| --- | --- |
| `definitions` | tool definitions in, in any accepted shape, validated once (`Tool`, `make_tool`) |
| `constraint` | the tools grammar and `ToolConstraint` out |
| `formats` | the table of each model family's call markup (`FORMATS`): markers, detection, Lark rules |
| `syntax` | Lark building blocks and the three call syntaxes that are not JSON (pythonic, XML, GLM-4.5) |
| `capture` | a call read back from its grammar capture (name, arguments) |
| `calls` | the calls of one generation from the grammar's captures; labels for streaming; `CallStream` |
| `check` | validate-and-rollback inside calls, for keywords the grammar cannot enforce |
| `answer` | a JSON answer beside tools (OpenAI's response_format with tools) |
"""

from guided.tools.calls import CallStream, CallTracker, ToolCall, call_key
from guided.tools.constraint import ToolConstraint, tool_constraint
from guided.tools.custom import CUSTOM, INPUT
from guided.tools.definitions import TOOL_NAME, parameters_schema
from guided.tools.formats import FORMATS

__all__ = [
    "CUSTOM",
    "FORMATS",
    "INPUT",
    "TOOL_NAME",
    "CallStream",
    "CallTracker",
    "ToolCall",
    "ToolConstraint",
    "call_key",
    "parameters_schema",
    "tool_constraint",
]

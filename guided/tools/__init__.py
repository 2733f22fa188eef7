"""Tool calls as a constraint, one module a concern:

| module | its one job |
| --- | --- |
| `constraint` | tool definitions in (validated once), the tools grammar and `ToolConstraint` out |
| `formats` | each model family's call markup: detection, Lark rules, reading a captured call |
| `syntax` | Lark building blocks and the two call syntaxes that are not JSON (pythonic, XML) |
| `calls` | the calls of one generation from the grammar's captures; labels for streaming; `CallStream` |
| `check` | validate-and-rollback inside calls, for keywords the grammar cannot enforce |
| `answer` | a JSON answer beside tools (OpenAI's response_format with tools) |
"""

from guided.tools.calls import CallStream, CallTracker, ToolCall
from guided.tools.constraint import TOOL_NAME, ToolConstraint, parameters_schema, tool_constraint
from guided.tools.custom import INPUT
from guided.tools.formats import FORMATS

__all__ = [
    "FORMATS",
    "INPUT",
    "TOOL_NAME",
    "CallStream",
    "CallTracker",
    "ToolCall",
    "ToolConstraint",
    "parameters_schema",
    "tool_constraint",
]

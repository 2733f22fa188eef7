"""Anthropic's client-run tool types (`bash_20250124`, `text_editor_*`, `memory_*`): tools Anthropic
defines and the client runs, sent as `{"type": ..., "name": ...}` with no `input_schema`, as the
Claude Agent SDK and the computer-use demos send them. The model sees each as a function tool with
the input schema Anthropic publishes for that version, and its calls are constrained to it like any
client tool's, so they come back as `tool_use` blocks the client runs (`client_tool`; the request
model is `schemas.ClientRunTool`). Computer use (`computer_*`) is not among them: its results are
screenshots, which this server's models cannot read; it stays a tool the server names and leaves
out (`request.hosted_tools`).

The schemas follow Anthropic's tool documentation (bash, text editor and memory tools): the
commands each version accepts and their parameters. `bash`'s `command` is required here, although
Anthropic also takes a call with `restart` alone, so a small model cannot answer `{}`.
"""

from __future__ import annotations

from typing import Any

from coreai.server.anthropic import schemas as m

_PATH = {"type": "string", "description": "Absolute path to the file or directory."}
_LINES = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}

BASH = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The bash command to run."},
        "restart": {"type": "boolean", "description": "Restart the bash session first."},
    },
    "required": ["command"],
}


def _editor(commands: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": commands},
            "path": _PATH,
            "file_text": {"type": "string", "description": "create: the new file's content."},
            "old_str": {"type": "string", "description": "str_replace: the exact text to replace."},
            "new_str": {"type": "string", "description": "str_replace: its replacement; insert: the text to insert."},
            "insert_line": {"type": "integer", "description": "insert: the line after which to insert (0: the top)."},
            "view_range": {**_LINES, "description": "view: [first, last] line (1-based; last -1: to the end)."},
        },
        "required": ["command", "path"],
    }


MEMORY = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "delete", "rename"]},
        "path": {"type": "string", "description": "A path under /memories."},
        "file_text": {"type": "string"},
        "old_str": {"type": "string"},
        "new_str": {"type": "string"},
        "insert_line": {"type": "integer"},
        "insert_text": {"type": "string"},
        "view_range": _LINES,
        "old_path": {"type": "string"},
        "new_path": {"type": "string"},
    },
    "required": ["command"],
}

EDITOR_OLD = _editor(["view", "create", "str_replace", "insert", "undo_edit"])  # 20241022, 20250124
EDITOR = _editor(["view", "create", "str_replace", "insert"])  # 20250429, 20250728: no undo_edit

# type (`schemas.CLIENT_RUN_TYPES`) -> (its input schema, the description the model sees)
CLIENT_TOOLS: dict[str, tuple[dict[str, Any], str]] = {
    "bash_20241022": (BASH, "Run a command in a persistent bash shell; the client runs it and returns its output."),
    "bash_20250124": (BASH, "Run a command in a persistent bash shell; the client runs it and returns its output."),
    "text_editor_20241022": (EDITOR_OLD, "View, create and edit files (view, create, str_replace, insert, undo_edit)."),
    "text_editor_20250124": (EDITOR_OLD, "View, create and edit files (view, create, str_replace, insert, undo_edit)."),
    "text_editor_20250429": (EDITOR, "View, create and edit files (view, create, str_replace, insert)."),
    "text_editor_20250728": (EDITOR, "View, create and edit files (view, create, str_replace, insert)."),
    "memory_20250818": (MEMORY, "Read and write files in the /memories folder, kept across conversations."),
}


def client_tool(tool: m.ClientRunTool) -> m.Tool:
    """`tool` as the client tool the model sees, under the name the request gives it, deferred
    (`defer_loading`) as it says."""
    schema, description = CLIENT_TOOLS[tool.type]
    if tool.max_characters:  # text_editor_20250728's view truncation, which the client applies
        description += f" A view shows at most {tool.max_characters} characters."
    return m.Tool(
        name=tool.name,
        description=description,
        input_schema=schema,
        cache_control=tool.cache_control,
        defer_loading=tool.defer_loading,
    )

"""The Responses API's input items, as pydantic models: messages (text or parts), function, custom tool
and `local_shell` calls and their outputs, reasoning and compaction items, discriminated by `type`
(an item without one is a message, as OpenAI reads it), so a bad item gets one error naming its
location. `schemas` re-exports them (the dialect reads them as `schemas.X`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from coreai.server.bodies import Request


class InputText(Request):
    type: Literal["input_text"]
    text: str


class OutputText(Request):
    """An assistant's earlier text, passed back; its annotations and logprobs are not used."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


Part = Annotated[InputText | OutputText, Field(discriminator="type")]


class MessageItem(Request):
    """A message: `content` a string or text parts. `id` / `status` come with messages passed back."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallItem(Request):
    """A function call passed back; `namespace`: the namespace tool holding the function, if any."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text
    namespace: str | None = None
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(Request):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class CustomToolCallItem(Request):
    """A custom tool's call passed back: its raw `input`."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class CustomToolCallOutputItem(Request):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None


class LocalShellAction(Request):
    """The `exec` action of a `local_shell` call (OpenAI's `LocalShellCallAction`)."""

    type: Literal["exec"]
    command: list[str]
    env: dict[str, str] = {}
    timeout_ms: int | None = None
    user: str | None = None
    working_directory: str | None = None


class LocalShellCallItem(Request):
    """A `local_shell` call passed back (`local_shell.py`)."""

    type: Literal["local_shell_call"]
    call_id: str
    action: LocalShellAction
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class LocalShellCallOutputItem(Request):
    """A `local_shell` call's output; `id` is the call's `call_id` (OpenAI's shape)."""

    type: Literal["local_shell_call_output"]
    id: str
    output: str
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ReasoningText(Request):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(Request):
    """A reasoning item passed back: accepted, and not rendered (chat templates drop earlier turns'
    reasoning); its `encrypted_content`, this server's capsule (`capsule.py`), is opened and checked."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


ITEM_TAGS = {"message": "Message", "function_call": "FunctionCall", "function_call_output": "FunctionCallOutput"}
ITEM_TAGS |= {"reasoning": "Reasoning", "custom_tool_call": "Custom", "custom_tool_call_output": "CustomOutput"}
ITEM_TAGS |= {"compaction": "Compaction", "compaction_summary": "Compaction", "compaction_trigger": "Trigger"}
ITEM_TAGS |= {"local_shell_call": "LocalShell", "local_shell_call_output": "LocalShellOutput"}


class CompactionItem(Request):
    """A compaction passed back (`compaction_summary` is Codex's older name): its `encrypted_content`
    is this server's capsule of the summary (`compaction.py`), expanded into the prompt."""

    type: Literal["compaction", "compaction_summary"]
    encrypted_content: str
    id: str | None = None


class CompactionTriggerItem(Request):
    """Remote compaction v2: the last input item asks for one `compaction` output item."""

    type: Literal["compaction_trigger"]
    id: str | None = None


def _item_tag(value) -> str | None:
    # Capitalised tags: the 400's field path skips them (`errors.field_path` keeps lower-case keys).
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return ITEM_TAGS.get(kind) if isinstance(kind, str) else None  # a non-string type: no member, a 400


InputItem = Annotated[
    Annotated[MessageItem, Tag("Message")]
    | Annotated[FunctionCallItem, Tag("FunctionCall")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")]
    | Annotated[ReasoningItem, Tag("Reasoning")]
    | Annotated[CustomToolCallItem, Tag("Custom")]
    | Annotated[CustomToolCallOutputItem, Tag("CustomOutput")]
    | Annotated[CompactionItem, Tag("Compaction")]
    | Annotated[CompactionTriggerItem, Tag("Trigger")]
    | Annotated[LocalShellCallItem, Tag("LocalShell")]
    | Annotated[LocalShellCallOutputItem, Tag("LocalShellOutput")],
    Discriminator(
        _item_tag,
        custom_error_type="invalid_item",
        custom_error_message="an input item's type is message, function_call, function_call_output, "
        "custom_tool_call, custom_tool_call_output, local_shell_call, local_shell_call_output, reasoning, "
        "compaction or compaction_trigger",
    ),
]

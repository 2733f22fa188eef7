"""`ResponseStore`: the Responses API's stored responses, for `previous_response_id` and
`GET` / `DELETE /v1/responses/{id}`.

In memory, bounded by count and by bytes (the JSON size of what is kept), least recently used out
first, as OpenAI's semantics allow for a local server: an evicted id is a 404 like an unknown one.
Each entry keeps the response as sent and the conversation it ends, as chat messages (the inputs of
every turn so far and this turn's output; `instructions` are not carried over, as OpenAI does), so a
follow-up turn renders the same prompt and starts from its prefix-cache entry.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from coreai.server.responses import local_shell
from coreai.server.responses import schemas as r
from coreai.server.responses.namespaces import flat_name
from runtime.errors import InputError


@dataclass(frozen=True)
class StoredResponse:
    """response: the `Response` JSON as sent; messages: the conversation up to and including it;
    input_items: this turn's `input` as items with ids (`GET /v1/responses/{id}/input_items`)."""

    response: dict
    messages: list[dict]
    nbytes: int
    input_items: list[dict] = field(default_factory=list)


class ResponseStore:
    """Responses by id, at most `max_count` of them and `max_bytes` bytes of JSON (>= 1 each).
    Thread-safe (routes run on the event loop and on thread-pool threads)."""

    def __init__(self, max_count: int = 1024, max_bytes: int = 64 << 20):
        if max_count < 1 or max_bytes < 1:
            raise InputError(f"max_count and max_bytes must be >= 1, got {max_count}, {max_bytes}")
        self.max_count, self.max_bytes = max_count, max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response: dict, messages: list[dict], input_items: list[dict] | None = None) -> None:
        """Keep `response` (its "id" is the key), its conversation and its input items; evicts the least
        recently used entries past the bounds (an entry larger than `max_bytes` alone is not kept)."""
        items = input_items or []
        nbytes = len(json.dumps([response, messages, items], ensure_ascii=False))
        entry = StoredResponse(response, messages, nbytes, items)
        with self._lock:
            self._pop(response["id"])
            if entry.nbytes > self.max_bytes:
                return
            self._entries[response["id"]] = entry
            self._bytes += entry.nbytes
            while len(self._entries) > self.max_count or self._bytes > self.max_bytes:
                self._pop(next(iter(self._entries)))

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry, now the most recently used; None if unknown or evicted."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        """Forget a response; False if it was not kept."""
        with self._lock:
            return self._pop(response_id)

    def __len__(self) -> int:
        return len(self._entries)

    def _pop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry.nbytes
        return entry is not None


CALLS = ("function_call", "custom_tool_call", "local_shell_call")


def call_message(item: dict) -> dict:
    """A call output item as a chat message's tool call, named as the model saw the tool."""
    if item["type"] == "custom_tool_call":
        return {"id": item["call_id"], "type": "custom", "custom": {"name": item["name"], "input": item["input"]}}
    if item["type"] == "local_shell_call":
        return local_shell.chat_call(item["call_id"], r.LocalShellAction.model_validate(item["action"]))
    flat = flat_name(item.get("namespace"), item["name"])
    return {"id": item["call_id"], "type": "function", "function": {"name": flat, "arguments": item["arguments"]}}


def output_messages(output: list[dict]) -> list[dict]:
    """A response's output items as chat messages: its message text and function and custom tool
    calls as one assistant turn (reasoning items are dropped, as chat templates drop earlier turns'
    reasoning, and so is a call cut by the budget, `status: "incomplete"`: its arguments are not
    JSON text, its input not what the grammar asks for)."""
    text = "".join(
        part.get("text", "") for item in output if item.get("type") == "message" for part in item.get("content", [])
    )
    calls = [call_message(item) for item in output if item.get("type") in CALLS and item.get("status") != "incomplete"]
    if not text and not calls:
        return []
    message: dict = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]

"""Local compaction: OpenAI's remote compaction (v2, a `compaction_trigger` as the last input item;
and `POST /v1/responses/compact`) done by the served model.

The conversation before the trigger is shown to the model as a transcript, and the model writes a
summary under a JSON schema (`SUMMARY_SCHEMA`: one string, at most `SUMMARY_CHARS` characters,
enforced by guided generation). The answer is exactly one `compaction` item whose
`encrypted_content` is a capsule (`capsule.py`) holding the summary: self-contained, so any server
instance expands it when a later request replays the item (`request.compaction_text`: a user turn
standing for the turns it replaced). `/v1/responses/compact` answers the conversation's user
messages followed by that item, as OpenAI's `CompactedResponse` does.
"""

from __future__ import annotations

import json

from coreai.server.responses import schemas as r
from coreai.server.responses.capsule import seal
from coreai.server.responses.schemas import new_id

SUMMARY_CHARS = 1200
SUMMARY_SCHEMA = {
    "type": "object",
    "properties": {"summary": {"type": "string", "minLength": 1, "maxLength": SUMMARY_CHARS}},
    "required": ["summary"],
    "additionalProperties": False,
}
INSTRUCTIONS = (
    "You compact a conversation between a user and a coding assistant. Write a short summary that "
    "lets the assistant continue: the user's goal, what was done (commands run, files read or "
    'changed, their results), and what is left to do. Answer as JSON: {"summary": "..."}.'
)
TRANSCRIPT_CHARS = 2000  # a turn's text shown to the summarizer at most (tool outputs are long)


def is_trigger(req: r.ResponseCreateRequest) -> bool:
    """Whether `req` asks for a compaction (its last input item is a `compaction_trigger`)."""
    return isinstance(req.input, list) and isinstance(req.input[-1], r.CompactionTriggerItem)


def transcript(messages: list[dict]) -> str:
    """Chat messages (the conversation to compact) as one text the summarizer reads."""
    lines = []
    for m in messages:
        if m["role"] == "system":
            continue
        text = m.get("content") or ""
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or call.get("custom") or {}
            text += f"\n[call {fn.get('name')}: {fn.get('arguments', fn.get('input', ''))}]"
        if len(text) > TRANSCRIPT_CHARS:
            text = text[:TRANSCRIPT_CHARS] + " [...]"
        lines.append(f"{m['role']}: {text.strip()}")
    return "\n\n".join(lines)


def summary_messages(conversation: list[dict]) -> list[dict]:
    """The summarizer's prompt: its instructions, then the transcript as the user's turn."""
    return [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "Conversation to compact:\n\n" + transcript(conversation)},
    ]


def summary_answer() -> tuple[str, dict]:
    """The answer format of the summary (the `GenerationRequest.answer` pair)."""
    return ("input", {"schema": SUMMARY_SCHEMA, "strict": True})


def compaction_item(content: str, item_id: str | None = None) -> r.OutputCompaction:
    """The compaction item of the summarizer's answer (`content`: JSON text under `SUMMARY_SCHEMA`;
    text that is not, as a cut generation's, is kept whole as the summary)."""
    try:
        summary = json.loads(content)["summary"]
    except (ValueError, KeyError, TypeError):
        summary = content
    return r.OutputCompaction(id=item_id or new_id("cmp_"), encrypted_content=seal("compaction", {"summary": summary}))


def kept_user_messages(req: r.ResponseCreateRequest) -> list[dict]:
    """The user messages of `req.input`, as `/v1/responses/compact` returns them before its item."""
    items = [r.MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    out = []
    for item in items:
        if isinstance(item, r.MessageItem) and item.role == "user":
            text = item.content if isinstance(item.content, str) else "".join(p.text for p in item.content)
            content = [{"type": "input_text", "text": text}]
            out.append(
                {"type": "message", "id": new_id("msg_"), "role": "user", "status": "completed", "content": content}
            )
    return out

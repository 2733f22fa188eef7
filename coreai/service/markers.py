"""Volatile prompt markers: text agent clients put in every request that changes from session to
session (or request to request) and means nothing to the model, removed before the prompt is
rendered so that the long prefix the requests share (an agent's system prompt and tool
definitions) stays one prefix in the KV cache.

Why: the prefix cache reuses the longest common prefix of token ids. Claude Code's first system
block is a billing line whose `cc_version` suffix changes with the session's first question (and,
in later releases, a `cch=` field that changes on every request); everything after it (~20k tokens
on Qwen's tokenizer, minutes of prefill on a CPU) is byte-identical across sessions. Left in, every
new session prefills it all again. Peers strip the same lines (vllm-mlx, oMLX; Ollama's launcher
sets `CLAUDE_CODE_ATTRIBUTION_HEADER=0` instead).

The rules are data (`RULES`): each names the client release it was seen in and where (a test
replays that capture, tests/test_markers.py). A rule matches only its own marker's shape, so a
conversation that quotes such a line elsewhere keeps it. The server applies them to every dialect's
request (`Settings.strip_markers`); the Python API and the CLI never rewrite a caller's prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MarkerRule:
    """One volatile marker. name: what the `x-coreai-ignored` header and the stats call it.
    pattern: the marker's text, with the separator that follows it. roles: the message roles it is
    looked for in. at_start: only at the very start of the message's text. seen_in: the client
    release that sends it, and where it was seen."""

    name: str
    pattern: re.Pattern[str]
    roles: frozenset[str]
    at_start: bool
    seen_in: str


RULES: tuple[MarkerRule, ...] = (
    MarkerRule(
        "claude-code billing header",
        # `x-anthropic-billing-header: cc_version=2.1.332.862; cc_entrypoint=sdk-cli;` and the later
        # form with `cch=<hash>;`: any fields, up to the end of its line, and the blank line after it.
        re.compile(r"x-anthropic-billing-header:[^\r\n]*(?:(?:\r?\n)+|\Z)"),
        frozenset({"system"}),
        True,
        "Claude Code 2.1.332 (npm @anthropic-ai/claude-code, tests/data/claude_code/): the first system "
        "block, its cc_version suffix set by the session's first question; `cch=` in later releases",
    ),
    MarkerRule(
        "total_tokens reminder",
        # `<total_tokens>N tokens left</total_tokens>`, a countdown of the session's token budget, in a
        # `<system-reminder>` block of its own (the block goes with it), or bare at the message's end
        # (so a user quoting one mid-sentence keeps it).
        re.compile(
            r"\s*<system-reminder>\s*<total_tokens>\d+ tokens left</total_tokens>\s*</system-reminder>"
            r"|\s*<total_tokens>\d+ tokens left</total_tokens>\s*\Z"
        ),
        frozenset({"system", "user", "tool"}),
        False,
        "Claude Code 2.1.332 (tests/data/claude_code/): the end of the last system block, and a reminder "
        "in the first user message and after every tool result, counting down as the session spends tokens",
    ),
)


def strip_markers(messages: list, rules: tuple[MarkerRule, ...] = RULES) -> tuple[list, list[str]]:
    """`messages` (chat messages: dicts with `role` and text `content`) with every marker of
    `rules` removed, and the names of the rules that removed something (each once, in `rules`'
    order). Messages are copied where changed, never edited in place; other shapes (a text prompt,
    token ids, content that is not text) pass unchanged."""
    hits: set[str] = set()
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            out.append(message)
            continue
        text = content
        for rule in rules:
            if message.get("role") not in rule.roles:
                continue
            if rule.at_start:
                found = rule.pattern.match(text)
                changed = text[found.end() :] if found else text
            else:
                changed = rule.pattern.sub("", text)
            if changed != text:
                hits.add(rule.name)
                text = changed
        out.append(message if text is content else {**message, "content": text})
    return out, [rule.name for rule in rules if rule.name in hits]

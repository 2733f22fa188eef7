"""Reasoning blocks of thinking models (`<think> ... </think>` before the answer): the markers of the
known families, the per-request `ReasoningPlan`, and a streaming splitter of generated text into
reasoning and answer.

Families: Qwen3 / QwQ / DeepSeek-R1 distills use `<think>` and `</think>`; Kimi uses `◁think▷`
and `◁/think▷`; Seed-OSS `<seed:think>` and `</seed:think>`. A model is taken to think when its
chat template mentions both markers of a family and both are single tokens of its tokenizer
(`Tokenizer.reasoning_tokens`); `ConstrainedSession(reasoning_markers=...)` sets them by hand.

Whether one generation may reason is decided once, from its rendered prompt, by `plan_reasoning`;
the plan travels with the request (the guided strategy's phases, the server's reply split).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import InputError
from runtime.stops import partial_suffix

KNOWN_MARKERS = (("<think>", "</think>"), ("◁think▷", "◁/think▷"), ("<seed:think>", "</seed:think>"))


@dataclass(frozen=True)
class ReasoningMarkers:
    """The text that opens and closes a reasoning block, and the separator the family writes
    between the block and the answer (Qwen3: a blank line)."""

    start: str
    end: str
    separator: str = "\n\n"


def detect_markers(chat_template, hf_tokenizer=None) -> ReasoningMarkers | None:
    """The markers of a known family whose start and end both appear in `chat_template` (a string,
    or a dict of named templates), else None. With `hf_tokenizer`, only a family whose markers are
    single tokens of it counts (the strategy switches phases on those token ids)."""
    if hf_tokenizer is not None:
        tokens = detect_reasoning(chat_template, hf_tokenizer)
        return tokens.markers if tokens is not None else None
    return next(iter(_mentioned(chat_template)), None)


def detect_reasoning(chat_template, hf_tokenizer) -> ReasoningTokens | None:
    """The token ids of the first known family that `chat_template` mentions and whose markers are
    single tokens of `hf_tokenizer`, else None."""
    for markers in _mentioned(chat_template):
        try:
            return ReasoningTokens.of(markers, hf_tokenizer)
        except ValueError:
            continue
    return None


def _mentioned(chat_template) -> list[ReasoningMarkers]:
    """The known families whose start and end markers both appear in the template (text or dict)."""
    if isinstance(chat_template, dict):
        chat_template = "\n".join(str(t) for t in chat_template.values())
    if not chat_template:
        return []
    return [ReasoningMarkers(a, b) for a, b in KNOWN_MARKERS if a in chat_template and b in chat_template]


class ReasoningSplitter:
    """Splits streamed text into (reasoning, answer) pieces.

    opened: the prompt already opened the block (the text starts inside it); otherwise a block is
    recognised only at the very start of the output (after whitespace). Text that may be the start
    of a marker is held back until it is not. The separator after the end marker is dropped.
    """

    def __init__(self, markers: ReasoningMarkers, opened: bool = False):
        self.markers = markers
        self._state = "inside" if opened else "start"  # start -> inside -> after -> answer
        self._buf = ""
        self.seen = opened  # a reasoning block was opened

    def feed(self, text: str) -> tuple[str, str]:
        """Add generated text; returns (reasoning, answer) text that is safe to emit now."""
        self._buf += text
        reasoning = answer = ""
        m = self.markers
        if self._state == "start":
            head = self._buf.lstrip()
            if head.startswith(m.start):
                self._buf, self._state, self.seen = head[len(m.start) :], "inside", True
            elif m.start.startswith(head):
                return "", ""  # maybe a marker still arriving
            else:
                self._state = "answer"
        if self._state == "inside":
            end = self._buf.find(m.end)
            if end < 0:
                keep = partial_suffix(self._buf, (m.end,))
                reasoning, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
                return reasoning, ""
            reasoning, self._buf, self._state = self._buf[:end], self._buf[end + len(m.end) :], "after"
        if self._state == "after":
            stripped = self._buf.lstrip("\n")
            if not stripped and len(self._buf) < len(m.separator):
                return reasoning, ""
            self._buf, self._state = stripped, "answer"
        answer, self._buf = self._buf, ""
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """Flush held-back text at the end of generation."""
        text, self._buf = self._buf, ""
        if self._state == "inside":
            return text, ""
        if self._state == "start":
            return "", text
        return "", text.lstrip("\n") if self._state == "after" else text


def split_reasoning(text: str, markers: ReasoningMarkers | None, opened: bool = False) -> tuple[str | None, str]:
    """(reasoning or None when there was no block, answer) of a whole output."""
    if markers is None:
        return None, text
    splitter = ReasoningSplitter(markers, opened)
    r1, a1 = splitter.feed(text)
    r2, a2 = splitter.finish()
    return (r1 + r2 if splitter.seen else None), a1 + a2


@dataclass(frozen=True)
class ReasoningTokens:
    """A family's markers and the token ids of its markers and separator for one tokenizer."""

    markers: ReasoningMarkers
    start: tuple[int, ...]
    end: tuple[int, ...]
    separator: tuple[int, ...]

    @classmethod
    def of(cls, markers: ReasoningMarkers, hf_tokenizer) -> ReasoningTokens:
        """Raises ValueError when a marker is not in the vocabulary as one token (a family this
        tokenizer does not speak)."""
        ids = [
            hf_tokenizer.encode(m, add_special_tokens=False) for m in (markers.start, markers.end, markers.separator)
        ]
        if len(ids[0]) != 1 or len(ids[1]) != 1:
            raise InputError(
                f"reasoning markers {markers.start!r} / {markers.end!r} are not single tokens of this tokenizer"
            )
        return cls(markers, *(tuple(i) for i in ids))

    def prompt_state(self, prompt_ids: list[int]) -> str:
        """ "open": the prompt opened a block (the output starts inside it); "closed": the prompt ends
        with a closed block (the template turned thinking off, e.g. Qwen3's enable_thinking=False);
        "free": the model may open a block with its first token."""
        start, end = self.start[0], self.end[0]
        last_start = max((i for i, t in enumerate(prompt_ids) if t == start), default=-1)
        last_end = max((i for i, t in enumerate(prompt_ids) if t == end), default=-1)
        if last_start > last_end:
            return "open"
        if last_end >= 0 and len(prompt_ids) - last_end <= len(self.separator) + 1:
            return "closed"
        return "free"


def thinking_enabled(chat_template_kwargs: dict | None) -> bool:
    """False when the template variables turn reasoning off ({"enable_thinking": False})."""
    return (chat_template_kwargs or {}).get("enable_thinking", True) is not False


@dataclass(frozen=True)
class ReasoningPlan:
    """How one generation treats a reasoning block, decided once from its rendered prompt.

    tokens: the family's markers and token ids. opened: the prompt opened the block (the output
    starts inside it); otherwise the model may open one with its first token. max_tokens: reasoning
    tokens (end marker included) before a constrained generation forces the end marker (>= 1).
    """

    tokens: ReasoningTokens
    opened: bool
    max_tokens: int = 1024

    def splitter(self) -> ReasoningSplitter:
        """A streaming splitter of this generation's output into (reasoning, answer)."""
        return ReasoningSplitter(self.tokens.markers, self.opened)

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None when there was no block, answer) of a whole output."""
        return split_reasoning(text, self.tokens.markers, self.opened)

    def count(self, token_ids: list[int]) -> int:
        """The tokens inside an output's reasoning block, its end marker included and the start
        marker not (as the guided strategy counts them): the rest of the output while the block is
        open; 0 when the output did not open one."""
        first = 0 if self.opened else 1
        if not self.opened and token_ids[:1] != [self.tokens.start[0]]:
            return 0
        end = self.tokens.end[0]
        last = token_ids.index(end, first) + 1 if end in token_ids[first:] else len(token_ids)
        return last - first


def plan_reasoning(
    tokens: ReasoningTokens | None,
    prompt_ids: list[int],
    chat_template_kwargs: dict | None = None,
    max_tokens: int = 1024,
) -> ReasoningPlan | None:
    """The reasoning plan of one generation, or None when it cannot reason: the model has no
    markers (`tokens` None), the template variables turned thinking off, or the prompt ends with a
    closed block (the template's own way of turning it off). Raises ValueError if max_tokens < 1."""
    if max_tokens < 1:
        raise InputError(f"max_reasoning_tokens must be >= 1, got {max_tokens}")
    if tokens is None or not thinking_enabled(chat_template_kwargs):
        return None
    state = tokens.prompt_state(prompt_ids)
    return None if state == "closed" else ReasoningPlan(tokens, state == "open", max_tokens)

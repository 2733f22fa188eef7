"""`ReasoningGate`: the phases of one constrained generation of a thinking model.

Rather than a grammar `think? answer` (which would make the engine lex free text token by token and
tie every grammar to a family's markers), the strategy runs in phases and the gate says which one a
step is in:

- "start": the model may open a block with its first token (the grammar's mask plus the start
  marker); any other token begins the answer;
- "free": inside the block, every token but EOS, padding and the start marker; drafts are cut at
  the end marker; after `plan.max_tokens` reasoning tokens the end marker and separator are forced;
- "answer": the grammar, from its start (the end marker is followed by the forced separator, then
  the grammar's jump-forward tokens).

The phases are decided once per generation by the `runtime.reasoning.ReasoningPlan` built from the
rendered prompt (None: straight to "answer"). The gate owns the phase and the reasoning-token count;
the grammar matcher is untouched until the answer begins.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from guided.bitmask import TokenBitmask
from runtime.reasoning import ReasoningPlan


class FixedMask:
    """Fills a bitmask row with a fixed mask: every token below `vocab_size` except `banned`
    (`fill_bitmask_at`, the call `GrammarMatcher` answers)."""

    def __init__(self, vocab_size: int, banned):
        bits = np.ones(-(-vocab_size // 32) * 32, np.uint8)
        bits[vocab_size:] = 0
        bits[list(banned)] = 0
        self.row = np.packbits(bits, bitorder="little").view(np.int32)

    def fill_bitmask_at(self, address: int, nbytes: int) -> None:
        ctypes.memmove(address, self.row.ctypes.data, nbytes)


@dataclass
class GateStep:
    """What the gate decided for a step outside the answer: `tokens` (accepted draft + the sampled
    token) and `forced` (end marker and separator after them); `answer`: the answer begins after
    them."""

    tokens: list[int]
    forced: list[int]
    answer: bool = False


class ReasoningGate:
    """The phase of one generation (see the module docstring).

    plan: the generation's reasoning plan, or None (no reasoning: the answer from the start).
    vocab_size: the logit width. never: ids never allowed while reasoning (EOS, padding).
    """

    def __init__(self, plan: ReasoningPlan | None, vocab_size: int, never):
        self.plan = plan
        self.tokens = 0  # reasoning tokens so far (end marker included)
        if plan is None:
            self.phase = "answer"
            return
        self.phase = "free" if plan.opened else "start"
        self._start, self._end = plan.tokens.start[0], plan.tokens.end[0]
        self._never = set(never)
        self.free_mask = FixedMask(vocab_size, self._never | {self._start})

    @property
    def answering(self) -> bool:
        return self.phase == "answer"

    @property
    def reasoned(self) -> bool:
        """The output holds a reasoning block (opened by the prompt or by the model)."""
        return self.plan is not None and (self.plan.opened or self.tokens > 0)

    def fill(self, bitmask: TokenBitmask, rows: int) -> None:
        """Fill `rows` bitmask rows inside the block (the "free" phase)."""
        for j in range(rows):
            bitmask.fill(self.free_mask, row=j)

    def allow_start(self, bitmask: TokenBitmask) -> None:
        """In the "start" phase, let the first token open the block (row 0 holds the grammar's mask)."""
        if self.phase == "start":
            bitmask.allow(0, self._start)

    def cut_draft(self, draft: list[int]) -> list[int]:
        """The part of `draft` to verify outside the answer: none at the start (the first token
        decides the phase); inside the block, up to the first marker or EOS and within the budget."""
        if self.phase == "start":
            return []
        assert self.plan is not None  # outside the answer there is a plan
        stop = self._never | {self._start, self._end}
        end = next((i for i, d in enumerate(draft) if d in stop), len(draft))
        return draft[: min(end, self.plan.max_tokens - self.tokens - 1)]

    def advance(self, accepted: list[int], token: int) -> GateStep | None:
        """The step outside the answer after `accepted` draft tokens and the sampled `token`; None
        when `token` begins the answer (it did not open a block), which the grammar then decides."""
        if self.phase == "start":
            if token != self._start:
                self.phase = "answer"
                return None
            self.phase = "free"
            return GateStep([token], [])
        assert self.plan is not None  # outside the answer there is a plan
        t = self.plan.tokens
        tokens = accepted + [token]
        self.tokens += len(tokens)
        if token == self._end:
            forced = list(t.end[1:] + t.separator)
        elif self.tokens >= self.plan.max_tokens:
            forced = list(t.end + t.separator)
        else:
            return GateStep(tokens, [])
        self.phase = "answer"
        return GateStep(tokens, forced, answer=True)

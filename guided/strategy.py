"""`ConstrainedDecodingStrategy`: the runtime's `SamplingStrategy` with a grammar in the loop.

It composes the runtime's pipeline (processors -> mask -> log-softmax -> sampler, speculative
verification) and fills in its hooks:

- `prepare()` fills the bitmask rows of the coming step on the CPU while MLX computes the logits
  (the loop calls it after `mx.async_eval` of the forward pass); llguidance drops the GIL while
  filling. Row j is the mask after the first j draft tokens: the matcher accepts each draft token
  after filling its row.
- `mask()` applies those rows to the logits of every position in one op (-inf where disallowed).
- `check_draft()` cuts a draft at its first token the grammar forbids (before the forward pass),
  and at an EOS (a draft never ends the output).
- `advance()`: the matcher rolls back the draft tokens the target rejected (the loop trims the KV
  cache by the same count), accepts the sampled token, then the jump-forward tokens the grammar
  forces, which go through the model in the same forward pass as the next draft; `Step.forced`
  counts them.
- EOS gating: EOS / end-of-turn ids are in the mask only where the grammar can end. When the grammar
  is finished (nothing but EOS possible) the step ends generation with finish "stop", without
  emitting an end token.
- An engine error (a rejected token, a limit hit while computing a mask) ends generation with
  finish "error" and the engine's message; the partial text is then not valid (`complete` is False).
- Reasoning (thinking models, `reasoning=`): the grammar is switched on after the reasoning block.
  Rather than a grammar `think? answer` (which would make the engine lex free text token by token
  and tie every grammar to a family's markers), the strategy runs in phases: "free" (the first
  token may open a block: the grammar's mask plus the start marker), "thinking" (every token but
  EOS, padding and the start marker; drafts cut at the end marker; after `max_tokens` reasoning
  tokens the end marker and separator are forced) and "answer" (the grammar, from its start; the
  end marker is followed by the forced separator and the grammar's jump-forward tokens).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from guided.bitmask import TokenBitmask
from guided.compiler import CompiledGrammar
from runtime.reasoning import ReasoningTokens
from runtime.sampling import SamplingParams, SamplingStrategy
from runtime.strategy import Step


@dataclass(frozen=True)
class Reasoning:
    """A reasoning block before the constrained answer: the markers' token ids and the most
    reasoning tokens before the end marker is forced (`max_tokens`, >= 1)."""

    tokens: ReasoningTokens
    max_tokens: int = 1024


class _FreeMask:
    """Fills a bitmask row with a fixed mask (`fill_bitmask_at`, as `GrammarMatcher` does)."""

    def __init__(self, vocab_size: int, banned):
        bits = np.ones(-(-vocab_size // 32) * 32, np.uint8)
        bits[vocab_size:] = 0
        bits[list(banned)] = 0
        self.row = np.packbits(bits, bitorder="little").view(np.int32)

    def fill_bitmask_at(self, address: int, nbytes: int) -> None:
        ctypes.memmove(address, self.row.ctypes.data, nbytes)


@dataclass
class GuidedStats:
    """Counters of one generation. forward_passes: steps (each scores all positions of one forward
    pass); tokens_sampled / tokens_jumped / tokens_drafted: tokens chosen by the sampler (accepted
    draft tokens included) / forced by the grammar / accepted from drafts; rollbacks: draft tokens
    rolled back; mask_seconds: CPU time filling masks (s), mostly hidden behind the forward pass;
    masks: mask rows filled; reasoning_tokens: tokens inside the reasoning block (end marker included)."""

    forward_passes: int = 0
    tokens_sampled: int = 0
    tokens_jumped: int = 0
    tokens_drafted: int = 0
    rollbacks: int = 0
    mask_seconds: float = 0.0
    masks: int = 0
    reasoning_tokens: int = 0


class ConstrainedDecodingStrategy(SamplingStrategy):
    """Decoding constrained by a compiled grammar. One per generation; not thread-safe.

    compiled: the grammar (`GrammarCache.get` / `compile_grammar`).
    params: sampling settings.
    bitmask: buffers to reuse across generations of a session (allocated if None); its rows bound
        the draft length (rows - 1).
    jump_forward: append forced tokens without sampling (True) or sample every token.
    want_logprobs: return log-probabilities (after masking) of each sampled token in `Step.logprobs`.
    max_draft: the longest speculative draft (used when the loop passes a drafter).
    reasoning: let a thinking model reason before the constrained answer (`Reasoning`), or None.
    Raises ValueError when the bitmask's width is not the grammar's.
    """

    def __init__(
        self,
        compiled: CompiledGrammar,
        params: SamplingParams | None = None,
        bitmask: TokenBitmask | None = None,
        jump_forward: bool = True,
        want_logprobs: bool = False,
        max_draft: int = 8,
        reasoning: Reasoning | None = None,
    ):
        vocab_size = compiled.tokenizer.vocab_size
        bitmask = bitmask or TokenBitmask(vocab_size, batch=max_draft + 1)
        if bitmask.vocab_size != vocab_size:
            raise ValueError(f"bitmask for {bitmask.vocab_size} tokens, grammar for {vocab_size}")
        super().__init__(params, want_logprobs, max_draft=min(max_draft, bitmask.batch - 1))
        self.compiled = compiled
        self.matcher = compiled.matcher()
        self.bitmask = bitmask
        self.jump_forward = jump_forward
        self.stats = GuidedStats()
        self._rows = 0  # bitmask rows filled for the coming step (0: not yet)
        self.reasoning = reasoning
        self.phase = "answer"  # or "free" / "thinking" (see the module docstring)
        self.prompt_state = "none"  # the prompt's reasoning state (`ReasoningTokens.prompt_state`)
        if reasoning is not None:
            t = reasoning.tokens
            self._free = _FreeMask(
                vocab_size, set(compiled.tokenizer.eos_ids) | compiled.tokenizer.padding_ids | {t.start[0]}
            )

    def begin(self, prompt_ids: list[int], drafter=None) -> None:
        super().begin(prompt_ids, drafter)
        if self.reasoning is not None:
            self.prompt_state = self.reasoning.tokens.prompt_state(prompt_ids)
            self.phase = {"open": "thinking", "free": "free"}.get(self.prompt_state, "answer")

    @property
    def complete(self) -> bool:
        """True if the answer so far is a complete match of the grammar (and no engine error)."""
        return self.phase == "answer" and self.matcher.is_accepting()

    @property
    def error(self) -> str:
        return self.matcher.error

    def prepare(self) -> None:
        """Fill the bitmask rows of the coming step (once per step; a no-op if already filled)."""
        if self._rows:
            return
        t0 = time.perf_counter()
        if self.phase == "thinking":
            for j in range(len(self.draft) + 1):
                self.bitmask.fill(self._free, row=j)
        else:
            for j, token in enumerate(self.draft):
                self.bitmask.fill(self.matcher, row=j)
                self.matcher.accept_token(token)  # checked by check_draft
            self.bitmask.fill(self.matcher, row=len(self.draft))
            if self.phase == "free":
                self.bitmask.allow(0, self.reasoning.tokens.start[0])
        self._rows = len(self.draft) + 1
        self.stats.mask_seconds += time.perf_counter() - t0
        self.stats.masks += self._rows

    def step(self, logits: mx.array) -> Step:
        """logits: mx.array [1 + d, vocab_size] (float32/float16/bfloat16) -> the next Step."""
        if self.phase == "answer" and not self.draft and self.matcher.is_terminated():
            return self._finish()
        self.prepare()
        self._rows = 0
        if self.matcher.error:  # e.g. a lexer limit hit while computing a mask
            return self._finish()
        self.stats.forward_passes += 1
        return super().step(logits)

    def mask(self, logits: mx.array) -> mx.array:
        return self.bitmask.apply(logits)

    def check_draft(self, draft: list[int]) -> list[int]:
        if self.phase == "thinking":  # free text, up to the end marker and within the budget
            t = self.reasoning.tokens
            stop = set(self.matcher.eos_ids) | {t.start[0], t.end[0]}
            end = next((i for i, d in enumerate(draft) if d in stop), len(draft))
            return draft[: min(end, self.reasoning.max_tokens - self.stats.reasoning_tokens - 1)]
        if self.phase == "free":
            return []
        return draft[: self.matcher.valid_prefix(draft)]

    def advance(self, accepted: list[int], token: int) -> Step:
        if self.phase == "free":
            if token == self.reasoning.tokens.start[0]:
                self.phase = "thinking"
                return Step(tokens=[token])
            self.phase = "answer"
        if self.phase == "thinking":
            return self._think(accepted, token)
        rejected = len(self.draft) - len(accepted)
        if rejected and not self.matcher.rollback(rejected):
            return self._finish()
        self.stats.rollbacks += rejected
        self.stats.tokens_drafted += len(accepted)
        self.stats.tokens_sampled += len(accepted) + 1
        if not self.matcher.accept_token(token):
            return self._finish()
        if token in self.matcher.eos_ids:  # allowed only where the grammar can end: the loop stops, emits no text
            return Step(tokens=accepted + [token], verified=len(accepted), finish="stop")
        forced = []
        if self.jump_forward and not self.matcher.is_terminated():
            forced = self.matcher.jump_forward_tokens()
            if forced and not self.matcher.accept_tokens(forced):
                return self._finish()
            self.stats.tokens_jumped += len(forced)
        finish = "stop" if self.matcher.is_terminated() else None
        return Step(tokens=accepted + [token] + forced, verified=len(accepted), finish=finish, forced=len(forced))

    def _think(self, accepted: list[int], token: int) -> Step:
        """A step inside the reasoning block: free tokens; the end marker (sampled, or forced once the
        budget is spent) switches to the answer, after the separator and jump-forward tokens."""
        t = self.reasoning.tokens
        tokens = accepted + [token]
        self.stats.reasoning_tokens += len(tokens)
        self.stats.tokens_sampled += len(tokens)
        self.stats.tokens_drafted += len(accepted)
        if token == t.end[0]:
            forced = list(t.end[1:] + t.separator)
        elif self.stats.reasoning_tokens >= self.reasoning.max_tokens:
            forced = list(t.end + t.separator)
        else:
            return Step(tokens=tokens, verified=len(accepted))
        self.phase = "answer"
        if self.jump_forward:
            jump = self.matcher.jump_forward_tokens()
            if jump and not self.matcher.accept_tokens(jump):
                return self._finish()
            self.stats.tokens_jumped += len(jump)
            forced += jump
        return Step(tokens=tokens + forced, verified=len(accepted), forced=len(forced))

    def _finish(self) -> Step:
        if self.matcher.error:
            return Step(finish="error", message=f"grammar engine: {self.matcher.error}")
        return Step(finish="stop")

    def rollback(self, n: int) -> None:
        """Remove the last `n` generated tokens from the grammar state and the processors' history.
        Raises ValueError if fewer than `n` tokens were accepted."""
        if self._rows:  # prepare() ran: the matcher holds this step's draft
            self.matcher.rollback(self._rows - 1)
            self._rows = 0
        if not self.matcher.rollback(n):
            raise ValueError(f"cannot roll back {n} tokens: only {self.matcher.num_accepted} accepted")
        super().rollback(n)

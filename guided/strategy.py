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
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx

from guided.bitmask import TokenBitmask
from guided.compiler import CompiledGrammar
from runtime.sampling import SamplingParams, SamplingStrategy
from runtime.strategy import Step


@dataclass
class GuidedStats:
    """Counters of one generation. forward_passes: steps (each scores all positions of one forward
    pass); tokens_sampled / tokens_jumped / tokens_drafted: tokens chosen by the sampler (accepted
    draft tokens included) / forced by the grammar / accepted from drafts; rollbacks: draft tokens
    rolled back; mask_seconds: CPU time filling masks (s), mostly hidden behind the forward pass;
    masks: mask rows filled."""

    forward_passes: int = 0
    tokens_sampled: int = 0
    tokens_jumped: int = 0
    tokens_drafted: int = 0
    rollbacks: int = 0
    mask_seconds: float = 0.0
    masks: int = 0


class ConstrainedDecodingStrategy(SamplingStrategy):
    """Decoding constrained by a compiled grammar. One per generation; not thread-safe.

    compiled: the grammar (`GrammarCache.get` / `compile_grammar`).
    params: sampling settings.
    bitmask: buffers to reuse across generations of a session (allocated if None); its rows bound
        the draft length (rows - 1).
    jump_forward: append forced tokens without sampling (True) or sample every token.
    want_logprobs: return log-probabilities (after masking) of each sampled token in `Step.logprobs`.
    max_draft: the longest speculative draft (used when the loop passes a drafter).
    Raises ValueError when the bitmask's width is not the grammar's.
    """

    def __init__(self, compiled: CompiledGrammar, params: SamplingParams | None = None,
                 bitmask: TokenBitmask | None = None, jump_forward: bool = True, want_logprobs: bool = False,
                 max_draft: int = 8):
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

    @property
    def complete(self) -> bool:
        """True if the output so far is a complete match of the grammar (and no engine error)."""
        return self.matcher.is_accepting()

    @property
    def error(self) -> str:
        return self.matcher.error

    def prepare(self) -> None:
        """Fill the bitmask rows of the coming step (once per step; a no-op if already filled)."""
        if self._rows:
            return
        t0 = time.perf_counter()
        for j, token in enumerate(self.draft):
            self.bitmask.fill(self.matcher, row=j)
            self.matcher.accept_token(token)  # checked by check_draft
        self.bitmask.fill(self.matcher, row=len(self.draft))
        self._rows = len(self.draft) + 1
        self.stats.mask_seconds += time.perf_counter() - t0
        self.stats.masks += self._rows

    def step(self, logits: mx.array) -> Step:
        """logits: mx.array [1 + d, vocab_size] (float32/float16/bfloat16) -> the next Step."""
        if not self.draft and self.matcher.is_terminated():
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
        return draft[: self.matcher.valid_prefix(draft)]

    def advance(self, accepted: list[int], token: int) -> Step:
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

"""`ConstrainedDecodingStrategy`: the runtime's `DecodingStrategy` with a grammar in the loop.

Per step (the order of `runtime.sampling`, with the bitmask inserted after the processors):
logits -> logits processors (repetition/presence/frequency penalties) -> bitmask (-inf) ->
log-softmax -> sampler chain -> token -> matcher accepts it -> jump-forward.

- `prepare()` fills the next mask on the CPU while MLX computes the logits (the loop calls it after
  `mx.async_eval` of the forward pass); llguidance drops the GIL while filling.
- Jump-forward: after the sampled token, the tokens the grammar forces are accepted and returned in
  the same `Step`, so the loop runs them through the model in ONE forward pass; `Step.forced` counts them.
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
from runtime.sampling import SamplingParams, TokenHistory
from runtime.strategy import Step


@dataclass
class GuidedStats:
    """Counters of one generation. forward_passes: decode steps (each runs all tokens of one Step
    at once); tokens_sampled / tokens_jumped: tokens chosen by the sampler / forced by the grammar;
    mask_seconds: CPU time filling masks (s), mostly hidden behind the forward pass; masks: masks filled."""

    forward_passes: int = 0
    tokens_sampled: int = 0
    tokens_jumped: int = 0
    mask_seconds: float = 0.0
    masks: int = 0


class ConstrainedDecodingStrategy:
    """Decoding constrained by a compiled grammar. One per generation; not thread-safe.

    compiled: the grammar (`GrammarCache.get` / `compile_grammar`).
    params: sampling settings (validated here; ValueError names a bad one).
    bitmask: buffers to reuse across generations of a session (allocated if None).
    jump_forward: append forced tokens without sampling (True) or sample every token.
    want_logprobs: return log-probabilities (after masking) of each sampled token in `Step.logprobs`.
    """

    def __init__(self, compiled: CompiledGrammar, params: SamplingParams | None = None,
                 bitmask: TokenBitmask | None = None, jump_forward: bool = True, want_logprobs: bool = False):
        self.compiled = compiled
        self.matcher = compiled.matcher()
        self.params = (params or SamplingParams()).validate()
        self.sampler = self.params.make_sampler()
        self.processors = self.params.make_logits_processors()
        self.history = TokenHistory(self.params.repetition_context_size)
        self.bitmask = bitmask or TokenBitmask(compiled.tokenizer.vocab_size)
        if self.bitmask.vocab_size != compiled.tokenizer.vocab_size:
            raise ValueError(f"bitmask for {self.bitmask.vocab_size} tokens, grammar for {compiled.tokenizer.vocab_size}")
        self.eos_ids = frozenset(compiled.tokenizer.eos_ids)
        self.jump_forward = jump_forward
        self.want_logprobs = want_logprobs
        self.stats = GuidedStats()
        self._filled = False

    @property
    def complete(self) -> bool:
        """True if the output so far is a complete match of the grammar (and no engine error)."""
        return self.matcher.is_accepting() and not self.matcher.error

    @property
    def error(self) -> str:
        return self.matcher.error

    def begin(self, prompt_ids: list[int]) -> None:
        self.history.extend(prompt_ids)

    def prepare(self) -> None:
        """Fill the next token bitmask (once per step; a no-op if already filled)."""
        if self._filled:
            return
        t0 = time.perf_counter()
        self.bitmask.fill(self.matcher)
        self.stats.mask_seconds += time.perf_counter() - t0
        self.stats.masks += 1
        self._filled = True

    def step(self, logits: mx.array) -> Step:
        """logits: mx.array [1, vocab_size] (float32/float16/bfloat16) -> the next Step."""
        if self.matcher.is_terminated():
            return self._finish()
        self.prepare()
        self._filled = False
        if self.matcher.error:  # e.g. a lexer limit hit while computing the mask
            return self._finish()
        self.stats.forward_passes += 1
        x = logits.astype(mx.float32)
        if self.processors and self.history.ids:
            tokens = self.history.array()
            for processor in self.processors:
                x = processor(tokens, x)
        x = self.bitmask.apply(x)
        logprobs = x - mx.logsumexp(x, axis=-1, keepdims=True)
        token = int(self.sampler(logprobs).item())
        self.stats.tokens_sampled += 1
        logprobs = logprobs[0] if self.want_logprobs else None
        if not self.matcher.accept_token(token):
            return self._finish()
        if token in self.eos_ids:  # allowed only where the grammar can end: the loop stops, emits no text
            return Step(tokens=[token], finish="stop", logprobs=logprobs)
        tokens = [token]
        if self.jump_forward and not self.matcher.is_terminated():
            forced = self.matcher.jump_forward_tokens()
            if forced and not self.matcher.accept_tokens(forced):
                return self._finish()
            tokens += forced
            self.stats.tokens_jumped += len(forced)
        self.history.extend(tokens)
        finish = "stop" if self.matcher.is_terminated() else None
        return Step(tokens=tokens, finish=finish, forced=len(tokens) - 1, logprobs=logprobs)

    def _finish(self) -> Step:
        if self.matcher.error:
            return Step(finish="error", message=f"grammar engine: {self.matcher.error}")
        return Step(finish="stop")

    def rollback(self, n: int) -> None:
        """Remove the last `n` generated tokens from the grammar state and the processors' history.
        Raises ValueError if fewer than `n` tokens were accepted."""
        if not self.matcher.rollback(n):
            raise ValueError(f"cannot roll back {n} tokens: only {self.matcher.num_accepted} accepted")
        self.history.drop(n)
        self._filled = False

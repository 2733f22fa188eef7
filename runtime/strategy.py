"""The `DecodingStrategy` protocol: what the generation loop asks of a strategy once per step.

The loop (see `runtime.generate`) owns the model, the KV cache and stop handling. Per step it:

1. launches the forward pass for the tokens appended last step plus the strategy's draft (tokens
   proposed for speculative verification) and starts evaluating the logits (`mx.async_eval`);
2. calls `strategy.prepare()`: CPU work that does not need the logits (for guided generation: the
   grammar matcher fills the bitmask rows of every position) overlaps the forward pass here;
3. calls `strategy.step(logits)` with the logits of the last appended token and of each draft
   position, which returns a `Step`: the tokens to append (accepted draft tokens, then one sampled
   token, then any forced ones, e.g. jump-forward), the next draft, an optional rollback, and an
   optional finish reason.

All new tokens of one `Step` and its draft go through the model in ONE forward pass on the next
iteration; draft tokens the next step rejects are trimmed from the KV cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import mlx.core as mx


@dataclass
class Step:
    """The decision of one strategy step.

    tokens: token ids to append, in order (may be empty only when `finish` is set). If one of them
        is an end-of-sequence / end-of-turn id the loop stops there with finish_reason "stop"
        and emits no text for it.
    verified: how many leading `tokens` are draft tokens of the previous step that this step
        accepted: they are already in the KV cache. The loop trims the rest of that draft.
    draft: tokens proposed to follow `tokens`, fed to the model whole in the same forward pass and
        verified by the next step; never emitted unless that step accepts them. The strategy keeps
        it within the budget and the loop's solo rule given to `begin` (`runtime.draft_policy`).
    rollback: number of already generated tokens to remove (from the output and, by trimming, from
        the KV cache) before appending `tokens`.
    finish: when set ("stop", "length", "error"), generation ends after applying this step.
    message: a human-readable reason for "error" finishes.
    forced: how many of `tokens` (the last ones) were forced rather than sampled (jump-forward).
    logprobs: optional log-probabilities of the sampled tokens (the first `len(tokens) - forced`),
        mx.array [sampled, vocab] float32.
    hold: how many trailing tokens of the output (after this step) the strategy may still roll back:
        the loop does not stream their text yet.
    channels: labels of the last `len(channels)` output tokens after this step: this step's
        `tokens` and, before them, earlier tokens still held back (`hold`), which a strategy may
        relabel (None: this step's tokens are unlabelled). The loop reports each token's text under
        its label (`Delta.parts`), e.g. the tool-call segments of a constrained output.

    A step with no tokens and no finish (after a rollback) makes the loop score the last kept token
    again, so the next step has logits to sample from.
    """

    tokens: list[int] = field(default_factory=list)
    verified: int = 0
    draft: list[int] = field(default_factory=list)
    rollback: int = 0
    finish: str | None = None
    message: str | None = None
    forced: int = 0
    logprobs: mx.array | None = None
    hold: int = 0
    channels: list[str | None] | None = None


@runtime_checkable
class Drafter(Protocol):
    """A source of draft tokens for speculative decoding (see `runtime.speculative`)."""

    def propose(self, context: list[int], n: int) -> list[int]:
        """Up to `n` token ids likely to follow `context` (prompt + output so far); may be empty."""


@runtime_checkable
class DecodingStrategy(Protocol):
    """One generation's decoding policy. Not shared between threads or generations."""

    def begin(
        self,
        prompt_ids: list[int],
        drafter: Drafter | None = None,
        *,
        budget: int | None = None,
        solo: Callable[[], bool] | None = None,
    ) -> None:
        """Called once before the first step with the prompt token ids. With a drafter (only then:
        strategies that never speculate may take the prompt alone) also the completion budget
        (max_tokens), which no draft may run past, and the loop's `solo` rule: drafts are fed only
        while it returns True (None: always). No drafter: no speculation, e.g. when the KV cache
        cannot be trimmed."""

    def prepare(self) -> None:
        """CPU work for the coming step, run while MLX computes its logits. May do nothing."""

    def step(self, logits: mx.array) -> Step:
        """Decide the next token(s). `logits`: mx.array [1 + d, vocab] (model dtype) for the last
        appended token and the `d` draft tokens the previous step proposed (the loop feeds a draft
        whole). `vocab` is the model's logit width."""

    def rollback(self, n: int) -> None:
        """Forget the last `n` tokens this strategy returned. The loop calls it when max_tokens cut a
        step of several tokens: the tokens past the budget are never output."""

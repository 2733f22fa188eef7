"""The `DecodingStrategy` protocol: what the generation loop asks of a strategy once per step.

The loop (see `runtime.generate`) owns the model, the KV cache and stop handling. Per step it:

1. launches the forward pass for the tokens appended last step and starts evaluating the logits
   asynchronously (`mx.async_eval`);
2. calls `strategy.prepare()`: CPU work that does not need the logits (for guided generation: the
   grammar matcher fills the next token bitmask) overlaps the forward pass here;
3. calls `strategy.step(logits)`, which returns a `Step`: the tokens to append (the first is
   usually sampled, any further ones are forced, e.g. jump-forward), an optional rollback, and an
   optional finish reason.

All tokens of one `Step` go through the model in ONE forward pass on the next iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import mlx.core as mx


@dataclass
class Step:
    """The decision of one strategy step.

    tokens: token ids to append, in order (may be empty only when `finish` is set). If one of them
        is an end-of-sequence / end-of-turn id the loop stops there with finish_reason "stop"
        and emits no text for it.
    rollback: number of already generated tokens to remove (from the output and, by trimming, from
        the KV cache) before appending `tokens`.
    finish: when set ("stop", "length", "error"), generation ends after applying this step.
    message: a human-readable reason for "error" finishes.
    forced: how many of `tokens` were forced rather than sampled (jump-forward), for stats.
    logprobs: optional log-probabilities of the sampled token, mx.array [vocab] float32.
    """

    tokens: list[int] = field(default_factory=list)
    rollback: int = 0
    finish: str | None = None
    message: str | None = None
    forced: int = 0
    logprobs: mx.array | None = None


@runtime_checkable
class DecodingStrategy(Protocol):
    """One generation's decoding policy. Not shared between threads or generations."""

    def begin(self, prompt_ids: list[int]) -> None:
        """Called once before the first step with the prompt token ids."""

    def prepare(self) -> None:
        """CPU work for the coming step, run while MLX computes its logits. May do nothing."""

    def step(self, logits: mx.array) -> Step:
        """Decide the next token(s). `logits`: mx.array [1, vocab] float32 (model dtype may be
        float16/bfloat16) for the last position. `vocab` is the model's logit width."""

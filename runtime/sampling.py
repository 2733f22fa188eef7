"""Sampling parameters and the default (unconstrained) decoding strategy.

Order of operations per step (the same in the guided strategy, which inserts its bitmask after
step 1):

1. logits processors over the last `repetition_context_size` tokens (prompt + output):
   repetition penalty (multiplicative, sign-aware; Keskar et al. 2019, arXiv:1909.05858),
   presence penalty and frequency penalty (additive, as in OpenAI's API);
2. log-softmax;
3. the sampler chain of mlx-lm (`mlx_lm.sample_utils.make_sampler`): top-p, then min-p, then
   top-k filter the log-probabilities, then a categorical draw at `temperature`; temperature 0 is
   greedy argmax (and ignores the filters).

A `seed` seeds MLX's global random state at the start of a generation, which makes runs with the
same prompt and parameters reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from runtime.strategy import Step


@dataclass
class SamplingParams:
    """Sampling settings. `validate()` raises ValueError naming the parameter and its allowed range."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context_size: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def validate(self) -> "SamplingParams":
        checks = (
            ("temperature", self.temperature >= 0, ">= 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0 (0 disables)"),
            ("min_p", 0 <= self.min_p <= 1, "in [0, 1]"),
            ("repetition_penalty", self.repetition_penalty > 0, "> 0 (1 disables)"),
            ("repetition_context_size", self.repetition_context_size >= 1, ">= 1"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "in [-2, 2]"),
        )
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**64):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name} must be {allowed}, got {getattr(self, name)!r}")
        return self

    def make_sampler(self):
        """mlx-lm sampler: log-probabilities mx.array [1, vocab] -> token mx.array [1] uint32."""
        return make_sampler(self.temperature, top_p=self.top_p if self.top_p < 1 else 0.0, min_p=self.min_p, top_k=self.top_k)

    def make_logits_processors(self):
        """mlx-lm logits processors `(tokens mx.array [n], logits [1, vocab]) -> logits`."""
        n = self.repetition_context_size
        return make_logits_processors(
            repetition_penalty=self.repetition_penalty if self.repetition_penalty != 1 else None,
            repetition_context_size=n,
            presence_penalty=self.presence_penalty or None,
            presence_context_size=n,
            frequency_penalty=self.frequency_penalty or None,
            frequency_context_size=n,
        )


class TokenHistory:
    """The last `size` token ids (prompt and output) as seen by the logits processors."""

    def __init__(self, size: int):
        self.size = size
        self.ids: list[int] = []

    def extend(self, ids) -> None:
        self.ids.extend(ids)
        del self.ids[: -self.size]

    def drop(self, n: int) -> None:
        if n:
            del self.ids[-n:]

    def array(self) -> mx.array:
        return mx.array(self.ids, dtype=mx.int32)


def process_logits(processors, history: TokenHistory, logits: mx.array) -> mx.array:
    """Apply logits processors, then log-softmax. logits: [1, vocab] -> log-probs [1, vocab] float32."""
    logits = logits.astype(mx.float32)
    if processors and history.ids:
        tokens = history.array()
        for processor in processors:
            logits = processor(tokens, logits)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


class SamplingStrategy:
    """The default strategy: processors -> log-softmax -> sampler chain -> one sampled token."""

    def __init__(self, params: SamplingParams | None = None, want_logprobs: bool = False):
        self.params = (params or SamplingParams()).validate()
        self.sampler = self.params.make_sampler()
        self.processors = self.params.make_logits_processors()
        self.history = TokenHistory(self.params.repetition_context_size)
        self.want_logprobs = want_logprobs

    def begin(self, prompt_ids: list[int]) -> None:
        self.history.extend(prompt_ids)

    def prepare(self) -> None:
        pass

    def step(self, logits: mx.array) -> Step:
        logprobs = process_logits(self.processors, self.history, logits)
        token = self.sampler(logprobs)
        tok = int(token.item())
        self.history.extend([tok])
        return Step(tokens=[tok], logprobs=logprobs[0] if self.want_logprobs else None)

    def rollback(self, n: int) -> None:
        self.history.drop(n)

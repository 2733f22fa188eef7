"""`GenerationJob`: one prepared generation, complete, as the engine (or a single-sequence loop,
`coreai.service.run`) runs it. `coreai.service.prepare` makes it; nothing downstream goes back to
the request."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from guided import Constraint
from runtime import SamplingParams
from runtime.reasoning import ReasoningPlan


@dataclass
class GenerationJob:
    """prompt_ids: the rendered prompt's token ids. sampling: checked `SamplingParams`.
    max_tokens: the completion budget in tokens, already cut at the model's context.
    stop: stop strings. constraint: the compiled constraint on the output (`guided.Constraint`),
    or None for free text. logprobs: return per-token logprobs; top_logprobs: how many alternatives
    (0-20) with each. speculative: the speculative-decoding option of `Model.stream`
    ("prompt_lookup", "draft", a draft Model, None). reasoning: the reasoning plan
    (`runtime.reasoning.plan_reasoning`: a thinking model's block, its budget), or None.
    n: the request's choices (`choices()`). origins: pieces carry each token's origin.
    removed: the volatile prompt markers taken out of the messages (`coreai.service.markers`), by
    rule name. capped: the budget asked for above the server's bound, cut to it (`Settings.max_tokens_limit`),
    as the header names it. key: what makes two requests the same generation (`request.resend_key`; None: none)."""

    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop: list[str]
    constraint: Constraint | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    speculative: Any = None
    reasoning: ReasoningPlan | None = None
    n: int = 1
    origins: bool = False
    removed: tuple[str, ...] = ()
    capped: tuple[str, ...] = ()
    key: str | None = None

    def choices(self) -> list[GenerationJob]:
        """The generations of the `n` choices: choice i is seeded `seed + i` (mod 2**64), so seeded
        choices differ from each other and repeat from request to request; they share the
        constraint (each row gets its own `guided.Generation` and bitmask)."""
        one = dataclasses.replace(self, n=1)
        if self.sampling.seed is None:
            return [one] * self.n
        seeds = [(self.sampling.seed + i) % 2**64 for i in range(self.n)]
        return [dataclasses.replace(one, sampling=dataclasses.replace(self.sampling, seed=seed)) for seed in seeds]

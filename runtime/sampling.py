"""Sampling parameters, the sampler (with speculative verification) and the default decoding
strategy, which guided generation extends (`guided.strategy`) rather than copies.

Order of operations per position:

1. logits processors over the last `repetition_context_size` tokens (prompt + output, plus the draft
   tokens before that position): repetition penalty (multiplicative, sign-aware; Keskar et al. 2019,
   arXiv:1909.05858), presence and frequency penalty (additive, as in OpenAI's API);
2. `mask(logits)`: the padding mask here (ids that are no real token); the grammar's bitmask in
   guided generation, which never allows those ids either;
3. log-softmax;
4. the filters of mlx-lm's sampler chain (`mlx_lm.sample_utils`): top-p, then min-p, then top-k, then a
   categorical draw at `temperature`; temperature 0 is greedy argmax (and ignores the filters).

Randomness is per generation and per position: the token at position t (in prompt + output) is drawn
with `mx.random.key` of the generation's seed (the request's `seed`, else fresh entropy) and t, never
from MLX's process-wide state. So a seeded request gives the same output whatever ran before or beside
it, and however many tokens a step drew (drafts).

Speculative verification with a deterministic proposal (prompt lookup, or a draft model decoding
greedily): every position of the step draws its token from the target's processed, masked, filtered
distribution p with its own key, and draft token d is accepted iff it is the token drawn there. Every
emitted token is the one decoding without speculation draws, at any temperature; d is accepted with
probability p(d), as under the rejection rule of speculative sampling (Leviathan et al. 2023,
arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318), which gives the same distribution but not the
same tokens per seed. At temperature 0 the draw is the argmax.
"""

from __future__ import annotations

import math
import numbers
import secrets
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, cast

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from runtime.draft_policy import DraftPolicy
from runtime.errors import ParameterError
from runtime.strategy import Drafter, Step


def check_max_tokens(max_tokens: int, limit: int | None = None, param: str = "max_tokens") -> int:
    """`max_tokens` (a completion budget in tokens) if it is an integer in [1, limit] (no upper
    bound when `limit` is None); the one check of it, beside `SamplingParams`' of the sampling
    ranges. Raises ParameterError naming `param` (the caller's name of the field)."""
    # bool is an Integral: True is a mistake, not 1; numpy's integers are fine
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral) or max_tokens < 1:
        raise ParameterError(f"{param} must be an integer >= 1, got {max_tokens!r}", param)
    if limit is not None and max_tokens > limit:
        raise ParameterError(f"{param} must be <= {limit}, got {max_tokens}", param)
    return int(max_tokens)


@dataclass
class SamplingParams:
    """Sampling settings, checked on construction: `ParameterError` (a ValueError) names the parameter
    (its `param`) and its allowed range."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context_size: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100] (OpenAI's)

    def __post_init__(self):
        checks = (
            ("temperature", math.isfinite(self.temperature) and self.temperature >= 0, "a finite number >= 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0 (0 disables)"),
            ("min_p", 0 <= self.min_p <= 1, "in [0, 1]"),
            (
                "repetition_penalty",
                math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0,
                "a finite number > 0 (1 disables)",
            ),
            ("repetition_context_size", self.repetition_context_size >= 1, ">= 1"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "in [-2, 2]"),
        )
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**64):
            raise ParameterError(f"seed must be an integer in [0, 2**64), got {self.seed!r}", "seed")
        for name, ok, allowed in checks:
            if not ok:
                raise ParameterError(f"{name} must be {allowed}, got {getattr(self, name)!r}", name)
        for token, bias in (self.logit_bias or {}).items():
            ok = type(token) is int and type(bias) in (int, float) and token >= 0 and -100 <= bias <= 100
            if not ok:  # bool is an int: {True: 5} is a mistake, not token 1
                raise ParameterError(
                    f"logit_bias must map token ids >= 0 to values in [-100, 100], got {token!r}: {bias!r}",
                    "logit_bias",
                )

    def check_token_ids(self, vocab_size: int) -> None:
        """Raises ParameterError when `logit_bias` names a token id >= `vocab_size` (a model's logit width)."""
        if self.logit_bias and max(self.logit_bias) >= vocab_size:
            raise ParameterError(
                f"logit_bias names token {max(self.logit_bias)}; the model has {vocab_size} tokens", "logit_bias"
            )

    def make_logits_processors(self):
        """mlx-lm logits processors `(tokens mx.array [n], logits [1, vocab]) -> logits`."""
        n = self.repetition_context_size
        return make_logits_processors(
            logit_bias=self.logit_bias or None,
            repetition_penalty=self.repetition_penalty if self.repetition_penalty != 1 else None,
            repetition_context_size=n,
            presence_penalty=self.presence_penalty or None,
            presence_context_size=n,
            frequency_penalty=self.frequency_penalty or None,
            frequency_context_size=n,
        )


def given_sampling(source: Any) -> dict[str, Any]:
    """The `SamplingParams` fields that `source` (a request body, parsed command-line flags, keyword
    arguments as a dict) gives, by name: its attributes (or keys) of those names that are not None.
    The field names are declared once, on `SamplingParams`; what a front end leaves out takes the
    defaults of whoever builds the params (`coreai.service.prepare`)."""
    get = source.get if isinstance(source, dict) else lambda name: getattr(source, name, None)
    return {f.name: value for f in fields(SamplingParams) if (value := get(f.name)) is not None}


class TokenSampler:
    """Draws tokens from log-probabilities with one generation's own random key.

    params: the temperature and the top-p / min-p / top-k filters (mlx-lm's implementations).
    """

    def __init__(self, params: SamplingParams):
        self.temperature = params.temperature
        self.filters = []
        if params.top_p < 1:
            self.filters.append(lambda x: apply_top_p(x, params.top_p))
        if params.min_p > 0:
            self.filters.append(lambda x: apply_min_p(x, params.min_p))
        if params.top_k > 0:
            self.filters.append(lambda x: apply_top_k(x, params.top_k))
        self.seed = params.seed if params.seed is not None else secrets.randbits(64)

    def _key(self, position: int) -> mx.array:
        """The key of the draw at `position`: the position is spread by SplitMix64's increment (the
        golden ratio, Steele et al. 2014) and mixed by MLX's Threefry generator."""
        return mx.random.key((self.seed + position * 0x9E3779B97F4A7C15) % 2**64)

    def verify(self, logprobs: mx.array, draft: list[int], position: int) -> tuple[int, int]:
        """Accept a prefix of `draft` and draw the token after it (see the module docstring).

        logprobs: mx.array [len(draft) + 1, vocab] float32; row j is the distribution after the
            first j draft tokens. position: the position (in prompt + output) of row 0's token.
        Returns (accepted draft tokens, the next token id).
        """
        k = len(draft)
        if self.temperature == 0:
            best = cast(list[int], mx.argmax(logprobs, axis=-1).tolist())  # mlx types tolist() as any nesting
            i = 0
            while i < k and best[i] == draft[i]:
                i += 1
            return i, best[i]
        scores = logprobs
        for f in self.filters:
            scores = f(scores)
        scores = scores * (1.0 / self.temperature)
        drawn = mx.stack([mx.random.categorical(scores[j], key=self._key(position + j)) for j in range(k + 1)])
        tokens = cast(list[int], drawn.tolist())
        i = 0
        while i < k and tokens[i] == draft[i]:
            i += 1
        return i, tokens[i]


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


class SamplingStrategy:
    """The default strategy: processors -> `mask` -> log-softmax -> sampler, with speculative
    verification of drafts; each step's draft is made and cut by its `runtime.draft_policy.DraftPolicy`
    (`drafts`: the cost model, the solo rule, `check_draft` as its filter, the budget, max_draft).

    params: sampling settings. want_logprobs: return the log-probabilities of sampled tokens in
    `Step.logprobs`. max_draft: the longest draft (tokens per forward pass - 1); 0 disables drafting.
    padding_mask: mx.array [vocab] float32 added to the logits by `mask` (-inf at ids that are no real
    token, `Model.padding_mask`), or None: such ids are then never drawn and have probability 0.

    Subclasses (guided generation) override the hooks `prepare`, `mask`, `check_draft` and `advance`.
    """

    def __init__(
        self,
        params: SamplingParams | None = None,
        want_logprobs: bool = False,
        max_draft: int = 32,
        padding_mask: mx.array | None = None,
    ):
        self.params = params or SamplingParams()
        self.padding_mask = padding_mask
        self.sampler = TokenSampler(self.params)
        self.processors = self.params.make_logits_processors()
        self.history = TokenHistory(self.params.repetition_context_size)
        self.want_logprobs = want_logprobs
        self.drafts = DraftPolicy(max_draft, filter=self.check_draft)
        self.context: list[int] = []  # prompt + output: what drafters match against

    # The policy's state, as the hooks read it.
    @property
    def draft(self) -> list[int]:
        """The draft fed with the coming pass, awaiting verification (token ids)."""
        return self.drafts.draft

    @property
    def drafter(self) -> Drafter | None:
        """The drafter of this generation (None: no drafts)."""
        return self.drafts.drafter

    @property
    def max_draft(self) -> int:
        """The longest draft (tokens)."""
        return self.drafts.max_draft

    def begin(
        self,
        prompt_ids: list[int],
        drafter: Drafter | None = None,
        *,
        budget: int | None = None,
        solo: Callable[[], bool] | None = None,
    ) -> None:
        self.history.extend(prompt_ids)
        self.context = list(prompt_ids)
        self.drafts.begin(len(prompt_ids), drafter, budget=budget, solo=solo)

    def prepare(self) -> None:
        pass

    def mask(self, logits: mx.array) -> mx.array:
        """Hook: restrict logits [rows, vocab] float32 (row j: after the first j draft tokens); here
        the padding mask (guided generation's bitmask replaces it: it never allows those ids)."""
        return logits if self.padding_mask is None else logits + self.padding_mask

    def check_draft(self, draft: list[int]) -> list[int]:
        """Hook: the draft's filter (`DraftPolicy`, cut 4): what of `draft` to verify (all of it here)."""
        return draft

    def advance(self, accepted: list[int], token: int) -> Step:
        """Hook: the step after accepting `accepted` draft tokens and sampling `token`."""
        return Step(tokens=accepted + [token], verified=len(accepted))

    def step(self, logits: mx.array) -> Step:
        fed = self.draft  # the loop fed it whole
        # Greedy decoding without logprobs needs only the argmax, which normalizing does not move, so
        # the log-softmax over the whole vocabulary (a full pass per row per step) is skipped.
        normalize = self.want_logprobs or self.sampler.temperature > 0
        logprobs = self.logprobs(logits, fed, normalize)
        n, token = self.sampler.verify(logprobs, fed, len(self.context))
        self.drafts.observe(n)
        step = self.advance(fed[:n], token)
        if self.want_logprobs:
            step.logprobs = logprobs[: min(n + 1, len(step.tokens) - step.forced)]
        self.history.extend(step.tokens)
        self.context.extend(step.tokens)
        self.drafts.clear()
        if step.finish is None:  # the coming pass: the step's new tokens (none: one re-fed) and the draft
            self.drafts.next(self.context, max(1, len(step.tokens) - step.verified))
        step.draft = self.draft
        return step

    def logprobs(self, logits: mx.array, draft: list[int], normalize: bool = True) -> mx.array:
        """logits [1 + len(draft), vocab] -> processed, masked log-probabilities, same shape, float32
        (normalize=False: the processed, masked scores before the log-softmax)."""
        x = logits.astype(mx.float32)
        if self.processors:
            rows = []
            for j in range(x.shape[0]):
                tokens = mx.array(self.history.ids + draft[:j], dtype=mx.int32)
                row = x[j : j + 1]
                for processor in self.processors:
                    row = processor(tokens, row)
                rows.append(row)
            x = mx.concatenate(rows)
        x = self.mask(x)
        return x - mx.logsumexp(x, axis=-1, keepdims=True) if normalize else x

    def rollback(self, n: int) -> None:
        """Forget the last `n` generated tokens (the loop trims them from the KV cache)."""
        self.history.drop(n)
        del self.context[len(self.context) - n :]
        self.drafts.clear()

"""Draft sources for speculative decoding (the `Drafter` protocol of `runtime.strategy`).

- `PromptLookup`: n-gram match of the last tokens against the prompt and the output so far; the
  tokens that followed the most recent match are the draft (Saxena 2023, "prompt lookup decoding";
  vLLM's `ngram` speculator). No extra model; pays where the output copies its input (extraction,
  tool calls, code edits).
- `DraftModel`: a smaller model sharing the target's tokenizer decodes greedily ahead (as mlx-lm's
  `speculative_generate_step`), with its own KV cache kept in step with the accepted tokens.

Verification (and with it exactness) is the strategy's (`runtime.sampling`); a drafter only guesses.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache


class PromptLookup:
    """Drafts by n-gram lookup. max_ngram / min_ngram: the longest and shortest suffix of the
    context matched (longest first); the most recent earlier occurrence wins."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context: list[int], n: int) -> list[int]:
        if n < 1:
            return []
        for size in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            suffix = context[-size:]
            first = suffix[0]
            # Scan backwards so the most recent match (the likeliest continuation) wins.
            for start in range(len(context) - size - 1, -1, -1):
                if context[start] == first and context[start : start + size] == suffix:
                    return context[start + size : start + size + n]
        return []


class DraftModel:
    """Drafts with a smaller model decoding greedily. `model`: a `runtime.Model` whose tokenizer is
    the target's (same ids). Raises ValueError if its KV cache cannot be trimmed (rollback needs it).
    Not thread-safe; one per generation (its KV cache follows one context)."""

    def __init__(self, model):
        self.model = model
        self.cache = make_prompt_cache(model.network)
        if not can_trim_prompt_cache(self.cache):
            raise ValueError(f"the draft model {model.name} has a KV cache that cannot be trimmed")
        self.tokens: list[int] = []  # what the draft's KV cache holds

    def propose(self, context: list[int], n: int) -> list[int]:
        if n < 1:
            return []
        common = 0
        for a, b in zip(self.tokens, context):
            if a != b:
                break
            common += 1
        common = min(common, len(context) - 1)  # feed at least one token to get logits
        trim_prompt_cache(self.cache, len(self.tokens) - common)
        feed = context[common:]
        self.tokens = list(context)
        draft: list[int] = []
        for _ in range(n):
            logits = self.model.network(mx.array(feed)[None], cache=self.cache)[0, -1]
            token = int(mx.argmax(logits).item())
            draft.append(token)
            feed = [token]
            self.tokens.append(token)
        # The last draft token was never fed: the cache holds context + draft[:-1].
        self.tokens.pop()
        return draft


def make_drafter(speculative, model):
    """The drafter for a `speculative` option: None / False / "off" (no speculation),
    "prompt_lookup", "draft" (the target's `model.draft`), or a `runtime.Model` to draft with.

    Raises ValueError for an unknown option, a missing draft model, or a draft model whose
    vocabulary differs from the target's."""
    if speculative in (None, False, "off", "none"):
        return None
    if speculative == "prompt_lookup":
        return PromptLookup()
    if speculative == "draft":
        speculative = getattr(model, "draft", None)
        if speculative is None:
            raise ValueError('speculative="draft" needs a draft model: coreai.load(..., draft=NAME)')
    if isinstance(speculative, str) or not hasattr(speculative, "network"):
        raise ValueError(f'speculative must be "prompt_lookup", "draft", a Model or None, got {speculative!r}')
    if speculative.tokenizer.hf.get_vocab() != model.tokenizer.hf.get_vocab():
        raise ValueError(f"the draft model {speculative.name} does not share the target's tokenizer")
    return DraftModel(speculative)

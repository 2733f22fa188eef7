"""Reuse of a KV cache across generations that share a prompt prefix (same system prompt, same
tool schemas): only the tokens after the common prefix are prefilled."""

from __future__ import annotations

from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache


class PromptCache:
    """The KV cache of the last generation and the token ids it holds. Not thread-safe: one
    generation at a time uses it (the server's queue guarantees that)."""

    def __init__(self, network):
        self.network = network
        self.tokens: list[int] = []
        self.cache = make_prompt_cache(network)

    def reuse(self, prompt_ids: list[int]) -> int:
        """Trim the cache to the longest common prefix with `prompt_ids`, keeping at least one
        prompt token to prefill (its logits start decoding). Returns the number of reused tokens;
        0 means a fresh cache."""
        common = 0
        for a, b in zip(self.tokens, prompt_ids, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt_ids) - 1)
        excess = len(self.tokens) - common
        if common > 0 and (excess == 0 or can_trim_prompt_cache(self.cache)):
            trim_prompt_cache(self.cache, excess)
            self.tokens = self.tokens[:common]
            return common
        self.cache = make_prompt_cache(self.network)
        self.tokens = []
        return 0

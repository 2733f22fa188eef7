"""KV-memory admission: the running generations' KV caches are bounded in bytes (`KVBudget`), so
that load beyond the machine's memory waits in the queue (or is refused) instead of the kernel's
OOM killer ending the process.

The bound counts a row's worst case: its prompt plus its whole completion budget (`max_tokens`), in
the batch's layout, where rows are left-padded to the longest (mlx-lm's `BatchKVCache`) and grow in
steps of `STEP` tokens: rows x longest x bytes per token. A job joins the batch only when the rows
running and it fit together; a job that could not fit even alone is refused when it is submitted.
The prefix cache has a bound of its own (`prompt_cache_bytes`) and is not counted here.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from runtime import Model

log = logging.getLogger("coreai.service")

STEP = 256  # tokens: mlx-lm's KV caches grow in steps of this many positions
MIN_DEFAULT = 256 << 20  # bytes: the least default bound


def kv_bytes_per_token(model: Model) -> int:
    """Bytes of KV cache one position takes in every layer of `model`: 2 (K and V) x layers x KV
    heads x head size x the compute dtype's item size, from its config (`num_key_value_heads`,
    default `num_attention_heads`; `head_dim`, default hidden size / heads). An upper bound for
    models whose sliding-window layers keep fewer positions. 0 for a config without these keys
    (an architecture this formula does not know: admission is then not bounded, with a warning)."""
    config = model.config.get("text_config", model.config)
    try:
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
        layers = int(config["num_hidden_layers"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        log.warning("KV-memory admission off: the model's config does not give its KV size (%r)", exc)
        return 0
    return 2 * layers * kv_heads * head_dim * _compute_itemsize(model)


def _compute_itemsize(model: Model) -> int:
    """The item size of the network's floating-point parameters (the KV cache's dtype)."""
    for value in _parameters(model):
        if mx.issubdtype(value.dtype, mx.floating):
            return value.dtype.size
    return 4


def _parameters(model: Model) -> list[mx.array]:
    flat: Any = tree_flatten(model.network.parameters())
    return [value for _, value in flat if isinstance(value, mx.array)]


def weights_bytes(model: Model) -> int:
    """Bytes of `model`'s parameters (without evaluating lazy ones)."""
    return sum(value.nbytes for value in _parameters(model))


def physical_memory() -> int | None:
    """The machine's physical memory in bytes (sysconf: Linux, macOS), or None where unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_max_kv_bytes(model: Model, prompt_cache_bytes: int) -> int:
    """The default bound: half of what the machine's memory leaves beside the weights and the
    prefix cache's bound, at least `MIN_DEFAULT` (and `MIN_DEFAULT` where the memory is unknown)."""
    total = physical_memory()
    if total is None:
        return MIN_DEFAULT
    return max(MIN_DEFAULT, (total - weights_bytes(model) - prompt_cache_bytes) // 2)


class KVBudget:
    """The KV bytes the running rows may take together. bytes_per_token: `kv_bytes_per_token`;
    max_bytes: the bound (>= 1). A row is (prompt tokens, max_tokens)."""

    def __init__(self, bytes_per_token: int, max_bytes: int):
        self.bytes_per_token, self.max_bytes = bytes_per_token, max_bytes

    def bytes(self, rows: Sequence[tuple[int, int]]) -> int:
        """Worst-case bytes of `rows` decoding together: rows x the longest (prompt + max_tokens,
        rounded up to `STEP`) x bytes per token."""
        if not rows:
            return 0
        longest = max(prompt + budget for prompt, budget in rows)
        return len(rows) * math.ceil(longest / STEP) * STEP * self.bytes_per_token

    def fits(self, running: Sequence[tuple[int, int]], row: tuple[int, int]) -> bool:
        """Whether `row` may join `running` within the bound."""
        return self.bytes([*running, row]) <= self.max_bytes

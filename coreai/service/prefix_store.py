"""`PrefixStore`: the prefix cache's newest entries kept on disk, so that a restarted server starts
with the KV cache of the prompts it had (an agent's long system prompt and tools, its conversation):
its first request after the restart prefills only what is new, as a later turn does.

Each entry is one mlx-lm prompt-cache file (`mlx_lm.models.cache.save_prompt_cache`: the layers'
KV arrays in safetensors, the prompt's token ids in its metadata), named by the model's fingerprint
(its folder, config and dtype: a cache is only valid for the network that computed it) and a hash of
the tokens. `keep` writes the newest entries when the service stops (not while it serves: writing
hundreds of MB would stall the batch); `restore` reads them back into the prefix cache at start.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import deque
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import LRUPromptCache, load_prompt_cache, save_prompt_cache

log = logging.getLogger("coreai.service")

SUFFIX = ".safetensors"


def fingerprint(model) -> str:
    """A short hash of what a KV cache depends on: the model's folder, config and compute dtype."""
    weights: list[tuple[str, Any]] = tree_flatten(model.network.parameters())  # type: ignore[assignment]
    dtype = str(weights[0][1].dtype) if weights else ""
    text = json.dumps([str(model.path), model.config, dtype], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class KeptPromptCache(LRUPromptCache):
    """mlx-lm's `LRUPromptCache` that remembers the token ids of its newest insertions (at most
    `newest`), for `PrefixStore.keep`."""

    def __init__(self, max_bytes: int, newest: int = 4):
        super().__init__(max_size=1 << 30, max_bytes=max_bytes)  # bounded by bytes only
        self.newest: deque[tuple[Any, tuple[int, ...]]] = deque(maxlen=newest)

    def insert_cache(self, model, tokens, prompt_cache, *, cache_type: str = "assistant"):
        super().insert_cache(model, tokens, prompt_cache, cache_type=cache_type)
        key = (model, tuple(tokens))
        if key in self.newest:
            self.newest.remove(key)
        self.newest.append(key)


class PrefixStore:
    """The folder `folder` of prompt-cache files for the model of fingerprint `model_key`; at most
    `max_bytes` of KV arrays are written (the newest entries first)."""

    def __init__(self, folder: str | Path, model_key: str, max_bytes: int):
        self.folder, self.model_key, self.max_bytes = Path(folder), model_key, max_bytes

    def files(self) -> list[Path]:
        return sorted(self.folder.glob(f"{self.model_key}-*{SUFFIX}"), key=lambda p: p.stat().st_mtime)

    def restore(self, cache: LRUPromptCache, key: Any) -> int:
        """Insert the kept entries into `cache` under `key` (oldest first, so the newest stays most
        recent). Returns the prompt tokens restored; an unreadable file is logged and skipped."""
        restored = 0
        for path in self.files():
            try:
                layers, metadata = load_prompt_cache(str(path), return_metadata=True)
                tokens = json.loads(metadata["tokens"])
                mx.eval([c.state for c in layers])  # loaded now, on this thread (MLX streams are per thread)
            except (OSError, ValueError, KeyError) as exc:
                log.warning("prefix cache file %s not restored: %s", path, exc)
                continue
            cache.insert_cache(key, tokens, layers)
            restored += len(tokens)
        if restored:
            log.info("prefix cache: %d prompt tokens restored from %s", restored, self.folder)
        return restored

    def keep(self, cache: KeptPromptCache) -> int:
        """Write `cache`'s newest entries (newest first, none that is a prefix of one written, at most
        `max_bytes`), replacing the files kept before. Returns the files written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        chosen: list[tuple[tuple[int, ...], list]] = []
        total = 0
        for key, tokens in reversed(cache.newest):
            if any(held[: len(tokens)] == tokens for held, _ in chosen):
                continue
            layers, rest = cache.fetch_nearest_cache(key, list(tokens))
            if layers is None:
                continue
            size = sum(c.nbytes for c in layers)
            if total + size > self.max_bytes:
                break
            chosen.append((tokens[: len(tokens) - len(rest)], layers))
            total += size
        paths = []
        for held, layers in reversed(chosen):  # the newest written last: restored last, most recent
            name = hashlib.sha256(json.dumps(held).encode()).hexdigest()[:16]
            path = self.folder / f"{self.model_key}-{name}{SUFFIX}"
            save_prompt_cache(str(path), layers, {"tokens": json.dumps(held)})
            paths.append(path)
        for old in self.files():
            if old not in paths:
                old.unlink()
        log.info("prefix cache: %d entries (%d bytes) kept in %s", len(paths), total, self.folder)
        return len(paths)

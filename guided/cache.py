"""A bounded, thread-safe LRU of compiled grammars keyed by (grammar text, tokenizer key).

The grammar text is the canonical form of (spec, options): `GrammarSpec.grammar` already encodes
the schema (key order kept), the whitespace/strict/lenient options and the kind. A hit is a dict
lookup under a lock. Two threads missing on the same key may both compile; the first result stays.
With a `GrammarJournal` (`persist`), compiles are recorded on disk and `warm` compiles them again
after a restart.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from guided.compiler import CompiledGrammar, GrammarBackend, LLGuidanceBackend
from guided.errors import GrammarError
from guided.journal import GrammarJournal
from guided.spec import GrammarSpec
from guided.tokenizer_info import TokenizerInfo
from runtime.errors import InputError


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    size: int
    capacity: int


class GrammarCache:
    """LRU of `CompiledGrammar`s. capacity: the number of entries kept (>= 1). Errors are not cached."""

    def __init__(self, capacity: int = 256, backend: GrammarBackend | None = None):
        if capacity < 1:
            raise InputError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.backend = backend or LLGuidanceBackend()
        self._entries: OrderedDict[tuple, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.journal: GrammarJournal | None = None

    def get(self, spec: GrammarSpec, tokenizer: TokenizerInfo) -> CompiledGrammar:
        """The compiled grammar for `spec` and `tokenizer`, compiling on a miss (errors as `compile_grammar`)."""
        key = (self.backend.name, spec.grammar, tokenizer.key)
        with self._lock:
            compiled = self._entries.get(key)
            if compiled is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return compiled
            self.misses += 1
        compiled = self.backend.compile(spec, tokenizer)
        if self.journal is not None and self.journal.tokenizer is tokenizer:
            self.journal.record(spec)
        with self._lock:
            compiled = self._entries.setdefault(key, compiled)
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return compiled

    def persist(self, journal: GrammarJournal | None) -> None:
        """Record every compile for `journal.tokenizer` in `journal` (None: stop recording)."""
        self.journal = journal

    def warm(self, journal: GrammarJournal, limit: int | None = None, stop: threading.Event | None = None) -> int:
        """Compile the journal's specs (most recently used first, at most `limit` or `capacity`)
        into this cache; specs that no longer compile are skipped. `stop`: set from another thread to
        end after the compile under way. Returns how many compiled."""
        done = 0
        for spec in journal.specs()[: min(limit or self.capacity, self.capacity)]:
            if stop is not None and stop.is_set():
                break
            try:
                self.get(spec, journal.tokenizer)
                done += 1
            except (GrammarError, ValueError):
                continue
        return done

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.hits, self.misses, len(self._entries), self.capacity)


default_cache = GrammarCache()

"""Compiled grammars across restarts: a journal of the grammars a process compiled, on disk, which the
next process compiles again in the background at start-up (`GrammarCache.warm`), so its first
requests find them in memory instead of paying the compile.

llguidance 1.9.1 cannot serialize a compiled grammar (`LLMatcher` has no save or load; its lexer
is built lazily from the grammar), so the journal keeps what the compile is a pure function of: the
`GrammarSpec` (grammar text, schema, options). Entries live under
`<root>/<tokenizer fingerprint>-llguidance-<version>/<sha256 of the grammar text>.json`: a grammar
compiled for another tokenizer or engine version is never reused. Unreadable entries are skipped and
removed; at most `max_entries` are kept (least recently compiled or used dropped first).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import llguidance

from guided.spec import GrammarSpec
from guided.tokenizer_info import TokenizerInfo
from runtime.errors import InputError

log = logging.getLogger("coreai.guided")


class GrammarJournal:
    """The specs compiled for one tokenizer, as files under `root` (created on first write).

    Thread-safe: every write goes to a temporary file renamed into place.
    """

    def __init__(self, root: str | os.PathLike, tokenizer: TokenizerInfo, max_entries: int = 4096):
        if max_entries < 1:
            raise InputError(f"max_entries must be >= 1, got {max_entries}")
        self.tokenizer = tokenizer
        self.dir = Path(root) / f"{tokenizer.fingerprint[:16]}-llguidance-{llguidance.__version__}"
        self.max_entries = max_entries

    def _path(self, spec: GrammarSpec) -> Path:
        return self.dir / (hashlib.sha256(spec.grammar.encode()).hexdigest()[:32] + ".json")

    def record(self, spec: GrammarSpec) -> None:
        """Remember `spec` (a compile that succeeded); marks it as recently used if already there."""
        path = self._path(spec)
        try:
            if path.exists():
                os.utime(path)
                return
            self.dir.mkdir(parents=True, exist_ok=True)
            entry = {"kind": spec.kind, "grammar": spec.grammar, "schema": spec.schema, "options": spec.options}
            with tempfile.NamedTemporaryFile("w", dir=self.dir, suffix=".tmp", delete=False, encoding="utf-8") as f:
                json.dump(entry, f, ensure_ascii=False)
            os.replace(f.name, path)
            self._evict()
        except OSError as exc:  # a full or read-only disk costs the next restart a compile, nothing more
            log.warning("grammar journal: cannot write %s: %s", path, exc)

    def _evict(self) -> None:
        entries = sorted(self.dir.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for path in entries[: max(0, len(entries) - self.max_entries)]:
            path.unlink(missing_ok=True)

    def specs(self) -> list[GrammarSpec]:
        """The recorded specs, most recently used first."""
        if not self.dir.is_dir():
            return []
        out = []
        for path in sorted(self.dir.glob("*.json"), key=lambda p: -p.stat().st_mtime):
            try:
                entry = json.loads(path.read_text(encoding="utf-8"))
                out.append(GrammarSpec(entry["kind"], entry["grammar"], entry["schema"], entry["options"]))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("grammar journal: skipping unreadable %s (%s)", path, exc)
                path.unlink(missing_ok=True)
        return out

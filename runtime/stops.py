"""Stop strings matched on decoded text, across token boundaries.

Text that could still be the start of a stop string is held back until it cannot be, so a stop
string is never partly emitted; the stop string itself is trimmed from the output.
"""

from __future__ import annotations


def partial_suffix(text: str, markers) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers` (strings):
    the text a streaming reader holds back because a marker may still be arriving."""
    return max(
        (k for m in markers for k in range(min(len(m) - 1, len(text)), 0, -1) if text.endswith(m[:k])), default=0
    )


class StopStrings:
    def __init__(self, stops: list[str] | None):
        self.stops = [s for s in (stops or []) if s]
        self._pending = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add decoded text. Returns (text safe to emit, the stop string hit or None)."""
        if not self.stops:
            return text, None
        buf = self._pending + text
        hits = [(buf.find(s), s) for s in self.stops if s in buf]
        if hits:
            pos, stop = min(hits)
            self._pending = ""
            return buf[:pos], stop
        keep = partial_suffix(buf, self.stops)
        self._pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        """Text held back at the end of generation (it matched no stop string)."""
        text, self._pending = self._pending, ""
        return text

"""The field policy, one for every dialect (docs/reference/field-policy.md has the table):

(a) fields that change what a valid output is (schemas, `strict`, `tool_choice`, grammars, stop
    sequences) are enforced or refused with a 400 naming them: each dialect's schema and mapping;
(b) hints and provider features a local server honours by its own equivalent or by nothing
    (`context_management`, `cache_control`, `metadata`, `service_tier`, `prompt_cache_key`, ...) are
    accepted, and named in one response header, `x-coreai-ignored`, and in the log, never a 400:
    each dialect lists them as `Hint`s;
(c) hosted tools the server does not run (web search, file search, code interpreter, Anthropic's
    server tools) are left out of what the model sees and named in the same header, unless the
    request forces one (a 400): each dialect's mapping drops them (`hosted`).

Unknown fields stay refused: a field that is neither enforced nor listed is a 400 naming it, so a
new client field is seen, and classed, rather than silently dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("coreai.server")

IGNORED = "x-coreai-ignored"


@dataclass(frozen=True)
class Hint:
    """A field of class (b). path: where it sits in the body, `[]` for every item of a list
    (`tools[].cache_control`, `messages[].content[].cache_control`); instead: what this server does
    in its place (the docs table's last column)."""

    path: str
    instead: str


def _present(node: Any, parts: Sequence[str]) -> bool:
    """Whether the body (JSON data) holds a non-null value at `parts` (`[]` parts: in any item)."""
    if not parts:
        return node is not None
    head, rest = parts[0], parts[1:]
    key, each = head.removesuffix("[]"), head.endswith("[]")
    value = node.get(key) if isinstance(node, dict) else None
    if not each:
        return _present(value, rest)
    return isinstance(value, list) and any(_present(item, rest) for item in value)


def ignored_fields(body: dict, hints: Iterable[Hint]) -> list[str]:
    """The paths of the `hints` that `body` (the request as JSON data) gives."""
    return [hint.path for hint in hints if _present(body, hint.path.split("."))]


def ignored_headers(names: Sequence[str]) -> dict[str, str]:
    """The `x-coreai-ignored` header naming `names` (none: no header); logged once per request."""
    if not names:
        return {}
    log.info("accepted and not applied: %s", ", ".join(names))
    return {IGNORED: ", ".join(names)}

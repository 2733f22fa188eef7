"""Capsules: the opaque `encrypted_content` this server hands out (a reasoning item's, with
`include: ["reasoning.encrypted_content"]`; a `compaction` item's), and opens again when a client
sends the item back.

A capsule is self-contained, so it opens on any server instance and after a restart: the URL-safe
base64 (no padding) of the JSON `{"coreai": 1, "kind": <kind>, "data": <payload>}`, behind the
prefix `coreai1.`. It is not encrypted: the client holds its own conversation's text anyway, and the
name `encrypted_content` is OpenAI's. It is opaque in the sense clients rely on: they store it and
pass it back unchanged.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

PREFIX = "coreai1."
VERSION = 1


class CapsuleError(ValueError):
    """A capsule this server cannot open: not made here, damaged, of another kind or version."""


def seal(kind: str, data: Any) -> str:
    """The capsule of `data` (JSON data) of `kind` ("reasoning", "compaction")."""
    text = json.dumps({"coreai": VERSION, "kind": kind, "data": data}, ensure_ascii=False, separators=(",", ":"))
    return PREFIX + base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def open_capsule(kind: str, capsule: str) -> Any:
    """The data sealed in `capsule`; raises `CapsuleError` unless it is a capsule of `kind` made by
    `seal` (of this version)."""
    if not capsule.startswith(PREFIX):
        raise CapsuleError(f"not a {kind} capsule made by this server (it does not start with {PREFIX!r})")
    body = capsule[len(PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        value = json.loads(raw.decode())
    except (binascii.Error, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CapsuleError(f"a damaged {kind} capsule ({exc})") from None
    if not isinstance(value, dict) or value.get("coreai") != VERSION or value.get("kind") != kind:
        raise CapsuleError(f"not a version-{VERSION} {kind} capsule")
    return value.get("data")

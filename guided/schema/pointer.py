"""JSON pointers (RFC 6901) into schema documents, and local `$ref`s ("#" + a pointer).

A path is a tuple of object keys (str) and array indexes (int): ("a/b", 0) is the pointer "/a~1b/0".
RFC 6901 section 3: "~" is written "~0" and "/" is written "~1"; on parsing "~1" is read before "~0"
(section 4), so "~01" is "~1", not "/".
"""

from __future__ import annotations

from typing import Any

from runtime.errors import InputError


def pointer(path) -> str:
    """The JSON pointer of a path of keys and indexes: ("a/b", 0) -> "/a~1b/0"; () -> ""."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def parse_pointer(text: str) -> tuple[str, ...]:
    """The reference tokens of a JSON pointer, unescaped: "/a~1b/0" -> ("a/b", "0"); "" -> ().

    Raises ValueError for text that is neither empty nor starts with "/".
    """
    if text == "":
        return ()
    if not text.startswith("/"):
        raise InputError(f"a JSON pointer is empty or starts with '/', not {text[:40]!r}")
    return tuple(part.replace("~1", "/").replace("~0", "~") for part in text[1:].split("/"))


def local_ref(ref) -> tuple[str, ...] | None:
    """The reference tokens of a local `$ref` ("#" -> (), "#/$defs/a~1b" -> ("$defs", "a/b")); None for
    any other value (a remote or relative URI, an anchor "#name", not a string)."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    return parse_pointer(ref[1:])


def _step(node, token: str):
    """(key, child) of `node` for one reference token (an int key for a list), or None if absent."""
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return int(token), node[int(token)]
    if isinstance(node, dict) and token in node:
        return token, node[token]
    return None


def resolve_pointer(root, text: str) -> tuple[tuple, Any] | None:
    """(path, value) the JSON pointer `text` names in `root`; None if it names nothing.

    Raises ValueError for text that is not a JSON pointer (see `parse_pointer`)."""
    node, path = root, tuple[Any, ...]()
    for token in parse_pointer(text):
        step = _step(node, token)
        if step is None:
            return None
        path, node = path + (step[0],), step[1]
    return path, node


def resolve_local_ref(root, ref) -> tuple[tuple, Any] | None:
    """(schema path, subschema) a local `$ref` ("#", "#/$defs/a~1b", "#/allOf/0") points to in
    `root`; None for any other ref or a pointer to nothing."""
    return None if local_ref(ref) is None else resolve_pointer(root, ref[1:])


def path_of(root, text: str) -> tuple:
    """The path a JSON pointer names in `root`: its tokens, with ints where `root` has a list there.
    Tokens past the end of the document are kept as strings.

    Raises ValueError for text that is not a JSON pointer (see `parse_pointer`)."""
    path, node = tuple[Any, ...](), root
    for token in parse_pointer(text):
        step = _step(node, token)
        path, node = (path + (step[0],), step[1]) if step else (path + (token,), None)
    return path


def get(root, path: tuple, default=None):
    """The value at `path` in `root`, or `default` when the path leaves the document."""
    for key in path:
        try:
            root = root[key]
        except (KeyError, IndexError, TypeError):
            return default
    return root

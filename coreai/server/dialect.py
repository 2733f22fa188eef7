"""What a dialect package gives the shell (`Dialect`), so that the shell (`coreai/server/*.py`) names
no dialect: the app mounts each dialect's routes, answers errors under its paths in its shape, lists
its error shape and streaming routes in the OpenAPI document, reads its union tags when it names a
field at fault, and renders the model list in its shape when a request asks for it by header."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from coreai.server.errors import ErrorShape


@dataclass(frozen=True)
class ModelShape:
    """The model list and card in a dialect's shape, for a request carrying `header` (the SDK's
    `models.list` / `retrieve`). listing(ids, created) and card(id, created): the bodies, `created`
    in Unix seconds."""

    header: str
    listing: Callable[[list[str], int], dict[str, Any]]
    card: Callable[[str, int], dict[str, Any]]


@dataclass(frozen=True)
class Dialect:
    """One dialect package, as the shell sees it.

    install: mounts its routes on the app. error_shapes: path prefix -> its error response (paths
    outside every prefix answer OpenAI's shape, `coreai.server.errors`). error_schemas: path prefix
    -> (its error body as JSON Schema, extra statuses it answers) for the OpenAPI document.
    streaming_paths: its routes that answer `stream: true` with server-sent events. union_tags: the
    discriminator values of its request models' unions, which pydantic puts in an error's location
    (never a field's name: `errors.field_path` skips them). models: its model list shape, if any."""

    install: Callable[[FastAPI], None]
    error_shapes: Mapping[str, ErrorShape] = field(default_factory=dict)
    error_schemas: Mapping[str, tuple[dict[str, Any], tuple[str, ...]]] = field(default_factory=dict)
    streaming_paths: tuple[str, ...] = ()
    union_tags: frozenset[str] = frozenset()
    models: ModelShape | None = None

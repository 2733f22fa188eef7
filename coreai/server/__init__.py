"""llm-server: a local OpenAI-compatible HTTP server (FastAPI + uvicorn) whose `response_format`,
`structured_outputs` and `tools` are enforced by guided generation.

    from coreai.server import ServerConfig, create_app
    app = create_app(coreai.load(), ServerConfig(api_key="..."))

The names are imported when first used, so `coreai.server.config` (the settings, which the command
line reads for its defaults) loads without FastAPI.
"""

from __future__ import annotations

import importlib

__all__ = ["ServerConfig", "create_app"]

_HOMES = {"ServerConfig": "coreai.server.config", "create_app": "coreai.server.app"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

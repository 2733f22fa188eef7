"""The playground: a single page at `/` (static files in `coreai/server/static`, shipped as package
data; no build step, no CDN) that talks to this server's public `/v1` API only, with the opt-in
`token_provenance` stream extension (`coreai.server.openai.provenance`) for its token marks."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"


def install(app: FastAPI) -> None:
    """Serve the page at `/` and its scripts and styles under `/playground/`. Both stay open under
    `--api-key`: they hold no data; the page asks for the key and sends it with its `/v1` requests."""
    app.mount("/playground", StaticFiles(directory=STATIC), name="playground")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

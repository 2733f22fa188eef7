"""Run the server in a background thread of this process (tests, benchmarks, notebooks)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator

import uvicorn

from coreai.server.app import ServerConfig, create_app


@contextlib.contextmanager
def serve_in_thread(
    model, config: ServerConfig | None = None, host: str = "127.0.0.1", start_timeout: float = 60.0
) -> Iterator[str]:
    """A real uvicorn server for `model` on a free port of `host`; yields its base URL
    ("http://127.0.0.1:PORT") and shuts it down on exit. Raises RuntimeError if it does not start
    within `start_timeout` seconds."""
    app = create_app(model, config)
    sock = socket.socket()
    sock.bind((host, 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="coreai-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()

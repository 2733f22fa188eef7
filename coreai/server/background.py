"""Running the app under uvicorn: `Server`, which drains the generation worker when uvicorn shuts
down, and `serve_in_thread`, the server in a background thread of this process (tests, benchmarks,
notebooks)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from fastapi.concurrency import run_in_threadpool

from coreai.server.app import ServerConfig, create_app
from guided import GrammarCache

GRACE_AFTER_DRAIN = 30  # seconds for responses to finish writing once their generations ended
# Seconds one exchange between the ranks may take once a distributed rank 0 stops (`Leader.stopping`):
# a step longer than that then counts as the cluster lost (503, exit code 3).
STOPPING_RANK_TIMEOUT = 5.0


class Server(uvicorn.Server):
    """uvicorn's server for an app of `create_app`. On shutdown (Ctrl-C, SIGTERM, `should_exit`) it
    first drains the generation worker: no new generations (503), `shutdown_timeout` seconds for the
    running ones, then they are cancelled; so the responses end themselves (finish_reason
    "cancelled") rather than uvicorn cancelling their tasks mid-write. Then uvicorn's own shutdown
    and the app's lifespan shutdown, which joins the worker and journal threads. On a distributed
    rank 0 an exchange with the other ranks may take `STOPPING_RANK_TIMEOUT` s from then on."""

    def __init__(self, app, **options):
        state = app.state.server
        super().__init__(uvicorn.Config(app, timeout_graceful_shutdown=GRACE_AFTER_DRAIN, **options))
        self.state = state

    async def shutdown(self, sockets=None) -> None:
        if (leader := self.state.model.leader) is not None:  # the other ranks may be gone: a short bound
            leader.stopping(STOPPING_RANK_TIMEOUT)
        await run_in_threadpool(self.state.worker.drain, self.state.config.shutdown_timeout)
        await super().shutdown(sockets)


@contextlib.contextmanager
def serve_in_thread(
    model,
    config: ServerConfig | None = None,
    host: str = "127.0.0.1",
    start_timeout: float = 60.0,
    grammar_cache: GrammarCache | None = None,
) -> Iterator[str]:
    """A real uvicorn server for `model` on a free port of `host` (`create_app(model, config,
    grammar_cache)`); yields its base URL ("http://127.0.0.1:PORT") and shuts it down on exit
    (running requests get `shutdown_timeout`, then the worker is joined). Raises RuntimeError if it
    does not start within `start_timeout` seconds."""
    config = config or ServerConfig()
    app = create_app(model, config, grammar_cache)
    sock = socket.socket()
    sock.bind((host, 0))
    uv_config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=config.shutdown_timeout,  # type: ignore[arg-type]  # a float works (asyncio timeout)
    )
    server = uvicorn.Server(uv_config)
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
        thread.join(config.shutdown_timeout + GRACE_AFTER_DRAIN + 60)  # drain, responses, the threads' join
        if thread.is_alive():
            raise RuntimeError("the server did not stop")
        sock.close()

"""One worker thread in front of the model, with a bounded admission queue.

MLX is not safe for concurrent graphs on one model, and the prompt (KV) cache is shared, so every
generation runs on a single thread, one at a time. Requests wait in a FIFO; at most `max_queue` may
wait besides the running one, and `submit` refuses the rest (`QueueFull`, answered 429 with a
Retry-After estimated from recent job durations).

A job is a generator function `work(cancel: threading.Event)` run on the worker; each item it yields
is handed to the event loop (`Job.get`). Setting `cancel` (a client disconnected) makes the runtime
stop at its next step, and a job cancelled while waiting is skipped, so the worker is freed at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from typing import Any, Callable, Iterator

log = logging.getLogger("coreai.server")

_END = object()


class QueueFull(Exception):
    """The queue is full. `retry_after`: seconds (>= 1) until a slot is likely free."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy; retry after {retry_after} s")
        self.retry_after = retry_after


class Job:
    """One unit of work and the channel its results come back through (to one asyncio loop)."""

    def __init__(self, work: Callable[[threading.Event], Iterator[Any]], loop: asyncio.AbstractEventLoop):
        self.work = work
        self.cancel = threading.Event()
        self._loop = loop
        self._items: asyncio.Queue = asyncio.Queue()

    def _put(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed (server shutting down): nobody is listening
            self.cancel.set()

    async def get(self) -> Any:
        """The next item; `Job.END` when the work is done. Re-raises an exception the work raised."""
        item = await self._items.get()
        if isinstance(item, BaseException):
            raise item
        return item

    END = _END


class Worker:
    """The generation thread and its bounded queue.

    max_queue: requests allowed to wait while one runs (>= 0).
    """

    def __init__(self, max_queue: int):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.max_queue = max_queue
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._admitted = 0  # waiting + running
        self._mean_seconds = 5.0  # moving average of job durations, for Retry-After
        self._thread = threading.Thread(target=self._run, name="coreai-generation", daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[threading.Event], Iterator[Any]]) -> Job:
        """Queue `work` and return its Job. Must be called on the event loop that will read it.
        Raises QueueFull when `max_queue` requests already wait."""
        with self._lock:
            if self._admitted > self.max_queue:
                # One job finishing frees one slot: about one mean job duration from now.
                raise QueueFull(max(1, math.ceil(self._mean_seconds)))
            self._admitted += 1
        job = Job(work, asyncio.get_running_loop())
        self._jobs.put(job)
        return job

    @property
    def busy(self) -> int:
        """Requests waiting or running."""
        return self._admitted

    def close(self) -> None:
        """Stop the thread after the running job (waiting jobs are cancelled)."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            start = time.perf_counter()
            try:
                if not job.cancel.is_set():
                    for item in job.work(job.cancel):
                        job._put(item)
            except Exception as exc:  # noqa: BLE001 - delivered to the request, which maps or logs it
                job._put(exc)
            finally:
                job._put(_END)
                with self._lock:
                    self._admitted -= 1
                    self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.perf_counter() - start)
        while not self._jobs.empty():  # closing: release whoever still waits
            if (job := self._jobs.get_nowait()) is not None:
                job.cancel.set()
                job._put(_END)

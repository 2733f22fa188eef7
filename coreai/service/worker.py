"""One worker thread in front of the model, running a batch of generations (`coreai.service.engine`),
with a bounded admission queue.

MLX is not safe for concurrent graphs on one model, so every generation runs on a single thread: the
worker steps one batch (`Batch`, the engine's `runtime.batch.BatchGenerator`), where up to
`max_batch` generations decode together. Requests beyond that wait in a FIFO and join the batch as
rows free up; at most `max_queue` may wait, and `submit` refuses the rest (`QueueFull`, answered 429
with a Retry-After estimated from recent job durations).

A job carries its parameters; the batch delivers each job's items (`Job.put`) to the event loop
(`Job.get`). Setting `cancel` (a client disconnected) makes the runtime end that row at its next
step; a job cancelled while waiting is dropped from the queue before the next admission (or `load`)
is counted and before the worker takes a job, so its place is freed at once, not when a row frees.

The worker owns its batch (the batch knows nothing of the worker). `start` starts the thread;
`drain` stops admitting (`Closed`) and gives the jobs a grace period; `close` stops it in order:
waiting jobs released, running rows cancelled and stepped until they leave, then the thread is
joined, so nothing touches MLX after.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("coreai.service")

_END = object()


class QueueFull(Exception):
    """The queue is full. `retry_after`: seconds (>= 1) until a slot is likely free."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy; retry after {retry_after} s")
        self.retry_after = retry_after


class Closed(Exception):
    """The worker admits no more jobs: shutting down, or `reason` (e.g. a lost distributed model)."""

    def __init__(self, reason: str = "the server is shutting down"):
        super().__init__(reason)


class Batch(Protocol):
    """What the worker steps: `start(job)` adds a job's generation (raising for that job only);
    `step()` advances every running generation once and returns the jobs that ended (their last
    item delivered); `len()` is the number running; `close()` runs on the worker thread once it
    has stopped (the engine keeps its prefix cache on disk there)."""

    def __len__(self) -> int: ...

    def start(self, job: Job) -> None: ...

    def step(self) -> list[Job]: ...

    def close(self) -> None: ...


class Job:
    """One request's generation (`params`, given to the batch) and the channel its results come back
    through (to one asyncio loop). `read`: items its readers have taken. `on_release`: what `release`
    does instead of cancelling (the service's resend coalescing), or None. `released`: its reader
    has let go (a later `release` does nothing until a new reader takes it)."""

    def __init__(self, params: Any, loop: asyncio.AbstractEventLoop):
        self.params = params
        self.cancel = threading.Event()
        self.started = 0.0  # time.perf_counter() when it joined the batch
        self.read = 0
        self.released = False
        self.on_release: Callable[[Job], None] | None = None
        self._loop = loop
        self._items: asyncio.Queue = asyncio.Queue()

    def release(self) -> None:
        """Its reader stops reading (done, or the client left; call it once the reader reads no
        more): the job is cancelled (a no-op once it ended), or handed to `on_release`. Once per
        reader: the paths that may each let go of a job (a stream's end, the request's) release it once."""
        if self.released:
            return
        self.released = True
        if self.on_release is None:
            self.cancel.set()
        else:
            self.on_release(self)

    def put(self, item) -> None:
        """Deliver an item (from the worker thread)."""
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed (server shutting down): nobody is listening
            self.cancel.set()

    async def get(self) -> Any:
        """The next item; `Job.END` when the work is done. Re-raises an exception the work raised."""
        item = await self._items.get()
        self.read += 1
        if isinstance(item, BaseException):
            raise item
        return item

    END = _END


class Worker:
    """The generation thread, its batch and its bounded queue.

    max_queue: requests allowed to wait while `max_batch` run (>= 0). max_batch: requests running
    together (>= 1); both checked by `ServerConfig`. batch: what runs them, owned by the worker.
    heartbeat: (seconds, call) made on the worker thread after each such idle period (a distributed
    model's rank 0 keeping the other ranks, which wait on it, alive), or None.
    admit: `admit(running_params, params)`, whether the waiting job of `params` may join the jobs
    running now (a memory bound, `coreai.service.memory`); the oldest waiting job that may not
    holds the others behind it (first come, first served) until rows leave. None: always.
    Jobs submitted before `start` wait for it.
    """

    def __init__(
        self,
        max_queue: int,
        max_batch: int,
        batch: Batch,
        heartbeat: tuple[float, Callable[[], None]] | None = None,
        admit: Callable[[list[Any], Any], bool] | None = None,
    ):
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.batch = batch
        # The waiting jobs live under the lock, not in a queue.Queue, so that a job cancelled while it
        # waits can be taken out at once (`_release_cancelled`) instead of when the worker reaches it.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # notified when a job arrives or the worker closes
        self._left = threading.Condition(self._lock)  # notified when a job ends or leaves the queue
        self._admitting = True
        self._refusal = "the server is shutting down"  # what `submit` says once admissions stop
        self._heartbeat = heartbeat
        self._admit = admit
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: set[Job] = set()  # taken by the worker thread, not yet done
        self._closing = False
        self._mean_seconds = 5.0  # moving average of job durations, for Retry-After
        self._thread = threading.Thread(target=self._run, name="coreai-generation", daemon=True)

    def start(self) -> None:
        """Start the generation thread."""
        self._thread.start()

    def submit(self, params: list[Any]) -> list[Job]:
        """Queue a job for each of `params` (a request's choices), all or none, and return them. Must
        be called on the event loop that will read them. Raises QueueFull when they would not all fit
        beside the `max_batch` running and `max_queue` waiting, Closed once `drain` or `close` was called."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._admitting:
                raise Closed(self._refusal)
            self._release_cancelled()
            if len(self._running) + len(self._waiting) + len(params) > self.max_batch + self.max_queue:
                # One job finishing frees one slot: about one mean job duration over the batch from now.
                raise QueueFull(max(1, math.ceil(self._mean_seconds / self.max_batch)))
            jobs = [Job(p, loop) for p in params]
            self._waiting.extend(jobs)
            self._wake.notify()
        return jobs

    def load(self) -> tuple[int, int]:
        """(running, waiting): jobs in the batch (or joining it) and jobs waiting for a row; a
        request's n choices count n."""
        with self._lock:
            self._release_cancelled()
            return len(self._running), len(self._waiting)

    def running(self) -> list[Any]:
        """The params of the jobs in the batch (or joining it)."""
        with self._lock:
            return [j.params for j in self._running]

    def fail(self, error: Exception) -> None:
        """Admit no more jobs (`submit` raises Closed with the error's message) and end every running
        and waiting one with `error` now, from this thread: the worker thread may never return (a
        lost distributed model's collective), so a waiting job would never be taken."""
        with self._lock:
            self._admitting, self._refusal = False, str(error)
            for job in self._running:
                job.put(error)  # its reader raises it and stops reading
            for job in self._waiting:
                job.cancel.set()
                job.put(error)
            self._waiting.clear()
            self._left.notify_all()

    def drain(self, grace: float) -> None:
        """Stop admitting (`submit` raises Closed), wait up to `grace` seconds for the running and
        waiting jobs to end, then cancel the rest (`close` without waiting)."""
        deadline = time.monotonic() + grace
        with self._lock:
            self._admitting = False
            self._release_cancelled()
            while (self._running or self._waiting) and (left := deadline - time.monotonic()) > 0:
                self._left.wait(left)
                self._release_cancelled()
        self.close(timeout=0)

    def close(self, timeout: float | None = None) -> bool:
        """Stop the thread and wait for it (at most `timeout` seconds; None: as long as it takes): no
        more admissions, waiting jobs released, running ones cancelled (they end at their next step,
        within a forward pass or a prefill chunk). Returns whether the thread has ended."""
        with self._lock:
            self._admitting = False
            self._closing = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _release_cancelled(self) -> None:
        """Drop the waiting jobs whose request is gone, ending them (with the lock held)."""
        for job in [j for j in self._waiting if j.cancel.is_set()]:
            self._waiting.remove(job)
            job.put(_END)
            self._left.notify_all()

    def _take(self, room: int, block: bool) -> list[Job] | None:
        """Up to `room` waiting jobs, oldest first, now counted as running; waits for one if `block`
        (with a heartbeat: at most its period, then [] and the heartbeat is due). None when the
        worker is closing."""
        with self._lock:
            self._release_cancelled()
            while block and not self._waiting and not self._closing:
                if not self._wake.wait(self._heartbeat[0] if self._heartbeat else None):
                    return []
                self._release_cancelled()
            if self._closing:
                return None
            jobs: list[Job] = []
            while self._waiting and len(jobs) < room:
                running = [j.params for j in (*self._running, *jobs)]
                if running and self._admit is not None and not self._admit(running, self._waiting[0].params):
                    break  # it waits for rows to leave (alone, every job is admitted)
                jobs.append(self._waiting.popleft())
            self._running.update(jobs)
            return jobs

    @staticmethod
    def _beat(heartbeat: Callable[[], None]) -> None:
        try:
            heartbeat()
        except Exception:  # noqa: BLE001 - its failure is reported by the heartbeat itself (a lost cluster)
            log.debug("heartbeat failed", exc_info=True)

    def _done(self, job: Job) -> None:
        job.put(_END)
        with self._lock:
            self._running.discard(job)
            self._left.notify_all()
            if job.started:
                self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.perf_counter() - job.started)

    def _run(self) -> None:
        running: list[Job] = []
        closing = False
        while not closing or running:
            if not closing:
                jobs = self._take(self.max_batch - len(running), block=not running)
                if jobs is None:
                    closing, jobs = True, []
                    for j in running:
                        j.cancel.set()
                for job in jobs:
                    if job.cancel.is_set():  # cancelled since it was taken
                        self._done(job)
                        continue
                    try:
                        job.started = time.perf_counter()
                        self.batch.start(job)
                        running.append(job)
                    except Exception as exc:  # noqa: BLE001 - delivered to the request, which maps or logs it
                        job.put(exc)
                        self._done(job)
            if not running:
                if self._heartbeat is not None and not closing:
                    self._beat(self._heartbeat[1])
                continue
            try:
                ended = self.batch.step()
            except Exception as exc:  # noqa: BLE001 - a failed forward pass ends every running job
                ended = list(running)
                for job in ended:
                    job.put(exc)
            for job in ended:
                running.remove(job)
                self._done(job)
        with self._lock:  # closing: release whoever still waits
            for job in self._waiting:
                job.cancel.set()
                job.put(_END)
            self._waiting.clear()
        try:
            self.batch.close()
        except Exception:  # noqa: BLE001 - a failure to keep the cache must not hide the stop
            log.exception("closing the batch engine failed")

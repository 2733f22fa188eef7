"""Resend coalescing: a request sent again while its first copy still runs attaches to that copy.

An agent CLI whose stream stays silent too long (a long prompt prefilling on a CPU) gives up,
closes the connection and sends the identical request again: Claude Code after its stream-idle
watchdog, the SDKs after a read timeout. Cancelling the first copy would throw its prefill away and
the resend would start from scratch (seen: Claude Code's first request cut at 300 s, its resend
prefilling another 472 s). Instead, a job whose reader left before taking anything from it is held
for `grace` seconds under its request's key (`coreai.service.request.resend_key`); a request of
the same key in that time gets the held job itself, whose items (nothing, or the whole answer if
it ended meanwhile) it reads from the start. One prefill, and no wait behind it in the queue. A held
job nobody claims is cancelled when the grace ends, which frees its row and its KV cache.

A job a reader took anything from is cancelled at once as before: a resend must not get half an
answer. Two live requests with the same key are never joined (each may want its own sample).
"""

from __future__ import annotations

import asyncio
import logging

from coreai.service.worker import Job

log = logging.getLogger("coreai.service")

RESEND_GRACE = 15.0  # seconds a job whose reader left waits for a resend (Claude Code retries within ~10 s)


class Resends:
    """The jobs held for a resend, by key (on the event loop's thread only), each `grace` seconds
    (None: `RESEND_GRACE`). Counters: `held`
    (jobs held when their reader left), `attached` (resends that got a held job), `expired` (held
    jobs cancelled with no resend)."""

    def __init__(self, grace: float | None = None):
        self.grace = RESEND_GRACE if grace is None else grace
        self._held: dict[str, tuple[Job, asyncio.TimerHandle]] = {}
        self.held = self.attached = self.expired = 0

    def release(self, job: Job) -> None:
        """`job`'s reader is gone: hold the job for a resend (a key, nothing read, not cancelled,
        no other job held under its key) or cancel it (see the module docstring)."""
        key = job.params.key
        if key is None or job.read or job.cancel.is_set() or key in self._held:
            job.cancel.set()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (shutting down): nobody can resend
            job.cancel.set()
            return
        self._held[key] = (job, loop.call_later(self.grace, self._expire, key, job))
        self.held += 1
        log.info("client left before the first token: its job waits %.0f s for a resend", self.grace)

    def attach(self, key: str | None) -> Job | None:
        """The job held under `key` (taken out, its reader now the caller), or None."""
        held = self._held.pop(key, None) if key is not None else None
        if held is None:
            return None
        job, timer = held
        timer.cancel()
        if job.cancel.is_set():  # cancelled meanwhile (the worker closed): start afresh
            return None
        job.released = False  # the caller is its reader now
        self.attached += 1
        log.info("a resend attached to the job still running for it")
        return job

    def _expire(self, key: str, job: Job) -> None:
        if self._held.get(key, (None,))[0] is job:
            del self._held[key]
            job.cancel.set()
            self.expired += 1

"""`Service`: one model's generation service, with no HTTP in it: the settings every request gets,
the compiled grammars, and the worker thread with its batch engine. The server (`coreai.server`)
maps each API dialect's request into a `GenerationRequest`, then calls `prepare` (on a thread-pool
thread) and `submit`, and renders the jobs' events; the CLI and `coreai.ConstrainedSession` use the
same `prepare` and run the job alone (`coreai.service.run`)."""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable

import mlx.core as mx

from coreai.service.engine import Engine
from coreai.service.job import GenerationJob
from coreai.service.memory import KVBudget, default_max_kv_bytes, kv_bytes_per_token
from coreai.service.prepare import Settings, prepare
from coreai.service.request import GenerationRequest, Names, RequestError
from coreai.service.resend import Resends
from coreai.service.worker import Job, Worker
from guided import GrammarCache, TokenizerInfo, get_tokenizer_info
from runtime import Model

log = logging.getLogger("coreai.service")


class Service:
    """Generation for `model`. settings: the defaults and bounds of every request (`Settings`; its
    `guided` is set here, from whether the grammar engine can use the tokenizer). cache: the
    compiled grammars. max_batch: requests decoding together (>= 1); max_queue: requests allowed
    to wait beside them (>= 0); prompt_cache_bytes: the prefix cache's bound (0: off);
    prompt_cache_dir: where the prefix cache is kept across restarts (None: not kept).
    heartbeat: (seconds, call) the idle worker makes (a distributed rank 0), or None.
    max_kv_bytes: the KV-cache bytes the running rows may take together (`memory.KVBudget`; None:
    `memory.default_max_kv_bytes`); a job that does not fit waits for rows to leave.
    Builds the grammar engine's view of the tokenizer (a few seconds, once per tokenizer per
    process); the worker runs between `start` and `worker.close`."""

    def __init__(
        self,
        model: Model,
        settings: Settings,
        cache: GrammarCache,
        *,
        max_batch: int = 8,
        max_queue: int = 16,
        prompt_cache_bytes: int = 1 << 30,
        prompt_cache_dir: str | None = None,
        heartbeat: tuple[float, Callable[[], None]] | None = None,
        max_kv_bytes: int | None = None,
    ):
        self.model, self.cache = model, cache
        self.tokenizer_info: TokenizerInfo | None
        try:
            self.tokenizer_info = get_tokenizer_info(model.tokenizer, model.vocab_size, model.tokenizer.eos_ids)
        except ValueError as exc:
            log.warning("guided generation disabled: %s", exc)
            self.tokenizer_info = None
        self.settings = dataclasses.replace(settings, guided=self.tokenizer_info is not None)
        self.max_batch, self.max_queue = max_batch, max_queue
        if max_kv_bytes is None:
            max_kv_bytes = default_max_kv_bytes(model, prompt_cache_bytes)
        self.kv = KVBudget(kv_bytes_per_token(model), max_kv_bytes)
        self.engine = Engine(model, max_batch, prompt_cache_bytes, prompt_cache_dir)
        self.worker = Worker(max_queue, max_batch, self.engine, heartbeat, admit=self._admit)
        self.resends = Resends()
        self.markers_removed: collections.Counter[str] = collections.Counter()  # by rule, over prepared requests

    def _admit(self, running: list[GenerationJob], job: GenerationJob) -> bool:
        return self.kv.fits([_row(j) for j in running], _row(job))

    def start(self) -> None:
        self.worker.start()

    def memory(self) -> dict[str, int]:
        """Bytes: `max_kv_bytes` (the bound), `kv_bytes` (the worst case of the rows running now),
        `prefix_cache_bytes` (held by the prefix cache now) and `prefix_cache_max_bytes` (its bound, 0
        without a cache), and MLX's allocator: `mlx_active_bytes`
        (arrays alive) and `mlx_cache_bytes` (freed buffers it keeps for reuse, up to its cache limit)."""
        prefix = self.engine.batch.kv.prompt_cache
        return {
            "max_kv_bytes": self.kv.max_bytes,
            "kv_bytes": self.kv.bytes([_row(j) for j in self.worker.running()]),
            "prefix_cache_bytes": prefix.nbytes if prefix is not None else 0,
            "prefix_cache_max_bytes": prefix.max_bytes if prefix is not None else 0,
            "mlx_active_bytes": mx.get_active_memory(),
            "mlx_cache_bytes": mx.get_cache_memory(),
        }

    def stats(self) -> dict:
        """Counters since start: `prefills` (rows that started a prefill), `prefill_tokens` (prompt
        tokens the forward passes computed; the rest came from the prefix cache), `cached_tokens`
        (prompt tokens read from the prefix cache), `markers_removed` (volatile prompt markers
        taken out of submitted requests, by rule: `coreai.service.markers`), `resends` (`held`: jobs whose client left
        before the first token, kept for a resend; `attached`: resends that got one; `expired`:
        held jobs cancelled, no resend came)."""
        kv = self.engine.batch.kv
        r = self.resends
        return {
            "prefills": kv.prefills,
            "prefill_tokens": kv.prefill_tokens,  # each row's last prompt token is fed with its first decode step
            "cached_tokens": kv.cached_tokens,
            "markers_removed": dict(self.markers_removed),
            "resends": {"held": r.held, "attached": r.attached, "expired": r.expired},
        }

    def prepare(self, req: GenerationRequest) -> GenerationJob:
        """`coreai.service.prepare.prepare` with this service's model, grammars and settings."""
        return prepare(self.model, req, self.cache, self.settings)

    def submit(self, job: GenerationJob, names: Names | None = None) -> list[Job]:
        """Queue `job`'s `n` choices, all or none. Raises `RequestError` naming `names.n` when they
        could never fit, `worker.QueueFull` (with `retry_after`) when the queue is full, `worker.
        Closed` once the worker stops admitting (shutting down, a lost distributed model). A choice
        whose KV cache could not fit the bound even alone is a `RequestError` naming `names.max_tokens`.
        A job of the same `key` whose client left before its first token (`Resends`) is returned
        instead of queueing another: its reader is now the caller."""
        names = names or Names()
        self.markers_removed.update(job.removed)  # requests queued, not token counts
        if (held := self.resends.attach(job.key)) is not None:
            return [held]  # the same request, sent again after its client gave up on the first
        if not self.kv.fits([], _row(job)):
            need, prompt = self.kv.bytes([_row(job)]), len(job.prompt_ids)
            raise RequestError(
                f"this request may need {need} bytes of KV cache ({prompt} prompt tokens + max_tokens "
                f"{job.max_tokens}), more than this server's bound of {self.kv.max_bytes} bytes "
                "(coreai serve --max-kv-bytes): lower max_tokens or shorten the prompt",
                names.max_tokens,
                "kv_memory_exceeded",
            )
        if job.n > self.max_batch + self.max_queue:  # would never fit: not a full queue to retry
            raise RequestError(
                f"n = {job.n} is more than this server runs and queues at once "
                f"(max_batch {self.max_batch} + max_queue {self.max_queue})",
                names.n,
            )
        jobs = self.worker.submit(job.choices())
        for j in jobs:
            j.on_release = self.resends.release
        return jobs


def _row(job: GenerationJob) -> tuple[int, int]:
    """A job's row for `KVBudget`: (prompt tokens, max_tokens)."""
    return len(job.prompt_ids), job.max_tokens

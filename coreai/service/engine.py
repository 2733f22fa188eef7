"""The model behind the service: the worker thread (`coreai.service.worker.Worker`, which owns the
engine) steps one batch of generations (`runtime.batch.BatchGenerator`), up to `max_batch` decoding
together, with a prefix cache of several entries (mlx-lm's `LRUPromptCache`, bounded in bytes; kept on disk
across restarts with a `prompt_cache_dir`: `coreai.service.prefix_store`). A
constrained request is a row driven by a `guided.Generation` of its `guided.Constraint` and gets that
generation's verdict (the same path as the Python API and the CLI); a free one a `SamplingStrategy`.

Everything that touches MLX (the forward passes, the generations' bitmasks, log-probabilities) runs on
the worker thread; the event loop only sees plain Python values (`Piece`s and the final
`GenerationResult`, a `GuidedResult` for constrained requests).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import mlx.core as mx
from mlx_lm.models.cache import LRUPromptCache

from coreai.service.job import GenerationJob
from coreai.service.prefix_store import KeptPromptCache, PrefixStore, key_parts
from coreai.service.worker import Job
from guided import Generation
from runtime import Model, SamplingStrategy, make_drafter
from runtime.batch import BatchGenerator
from runtime.distributed import prefix_cache_agrees
from runtime.kv_batch import PROMPT_CACHE_KEY
from runtime.strategy import DecodingStrategy

log = logging.getLogger("coreai.service")


@dataclass
class TokenLogprob:
    """Log-probability (natural log) of one generated token and the `top` alternatives [(id, logprob)],
    most likely first. Tokens forced by the grammar (jump-forward) have logprob 0.0: under the
    constraint they were certain."""

    id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Piece:
    """One streamed step: text (never splits a UTF-8 character) and, if asked, its tokens' logprobs;
    parts: the text by channel (`runtime.Delta.parts`: tool-call segments of a tools constraint);
    call_ids: the ids of the calls begun so far (`guided.tools.calls.CallTracker.ids`), by index."""

    text: str
    logprobs: list[TokenLogprob] | None = None
    parts: list[tuple[str | None, str]] = dataclasses.field(default_factory=list)
    call_ids: tuple[str, ...] = ()
    origins: list[tuple[int, str]] | None = None  # (token id, `runtime.Delta.origins` entry), if asked


class Engine:
    """A model, its batch of generations and the prefix cache: the `coreai.service.worker.Batch` the
    worker steps (a job's params are a `GenerationJob`; each Job yields `Piece`s then the result).

    max_batch: requests decoding together (>= 1). prompt_cache_bytes: the prefix cache's bound in
    bytes of KV cache (0 turns it off; on a distributed model, bytes of this rank's shard of it).
    prompt_cache_dir: a folder where its newest entries are kept when the engine closes and read
    back when it starts (`PrefixStore`, keyed by the weights' content and the rest of `key_parts`;
    a file or folder that cannot be read is skipped with a warning; None: none; not on a distributed
    model).
    On rank 0 of a distributed model every step's plan goes to the other ranks (`model.leader`).
    """

    def __init__(self, model: Model, max_batch: int, prompt_cache_bytes: int, prompt_cache_dir: str | None = None):
        self.model = model
        if model.cluster is not None and not prefix_cache_agrees(model.cluster, model.config):
            log.warning("prefix cache off: the pipeline's ranks hold different numbers of layers")
            prompt_cache_bytes = 0
        self.store = None
        cache: LRUPromptCache | None = None
        if prompt_cache_bytes > 0 and prompt_cache_dir and model.cluster is None:
            try:  # a store that cannot be read never stops the server: the cache starts empty
                self.store = PrefixStore(prompt_cache_dir, key_parts(model, Path(prompt_cache_dir)), prompt_cache_bytes)
            except OSError as exc:
                log.warning("prefix cache not kept in %s: %s", prompt_cache_dir, exc)
            cache = KeptPromptCache(prompt_cache_bytes)
            if self.store is not None:
                self.store.restore(cache, PROMPT_CACHE_KEY)
        elif prompt_cache_bytes > 0:  # bounded by bytes only: the entry count is not what runs out
            cache = LRUPromptCache(max_size=1 << 30, max_bytes=prompt_cache_bytes)
        self.prompt_cache = cache
        execute = model.leader.execute if model.leader is not None else None
        self.batch = BatchGenerator(
            model.network, model.tokenizer, max_batch=max_batch, prompt_cache=cache, execute=execute
        )
        self._failed: set[Job] = set()  # jobs whose delivery failed, until their row leaves
        self._generations: dict[Job, Generation] = {}  # each constrained row's generation, until it leaves

    def __len__(self) -> int:
        return len(self.batch)

    def close(self) -> None:
        """With a `prompt_cache_dir`: the prefix cache's newest entries written there (`PrefixStore.keep`)."""
        if self.store is not None and isinstance(self.prompt_cache, KeptPromptCache):
            self.store.keep(self.prompt_cache)

    def start(self, job: Job) -> None:
        """Add a job's generation to the batch (on the worker thread: generations allocate their
        bitmask there). Raises ValueError for bad parameters."""
        p: GenerationJob = job.params
        strategy: DecodingStrategy
        if p.constraint is not None:
            # Buffers of its own: the n choices of a request share its constraint and run at once.
            self._generations[job] = Generation(p.constraint, p.sampling, p.logprobs, p.reasoning)
            strategy = self._generations[job].strategy
        else:
            strategy = SamplingStrategy(p.sampling, want_logprobs=p.logprobs, padding_mask=self.model.padding_mask)
        self.batch.add(
            p.prompt_ids,
            strategy,
            max_tokens=p.max_tokens,
            stop=p.stop or None,
            cancel=job.cancel,
            drafter=make_drafter(p.speculative, self.model),
            tag=job,
        )

    def step(self) -> list[Job]:
        """One batch step: deliver each row's `Piece` and, when it ends, its result, before the next
        forward pass is launched (`BatchGenerator.step`'s `deliver`). Returns the jobs that ended.
        An error delivering one row (a bug) is that job's error only: the job gets the exception,
        its row is cancelled (it leaves the batch at its next step) and the others go on. An error of
        the forward pass (a rank lost) is the error of every job still running; a job whose result
        was delivered in this step keeps it. Then every job of the batch has ended."""
        ended: list[Job] = []
        jobs = [row.tag for row in self.batch.rows.values()]

        def deliver(out) -> None:
            for row, delta in out:
                job = row.tag
                try:
                    if job not in self._failed:
                        self._deliver(row, delta)
                except Exception as exc:  # noqa: BLE001 - logged with its traceback, delivered to the request
                    log.exception("internal error delivering a generation")
                    job.put(exc)
                    job.cancel.set()
                    self._failed.add(job)
                if delta.result is not None:
                    self._failed.discard(job)
                    self._generations.pop(job, None)
                    ended.append(job)

        try:
            self.batch.step(deliver)
        except Exception as exc:  # noqa: BLE001 - the pass failed: every row is dropped (`BatchGenerator.step`)
            for job in jobs:
                if job not in ended:
                    job.put(exc)
            self._failed.clear()
            self._generations.clear()
            return jobs
        return ended

    def _deliver(self, row, delta) -> None:
        job, p = row.tag, row.tag.params
        logprobs = _token_logprobs(delta.token_ids, delta.logprobs, p.top_logprobs) if p.logprobs else None
        generation = self._generations.get(job)
        origins = list(zip(delta.token_ids, delta.origins, strict=False)) if p.origins else None
        if delta.text or logprobs or origins:  # with tools, the ids of the calls streamed so far
            call_ids = generation.call_ids if generation is not None else ()
            job.put(Piece(delta.text, logprobs, delta.parts, call_ids, origins))
        if delta.result is None:
            return
        r = delta.result
        if generation is not None:
            r = generation.verdict(r)
        log.info(
            "prompt %d tokens (%d cached), ttft %.3f s, %d tokens at %.1f tok/s, %d forward passes, "
            "%d of %d draft tokens accepted, finish %s%s",
            r.usage.prompt_tokens,
            r.usage.cached_tokens,
            r.timings.ttft,
            r.usage.completion_tokens,
            r.timings.decode_tps,
            r.forward_passes,
            r.accepted_tokens,
            r.drafted_tokens,
            r.finish_reason,
            f" ({r.error})" if r.error else "",
        )
        job.put(r)


def _token_logprobs(token_ids: list[int], rows: list[mx.array | None], k: int) -> list[TokenLogprob]:
    """Per-token entries of one delta. rows: per token, the distribution it was drawn from
    (mx.array [vocab] float32), or None for a token the grammar forced (jump-forward): logprob 0.0."""
    out = []
    for t, row in zip(token_ids, rows, strict=False):
        if row is None:
            out.append(TokenLogprob(t, 0.0, [(t, 0.0)] if k else []))
            continue
        top_pairs = []
        if k:
            top = mx.argpartition(-row, kth=k - 1)[:k]
            values = row[top]
            mx.eval(values, top)
            ids, logprobs = cast(list[int], top.tolist()), cast(list[float], values.tolist())  # 1-D arrays
            pairs = sorted(zip(ids, logprobs, strict=False), key=lambda x: -x[1])
            top_pairs = [(i, v) for i, v in pairs if v != float("-inf")]  # masked-out tokens are no alternative
        out.append(TokenLogprob(t, cast(float, row[t].item()), top_pairs))
    return out

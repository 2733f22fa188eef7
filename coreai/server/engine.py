"""The model behind the server: one worker thread runs every generation (see `coreai.server.queue`),
reusing one prompt (KV) cache across requests. A constrained request runs through its
`guided.ConstrainedSession` (the same path as the Python API and the CLI), a free one through
`Model.stream`.

Everything that touches MLX (the forward passes, the session's bitmask, log-probabilities) runs on
the worker thread; the event loop only sees plain Python values (`Piece`s and the final
`GenerationResult`, a `GuidedResult` for constrained requests).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Iterator

import mlx.core as mx

from guided import ConstrainedSession
from runtime import GenerationResult, Model, PromptCache, SamplingParams
from coreai.server.queue import Job, Worker

log = logging.getLogger("coreai.server")


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
    """One streamed step: text (never splits a UTF-8 character) and, if asked, its tokens' logprobs."""

    text: str
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerationParams:
    """One generation as the worker runs it.

    prompt_ids: token ids of the rendered prompt. max_tokens: completion budget (tokens).
    session: the guided session constraining the output, or None for free text.
    logprobs: return per-token logprobs; top_logprobs: how many alternatives (0-20) with each.
    speculative: the speculative-decoding option of `Model.stream` ("prompt_lookup", "draft", None).
    chat_template_kwargs: the request's template variables ({"enable_thinking": False} keeps a
        thinking model's session from opening a reasoning block).
    """

    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop: list[str]
    session: ConstrainedSession | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    speculative: str | None = None
    chat_template_kwargs: dict | None = None


class Engine:
    """A model, its worker thread and the per-server caches.

    max_queue: requests allowed to wait while one runs (more are refused with `QueueFull`).
    """

    def __init__(self, model: Model, max_queue: int):
        self.model = model
        self.worker = Worker(max_queue)
        self.prompt_cache = PromptCache(model.network)

    def submit(self, params: GenerationParams) -> Job:
        """Queue a generation; its Job yields `Piece`s then the `GenerationResult`. Raises QueueFull."""
        return self.worker.submit(lambda cancel: self._generate(params, cancel))

    def close(self) -> None:
        self.worker.close()

    def _generate(self, p: GenerationParams, cancel: threading.Event) -> Iterator[Piece | GenerationResult]:
        runner = p.session or self.model
        try:
            for delta in runner.stream(
                p.prompt_ids,
                sampling=p.sampling,
                max_tokens=p.max_tokens,
                stop=p.stop or None,
                cancel=cancel,
                prompt_cache=self.prompt_cache,
                logprobs=p.logprobs,
                speculative=p.speculative,
                chat_template_kwargs=p.chat_template_kwargs,
            ):
                logprobs = _token_logprobs(delta.token_ids, delta.logprobs, p.top_logprobs) if p.logprobs else None
                if delta.text or logprobs:
                    yield Piece(delta.text, logprobs)
                if delta.result is not None:
                    r = delta.result
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
                    yield r
        except Exception:
            # A failure mid-step may leave the KV cache and its token list out of step: start afresh.
            self.prompt_cache = PromptCache(self.model.network)
            raise


def _token_logprobs(token_ids: list[int], rows: list[mx.array | None], k: int) -> list[TokenLogprob]:
    """Per-token entries of one delta. rows: per token, the distribution it was drawn from
    (mx.array [vocab] float32), or None for a token the grammar forced (jump-forward): logprob 0.0."""
    out = []
    for t, row in zip(token_ids, rows):
        if row is None:
            out.append(TokenLogprob(t, 0.0, [(t, 0.0)] if k else []))
            continue
        top_pairs = []
        if k:
            top = mx.argpartition(-row, kth=k - 1)[:k]
            values = row[top]
            mx.eval(values, top)
            pairs = sorted(zip(top.tolist(), values.tolist()), key=lambda x: -x[1])
            top_pairs = [(i, v) for i, v in pairs if v != float("-inf")]  # masked-out tokens are no alternative
        out.append(TokenLogprob(t, row[t].item(), top_pairs))
    return out

"""The model behind the server: one worker thread runs every generation (see `coreai.server.queue`),
reusing one prompt (KV) cache and one bitmask buffer across requests.

Everything that touches MLX (the forward passes, the guided strategy's bitmask, log-probabilities)
runs on the worker thread; the event loop only sees plain Python values (`Piece`s and the final
`GenerationResult`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Iterator

import mlx.core as mx

from guided import CompiledGrammar, ConstrainedDecodingStrategy, TokenBitmask
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
    compiled: the grammar constraining the output, or None for free text.
    logprobs: return per-token logprobs; top_logprobs: how many alternatives (0-20) with each.
    """

    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop: list[str]
    compiled: CompiledGrammar | None = None
    logprobs: bool = False
    top_logprobs: int = 0


class Engine:
    """A model, its worker thread and the per-server caches.

    max_queue: requests allowed to wait while one runs (more are refused with `QueueFull`).
    """

    def __init__(self, model: Model, max_queue: int):
        self.model = model
        self.worker = Worker(max_queue)
        self.prompt_cache = PromptCache(model.network)
        self._bitmask: TokenBitmask | None = None

    def submit(self, params: GenerationParams) -> Job:
        """Queue a generation; its Job yields `Piece`s then the `GenerationResult`. Raises QueueFull."""
        return self.worker.submit(lambda cancel: self._generate(params, cancel))

    def close(self) -> None:
        self.worker.close()

    def _generate(self, p: GenerationParams, cancel: threading.Event) -> Iterator[Piece | GenerationResult]:
        strategy = None
        if p.compiled is not None:
            if self._bitmask is None or self._bitmask.vocab_size != p.compiled.tokenizer.vocab_size:
                self._bitmask = TokenBitmask(p.compiled.tokenizer.vocab_size)  # MLX memory: made on this thread
            strategy = ConstrainedDecodingStrategy(p.compiled, p.sampling, bitmask=self._bitmask,
                                                   want_logprobs=p.logprobs)
        try:
            for delta in self.model.stream(
                p.prompt_ids, strategy=strategy, sampling=p.sampling, max_tokens=p.max_tokens, stop=p.stop or None,
                cancel=cancel, prompt_cache=self.prompt_cache, logprobs=p.logprobs,
            ):
                logprobs = _token_logprobs(delta.token_ids, delta.logprobs, p.top_logprobs) if p.logprobs else None
                if delta.text or logprobs:
                    yield Piece(delta.text, logprobs)
                if delta.result is not None:
                    r = delta.result
                    if strategy is not None and r.finish_reason == "stop" and not strategy.complete:
                        # a stop string cut what the grammar still required (e.g. inside a tool call)
                        r.finish_reason, r.error = "error", "a stop string ended the output before its grammar completed"
                    log.info("prompt %d tokens (%d cached), ttft %.3f s, %d tokens at %.1f tok/s, finish %s",
                             r.usage.prompt_tokens, r.usage.cached_tokens, r.timings.ttft, r.usage.completion_tokens,
                             r.timings.decode_tps, r.finish_reason)
                    yield r
        except Exception:
            # A failure mid-step may leave the KV cache and its token list out of step: start afresh.
            self.prompt_cache = PromptCache(self.model.network)
            raise


def _token_logprobs(token_ids: list[int], logprobs: mx.array | None, k: int) -> list[TokenLogprob]:
    """Per-token entries of one step. logprobs: mx.array [vocab] float32, the distribution the first
    token was sampled from; later tokens of the step were forced (jump-forward)."""
    if not token_ids:
        return []
    if logprobs is None:
        return [TokenLogprob(t, 0.0, [(t, 0.0)] if k else []) for t in token_ids]
    first = token_ids[0]
    if k:
        top = mx.argpartition(-logprobs, kth=k - 1)[:k]
        values = logprobs[top]
        mx.eval(values, top)
        pairs = sorted(zip(top.tolist(), values.tolist()), key=lambda x: -x[1])
        top_pairs = [(i, v) for i, v in pairs if v != float("-inf")]  # masked-out tokens are no alternative
    else:
        top_pairs = []
    chosen = logprobs[first].item()
    out = [TokenLogprob(first, chosen, top_pairs)]
    out += [TokenLogprob(t, 0.0, [(t, 0.0)] if k else []) for t in token_ids[1:]]
    return out

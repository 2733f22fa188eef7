"""The generation loop: chunked prefill, decode with mlx-lm's KV caches, one `DecodingStrategy`
step per forward pass, speculative drafts, stop handling and UTF-8-safe streaming.

Our own loop exists because jump-forward (several tokens appended in one forward pass), speculative
verification (several positions scored in one pass) and rollback (KV-cache trimming) need control
that mlx-lm's `generate_step` does not give. Per iteration:

    logits = model(new tokens + draft)[last 1 + len(draft) positions]   # lazy graph
    mx.async_eval(logits)                          # MLX computes ...
    strategy.prepare()                             # ... while the CPU prepares (e.g. bitmasks)
    step = strategy.step(logits)                   # verify the draft, sample / force tokens
    trim the rejected draft tokens from the KV cache

finish_reason is "stop" (end-of-turn id, stop string, or the strategy finished), "length"
(max_tokens), "cancelled" (the cancel event was set from another thread), or "error" (the
strategy reported one; `GenerationResult.error` says what).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from runtime.prompt_cache import PromptCache
from runtime.stops import StopStrings
from runtime.strategy import DecodingStrategy, Drafter


@dataclass
class Timings:
    """Seconds and tokens per second of one generation; peak_memory in bytes (MLX allocator)."""

    ttft: float = 0.0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    total: float = 0.0
    peak_memory: int = 0


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the prompt cache (not prefilled)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    timings: Timings
    forward_passes: int = 0  # passes that produced logits to sample from (the prompt's last one included)
    forced_tokens: int = 0  # jump-forward tokens
    drafted_tokens: int = 0  # speculative draft tokens scored by the model
    accepted_tokens: int = 0  # draft tokens accepted (emitted without a pass of their own)
    error: str | None = None

    @property
    def tokens_per_pass(self) -> float:
        """Completion tokens per forward pass (1.0 without jump-forward or speculation)."""
        return len(self.token_ids) / max(self.forward_passes, 1)


@dataclass
class Delta:
    """One streamed piece. `text` never splits a UTF-8 character. The last delta of a stream has
    `finish_reason` set and carries the `result`."""

    text: str
    token_ids: list[int]
    logprobs: list[mx.array | None] | None = None  # per token: [vocab] float32, None for a forced token
    finish_reason: str | None = None
    result: GenerationResult | None = field(default=None, repr=False)


def default_prefill_step() -> int:
    """Prompt tokens per prefill chunk: 2048 on Metal (mlx-lm's default); 64 on the CPU backend,
    where a chunk of 64 takes about 0.7 s for the 0.5B model, so a cancel is seen within a second."""
    return 2048 if mx.metal.is_available() else 64


def stream_tokens(
    network,
    tokenizer,
    prompt_ids: list[int],
    strategy: DecodingStrategy,
    *,
    max_tokens: int = 256,
    context_length: int | None = None,
    **options,
) -> Iterator[Delta]:
    """Run one generation and yield `Delta`s; the last one carries the `GenerationResult`.

    Checks its arguments at the call, before any work (the generation itself starts at the first
    `next()`); see `_generate` for the arguments.
    Raises:
        ValueError: empty prompt, max_tokens < 1, or a prompt longer than `context_length`.
    """
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if context_length and len(prompt_ids) >= context_length:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the model's context is {context_length}")
    return _generate(network, tokenizer, prompt_ids, strategy, max_tokens=max_tokens, **options)


def _generate(
    network,
    tokenizer,
    prompt_ids: list[int],
    strategy: DecodingStrategy,
    *,
    max_tokens: int = 256,
    stop: list[str] | None = None,
    cancel: threading.Event | None = None,
    prompt_cache: PromptCache | None = None,
    prefill_step_size: int | None = None,
    drafter: Drafter | None = None,
) -> Iterator[Delta]:
    """The generation behind `stream_tokens`.

    Args:
        network: an mlx-lm model (nn.Module) returning logits [1, seq, vocab].
        tokenizer: `runtime.tokenizer.Tokenizer` (eos ids and the streaming detokenizer).
        prompt_ids: prompt token ids (non-empty).
        strategy: the decoding strategy (`runtime.sampling.SamplingStrategy` by default).
        max_tokens: completion-token budget (>= 1); forced and accepted draft tokens count too.
        stop: stop strings, trimmed from the output.
        cancel: set from another thread to end the generation with finish_reason "cancelled"; checked
            between prefill chunks and between decode steps.
        prompt_cache: a `PromptCache` to reuse (and update) across generations.
        prefill_step_size: prompt tokens per prefill chunk (default `default_prefill_step()`).
        drafter: speculative draft source (`runtime.speculative`), or None. Ignored when the KV cache
            cannot be trimmed (e.g. rotating caches of sliding-window models).
    """

    start = time.perf_counter()
    mx.reset_peak_memory()
    pc = prompt_cache or PromptCache(network)
    reused = pc.reuse(prompt_ids)
    cache = pc.cache
    if drafter is not None and can_trim_prompt_cache(cache):
        strategy.begin(list(prompt_ids), drafter)
    else:  # strategies that never speculate may take the prompt alone
        strategy.begin(list(prompt_ids))
    prefill_step_size = prefill_step_size or default_prefill_step()
    out: list[int] = []
    text_parts: list[str] = []
    stats = dict(forward_passes=1, forced_tokens=0, drafted_tokens=0, accepted_tokens=0)
    first = None

    def result(finish: str, error: str | None = None) -> GenerationResult:
        now = time.perf_counter()
        ttft = (first or now) - start
        decode_time = now - (first or now)
        timings = Timings(
            ttft=ttft,
            prefill_tps=(len(prompt_ids) - reused) / max(ttft, 1e-9) if first else 0.0,
            decode_tps=(len(out) - 1) / decode_time if len(out) > 1 and decode_time > 0 else 0.0,
            total=now - start,
            peak_memory=mx.get_peak_memory(),
        )
        return GenerationResult(
            "".join(text_parts), out, finish, Usage(len(prompt_ids), len(out), reused), timings, error=error, **stats
        )

    # Prefill all but the last prompt token in chunks; the last one produces the first logits.
    pending = list(prompt_ids[reused:])
    while len(pending) > 1:
        if cancel is not None and cancel.is_set():
            yield Delta("", [], finish_reason="cancelled", result=result("cancelled"))
            return
        n = min(prefill_step_size, len(pending) - 1)
        network(mx.array(pending[:n])[None], cache=cache)
        mx.eval([c.state for c in cache])
        pc.tokens.extend(pending[:n])
        pending = pending[n:]

    def forward(ids: list[int], rows: int) -> mx.array:
        pc.tokens.extend(ids)
        logits = network(mx.array(ids)[None], cache=cache)[0, -rows:, :]
        mx.async_eval(logits)
        return logits

    logits = forward(pending, 1)
    strategy.prepare()
    step = strategy.step(logits)
    first = time.perf_counter()

    detok = tokenizer.detokenizer()
    stops = StopStrings(stop)
    finish = error = None
    drafted = 0  # draft tokens fed in the last forward pass
    held: list[tuple[int, mx.array | None]] = []  # output tokens not streamed yet (Step.hold), with logprobs
    while True:
        rejected = drafted - step.verified
        if rejected:
            trim_prompt_cache(cache, rejected)
            del pc.tokens[len(pc.tokens) - rejected :]
        stats["accepted_tokens"] += step.verified
        if step.rollback:
            if step.rollback > len(held):
                raise RuntimeError(f"the strategy rolled back {step.rollback} tokens; {len(held)} were held back")
            del out[len(out) - step.rollback :], held[len(held) - step.rollback :]
            trim_prompt_cache(cache, step.rollback)
            del pc.tokens[len(pc.tokens) - step.rollback :]
        stats["forced_tokens"] += step.forced
        appended: list[int] = []
        for t in step.tokens:
            if t in tokenizer.eos_ids:
                finish = "stop"
                break
            appended.append(t)
            if len(out) + len(appended) >= max_tokens:
                break
        out.extend(appended)
        sampled = len(step.tokens) - step.forced
        held += [
            (t, step.logprobs[j] if step.logprobs is not None and j < sampled else None) for j, t in enumerate(appended)
        ]
        if finish is None and step.finish:
            finish, error = step.finish, step.message
        if finish is None and len(out) >= max_tokens:
            finish = "length"
        if finish is None and cancel is not None and cancel.is_set():
            finish = "cancelled"

        # Start the next forward pass before the CPU work of detokenizing and stop matching.
        if finish is None:
            draft = step.draft[: max_tokens - len(out) - 1]  # a draft never runs past the budget
            fed = appended[step.verified :]
            if not appended:  # a rollback appended nothing: score the last kept token again
                trim_prompt_cache(cache, 1)
                fed = [pc.tokens.pop()]
            logits = forward(fed + draft, len(draft) + 1)
            drafted = len(draft)
            stats["forward_passes"] += 1
            stats["drafted_tokens"] += drafted

        # Token by token, so a stop string ends the output at the token that completes it, also when
        # one step appended several (accepted drafts, jump-forward). Held tokens wait (see Step.hold).
        release = len(held) if finish is not None else max(0, len(held) - step.hold)
        emitted, held = held[:release], held[release:]
        text = ""
        for i, (t, _) in enumerate(emitted):
            detok.add_token(t)
            piece, hit = stops.feed(detok.last_segment)
            text += piece
            if hit:
                finish = "stop"
                del out[len(out) - (len(emitted) - i - 1) - len(held) :]
                emitted, held = emitted[: i + 1], []
                break
        else:
            if finish is not None:
                detok.finalize()
                piece, hit = stops.feed(detok.last_segment)
                text += piece if hit else piece + stops.flush()
                finish = "stop" if hit else finish
        text_parts.append(text)
        ids, logprobs = [t for t, _ in emitted], [row for _, row in emitted]

        if finish is not None:
            yield Delta(text, ids, logprobs, finish, result(finish, error))
            return
        if text or ids:
            yield Delta(text, ids, logprobs)
        strategy.prepare()
        step = strategy.step(logits)

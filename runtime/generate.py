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
from collections.abc import Iterator

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from runtime.attention import engine
from runtime.errors import InputError
from runtime.prompt_cache import PromptCache
from runtime.sampling import check_max_tokens
from runtime.sequence import Delta, Sequence
from runtime.strategy import DecodingStrategy, Drafter


def default_prefill_step(interleaved: bool = False) -> int:
    """Prompt tokens per prefill chunk: 2048 on Metal (mlx-lm's default). On the CPU backend, 128
    for a prompt prefilled alone (`stream_tokens`): the best or within 3 % of the best chunk measured
    for the 0.5B model (`python -m benchmarks.prefill_chunks`, 2 cores, OpenBLAS: 78.6 -> 84.2 tok/s
    at 1,024 prompt tokens against chunks of 64; all equal at 4,096, where attention dominates),
    about 1.4 s, so a cancel is still seen within a few seconds. interleaved: 64 for the batch
    (`runtime.batch`), where a chunk runs between the decode steps of running rows and its time is
    their inter-token latency."""
    if mx.metal.is_available():
        return 2048
    return 64 if interleaved else 128


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
        raise InputError("the prompt is empty")
    check_max_tokens(max_tokens)
    if context_length and len(prompt_ids) >= context_length:
        raise InputError(f"the prompt has {len(prompt_ids)} tokens; the model's context is {context_length}")
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
        strategy.begin(list(prompt_ids), drafter, budget=max_tokens)
    else:  # strategies that never speculate may take the prompt alone
        strategy.begin(list(prompt_ids))
    prefill_step_size = prefill_step_size or default_prefill_step()
    seq = Sequence(tokenizer, prompt_ids, max_tokens=max_tokens, stop=stop, cancel=cancel, reused=reused, start=start)

    # Prefill all but the last prompt token in chunks; the last one produces the first logits.
    pending = list(prompt_ids[reused:])
    while len(pending) > 1:
        if seq.cancelled:
            yield seq.end("cancelled")
            return
        n = min(prefill_step_size, len(pending) - 1)
        with engine():
            network(mx.array(pending[:n])[None], cache=cache)
        mx.eval([c.state for c in cache])
        pc.tokens.extend(pending[:n])
        pending = pending[n:]

    def forward(ids: list[int], rows: int) -> mx.array:
        pc.tokens.extend(ids)
        with engine():
            logits = network(mx.array(ids)[None], cache=cache)[0, -rows:, :]
        mx.async_eval(logits)
        return logits

    # On Metal the next forward pass is launched before the step's text is emitted, so the GPU computes
    # while the CPU detokenizes and the caller handles the delta. On the CPU backend `mx.async_eval`
    # returns only once most of the pass has run (measured for the 0.5B model: 155-172 ms of a
    # ~230 ms step), so launching first would hold every delta, the first token's included, back by
    # most of a pass: there the text goes out first.
    emit_first = mx.default_device() == mx.cpu
    logits = forward(pending, 1)
    while True:
        strategy.prepare()
        trim = seq.apply(strategy.step(logits))
        if seq.overrun:
            strategy.rollback(seq.overrun)
        if trim:
            trim_prompt_cache(cache, trim)
            del pc.tokens[len(pc.tokens) - trim :]
        if seq.finish is None and not emit_first:
            logits = forward(*seq.next_feed())
        delta = seq.emit()
        if delta is not None:
            yield delta
        if seq.finish is not None:  # also a stop string `emit` found: no pass is launched for nothing
            return
        if emit_first:
            logits = forward(*seq.next_feed())

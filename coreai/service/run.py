"""`stream`: a prepared job run alone on one model (the CLI, `coreai.ConstrainedSession`), the
single-sequence counterpart of the server's batch engine (`coreai.service.engine`)."""

from __future__ import annotations

from collections.abc import Iterator

from coreai.service.job import GenerationJob
from guided import Generation, TokenBitmask
from runtime.sequence import Delta


def stream(model, job: GenerationJob, *, bitmask: TokenBitmask | None = None, **kwargs) -> Iterator[Delta]:
    """Run `job` on `model` alone, streaming `runtime.Delta`s; under a constraint the last delta's
    `result` is the generation's verdict (a `guided.GuidedResult`, `.outcome` decided).
    bitmask: the buffers the generation fills (None: its own). Other keyword arguments go to
    `Model.stream` (cancel, prompt_cache). Raises what `Model.stream` raises."""
    constraint = job.constraint
    generation = (
        None if constraint is None else Generation(constraint, job.sampling, job.logprobs, job.reasoning, bitmask)
    )
    strategy = None if generation is None else generation.strategy
    for delta in model.stream(
        job.prompt_ids,
        strategy=strategy,
        sampling=job.sampling,
        max_tokens=job.max_tokens,
        logprobs=job.logprobs,
        stop=job.stop or None,
        speculative=job.speculative,
        **kwargs,
    ):
        if delta.result is not None and generation is not None:
            delta.result = generation.verdict(delta.result)
        yield delta

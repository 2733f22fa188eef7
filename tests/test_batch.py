"""The batched decode loop (`runtime.batch`) on the tiny random network: every row gives what the
single-sequence loop gives for the same request, whatever runs beside it; rows join and leave
mid-batch; a cancelled or failing row ends alone; the prefix cache changes no output."""

from __future__ import annotations

import threading

import pytest
from mlx_lm.models.cache import LRUPromptCache

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai import ConstrainedSession
from runtime import GenerationResult, PromptLookup, SamplingParams, SamplingStrategy
from runtime.batch import BatchGenerator

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def requests(model):
    """(prompt ids, strategy factory, options) of six different generations."""
    ids = [model.prompt_ids([{"role": "user", "content": f"Question {i}: say something."}]) for i in range(6)]
    free = lambda **kw: lambda: SamplingStrategy(SamplingParams(**kw))  # noqa: E731
    guided = lambda **spec: lambda: ConstrainedSession(model, **spec).strategy(SamplingParams())  # noqa: E731
    return [
        (ids[0], free(), dict(max_tokens=20)),
        (ids[1], guided(schema=SCHEMA), dict(max_tokens=40)),
        (ids[2], free(temperature=0.9, top_p=0.9, seed=7), dict(max_tokens=14)),
        (ids[3], guided(regex=r"[a-z]{3,8}-[0-9]{2}"), dict(max_tokens=16)),
        (ids[4], free(repetition_penalty=1.3), dict(max_tokens=9, stop=["e"])),
        (ids[5], guided(choices=["alpha beta gamma", "delta"]), dict(max_tokens=16)),
    ]


def run(batch: BatchGenerator, join_every: int, reqs) -> dict:
    """Add the requests `join_every` steps apart; returns {index: GenerationResult}."""
    results, steps, pending = {}, 0, list(enumerate(reqs))
    while pending or len(batch):
        if pending and steps % join_every == 0:
            i, (ids, make, options) = pending.pop(0)
            batch.add(ids, make(), tag=i, **options)
        for row, delta in batch.step():
            if delta.result is not None:
                results[row.tag] = delta.result
        steps += 1
    return results


def test_rows_equal_single_generations(tiny_model):
    reqs = requests(tiny_model)
    single = [tiny_model.generate(ids, strategy=make(), **options) for ids, make, options in reqs]
    for max_batch, join_every in ((4, 3), (6, 1)):
        batched = run(BatchGenerator(tiny_model.network, tiny_model.tokenizer, max_batch=max_batch), join_every, reqs)
        for i, r in enumerate(single):
            b = batched[i]
            assert (b.token_ids, b.text, b.finish_reason) == (r.token_ids, r.text, r.finish_reason), (max_batch, i)
    assert single[1].forced_tokens > 0  # jump-forward ran beside the other rows
    assert single[4].finish_reason == "stop" and "e" not in single[4].text


def test_cancel_and_failure_end_one_row(tiny_model):
    reqs = requests(tiny_model)[:3]
    single = [tiny_model.generate(ids, strategy=make(), **options) for ids, make, options in reqs]

    class Broken(SamplingStrategy):
        def step(self, logits):
            raise RuntimeError("boom")

    batch = BatchGenerator(tiny_model.network, tiny_model.tokenizer, max_batch=5)
    cancel = threading.Event()
    for i, (ids, make, options) in enumerate(reqs):
        batch.add(ids, make(), tag=i, **options)
    batch.add(reqs[0][0], SamplingStrategy(), max_tokens=30, cancel=cancel, tag="cancelled")
    batch.add(reqs[1][0], Broken(), max_tokens=30, tag="broken")
    results, steps = {}, 0
    while len(batch):
        for row, delta in batch.step():
            if delta.result is not None:
                results[row.tag] = delta.result
        steps += 1
        if steps == 8:
            cancel.set()
    assert results["cancelled"].finish_reason == "cancelled" and 0 < len(results["cancelled"].token_ids) < 30
    assert results["broken"].finish_reason == "error" and "boom" in results["broken"].error
    for i, r in enumerate(single):
        assert results[i].token_ids == r.token_ids and results[i].finish_reason == r.finish_reason


def test_solo_row_drafts_and_matches(qwen_model):
    """On the real model, whose output depends on every cached token (an untrimmed draft shows)."""
    ids = qwen_model.prompt_ids("a b c a b c a b c a b c a b c a b")
    plain = qwen_model.generate(ids, max_tokens=24)
    batch = BatchGenerator(qwen_model.network, qwen_model.tokenizer, max_batch=2)
    batch.add(ids, SamplingStrategy(), max_tokens=24, drafter=PromptLookup(), tag=0)
    result = None
    while len(batch):
        result = next((d.result for _, d in batch.step() if d.result is not None), result)
    assert result.token_ids == plain.token_ids
    assert result.drafted_tokens > 0  # a lone row speculates; rejected drafts were trimmed per row


@pytest.mark.parametrize("max_batch", [1, 3])
def test_prefix_cache_changes_no_output(tiny_model, max_batch):
    """Exact repeats, shared prefixes and a follow-up turn: equal with the cache on and off, and
    the cache serves prompt tokens."""
    system = {"role": "system", "content": "You are a terse assistant. " * 8}
    first = [system, {"role": "user", "content": "Hello there."}]
    a = tiny_model.prompt_ids(first)
    b = tiny_model.prompt_ids([system, {"role": "user", "content": "Another question."}])
    free = lambda: SamplingStrategy(SamplingParams())  # noqa: E731
    reqs = [(a, free, dict(max_tokens=12)), (b, free, dict(max_tokens=12)), (a, free, dict(max_tokens=12))]
    cold = run(BatchGenerator(tiny_model.network, tiny_model.tokenizer, max_batch=max_batch), 1, reqs)
    cache = LRUPromptCache(max_size=1 << 20, max_bytes=64 << 20)
    warm_batch = BatchGenerator(tiny_model.network, tiny_model.tokenizer, max_batch=max_batch, prompt_cache=cache)
    warm = run(warm_batch, 40, reqs)  # one after another, so each finds the ones before it
    follow = tiny_model.prompt_ids(
        first + [{"role": "assistant", "content": warm[0].text}, {"role": "user", "content": "And then?"}]
    )
    cold[3] = run(BatchGenerator(tiny_model.network, tiny_model.tokenizer), 1, [(follow, free, dict(max_tokens=12))])[0]
    warm[3] = run(warm_batch, 1, [(follow, free, dict(max_tokens=12))])[0]
    for i in range(4):
        assert warm[i].token_ids == cold[i].token_ids, i
    assert all(warm[i].usage.cached_tokens > 0 for i in (1, 2, 3))
    assert warm[2].usage.cached_tokens == len(a) - 1 and warm[3].usage.cached_tokens > len(a)


def run_together(batch: BatchGenerator, reqs) -> dict:
    """Add all the requests before the first step; returns {index: GenerationResult}."""
    for i, (ids, make, options) in enumerate(reqs):
        batch.add(ids, make(), tag=i, **options)
    results = {}
    while len(batch):
        results.update((row.tag, d.result) for row, d in batch.step() if d.result is not None)
    return results


def test_rows_arriving_together_prefill_in_one_pass(qwen_model):
    """On the real model, whose output would show a padding or offset fault: prompts of different
    lengths, one starting from a cached prefix (so the merged KV caches start at different lengths),
    prefill together and join in the first step, though a longer prompt came first; that one
    prefills alone, chunk by chunk, and joins later. Every output equals its single generation."""
    free = lambda: SamplingStrategy(SamplingParams())  # noqa: E731
    cached = qwen_model.prompt_ids("The capital of France is", chat_template=False)
    texts = ["The capital of France is Paris, and the capital of Spain is", "One, two,", "List three colours:"]
    prompts = [qwen_model.prompt_ids(t, chat_template=False) for t in texts]
    prompts.insert(0, qwen_model.prompt_ids("alpha beta gamma delta " * 12, chat_template=False))
    reqs = [(ids, free, dict(max_tokens=6)) for ids in prompts]
    single = [qwen_model.generate(ids, strategy=make(), **options) for ids, make, options in reqs]

    cache = LRUPromptCache(max_size=1 << 20, max_bytes=64 << 20)
    batch = BatchGenerator(
        qwen_model.network, qwen_model.tokenizer, max_batch=4, prompt_cache=cache, prefill_step_size=16
    )
    run_together(batch, [(cached, free, dict(max_tokens=2))])
    rows = [batch.add(ids, make(), tag=i, **options) for i, (ids, make, options) in enumerate(reqs)]
    assert rows[1].seq.reused > 0 and len(prompts[0]) - 1 > 16
    results = {}
    for step in range(1, 200):
        results.update((row.tag, d.result) for row, d in batch.step() if d.result is not None)
        if step == 1:
            assert batch.active == rows[1:] and batch.waiting == rows[:1]
        if not len(batch):
            break
    for i, r in enumerate(single):
        assert results[i].token_ids == r.token_ids, i


class CountingNetwork:
    """The network, recording every row of token ids it is fed (to count prefill work)."""

    def __init__(self, network):
        self.network, self.fed = network, []

    def __call__(self, ids, cache=None):
        self.fed += ids.tolist()
        return self.network(ids, cache=cache)

    def __getattr__(self, name):
        return getattr(self.network, name)


@pytest.mark.parametrize("prefill_step_size", [8, 512])
def test_rows_with_one_prompt_prefill_it_once(tiny_model, prefill_step_size):
    """Three seeded choices of one long prompt and three of one short prompt (what the server's `n`
    adds) arrive together, with a prompt that shares the long one's start: each prompt goes through
    the network once, whether it prefills in chunks (a long prompt: the others copy its KV cache, as
    far as they share it) or in one pass (rows in the same state share a row of it), and every
    choice equals its single generation."""
    long = tiny_model.prompt_ids("alpha beta gamma delta " * 6, chat_template=False)
    short = tiny_model.prompt_ids("One, two, three, four, five", chat_template=False)
    branch = long[:12] + short  # shares long's first chunk of 8, not its second
    reqs = [
        (ids, lambda s=seed: SamplingStrategy(SamplingParams(temperature=0.9, seed=s)), dict(max_tokens=6))
        for ids in (long, short, branch)
        for seed in (1, 2, 3)[: 1 if ids is branch else 3]
    ]
    single = [tiny_model.generate(ids, strategy=make(), **options) for ids, make, options in reqs]
    assert len({tuple(r.token_ids) for r in single}) > 2  # the seeds differ, so a shared row would show
    network = CountingNetwork(tiny_model.network)
    batch = BatchGenerator(network, tiny_model.tokenizer, max_batch=7, prefill_step_size=prefill_step_size)
    batched = run_together(batch, reqs)
    for i, r in enumerate(single):
        assert batched[i].token_ids == r.token_ids, i
    # 8 tokens to prefill: three copies would pass the bound of 2 * 8 padded positions of one pass
    assert len(long) > 16 and len(short) == 9
    # In chunks of 8, `branch` copies long's first chunk; in one pass it is a row of its own.
    assert sum(row[:3] == long[:3] for row in network.fed) == (1 if prefill_step_size == 8 else 2)
    assert sum(row[:2] == short[:2] for row in network.fed) == 1


class Backtrack(SamplingStrategy):
    """Rolls back its last 2 tokens at its 5th step (as validate-and-rollback does), so the batched
    loop must trim one row's KV cache while the other rows keep theirs. It holds back its last 2
    tokens (`Step.hold`), as a strategy must for what it may roll back."""

    steps = 0

    def step(self, logits):
        self.steps += 1
        if self.steps == 5:
            self.rollback(2)
        step = super().step(logits)
        step.rollback, step.hold = (2 if self.steps == 5 else 0), 2
        return step


def test_rollback_trims_one_row(qwen_model):
    """On the real model: the tiny random one hardly depends on its context, so it would not notice
    an untrimmed KV cache."""
    reqs = requests(qwen_model)[:3]
    reqs[1] = (reqs[1][0], Backtrack, dict(max_tokens=12))
    single = [qwen_model.generate(ids, strategy=make(), **options) for ids, make, options in reqs]
    batched = run(BatchGenerator(qwen_model.network, qwen_model.tokenizer, max_batch=3), 1, reqs)
    for i, r in enumerate(single):
        assert batched[i].token_ids == r.token_ids and batched[i].text == r.text, i


class ForceTwo(SamplingStrategy):
    """Appends two forced tokens after its 3rd sampled one (as jump-forward does), without the cost
    of a grammar for a 262k vocabulary."""

    steps = 0

    def advance(self, accepted, token):
        self.steps += 1
        step = super().advance(accepted, token)
        if self.steps == 3:
            step.tokens += [token, token]
            step.forced = 2
        return step


def test_sliding_window_model_batches(gemma_dir):
    """Gemma 3 has rotating (sliding-window) KV layers: rows of different feed lengths still batch,
    equal to their single-sequence outputs; its caches cannot be trimmed, so no drafts."""
    from runtime import load_model

    model = load_model(gemma_dir)
    ids = [model.prompt_ids(f"Story number {i}: Once upon a time") for i in range(3)]
    reqs = [(ids[0], SamplingStrategy, dict(max_tokens=12)), (ids[1], ForceTwo, dict(max_tokens=12))]
    reqs.append((ids[2], SamplingStrategy, dict(max_tokens=12)))
    single = [model.generate(i, strategy=make(), **options) for i, make, options in reqs]
    assert single[1].forced_tokens == 2
    for join in ("one by one", "together"):  # rows joining a running batch; rows prefilled in one pass
        batch = BatchGenerator(model.network, model.tokenizer, max_batch=3)
        assert not batch.trimmable
        batched = run(batch, 1, reqs) if join == "one by one" else run_together(batch, reqs)
        for i, r in enumerate(single):
            assert batched[i].token_ids == r.token_ids, (join, i)


def test_a_shorter_long_prompt_is_not_stuck_behind_a_longer_one(tiny_model):
    """Two prompts longer than a prefill chunk wait: a long one (an agent's 20k-token request) and a
    shorter one that arrived after it (a tools request of a few chunks). The shorter one is prefilled
    between the long one's chunks and joins the batch long before the long one does, and the long one
    still progresses every other step (it is not starved either); both outputs equal their single
    generations."""
    long = tiny_model.prompt_ids("alpha beta gamma delta " * 40, chat_template=False)
    medium = tiny_model.prompt_ids("One, two, three, four, five, six, seven", chat_template=False)
    assert len(long) > 20 * 8 and 8 < len(medium) <= 3 * 8
    make = lambda: SamplingStrategy(SamplingParams(temperature=0.9, seed=3))  # noqa: E731
    single = [tiny_model.generate(ids, strategy=make(), max_tokens=4) for ids in (long, medium)]
    batch = BatchGenerator(tiny_model.network, tiny_model.tokenizer, max_batch=4, prefill_step_size=8)
    batch.add(long, make(), tag="long", max_tokens=4)
    batch.step()  # the long prompt's first chunk
    batch.add(medium, make(), tag="medium", max_tokens=4)
    first_delta, results, steps = {}, {}, 1
    while len(batch):
        for row, delta in batch.step():
            first_delta.setdefault(row.tag, steps)
            if delta.result is not None:
                results[row.tag] = delta.result
        steps += 1
    chunks = lambda ids: -(-(len(ids) - 1) // 8)  # noqa: E731
    # the medium prompt's chunks interleave with the long one's: it joins within twice its own chunks
    assert first_delta["medium"] <= 1 + 2 * chunks(medium) + 1, first_delta
    # the long prompt pays at most the medium one's chunks on top of its own
    assert first_delta["long"] <= chunks(long) + chunks(medium) + 1, first_delta
    assert [results["long"].token_ids, results["medium"].token_ids] == [r.token_ids for r in single]


def test_rows_left_in_the_prefix_cache_hold_only_their_own_kv(tiny_model):
    """A row that leaves a batch goes to the prefix cache, which counts only that row's bytes. Round
    after round of rows leaving full batches, MLX's active memory stays within the cache's bound of
    where it began (a lazily sliced row kept the whole batch's KV arrays alive: the 10-minute soak
    grew 3 -> 11 GiB)."""
    import gc

    import mlx.core as mx

    bound = 4 << 20
    cache = LRUPromptCache(max_size=1 << 20, max_bytes=bound)
    batch = BatchGenerator(tiny_model.network, tiny_model.tokenizer, max_batch=8, prompt_cache=cache)
    make = lambda: SamplingStrategy(SamplingParams())  # noqa: E731

    def round_of_rows(r: int) -> int:
        prompts = [tiny_model.prompt_ids(f"Round {r} row {i}: " + "word " * 60, chat_template=False) for i in range(8)]
        reqs = [(ids, make, {"max_tokens": 4 + 3 * i}) for i, ids in enumerate(prompts)]
        run_together(batch, reqs)  # rows leave one by one while the others still run
        gc.collect()
        mx.clear_cache()
        return mx.get_active_memory()

    start = round_of_rows(0)
    ends = [round_of_rows(r) for r in range(1, 6)]
    assert cache.nbytes <= bound
    assert max(ends) - start <= bound, (start, ends)


def test_a_step_delivers_its_deltas_before_the_next_pass(tiny_model):
    """`step(deliver)` hands a step's deltas over before the plan executes: on the CPU backend
    launching the pass takes most of it, and the clients would wait for it (`runtime.generate`)."""
    order: list = []
    batch = BatchGenerator(tiny_model.network, tiny_model.tokenizer, max_batch=2)
    execute = batch._execute
    batch._execute = lambda plan: (order.append("pass"), execute(plan))[1]
    for i in range(2):
        batch.add(tiny_model.prompt_ids(f"Row {i}: say something."), SamplingStrategy(), tag=i, max_tokens=4 + i)
    while len(batch):
        returned = batch.step(deliver=lambda out: order.append(list(out)))
        delivered = order[-2]
        assert order[-1] == "pass" and delivered == returned


def test_a_failed_pass_spares_the_results_delivered_before_it(tiny_model):
    """The engine delivers a step's results before the pass; when that pass fails (a rank lost), a
    job whose result was delivered in the step keeps it, every other running job gets the error, and
    the step reports them all ended."""
    from coreai.service.engine import Engine
    from coreai.service.job import GenerationJob

    class Job:  # what the engine uses of `coreai.service.Job`: params, cancel, put
        def __init__(self, max_tokens):
            prompt = tiny_model.prompt_ids("Say something.")
            self.params = GenerationJob(prompt, SamplingParams(), max_tokens=max_tokens, stop=[])
            self.cancel = threading.Event()
            self.items: list = []

        def put(self, item):
            self.items.append(item)

    engine = Engine(tiny_model, max_batch=2, prompt_cache_bytes=0)
    short, long = Job(2), Job(50)
    engine.start(short)
    engine.start(long)
    execute = engine.batch._execute
    lost = RuntimeError("rank 1 is gone")

    def fail_once_short_ended(plan):
        if any(isinstance(i, GenerationResult) for i in short.items):
            raise lost
        return execute(plan)

    engine.batch._execute = fail_once_short_ended
    ended = []
    while not ended:
        ended = engine.step()
    assert set(ended) == {short, long} and len(engine) == 0
    assert isinstance(short.items[-1], GenerationResult) and lost not in short.items
    assert long.items[-1] is lost

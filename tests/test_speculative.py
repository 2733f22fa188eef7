"""Speculative decoding: drafts, exactness against non-speculative decoding (greedy, on the real
model, constrained and not), the acceptance rule's distribution, and the state after rollbacks
(KV cache and grammar matcher equal a fresh run's). Also per-request randomness and cancellation
between prefill chunks, which live in the same loop."""

from __future__ import annotations

import threading

import coreai  # noqa: F401 - loads the system BLAS before mlx.core

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from coreai import ConstrainedSession  # noqa: E402
from runtime import PromptCache, PromptLookup, SamplingParams, TokenSampler, ValueLookup, make_drafter  # noqa: E402
from runtime.draft_cost import DraftCostModel  # noqa: E402

INVOICE = (
    "Invoice INV-2291 from Northwind Traders, 1200 Harbor Boulevard, Seattle. Bill to: Ada Lovelace, "
    "12 St James's Square, London. Total due: 4512.50 EUR."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "invoice": {"type": "string"},
        "seller": {"type": "string"},
        "seller_address": {"type": "string"},
        "buyer": {"type": "string"},
        "total": {"type": "number"},
    },
    "required": ["invoice", "seller", "seller_address", "buyer", "total"],
}
PROMPTS = [
    [
        {"role": "system", "content": "Copy values verbatim from the text into JSON."},
        {"role": "user", "content": INVOICE},
    ],
    "Repeat this sentence exactly: " + INVOICE,
    "Write a haiku about the sea.",
]


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    lookup = PromptLookup(max_ngram=3, min_ngram=1)
    context = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 0, 2, 3]
    assert lookup.propose(context, 3) == [7, 8, 0]  # no earlier [0, 2, 3]; the latest [2, 3] came before 7
    assert lookup.propose(context[:-3] + [1, 2, 3], 2) == [4, 5]  # the longest match wins
    assert lookup.propose([5, 6, 5], 4) == [6, 5]  # the unigram 5 matched at the start
    assert lookup.propose([1, 2, 3], 4) == [] and lookup.propose(context, 0) == []
    with pytest.raises(ValueError):
        PromptLookup(max_ngram=1, min_ngram=2)


def test_make_drafter_options(tiny_model):
    assert make_drafter(None, tiny_model) is None and make_drafter("off", tiny_model) is None
    assert isinstance(make_drafter("prompt_lookup", tiny_model), ValueLookup)
    with pytest.raises(ValueError, match="draft model"):
        make_drafter("draft", tiny_model)
    with pytest.raises(ValueError, match="speculative"):
        make_drafter("medusa", tiny_model)


@pytest.mark.model
@pytest.mark.parametrize("prompt", PROMPTS, ids=["extraction", "copy", "prose"])
def test_greedy_output_is_identical_with_prompt_lookup(qwen_model, prompt):
    plain = qwen_model.generate(prompt, max_tokens=24)
    fast = qwen_model.generate(prompt, max_tokens=24, speculative="prompt_lookup")
    assert fast.token_ids == plain.token_ids and fast.text == plain.text
    assert fast.finish_reason == plain.finish_reason


@pytest.mark.model
def test_guided_greedy_output_is_identical_and_uses_rollback(qwen_model):
    session = ConstrainedSession(qwen_model, schema=SCHEMA)
    plain = session.generate(PROMPTS[0], max_tokens=60)
    fast = session.generate(PROMPTS[0], max_tokens=60, speculative="prompt_lookup")
    assert fast.token_ids == plain.token_ids and fast.valid == plain.valid and fast.value == plain.value
    assert fast.accepted_tokens > 0 and fast.forward_passes < plain.forward_passes
    assert fast.drafted_tokens - fast.accepted_tokens > 0  # some drafts were rejected (and rolled back)


@pytest.mark.model
def test_state_after_rollbacks_equals_a_fresh_run(qwen_model):
    """After a speculative guided generation with rejected drafts, the KV cache holds exactly the
    prompt and the output (next-token logits equal a fresh prefill's) and the matcher equals a fresh
    matcher fed the output (a max_tokens cut inside a step: tests/test_rollback.py)."""
    session = ConstrainedSession(qwen_model, schema=SCHEMA)
    cache = PromptCache(qwen_model.network)
    strategy = session.strategy()
    prompt_ids = qwen_model.prompt_ids(PROMPTS[0])
    for delta in qwen_model.stream(
        prompt_ids, strategy=strategy, max_tokens=160, prompt_cache=cache, speculative="prompt_lookup"
    ):
        result = delta.result
    assert result.drafted_tokens > result.accepted_tokens  # some drafts were rejected
    out = result.token_ids
    assert cache.tokens == prompt_ids + out[:-1]  # the last token is never fed
    kept = qwen_model.network(mx.array(out[-1:])[None], cache=cache.cache)[0, -1]
    fresh = qwen_model.network(mx.array(prompt_ids + out)[None])[0, -1]
    assert mx.allclose(kept, fresh, atol=1e-3, rtol=1e-3)
    replay = session.compiled.matcher()
    assert replay.accept_tokens(out)
    words = replay.words
    a, b = np.zeros((1, words), np.int32), np.zeros((1, words), np.int32)
    replay.fill_next_token_bitmask(a)
    strategy.matcher.fill_next_token_bitmask(b)
    assert strategy.matcher.num_accepted == replay.num_accepted == len(out)
    assert np.array_equal(a, b)


def test_draft_model_identical_to_target_accepts_every_greedy_draft(tiny_model):
    plain = tiny_model.generate("Hello there", max_tokens=20)
    fast = tiny_model.generate("Hello there", max_tokens=20, speculative=tiny_model)
    assert fast.token_ids == plain.token_ids
    assert fast.drafted_tokens > 0 and fast.accepted_tokens >= fast.drafted_tokens - 1
    assert fast.forward_passes < plain.forward_passes


@pytest.mark.model
def test_draft_model_with_rejections_keeps_greedy_output(qwen_model, tiny_qwen_model):
    """A random-weight draft with the same tokenizer: nearly every draft is rejected, the output is
    still the target's, constrained and not."""
    plain = qwen_model.generate(PROMPTS[1], max_tokens=12)
    fast = qwen_model.generate(PROMPTS[1], max_tokens=12, speculative=tiny_qwen_model)
    assert fast.token_ids == plain.token_ids and fast.drafted_tokens > fast.accepted_tokens
    session = ConstrainedSession(qwen_model, schema=SCHEMA)
    assert (
        session.generate(PROMPTS[0], max_tokens=16, speculative=tiny_qwen_model).token_ids
        == session.generate(PROMPTS[0], max_tokens=16).token_ids
    )


def test_acceptance_rule_keeps_the_target_distribution():
    """With a deterministic draft, the first emitted token is distributed as p0 and, when the draft's
    first token was accepted (probability p0(d), as in Leviathan et al. 2023), the second as p1.
    6,000 draws, 4.5 sigma."""
    p0 = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    p1 = np.array([0.1, 0.1, 0.6, 0.1, 0.1])
    logprobs = mx.array(np.log(np.stack([p0, p1, p1])), dtype=mx.float32)
    draft = [1, 3]  # token 1 has p0 = 0.2: mostly rejected; the residual must make up for it
    sampler = TokenSampler(SamplingParams(temperature=1.0, seed=3))
    n = 6000
    first = np.zeros(5)
    second = np.zeros(5)
    for i in range(n):
        accepted, token = sampler.verify(logprobs, draft, position=3 * i)  # fresh positions: fresh draws
        emitted = draft[:accepted] + [token]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    for counts, p in ((first, p0), (second, p1)):
        total = counts.sum()
        sigma = np.sqrt(p * (1 - p) / total)
        assert np.all(np.abs(counts / total - p) < 4.5 * sigma), (counts / total, p)
    assert second.sum() == pytest.approx(n * p0[1], rel=0.15)


def test_seeded_sampling_is_the_same_with_or_without_drafts(tiny_model):
    """Each position's draw is fixed by the seed and the position, so drafts (which change how many
    draws a step makes) do not change a seeded output at temperature > 0: a request gets the same
    text alone (drafted) as in a batch (not drafted)."""
    params = SamplingParams(temperature=1.0, seed=11)
    plain = tiny_model.generate("Hello", sampling=params, max_tokens=24)
    fast = tiny_model.generate("Hello", sampling=params, max_tokens=24, speculative=tiny_model)
    assert fast.token_ids == plain.token_ids and fast.drafted_tokens > 0


def test_a_seed_does_not_leak_into_later_requests(tiny_model):
    seeded = SamplingParams(temperature=1.0, seed=1234)
    first = tiny_model.generate("Hello", sampling=seeded, max_tokens=12).token_ids
    unseeded = [tiny_model.generate("Hello", temperature=1.0, max_tokens=12).token_ids for _ in range(3)]
    assert len({tuple(u) for u in unseeded}) == 3  # fresh randomness each time
    mx.random.seed(99)  # process-wide state does not matter either
    assert tiny_model.generate("Hello", sampling=seeded, max_tokens=12).token_ids == first


def test_cancel_is_seen_between_prefill_chunks(tiny_model):
    cancel = threading.Event()
    calls = []

    def network(ids, cache):
        calls.append(ids.shape[1])
        cancel.set()  # the client goes away during the first chunk
        return tiny_model.network(ids, cache=cache)

    from runtime import SamplingStrategy, stream_tokens

    prompt = tiny_model.tokenizer.encode("word " * 300)
    deltas = list(
        stream_tokens(
            network,
            tiny_model.tokenizer,
            prompt,
            SamplingStrategy(),
            max_tokens=8,
            cancel=cancel,
            prefill_step_size=64,
            prompt_cache=PromptCache(tiny_model.network),
        )
    )
    result = deltas[-1].result
    assert result.finish_reason == "cancelled" and result.token_ids == []
    assert calls == [64]  # one chunk ran, the other four did not


@pytest.mark.model
def test_a_stop_string_ends_the_tokens_too(qwen_model):
    """A step with several accepted draft tokens is cut before the stop string: ids, usage and
    logprobs as without speculation, and the accepted drafts among them (issue 41)."""
    prompt = "Repeat this text exactly, nothing else: 'alpha beta gamma delta alpha beta gamma delta'"
    slow = list(qwen_model.stream(prompt, max_tokens=16, stop=["a b"], logprobs=True))
    deltas = list(qwen_model.stream(prompt, max_tokens=16, stop=["a b"], logprobs=True, speculative="prompt_lookup"))
    plain, fast = slow[-1].result, deltas[-1].result
    assert (fast.text, fast.token_ids, fast.usage.completion_tokens) == (
        plain.text,
        plain.token_ids,
        plain.usage.completion_tokens,
    )
    streamed = [t for d in deltas for t in d.token_ids]
    assert streamed == [t for d in slow for t in d.token_ids]
    # The tokens that spell the stop string are neither streamed nor counted.
    assert streamed == fast.token_ids and fast.usage.completion_tokens == len(streamed)
    assert fast.accepted_tokens == [o for d in deltas for o in d.origins].count("drafted")


# -- the draft cost model and the suffix drafter (deterministic: injected costs and acceptance) --------

IDLE = {1: 0.266, 2: 0.247, 4: 0.288, 8: 0.320, 16: 0.389, 32: 0.556}  # the idle CPU pass costs (s)


def _costs(model: DraftCostModel, table: dict, times: int = 8) -> None:
    for _ in range(times):
        for width, seconds in table.items():
            model.observe_pass(width, seconds)


def test_expected_tokens_follow_the_geometric_acceptance_model():
    model = DraftCostModel(8, prior_acceptance=0.5)
    assert model.expected_tokens(0) == 1 and model.expected_tokens(2) == pytest.approx(1.75)
    for _ in range(50):
        model.observe_draft(4, 4)  # every draft accepted whole: a -> 1, E(k) -> k + 1
    assert model.acceptance > 0.97 and model.expected_tokens(8) > 8
    with pytest.raises(ValueError, match="decay"):
        DraftCostModel(8, decay=0)


def test_low_acceptance_means_no_draft():
    model = DraftCostModel(32)
    _costs(model, IDLE)
    for _ in range(20):
        model.observe_draft(8, 0)  # free prose: the first draft token is rejected
    assert model.best(base=1) == 0
    assert [model.choose(1) for _ in range(model.probe_every - 1)] == [0] * (model.probe_every - 1)


def test_cheap_wide_passes_and_high_acceptance_mean_long_drafts():
    model = DraftCostModel(32)
    _costs(model, IDLE)
    for _ in range(20):
        model.observe_draft(16, 16)  # the output copies the prompt
    assert model.best(base=1) >= 16
    assert model.rate(model.best(1), 1) > 2 * model.rate(0, 1)
    # the same acceptance with a pass cost growing in proportion to its width: a draft never pays
    linear = DraftCostModel(32)
    _costs(linear, {w: 0.25 * w for w in IDLE})
    for _ in range(20):
        linear.observe_draft(16, 12)
    assert linear.best(base=1) == 0


def test_a_loaded_machine_gets_shorter_drafts_and_a_quiet_one_is_seen_again():
    model = DraftCostModel(32, probe_every=8)
    _costs(model, IDLE)
    for _ in range(20):
        model.observe_draft(12, 9)
    idle = model.best(base=1)
    loaded = {1: 0.3, 2: 0.32, 4: 0.45, 8: 0.9, 16: 1.8, 32: 3.6}  # flat, then steep: the cores are shared
    _costs(model, loaded)
    busy = model.best(base=1)
    assert 0 < busy < idle
    # Quiet again: only the chosen width is measured from now on (the wide buckets keep their loaded
    # costs) until a probe feeds a wider pass and finds it cheap again.
    chosen = []
    for _ in range(40):
        k = model.choose(1)
        chosen.append(k)
        model.observe_pass(1 + k, 0.266 + 0.009 * k)  # the idle curve
        model.observe_draft(k, k - 1)
    assert chosen[0] == busy and max(chosen) == 32
    assert model.best(base=1) >= idle


def test_jump_forward_tokens_in_the_pass_are_part_of_its_cost():
    """A pass already 16 tokens wide (forced tokens) has less room before the cost curve turns steep."""
    model = DraftCostModel(32)
    _costs(model, {1: 0.3, 2: 0.3, 4: 0.3, 8: 0.31, 16: 0.35, 32: 1.4})
    for _ in range(20):
        model.observe_draft(8, 7)
    assert model.best(base=16) < model.best(base=1)


def test_prompt_lookup_drafts_the_whole_copied_span():
    span = list(range(100, 120))
    prompt = [1, 2, 3] + span + [4, 5, 1, 2]
    lookup = PromptLookup()
    context = prompt + span[:2]  # the output started copying the span
    rest = span[2:] + [4, 5, 1, 2] + span[:2]  # the continuation runs on into the output itself
    assert lookup.propose(context, 32) == rest and lookup.propose(context, 5) == rest[:5]
    assert PromptLookup(max_ngram=3).propose(context, 32) == rest
    for token in span[2:6]:  # extended token by token: the same answers as a fresh index
        context = context + [token]
        assert lookup.propose(context, 8) == PromptLookup().propose(context, 8)
    assert lookup.propose(context[:-3], 4) == span[3:7]  # a shorter context (a rollback) re-indexes


def test_prompt_lookup_undoes_a_context_it_did_not_keep():
    """After indexing a context that was then cut back (a rejected chained draft, a rollback), the
    index is exactly that of a fresh build of the context kept (the journal undoes, no rebuild)."""
    rng = np.random.default_rng(0)
    for _ in range(40):
        base = rng.integers(0, 6, size=int(rng.integers(2, 80))).tolist()
        spec = rng.integers(0, 6, size=int(rng.integers(1, 40))).tolist()
        after = rng.integers(0, 6, size=int(rng.integers(1, 20))).tolist()
        cut = int(rng.integers(1, len(base) + 1))
        lookup, fresh = PromptLookup(), PromptLookup()
        lookup.propose(base + spec, 4)
        kept = base[:cut] + after
        assert lookup.propose(kept, 8) == fresh.propose(kept, 8)
        state = (lookup.tokens, lookup.next, lookup.link, lookup.length, lookup.last_end, lookup.last)
        assert state == (fresh.tokens, fresh.next, fresh.link, fresh.length, fresh.last_end, fresh.last)
    lookup = PromptLookup()
    lookup.propose(list(range(300)), 4)
    lookup.propose([7] + list(range(1, 300)), 4)  # past the journal: rebuilt, still right
    assert lookup.tokens == [7] + list(range(1, 299))

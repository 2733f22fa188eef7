"""Runtime: sampler chain, stops, streaming, cancellation, KV-cache trimming, bad input, and the
real Qwen model answering a factual question."""

from __future__ import annotations

import threading

import mlx.core as mx
import pytest

from runtime import ModelNotFound, PromptCache, SamplingParams, SamplingStrategy, Step, TokenSampler, load_model
from runtime.sequence import Sequence
from runtime.stops import StopStrings


class ForcedStrategy:
    """Appends a fixed token sequence, `per_step` tokens per forward pass (like jump-forward)."""

    def __init__(self, ids, per_step=1):
        self.ids, self.per_step, self.pos = list(ids), per_step, 0
        self.seen_logits = []

    def begin(self, prompt_ids):
        pass

    def prepare(self):
        pass

    def step(self, logits):
        self.seen_logits.append(logits)
        chunk = self.ids[self.pos : self.pos + self.per_step]
        self.pos += len(chunk)
        if not chunk:
            return Step(finish="stop")
        return Step(tokens=chunk, forced=len(chunk) - 1)

    def rollback(self, n):
        self.pos -= n


def test_seeded_sampling_is_reproducible(tiny_model):
    params = SamplingParams(temperature=1.0, seed=7)
    a = tiny_model.generate("Hello", sampling=params, max_tokens=12)
    b = tiny_model.generate("Hello", sampling=params, max_tokens=12)
    c = tiny_model.generate("Hello", sampling=SamplingParams(temperature=1.0, seed=8), max_tokens=12)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_greedy_equals_argmax_and_filters_reduce_to_greedy(tiny_model):
    greedy = tiny_model.generate("Hi", max_tokens=8).token_ids
    assert (
        tiny_model.generate("Hi", sampling=SamplingParams(temperature=1.0, top_k=1, seed=1), max_tokens=8).token_ids
        == greedy
    )
    assert (
        tiny_model.generate("Hi", sampling=SamplingParams(temperature=1.0, min_p=1.0, seed=1), max_tokens=8).token_ids
        == greedy
    )
    assert (
        tiny_model.generate("Hi", sampling=SamplingParams(temperature=1.0, top_p=1e-6, seed=1), max_tokens=8).token_ids
        == greedy
    )


def test_top_k_and_min_p_restrict_the_candidates():
    logits = mx.array([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    for params, allowed in (
        (SamplingParams(temperature=5.0, top_k=2), {0, 1}),
        (SamplingParams(temperature=5.0, min_p=0.3), {0, 1}),  # p >= 0.3 * p_max keeps e^-1 = 0.37, not e^-2
        (SamplingParams(temperature=5.0, top_p=0.8), {0, 1}),  # p0 = 0.64, p0 + p1 = 0.88
    ):
        sampler = TokenSampler(params)
        drawn = {sampler.verify(logprobs, [], position=i)[1] for i in range(200)}
        assert drawn == allowed, params


def test_repetition_penalty_scales_recent_tokens_only():
    penalized = SamplingStrategy(SamplingParams(repetition_penalty=2.0, repetition_context_size=2))
    penalized.begin([0, 1, 2])  # token 0 left the window
    out = penalized.logprobs(mx.array([[2.0, 2.0, -2.0, 2.0]]), [])
    raw = SamplingStrategy().logprobs(mx.array([[2.0, 1.0, -4.0, 2.0]]), [])
    assert mx.allclose(out, raw, atol=1e-5)
    # a draft token before a position counts as history at that position
    rows = penalized.logprobs(mx.array([[2.0, 2.0, -2.0, 2.0]] * 2), [3])
    assert mx.allclose(rows[0], out[0]) and rows[1, 3] < rows[0, 3]


def test_stop_strings_across_token_boundaries():
    stops = StopStrings(["END", "\n\n"])
    emitted = []
    for piece in ["ab", "cE", "N", "Dxyz"]:
        text, hit = stops.feed(piece)
        emitted.append(text)
        if hit:
            break
    assert "".join(emitted) == "abc" and hit == "END"
    stops = StopStrings(["END"])
    assert stops.feed("xE") == ("x", None)
    assert stops.feed("Nd") == ("ENd", None)


def test_stop_string_in_generation_is_trimmed(tiny_model):
    ids = tiny_model.tokenizer.encode("one two three four five", add_special_tokens=False)
    result = tiny_model.generate("x", strategy=ForcedStrategy(ids), stop=["ee fo"], max_tokens=50)
    assert result.finish_reason == "stop"
    assert result.text == "one two thr"


def reported_tokens(tokenizer, ids, stop, per_step):
    """Drive `Sequence` (no model) with `ids`, `per_step` per step: (content, reported ids, deltas)."""
    seq = Sequence(tokenizer, [tokenizer.bos_id or 0], max_tokens=100, stop=[stop])
    deltas, pos = [], 0
    while seq.finish is None:
        chunk = ids[pos : pos + per_step]
        pos += len(chunk)
        rows = mx.zeros((len(chunk), 4)) if chunk else None
        seq.apply(Step(tokens=chunk, logprobs=rows, finish=None if chunk else "stop"))
        if (delta := seq.emit()) is not None:
            deltas.append(delta)
    reported = [t for d in deltas for t in d.token_ids]
    assert all(len(d.logprobs or []) == len(d.token_ids) for d in deltas)
    return "".join(d.text for d in deltas), reported, deltas


STOP_CASES = [
    ("one two three four five", "ee fo"),
    ("one two three four five", " four"),
    ("one two three four five", "e"),
    ("1 2 3 4 5 6 7 8 9", " 5"),  # issue 24: " 5" is two tokens, " " then "5"
    ("1 2 3 4 5 6 7 8 9", "5"),
    ("a  b   c", "  c"),  # runs of spaces
    ("go 🚀🎉 now", "🎉"),  # a stop string in the middle of a multi-token character sequence
    ("go 🚀🎉 now", "\U0001f389 n"),
    ("深圳湾公园 naïve", "公"),
    ("no stop here", "zzz"),
]


@pytest.mark.parametrize("text, stop", STOP_CASES)
@pytest.mark.parametrize("per_step", [1, 3])
@pytest.mark.parametrize(
    "tokenizer",
    ["tiny_tokenizer"] + [pytest.param(t, marks=pytest.mark.model) for t in ("qwen_tokenizer", "gemma_tokenizer")],
)
def test_a_token_is_reported_iff_all_its_text_is_in_the_content(request, tokenizer, text, stop, per_step):
    """Issue 24: the tokens reported with a delta (and their logprobs) are exactly the longest run
    of output tokens whose text is all in the content, whatever the tokenizer's detokenizer holds
    back (Qwen's lone spaces and split characters, Gemma's SentencePiece words)."""
    tokenizer = request.getfixturevalue(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    content, reported, _ = reported_tokens(tokenizer, ids, stop, per_step)
    assert content == text.split(stop)[0]
    decode = lambda t: tokenizer.hf.decode(t, clean_up_tokenization_spaces=False)  # noqa: E731
    n = len(reported)
    assert reported == ids[:n]
    assert content.startswith(decode(reported)) or n == 0
    complete = [m for m in range(n + 1, len(ids) + 1) if not decode(ids[:m]).endswith("\ufffd")]
    if complete:  # the next run of tokens that ends a character has text beyond the content
        assert not content.startswith(decode(ids[: complete[0]])), (content, decode(ids[: complete[0]]))


def test_utf8_streaming_never_splits_characters(tiny_model):
    text = "深圳湾公园 🚀🎉 naïve “quotes” 한국어"
    ids = tiny_model.tokenizer.encode(text, add_special_tokens=False)
    for per_step in (1, 3):
        deltas = list(tiny_model.stream("x", strategy=ForcedStrategy(ids, per_step), max_tokens=100))
        assert all("\ufffd" not in d.text for d in deltas)
        assert "".join(d.text for d in deltas) == text
        result = deltas[-1].result
        assert result.text == text and result.finish_reason == "stop"
        assert result.token_ids == ids
        assert result.forward_passes == 1 + -(-len(ids) // per_step)  # prompt pass + one per step


def test_max_tokens_one(tiny_model):
    result = tiny_model.generate("Hello", max_tokens=1)
    assert result.finish_reason == "length" and len(result.token_ids) == 1
    assert result.usage.completion_tokens == 1


def test_a_step_cut_by_max_tokens_ends_length_and_its_overrun_is_handed_back(tiny_model):
    """A strategy whose last step (several tokens, e.g. a grammar's jump-forward to its end) says
    "stop" but runs past max_tokens: the output ends "length" (never "stop" with the end cut off), and
    the tokens past the budget are rolled back from the strategy, solo and batched."""
    from runtime.batch import BatchGenerator

    ids = tiny_model.tokenizer.encode(" alpha beta gamma delta epsilon zeta", add_special_tokens=False)[:6]

    class Ending(ForcedStrategy):
        def step(self, logits):
            step = super().step(logits)
            step.finish = step.finish or ("stop" if self.pos == len(self.ids) else None)
            return step

    solo = Ending(ids, per_step=4)
    result = tiny_model.generate("x", strategy=solo, max_tokens=6 - 1)
    batch = BatchGenerator(tiny_model.network, tiny_model.tokenizer, max_batch=2)
    batched = Ending(ids, per_step=4)
    batch.add(tiny_model.prompt_ids("x"), batched, max_tokens=6 - 1, tag=0)
    last = None
    while len(batch):
        last = next((d.result for _, d in batch.step() if d.result is not None), last)
    for r, strategy in ((result, solo), (last, batched)):
        assert r.finish_reason == "length" and r.token_ids == ids[:5]
        assert strategy.pos == 5  # the 6th token, past the budget, was handed back
    whole = tiny_model.generate("x", strategy=Ending(ids, per_step=4), max_tokens=6)
    assert whole.finish_reason == "stop" and whole.token_ids == ids  # the budget held all of it


def test_end_of_turn_id_stops_without_text(tiny_model):
    eos = max(tiny_model.tokenizer.eos_ids)
    ids = tiny_model.tokenizer.encode("ok", add_special_tokens=False) + [eos] + [100, 101]
    result = tiny_model.generate("x", strategy=ForcedStrategy(ids), max_tokens=20)
    assert result.finish_reason == "stop" and result.text == "ok"
    assert eos not in result.token_ids


def test_cancellation_from_another_thread(tiny_model):
    cancel = threading.Event()
    deltas = []
    for delta in tiny_model.stream("Hello", max_tokens=400, cancel=cancel):
        deltas.append(delta)
        if len(deltas) == 3:
            threading.Thread(target=cancel.set).start()
    result = deltas[-1].result
    assert result.finish_reason == "cancelled"
    assert len(result.token_ids) < 400


def test_rollback_trims_the_kv_cache(tiny_model):
    tok = tiny_model.tokenizer
    a, b, c = tok.encode(" alpha beta gamma", add_special_tokens=False)[:3]

    class RollingBack(ForcedStrategy):
        def step(self, logits):
            self.seen_logits.append(logits)
            n = len(self.seen_logits)
            if n == 1:
                return Step(tokens=[a, b], hold=1)  # b may be rolled back: not streamed yet
            if n == 2:
                return Step(tokens=[c], rollback=1, hold=1)  # drop b, then append c: sequence a c
            if n == 3:
                return Step(rollback=1, hold=1)  # drop c, append nothing: "a" is scored again
            return Step(finish="stop")

    strategy = RollingBack([])
    deltas = list(tiny_model.stream("x", strategy=strategy, max_tokens=10))
    result = deltas[-1].result
    assert result.token_ids == [a] and result.text == tok.decode([a])
    assert [t for d in deltas for t in d.token_ids] == [a]  # b and c were never streamed
    reference = ForcedStrategy([a, c, a])
    tiny_model.generate("x", strategy=reference, max_tokens=10)
    # logits after "a c" must equal a fresh run over the same tokens: b left no trace in the cache
    assert mx.allclose(strategy.seen_logits[2], reference.seen_logits[2], atol=1e-4)
    # after rolling c back without appending, the logits are those after "a" again
    assert mx.allclose(strategy.seen_logits[3], reference.seen_logits[1], atol=1e-4)


def test_rolling_back_streamed_tokens_is_an_error(tiny_model):
    tok = tiny_model.tokenizer
    a = tok.encode(" alpha", add_special_tokens=False)[0]
    steps = iter([Step(tokens=[a]), Step(tokens=[a], rollback=1)])

    class Streamed(ForcedStrategy):
        def step(self, logits):
            return next(steps)

    with pytest.raises(RuntimeError, match="held back"):
        tiny_model.generate("x", strategy=Streamed([]), max_tokens=10)


def test_prompt_cache_reuses_the_shared_prefix(tiny_model):
    cache = PromptCache(tiny_model.network)
    system = [{"role": "system", "content": "You are terse. " * 20}]
    first = tiny_model.generate(system + [{"role": "user", "content": "a"}], max_tokens=4, prompt_cache=cache)
    second = tiny_model.generate(system + [{"role": "user", "content": "b"}], max_tokens=4, prompt_cache=cache)
    fresh = tiny_model.generate(system + [{"role": "user", "content": "b"}], max_tokens=4)
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens > 60
    assert second.token_ids == fresh.token_ids


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=-1), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(min_p=2), "min_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(seed=-1), "seed"),
        (dict(temperature=-0.5), "temperature"),
    ],
)
def test_bad_parameters_raise_before_work(tiny_model, kwargs, name):
    if name != "max_tokens":  # sampling parameters are checked once, when SamplingParams is made
        with pytest.raises(ValueError, match=name):
            SamplingParams(**kwargs)
    with pytest.raises(ValueError, match=name):
        tiny_model.stream("Hello", **kwargs)


def test_prompt_longer_than_context(tiny_model):
    with pytest.raises(ValueError, match="context"):
        tiny_model.stream("word " * 600, max_tokens=2)


def test_unknown_model_and_missing_folder(tmp_path):
    import coreai

    with pytest.raises(ModelNotFound, match="known models"):
        coreai.load("no-such-model")
    with pytest.raises(ModelNotFound, match="config.json"):
        load_model(tmp_path)


def test_strategy_protocol_default_is_sampling(tiny_model):
    from runtime import DecodingStrategy

    assert isinstance(SamplingStrategy(), DecodingStrategy)


@pytest.mark.model
def test_real_qwen_answers_a_factual_question(qwen_model):
    result = qwen_model.generate("What is the capital of France? Answer in one word.", max_tokens=8)
    assert "Paris" in result.text
    assert result.finish_reason in ("stop", "length")
    assert result.timings.ttft > 0 and result.usage.prompt_tokens > 10


@pytest.mark.parametrize(
    "vocab", [pytest.param("qwen", marks=pytest.mark.model), pytest.param("gemma", marks=pytest.mark.model), "tiny"]
)
@pytest.mark.parametrize("text", [" yes", " 1, 2", "  two spaces", "\n<end>"])
def test_streamed_text_keeps_a_leading_space(vocab, text, request):
    """The streamed text is exactly the tokens' text: mlx-lm's detokenizers drop a leading space by
    default, which turned a grammar's " yes" into "yes" (an output outside the choices)."""
    tok = request.getfixturevalue(f"{vocab}_tokenizer")
    detok = tok.detokenizer()
    for i in tok.hf.encode(text, add_special_tokens=False):
        detok.add_token(i)
    detok.finalize()
    assert detok.text == text


def test_channels_label_the_streamed_text(tiny_model):
    """`Step.channels` labels tokens, and may relabel tokens still held back: every token is held one
    step as "new", then relabelled "old"; the streamed parts and the result's parts carry the labels."""
    from runtime import SamplingStrategy

    class Relabel(SamplingStrategy):
        def advance(self, accepted, token):
            step = super().advance(accepted, token)
            earlier = ["old"] if len(self.context) > self.prompt_len else []
            step.channels, step.hold = earlier + ["new"] * len(step.tokens), 1
            return step

        def begin(self, prompt_ids, drafter=None):
            super().begin(prompt_ids, drafter)
            self.prompt_len = len(prompt_ids)

    parts = []
    for delta in tiny_model.stream("hi", strategy=Relabel(), max_tokens=8, chat_template=False):
        parts += delta.parts
        assert "".join(t for _, t in delta.parts) == delta.text
    result = delta.result
    assert "".join(t for _, t in result.parts) == result.text
    labels = [label for label, _ in result.parts]
    assert labels in (["old", "new"], ["old"]), result.parts  # the last token's text may be empty
    assert [label for label, _ in parts if _][:1] == ["old"]


def test_each_delta_is_emitted_before_the_next_pass_on_the_cpu(tiny_model):
    """On the CPU backend `mx.async_eval` returns only once most of a pass has run, so a delta must be
    yielded before the next pass is launched, or each token (the first one's TTFT too) waits for most
    of a pass; on Metal the pass is launched first, to overlap the caller's work."""
    from types import SimpleNamespace

    from runtime import stream_tokens

    calls = []

    class Counted:  # the network, counting its passes (the KV cache is made from its layers)
        def __getattr__(self, name):
            return getattr(tiny_model.network, name)

        def __call__(self, ids, cache):
            calls.append(ids.shape[1])
            return tiny_model.network(ids, cache=cache)

    network = Counted()

    tokenizer = SimpleNamespace(eos_ids=set(), detokenizer=tiny_model.tokenizer.detokenizer)
    prompt = tiny_model.tokenizer.encode("Hello there", add_special_tokens=False)
    seen = []
    for delta in stream_tokens(network, tokenizer, prompt, SamplingStrategy(), max_tokens=5):
        seen.append((len(calls), len(delta.token_ids)))
    on_cpu = mx.default_device() == mx.cpu
    prefill = len(calls) - 5  # the chunks of all but the last prompt token, before the first logits
    produced = 0
    for passes, n in seen:
        produced += n
        # passes run when a delta arrives: the prefill's, then one per token produced so far, and one
        # more (the next token's pass, already launched) on Metal unless the output is complete
        ahead = 0 if on_cpu or produced == 5 else 1
        assert passes == prefill + produced + ahead

"""Guided generation with the real tokenizers (Qwen byte-level BPE with llama.cpp padding, Gemma
SentencePiece with byte fallback), the session on a tiny random Qwen-shaped model, and the real
Qwen model extracting an address (marked `model`)."""

from __future__ import annotations

import json
from pathlib import Path

import coreai  # noqa: F401 - loads the system BLAS before mlx.core

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from coreai import ConstrainedSession  # noqa: E402
from guided import (  # noqa: E402
    ConstrainedDecodingStrategy,
    check_json,
    compile_grammar,
    get_tokenizer_info,
    make_spec,
)
from runtime.sampling import SamplingParams  # noqa: E402

DATA = Path(__file__).parent / "data" / "guided"
QWEN_LOGITS = 151_936  # Qwen2.5 config vocab_size; the tokenizer has 151,665 real tokens
GEMMA_LOGITS = 262_144

VALUES = {
    "name": "深圳湾公园 😀 ü",
    "n": -12.5e3,
    "k": 0,
    "s": 'a "quoted" \\ back\nslash\ttab \u0001',
    "t": [True, None],
}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "n": {"type": "number"},
        "k": {"type": "integer"},
        "s": {"type": "string"},
        "t": {"type": "array"},
    },
    "required": ["name", "n", "k", "s", "t"],
}


@pytest.fixture(scope="module")
def qwen_info(qwen_tokenizer):
    return get_tokenizer_info(qwen_tokenizer.hf, QWEN_LOGITS, qwen_tokenizer.eos_ids)


@pytest.fixture(scope="module")
def gemma_info(gemma_tokenizer):
    return get_tokenizer_info(gemma_tokenizer.hf, GEMMA_LOGITS, gemma_tokenizer.eos_ids)


@pytest.fixture(scope="module")
def tiny_info(tiny_model):
    return get_tokenizer_info(tiny_model.tokenizer.hf, tiny_model.vocab_size, tiny_model.tokenizer.eos_ids)


def mask_of(matcher) -> np.ndarray:
    buf = np.zeros((1, matcher.words), np.int32)
    matcher.fill_next_token_bitmask(buf)
    return np.unpackbits(buf.view(np.uint8), bitorder="little").astype(bool)


def test_qwen_padding_never_allowed(qwen_info, qwen_tokenizer):
    pad = set(range(151_665, QWEN_LOGITS))
    assert pad <= qwen_info.padding_ids and len(qwen_info.padding_ids) == 271
    assert qwen_info.ll_tokenizer.is_special_token(151_700)  # no longer "[PAD151700]" text
    for regex in (r"[\[\]A-Z0-9]+", r"[\s\S]*"):
        m = compile_grammar(make_spec(regex=regex), qwen_info).matcher()
        mask = mask_of(m)
        assert mask.sum() > 1000 and not mask[sorted(pad)].any()
        assert not mask[sorted(qwen_info.eos_ids)].any() or m.is_accepting()


def test_tiny_padding_never_allowed(tiny_info, tiny_model):
    """The tiny network's logit width exceeds its tokenizer, as Qwen's: the ids past the vocabulary
    are padding, never allowed by any grammar."""
    pad = set(range(len(tiny_model.tokenizer), tiny_model.vocab_size))
    assert pad and tiny_info.padding_ids >= pad
    for regex in (r"[\[\]A-Z0-9]+", r"[\s\S]*"):
        mask = mask_of(compile_grammar(make_spec(regex=regex), tiny_info).matcher())
        assert mask.sum() > 40 and not mask[sorted(pad)].any()


@pytest.mark.parametrize(
    "which", [pytest.param("qwen", marks=pytest.mark.model), pytest.param("gemma", marks=pytest.mark.model), "tiny"]
)
def test_real_tokenizer_accepts_cjk_emoji_numbers_escapes(which, request):
    tok = request.getfixturevalue(f"{which}_tokenizer")
    info = request.getfixturevalue(f"{which}_info")
    text = json.dumps(VALUES, ensure_ascii=False, separators=(",", ":"))
    assert json.loads(text) == VALUES
    m = compile_grammar(make_spec(schema=SCHEMA), info).matcher()
    tokens = tok.hf.encode(text, add_special_tokens=False)
    for i, t in enumerate(tokens):
        assert not m.is_accepting(), i
        assert not mask_of(m)[list(info.eos_ids)].any(), "EOS allowed before the end"
        assert m.accept_token(t), (i, tok.hf.decode(tokens[: i + 1]), m.error)
    assert m.is_accepting() and mask_of(m)[list(info.eos_ids)].all()
    # the same text with a broken escape is refused
    bad = compile_grammar(make_spec(schema=SCHEMA), info).matcher()
    assert not bad.accept_tokens(tok.hf.encode('{"name":"a\\q"', add_special_tokens=False))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_random_logits_at_qwen_width(qwen_info, qwen_tokenizer, dtype):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "altitude": {"type": "integer", "minimum": 0, "maximum": 9000},
            "mode": {"enum": ["fly", "hover"]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 4},
        },
        "required": ["city", "altitude", "mode", "tags"],
    }
    compiled = compile_grammar(make_spec(schema=schema), qwen_info)
    rng = np.random.default_rng(0)
    for _seed in range(2):
        strategy = ConstrainedDecodingStrategy(compiled, SamplingParams(temperature=1.0))
        strategy.begin([1])
        tokens = []
        for _ in range(300):
            strategy.prepare()
            allowed = np.unpackbits(np.array(strategy.bitmask.current).view(np.uint8), bitorder="little")
            assert not allowed[151_665:].any()
            step = strategy.step(mx.array(rng.normal(size=(1, QWEN_LOGITS)) * 4).astype(dtype))
            assert not step.tokens or allowed[step.tokens[0]]
            tokens += step.tokens
            if step.finish:
                break
        assert step.finish == "stop", step
        text = qwen_tokenizer.decode([t for t in tokens if t not in qwen_info.eos_ids])
        value, errors = check_json(text, schema)
        assert not errors, (text, errors)


# -- the session on a tiny random network with the tiny tokenizer ----------------------------------------

TINY_SCHEMA = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "maxLength": 10},
        "altitude": {"type": "integer", "minimum": 0, "maximum": 500},
        "confirm": {"type": "boolean"},
    },
    "required": ["location", "altitude", "confirm"],
}


def test_session_generate_valid_json(tiny_model):
    session = ConstrainedSession(tiny_model, schema=TINY_SCHEMA)
    result = session.generate("fly to Shenzhen Bay Park at 100 metres", max_tokens=64)
    assert result.finish_reason == "stop" and result.complete and result.valid, result
    assert list(result.value) == ["location", "altitude", "confirm"]
    assert result.forced_tokens > 0
    assert result.forward_passes < result.usage.completion_tokens + 1  # jump-forward saved passes
    assert result.stats.masks >= result.forward_passes - 1  # a row per position of every decode pass


def test_session_stream_and_length(tiny_model):
    session = ConstrainedSession(tiny_model, schema=TINY_SCHEMA)
    deltas = list(session.stream("hello", max_tokens=64, temperature=0.7, seed=3))
    result = deltas[-1].result
    assert "".join(d.text for d in deltas) == result.text and result.valid
    short = session.generate("hello", max_tokens=3)
    assert short.finish_reason == "length" and not short.complete and not short.valid
    assert short.errors and short.errors[0].startswith("incomplete")


def test_session_choices_regex_grammar(tiny_model):
    for kwargs, check in (
        ({"choices": ["yes", "no", "深圳"]}, lambda t: t in ("yes", "no", "深圳")),
        ({"regex": r"[0-9]{3}-[a-z]{2}"}, lambda t: len(t) == 6 and t[3] == "-"),
        ({"grammar": str(DATA / "arithmetic.gbnf")}, lambda t: t[0].isdigit() or t[0] == "("),
    ):
        result = ConstrainedSession(tiny_model, **kwargs).generate("go", max_tokens=12)
        if result.finish_reason == "stop":
            assert result.valid and check(result.text), (kwargs, result.text)
        else:
            assert result.finish_reason == "length" and not result.valid


def test_a_stop_string_that_cuts_a_constrained_output_makes_it_invalid(tiny_model):
    """A stop string found inside the grammar's text cuts what the grammar accepted (here inside the
    forced output "Paris", then inside the last of a JSON string's tokens): never a valid "stop"
    with a cut output. A stop string that leaves text the grammar accepts is an ordinary stop."""
    for kwargs, stop in (({"regex": "Paris"}, "is"), ({"regex": "(yes|no)"}, "s"), ({"choices": ["ab"]}, "b")):
        result = ConstrainedSession(tiny_model, **kwargs).generate("Answer:", stop=[stop], max_tokens=8)
        if stop in "".join(tiny_model.tokenizer.decode([t]) for t in result.token_ids):
            assert result.finish_reason == "error" and not result.valid, (kwargs, result.text)
            assert "stop string" in result.error
    no_end = {t: -100.0 for t in tiny_model.tokenizer.eos_ids}  # no end after "Par": "is" must follow
    kept = ConstrainedSession(tiny_model, regex="Par(is)?").generate(
        "Answer:", stop=["is"], max_tokens=8, logit_bias=no_end
    )
    assert kept.text == "Par" and kept.stop_string == "is" and kept.finish_reason == "stop" and kept.valid


def test_a_final_check_that_raises_makes_the_output_invalid(tiny_model):
    """An output the final check cannot check is invalid (finish_reason "error" with the reason),
    never valid by default and never an exception out of the verdict (the server's worker calls it)."""

    def broken(text):
        raise RuntimeError("checker bug")

    result = ConstrainedSession(tiny_model, choices=["ab"], check=broken).generate("go", max_tokens=4)
    assert result.text == "ab" and not result.valid and result.finish_reason == "error"
    assert "the final check failed: RuntimeError: checker bug" in result.error


def test_session_low_level_calls(tiny_model):
    session = ConstrainedSession(tiny_model, regex="ab[0-9]+")
    mask = session.next_token_bitmask()
    assert mask.dtype == mx.int32 and mask.shape == (1, (tiny_model.vocab_size + 31) // 32)
    logits = session.apply_mask(mx.zeros((1, tiny_model.vocab_size), dtype=mx.bfloat16))
    first = int(mx.argmax(logits, axis=-1).item())
    assert session.accept_token(first)
    text = tiny_model.tokenizer.decode([first])
    assert "ab".startswith(text) or text.startswith("ab")
    forced = session.jump_forward_string()
    assert (text + forced).startswith("ab") and not session.is_terminated
    assert session.rollback(1) and not session.rollback(1)
    session.reset()
    assert np.array_equal(np.array(session.next_token_bitmask()), np.array(mask))


# -- the real Qwen model ------------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("whitespace", [None, "compact"])
def test_qwen_extracts_shipping_address(qwen_model, whitespace):
    """The default layout is the model's own pretty-printing (indent 2); "compact" forces `{"k":"v"}`
    and, with no whitespace to choose, the keys and their punctuation are forced tokens."""
    session = ConstrainedSession(qwen_model, schema=DATA / "address.schema.json", whitespace=whitespace)
    result = session.generate(
        "Extract the shipping address from this message as JSON: 'Hi, please ship my order to Jane Doe, "
        "42 Baker Street, London, postal code NW1 6XE, United Kingdom. Thanks!'",
        max_tokens=120,
    )
    assert result.valid and result.finish_reason == "stop", (result.text, result.errors)
    assert result.value["name"] == "Jane Doe"
    assert "42 Baker Street" in result.value["street"] and result.value["city"] == "London"
    assert result.value["postal_code"] == "NW1 6XE" and "United Kingdom" in result.value["country"]
    if whitespace == "compact":
        assert result.text == json.dumps(result.value, separators=(",", ":"), ensure_ascii=False)
        assert result.forced_tokens >= 10  # the five keys and their punctuation
    else:
        assert result.text == json.dumps(result.value, indent=2, ensure_ascii=False)


@pytest.mark.parametrize(
    "vocab", [pytest.param("qwen", marks=pytest.mark.model), pytest.param("gemma", marks=pytest.mark.model), "tiny"]
)
@pytest.mark.parametrize("text", ["x <|im_end|> y", "</tool_call>", "<tool_call><end_of_turn><start_of_turn>"])
def test_added_token_text_inside_a_string_is_spelled_as_text(vocab, text, request):
    """Text equal to an added token's content ("<|im_end|>", "</tool_call>", "<end_of_turn>") is spelled with
    ordinary tokens: the mask allows a token that starts it and never an added token, and jump-forward
    completes it."""
    hf, info = request.getfixturevalue(f"{vocab}_tokenizer").hf, request.getfixturevalue(f"{vocab}_info")
    # compact, so the closing brace is forced too (a layout with whitespace leaves it open after the quote)
    schema = {"type": "object", "properties": {"t": {"const": text}}, "required": ["t"]}
    spec = make_spec(schema=schema, whitespace="compact")
    matcher = compile_grammar(spec, info).matcher()
    prefix = '{"t":"' + text[: text.index("<")]
    assert matcher.accept_tokens(hf.encode(prefix, add_special_tokens=False))
    allowed = mask_of(matcher)
    added = [i for i in hf.added_tokens_decoder if i < info.vocab_size]
    assert allowed.any() and not allowed[added].any()
    forced = matcher.jump_forward_tokens()
    assert not set(forced) & set(added) and hf.decode(forced) == text[text.index("<") :] + '"}', forced
    assert matcher.accept_tokens(forced) and matcher.is_accepting()


def test_generation_spells_added_token_text(qwen_model):
    """End to end: the model writes a string containing "<|im_end|>" and "</tool_call>" as text."""
    schema = {"type": "object", "properties": {"t": {"const": "a <|im_end|> </tool_call>"}}, "required": ["t"]}
    result = ConstrainedSession(qwen_model, schema=schema).generate("Say anything.", max_tokens=30)
    assert result.finish_reason == "stop" and result.valid, (result.text, result.errors)
    assert result.value == {"t": "a <|im_end|> </tool_call>"}


def test_choice_with_a_leading_space_is_returned_exactly(qwen_model):
    result = ConstrainedSession(qwen_model, choices=[" yes", " no"]).generate("Is water wet?", max_tokens=4)
    assert result.valid and result.text in (" yes", " no"), repr(result.text)


def test_session_takes_every_sampling_field_and_checks_options_early(tiny_model):
    session = ConstrainedSession(tiny_model, regex="[a-z ]+")
    result = session.generate("Hi", max_tokens=6, frequency_penalty=2.0, presence_penalty=1.0, temperature=0.5, seed=1)
    assert result.usage.completion_tokens >= 1
    with pytest.raises(ValueError, match="not both"):
        session.generate("Hi", max_tokens=4, sampling=SamplingParams(), top_k=3)
    with pytest.raises(ValueError, match="speculative"):
        ConstrainedSession(tiny_model, json_object=True, speculative="bogus")

"""Guided generation without a model: grammars fed token by token, a toy byte-level vocabulary,
bitmask buffers, the decoding strategy driven by random logits, the cache, and every error path."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import coreai  # noqa: F401 - loads the system BLAS before mlx.core

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from llguidance import LLParserLimits  # noqa: E402

from guided import (  # noqa: E402
    ConstrainedDecodingStrategy,
    GrammarCache,
    GrammarError,
    SchemaError,
    TokenBitmask,
    UnsupportedSchemaFeature,
    apply_token_bitmask,
    check_json,
    compile_grammar,
    get_tokenizer_info,
    make_spec,
)
from runtime.sampling import SamplingParams  # noqa: E402

DATA = Path(__file__).parent / "data" / "guided"
VOCAB = 320  # logit width of the toy "model": ids 267..319 are padding


@pytest.fixture(scope="module")
def toy():
    """A byte-level BPE tokenizer: 256 byte tokens, 8 merges, <eos> and <eot> (end ids) and <sp> (special)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = []
    for a, b in [("a", "b"), ("ab", "c"), ("{", '"'), ('"', ":"), ("1", "2"), ("t", "r"), ("tr", "u"), ("tru", "e")]:
        merges.append((a, b))
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    hf.add_special_tokens({"eos_token": "<eos>", "additional_special_tokens": ["<eot>", "<sp>"]})
    return hf


@pytest.fixture(scope="module")
def info(toy):
    return get_tokenizer_info(toy, VOCAB, [toy.eos_token_id, toy.convert_tokens_to_ids("<eot>")])


def ids(toy, text):
    return toy.encode(text, add_special_tokens=False)


def allowed(matcher) -> set[int]:
    buf = np.zeros((1, matcher.words), np.int32)
    matcher.fill_next_token_bitmask(buf)
    return set(np.nonzero(np.unpackbits(buf.view(np.uint8), bitorder="little"))[0].tolist())


def matcher_for(info, **spec):
    return compile_grammar(make_spec(**spec), info).matcher()


def feed(info, toy, text, **spec) -> bool:
    """Feed `text` token by token as generation would; check EOS is allowed exactly where the grammar
    can end, padding and non-end special ids never. True if every token was accepted and the grammar can end."""
    m = matcher_for(info, **spec)
    never = info.padding_ids | {toy.convert_tokens_to_ids("<sp>")}
    for t in ids(toy, text):
        mask = allowed(m)
        assert not mask & never
        assert (info.eos_ids[0] in mask) == m.is_accepting()
        if t not in mask:
            # Not generable here. (In forced stretches the mask holds only the canonical token, while
            # accept_token may still take another spelling, so the mask is the test's authority.)
            return False
        assert m.accept_token(t)
    mask = allowed(m)
    assert (set(info.eos_ids) <= mask) == m.is_accepting()
    return m.is_accepting()


# -- grammars fed token by token (in the spirit of llama.cpp's tests/test-grammar-llguidance.cpp) ------


def test_arithmetic_gbnf(info, toy):
    grammar = str(DATA / "arithmetic.gbnf")
    for text in ["1", "1+2", "12*(3-4)/5", "((7))"]:
        assert feed(info, toy, text, grammar=grammar), text
    for text in ["", "1+", "+1", "1++2", "(1", "1)", "a"]:
        assert not feed(info, toy, text, grammar=grammar), text


def test_lark_with_llguidance_prefix(info, toy):
    lark = '%llguidance {}\nstart: "ab" num\nnum: /[0-9]+/\n'
    assert feed(info, toy, "ab12", grammar=lark)
    assert not feed(info, toy, "ab", grammar=lark)


def test_emoji_is_one_character(info, toy):
    # The emoji is 4 UTF-8 bytes, 4 byte tokens here; the grammar counts characters.
    assert feed(info, toy, "😀", regex=".")
    assert feed(info, toy, "深😀a", regex=".{3}")
    assert not feed(info, toy, "😀😀", regex=".")
    assert not feed(info, toy, "ab", regex=".")


@pytest.mark.parametrize(
    "regex,good,bad",
    [
        ("xa*", ["x", "xa", "xaaaa"], ["", "xb"]),
        ("xa+", ["xa", "xaaa"], ["x"]),
        ("xa?", ["x", "xa"], ["xaa"]),
        ("a{3}", ["aaa"], ["aa", "aaaa"]),
        ("a{2,}", ["aa", "aaaaaa"], ["a"]),
        ("a{0,2}", ["", "a", "aa"], ["aaa"]),
    ],
)
def test_repetitions(info, toy, regex, good, bad):
    for text in good:
        assert feed(info, toy, text, regex=regex), (regex, text)
    for text in bad:
        assert not feed(info, toy, text, regex=regex), (regex, text)


def test_choices_with_quotes_and_unicode(info, toy):
    choices = ['say "hi"', "back\\slash", "深圳"]
    for c in choices:
        assert feed(info, toy, c, choices=choices)
    assert not feed(info, toy, "say", choices=choices)


def test_json_whitespace_options(info, toy):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    # the default ("pretty"): nothing, one space, or one line break and indentation between tokens
    for text in ['{"a":1}', '{"a": 1}', '{\n  "a": 1\n}', '{ "a" : 1 }']:
        assert feed(info, toy, text, schema=schema), text
    for text in ['{"a":  1}', '{\n\n"a":1}', '{"a":1 \n}', '{"a":1\n' + " " * 21 + "}"]:
        assert not feed(info, toy, text, schema=schema), text
    # "compact" (also any_whitespace=False): no whitespace at all
    for compact in ({"whitespace": "compact"}, {"any_whitespace": False}):
        assert feed(info, toy, '{"a":1}', schema=schema, **compact)
        assert not feed(info, toy, '{"a": 1}', schema=schema, **compact)
        assert not feed(info, toy, '{\n"a":1}', schema=schema, **compact)
    # "any" (also any_whitespace=True): any order, up to 2 line breaks
    for loose in ({"whitespace": "any"}, {"any_whitespace": True}):
        assert feed(info, toy, '{ "a" :\n 1 }', schema=schema, **loose)
        assert feed(info, toy, '{\n\n  "a":  1 \n}', schema=schema, **loose)


def test_whitespace_option_errors():
    with pytest.raises(ValueError, match="one of pretty, compact, any"):
        make_spec(schema={"type": "object"}, whitespace="tabs")
    with pytest.raises(ValueError, match="contradicts"):
        make_spec(schema={"type": "object"}, whitespace="pretty", any_whitespace=True)
    assert make_spec(schema={"type": "object"}, whitespace="any", any_whitespace=True).options["whitespace"] == "any"


def test_property_order_follows_schema(info, toy):
    schema = {
        "type": "object",
        "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}},
        "required": ["alpha", "zeta"],
    }
    assert feed(info, toy, '{"zeta":1,"alpha":2}', schema=schema)
    assert not feed(info, toy, '{"alpha":2,"zeta":1}', schema=schema)
    assert feed(info, toy, '{\n  "zeta": 1,\n  "alpha": 2\n}', schema=schema)
    assert not feed(info, toy, '{\n  "alpha": 2,\n  "zeta": 1\n}', schema=schema)
    m = matcher_for(info, schema=json.dumps(schema), whitespace="compact")  # JSON text keeps the order too
    assert m.jump_forward_string() == '{"zeta":'
    # with whitespace allowed after "{", the grammar forces only the brace
    assert matcher_for(info, schema=json.dumps(schema)).jump_forward_string() == "{"


def test_strict_mode(info, toy):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not feed(info, toy, '{"a":1,"b":2}', schema=schema)
    assert feed(info, toy, '{"a":1,"b":2}', schema=schema, strict=False)
    explicit = dict(schema, additionalProperties={"type": "integer"})
    assert feed(info, toy, '{"a":1,"b":2}', schema=explicit)
    # allOf parts are not closed: closing each would forbid the other part's keys
    combined = {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "integer"}}}]}
    assert feed(info, toy, '{"a":1,"b":2}', schema=combined)
    via_refs = {
        "definitions": {
            "base": {"properties": {"a": {"type": "integer"}}},
            "x": {"properties": {"b": {"type": "integer"}}},
        },
        "allOf": [{"$ref": "#/definitions/base"}, {"anyOf": [{"$ref": "#/definitions/x"}]}],
    }
    assert feed(info, toy, '{"a":1,"b":2}', schema=via_refs)
    branches = {"properties": {"a": {"type": "integer"}}, "anyOf": [{"properties": {"b": {"type": "integer"}}}]}
    assert feed(info, toy, '{"a":1,"b":2}', schema=branches)
    # strict can make a schema unsatisfiable; that is a SchemaError saying so, not an unsupported keyword
    with pytest.raises(SchemaError, match="strict") as err:
        compile_grammar(make_spec(schema=dict(schema, required=["a"], minProperties=2)), info)
    assert not isinstance(err.value, UnsupportedSchemaFeature)
    compile_grammar(make_spec(schema=dict(schema, required=["a"], minProperties=2), strict=False), info)
    # an unsatisfiable schema that strict mode did not touch does not blame it
    with pytest.raises(SchemaError, match="no JSON value satisfies") as err:
        compile_grammar(make_spec(schema={"type": "string", "pattern": "^a+$", "format": "date"}), info)
    assert "strict" not in str(err.value)


NEXT = {"$ref": "#"}


@pytest.mark.parametrize(
    "schema, where",
    [
        ({"type": "object", "properties": {"next": NEXT}, "required": ["next"]}, "/properties/next/$ref"),
        (
            {
                "$defs": {
                    "node": {"type": "object", "properties": {"kids": {"$ref": "#/$defs/kids"}}, "required": ["kids"]},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "minItems": 1},
                },
                "$ref": "#/$defs/node",
            },
            "/$defs/kids/items/$ref",
        ),
        ({"type": "array", "prefixItems": [{"type": "integer"}, NEXT], "minItems": 2}, "/prefixItems/1/$ref"),
        ({"anyOf": [{"not": {}}, {"allOf": [{"not": True}]}]}, "/anyOf/0/not"),
    ],
)
def test_schema_with_no_finite_value_is_refused(schema, where):
    """Every value would have to hold another value of the same schema (or `not` excludes all): no
    finite output exists, so the schema is refused before decoding rather than failing during it."""
    with pytest.raises(SchemaError, match="no finite JSON value") as err:
        make_spec(schema=schema)
    assert err.value.pointer == where


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"next": NEXT}},  # optional
        {"type": ["object", "null"], "properties": {"next": NEXT}, "required": ["next"]},  # null ends it
        {"type": "object", "properties": {"next": {"anyOf": [NEXT, {"type": "null"}]}}, "required": ["next"]},
        {"type": "array", "items": NEXT},  # [] ends it
        {"properties": {"next": NEXT}, "required": ["next"]},  # any non-object ends it
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"a": {}},
            "$ref": "#/definitions/a",
            "type": "object",
            "properties": {"next": NEXT},
            "required": ["next"],
        },  # draft 7 ignores $ref's siblings
    ],
)
def test_recursive_schema_with_a_finite_value_compiles(info, schema):
    compile_grammar(make_spec(schema=schema), info)


def test_a_chain_of_references_too_long_to_follow_is_left_to_the_engine(info):
    """The check gives up (Python's recursion limit) rather than fail the request; decoding such a
    schema then ends in `error`, as before the check existed."""
    chain = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(600)}
    chain["d600"] = {"type": "object", "properties": {"next": {"$ref": "#/$defs/d0"}}, "required": ["next"]}
    compile_grammar(make_spec(schema={"$defs": chain, "$ref": "#/$defs/d0"}), info)
    chain["d600"]["required"] = []
    compile_grammar(make_spec(schema={"$defs": chain, "$ref": "#/$defs/d0"}), info)


def test_schema_inputs(info, toy, tmp_path):
    from pydantic import BaseModel

    class Point(BaseModel):
        x: int
        y: int

    path = tmp_path / "point.json"
    path.write_text(json.dumps(Point.model_json_schema()))
    for schema in (Point, str(path), path, path.read_text()):
        assert feed(info, toy, '{"x":1,"y":2}', schema=schema)
        assert not feed(info, toy, '{"x":1,"y":2,"z":3}', schema=schema)
    assert feed(info, toy, '{"q":[1,true]}', json_object=True)
    assert not feed(info, toy, "[1]", json_object=True)


@pytest.mark.parametrize("text", ["[1, 2]", " 3", '"string"', "null", "[]"])
def test_inline_json_that_is_not_a_schema_says_so(text):
    """JSON text other than an object or a boolean is not a schema; it is not a file name either."""
    value = json.loads(text)
    for schema in [text] + ([value] if not isinstance(value, str) and value is not None else []):
        with pytest.raises(SchemaError, match="must be a JSON object or a boolean") as err:
            make_spec(schema=schema)
        assert "file" not in str(err.value)


# -- toy vocabulary: the matcher's state -------------------------------------------------------------


def test_first_allowed_and_mask_after_accept(info, toy):
    m = matcher_for(info, regex="ab+c")
    a, b, ab, abc = (toy.convert_tokens_to_ids(t) for t in ("a", "b", "ab", "abc"))
    assert allowed(m) == {a, ab, abc}
    assert m.accept_token(a)
    assert allowed(m) == {b}
    assert m.accept_token(b)
    assert allowed(m) == {b, toy.convert_tokens_to_ids("c")}


def test_rollback_restores_state(info, toy):
    m = matcher_for(info, regex="a{0,200}b")
    a = toy.convert_tokens_to_ids("a")
    start = allowed(m)
    assert m.accept_tokens([a] * 3)
    middle = allowed(m)
    assert m.accept_tokens([a] * 100)
    assert m.rollback(100) and allowed(m) == middle
    assert not m.rollback(4) and allowed(m) == middle  # more than accepted: refused, state kept
    assert m.rollback(3) and allowed(m) == start


def test_jump_forward_has_no_side_effects(info, toy):
    m = matcher_for(info, grammar='start: "abc" /[0-9]+/')
    before = allowed(m)
    assert m.jump_forward_tokens() == [toy.convert_tokens_to_ids("abc")]
    assert m.jump_forward_string() == "abc"
    assert m.jump_forward_tokens() == [toy.convert_tokens_to_ids("abc")]
    assert allowed(m) == before and m.num_accepted == 0


def test_reset_after_completion(info, toy):
    m = matcher_for(info, choices=["ab", "abc"])
    start = allowed(m)
    assert m.accept_token(toy.convert_tokens_to_ids("abc"))
    assert m.is_terminated() and m.is_accepting()
    assert allowed(m) == set(info.eos_ids)  # finished: only the end ids
    m.reset()
    assert not m.is_terminated() and allowed(m) == start
    assert not m.accept_token(toy.convert_tokens_to_ids("c")) and m.error  # an error state ...
    m.reset()
    assert not m.error and allowed(m) == start  # ... is left by reset too


def test_padding_and_special_ids_never_allowed(info, toy):
    assert info.padding_ids == frozenset(range(len(toy), VOCAB))
    sp = toy.convert_tokens_to_ids("<sp>")
    for spec in ({"regex": r"[\s\S]*"}, {"grammar": "start: /.*/"}, {"json_object": True}):
        m = matcher_for(info, **spec)
        mask = allowed(m)
        assert not mask & (info.padding_ids | {sp}), spec
        assert len(mask) > 150 or "json_object" in spec  # the byte tokens that can start UTF-8


# -- bitmask buffers ---------------------------------------------------------------------------------


def test_bitmask_buffers_filled_in_place(info, toy):
    bm = TokenBitmask(VOCAB)
    arrays = list(bm.arrays)
    addresses = list(bm.addresses)
    m = matcher_for(info, regex="(ab|a)+c")
    reference = np.zeros((1, bm.words), np.int32)
    for token in ids(toy, "aabab"):
        out = bm.fill(m)
        m.fill_next_token_bitmask(reference)
        assert out is bm.current and any(out is a for a in arrays)
        # MLX sees what the engine wrote through the shared address: no copy was made
        assert np.array_equal(np.array(out), reference)
        assert np.asarray(out).ctypes.data == bm.addresses[bm.index]
        assert m.accept_token(token)
    assert bm.addresses == addresses and all(x is y for x, y in zip(bm.arrays, arrays, strict=False))


def test_apply_bit_order_lsb_first():
    mask = mx.array([[0b101, 0, -(2**31)]], dtype=mx.int32)  # tokens 0, 2 and 95 (bit 31 of word 2)
    out = apply_token_bitmask(mx.zeros((1, 96)), mask)
    assert np.nonzero(np.isfinite(np.array(out[0])))[0].tolist() == [0, 2, 95]
    with pytest.raises(ValueError):
        apply_token_bitmask(mx.zeros((1, 97)), mask)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_masked_tokens_never_sampled(dtype):
    rng = np.random.default_rng(0)
    V = 1000
    words = rng.integers(-(2**31), 2**31, size=(1, (V + 31) // 32), dtype=np.int64).astype(np.int32)
    words[0, :] &= rng.integers(0, 2**31, size=words.shape[1]).astype(np.int32)  # sparser
    allowed_ids = np.nonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:V])[0]
    logits = mx.array(rng.normal(size=(1, V)) * 5).astype(dtype)
    out = apply_token_bitmask(logits, mx.array(words))
    assert out.dtype == dtype
    host = np.array(out.astype(mx.float32))[0]
    keep = np.zeros(V, bool)
    keep[allowed_ids] = True
    assert np.all(np.isneginf(host[~keep]))
    assert np.array_equal(host[keep], np.array(logits.astype(mx.float32))[0][keep])
    samples = np.array(mx.random.categorical(out.astype(mx.float32), num_samples=2000, key=mx.random.key(1)))
    assert set(samples.ravel().tolist()) <= set(allowed_ids.tolist())


# -- the decoding strategy with random logits ---------------------------------------------------------


SCHEMA = {
    "type": "object",
    "properties": {
        "abc": {"type": "integer"},
        "flag": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["x", "yy"]}, "maxItems": 3},
    },
    "required": ["abc", "flag", "tags"],
}


def run(strategy, steps=200, dtype=mx.float32, seed=0, forced=None):
    """Drive a strategy as the runtime loop does, with random logits; returns (tokens, last Step).
    `forced`: a list that gets each step's count of forced tokens."""
    rng = np.random.default_rng(seed)
    strategy.begin([0])
    out = []
    for _ in range(steps):
        logits = mx.array(rng.normal(size=(1, VOCAB)) * 3).astype(dtype)
        strategy.prepare()
        mask = np.array(strategy.bitmask.current)
        step = strategy.step(logits)
        if step.tokens:
            bit = (mask[0, step.tokens[0] // 32] >> (step.tokens[0] % 32)) & 1
            assert bit == 1, "sampled a masked token"
        out += step.tokens
        if forced is not None:
            forced.append(step.forced)
        if step.finish:
            return out, step
    return out, step


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_strategy_random_logits_valid(info, toy, dtype, temperature):
    compiled = compile_grammar(make_spec(schema=SCHEMA), info)
    for seed in range(3):
        strategy = ConstrainedDecodingStrategy(compiled, SamplingParams(temperature=temperature, top_p=0.9))
        forced = []
        tokens, step = run(strategy, dtype=dtype, seed=seed, forced=forced)
        assert step.finish == "stop" and strategy.complete
        text = toy.decode([t for t in tokens if t not in info.eos_ids])
        value, errors = check_json(text, SCHEMA)
        assert not errors, (text, errors)
        assert list(value) == ["abc", "flag", "tags"]
        assert sum(forced) > 0  # '{"abc":' and ',"flag":' ... are forced
        assert len(forced) + sum(forced) == len(tokens)  # one sampled token per step, the rest forced


def test_strategy_jump_forward_in_one_step(info, toy):
    compiled = compile_grammar(make_spec(grammar='start: "abc" "12" /[xy]/'), info)
    strategy = ConstrainedDecodingStrategy(compiled)
    strategy.begin([0])
    strategy.prepare()
    step = strategy.step(mx.zeros((1, VOCAB)))
    # the sampler can only pick "abc"; "12" is forced and comes in the same Step
    assert toy.decode(step.tokens) == "abc12" and step.forced == 1 and step.finish is None
    step = strategy.step(mx.zeros((1, VOCAB)))
    assert toy.decode(step.tokens) in ("x", "y") and step.finish == "stop"


def test_strategy_eos_only_at_end(info, toy):
    compiled = compile_grammar(make_spec(regex="a{2,4}"), info)
    strategy = ConstrainedDecodingStrategy(compiled)
    strategy.begin([0])
    eos = info.eos_ids[1]
    logits = mx.zeros((1, VOCAB))
    logits[0, eos] = 100.0  # the model wants to stop at once
    tokens = []
    while True:
        step = strategy.step(logits)
        tokens += step.tokens
        if step.finish:
            break
    assert step.finish == "stop" and tokens[-1] == eos and toy.decode(tokens[:-1]) == "aa"


def test_strategy_rejection_is_an_error(info, toy):
    compiled = compile_grammar(make_spec(regex="ab"), info)
    strategy = ConstrainedDecodingStrategy(compiled)
    strategy.sampler.verify = lambda logprobs, draft, position: (0, toy.convert_tokens_to_ids("b"))  # a broken sampler
    strategy.begin([0])
    step = strategy.step(mx.zeros((1, VOCAB)))
    assert step.finish == "error" and step.tokens == [] and "grammar engine" in step.message
    assert not strategy.complete


def test_strategy_rollback(info, toy):
    compiled = compile_grammar(make_spec(regex="[ab]{8,10}c"), info)
    strategy = ConstrainedDecodingStrategy(compiled, SamplingParams(temperature=1.0))
    start = allowed(strategy.matcher)
    tokens, _ = run(strategy, steps=3)
    assert strategy.matcher.num_accepted == len(tokens) == len(strategy.history.ids) - 1
    strategy.rollback(len(tokens))
    assert strategy.matcher.num_accepted == 0 and strategy.history.ids == [0] and allowed(strategy.matcher) == start
    with pytest.raises(ValueError):
        strategy.rollback(1)


def test_strategy_limit_hit_mid_generation_is_an_error(info):
    # The lazily built lexer of this regex grows with the input, until the bound on its states.
    limits = LLParserLimits(max_lexer_states=40, verbose_errors=False)
    compiled = compile_grammar(make_spec(regex="(a|b)*a(a|b){20}"), info, limits=limits)
    tokens, step = run(ConstrainedDecodingStrategy(compiled, SamplingParams(temperature=1.0)), steps=500)
    assert step.finish == "error" and "too many states" in step.message


# -- compiled grammar cache --------------------------------------------------------------------------


def test_cache_hits_misses_and_lru(info):
    cache = GrammarCache(capacity=2)
    a, b, c = (make_spec(regex=r) for r in ("a+", "b+", "c+"))
    first = cache.get(a, info)
    assert cache.get(make_spec(regex="a+"), info) is first
    cache.get(b, info)
    cache.get(c, info)  # evicts a
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.size) == (1, 3, 2)
    assert cache.get(a, info) is not first
    # schema specs are memoized on their canonical text, so a repeated session is a hit end to end
    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    assert make_spec(schema=schema) is make_spec(schema=json.dumps(schema))
    assert make_spec(schema=schema) is not make_spec(schema={"type": "object", "properties": {"a": {}, "b": {}}})
    # options are part of the key
    assert cache.get(make_spec(schema={"type": "object"}), info) is not cache.get(
        make_spec(schema={"type": "object"}, any_whitespace=True), info
    )


def test_cache_thread_safe(info):
    cache = GrammarCache(capacity=4)
    specs = [make_spec(regex=f"x{i}+") for i in range(8)]
    errors = []

    def work():
        try:
            for _ in range(20):
                for s in specs:
                    assert cache.get(s, info).spec.grammar == s.grammar
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = cache.stats()
    assert not errors and stats.size == 4 and stats.hits + stats.misses == 4 * 20 * 8


def test_cache_does_not_keep_errors(info):
    cache = GrammarCache()
    for _ in range(2):
        with pytest.raises(GrammarError):
            cache.get(make_spec(regex="[a-"), info)
    assert cache.stats().size == 0


# -- error paths -------------------------------------------------------------------------------------


def test_invalid_schema_has_pointer():
    with pytest.raises(SchemaError) as err:
        make_spec(schema={"type": "object", "properties": {"a": {"type": "strin"}}})
    assert err.value.pointer == "/properties/a/type"
    with pytest.raises(SchemaError) as err:
        make_spec(schema={"type": "array", "items": {"minItems": -1}})
    assert err.value.pointer == "/items/minItems"
    with pytest.raises(SchemaError):
        make_spec(schema="{not json")
    with pytest.raises(SchemaError):
        make_spec(schema="/no/such/schema.json")


@pytest.mark.parametrize(
    "schema,keyword,pointer",
    [
        ({"properties": {"d": {"type": "string", "format": "no-such-format"}}}, "format", "/properties/d/format"),
        ({"properties": {"p": {"type": "string", "pattern": "(?=a)b"}}}, "pattern", "/properties/p/pattern"),
        ({"properties": {"r": {"$ref": "https://example.com/remote.json"}}}, "$ref", "/properties/r/$ref"),
        # `dependencies` is not a draft 2020-12 keyword (the default draft): nothing checks it
        ({"type": "object", "dependencies": {"a": ["b"]}}, "dependencies", "/dependencies"),
    ],
)
def test_unsupported_keyword_has_keyword_and_pointer(info, schema, keyword, pointer):
    with pytest.raises(UnsupportedSchemaFeature) as err:
        compile_grammar(make_spec(schema=schema), info)
    assert (err.value.keyword, err.value.pointer) == (keyword, pointer), str(err.value)


def test_ecma_patterns_are_checked():
    """The final check reads `pattern` as ECMA 262 does (`\\p{L}`, `(?<name>...)`, which Python's `re`
    refuses); a `patternProperties` name it cannot read is refused at compile time, with its pointer."""
    schema = {"type": "string", "pattern": r"^(?<w>\p{L}+)$"}
    assert check_json('"héllo"', schema)[1] == []
    assert check_json('"h3llo"', schema)[1]
    with pytest.raises(UnsupportedSchemaFeature) as err:
        make_spec(schema={"type": "object", "patternProperties": {r"^\p{L}+$": {"type": "integer"}}})
    assert (err.value.keyword, err.value.pointer) == ("patternProperties", r"/patternProperties/^\p{L}+$")


@pytest.mark.parametrize(
    "schema,keyword,pointer",
    [
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not", "/properties/a/not"),
        ({"type": "array", "items": {"type": "array", "uniqueItems": True}}, "uniqueItems", "/items/uniqueItems"),
        (
            {"$defs": {"x": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}, "$ref": "#/$defs/x"},
            "oneOf",
            "/$defs/x/oneOf",
        ),
        ({"type": "string", "format": "iri"}, "format", "/format"),
        (
            {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "dependencies": {"a": ["b"]}},
            "dependencies",
            "/dependencies",
        ),
    ],
)
def test_keywords_beyond_the_grammar_are_validated(info, schema, keyword, pointer):
    compiled = compile_grammar(make_spec(schema=schema), info)
    assert (keyword, pointer) in [(n.keyword, n.pointer) for n in compiled.validated]
    assert not compiled.not_enforced and compiled.checks is not None


def test_lenient_lists_what_is_not_enforced(info, toy):
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}}
    compiled = compile_grammar(make_spec(schema=schema, lenient=True), info)
    assert [(n.keyword, n.pointer) for n in compiled.not_enforced] == [("format", "/properties/a/format")]
    assert compiled.checks is None


def test_grammar_errors(info):
    # GBNF with a rule it never defines, or without `root` (llguidance's converter raises a plain
    # Exception for those: it must still be a GrammarError, a 400, never a traceback).
    bad = ("start: foo", "root ::= [a-", "root ::= foo", 'a ::= "x"', 'root ::= "x" bar\nbar ::= baz')
    for spec in ({"regex": "[a-"}, *({"grammar": g} for g in bad)):
        with pytest.raises(GrammarError):
            compile_grammar(make_spec(**spec), info)
    with pytest.raises(GrammarError):
        make_spec(choices=[])
    with pytest.raises(ValueError):
        make_spec(regex="a", choices=["a"])
    with pytest.raises(ValueError):
        make_spec()


def test_pathological_regex_is_bounded(info):
    # Exponential DFAs: llguidance builds its lexer lazily, so these compile in milliseconds ...
    for regex in ["(a|b)*a(a|b){20}", "((a|b|c|d){50}){50}", r"(\w+\s*)+x{3,9}(y|z){1,300}"]:
        compile_grammar(make_spec(regex=regex), info).matcher()
    # ... and when a bound is hit it is an error, not a hang.
    with pytest.raises(GrammarError, match="too many states"):
        compile_grammar(make_spec(regex="(a|b)*a(a|b){20}"), info, limits=LLParserLimits(max_lexer_states=10))


def test_choices_as_a_single_string_is_refused():
    from guided import GrammarError, make_spec

    with pytest.raises(GrammarError, match="list of strings"):
        make_spec(choices="abc")


def test_boolean_schemas():
    from guided import SchemaError, make_spec

    assert make_spec(schema=True).kind == "json_schema"
    with pytest.raises(SchemaError, match="false"):
        make_spec(schema=False)


# -- rollback undoes exactly the last n accepted tokens, EOS and a finished matcher included -----------


@pytest.fixture()
def finished(info, toy):
    """A matcher for `start: "a"` that accepted "a" then EOS."""
    m = compile_grammar(make_spec(grammar='start: "a"'), info).matcher()
    eos = toy.eos_token_id
    assert m.accept_token(ids(toy, "a")[0]) and m.accept_token(eos)
    return m, eos


def test_rollback_undoes_eos_first(finished, toy):
    m, eos = finished
    assert m.is_terminated() and m.num_accepted == 2
    assert m.rollback(1) and not m.error  # undoes EOS, not "a"
    assert m.is_accepting() and m.accept_token(eos) and m.is_terminated()


def test_rollback_past_a_finished_matcher(finished, toy):
    m, eos = finished
    assert m.rollback(2) and not m.error and m.num_accepted == 0
    assert m.accept_token(ids(toy, "a")[0]) and m.accept_token(eos)  # as from the start
    assert not m.rollback(3) and not m.error and m.is_terminated()  # refused, state kept


def test_no_token_after_termination(finished, toy):
    m, eos = finished
    assert not m.accept_token(ids(toy, "a")[0]) and m.error
    fresh = compile_grammar(make_spec(grammar='start: "a"'), m.tokenizer).matcher()
    assert not fresh.accept_tokens([ids(toy, "a")[0], eos, ids(toy, "a")[0]]) and fresh.error
    assert fresh.num_accepted == 2


def test_rollback_state_equals_a_fresh_run(info, toy):
    """After accepting a sequence and rolling back k, masks and verdicts equal a fresh matcher fed
    the first n - k tokens (for every k)."""
    spec = make_spec(schema={"type": "object", "properties": {"abc": {"type": "integer"}}, "required": ["abc"]})
    compiled = compile_grammar(spec, info)
    tokens = ids(toy, '{"abc":12}') + [toy.eos_token_id]
    for k in range(len(tokens) + 1):
        m = compiled.matcher()
        assert m.accept_tokens(tokens) and m.rollback(k)
        fresh = compiled.matcher()
        assert fresh.accept_tokens(tokens[: len(tokens) - k])
        assert allowed(m) == allowed(fresh), k
        assert (m.is_accepting(), m.is_terminated(), m.num_accepted) == (
            fresh.is_accepting(),
            fresh.is_terminated(),
            fresh.num_accepted,
        )

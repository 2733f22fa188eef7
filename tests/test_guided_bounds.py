"""Where the grammar and the final check must agree (issue 24): bounded flexible whitespace in any
order of the four JSON whitespace characters, numbers judged as exact decimals by both, refusals
that name the keyword really left unenforced, and `format: email` bounded as RFC 5321 bounds it.
A byte-level toy tokenizer (every text is spelled one byte per token): no model needed."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import coreai  # noqa: F401 - loads the system BLAS before mlx.core

import pytest  # noqa: E402
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from guided import (  # noqa: E402
    GrammarSpec,
    SchemaError,
    UnsupportedSchemaFeature,
    check_json,
    compile_grammar,
    get_tokenizer_info,
    make_spec,
)
from guided.enforcement import ROLLBACK, enforcement  # noqa: E402

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def byte_tok():
    """256 byte tokens and <eos>: the matcher sees exactly the characters of a text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    tok = Tokenizer(models.BPE({b2u[b]: b for b in range(256)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    hf.add_special_tokens({"eos_token": "<eos>"})
    return hf, get_tokenizer_info(hf, 264, [hf.eos_token_id])


def accepts(byte_tok, compiled, text: str) -> bool:
    hf, _ = byte_tok
    matcher = compiled.matcher()
    return matcher.accept_tokens(hf.encode(text, add_special_tokens=False)) and matcher.is_accepting()


def compiled_for(byte_tok, **spec):
    return compile_grammar(make_spec(**spec), byte_tok[1])


# -- 1. whitespace ------------------------------------------------------------------------------

SEGMENT = st.text(alphabet=" \t", max_size=70)
BREAK = st.sampled_from(["\n", "\r", "\r\n"])


@st.composite
def whitespace_runs(draw):
    """A run of JSON whitespace: spaces/tabs segments joined by 0-3 line breaks (LF, CR or CRLF),
    so both sides of the bounds (2 breaks, 64 spaces/tabs per segment) are reached often."""
    breaks = draw(st.lists(BREAK, max_size=3))
    segments = [draw(SEGMENT) for _ in range(len(breaks) + 1)]
    return "".join(s + b for s, b in zip(segments, breaks + [""], strict=False))


def within_bounds(run: str) -> bool:
    """The documented bound: at most 2 line breaks (CRLF counts as one) and at most 64 spaces/tabs
    before, between and after them."""
    segments = re.split(r"\r\n|\r|\n", run)
    return len(segments) <= 3 and all(len(s) <= 64 for s in segments)


# Places between tokens of `{"a":[1,true],"b":"x"}` where the run is put.
TOKENS = ["{", '"a"', ":", "[", "1", ",", "true", "]", ",", '"b"', ":", '"x"', "}"]


@SETTINGS
@given(run=whitespace_runs(), where=st.integers(1, len(TOKENS) - 1))
def test_whitespace_within_the_bounds_in_any_order_is_accepted(byte_tok, run, where):
    compiled = compiled_for(byte_tok, schema={"type": "object"}, any_whitespace=True)
    text = "".join(TOKENS[:where]) + run + "".join(TOKENS[where:])
    assert accepts(byte_tok, compiled, text) == within_bounds(run), repr(run)


@pytest.mark.parametrize(
    "text", ['{"a":\r"x"}', '{"a": "x", \n"b": 1}', '{"a":"x",\t\n"b":1}', '{"a":"x" \r\n\t,"b":1}']
)
def test_whitespace_reported_refused(byte_tok, text):
    assert accepts(byte_tok, compiled_for(byte_tok, schema={"type": "object"}, any_whitespace=True), text)


# -- 3. numbers ---------------------------------------------------------------------------------


def test_decimal_multiple_of_is_exact_in_the_final_check():
    schema = {"type": "number", "multipleOf": 0.01}
    for text in ["0.07", "19.99", "4.02", "2.4", "0.3", "-0.7", "1e-2"]:
        assert check_json(text, schema)[1] == [], text
    assert check_json("0.071", schema)[1]
    assert check_json("0.1000000000000000055511151231257827", schema)[1]  # the float 0.1, not the decimal


def test_bounds_are_exact_in_the_final_check():
    assert check_json("0.10000000000000001", {"exclusiveMinimum": 0.1})[1] == []
    assert check_json("9007199254740993", {"maximum": 9007199254740992})[1]
    assert check_json("1.0000000000000001", {"type": "integer"})[1]
    assert check_json("1.0", {"type": "integer"})[1] == []
    assert check_json("1e400", {"type": "integer", "minimum": 1e300})[1] == []
    legacy = {"$schema": "http://json-schema.org/draft-04/schema#", "minimum": 0.1, "exclusiveMinimum": True}
    assert check_json("0.1", legacy)[1] and check_json("0.10000000000000001", legacy)[1] == []


def test_satisfiable_multiple_of_with_bounds_is_not_refused(byte_tok):
    """The engine would round 0.07 / 0.01 to 8 steps ("unsatisfiable"); the bounds are enforced by
    validate-and-rollback instead, on the exact decimals."""
    schema = {"type": "number", "multipleOf": 0.01, "minimum": 0.07, "maximum": 0.07}
    compiled = compiled_for(byte_tok, schema=schema)
    assert accepts(byte_tok, compiled, "0.07")
    assert {(e.keyword, e.how) for e in enforcement(compiled)} >= {("minimum", ROLLBACK), ("maximum", ROLLBACK)}
    for text, valid in (("0.07", True), ("0.08", False), ("0.06", False), ("0.0700", True)):
        checker = compiled.checks.checker()
        violation = checker.feed(text.encode()) or checker.end()
        assert (violation is None) == valid, text


def test_widened_bounds_keep_their_own_cache_key_and_checks():
    """maximum 0.5 is given to the engine as maximum 1 (and checked by rollback): its grammar text,
    the cache's key, must differ from maximum 1's, and a spec rebuilt from the journal's fields
    (kind, grammar, schema, options) must still carry the check."""
    widened = make_spec(schema={"type": "number", "maximum": 0.5})
    plain = make_spec(schema={"type": "number", "maximum": 1})
    assert widened.grammar != plain.grammar
    assert GrammarSpec(widened.kind, widened.grammar, widened.schema, widened.options).validated == ("/maximum",)
    assert plain.validated == ()
    left_out = make_spec(schema={"type": "number", "multipleOf": 0.07})  # the engine cannot write 0.07
    assert left_out.validated == ("/multipleOf",) and left_out.grammar != make_spec(schema={"type": "number"}).grammar


DIVISORS = ["0.01", "0.05", "0.3", "3", "0.001", "2.5", "1e-5", "7", "0.07"]


def canonical(value: Decimal) -> str:
    """The plain spelling of a decimal: no exponent, no trailing zeros ("0.07", "-3", "12.5")."""
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


@st.composite
def number_schemas(draw):
    """(schema, witness): a number/integer schema with bounds and maybe a multipleOf, built around
    a witness value that satisfies it, so the schema is satisfiable by construction."""
    integer = draw(st.booleans())
    divisor = Decimal(draw(st.sampled_from(DIVISORS))) if draw(st.booleans()) else None
    step = divisor if divisor is not None else Decimal(1) if integer else Decimal("0.001")
    if integer and step.as_tuple().exponent < 0:  # an integer multiple of 0.05: 5 (its coefficient)
        step = step.scaleb(-step.as_tuple().exponent)
    big = draw(st.sampled_from([10**3, 10**12, 2**53 + 7, 10**20]))
    witness = step * draw(st.integers(-big, big))
    schema = {"type": "integer" if integer else "number"}
    if divisor is not None:
        schema["multipleOf"] = json.loads(str(divisor))
    for key, below in (("minimum", True), ("maximum", False), ("exclusiveMinimum", True), ("exclusiveMaximum", False)):
        if draw(st.booleans()):
            gap = Decimal(draw(st.sampled_from(["0", "1e-17", "0.001", "0.5", "1", "1000"])))
            if key.startswith("exclusive") and gap == 0:
                gap = step / 2
            bound = witness - gap if below else witness + gap
            schema[key] = json.loads(canonical(bound))
    return schema, witness


NUMBER_TEXTS = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False, places=3).map(canonical),
    st.integers(-(2**64), 2**64).map(str),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(-999, 999), st.integers(-30, 30)),
    st.sampled_from(["0.07", "0.1", "0.30000000000000004", "9007199254740993", "1.0", "1e400", "-0.0", "5e-324"]),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=number_schemas(), texts=st.lists(NUMBER_TEXTS, min_size=1, max_size=12))
def test_grammar_and_final_check_agree_on_numbers(byte_tok, case, texts):
    """Never a refused satisfiable schema; the decoder's verdict on a number (the grammar, then
    validate-and-rollback for what the engine cannot judge exactly) accepts the witness, and
    accepts no text the final check rejects."""
    schema, witness = case
    assume(check_json(canonical(witness), schema)[1] == [])  # the witness satisfies it
    compiled = compiled_for(byte_tok, schema=schema)

    def decoder_accepts(text: str) -> bool:
        if not accepts(byte_tok, compiled, text):
            return False
        checker = compiled.checks and compiled.checks.checker()
        return checker is None or (checker.feed(text.encode()) or checker.end()) is None

    assert decoder_accepts(canonical(witness)), (schema, canonical(witness))
    for text in texts:
        if decoder_accepts(text):
            assert check_json(text, schema)[1] == [], (schema, text)


# -- 4. refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "items": {"type": "string", "format": "color"}, "uniqueItems": True},
        {"type": "object", "properties": {"c": {"type": "string", "format": "color"}}, "not": {"required": ["d"]}},
        {
            "type": "object",
            "properties": {"c": {"type": "string", "format": "color"}},
            "dependentRequired": {"c": ["d"]},
        },
    ],
)
def test_refusal_names_the_keyword_nothing_enforces(byte_tok, schema):
    with pytest.raises(UnsupportedSchemaFeature) as refusal:
        compiled_for(byte_tok, schema=schema)
    where = "/items/format" if "items" in schema else "/properties/c/format"
    assert (refusal.value.keyword, refusal.value.pointer) == ("format", where)
    assert f"format at {where}" in str(refusal.value)


def test_refusal_beside_a_validated_keyword_names_the_real_blocker(byte_tok):
    """`not` is enforced by validate-and-rollback; what blocks the schema is the empty range."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}},
        "required": ["a"],
        "not": {"required": ["b"]},
    }
    with pytest.raises(SchemaError, match="no JSON value satisfies the schema") as refusal:
        compiled_for(byte_tok, schema=schema)
    assert not isinstance(refusal.value, UnsupportedSchemaFeature)


# -- 8. email -----------------------------------------------------------------------------------


def test_email_is_bounded_as_rfc_5321_bounds_it(byte_tok):
    compiled = compiled_for(byte_tok, schema={"type": "string", "format": "email"})
    local, label = "a" * 64, "b" * 63
    domain = f"{label}.{label}.{'c' * 61}"  # 64 + 1 + 189 = 254 octets in all
    assert accepts(byte_tok, compiled, f'"{local}@{domain}"')
    assert not accepts(byte_tok, compiled, f'"{local}a@b.co"')  # local part over 64 octets
    assert not accepts(byte_tok, compiled, f'"{local}@{domain}c"')  # address over 254 octets
    assert accepts(byte_tok, compiled, '"first.last+tag@example.com"')

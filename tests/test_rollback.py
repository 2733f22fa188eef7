"""Validate-and-rollback: keywords the grammar cannot express, enforced while decoding (see
`guided.checker`). Each generation is pushed toward a violation with a logit bias on the tiny
random-weight model (the tiny test tokenizer), and must end valid after rolling back, with the retries
counted in `result.stats`."""

from __future__ import annotations

import pytest

from coreai import ConstrainedSession
from guided.checker import CheckPlan


def bias(model, *texts, value=40.0) -> dict[int, float]:
    """A strong logit bias toward every token of `texts`, also when spelled after a quote."""
    spellings = [s for text in texts for s in (text, '"' + text)]
    return {t: value for text in spellings for t in model.tokenizer.encode(text, add_special_tokens=False)}


CASES = {
    "uniqueItems": (
        {
            "type": "array",
            "items": {"enum": ["red", "green", "blue"]},
            "minItems": 3,
            "maxItems": 3,
            "uniqueItems": True,
        },
        ["red"],
    ),
    "not": (
        {
            "type": "object",
            "properties": {"color": {"enum": ["red", "green", "blue"], "not": {"const": "red"}}},
            "required": ["color"],
        },
        ["red"],
    ),
    "not (an optional member left out)": (
        {
            "type": "object",
            "properties": {"a": {"enum": [1]}, "b": {"enum": ["x"], "not": {"const": "x"}}},
            "required": ["a"],
        },
        [',"b', "x"],
    ),
    "dependentRequired (a member added)": (
        {
            "type": "object",
            "properties": {"card": {"enum": [1]}, "billing": {"enum": [2]}},
            "required": ["card"],
            "dependentRequired": {"card": ["billing"]},
        },
        ["}"],
    ),
    "contains": (
        {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 2, "maxItems": 2, "contains": {"const": "y"}},
        ["x"],
    ),
    "if/then": (
        {
            "type": "object",
            "properties": {"kind": {"enum": ["a", "b"]}, "size": {"enum": ["big", "small"]}},
            "required": ["kind", "size"],
            "if": {"properties": {"kind": {"const": "a"}}},
            "then": {"properties": {"size": {"const": "small"}}},
        },
        ["a", "big"],
    ),
    "dependentRequired": (
        {
            "type": "object",
            "properties": {"a": {"enum": [1]}, "b": {"enum": [2]}},
            "dependentRequired": {"a": ["b"]},
        },
        ['{"a"', "}"],
    ),
    "oneOf": ({"oneOf": [{"enum": [5, 6]}, {"enum": [5, 7]}]}, ["5"]),
    "format": ({"type": "string", "format": "iri-reference", "minLength": 1, "maxLength": 1}, [" "]),
    "propertyNames": (
        {
            "type": "object",
            "properties": {"no": {"enum": [1]}, "ok": {"enum": [1]}},
            "propertyNames": {"enum": ["ok"]},
            "minProperties": 1,
        },
        ["no"],
    ),
}


# The tiny model has random weights: steered by logit_bias towards the values, it would still spend
# its tokens on whitespace under the default layout, which is not what these tests check.
COMPACT = {"whitespace": "compact"}


@pytest.mark.parametrize("name", CASES)
def test_a_biased_violation_is_rolled_back(tiny_model, name):
    schema, texts = CASES[name]
    session = ConstrainedSession(tiny_model, **COMPACT, schema=schema)
    assert session.compiled.validated, "the keyword should be enforced by validate-and-rollback"
    plain = ConstrainedSession(tiny_model, **COMPACT, schema=schema, lenient=True, max_retries=0)
    pushed = plain.generate("x", max_tokens=40, logit_bias=bias(tiny_model, *texts))
    assert not pushed.valid, "the bias should push the generation into the violation"
    result = session.generate("x", max_tokens=40, logit_bias=bias(tiny_model, *texts))
    assert result.finish_reason == "stop" and result.valid, (result.text, result.errors, result.stats.violations)
    assert result.stats.retries >= 1 and len(result.stats.violations) == result.stats.retries


def test_streamed_text_is_never_taken_back(tiny_model):
    schema = {
        "type": "object",
        "properties": {
            "name": {"enum": ["ann"]},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 3, "uniqueItems": True},
        },
        "required": ["name", "tags"],
    }
    session = ConstrainedSession(tiny_model, **COMPACT, schema=schema)
    deltas = list(session.stream("x", max_tokens=40, logit_bias=bias(tiny_model, "red")))
    result = deltas[-1].result
    assert result.valid and result.stats.retries >= 1
    assert "".join(d.text for d in deltas) == result.text
    assert [t for d in deltas for t in d.token_ids] == result.token_ids
    # the name streamed before the array (held back while open) was finished (its closing quote may
    # share a token with the next key, '","')
    assert deltas[0].text.startswith('{"name":"ann')


def test_no_alternative_or_no_budget_ends_in_error(tiny_model):
    only_red = {"enum": ["red"], "not": {"const": "red"}}  # the grammar forces "red": nothing to retry
    result = ConstrainedSession(tiny_model, **COMPACT, schema=only_red).generate("x", max_tokens=10)
    assert result.finish_reason == "error" and not result.valid
    assert "not at /" in result.error and "no sampled token" in result.error
    schema, texts = CASES["uniqueItems"]
    result = ConstrainedSession(tiny_model, **COMPACT, schema=schema, max_retries=0).generate(
        "x", max_tokens=40, logit_bias=bias(tiny_model, *texts)
    )
    assert result.finish_reason == "error" and not result.valid and "uniqueItems" in result.error


def test_checked_values_follow_refs_and_items():
    schema = {
        "$defs": {
            "tags": {"type": "array", "uniqueItems": True},
            "node": {"properties": {"kids": {"items": {"$ref": "#/$defs/node"}}}, "not": {}},
        },
        "properties": {
            "a": {"$ref": "#/$defs/tags"},
            "b": {"items": {"format": "iri"}},
            "tree": {"$ref": "#/$defs/node"},
        },
    }
    paths = {("$defs", "tags", "uniqueItems"), ("properties", "b", "items", "format"), ("$defs", "node", "not")}
    plan = CheckPlan(schema, frozenset(paths))
    assert plan.patterns == {("a",), ("b", "*"), ("tree",), ("tree", "kids", "*", "**")}
    assert plan.checked(("a",)) and plan.checked(("b", 3)) and plan.checked(("tree", "kids", 0, "kids", 1))
    assert not plan.checked(("b",)) and not plan.checked(("c",)) and not plan.checked(())


def test_strategy_rollback_keeps_the_checker_in_step(tiny_model):
    """`ConstrainedDecodingStrategy.rollback` (the public call) also takes the tokens back from
    validate-and-rollback's view of the output."""
    strategy = ConstrainedSession(tiny_model, **COMPACT, schema=CASES["uniqueItems"][0]).strategy()
    result = tiny_model.generate("x", strategy=strategy, max_tokens=40)
    planner = strategy.planner
    assert planner.answer == result.token_ids and bytes(planner.checker.text) == result.text.encode()
    strategy.rollback(3)
    kept = result.token_ids[:-3]
    assert planner.answer == kept and bytes(planner.checker.text) == tiny_model.tokenizer.hf.decode(kept).encode()


def test_a_max_tokens_cut_inside_jump_forward_leaves_the_matcher_at_the_output(tiny_model):
    """The grammar forces all but its first token (jump-forward) and ends; max_tokens cuts that
    step. The output ends "length", not valid, and the matcher holds exactly the delivered tokens
    (it had taken the whole step: found 2026-12-02, docs/reference/guided.md)."""
    session = ConstrainedSession(tiny_model, choices=["alpha beta gamma delta epsilon zeta eta theta"])
    result = session.generate("x", max_tokens=3)
    assert result.finish_reason == "length" and not result.valid and len(result.token_ids) == 3
    strategy = session.strategy()
    assert tiny_model.generate("x", strategy=strategy, max_tokens=3).token_ids == result.token_ids
    assert strategy.matcher.num_accepted == 3
    replay = session.compiled.matcher()
    assert replay.accept_tokens(result.token_ids) and not replay.is_terminated()


def test_the_report_labels_keywords_under_a_validated_one(tiny_model):
    session = ConstrainedSession(tiny_model, **COMPACT, schema={"enum": ["x", "y"], "not": {"enum": ["x"]}})
    hows = {(e.keyword, e.pointer): e.how for e in session.enforcement}
    assert hows == {
        ("enum", "/enum"): "grammar",
        ("not", "/not"): "validate-and-rollback",
        ("enum", "/not/enum"): "validate-and-rollback",
    }


def test_the_enforcement_header_stays_small(tiny_model):
    from coreai.server.enforcement import MAX_HEADER_ENTRIES, enforcement_headers

    many = {f"p{i}": {"type": "array", "uniqueItems": True} for i in range(100)}
    header = enforcement_headers(
        ConstrainedSession(tiny_model, **COMPACT, schema={"type": "object", "properties": many})
    )
    value = header["x-coreai-enforcement"]
    assert value.count("validate-and-rollback uniqueItems") == MAX_HEADER_ENTRIES
    assert value.endswith(f"and {100 - MAX_HEADER_ENTRIES} more (coreai check-schema lists them all)")


@pytest.mark.parametrize("logit_bias", [{True: 5}, {1: "5"}, {-1: 5}, {1: 101}])
def test_bad_logit_bias(logit_bias):
    from runtime import SamplingParams

    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=logit_bias)

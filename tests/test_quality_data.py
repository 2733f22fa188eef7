"""The labelled extraction set (`benchmarks.extraction_data`) and its scorer (issue 27)."""

import inspect
import json
import re

import pytest

from benchmarks.extraction_data import DOMAINS, FULL_PER_DOMAIN, examples, normalise, score
from guided import Constraint, check_json, make_spec


def test_the_set_is_deterministic_and_a_sample_is_a_prefix_of_the_full_set():
    full = examples()
    assert len(full) == FULL_PER_DOMAIN * len(DOMAINS) >= 250
    assert full == examples()
    sample = examples(per_domain=3)
    assert sample == [e for e in full if int(e.id.rsplit("-", 1)[1]) < 3]
    assert examples(per_domain=3, seed=1) != sample
    assert len({e.document for e in full}) == len(full)  # no duplicate documents


def test_every_truth_is_valid_against_its_schema_with_formats_checked():
    for ex in examples():
        value, errors = check_json(json.dumps(ex.truth), DOMAINS[ex.domain].schema)
        assert errors == [], (ex.id, errors)
        assert list(ex.truth) == list(DOMAINS[ex.domain].schema["properties"])  # schema order


def test_copied_values_are_in_the_document_and_written_values_are_not_in_truth_form():
    # Strings copied verbatim (names, streets, numbers of orders and invoices) are in the text; ISO dates
    # and amounts as JSON numbers never are: the model has to convert them.
    copied = {
        "invoice": ("vendor", "invoice_number"),
        "shipping": ("order_number", "street", "city", "postal_code"),
        "event": ("title", "location"),
        "contact": ("job_title", "company", "email"),
        "review": ("product",),
    }
    for ex in examples():
        text = ex.document.casefold()
        for key in copied[ex.domain]:
            assert ex.truth[key].casefold() in text, (ex.id, key)
        for key in DOMAINS[ex.domain].names:
            assert ex.truth[key].casefold() in text
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", ex.document), ex.id


def test_the_truth_scores_every_field_right():
    for ex in examples(per_domain=10):
        assert all(score(DOMAINS[ex.domain], ex.truth, ex.truth).values())


def test_scoring_normalisation():
    review = DOMAINS["review"]
    truth = {"product": "Lumio X2 desk lamp", "rating": 4, "sentiment": "positive", "would_recommend": True,
             "price": 49.9, "reviewer": "Maria Rossi"}  # fmt: skip
    answer = {"product": "  lumio x2\nDESK lamp.", "rating": 4.0, "sentiment": "Positive", "would_recommend": True,
              "price": 49.90, "reviewer": "Dr. Maria Rossi"}  # fmt: skip
    assert all(score(review, answer, truth).values())
    wrong = {"product": "Lumio X2", "rating": True, "sentiment": "neutral", "would_recommend": 1,
             "price": "49.90", "reviewer": "Maria"}  # fmt: skip
    assert not any(score(review, wrong, truth).values())  # True is not 4, 1 is not True, "49.90" is not a number
    assert score(review, {"product": "Lumio X2 desk lamp"}, truth) == {k: k == "product" for k in truth}
    assert not any(score(review, None, truth).values())  # unparsable
    assert not any(score(review, ["Lumio X2 desk lamp"], truth).values())
    assert normalise("+1 (415) 555-0132", "phone") == "+14155550132"
    assert normalise("Prof. Dr. Anna Nowak", "name") == "anna nowak"
    assert normalise(1249.004) == normalise(1249) == 1249.0


def test_bad_sample_size():
    with pytest.raises(ValueError, match="per_domain"):
        examples(per_domain=0)
    with pytest.raises(KeyError):
        examples(domains=["nope"])


def test_unconstrained_answers_are_parsed_generously():
    from benchmarks.quality import parse_answer

    assert parse_answer('{"a": 1}') == {"a": 1}
    assert parse_answer('Here it is:\n```json\n{"a": 1}\n```\nDone.') == {"a": 1}
    assert parse_answer('The answer is {"a": {"b": 2}} as asked.') == {"a": {"b": 2}}
    assert parse_answer("no JSON here") is None
    assert parse_answer('{"a": 1,') is None


def test_the_variant_marked_default_is_what_the_shipped_defaults_run():
    from benchmarks.quality import VARIANTS, default_variant
    from guided.schema_prompt import SCHEMA_IN_PROMPT, SCHEMA_PROMPT_STYLE

    default = VARIANTS[default_variant()]
    assert default.constrained
    assert default.style == (SCHEMA_PROMPT_STYLE if SCHEMA_IN_PROMPT else None)
    assert default.whitespace == make_spec(schema={"type": "object"}).options["whitespace"]  # the shipped layout
    assert (
        inspect.signature(Constraint).parameters["whitespace"].default is None
    )  # i.e. make_spec's (the session passes it on)


def test_resume_keeps_only_comparable_answers(tmp_path):
    from benchmarks.quality import main, previous_records

    out = tmp_path / "quality.json"
    args = type("Args", (), {"seed": 0, "max_tokens": 192, "variants": ["constrained"], "domains": ["invoice"]})
    assert previous_records(str(out), args) == []
    records = [{"id": "invoice-000", "domain": "invoice", "variant": v} for v in ("constrained", "constrained+ws")]
    out.write_text(json.dumps({"args": {"seed": 0, "max_tokens": 192}, "records": records}))
    assert previous_records(str(out), args) == records  # other variants' answers stay in the file
    with pytest.raises(SystemExit, match="ran with seed 0, max tokens 192"):
        main(["--resume", "--seed", "1", "--out", str(out)])  # refused before the model loads

"""`runtime.value_lookup.ValueLookup` on the real Qwen tokenizer: drafts at JSON string values (a
field label in the prompt, the value so far found in it, no draft of the previous value), and the
offline replay of the stored invoice, order and fly_to outputs (`benchmarks.speculative_replay`:
the real grammar and strategy, no model weights): the output stays identical and the drafts need
fewer passes than `PromptLookup`'s, fewer still with drafts chained across the forced keys."""

from __future__ import annotations

import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from runtime import PromptLookup, ValueLookup  # noqa: E402

pytestmark = pytest.mark.model  # the real tokenizer (no weights)

INVOICE = (
    "Invoice RE-2026-04817 for your order.\n\n"
    "Invoice number: RE-2026-04817\nCustomer name: Adaeze Okonkwo\nCity: Berlin"
)
ORDER = (
    "Order 58213-B was placed by Margarethe Villanueva-Oduya on 3 March 2026. "
    "Please call +33 4 78 29 61 05 before delivery."
)


def _context(tokenizer, document: str, output: str) -> list[int]:
    """A chat prompt holding `document`, followed by `output` as the model writes it."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": document}])
    return prompt + tokenizer.encode(output, add_special_tokens=False)


def _draft_text(tokenizer, document: str, output: str, n: int = 32, lookup=None) -> str:
    lookup = lookup or ValueLookup(tokenizer)
    return tokenizer.decode(lookup.propose(_context(tokenizer, document, output), n))


def test_after_a_key_the_draft_is_its_labelled_value(qwen_tokenizer):
    text = _draft_text(qwen_tokenizer, INVOICE, '{"invoice_number')
    assert text == '":"RE-2026-04817","'  # the labelled line, not the subject's mention
    assert _draft_text(qwen_tokenizer, INVOICE, '{"invoice_number":"RE-2026-04817","customer_name":"') == (
        'Adaeze Okonkwo","'
    )


def test_a_draft_is_encoded_as_the_model_would_write_it(qwen_tokenizer):
    output = '{"invoice_number":"RE-2026-04817","city'
    context = _context(qwen_tokenizer, INVOICE, output)
    whole = qwen_tokenizer.encode(output + '":"Berlin","', add_special_tokens=False)
    draft = ValueLookup(qwen_tokenizer).propose(context, 32)
    assert draft == whole[len(whole) - len(draft) :] and qwen_tokenizer.decode(draft) == '":"Berlin","'
    assert ValueLookup(qwen_tokenizer).propose(context, 2) == draft[:2]


def test_inside_a_value_the_draft_continues_it_from_the_prompt(qwen_tokenizer):
    # "Marg" has no token-level match: the text writes " Margarethe" (another token)
    assert _draft_text(qwen_tokenizer, ORDER, '{"order_id":"58213-B","customer":"Marg').startswith(
        "arethe Villanueva-Oduya on 3 March"
    )
    # the first "3" at a word start after the previous value's place in the text, not "+33"
    previous = '{"order_id":"58213-B","customer":"Margarethe Villanueva-Oduya","date":"3'
    assert _draft_text(qwen_tokenizer, ORDER, previous).startswith(" March 2026.")
    # where the copied line ends, the draft closes the value
    assert _draft_text(qwen_tokenizer, INVOICE, '{"city":"Berl') == 'in","'


def test_no_draft_of_the_previous_value_at_an_unlabelled_key(qwen_tokenizer):
    output = '{"order_id":"58213-B","customer":"'
    plain = _draft_text(qwen_tokenizer, ORDER, output, lookup=PromptLookup())
    assert plain.startswith("58213-B")  # token-level lookup: what followed `":"` last time
    assert _draft_text(qwen_tokenizer, ORDER, output) == ""
    # after the next key it drafts the separator the output wrote, whose tokens it learnt above
    lookup = ValueLookup(qwen_tokenizer)
    lookup.propose(_context(qwen_tokenizer, ORDER, output), 8)
    assert _draft_text(qwen_tokenizer, ORDER, output + 'Margarethe","date', lookup=lookup) == '":"'


def test_a_mention_is_no_label(qwen_tokenizer):
    document = "The location is the place name exactly as the user wrote it. Fly to Shenzhen Bay Park."
    assert _draft_text(qwen_tokenizer, document, '{"location') == ""
    assert _draft_text(qwen_tokenizer, document, '{"location":"Sh').startswith("enzhen Bay Park.")


def test_prose_is_drafted_as_prompt_lookup_does(qwen_tokenizer):
    output = "Order 58213-B was placed by"
    context = _context(qwen_tokenizer, ORDER, output)
    assert ValueLookup(qwen_tokenizer).propose(context, 8) == PromptLookup().propose(context, 8) != []


@pytest.fixture(scope="module")
def replay_model(qwen_dir):
    from benchmarks.speculative_replay import qwen_without_weights

    return qwen_without_weights()


@pytest.mark.parametrize("case", ["invoice", "order", "fly_to"])
def test_replay_identical_and_fewer_passes_than_prompt_lookup(replay_model, case):
    from benchmarks.speculative_replay import load_case, replay

    messages, schema, target = load_case(case)
    for policy in ("oracle", "cost"):
        plain = replay(replay_model, messages, schema, target, PromptLookup(), policy)
        values = replay(replay_model, messages, schema, target, ValueLookup(replay_model.tokenizer), policy)
        assert plain["identical"] and values["identical"]
        assert values["passes"] < plain["passes"], (case, policy, plain["passes"], values["passes"])


def test_chained_drafts_cross_the_forced_keys(replay_model, monkeypatch):
    """A labelled value's draft ends at its closing `","`; the guided strategy chains the next key
    (forced tokens) and the drafter's next value after it, so the invoice needs fewer passes."""
    from benchmarks.speculative_replay import load_case, replay
    from guided.strategy import ConstrainedDecodingStrategy

    messages, schema, target = load_case("invoice")
    chained = replay(replay_model, messages, schema, target, ValueLookup(replay_model.tokenizer), "oracle")
    monkeypatch.setattr(ConstrainedDecodingStrategy, "CHAIN_LINKS", 1)
    single = replay(replay_model, messages, schema, target, ValueLookup(replay_model.tokenizer), "oracle")
    assert chained["identical"] and single["identical"]
    assert chained["passes"] < single["passes"], (chained["passes"], single["passes"])


SOURCE = (
    "def total(lines):\n    result = Decimal(0)\n    for line in lines:\n"
    '        result += line.quantity + line.price\n    return result\n\nprint(row["sku"])\n'
)


def test_a_multi_line_value_is_drafted_escaped_across_lines(qwen_tokenizer):
    """An agent's Edit `old_string` or Write `content` copies lines of a file from a tool result: in
    the JSON string the model writes `\\n` and `\\"` where the file has a newline and a quote. The
    draft continues the copy in that escaped form, across line ends (no closing quote at a line's
    end once the value holds a newline)."""
    prefix = '{"file_path":"invoice.py","old_string":"def total(lines):\\n    result = Dec'
    text = _draft_text(qwen_tokenizer, SOURCE, prefix, n=24)
    assert text.startswith("imal(0)\\n    for line in lines:\\n        result += line.quantity"), text
    # a value copied from a line that is not the file's first: found from its own line start
    prefix = '{"content":"```python\\n    for line in lines:\\n        res'
    text = _draft_text(qwen_tokenizer, SOURCE, prefix, n=16)
    assert text.startswith("ult += line.quantity + line.price\\n    return result"), text


def test_quotes_in_a_copied_line_are_drafted_escaped(qwen_tokenizer):
    text = _draft_text(qwen_tokenizer, SOURCE, '{"file_path":"a.py","old_string":"print(row[\\"s', n=8)
    assert text.startswith('ku\\"])'), text

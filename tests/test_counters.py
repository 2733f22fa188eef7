"""Issue 41: every counter of a generation counts the tokens it delivered, on every cut (stop
string, max_tokens, EOS, a finished grammar), with speculation on and off, in the single-sequence
loop and in the batch. The drafter here proposes what the target is about to write, so every draft
is accepted and runs past whatever cut ends the output: the case where accepted drafts were counted
although never delivered."""

from __future__ import annotations

import numpy as np
import pytest

from coreai import ConstrainedSession
from runtime import SamplingParams, SamplingStrategy
from runtime.batch import BatchGenerator
from runtime.generate import stream_tokens

MESSAGES = [{"role": "user", "content": "Say something."}]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
}


class Oracle:
    """A `runtime.strategy.Drafter` that proposes the next tokens of a known continuation of the
    prompt (the target's own greedy output, then EOS and more): every draft is accepted up to the
    end of the output and beyond it."""

    def __init__(self, prompt_len: int, continuation: list[int]):
        self.prompt_len, self.continuation = prompt_len, continuation

    def propose(self, context: list[int], n: int) -> list[int]:
        done = len(context) - self.prompt_len
        if context[self.prompt_len :] != self.continuation[:done]:
            return []
        return self.continuation[done : done + n]


def eos_bias(model, ids: list[int]) -> float:
    """A logit bias on EOS that makes greedy decoding of `ids` end with EOS after a few tokens: EOS's
    raw logit is 0 in the tiny network (its head row is zero), so at each position the greedy
    token's lead over it is its log-probability minus EOS's; the bias sits between a later
    position's lead and every earlier one's."""
    eos = max(model.tokenizer.eos_ids)
    deltas = list(model.stream(ids, max_tokens=24, logprobs=True))
    rows = [row for d in deltas for row in d.logprobs]
    leads = [float(np.max(np.array(row)) - np.array(row)[eos]) for row in rows]
    p = max(i for i in range(3, len(leads)) if leads[i] < min(leads[:i]))  # a new lowest lead, after 3 tokens
    return (leads[p] + min(leads[:p])) / 2


def cases(model):
    """{cut: (strategy factory, options)}: each cut ends the output where the target would go on."""
    ids = model.prompt_ids(MESSAGES)
    free = lambda **kw: lambda: SamplingStrategy(SamplingParams(**kw), want_logprobs=True)  # noqa: E731
    guided = lambda **spec: lambda: ConstrainedSession(model, **spec).strategy(logprobs=True)  # noqa: E731
    text = model.generate(ids, max_tokens=24).text
    eos = max(model.tokenizer.eos_ids)
    return ids, {
        "stop": (free(), dict(max_tokens=24, stop=[text[8:11]])),
        "max_tokens": (free(), dict(max_tokens=7)),
        "eos": (free(logit_bias={eos: eos_bias(model, ids)}), dict(max_tokens=24)),
        "grammar": (guided(schema=SCHEMA, whitespace="compact"), dict(max_tokens=40)),
        "grammar max_tokens": (guided(schema=SCHEMA, whitespace="compact"), dict(max_tokens=9)),
        "grammar stop": (guided(regex=r"[a-z]{2,6}( [a-z]{2,6}){0,5}"), dict(max_tokens=24, stop=["a"])),
    }


def run(model, ids, make, options, drafter, batched):
    """One generation, solo (`stream_tokens`) or as the lone row of a `BatchGenerator`: its deltas."""
    if not batched:
        return list(stream_tokens(model.network, model.tokenizer, ids, make(), drafter=drafter, **options))
    batch = BatchGenerator(model.network, model.tokenizer, max_batch=2)
    batch.add(ids, make(), drafter=drafter, **options)
    deltas = []
    while len(batch):
        deltas += [delta for _, delta in batch.step()]
    return deltas


@pytest.mark.parametrize("batched", [False, True], ids=["solo", "batched"])
@pytest.mark.parametrize("speculate", [False, True], ids=["plain", "drafted"])
@pytest.mark.parametrize("cut", ["stop", "max_tokens", "eos", "grammar", "grammar max_tokens", "grammar stop"])
def test_counters_count_the_delivered_tokens(tiny_model, cut, speculate, batched):
    ids, table = cases(tiny_model)
    make, options = table[cut]
    # The target's own continuation without the cut, then EOS and more: the drafts run past any cut.
    whole = run(tiny_model, ids, make, {**options, "stop": None, "max_tokens": 24}, None, False)[-1].result
    eos = max(tiny_model.tokenizer.eos_ids)
    drafter = Oracle(len(ids), whole.token_ids + [eos] + whole.token_ids) if speculate else None
    deltas = run(tiny_model, ids, make, options, drafter, batched)
    result = deltas[-1].result
    assert result is not None and result.error is None

    delivered = [t for d in deltas for t in d.token_ids]
    origins = [o for d in deltas for o in d.origins]
    logprobs = [row for d in deltas for row in (d.logprobs or [])]
    assert result.token_ids == delivered
    assert result.usage.completion_tokens == len(delivered) == len(origins) == len(logprobs)
    assert result.accepted_tokens == origins.count("drafted")
    assert result.forced_tokens == origins.count("forced")
    assert 0 <= result.accepted_tokens <= result.drafted_tokens
    assert tiny_model.tokenizer.decode(delivered) == result.text[: len(tiny_model.tokenizer.decode(delivered))]
    # the cut happened, and the speculative runs drafted past it
    expected = {"stop": "stop", "max_tokens": "length", "eos": "stop", "grammar": "stop"}
    assert result.finish_reason == expected.get(cut, result.finish_reason)
    assert (result.stop_string is not None) == cut.endswith("stop")
    assert not speculate or result.drafted_tokens > 0

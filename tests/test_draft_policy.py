"""`runtime.draft_policy.DraftPolicy`: every cut of a draft, in its order (the cost model's choice,
the solo rule, the filter, the cost model's keep, the budget room, the maximum draft), with a
scripted cost model and drafter (no model, no clock)."""

from __future__ import annotations

import pytest

from runtime.draft_policy import DraftPolicy

PROMPT = [1, 2, 3]


class Script:
    """A cost model choosing `choose` tokens and keeping `keep` (None: all); records what it saw."""

    def __init__(self, choose: int, keep: int | None = None):
        self.k, self.kept, self.decisions, self.kept_from = choose, keep, 0, []

    def choose(self, base: int) -> int:
        self.decisions += 1
        return self.k

    def keep(self, k: int, base: int) -> int:
        self.kept_from.append(k)
        return k if self.kept is None else min(k, self.kept)

    def observe_pass(self, width: int, seconds: float) -> None:
        pass

    def observe_draft(self, drafted: int, accepted: int) -> None:
        pass


class Counting:
    """Proposes 100, 101, ... (n of them); records each n asked for."""

    def __init__(self):
        self.asked = []

    def propose(self, context: list[int], n: int) -> list[int]:
        self.asked.append(n)
        return list(range(100, 100 + n))


def policy(choose: int, keep: int | None = None, max_draft: int = 8, filter=None, **limits):
    drafts = DraftPolicy(max_draft, filter=filter)
    drafts.costs = Script(choose, keep)
    drafter = Counting()
    drafts.begin(len(PROMPT), drafter, **limits)
    return drafts, drafter


def test_the_cost_models_choice_is_what_the_drafter_is_asked_for_and_its_keep_cuts():
    drafts, drafter = policy(choose=5, keep=2)
    assert drafts.next(PROMPT, 1) == [100, 101] and drafter.asked == [5]
    assert drafts.draft == [100, 101]  # held for the coming pass's verification
    drafts, drafter = policy(choose=0)
    assert drafts.next(PROMPT, 1) == [] and drafter.asked == []  # k = 0: the drafter is not asked


def test_the_solo_rule_asks_nothing_but_the_cost_model_still_decides():
    alone = [False]
    drafts, drafter = policy(choose=4, solo=lambda: alone[0])
    assert drafts.next(PROMPT, 1) == [] and drafter.asked == []
    assert drafts.costs.decisions == 1  # a decision made all the same (the probes' schedule)
    alone[0] = True
    assert drafts.next(PROMPT, 1) == [100, 101, 102, 103] and drafter.asked == [4]


def test_the_filter_cuts_before_the_keep_sees_the_draft():
    drafts, _ = policy(choose=6, filter=lambda d: [t for t in d if t < 103])  # 103 forbidden
    assert drafts.next(PROMPT, 1) == [100, 101, 102]
    assert drafts.costs.kept_from == [3]  # the keep weighed the filtered draft


def test_the_budget_room_cuts_last():
    drafts, _ = policy(choose=6, budget=5)
    output = [7, 8]  # 2 of 5 tokens written: the pass yields one more after the draft, so 2 fit
    assert drafts.next(PROMPT + output, 1) == [100, 101]
    assert drafts.costs.kept_from == [6]  # the keep saw the whole draft, the budget cut what it kept
    assert drafts.next(PROMPT + output + [9, 10, 11], 1) == []  # the budget is spent: no draft


def test_the_maximum_draft_bounds_what_the_filter_adds():
    chain = lambda d: d + [200, 201, 202, 203]  # noqa: E731 - a filter that lengthens (chaining)
    drafts, _ = policy(choose=3, max_draft=4, filter=chain)
    assert drafts.next(PROMPT, 1) == [100, 101, 102, 200]


def test_no_drafter_no_draft():
    drafts = DraftPolicy(8)
    drafts.costs = Script(choose=4)
    drafts.begin(len(PROMPT), None)
    assert drafts.next(PROMPT, 1) == [] and drafts.costs.decisions == 0
    drafts = DraftPolicy(0)  # max_draft 0 disables drafting
    drafts.begin(len(PROMPT), Counting())
    assert drafts.drafter is None and drafts.next(PROMPT, 1) == []
    with pytest.raises(ValueError, match="max_draft"):
        DraftPolicy(-1)


def test_the_strategys_draft_is_the_policys_and_the_loop_feeds_it_whole(tiny_tokenizer):
    """One holder: the strategy's `draft`, the step's and the fed one are the policy's draft."""
    import mlx.core as mx

    from runtime import SamplingStrategy
    from runtime.sequence import Sequence

    strategy = SamplingStrategy(max_draft=4)
    strategy.drafts.costs = Script(choose=4)
    strategy.begin(PROMPT, Counting(), budget=4)
    seq = Sequence(tiny_tokenizer, PROMPT, max_tokens=4)
    logits = mx.zeros((1, tiny_tokenizer.hf.vocab_size))
    logits[0, 5] = 1.0  # greedy: token 5 (no end token)
    step = strategy.step(logits)  # one token written: 4 - 1 - 1 = 2 draft tokens fit
    seq.apply(step)
    feed, rows = seq.next_feed()
    assert step.draft == strategy.draft == strategy.drafts.draft == [100, 101]
    assert feed[-2:] == [100, 101] and rows == 3
    strategy.rollback(1)
    assert strategy.draft == []


def test_a_step_that_keeps_only_fed_draft_tokens_scores_the_last_one_again(tiny_tokenizer):
    """A step whose tokens are all accepted draft tokens (validate-and-rollback took back the token
    sampled after them) appends nothing the KV cache lacks: the next pass re-feeds the last kept token
    (its KV trimmed), never an empty feed (which the batch's forward pass cannot take)."""
    from runtime.sequence import Sequence
    from runtime.strategy import Step

    seq = Sequence(tiny_tokenizer, PROMPT, max_tokens=10)
    seq.apply(Step(tokens=[5], draft=[6]))
    assert seq.next_feed() == ([5, 6], 2)  # the sampled token and the draft, fed together
    trim = seq.apply(Step(tokens=[6], verified=1))  # the draft token kept, nothing after it
    assert trim == 1 and seq.next_feed() == ([6], 1)

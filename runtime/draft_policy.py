"""`DraftPolicy`: one generation's speculative draft and every cut of it, in one place.

The strategy asks for a draft once per step, after the step's tokens are known (`next`); the loop
feeds that draft whole beside the step's new tokens, and the next step verifies it (`draft`). The
cuts apply in this fixed order, each to what the one before left:

1. the cost model's choice (`runtime.draft_cost.DraftCostModel.choose`): k tokens, 0 <= k <= max_draft.
   Made every step, drafting or not: its decision count schedules the probes.
2. the solo rule: k = 0 while the loop feeds no drafts (a batch of several rows: the batch already
   fills the pass, and a draft would widen every row's feed), so the drafter is not even asked.
3. the drafter's proposal: at most k tokens.
4. the filter: the strategy's one cut of a draft (`SamplingStrategy.check_draft`; in guided
   generation the grammar's, which may also lengthen the draft by chaining forced tokens and
   further proposals).
5. the cost model's keep (`DraftCostModel.keep`): how much of what is left is worth feeding.
6. the budget room and the maximum draft: at most `budget - output - 1` tokens (the pass yields one
   sampled token after the accepted draft, so a draft never runs past the completion budget) and at
   most max_draft (what the filter added included: a guided strategy's bitmask has max_draft + 1 rows).

The budget cut comes after the keep, not before the choice: the cost model weighs the draft the
drafter and the filter gave, and the budget only shortens what it chose.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from runtime.draft_cost import DraftCostModel
from runtime.strategy import Drafter


class DraftPolicy:
    """The draft of one generation (see the module docstring). One per strategy; not thread-safe.

    max_draft: the longest draft (tokens, >= 0; 0 disables drafting). filter: `draft -> draft`, the
    strategy's cut of a proposal (None: none). Raises ValueError for max_draft < 0.
    """

    def __init__(self, max_draft: int, filter: Callable[[list[int]], list[int]] | None = None):
        self.max_draft = max_draft
        self.costs = DraftCostModel(max_draft)  # raises for max_draft < 0
        self.filter = filter
        self.drafter: Drafter | None = None
        self.budget: int | None = None  # completion tokens of the generation (None: no limit)
        self.solo: Callable[[], bool] | None = None  # whether the loop feeds drafts now (None: always)
        self.prompt_len = 0
        self.draft: list[int] = []  # proposed last step, fed with the coming pass, awaiting verification
        self._mark: float | None = None  # time.perf_counter() at the last decision
        self._base = 1  # new tokens (not drafts) of the pass launched after it
        self._fed = 0  # draft tokens of the pass verified last

    def begin(
        self,
        prompt_len: int,
        drafter: Drafter | None = None,
        *,
        budget: int | None = None,
        solo: Callable[[], bool] | None = None,
    ) -> None:
        """Start a generation of a `prompt_len`-token prompt with `drafter` (None: no drafts), a
        completion `budget` (max_tokens; None: no limit) and the loop's `solo` rule (None: always)."""
        self.drafter = drafter if self.max_draft > 0 else None
        self.prompt_len, self.budget, self.solo = prompt_len, budget, solo

    def observe(self, accepted: int) -> None:
        """The step verified `draft` and accepted its first `accepted` tokens."""
        self._fed = len(self.draft)
        self.costs.observe_draft(self._fed, accepted)

    def next(self, context: list[int], new: int) -> list[int]:
        """The draft to feed with the coming pass of `new` (>= 1) tokens, after `context` (prompt +
        output, the step's tokens included); also kept as `draft`. [] without a drafter.

        The time since the last decision is one loop cycle of the pass just verified (its forward
        pass, mask fills, verification, the drafter's proposal): the cost model's measurement of its
        width."""
        self.draft = []
        if self.drafter is None:
            return self.draft
        now = time.perf_counter()
        if self._mark is not None:
            self.costs.observe_pass(self._base + self._fed, now - self._mark)
        self._mark, self._base = now, new
        k = self.costs.choose(new)  # 1
        if self.solo is not None and not self.solo():  # 2
            k = 0
        draft = self.drafter.propose(context, k) if k else []  # 3
        if k and self.filter is not None:  # 4
            draft = self.filter(draft)
        draft = draft[: self.costs.keep(len(draft), new)]  # 5
        top = self.max_draft
        if self.budget is not None:  # 6
            top = min(top, max(0, self.budget - (len(context) - self.prompt_len) - 1))
        self.draft = draft[:top]
        return self.draft

    def clear(self) -> None:
        """Drop the draft (a finished step, a rollback): the coming pass feeds none."""
        self.draft = []

"""`KVBatch`: the batch's KV caches and its forward passes, driven by one `StepPlan` per step.

This is the model-call boundary of continuous batching: every call of the network and every change
of a KV cache happens here, and only as a `runtime.step_plan.StepPlan` says (or, for `add`, as the
prefix cache gives). The decisions (strategies, stops, budgets, cancels) live in
`runtime.batch.BatchGenerator`. On a distributed model the other ranks run a `KVBatch` of their own
on the same plans (`runtime.distributed`), so their caches hold the same rows at the same positions
and every rank runs the same passes, hence the same collectives, in the same order.

Built on mlx-lm's batched KV cache (`BatchKVCache`: rows left-padded to a common length; `merge`
builds one from single caches, `extend` adds rows, `filter` drops or copies rows, `extract` copies
one out, `prepare(right_padding=)` + `finalize()` shift rows right) and on its `LRUPromptCache`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import KVCache, LRUPromptCache, make_prompt_cache, trim_prompt_cache

from runtime.attention import engine
from runtime.step_plan import StepPlan

PROMPT_CACHE_KEY = "model"  # LRUPromptCache keys entries by model; one batch serves one model


@dataclass
class Slot:
    """One row's KV state. rid: the row's id (the plan's). cache: its own KV cache (mlx-lm caches,
    one per layer) while it prefills, None once it joined the batch cache. pending: prompt tokens not
    yet in the KV cache (the last one is fed with the batch). tokens: the ids its KV cache holds."""

    rid: int
    cache: list | None
    pending: list[int]
    tokens: list[int]
    reused: int  # prompt tokens found in the prefix cache or copied from another waiting row's
    feed: list[int] = field(default_factory=list)  # tokens of the running forward pass
    rows: int = 1  # logits rows taken from the end of `feed`


def _state(slot: Slot) -> tuple:
    """What a waiting row's prefill depends on: the tokens in its KV cache and the rest of its prompt."""
    return tuple(slot.tokens), tuple(slot.pending)


class KVBatch:
    """The KV caches of a batch's rows and its passes (see the module docstring); not thread-safe.

    network: an mlx-lm model returning logits [batch, seq, vocab]. max_batch: rows decoding together
    (>= 1). prompt_cache: an mlx-lm `LRUPromptCache` or None. prefill_step_size: prompt tokens per
    prefill chunk (> 0).
    Counters since it was made: `prefills` (rows added), `prefill_tokens` (prompt tokens the
    prefill passes computed, a shared row's once), `cached_tokens` (prompt tokens found in the
    prefix cache or copied from another waiting row).
    """

    def __init__(self, network, max_batch: int, prompt_cache: LRUPromptCache | None, prefill_step_size: int):
        self.network = network
        self.max_batch = max_batch
        self.prompt_cache = prompt_cache
        self.prefill_step_size = prefill_step_size
        self.active: list[Slot] = []  # decoding, in the order of the batch cache's rows
        self.waiting: list[Slot] = []  # prefilling (the first one) or waiting for a free row
        self.cache: list | None = None  # one BatchKVCache (or batched rotating cache) per layer
        self._short_next = True  # short prompts go first, then turns alternate while both wait
        self._oldest_next = True  # long turns alternate: the least left, then the oldest
        # A row's KV can be trimmed (rejected drafts, rollback) only in plain KV caches: a rotating
        # (sliding-window) one may have overwritten what a trim would uncover.
        self.trimmable = all(type(c) is KVCache for c in make_prompt_cache(network))
        self.prefills = self.prefill_tokens = self.cached_tokens = 0

    def clear(self) -> None:
        """Drop every row, decoding or waiting (after a failed pass: their KV state is unknown)."""
        self.active, self.waiting, self.cache = [], [], None

    def add(self, rid: int, prompt_ids: list[int]) -> Slot:
        """Queue a row for `prompt_ids` (non-empty), starting from its longest cached prefix."""
        cache, reused = None, 0
        if self.prompt_cache is not None:
            cache, rest = self.prompt_cache.fetch_nearest_cache(PROMPT_CACHE_KEY, list(prompt_ids))
            if cache is not None and not rest:  # an exact hit: the last prompt token still gives the first logits
                if trim_prompt_cache(cache, 1) == 1:
                    rest = prompt_ids[-1:]
                else:  # a rotating cache past its window cannot give the token back
                    cache, rest = None, prompt_ids
            reused = len(prompt_ids) - len(rest) if cache is not None else 0
        cache = cache or make_prompt_cache(self.network)
        slot = Slot(rid, cache, list(prompt_ids[reused:]), list(prompt_ids[:reused]), reused)
        self.waiting.append(slot)
        self.prefills += 1
        self.cached_tokens += reused
        return slot

    def run(self, plan: StepPlan) -> dict[int, mx.array]:
        """Execute one step's plan (its `add`s already done): drop cancelled waiting rows, trim and
        drop active rows, admit waiting rows, launch the pass. Returns each active row's logits
        (rid -> mx.array [rows, vocab], evaluating asynchronously). On an error every row is dropped
        (the batch starts afresh) and the error propagates."""
        try:
            cancelled = set(plan.cancel)
            self.waiting = [s for s in self.waiting if s.rid not in cancelled]
            self._trim(dict((rid, n) for rid, n in plan.trim))
            self._leave(dict((rid, bool(keep)) for rid, keep in plan.leave))
            self._admit()
            if not self.active:
                return {}
            return self._forward({rid: (ids, rows) for rid, ids, rows in plan.feed})
        except Exception:
            self.active, self.waiting, self.cache = [], [], None
            raise

    def _trim(self, trims: dict[int, int]) -> None:
        """Drop rows' last n KV entries: shifted right, they become left padding."""
        if not any(trims.values()):
            return
        assert self.cache is not None  # rows are active
        counts = [trims.get(s.rid, 0) for s in self.active]
        for s, n in zip(self.active, counts, strict=False):
            del s.tokens[len(s.tokens) - n :]
        for c in self.cache:
            c.prepare(right_padding=counts)
            c.finalize()

    def _leave(self, leaving: dict[int, bool]) -> None:
        """Rows that end leave the batch; those kept go to the prefix cache."""
        if not leaving:
            return
        assert self.cache is not None  # rows are active
        for i, s in enumerate(self.active):
            if leaving.get(s.rid) and self.prompt_cache is not None:
                row = [c.extract(i) for c in self.cache]
                # Evaluated here: a lazy copy keeps the whole batch's KV arrays alive in the prefix
                # cache, which counts only the row's bytes (the soak grew 3 -> 11 GiB in 10 minutes).
                mx.eval([c.state for c in row])
                self.prompt_cache.insert_cache(PROMPT_CACHE_KEY, list(s.tokens), row)
        keep = [i for i, s in enumerate(self.active) if s.rid not in leaving]
        self.active = [self.active[i] for i in keep]
        if not keep:
            self.cache = None
            return
        for c in self.cache:
            c.filter(keep)

    def _admit(self) -> None:
        """Waiting rows prefill and join the batch once only their last prompt token is left (that token
        is fed with the batch). Rows whose remaining prompts fit one chunk prefill together in ONE pass
        (as mlx-lm's `BatchGenerator` prefills a batch of prompts), up to the free rows and
        `2 * prefill_step_size` padded positions (rows in the same state, which share a row of the pass,
        count once), so several requests arriving together pause the running rows once, not once each.
        A longer prompt prefills alone, one chunk per step; while one does, steps alternate between its
        chunks and the short prompts, so a short request does not wait for a long prompt's whole
        prefill, nor a long one forever. Among long prompts, turns alternate between the one with the
        fewest tokens left and the oldest (`_next_long`)."""
        room = self.max_batch - len(self.active)
        if not self.waiting or room < 1:
            return
        self._share_prefill()
        short = [s for s in self.waiting if len(s.pending) - 1 <= self.prefill_step_size]
        long = [s for s in self.waiting if s not in short]
        long_turn = bool(long) and (not short or not self._short_next)
        self._short_next = long_turn or not long
        if long_turn:
            self._prefill_alone(self._next_long(long))
            return
        group: list[Slot] = []
        for slot in short[:room]:
            width = max(len(s.pending) - 1 for s in group + [slot])
            if group and len({_state(s) for s in group + [slot]}) * width > 2 * self.prefill_step_size:
                break
            group.append(slot)
        self._join(group, self._prefill_together(group))

    def _next_long(self, long: list[Slot]) -> Slot:
        """The long prompt (waiting, oldest first) to prefill one chunk of. Turns alternate between the
        one with the fewest tokens left, so a prompt of a few chunks (a tools request) is not stuck
        behind a 20k-token one (shortest remaining first, as vLLM's `max_num_partial_prefills` lets
        short prompts prefill beside a long one), and the oldest, so no prompt waits forever."""
        self._oldest_next = not self._oldest_next
        return long[0] if self._oldest_next else min(long, key=lambda s: len(s.pending))

    def _share_prefill(self) -> None:
        """A waiting row whose prompt starts with more tokens than it has in its KV cache, all of them
        already in another waiting row's KV cache, takes a copy of that cache instead of computing it
        again: the `n` choices of one request with a long prompt, or requests with one long system
        prompt arriving together, prefill it once (the prefix cache only holds finished rows)."""
        for slot in self.waiting:
            prompt = slot.tokens + slot.pending
            donors = [
                o
                for o in self.waiting
                if len(slot.tokens) < len(o.tokens) < len(prompt) and prompt[: len(o.tokens)] == o.tokens
            ]
            if donors:
                donor = max(donors, key=lambda o: len(o.tokens))
                self.cached_tokens += len(donor.tokens) - len(slot.tokens)
                slot.reused += len(donor.tokens) - len(slot.tokens)  # reported as cached: not computed for it
                slot.cache, slot.tokens = copy.deepcopy(donor.cache), list(donor.tokens)
                slot.pending = prompt[len(donor.tokens) :]

    def _prefill_alone(self, slot: Slot) -> None:
        """One chunk of a row's prompt into its own KV cache."""
        n = min(self.prefill_step_size, len(slot.pending) - 1)
        self.prefill_tokens += n
        with engine():
            self.network(mx.array(slot.pending[:n])[None], cache=slot.cache)
        assert slot.cache is not None  # a waiting row has its own cache
        mx.eval([c.state for c in slot.cache])
        slot.tokens += slot.pending[:n]
        slot.pending = slot.pending[n:]

    def _prefill_together(self, group: list[Slot]) -> list:
        """Merge the rows' own KV caches into a batched one and prefill all but the last token of
        each remaining prompt in one pass, right-padded to the longest (the padding moves to the left
        and is masked, as in `_forward`). Rows in the same state (the `n` choices of one request)
        share one row of that pass, copied out after it. Returns the batched caches, one per layer,
        rows in order."""
        states: dict[tuple, int] = {}
        pick = [states.setdefault(_state(s), len(states)) for s in group]
        unique = [group[pick.index(k)] for k in range(len(states))]
        merged = [type(layer[0]).merge(list(layer)) for layer in zip(*(s.cache for s in unique), strict=False)]
        chunks = [s.pending[:-1] for s in unique]
        lengths = [len(c) for c in chunks]
        width = max(lengths)
        self.prefill_tokens += sum(lengths)
        if width:
            padding = [width - n for n in lengths]
            for c in merged:
                c.prepare(lengths=lengths, right_padding=padding)
            with engine():
                self.network(mx.array([c + [0] * p for c, p in zip(chunks, padding, strict=False)]), cache=merged)
            for c in merged:
                c.finalize()
            mx.eval([c.state for c in merged])
        if len(unique) < len(group):
            for c in merged:
                c.filter(pick)  # repeated indices copy a row
        for s in group:
            s.tokens += s.pending[:-1]
            s.pending = s.pending[-1:]
        return merged

    def _join(self, group: list[Slot], caches: list) -> None:
        """Rows whose prompt is in `caches` (batched, one per layer, rows in order) join the batch;
        their first feed is their last prompt token."""
        if self.cache is None:
            self.cache = caches
        else:
            for c, j in zip(self.cache, caches, strict=False):
                c.extend(j)
        for s in group:
            self.waiting.remove(s)
            s.cache = None
            s.feed, s.rows, s.pending = s.pending, 1, []
            self.active.append(s)

    def _forward(self, feeds: dict[int, tuple[list[int], int]]) -> dict[int, mx.array]:
        """One forward pass over every active row's feed (the plan's, or a joining row's last prompt
        token), right-padded to the longest; each row's logits are the last `rows` positions of its
        own feed."""
        for s in self.active:
            if s.rid in feeds:
                s.feed, s.rows = list(feeds[s.rid][0]), feeds[s.rid][1]
            s.tokens += s.feed
        lengths = [len(s.feed) for s in self.active]
        width = max(lengths)
        padding = [width - n for n in lengths]
        if any(padding):
            assert self.cache is not None  # rows are active
            for c in self.cache:
                c.prepare(lengths=lengths, right_padding=padding)
        ids = mx.array([s.feed + [0] * p for s, p in zip(self.active, padding, strict=False)])
        with engine():
            logits = self.network(ids, cache=self.cache)
        if any(padding):  # the padded tail moves to the left padding, masked from later passes
            assert self.cache is not None  # rows are active
            for c in self.cache:
                c.finalize()
        out = {s.rid: logits[i, n - s.rows : n] for i, (s, n) in enumerate(zip(self.active, lengths, strict=False))}
        mx.async_eval(list(out.values()))
        return out
